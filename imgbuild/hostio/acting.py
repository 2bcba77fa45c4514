"""imgbuild acting for a user through sudo (enforced mode), as far as files and images go: what the user's own
permissions allow is all a build or a smoke test acting for them may read or write (`as_user`, `read_as`,
`write_as`, `private_copy`), and what it makes goes into their namespace (`check_target`) from images the site
allows (`check_image`). servers.enforce decides when imgbuild acts for a user, and holds the rules of a run."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.errors import EnvironmentProblem, UsageError
from imgbuild.hostio.host import Caller, expand
from imgbuild.hostio.regular import read_regular, write_atomic

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings


def acting_for_user(who: Caller) -> bool:
    """imgbuild runs as root through sudo for a user who is not an admin: the rules are enforced."""
    return who.via_sudo and os.geteuid() == 0 and not who.is_admin


@dataclass(frozen=True)
class ContainerUser:
    """Whom a script container runs for (a user imgbuild acts for through sudo): their IDs and name (the
    container's owner label), and the caps every run of theirs has (memory with no swap past it, processes, their
    slice), so that a smoke test of their own image is no way round `imgbuild run`'s."""

    uid: int
    gid: int
    name: str
    memory: int | None = None  # bytes
    pids_limit: int | None = None
    cgroup_parent: str = ""

    @property
    def ids(self) -> str:
        return f"{self.uid}:{self.gid}"


def container_user(settings: Settings | None) -> ContainerUser | None:
    """The user every container imgbuild starts for them runs as (a smoke test, a jupyter check, a base's pins, a
    lock: each a script container of an image they may have made), with no new privileges, no capabilities, its
    own IPC and their runs' caps (`run_script(as_user=...)`); None where imgbuild does not act for a user through
    sudo (the caller's own engine: the docker group, or root). Every `run_script` call passes its `as_user` from
    here (a test reads them all)."""
    from imgbuild.hostio.host import host_memory

    who = settings.caller if settings is not None else None
    if settings is None or who is None or not acting_for_user(who):
        return None
    house = settings.run
    return ContainerUser(
        who.uid,
        who.gid,
        who.name,
        memory=house.memory_bytes(host_memory()),
        pids_limit=house.pids_limit,
        cgroup_parent=house.cgroup_parent_of(who.name, who.uid, who.gid),
    )


@dataclass(frozen=True)
class Acting:
    """imgbuild acting for a user through sudo: who, and the site's images (`run.allowed_images`)."""

    who: Caller
    allowed_images: tuple[str, ...]

    def check_image(self, image_ref: str, what: str = "") -> None:
        check_image(self.who, self.allowed_images, image_ref, what)


def check_image(who: Caller, allowed_images: Sequence[str], image_ref: str, what: str = "") -> None:
    """`image_ref` (to run, a build's base, an image to smoke-test) is one the site allows (`run.allowed_images`)."""
    allowed = [expand(p, user=who.name) for p in allowed_images]
    if not any(fnmatch.fnmatchcase(image_ref, pattern) for pattern in allowed):
        raise UsageError(
            f"{what + ' ' if what else ''}{image_ref}: not an image this server allows "
            f"(run.allowed_images: {', '.join(allowed) or 'none'})"
        )


def check_target(who: Caller, target: str) -> None:
    """A build acting for a user tags only into their own namespace, `<user>/NAME:TAG` on this host."""
    from imgbuild.imageref import parse

    ref = parse(target)
    if ref.host or ref.path.split("/")[0] != who.name or "/" not in ref.path:
        raise UsageError(f"{target}: under this server's rules you build only {who.name}/NAME:TAG (remove `image:`)")


#: What code run `as_user` imports inside its functions from outside imgbuild (the standard library, jinja2,
#: packaging), imported before the switch: Python itself may live where the user cannot read (a pyenv in /root).
#: imgbuild's own modules are never named here: whoever opens an `as_user` block imports at its top what the code
#: inside it needs (a test follows every block's calls and checks both).
PRELOAD = (
    *("argparse", "concurrent.futures", "difflib", "filecmp", "grp", "hashlib", "importlib.metadata"),
    *("importlib.util", "os", "shutil", "stat", "sysconfig", "tempfile", "warnings", "importlib", "jinja2"),
    *("packaging.requirements", "packaging.specifiers", "packaging.tags", "packaging.utils", "packaging.version"),
)


