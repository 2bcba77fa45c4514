"""Plays a GitHub Actions workflow or a GitLab CI pipeline here, as those systems would run it, against stub
commands: each `run:` / `script:` text goes to bash as the runner hands it over, after the CI system's own
expansion (GitHub's `${{ }}` expressions, evaluated over its contexts; GitLab's `$VAR`s in `variables:`, never in
a script). Jobs run in order (needs, stages), each in a fresh folder, with artifacts passed on as the systems do;
every stubbed command (imgbuild, docker, pip, git, gh) records its argv, one JSON list a line."""

from __future__ import annotations

import fnmatch
import json
import operator
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import yaml

from imgbuild.ci.fanout import gitlab_child

#: The files a child pipeline may include, for which the stub's `rebuild --plan --gitlab-child` has imgbuild's own
#: child pipeline of the plan ready.
CHILD_INCLUDES = (".gitlab/imgbuild-runner.yml",)
#: Every stub records its argv: NUL-terminated words, then a record separator.
RECORD = """record() { printf '%s\\0' "${0##*/}" "$@" >> "$CIPLAY_LOG"; printf '\\036\\0' >> "$CIPLAY_LOG"; }
"""

#: imgbuild acts out what the workflows rely on: a plan (and its child pipeline), a runner's report, a merge.
STUB_IMGBUILD = r"""
# build's and rebuild's key: the option, else the variable (click's envvar)
case "$1" in build|rebuild)
  if [ -n "$IMGBUILD_SIGN_KEY" ] && ! printf '%s\n' "$@" | grep -qx -- --sign-key; then
    set -- "$@" --sign-key "$IMGBUILD_SIGN_KEY"
  fi
esac
record "$@"
value() { local want=$1; shift; while [ $# -gt 1 ]; do [ "$1" = "$want" ] && { printf '%s' "$2"; return; }; shift; done; }
json() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }
case "$1" in
rebuild)
  if printf '%s\n' "$@" | grep -qx -- --plan; then
    child=$(value --gitlab-child "$@")
    if [ -n "$child" ]; then
      include=$(value --gitlab-include "$@")
      cp "$(dirname "$CIPLAY_PLAN")/child-${include//\//_}" "$child" || exit 2
    fi
    cat "$CIPLAY_PLAN"
  elif printf '%s\n' "$@" | grep -qx -- --push; then
    printf '%s\n' "$CIPLAY_FAIL" | grep -qxF -- "$2" && exit 1  # a runner that dies before writing its report
    report=$(value --report-json "$@")
    [ -z "$report" ] || printf '{"images": [{"recipe": %s, "status": "built"}]}\n' "$(json "$2")" > "$report"
  fi ;;
merge-reports)
  for flag in --junit-xml --report-json; do out=$(value "$flag" "$@"); [ -z "$out" ] || echo merged > "$out"; done
  # as imgbuild does with --plan: the plan the runners were given (exit 2 when it is not that plan, or the key is
  # not there), and a planned recipe no report names fails the merge (exit 1)
  plan=$(value --plan "$@")
  [ -n "$plan" ] || exit 0
  [ -f "$(value --key "$@")" ] || exit 2
  python3 - "$plan" "$@" <<'PY' || exit $?
import json, os, sys
rows = lambda plan: [[{k: r[k] for k in ("recipe", "image", "wave", "after")} for r in w] for w in plan["waves"]]
plan = json.load(open(sys.argv[1]))
if rows(plan) != rows(json.load(open(os.environ["CIPLAY_PLAN"]))):
    sys.exit(2)
reported = set()
for arg in sys.argv[2:]:
    if arg.endswith("report.json") or arg.startswith("report-"):
        try:
            reported |= {i["recipe"] for i in json.load(open(arg))["images"]}
        except OSError:
            pass
sys.exit(1 if [r for w in plan["waves"] for r in w if r["recipe"] not in reported] else 0)
PY
  ;;
esac
exit 0
"""

STUB_RECORDER = """record "$@"
[ -t 0 ] || cat > /dev/null  # a password on standard input
"""

#: `python -m venv DIR` makes DIR/bin/pip (a recorder); anything else is this Python.
STUB_PYTHON = """#!/bin/bash
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin" && ln -sf "{pip}" "$3/bin/pip" && exit 0
fi
exec "{python}" "$@"
"""


