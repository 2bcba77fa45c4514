"""`imgbuild lock`: resolve a recipe's pip packages in its base, once, on purpose, and write what pip chose.

The resolution runs the build's own `install.sh` in the base image (the same pins, framework protection,
unpin, index and CA settings) with `pip install --dry-run --report`. The result, `name==version` for every
package the recipe adds, goes to `<recipe>.lock.txt` beside the recipe: reviewed in the merge request, part of
the recipe's hash (so `rebuild` rebuilds when it changes and never because an unpinned requirement would now
resolve differently), and installed again as constraints by every build. `--upgrade` resolves afresh;
`--upgrade-package P` frees only P.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from imgbuild.engine.probe import Probe
from imgbuild.errors import BuildFailed, UsageError
from imgbuild.recipe import LoadedRecipe, lock_path_for

MARKER = "IMGBUILD-LOCK-REPORT "

_SCRIPT = """
import base64, json, os, subprocess, sys
files = json.loads(base64.b64decode(FILES))
os.makedirs("/tmp/imgbuild-pip", exist_ok=True)
for name, text in files.items():
    with open(os.path.join("/tmp/imgbuild-pip", name), "w") as handle:
        handle.write(text)
env = dict(os.environ, IMGBUILD_PIP_REPORT="/tmp/imgbuild-report.json", PIP_NO_CACHE_DIR="1")
# The index credentials come on standard input (never a file of the image or the container's config) and
# are kept on a tmpfs only while pip runs.
size = sys.stdin.buffer.readline().strip()
secret = sys.stdin.buffer.read(int(size)) if size.isdigit() else b""
if secret:
    fd = os.open("/run/imgbuild/pip.conf", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secret)
    os.close(fd)
    env["PIP_CONFIG_FILE"] = "/run/imgbuild/pip.conf"
proc = subprocess.run(["sh", "/tmp/imgbuild-pip/install.sh"], capture_output=True, text=True, env=env)
if secret:
    os.remove("/run/imgbuild/pip.conf")  # gone before anything else runs
result = {"ok": proc.returncode == 0, "tail": (proc.stdout + proc.stderr).strip().splitlines()[-12:], "install": []}
if proc.returncode == 0:
    report = json.load(open("/tmp/imgbuild-report.json"))
    result["install"] = [[i["metadata"]["name"], i["metadata"]["version"]] for i in report.get("install", [])]
print("IMGBUILD-LOCK-REPORT " + json.dumps(result))
"""


@dataclass
class LockResult:
    path: Path
    pins: list[str]
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # "name old -> new"

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "path": str(self.path)}


def _pins(install: Any) -> list[str]:
    """`name==version` of what pip said it would install; a row of any other shape is not a pin (the answer comes
    from a container of the base, which is trusted as much as the build that runs on it, and no more)."""
    rows = install if isinstance(install, list) else []
    pins = {
        f"{row[0]}=={row[1]}"
        for row in rows[:10000]
        if isinstance(row, list) and len(row) == 2 and all(isinstance(x, str) for x in row)
        and _NAME.fullmatch(row[0]) and _VERSION.fullmatch(row[1])
    }  # fmt: skip
    return sorted(pins)


_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9.+!_-]{1,100}")


def diff(old: list[str] | tuple[str, ...], new: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(added, removed, changed) between two lists of `name==version`."""

    def by_name(pins: list[str] | tuple[str, ...]) -> dict[str, str]:
        return {canonicalize_name(p.split("==", 1)[0]): p.split("==", 1)[1] for p in pins}

    before, after = by_name(old), by_name(new)
    added = [f"{n}=={v}" for n, v in sorted(after.items()) if n not in before]
    removed = [f"{n}=={v}" for n, v in sorted(before.items()) if n not in after]
    changed = [f"{n} {before[n]} -> {v}" for n, v in sorted(after.items()) if n in before and before[n] != v]
    return added, removed, changed


def _outgrown(loaded: LoadedRecipe) -> list[str]:
    """Packages whose locked version the recipe's own requirements now exclude (it was edited since): these
    are resolved again, not kept."""
    from packaging.requirements import Requirement

    from imgbuild.build.plan import lock_conflict, lock_index, recipe_specs

    locked = lock_index(loaded)
    asked = [Requirement(spec) for _, spec in recipe_specs(loaded)]
    return [str(canonicalize_name(req.name)) for req in asked if lock_conflict(req, locked, "")]


def lock(
    recipe_path: str | Path,
    settings: Any,
    *,
    upgrade: bool = False,
    upgrade_packages: tuple[str, ...] = (),
    engine: Any = None,
) -> LockResult:
    from imgbuild.build.pipeline import build_secrets, pip_bounds
    from imgbuild.build.render import render
    from imgbuild.build.resolve import plan_recipe
    from imgbuild.engine import connect_engine
    from imgbuild.recipe import load_recipe

    loaded = load_recipe(recipe_path, secrets=settings.secrets())
    if not (loaded.recipe.pip.packages or loaded.requirements_path):
        raise UsageError(f"{loaded.display}: the recipe installs no pip packages: there is nothing to lock")
    old = loaded.lock_pins
    freed = {str(canonicalize_name(p)) for p in upgrade_packages}
    freed |= set(_outgrown(loaded))
    kept = () if upgrade else tuple(p for p in old if canonicalize_name(p.split("==")[0]) not in freed)
    resolving: LoadedRecipe = dataclasses.replace(loaded, lock_pins=kept)
    engine = engine or connect_engine(settings)
    plan = plan_recipe(resolving, settings, engine, with_pins=True)
    context = render(plan)
    files = {
        path.rsplit("/", 1)[1]: content.decode()
        for path, (content, _) in context.rendered.items()
        if path.startswith("imgbuild/pip/")
    }
    secret = b""
    with ExitStack() as stack:
        secrets = build_secrets(settings, loaded, stack)
        if "imgbuild-ca.crt" in secrets:
            files["ca.crt"] = secrets["imgbuild-ca.crt"].read_text()  # a CA bundle is public
        if "imgbuild-pip.conf" in secrets:
            secret = secrets["imgbuild-pip.conf"].read_bytes()  # index credentials: memory and stdin only
    payload = base64.b64encode(json.dumps(files).encode()).decode()
    probe = Probe("lock", f"FILES = {payload!r}\n" + _SCRIPT, MARKER)
    if engine.images.image(plan.base.pinned) is None:
        engine.images.pull(plan.base.pinned)
    bounds = pip_bounds(settings)
    code, output, _ = engine.containers.run_script(
        plan.base.pinned, probe, [], bounds, stdin=secret, gpus=None, timeout=1800
    )
    report = probe.answer(output) or {"ok": False, "tail": output.strip().splitlines()[-10:]}
    if not report.get("ok"):
        tail = "\n".join(f"  | {line}" for line in report.get("tail", [])[-10:])
        raise BuildFailed(f"pip could not resolve the recipe's packages in {plan.base.ref}:\n{tail}")
    pins = _pins(report.get("install"))
    added, removed, changed = diff(old, pins)
    path = lock_path_for(loaded.path)
    header = (
        f"# imgbuild lock: what pip resolved for {loaded.path.name} in {plan.base.ref}; `imgbuild lock` refreshes it.\n"
    )
    from imgbuild.regular import write_atomic

    write_atomic(path, header + "".join(f"{pin}\n" for pin in pins))  # a kill leaves the old lock whole, or the new
    return LockResult(path, pins, added, removed, changed)
