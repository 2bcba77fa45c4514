"""Build contexts on disk: write one atomically, compare one with what a recipe renders to now.

The committed side (`images/<name>/`) comes from the repository: only its regular files are read, and a
symlink or a FIFO there counts as a difference, never as something to follow or block on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.errors import EnvironmentProblem, UsageError
from imgbuild.hostio.tree import TooDeep, walk
from imgbuild.pipeline.render import OWN_FOLDERS, OWN_SCRIPTS, RUN_FILES, Context, render, template_cache

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.pipeline.plan import Plan


def context_path(name: str, root: Path | None, settings: Settings) -> Path:
    """`images/<name>/` in the recipe's repository (`root`): a relative `images_dir` is the repository's,
    wherever imgbuild runs from; an absolute one is used as it is."""
    images = Path(settings.images_dir)
    return (images if images.is_absolute() else (root or Path.cwd()) / images) / name


def context_dir(plan: Plan, settings: Settings, out: str | Path | None = None) -> Path:
    """`-o DIR`, else the recipe's `images/<name>/` (context_path)."""
    return Path(out) if out else context_path(plan.loaded.recipe.name, plan.loaded.root, settings)


def render_into(plan: Plan, ctx: Path, backend: str, settings: Settings) -> Path:
    """Render `plan` and write it to `ctx` (see context.write_context)."""
    return write_context(render(plan, backend, template_cache(settings.cache_dir)), ctx, settings.secrets())


def render_checked(plan: Plan, backend: str, settings: Settings) -> Context:
    """Render `plan` in memory (`render --stdout`), refused as render_into would refuse it: no secret in it."""
    context = render(plan, backend, template_cache(settings.cache_dir))
    check_no_secrets(context, settings.secrets())
    return context


def check_no_secrets(context: Context, secrets: tuple[str, ...] | list[str]) -> None:
    """No configured secret's value may be written into a rendered file (it is committed and built)."""
    wanted = [s.encode() for s in secrets if s and len(s) >= 4]
    for path, (data, _) in sorted(context.rendered.items()):
        if any(w in data for w in wanted):
            raise UsageError(
                f"{path}: a configured secret would be written into the rendered context; remove it from the recipe"
            )


def write_context(context: Context, out_dir: Path, secrets: tuple[str, ...] | list[str] = ()) -> Path:
    """Write `context` to `out_dir`, replacing what was there only once all of it is written.

    A failure (a refused secret, a full disk, Ctrl-C) leaves `out_dir` as it was and no staging folder;
    the smoke report of the previous build is kept. The repository may have committed `images/` or
    `images/<name>` as a symlink to anywhere: contexts are written into real folders only. A folder that
    cannot be written is an environment problem (exit 3)."""
    check_no_secrets(context, secrets)
    for folder in (out_dir, out_dir.parent):
        if folder.is_symlink():
            raise UsageError(f"{folder} is a symbolic link; imgbuild writes build contexts into real folders only")
    try:
        return _write(context, out_dir)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write the build context {exc.filename or out_dir}: {exc.strerror}") from None


def _write(context: Context, out_dir: Path) -> Path:
    staging = out_dir.with_name(f".{out_dir.name}.rendering.{os.getpid()}")  # two renders never share one
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        for rel, (data, mode) in sorted(context.rendered.items()):
            _put(staging / rel, mode, data=data)
        for rel, (source, mode) in sorted(context.copies.items()):
            _put(staging / rel, mode, source=source)  # streamed: a copied file never passes through memory
        for keep in RUN_FILES:
            if (out_dir / keep).is_file() and not (out_dir / keep).is_symlink():
                shutil.copy2(out_dir / keep, staging / keep)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    with _swap_lock(out_dir.parent):
        _swap(staging, out_dir)
    return out_dir


@contextlib.contextmanager
def _swap_lock(parent: Path) -> Iterator[None]:
    """Hold an exclusive lock on the folder that holds the context while the old one is swapped out.

    Two renders of one recipe at once would otherwise interleave their two renames and one of them
    could leave the previous context behind as a hidden folder. The lock is on the folder itself, so
    nothing is left behind for it either."""
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _swap(staging: Path, out_dir: Path) -> None:
    old = out_dir.with_name(f".{out_dir.name}.old.{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    try:
        if out_dir.exists():
            out_dir.rename(old)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old.exists() and not out_dir.exists():
            old.rename(out_dir)  # put the working context back
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _put(path: Path, mode: int, *, data: bytes | None = None, source: Path | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if source is not None:
        shutil.copyfile(source, path, follow_symlinks=True)
    else:
        path.write_bytes(data or b"")
    os.chmod(path, mode)


def diff_context(context: Context, folder: Path) -> list[str]:
    """The paths where `folder` differs from `context` (missing, extra, other content); nothing is written.

    imgbuild's own scripts are not compared (a clean checkout has none; the lock records their digest)."""
    have: set[str] = set()
    odd: set[str] = set()
    try:
        tree = list(walk(folder))
    except TooDeep as exc:
        raise UsageError(str(exc)) from None
    for root, dirs, names in tree:
        for name in names + [d for d in dirs if Path(root, d).is_symlink()]:
            entry = Path(root, name)
            rel = entry.relative_to(folder).as_posix()
            (have if entry.is_file() and not entry.is_symlink() else odd).add(rel)
    have -= {*RUN_FILES, *OWN_SCRIPTS, *(rel for rel in have if rel.startswith(OWN_FOLDERS))}
    want = context.paths() - set(OWN_SCRIPTS)
    changed = (want ^ have) | odd
    for rel in sorted(want & have):
        if rel in context.rendered:
            same = _same_bytes(folder / rel, context.rendered[rel][0])
        else:
            same = _same_file(folder / rel, context.copies[rel][0])
        if not same:
            changed.add(rel)
    return sorted(changed)


def _same_bytes(path: Path, data: bytes) -> bool:
    return path.stat().st_size == len(data) and path.read_bytes() == data


def _same_file(path: Path, source: Path) -> bool:
    import filecmp

    return filecmp.cmp(path, source, shallow=False)