@dataclass
class Run:
    """What a played pipeline did: each job's outcome and the stubs' argv."""

    root: Path
    jobs: dict[str, str] = field(default_factory=dict)  # job (instance) name -> "success" | "failure" | "skipped"
    output: list[str] = field(default_factory=list)

    def calls(self, program: str = "imgbuild") -> list[list[str]]:
        """The arguments of each call of `program`, in order."""
        log = self.root / "calls.jsonl"
        text = log.read_text() if log.exists() else ""
        lines = [r.split("\0")[:-1] for r in text.split("\x1e\0")[:-1]]
        return [c[1:] for c in lines if c[0] == program]

    def made(self, name: str) -> list[Path]:
        return [p for p in self.root.rglob(name)]


class Bed:
    """The stubs' folder and the log, under `root`; `repo` (a folder) is what a checkout brings."""

    def __init__(self, root: Path, repo: Path, plan: dict[str, Any] | None = None, fail: tuple[str, ...] = ()):
        self.root, self.repo = root, repo
        self.stubs = root / "stubs"
        self.stubs.mkdir(parents=True)
        self.run = Run(root)
        self.serial = count(1)
        plan = plan or {"waves": [], "matrix": [], "images": 0, "invalid": []}
        (root / "plan.json").write_text(json.dumps(plan))
        for include in CHILD_INCLUDES:
            (root / f"child-{include.replace('/', '_')}").write_text(gitlab_child(plan, include))
        self.base_env = {
            "PATH": f"{self.stubs}:/usr/bin:/bin",
            "HOME": str(root / "home"),
            "LANG": "C.UTF-8",
            "CIPLAY_LOG": str(root / "calls.jsonl"),
            "CIPLAY_PLAN": str(root / "plan.json"),
            "CIPLAY_FAIL": "\n".join(fail),
        }
        python = Path(sys.executable).resolve()  # the interpreter itself: no site to read at each start
        self._script("imgbuild", STUB_IMGBUILD)
        for name in ("docker", "git", "gh", "pip"):
            self._script(name, STUB_RECORDER)
        for name in ("python", "python3"):
            (self.stubs / name).write_text(STUB_PYTHON.format(pip=self.stubs / "pip", python=python))
            (self.stubs / name).chmod(0o755)

    def _script(self, name: str, body: str) -> None:
        (self.stubs / name).write_text(f"#!/bin/bash\n{RECORD}{body}")
        (self.stubs / name).chmod(0o755)

    def workspace(self, job: str, checkout: bool = True) -> Path:
        folder = self.root / "jobs" / f"{next(self.serial)}-{re.sub(r'[^A-Za-z0-9_-]', '_', job)[:40]}"
        if checkout:
            shutil.copytree(self.repo, folder)
        else:
            folder.mkdir(parents=True)
        return folder

    def bash(self, script: str, cwd: Path, env: dict[str, str], flags: str = "-eo pipefail") -> int:
        text = cwd.parent / f"{cwd.name}.step{next(self.serial)}.sh"
        text.write_text(script)
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", *flags.split(), str(text)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        self.run.output.append(f"$ {script}\n{done.stdout}{done.stderr}")
        return done.returncode


# --- GitHub Actions --------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(\d+(?:\.\d+)?)|'((?:[^']|'')*)'|([A-Za-z_][A-Za-z0-9_-]*)|(==|!=|<=|>=|&&|\|\||[!<>()\[\].,*]))"
)


