"""A scripted user: reads what imgbuild said (its own lines, never a package's) and does literally what it says,
every cure at once, as a user reading every line would. The cures it knows are the ones imgbuild prints (each a
whole phrase, as written in imgbuild's messages); anything else leaves it stuck, and that is counted against
imgbuild, not guessed around.

Used by `benchmarks/realsets.py --follow`; tests/test_follow.py holds each cure to imgbuild's own words.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
NAMES = rf"{NAME}(?:(?:, | and ){NAME})*"  # imgbuild's spoken list: "a", "a and b", "a, b and c"
APT = re.compile(r"add (?:to the recipe: )?apt: \[([^\]\n]+)\]")
NO_ISOLATION = re.compile(rf"add ({NAMES}) to pip\.no_build_isolation")
UNPIN = re.compile(r"pip\.unpin: \[([^\]\n]+)\](?! cannot help)")  # "pip.unpin: [numpy] cannot help: ..." is no cure
OTHER_CUDA = re.compile(
    rf"({NAME}(?:\[[^\]\n]+\])?) is built for CUDA [0-9]+.*ask for the CUDA [0-9]+ build \(([^)\n]+)\)"
)
#: the extra the project lacks: "spacy declares no [cuda13x] extra: ask for spacy and cupy-cuda13x (the CUDA 13 ..."
EXTRA_LACKS = re.compile(rf"({NAME}) declares no \[[^\]\n]+\] extra: ask for \1 and ({NAMES}) \(the CUDA [0-9]+ build")
#: the smoke test's other-CUDA cure, checked against the index: "vllm 0.2.5: ask for its CUDA 13 build,
#: vllm==0.11.0+cu130 (on the index), ..." or "... build, faiss-gpu-cu13 (on the index)"
CUDA_BUILD = re.compile(rf"({NAME}) \S+: ask for its CUDA [0-9]+ build, ({NAME}(?:==[^\s,]+)?) \(on the index\)")
#: the pip step's, for what an install brought: "faiss-gpu brought CUDA 12 libraries (...) beside the base's CUDA 13:
#: ...: ask for its CUDA 13 build, faiss-gpu-cu13 (on the index), or use a base with CUDA 12"
BROUGHT = re.compile(
    rf"({NAME}) brought CUDA [0-9]+ libraries .*?: ask for its CUDA [0-9]+ build, ({NAME}) \(on the index\)"
)
#: NGC's pre-release framework: "... drop the pin, or write it to admit the pre-release (torch>=2.9.0a0)"
PRERELEASE = re.compile(rf"write it to admit the pre-release \(({NAME})(>=[^)\s]+)\)")
BY_VERSION = re.compile(rf"ask for (?:it|this one) by its version \(({NAME})==([^)\s]+)\)")
#: the pin the guard asked the resolver for before naming it
PIN = re.compile(rf"pin ({NAME})==([^\s,;()]+) \(the newest release that resolves with the base\)")
RESTORE = re.compile(rf"pin ({NAME}) to the release {NAME} was made for \(({NAME}[<>=!~][^)\s]+)\)")
TOOL = re.compile(rf"add ({NAME}) to pip\.packages")
ACCEPT = re.compile(r"smoke\.accept_pip_check: \[([^\]\n]+)\]")
#: a package whose only cure is to go: a binary wheel built for another framework build, or one that needs
#: another distribution of the base's framework
DROP = re.compile(
    rf"no recipe field changes a binary wheel: drop "
    rf"(?:({NAME}) \(what uses it|((?:{NAME}, )*{NAME}), which requires? it)"
    rf"|\(drop ({NAME}), or pin a release of it that needs no "
)
LOCK = re.compile(r"run imgbuild lock")
#: the cures other than dropping the line: a refusal that names one of them is cured by it
CURES = (APT, NO_ISOLATION, UNPIN, OTHER_CUDA, EXTRA_LACKS, CUDA_BUILD, BROUGHT, PRERELEASE, BY_VERSION, RESTORE, TOOL)
CURES += (ACCEPT, PIN)
#: a plan-time refusal at its place: FILE:LINE:COL: pip.requirements: ... or pip.packages[I]: ...
LOCATED = re.compile(r"(\S+?):([0-9]+):[0-9]+: pip\.(?:requirements|packages\[([0-9]+)\]): (.*)")


def _pip(data: dict) -> dict:
    pip = data.get("pip") or {}
    if isinstance(pip, list):
        pip = {"packages": pip}
    data["pip"] = pip
    return pip


def add(data: dict, path: tuple[str, ...], names: list[str]) -> None:
    """`names` appended to the recipe's list at `path` (`("apt",)`, `("pip", "unpin")`), each once."""
    where = data if path[0] != "pip" else _pip(data)
    for key in path[1:-1] if path[0] == "pip" else path[:-1]:
        where = where.setdefault(key, {})
    key = path[-1]
    where[key] = [*where.get(key, []), *[n for n in names if n not in where.get(key, [])]]


