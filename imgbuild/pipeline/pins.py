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
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packaging.utils import canonicalize_name

from imgbuild.engine.probe import SCRIPT_CACHE
from imgbuild.errors import BuildFailed, UsageError
from imgbuild.facts import UV_VERSION
from imgbuild.payload.probes import LOCK
from imgbuild.recipe import LoadedRecipe, lock_path_for
from imgbuild.recipe.load import MAX_HASHES
from imgbuild.text import printable

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.engine.types import ImageEngine
    from imgbuild.pipeline.plan import Plan
    from imgbuild.recipe.reqfile import ReqLine


@dataclass
class LockResult:
    path: Path
    pins: list[str]
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # "name old -> new"
    resolver: str = "pip"  # what resolved: the recipe's installer (uv or pip)
    hashed: bool = False  # each pin carries the sha256 of its files on the index
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "path": str(self.path)}


def _pins(install: Any) -> dict[str, tuple[str, ...]]:
    """`name==version` -> the sha256 of its files, of what the resolver said it would install; a row of any other
    shape is not a pin (the answer comes from a container of the base, which is trusted as much as the build that
    runs on it, and no more)."""
    rows = install if isinstance(install, list) else []
    pins: dict[str, tuple[str, ...]] = {}
    for row in rows[:10000]:
        if not (isinstance(row, list) and len(row) in (2, 3) and all(isinstance(x, str) for x in row[:2])):
            continue
        if not (_NAME.fullmatch(row[0]) and _VERSION.fullmatch(row[1])):
            continue
        digests = row[2] if len(row) == 3 else []
        if not isinstance(digests, list):
            continue
        good = [d for d in digests[:MAX_HASHES] if isinstance(d, str) and _SHA256.fullmatch(d)]
        pins[f"{row[0]}=={row[1]}"] = tuple(sorted(set(good))) if len(good) == len(digests) else ()
    seen: dict[str, str] = {}
    for pin in pins:
        name = str(canonicalize_name(pin.split("==")[0]))
        if seen.setdefault(name, pin) != pin:  # a resolution installs one version of a name
            raise BuildFailed(f"the resolver's answer names {name} twice ({seen[name]}, {pin}): no lock written")
    return dict(sorted(pins.items()))


_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9.+!_-]{1,100}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


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

    from imgbuild.pipeline.plan import lock_conflict, lock_index, recipe_specs

    locked = lock_index(loaded)
    asked = [Requirement(spec) for _, spec in recipe_specs(loaded)]
    return [str(canonicalize_name(req.name)) for req in asked if lock_conflict(req, locked, "")]


def _old_lines(loaded: LoadedRecipe) -> tuple[ReqLine, ...]:
    """The old lock's `name==version` lines that read as such (bounded, inside the repository), each with its
    place; nothing where there is none or it cannot be read. Preferences only: the resolver may move any of them."""
    from imgbuild.errors import Problem
    from imgbuild.recipe.load import read_lock, repository_root

    ignored: list[Problem] = []  # what validate would refuse in it is cured by writing it again
    _, lines = read_lock(loaded.path, loaded.root or repository_root(loaded.path.parent), ignored)
    return tuple(lines)


def _admitted(old: tuple[str, ...], freed: set[str], plan: Plan) -> tuple[str, ...]:
    """The old pins the resolution may keep: not freed (--upgrade-package, outgrown by the recipe), and none the
    base refuses (its framework, its pinned packages): a pin the base would refuse is resolved afresh."""
    refused = _base_refuses(old, plan)
    return tuple(s for s in old if str(canonicalize_name(s.split("==")[0])) not in freed and s not in refused)


def _base_refuses(specs: tuple[str, ...] | list[str], plan: Plan) -> list[str]:
    """The `name==version` pins of `specs` the build would refuse: the base's framework or CUDA libraries, or a
    version its pins exclude (baserules.base_refuses, the rule validate and the build apply)."""
    from imgbuild.pipeline.baserules import base_pin_versions, base_refuses
    from imgbuild.recipe.reqfile import LockedPin

    held = base_pin_versions(plan.base, plan.loaded.recipe.pip.unpin)
    return [s for s in specs if base_refuses(LockedPin.of(s), plan.base, held)]


def lockable(recipe_path: str | Path, settings: Settings) -> LoadedRecipe:
    """The recipe `imgbuild lock` resolves, judged before any engine is asked. The lock is what this command
    writes: a stale or refused lock never stops it (the cure validate and build name), so it is not read here."""
    from imgbuild.recipe import load_recipe

    loaded = load_recipe(recipe_path, secrets=settings.secrets(), lock=False)
    if not (loaded.recipe.pip.packages or loaded.requirements_path):
        raise UsageError(f"{loaded.display}: the recipe installs no pip packages: there is nothing to lock")
    return loaded