class Missing(dict):  # type: ignore[type-arg]
    """A context whose every name has a value (secrets, vars): `prefix-NAME`."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def __missing__(self, key: str) -> str:
        return f"{self.prefix}-{key}"


class Expression:
    """GitHub's expression language: literals, contexts, indexes, calls, ! == != < > && ||."""

    def __init__(self, text: str, contexts: dict[str, Any], status: dict[str, bool]):
        self.tokens: list[tuple[str, Any]] = []
        at = 0
        text = text.strip()
        while at < len(text):
            m = _TOKEN.match(text, at)
            if not m:
                raise ValueError(f"cannot read {text[at:]!r}")
            number, string, name, op = m.groups()
            kind, value = (
                ("lit", float(number))
                if number
                else ("lit", string.replace("''", "'"))
                if string is not None
                else ("name", name)
                if name
                else ("op", op)
            )
            self.tokens.append((kind, value))
            at = m.end()
        self.at, self.contexts, self.status, self.lazy = 0, contexts, status, 0

    def value(self) -> Any:
        result = self._or()
        if self.at != len(self.tokens):
            raise ValueError(f"left over: {self.tokens[self.at :]}")
        return result

    def _peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self, op: str) -> bool:
        if self._peek() == ("op", op):
            self.at += 1
            return True
        return False

    def _or(self) -> Any:
        left = self._and()
        while self._take("||"):
            right = self._unevaluated(self._and) if truthy(left) else self._and()
            left = left if truthy(left) else right
        return left

    def _and(self) -> Any:
        left = self._compare()
        while self._take("&&"):
            right = self._compare() if truthy(left) else self._unevaluated(self._compare)
            left = right if truthy(left) else left
        return left

    def _unevaluated(self, part: Any) -> None:
        """Read past the operand && and || do not evaluate (GitHub short-circuits: no call in it runs)."""
        self.lazy += 1
        part()
        self.lazy -= 1

    def _compare(self) -> Any:
        left = self._unary()
        for op in ("==", "!=", "<=", "<", ">"):
            if self._take(op):
                right = self._unary()
                a, b = (
                    (left.lower(), right.lower()) if isinstance(left, str) and isinstance(right, str) else (left, right)
                )
                return {"==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}.get(op, operator.le)(
                    a, b
                )
        return left

    def _unary(self) -> Any:
        if self._take("!"):
            return not truthy(self._unary())
        return self._postfix()

    def _postfix(self) -> Any:
        kind, value = self.tokens[self.at]
        self.at += 1
        if kind == "op" and value == "(":
            result = self._or()
            self._take(")")
        elif kind == "lit":
            result = value
        elif self._take("("):
            args = []
            while not self._take(")"):
                args.append(self._or())
                self._take(",")
            result = self._call(value, args)
        else:
            result = {"null": None, "true": True, "false": False}.get(value, self.contexts.get(value))
        while True:
            if self._take("."):
                key = self.tokens[self.at][1]
                self.at += 1
                result = _member(result, key)
            elif self._take("["):
                key = self._or()
                self._take("]")
                if isinstance(result, list) and isinstance(key, float):
                    result = result[int(key)] if int(key) < len(result) else None
                else:
                    result = _member(result, key)
            else:
                return result

    def _call(self, name: str, args: list[Any]) -> Any:
        name = name.lower()
        if self.lazy:
            return None
        if name in self.status:
            return self.status[name]
        if name == "fromjson":
            return json.loads(args[0])
        if name == "tojson":
            return json.dumps(args[0], indent=2)
        if name == "format":
            return re.sub(r"\{(\d+)\}", lambda m: text_of(args[1 + int(m.group(1))]), args[0])
        if name == "contains":
            return args[1] in args[0]
        raise ValueError(f"no function {name}")


def _member(value: Any, key: Any) -> Any:
    """`value.key` / `value[key]`: null where there is none (every name of a Missing context has a value)."""
    if isinstance(value, Missing):
        return value[key]
    return value.get(key) if isinstance(value, dict) else None


def truthy(value: Any) -> bool:
    return value not in (None, False, 0, "")


def text_of(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    return value if isinstance(value, str) else json.dumps(value)


def substitute(text: str, contexts: dict[str, Any], status: dict[str, bool]) -> str:
    """`text` with each `${{ }}` replaced by its value's text, once: what GitHub hands the runner."""
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: text_of(Expression(m.group(1), contexts, status).value()), text)


def condition(text: Any, contexts: dict[str, Any], status: dict[str, bool]) -> bool:
    """An `if:` as GitHub judges it: success() && (it) unless it asks for a status itself."""
    if text is None or text == "":
        return status["success"]
    text = str(text).strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2]
    if not re.search(r"\b(always|failure|cancelled|success)\s*\(", text):
        text = f"success() && ({text})"
    return truthy(Expression(text, contexts, status).value())


def play_github(workflow: Path, bed: Bed, github: dict[str, Any], variables: dict[str, str] | None = None) -> Run:
    """Every job of `workflow` (whatever its `on:` and the jobs' event conditions say), in the order of `needs`,
    each matrix entry a job of its own; `variables`: the repository's (`vars`), else every one set."""
    data = yaml.safe_load(workflow.read_text())
    jobs: dict[str, Any] = data["jobs"]
    results: dict[str, dict[str, Any]] = {}
    artifacts = bed.root / "artifacts"
    while len(results) < len(jobs):
        for name, job in jobs.items():
            needs = job.get("needs", [])
            needs = [needs] if isinstance(needs, str) else needs
            if name in results or any(n not in results for n in needs):
                continue
            needed = {n: results[n] for n in needs}
            status = {
                "always": True,
                "cancelled": False,
                "failure": any(r["result"] == "failure" for r in needed.values()),
                "success": all(r["result"] == "success" for r in needed.values()),
            }
            contexts = {
                "github": {**github, "job": name},
                "secrets": Missing("secret"),
                "vars": Missing("var") if variables is None else variables,
                "needs": needed,
                "env": {},
            }
            if "event_name" not in job.get("if", "") and not condition(job.get("if"), contexts, status):
                results[name] = {"result": "skipped", "outputs": {}}
                bed.run.jobs[name] = "skipped"
                continue
            matrix = job.get("strategy", {}).get("matrix")
            if isinstance(matrix, str):
                matrix = Expression(matrix.strip()[3:-2], contexts, status).value()
            entries = matrix.get("include", []) if isinstance(matrix, dict) else [{}]
            outcomes, outputs = [], {}
            for index, entry in enumerate(entries):
                ran, outputs = _github_job(bed, name, job, data.get("env", {}), contexts, entry, index, artifacts)
                bed.run.jobs[f"{name}[{index}]" if matrix else name] = ran
                outcomes.append(ran)
            result = "skipped" if not outcomes else "failure" if "failure" in outcomes else "success"
            results[name] = {"result": result, "outputs": outputs}
    return bed.run


