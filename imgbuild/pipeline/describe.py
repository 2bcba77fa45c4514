"""What imgbuild knows of a promoted image, gathered once for its signed records (build.attest): the recipe, its
lock and commit, the base by digest, the distributions that imported with their licenses and hashes, the apt
packages, every copied file and every file a run step wrote by the sha256 of its content, the engine and
imgbuild's version, the smoke result."""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.supply.attest import Made, sha256

if TYPE_CHECKING:
    from imgbuild.pipeline.plan import Plan
    from imgbuild.recipe import LoadedRecipe


def _process_started() -> float:
    """When this process started (the run that builds and describes images), from the kernel's own record; now
    where there is none to read."""
    import os

    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


#: This run: its id (shared by the images it builds) and when it started.
_RUN = (uuid.uuid4().hex, _process_started())


def _file_hashes(loaded: LoadedRecipe) -> dict[str, str]:
    """Each copied file's place in the image and its content's sha256 (what `sha256sum` says of it there)."""
    out = {}
    for dest, files in sorted(loaded.file_manifest.items()):
        for f in files:
            h = hashlib.sha256()
            with open(f.path, "rb") as handle:
                while block := handle.read(1 << 20):
                    h.update(block)
            out[f"{dest}/{f.rel}" if f.rel else dest] = "sha256:" + h.hexdigest()
    return out


def _file_sha256(path: Path | None) -> str | None:
    return sha256(path.read_bytes()) if path and path.is_file() else None


def _git_commit(folder: Path) -> str | None:
    import subprocess

    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit) else None


def _git_dirty(loaded: LoadedRecipe) -> bool:
    """Whether the recipe, its parents or a file it names has changes git has not committed (or is untracked)."""
    import subprocess

    paths = [str(p) for p in [*loaded.chain, *loaded.file_sources.values()] if p]
    for extra in (loaded.requirements_path, loaded.lock_path):
        if extra:
            paths.append(str(extra))
    try:
        done = subprocess.run(
            ["git", "-C", str(Path(loaded.path).parent), "status", "--porcelain", "--", *paths],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


def describe(plan: Plan, smoke: dict[str, Any], image: str, digest: str, builder: dict[str, str]) -> Made:
    """`Made` for `plan`'s image pushed as `image@digest`; `smoke` is its smoke report (smoke.json)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    from imgbuild import __version__
    from imgbuild.recipe import stable_name

    loaded, recipe = plan.loaded, plan.loaded.recipe
    hashes: dict[str, tuple[str, ...]] = {}
    for line in loaded.requirements:
        try:
            name = canonicalize_name(Requirement(line.spec).name)
        except InvalidRequirement:
            continue
        values = tuple(h.split("=", 1)[-1].split(" ", 1)[-1] for h in line.hashes)
        hashes[str(name)] = values
    rows = (smoke.get("meta") or {}).get("added") or []
    added = tuple(
        (str(r[0]), str(r[1]), str(r[2])) for r in rows if isinstance(r, list) and len(r) >= 3 and r[0] and r[1]
    )
    fleet = tuple(
        f"{c['name']}: {c['status']}: {c.get('reason', '')}"[:300]
        for c in smoke.get("checks") or []
        if str(c.get("name", "")).startswith("fleet")
    )
    failed = [c for c in smoke.get("checks") or [] if c.get("status") == "fail"]
    return Made(
        image=image,
        digest=digest,
        tag=plan.tag,
        recipe_path=loaded.name,
        recipe_sha256=sha256(Path(loaded.path).read_bytes()),
        content_hash=plan.content_hash,
        git_commit=_git_commit(Path(loaded.path).parent),
        git_dirty=_git_dirty(loaded),
        finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_RUN[1])),
        invocation=_RUN[0],
        lock_path=stable_name(loaded.lock_path) if loaded.lock_path else None,
        lock_sha256=_file_sha256(loaded.lock_path),
        requirements_path=stable_name(loaded.requirements_path) if loaded.requirements_path else None,
        requirements_sha256=_file_sha256(loaded.requirements_path),
        pip=(*recipe.pip.packages, *(line.spec for line in loaded.requirements)),
        base_ref=plan.base.ref,
        base_digest=plan.base.digest or plan.base.image_id,
        added=added,
        hashes=hashes,
        apt=_debs(smoke, tuple(recipe.apt)),
        files={**_run_files(smoke), **_file_hashes(loaded)},  # a copied file is copied after the run steps
        builder=builder,
        imgbuild_version=__version__,
        smoke={"ok": bool(smoke.get("ok")), "failed": [c.get("name") for c in failed]},
        fleet=fleet,
    )


def _run_files(smoke: dict[str, Any]) -> dict[str, str]:
    """Each file the recipe's run steps wrote and its sha256, as the image recorded them when they ran (smoke
    report's `run_files`); rows of another shape are dropped, read by the image's own parser."""
    from imgbuild.payload.smoke.sbom import RUN_FILES_MAX, run_file_row

    rows = (smoke.get("meta") or {}).get("run_files")
    if not isinstance(rows, list):
        return {}
    return {
        r[0]: "sha256:" + r[1]
        for r in rows[:RUN_FILES_MAX]
        if isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r) and run_file_row(r[0], r[1])
    }  # fmt: skip


def _debs(smoke: dict[str, Any], asked: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(package, version) of the Debian packages the image added over its base, as its smoke test read them with
    dpkg (the recipe's apt packages and what apt pulled in); where the test could not read them (a base without
    dpkg), the recipe's own names, version unknown. The smoke report comes from the image: rows of another shape
    are dropped."""
    from imgbuild.payload.smoke.sbom import DEB_LINE  # the one reading of a dpkg row, the image's own

    rows = (smoke.get("meta") or {}).get("debs")
    if not isinstance(rows, list):
        return tuple((name, "") for name in asked)
    found = [
        (r[0], r[1])
        for r in rows[:100000]
        if isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)
        and (line := DEB_LINE.fullmatch(f"{r[0]}\t{r[1]}")) and line.group(1) == r[0]
    ]  # fmt: skip
    return tuple(found)