def lock(
    loaded: LoadedRecipe,
    settings: Settings,
    engine: ImageEngine,
    *,
    upgrade: bool = False,
    upgrade_packages: tuple[str, ...] = (),
    on_line: Callable[[str], None] | None = None,
) -> LockResult:
    """Resolve and write the lock of `loaded` (lockable's); `on_line` is shown what the resolver is doing, line by
    line, as it comes. The old lock's acceptable lines are kept as preferences, the rest resolved afresh."""
    from imgbuild.pipeline.render import render
    from imgbuild.pipeline.resolve import plan_recipe
    from imgbuild.pipeline.scratch import pip_bounds
    from imgbuild.pipeline.secrets import build_secrets

    lines = _old_lines(loaded)
    old = tuple(line.spec for line in lines)
    freed = {str(canonicalize_name(p)) for p in upgrade_packages}
    # what the recipe now excludes, judged against the old lock's lines (validate's own rule, lock_index)
    freed |= set(_outgrown(dataclasses.replace(loaded, lock_pins=old, lock_lines=lines)))
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
        secrets = build_secrets(settings, loaded.ca_bundle_path, stack)
        if "imgbuild-ca.crt" in secrets:
            files["ca.crt"] = secrets["imgbuild-ca.crt"].read_text()  # a CA bundle is public
        if "imgbuild-pip.conf" in secrets:
            secret = secrets["imgbuild-pip.conf"].read_bytes()  # index credentials: memory and stdin only
    payload = base64.b64encode(json.dumps(files).encode()).decode()
    uv = f"uv=={UV_VERSION}" if loaded.recipe.pip.installer == "uv" else ""
    probe = LOCK.probe(f"\nmain({payload!r}, {SCRIPT_CACHE!r}, {uv!r})\n")
    if engine.images.image(plan.base.pinned) is None:
        engine.images.pull(plan.base.pinned)
    from imgbuild.hostio.acting import container_user

    bounds = pip_bounds(settings)
    shown = (lambda line: _show(line, on_line)) if on_line is not None else None
    code, output, _ = engine.containers.run_script(
        plan.base.pinned, probe, [], bounds, stdin=secret, gpus=None, timeout=1800, cache=cache_volume(),
        on_line=shown, as_user=container_user(settings),
    )  # fmt: skip
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
    _refuse_what_the_base_refuses(pins, plan)
    # Hashes go in only where every pin has them: pip's hash-checking mode takes a file whole or not at all.
    hashed = bool(pins) and all(resolved[p] for p in pins)
    notes = [printable(str(report.get("note") or ""))] if report.get("note") else []
    if pins and not hashed:
        bare = next(p for p in pins if not resolved[p])
        notes.append(f"the index gave no sha256 for {bare}: the lock has no hashes")
    added, removed, changed = diff(old, pins)
    path = lock_path_for(loaded.path)
    resolver = "uv" if report.get("resolver") == "uv" else "pip"
    header = (
        f"# imgbuild lock: what {resolver} resolved for {loaded.path.name} in {plan.base.ref}; "
        "`imgbuild lock` refreshes it.\n"
    )
    comments = "".join(
        f"# {p}: a CUDA library a requirement pulls in, installed by the build, not pinned here\n" for p in cuda
    )
    written = "".join(
        " ".join((p, *(f"--hash=sha256:{h}" for h in resolved[p]))) + "\n" if hashed else f"{p}\n" for p in pins
    )
    from imgbuild.hostio.regular import write_atomic

    write_atomic(path, header + comments + written)  # a kill leaves the old or the new
    return LockResult(path, pins, added, removed, changed, resolver, hashed, notes)


def _refuse_what_the_base_refuses(pins: list[str], plan: Plan) -> None:
    """A lock that the build would refuse is never written (the resolution runs under the base's pins, so only an
    answer that ignored them holds such a pin)."""
    refused = _base_refuses(pins, plan)
    if refused:
        raise BuildFailed(
            f"the resolver would install {', '.join(refused)}, which the base refuses (its framework, or a version "
            f"its pins exclude): no lock written; `imgbuild build` names the requirement that asks for it"
        )


def cache_volume() -> str:
    """The engine volume that keeps the caller's pip and uv caches (and uv itself) between locks: one per user, so
    one user's lock never reads what another's wrote."""
    import os

    return f"imgbuild-lock-cache-{os.getuid()}"


_RESOLVER_LINE = re.compile(r"(?:Collecting|Downloading|Using cached|Resolved|Prepared|Would install) \S")


def _show(line: str, on_line: Callable[[str], None]) -> None:
    """What the resolver says that a user wants to see (imgbuild's own status lines, pip's and uv's progress),
    made safe to show: the base's output is not trusted with a terminal."""
    if line.startswith("imgbuild: ") or _RESOLVER_LINE.match(line):
        on_line(printable(line))