def _replace(recipe: Path, data: dict, old: str, new: str) -> bool:
    """The requirement `old` (its name, with extras) becomes `new`, in pip.packages or the requirements file."""
    pip = _pip(data)
    key = re.sub(r"\[.*", "", old).lower()

    def same(line: str) -> bool:
        found = re.match(NAME + r"(?:\[[^\]]*\])?", line.strip())
        return found is not None and (found.group(0) == old or re.sub(r"\[.*", "", found.group(0)).lower() == key)

    packages = pip.get("packages", [])
    if any(same(p) for p in packages):
        pip["packages"] = [new if same(p) else p for p in packages]
        return True
    if pip.get("requirements"):
        file = recipe.parent / pip["requirements"]
        lines = file.read_text().splitlines()
        if any(same(ln) for ln in lines):
            file.write_text("".join(f"{new if same(ln) else ln}\n" for ln in lines))
            return True
    return False


def _drop(said: str, recipe: Path, data: dict) -> list[str]:
    """The requirement lines whose one cure is to drop them ("the base's framework is protected: drop it"),
    dropped, each at the place the line names; what was dropped."""
    lines: dict[Path, set[int]] = {}
    items: set[int] = set()
    for line in said.splitlines():
        found = LOCATED.match(line.removeprefix("imgbuild: ").strip())
        if not found or "drop" not in found.group(4) or any(p.search(found.group(4)) for p in CURES):
            continue
        if found.group(3) is not None:
            items.add(int(found.group(3)))
        else:
            file = Path(found.group(1))
            lines.setdefault(file if file.is_absolute() else recipe.parent.parent / file, set()).add(
                int(found.group(2))
            )
    dropped = []
    pip = _pip(data)
    if items:
        dropped += [p for i, p in enumerate(pip.get("packages", [])) if i in items]
        pip["packages"] = [p for i, p in enumerate(pip.get("packages", [])) if i not in items]
    for file, numbers in lines.items():
        text = file.read_text().splitlines()
        dropped += [ln for n, ln in enumerate(text, 1) if n in numbers]
        file.write_text("".join(f"{ln}\n" for n, ln in enumerate(text, 1) if n not in numbers))
    return dropped


def _listed(pattern: re.Pattern[str], text: str, data: dict, path: tuple[str, ...]) -> str:
    """Every `[a, b]` list the words give in `pattern`'s phrase (every line's, as a user reading them all would:
    one round), added to the recipe's list at `path`; what was done, or "" where the words give none."""
    names = list(dict.fromkeys(n.strip() for found in pattern.findall(text) for n in found.split(",")))
    if names:
        add(data, path, names)
    return f"{'.'.join(path)}: [{', '.join(names)}]" if names else ""


def _named(group: str) -> list[str]:
    """The names of imgbuild's spoken list ("a, b and c")."""
    return [n.strip() for n in re.split(r", | and ", group) if n.strip()]


def _remove(recipe: Path, data: dict, name: str) -> bool:
    """The requirement for `name` (any extras, any version) taken out of pip.packages or the requirements file."""
    key = re.sub(r"[-_.]+", "-", name).lower()

    def same(line: str) -> bool:
        found = re.match(NAME, line.strip())
        return found is not None and re.sub(r"[-_.]+", "-", found.group(0)).lower() == key

    pip = _pip(data)
    if any(same(p) for p in pip.get("packages", [])):
        pip["packages"] = [p for p in pip["packages"] if not same(p)]
        return True
    if pip.get("requirements"):
        file = recipe.parent / pip["requirements"]
        lines = file.read_text().splitlines()
        if any(same(ln) for ln in lines):
            file.write_text("".join(f"{ln}\n" for ln in lines if not same(ln)))
            return True
    return False