def _github_job(
    bed: Bed,
    name: str,
    job: dict[str, Any],
    workflow_env: dict[str, Any],
    contexts: dict[str, Any],
    entry: dict[str, Any],
    index: int,
    artifacts: Path,
) -> tuple[str, dict[str, str]]:
    folder = bed.workspace(name, checkout=False)
    temp = folder.parent / f"{folder.name}.temp"
    temp.mkdir()
    contexts = {**contexts, "matrix": entry, "strategy": {"job-index": float(index)}, "runner": {"temp": str(temp)}}
    env: dict[str, str] = {}
    for scope in (workflow_env, job.get("env", {})):
        for key, value in scope.items():
            env[key] = substitute(text_of(value), {**contexts, "env": env}, {"success": True, "always": True})
    paths: list[str] = []
    steps: dict[str, Any] = {}
    failed = False
    for step in job.get("steps", []):
        status = {"always": True, "cancelled": False, "failure": failed, "success": not failed}
        here = {**contexts, "env": env, "steps": steps}
        if not condition(step.get("if"), here, status):
            continue
        step_env = {k: substitute(text_of(v), here, status) for k, v in step.get("env", {}).items()}
        files = {
            k: folder.parent / f"{folder.name}.{k.lower()}" for k in ("GITHUB_OUTPUT", "GITHUB_PATH", "GITHUB_ENV")
        }
        for path in files.values():
            path.write_text("")
        if "run" in step:
            script = substitute(step["run"], here, status)
            run_env = {**bed.base_env, **env, **step_env, "RUNNER_TEMP": str(temp), "GITHUB_ACTIONS": "true"}
            run_env |= {k: str(v) for k, v in files.items()}
            run_env["PATH"] = ":".join([*reversed(paths), run_env["PATH"]])
            code = bed.bash(script, folder, run_env)
        else:
            with_ = {k: substitute(text_of(v), here, status) for k, v in step.get("with", {}).items()}
            code = _github_action(step["uses"], with_, folder, bed, artifacts)
        failed = failed or code != 0
        outputs = _outputs(files["GITHUB_OUTPUT"].read_text())
        paths += [p for p in files["GITHUB_PATH"].read_text().splitlines() if p]
        env |= _outputs(files["GITHUB_ENV"].read_text())
        if "id" in step:
            steps[step["id"]] = {"outputs": outputs, "outcome": "failure" if code else "success"}
    here = {**contexts, "env": env, "steps": steps}
    outputs = {k: substitute(text_of(v), here, {"success": True}) for k, v in job.get("outputs", {}).items()}
    return ("failure" if failed else "success"), outputs


def _outputs(text: str) -> dict[str, str]:
    """`name=value` lines and `name<<DELIMITER` blocks (GitHub's $GITHUB_OUTPUT and $GITHUB_ENV)."""
    found: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, end = line.split("<<", 1)
            found[key] = "\n".join(iter(lambda: next(lines), end))
        elif "=" in line:
            key, value = line.split("=", 1)
            found[key] = value
    return found


