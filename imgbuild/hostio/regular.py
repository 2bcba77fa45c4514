"""Files someone else may have put in the way: opened without following a link or blocking on a FIFO, believed only
when they are regular files, read only up to a bound. The ledger, the reaper's logs, the queue, the JSON caches,
a committed context record and a file read as the user acting through sudo all open their files here, and every
file imgbuild writes whole is written here (whole_file)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO, TypeVar

T = TypeVar("T")


def open_regular(path: Path, flags: int, mode: int = 0o644) -> int | None:
    """`path` opened without following a link or blocking on a FIFO, created (O_EXCL) when absent and
    `flags` asks; None when it is there but not a regular file (a FIFO, folder or socket someone planted)."""
    base = flags & ~(os.O_CREAT | os.O_EXCL)
    for attempt in range(3):  # two processes may both find it absent; the one that loses the create opens it
        try:
            fd = os.open(path, base | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            break
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
            try:
                fd = os.open(path, base | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
                break
            except FileExistsError:
                if attempt == 2:
                    raise
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO with no reader, a folder
                return None
            raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return fd


def read_regular(path: Path, limit: int) -> tuple[bytes, os.stat_result] | None:
    """(the bytes, the file's status) of `path` when it is a regular file of at most `limit` bytes (opened as
    open_regular opens it); None when it is something else or larger. OSError when it cannot be opened."""
    fd = open_regular(path, os.O_RDONLY)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if info.st_size > limit:
            return None
        data = handle.read(limit + 1)
    return (data, info) if len(data) <= limit else None


def clear_planted(path: Path, owner: int = 0) -> None:
    """Root, before it writes a name of its own in a shared folder: remove what stands at `path` unless it is a
    regular file of root's (or of `owner`, whose file it is). A folder is removed whole and never followed
    through a link (shutil.rmtree works on descriptors). Only root may take another user's entry away from a
    sticky folder, and only root calls this."""
    try:
        info = os.lstat(path)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode) and info.st_uid in (0, owner) and info.st_nlink == 1:
        return
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def files_of_uids(folder: Path, prefix: str, suffix: str, root_too: bool = False) -> list[tuple[int, Path]]:
    """(uid, path) of each `PREFIX<uid>SUFFIX` in `folder` (a shared, sticky one) that the uid it names owns (or
    root, `root_too`), by uid: the uid written one way only (no leading zero), each name judged by one lstat
    before anything is opened or looked up, so the names a user makes there by the hundred thousand cost a
    reader next to nothing and stand for nobody. OSError when the folder cannot be listed."""
    pattern = re.compile(re.escape(prefix) + r"(0|[1-9][0-9]{0,9})" + re.escape(suffix))
    found = []
    for name in os.listdir(folder):
        match = pattern.fullmatch(name)
        if match is None:
            continue
        uid = int(match.group(1))
        try:
            owner = os.lstat(folder / name).st_uid
        except OSError:
            continue
        if owner == uid or (root_too and owner == 0):
            found.append((uid, folder / name))
    return sorted(found)


@contextlib.contextmanager
def whole_file(
    path: Path, mode: int | None = None, owner: int = 0, replace: bool = True, planted: bool = False
) -> Iterator[BinaryIO]:
    """The one way imgbuild writes a file whole: a binary handle on a new file beside `path` (same folder, created
    O_EXCL, never through a link, never a FIFO) that becomes `path` only when the block ends cleanly: flushed,
    given its owner and mode, synced, renamed over `path`, and the folder synced, so a kill or a power cut leaves
    the old file or the new one, never a half or empty one. A link at `path` is replaced itself, its target
    untouched. An error in the block leaves `path` as it was and no temporary file.

    `mode`: exactly this mode; None keeps the old file's (a user's chmod survives), else 0644. `owner`: the uid
    root gives the file (a user's own file in a shared folder). `replace=False` writes only where nothing is
    (a hard link to the name: FileExistsError when anything is there). `planted`: root first removes what
    someone else put at the name (a folder, a FIFO, a link, another user's file), for a sticky shared folder
    where only root may take another user's entry away. An OSError of the write itself names `path`."""
    try:
        old = os.lstat(path)
    except FileNotFoundError:
        old = None
    if mode is None:
        mode = stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else 0o644
    if planted and replace and old is not None and os.geteuid() == 0:
        clear_planted(path, owner)
    sweep_partials(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.partial")
    try:
        fd = _named(path, unnamed_file, path.parent)  # no name while written: a kill leaves nothing behind
        named = fd is None
        if fd is None:  # a file system without O_TMPFILE: a named file, swept by the next write if killed
            fd = _named(
                path, os.open, partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        with os.fdopen(fd, "wb") as handle:
            yield handle
            _named(path, _settle, handle, mode, owner)
            if not named:  # a name only now, for the rename right after
                _named(path, link_unnamed, handle.fileno(), partial)
        _named(path, os.replace if replace else os.link, partial, path)
        _named(path, _sync_folder, path.parent)
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()


def write_atomic(
    path: Path, data: bytes | str, mode: int | None = None, owner: int = 0, replace: bool = True, planted: bool = False
) -> None:
    """`path` replaced whole by `data` (UTF-8 for text), as whole_file writes it."""
    with whole_file(path, mode, owner, replace, planted) as handle:
        handle.write(data.encode() if isinstance(data, str) else data)


def _named(path: Path, call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`, its OSError naming `path` (not the temporary file beside it)."""
    try:
        return call(*args)
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, str(path)) from None


def _settle(handle: BinaryIO, mode: int, owner: int) -> None:
    """The new file's bytes on disk, its owner and mode set, before it takes the name."""
    handle.flush()
    if owner and os.geteuid() == 0:
        os.fchown(handle.fileno(), owner, -1)
    os.fchmod(handle.fileno(), mode)
    os.fsync(handle.fileno())


def _sync_folder(folder: Path) -> None:
    """The folder's entry for a renamed file made durable (a rename is a change to the folder)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unnamed_file(folder: Path) -> int | None:
    """A new file with no name in `folder` (Linux's O_TMPFILE, linkable through /proc), or None where the file
    system or the platform has none."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.access("/proc/self/fd", os.R_OK | os.X_OK, effective_ids=True):
        return None  # none, or not ours to link through while acting for a user (a process made undumpable)
    try:
        return os.open(folder, flag | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise


def link_unnamed(fd: int, path: Path) -> None:
    """Give the unnamed file `fd` the name `path` (linkat through /proc, following the link to the file; EEXIST
    when anything is at `path`)."""
    proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), path, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


#: What write_atomic names a file while it writes it: `.NAME.PID.HEX.partial`.
_PARTIAL_RE = re.compile(r"\.(?P<name>.+)\.(?P<pid>[0-9]{1,10})\.[0-9a-f]{8}\.partial")


def sweep_partials(path: Path) -> None:
    """Remove what a killed write of `path` left beside it: its `.partial` files whose process is gone."""
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        m = _PARTIAL_RE.fullmatch(name)
        if m is None or m["name"] != path.name or _alive(int(m["pid"])):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path.parent / name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def named_error(exc: OSError, path: Path) -> OSError:
    """`exc` naming `path` where it names no file."""
    return exc if exc.filename else OSError(exc.errno, exc.strerror, str(path))


class LogWriter:
    """A text file whose write errors name it: a full disk's ENOSPC from write() or close() names no file."""

    def __init__(self, handle: TextIO, path: str) -> None:
        self._handle, self._path = handle, path

    def write(self, text: str) -> int:
        try:
            return int(self._handle.write(text))
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self._path) from None

    def flush(self) -> None:
        try:
            self._handle.flush()
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self._path) from None


@contextlib.contextmanager
def open_log(path: Path | None) -> Iterator[LogWriter]:
    """A log file opened for writing (os.devnull for none), whose every error names it."""
    name = str(path) if path else os.devnull
    handle = open(name, "w", encoding="utf-8")  # noqa: SIM115 - closed below, its error named
    try:
        yield LogWriter(handle, name)
    finally:
        try:
            handle.close()
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, name) from None


def read_named(path: Path, limit: int) -> bytes:
    """A file the user named on the command line (a key, a recipe to compare): links followed (the user chose the
    path), but only a regular file of at most `limit` bytes, never a FIFO, a device or /dev/zero read without end.
    ValueError saying why it is refused; OSError when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data