#: each cure that changes what a requirement asks for: its words, and (the requirement, what it becomes)
REPLACES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], tuple[str, str]]], ...] = (
    (OTHER_CUDA, lambda m: (m.group(1), m.group(2))),  # another CUDA's build: jax[cuda12] -> jax[cuda13]
    (EXTRA_LACKS, lambda m: (m.group(1), m.group(1))),  # spacy[cuda12x] -> spacy (and cupy-cuda13x beside it)
    (CUDA_BUILD, lambda m: (m.group(1), m.group(2))),  # vllm -> vllm==0.11.0+cu130
    (BROUGHT, lambda m: (m.group(1), m.group(2))),  # faiss-gpu -> faiss-gpu-cu13
    (PRERELEASE, lambda m: (m.group(1), m.group(1) + m.group(2))),  # torch>=2.9 -> torch>=2.9.0a0
    (BY_VERSION, lambda m: (m.group(1), f"{m.group(1)}=={m.group(2)}")),
    (PIN, lambda m: (m.group(1), f"{m.group(1)}=={m.group(2)}")),  # app<2 -> app==2.0, the release that resolves
)


def _replacing(text: str, recipe: Path, data: dict) -> list[str]:
    """The cures that change what a requirement asks for: another CUDA's build, the extra the project lacks, NGC's
    pre-release, a version by name."""
    done = []
    for pattern, change in REPLACES:
        for found in pattern.finditer(text):
            old, new = change(found)
            if not _replace(recipe, data, old, new):
                continue
            if pattern is EXTRA_LACKS:
                add(data, ("pip", "packages"), _named(found.group(2)))
                new = f"{new} and {found.group(2)}"
            done.append(f"asked for {new}")
    return done


def _adding(text: str, recipe: Path, data: dict) -> list[str]:
    """The cures that add to a recipe field: build isolation, apt, unpin, accepted pip-check lines, a build tool, a
    constraint."""
    done = []
    if names := list(dict.fromkeys(n for found in NO_ISOLATION.findall(text) for n in _named(found))):
        add(data, ("pip", "no_build_isolation"), names)
        done.append(f"pip.no_build_isolation: [{', '.join(names)}]")
    for pattern, path in ((APT, ("apt",)), (UNPIN, ("pip", "unpin")), (ACCEPT, ("smoke", "accept_pip_check"))):
        if listed := _listed(pattern, text, data, path):
            done.append(listed)
    if tools := list(dict.fromkeys(TOOL.findall(text))):
        add(data, ("pip", "packages"), tools)
        done.append(f"pip.packages: + {', '.join(tools)}")
    for found in RESTORE.finditer(text):
        add(data, ("pip", "constraints"), [found.group(2)])
        done.append(f"pip.constraints: [{found.group(2)}]")
    return done


def _dropping(text: str, recipe: Path, data: dict) -> list[str]:
    """The cure that takes a package out: by name (a binary wheel no field changes), or at the place a plan-time
    refusal names."""
    names = dict.fromkeys(n for found in DROP.findall(text) for group in found for n in group.split(", ") if n)
    done = [f"dropped {n}" for n in names if _remove(recipe, data, n)]
    if dropped := _drop(text, recipe, data):
        done.append("dropped " + ", ".join(dropped))
    return done


def imgbuilds_words(output: str) -> list[str]:
    """What imgbuild itself said in a command's output, a line each, from its "imgbuild: " on (its lines in the
    build log come after the engine's prefix; a line the progress cut short runs into the next one's), each once:
    never a package's or an installer's own words."""
    lines = [piece for ln in output.splitlines() for piece in re.split(r"(?=imgbuild: )", ln)]
    return list(dict.fromkeys(" ".join(ln.split()) for ln in lines if ln.startswith("imgbuild: ")))


def follow(said: str, recipe: Path, run: Callable[[list[str]], subprocess.CompletedProcess[str]]) -> str | None:
    """Apply every cure imgbuild's words name, as a user reading all of them would in one round; what was done
    ("; " between cures), or None (no cure it can follow)."""
    lines = imgbuilds_words(said)
    text = "\n".join(lines)  # no cure's words run from one line into the next (a line the progress cut short)
    data = yaml.safe_load(recipe.read_text())
    done = _replacing(text, recipe, data) + _adding(text, recipe, data)
    done += _dropping(text, recipe, data)
    done = list(dict.fromkeys(done))
    if done:
        recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    if LOCK.search(text) and run(["lock", str(recipe)]).returncode == 0:
        done.append("imgbuild lock")
    return "; ".join(done) or None


def imgbuild(cwd: Path) -> Callable[[list[str]], subprocess.CompletedProcess[str]]:
    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "imgbuild", *args], cwd=cwd, capture_output=True, text=True)

    return run