def _github_action(uses: str, with_: dict[str, str], folder: Path, bed: Bed, artifacts: Path) -> int:
    """The actions the examples use, as they act on the runner's files."""
    action = uses.split("@", 1)[0]
    if action == "actions/checkout":
        shutil.copytree(bed.repo, folder, dirs_exist_ok=True)
    elif action == "actions/upload-artifact":
        found = [p for p in folder.glob(with_["path"]) if p.is_file()]
        target = artifacts / with_.get("name", "artifact")
        target.mkdir(parents=True, exist_ok=True)
        for path in found:
            shutil.copy(path, target / path.name)
    elif action == "actions/download-artifact":
        into = folder / with_.get("path", ".")
        names = sorted(p.name for p in artifacts.iterdir()) if artifacts.exists() else []
        if "name" in with_:
            if with_["name"] not in names:
                return 1
            shutil.copytree(artifacts / with_["name"], into, dirs_exist_ok=True)
        for name in fnmatch.filter(names, with_.get("pattern", "")):
            shutil.copytree(artifacts / name, into / name, dirs_exist_ok=True)
    return 0


# --- GitLab CI ---------------------------------------------------------------------------------------------------

GITLAB_KEYWORDS = {"stages", "variables", "include", "default", "workflow", "image", "services", "cache"}
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand(value: str, known: dict[str, str]) -> str:
    """GitLab's expansion of a `variables:` value: $VAR and ${VAR} of the variables known so far; once."""
    return _VARIABLE.sub(lambda m: known.get(m.group(1) or m.group(2), ""), value)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = (
            _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def _load_gitlab(text: str, local: dict[str, Path]) -> dict[str, Any]:
    data = yaml.safe_load(text)
    included: dict[str, Any] = {}
    for item in data.get("include", []):
        included = _merge(included, _load_gitlab(local[item["local"]].read_text(), local))
    return _merge(included, {k: v for k, v in data.items() if k != "include"})


def _resolved(name: str, data: dict[str, Any]) -> dict[str, Any]:
    job = data[name]
    parents = job.get("extends", [])
    merged: dict[str, Any] = {}
    for parent in [parents] if isinstance(parents, str) else parents:
        merged = _merge(merged, _resolved(parent, data))
    return _merge(merged, {k: v for k, v in job.items() if k != "extends"})


def play_gitlab(pipeline: Path, bed: Bed, project: dict[str, str], local: dict[str, Path]) -> Run:
    """Every job of the pipeline (whatever its `rules:` say), stage by stage; a `trigger:` plays the child pipeline
    it includes from an artifact."""
    _play_gitlab(pipeline.read_text(), bed, project, local, bed.root / "gl-artifacts")
    return bed.run


def _play_gitlab(text: str, bed: Bed, project: dict[str, str], local: dict[str, Path], store: Path) -> bool:
    data = _load_gitlab(text, local)
    stages = data.get("stages", ["build", "test", "deploy"])
    names = [n for n in data if n not in GITLAB_KEYWORDS and not n.startswith(".")]
    results: dict[str, str] = {}
    for stage in stages:
        for name in names:
            job = _resolved(name, data)
            if job.get("stage", "test") != stage:
                continue
            # on_success: every job it needs succeeded (with `needs`), else every job of the earlier stages
            before = [results.get(n, "") for n in job["needs"]] if "needs" in job else list(results.values())
            if job.get("when", "on_success") != "always" and any(r != "success" for r in before):
                results[name] = bed.run.jobs[name] = "skipped"
                continue
            ok = _gitlab_job(name, job, data, bed, project, local, store)
            results[name] = bed.run.jobs[name] = "success" if ok else "failure"
    return all(r == "success" for r in results.values())


def _gitlab_job(
    name: str,
    job: dict[str, Any],
    data: dict[str, Any],
    bed: Bed,
    project: dict[str, str],
    local: dict[str, Path],
    store: Path,
) -> bool:
    if "trigger" in job:
        (include,) = job["trigger"]["include"]
        child = (store / include["job"] / include["artifact"]).read_text()
        return _play_gitlab(child, bed, {**project, **data.get("variables", {})}, local, store / f"child-of-{name}")
    folder = bed.workspace(name)
    if store.exists():
        shutil.copytree(store / "all", folder, dirs_exist_ok=True) if (store / "all").exists() else None
    known = {**project, "CI_PROJECT_DIR": str(folder), "CI_JOB_ID": str(next(bed.serial)), "CI_JOB_NAME": name}
    for scope in (data.get("variables", {}), job.get("variables", {})):
        for key, value in scope.items():
            known[key] = expand(str(value), known)
    lines = [*job.get("before_script", []), *job.get("script", [])]
    code = bed.bash("\n".join(lines) + "\n", folder, {**bed.base_env, **known, "GITLAB_CI": "true"})
    artifacts = job.get("artifacts", {})
    if code == 0 or artifacts.get("when") == "always":
        for pattern in artifacts.get("paths", []):
            for path in folder.glob(pattern):
                for place in (store / name, store / "all"):
                    place.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, place / path.name)
    return code == 0
