"""Files a recipe may name: inside its repository, regular files, bounded in number and size.

A recipe is untrusted (it may come from a merge request), so every path it names (`files[].src`,
`extends`, `pip.requirements` and the files those nest, `pip.ca_bundle`) is resolved with symlinks
followed and must stay inside the recipe's repository: the git top level above the recipe, else the
folder that holds `recipes/`, else the recipe's own folder. Inside a copied folder, a symlink must
point inside the repository too, and only regular files and folders are copied (never a FIFO or a
device, which would block or leak). Nothing here echoes a file's content.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from imgbuild import limits
from imgbuild.hostio.tree import TooDeep, walk


class OutsideRepository(ValueError):
    """A path that leaves the repository or is not a plain file; the message is safe to print."""


def repository_root(folder: Path) -> Path:
    """The root the paths of a recipe in `folder` must stay inside (resolved): the folder as the recipe is named
    (its parent before symlinks are resolved, so a recipe that is a symlink out of its repository does not
    carry the root along with it)."""
    start = Path(os.path.abspath(folder))
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder.resolve()
    for folder in (start, *start.parents):
        if folder.name == "recipes":
            return folder.parent.resolve()
    return start.resolve()


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def resolve_inside(base_dir: Path, written: str, root: Path) -> Path:
    """`written` (relative to `base_dir`, or absolute) resolved with symlinks, checked to be under `root`."""
    if not written or "\0" in written:
        raise OutsideRepository("empty path")
    if len(written) > 4096:
        raise OutsideRepository("a path longer than 4096 characters")
    try:
        target = Path(base_dir, written).resolve()
    except (OSError, RuntimeError) as exc:  # a name too long, a symlink loop
        raise OutsideRepository(f"cannot resolve the path: {getattr(exc, 'strerror', None) or exc}") from None
    if not _inside(target, root):
        raise OutsideRepository(f"{written} is outside the recipe's repository ({root.name}/)")
    return target


@dataclass(frozen=True)
class SourceFile:
    """One file to copy: its path below the source (`""` for a single file), resolved path, exec bit, size."""

    rel: str
    path: Path
    executable: bool
    size: int


def regular_file(path: Path, written: str) -> os.stat_result:
    try:
        st = path.stat()
    except OSError as exc:
        raise OutsideRepository(f"cannot read {written}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutsideRepository(f"{written} is not a regular file")
    return st


def _refuse_git(src: Path, written: str, root: Path) -> None:
    if src.is_relative_to(root) and ".git" in src.relative_to(root).parts:
        raise OutsideRepository(f"{written} is inside .git (it may hold credentials; it is never copied)")


def source_files(src: Path, written: str, root: Path) -> list[SourceFile]:
    """The files under `src` (already resolved and inside `root`), sorted, every symlink checked."""
    try:
        st = src.stat()
    except OSError as exc:
        raise OutsideRepository(f"cannot read {written}: {exc.strerror}") from None
    _refuse_git(src, written, root)
    if stat.S_ISREG(st.st_mode):
        _within_limits(1, st.st_size, written)  # one file is bounded as a folder is (a sparse 3 GiB file was not)
        return [SourceFile("", src, bool(st.st_mode & stat.S_IXUSR), st.st_size)]
    if not stat.S_ISDIR(st.st_mode):
        raise OutsideRepository(f"{written} is not a regular file or folder")
    found: list[SourceFile] = []
    total = 0
    try:
        for folder, dirs, names in walk(src):
            here = Path(folder)
            dirs[:] = [d for d in dirs if d != ".git"]  # a checkout's .git may hold a CI token: never copied
            linked = [d for d in dirs if (here / d).is_symlink()]
            if linked:
                raise OutsideRepository(
                    f"{written}: {(here / linked[0]).relative_to(src)} is a symlink to a folder (copy the folder "
                    "itself)"
                )
            here_files = [_source_file(here / name, src, written, root) for name in names if name != ".git"]
            found += here_files
            total += sum(f.size for f in here_files)
            _within_limits(len(found), total, written)
    except TooDeep:
        raise OutsideRepository(f"{written} holds folders nested more than {limits.TREE_DEPTH} deep") from None
    return sorted(found, key=lambda f: f.rel)


def _source_file(entry: Path, src: Path, written: str, root: Path) -> SourceFile:
    rel = entry.relative_to(src).as_posix()
    real = entry.resolve() if entry.is_symlink() else entry
    if not _inside(real, root):
        raise OutsideRepository(f"{written}: {rel} links outside the recipe's repository")
    _refuse_git(real, f"{written}/{rel}", root)  # a link to .git/config would copy the CI job token
    info = regular_file(real, f"{written}/{rel}")
    return SourceFile(rel, real, bool(info.st_mode & stat.S_IXUSR), info.st_size)


def _within_limits(count: int, total: int, written: str) -> None:
    if count > limits.COPY_FILES:
        raise OutsideRepository(f"{written} holds more than {limits.COPY_FILES} files")
    if total > limits.COPY_BYTES:
        raise OutsideRepository(f"{written} holds more than {limits.COPY_BYTES // limits.MIB} MiB")


def files_digest(files: list[SourceFile], secrets: tuple[str, ...] | list[str] = ()) -> str:
    """sha256 over the files' names, exec bits and content, streamed; a file that holds a configured
    secret's value is refused (it would be copied into the image), naming the file, never the secret."""
    import hashlib

    wanted = [s.encode() for s in secrets if s and len(s) >= 4]
    overlap = max((len(w) for w in wanted), default=1) - 1
    h = hashlib.sha256()
    for f in files:
        h.update(f.rel.encode() + b"\0" + (b"x" if f.executable else b"-"))
        tail = b""
        with open(f.path, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
                window = tail + block
                if any(w in window for w in wanted):
                    raise OutsideRepository(
                        f"{f.rel or f.path.name} holds a configured secret; it would be copied into the image"
                    )
                tail = window[-overlap:] if overlap else b""
    return h.hexdigest()