@contextlib.contextmanager
def as_user(who: Caller | None) -> Iterator[None]:
    """File access with `who`'s permissions (effective UID, GID and groups) inside the block, root's again after;
    nothing to do for None or when imgbuild is not root. Only file access changes: the engine is never asked
    inside (its socket is root's)."""
    if who is None or os.geteuid() != 0 or who.uid == 0:
        yield
        return
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    groups = os.getgroups()
    os.setgroups(os.getgrouplist(who.name, who.gid) if who.name else [who.gid])
    os.setegid(who.gid)
    os.seteuid(who.uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


def write_as(who: Caller | None, path: Path, text: str) -> None:
    """Write `text` to `path` whole as `who` would (only where their permissions let them; written as every whole
    file is, never through a link at `path`)."""
    with as_user(who):
        try:
            write_atomic(path, text)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot write {path}: {exc.strerror}") from None


def read_as(who: Caller | None, path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file `path` as `who` may read them (no link followed at the end), at most `limit`."""
    with as_user(who):
        try:
            found = read_regular(path, limit)
        except OSError as exc:
            raise UsageError(f"{what} {path}: {exc.strerror}") from None
    if found is None:
        raise UsageError(f"{what} {path}: not a regular file of at most {limit} bytes")
    return found[0]


def private_copy(src: Path, dest: Path, who: Caller, max_bytes: int, max_files: int) -> Path:
    """Copy the build context `src`, written as `who`, into root's folder `dest`: only folders and regular files
    `who` owns, each opened without following a link, so nothing swapped in after rendering (a link, a hard link
    to a file `who` cannot read, a FIFO) reaches the build. Bounded in files and bytes."""
    with as_user(who):
        top = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _CopyOwned(src, who.uid, max_bytes, max_files).folder(top, dest, "")
    finally:
        os.close(top)
    return dest


class _CopyOwned:
    """private_copy's walk: one budget of files and bytes for the whole tree."""

    def __init__(self, src: Path, uid: int, max_bytes: int, max_files: int) -> None:
        self.src, self.uid, self.bytes_left, self.files_left = src, uid, max_bytes, max_files
        self.max_bytes, self.max_files = max_bytes, max_files

    def folder(self, dir_fd: int, out: Path, rel: str) -> None:
        self._owned(os.fstat(dir_fd), rel)
        for name in sorted(os.listdir(dir_fd)):
            here = f"{rel}/{name}" if rel else name
            self.files_left -= 1
            if self.files_left < 0:
                raise UsageError(f"{self.src}: more than {self.max_files} files")
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError as exc:  # a link (ELOOP), or gone
                raise UsageError(f"{self.src / here}: {exc.strerror} (a build context holds only your files)") from None
            try:
                info = os.fstat(fd)
                self._owned(info, here)
                if stat.S_ISDIR(info.st_mode):
                    (out / name).mkdir(mode=0o700)
                    self.folder(fd, out / name, here)
                elif stat.S_ISREG(info.st_mode):
                    self._file(fd, info, out / name)
                else:
                    raise UsageError(f"{self.src / here}: not a regular file or folder")
            finally:
                os.close(fd)

    def _owned(self, info: os.stat_result, rel: str) -> None:
        if info.st_uid != self.uid:
            raise UsageError(f"{self.src / rel}: not yours (a build context holds only files you wrote)")

    def _file(self, fd: int, info: os.stat_result, out: Path) -> None:
        self.bytes_left -= info.st_size
        if self.bytes_left < 0:
            raise UsageError(f"{self.src}: larger than {self.max_bytes // (1024 * 1024)} MiB")
        sink_fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(sink_fd, "wb") as sink:
            left = info.st_size
            while left > 0 and (block := os.read(fd, min(left, 1 << 20))):
                sink.write(block)
                left -= len(block)
        os.chmod(out, 0o755 if info.st_mode & stat.S_IXUSR else 0o644)
