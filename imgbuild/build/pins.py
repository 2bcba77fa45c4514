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


def _old_pins(loaded: LoadedRecipe) -> tuple[str, ...]:
    """The old lock's `name==version` lines that read as such (bounded, inside the repository); nothing where
    there is none or it cannot be read. Preferences only: the resolver may move any of them."""
    from imgbuild.errors import Problem
    from imgbuild.recipe.load import read_lock, repository_root

    ignored: list[Problem] = []  # what validate would refuse in it is cured by writing it again
    _, lines = read_lock(loaded.path, loaded.root or repository_root(loaded.path), ignored)
    return tuple(line.spec for line in lines)


def _admitted(old: tuple[str, ...], freed: set[str], plan: Any) -> tuple[str, ...]:
    """The old pins the resolution may keep: not freed (--upgrade-package, outgrown by the recipe), and none the
    base refuses (its framework, its pinned packages): a pin the base would refuse is resolved afresh."""
    from imgbuild.build.plan import base_pin_versions, base_refuses
    from imgbuild.recipe.reqfile import LockedPin

    pins = base_pin_versions(plan.base, plan.loaded.recipe.pip.unpin)
    kept = []
    for spec in old:
        req = LockedPin.of(spec)
        if str(canonicalize_name(req.name)) in freed:
            continue
        if base_refuses(req, plan.base, pins):
            continue
        kept.append(spec)
    return tuple(kept)


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

    # The lock is what this command writes: a stale or refused lock never stops it (the cure validate and build
    # name). The old lock's acceptable lines are kept as preferences, the rest resolved afresh.
    loaded = load_recipe(recipe_path, secrets=settings.secrets(), lock=False)
    if not (loaded.recipe.pip.packages or loaded.requirements_path):
        raise UsageError(f"{loaded.display}: the recipe installs no pip packages: there is nothing to lock")
    old = _old_pins(loaded)
    freed = {str(canonicalize_name(p)) for p in upgrade_packages}
    freed |= set(_outgrown(dataclasses.replace(loaded, lock_pins=old, lock_lines=())))
    engine = engine or connect_engine(settings)
    plan = plan_recipe(loaded, settings, engine, with_pins=True)
    kept = () if upgrade else _admitted(old, freed, plan)
    plan = dataclasses.replace(plan, loaded=dataclasses.replace(loaded, lock_pins=kept))
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
    from imgbuild.ngc import is_cuda_library

    resolved = _pins(report.get("install"))
    # What validate and build refuse in a lock is never written as a pin: a CUDA library a requirement pulls in
    # (jax[cuda13] -> nvidia-cuda-nvcc) stays a comment, installed by the build as the requirement asks.
    cuda = [p for p in resolved if is_cuda_library(str(canonicalize_name(p.split("==")[0])))]
    pins = [p for p in resolved if p not in cuda]
    added, removed, changed = diff(old, pins)
    path = lock_path_for(loaded.path)
    header = (
        f"# imgbuild lock: what pip resolved for {loaded.path.name} in {plan.base.ref}; `imgbuild lock` refreshes it.\n"
    )
    notes = "".join(
        f"# {p}: a CUDA library a requirement pulls in, installed by the build, not pinned here\n" for p in cuda
    )
    from imgbuild.regular import write_atomic

    write_atomic(path, header + notes + "".join(f"{pin}\n" for pin in pins))  # a kill leaves the old or the new
    return LockResult(path, pins, added, removed, changed)
