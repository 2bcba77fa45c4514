"""The host's ledger of GPUs and CPUs being handed out: selection and start made atomic across users.

`imgbuild run` reads the GPUs, picks free ones and starts a container; two users doing that at the same
moment would pick the same GPUs (a container holds its GPUs only once its process touches CUDA). Under
one host-wide lock, a run records what it chose before it lets go of the lock; the next run sees that
entry (and every running container's labels) as taken. An entry lives while the process that wrote it
lives: a killed `imgbuild run` leaves nothing that blocks anyone.

Every other user of the host is untrusted. So each user writes only a file of their own in the site's state
folder (`run.state_dir`, sticky and world-writable like /tmp), `ledger-<uid>.json`, replaced whole by rename;
a reader believes a file only where its owner is the uid it is named for, an entry only where it names that
user and a live process of theirs, and an entry only for as long as a start takes (a queue place as long as
its waiter keeps looking). Nothing is read from a FIFO or through a link, and a folder that neither root nor
the caller owns is not used: whoever owns it could delete what others keep in it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgbuild.errors import EnvironmentProblem
from imgbuild.hostio.host import process_start
from imgbuild.hostio.regular import open_regular

DOCKER_SOCKET = "/var/run/docker.sock"
LOCK_FILE = "ledger.lock"
#: A user's ledger is a few KB; a larger file is not ours (or was vandalised) and is read as empty.
LEDGER_BYTES = 1024 * 1024
#: A hold lasts as long as a start (choosing, then `docker run`, an image pull included); older is stale.
HOLD_SECONDS = 900
#: A queue place is kept by its waiter looking again (every run.wait_poll seconds); unrefreshed, it lapses.
WAIT_SECONDS = 120
#: How long a run waits for another to let go of the host's lock before it says so.
LOCK_SECONDS = 120
#: How long root waits for the shared lock, which any user can hold, once it holds its own.
SHARED_LOCK_SECONDS = 5


def hold_lock(path: Path, what: str, seconds: float = LOCK_SECONDS, shared: bool = True) -> int:
    """A host-wide lock file held exclusively (bounded wait): shared by every user, or (`shared=False`) root's
    own, 0600; the descriptor to close. A planted FIFO, folder or hard link is removed by root and refused for
    anyone else."""
    mode = 0o666 if shared else 0o600
    if os.geteuid() == 0 and os.path.islink(path):
        _remove(path)  # root's name in a sticky folder: a link planted there goes, never followed
    try:
        fd = _single(open_regular(path, os.O_RDWR | os.O_CREAT, mode))
        if fd is None and os.geteuid() == 0:
            _remove(path)
            fd = _single(open_regular(path, os.O_RDWR | os.O_CREAT, mode))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise EnvironmentProblem(f"{path} is a symbolic link; remove it (run.state_dir)") from None
        raise EnvironmentProblem(f"cannot use {what} {path}: {exc.strerror}") from None
    if fd is None:
        raise EnvironmentProblem(f"{path} is not a regular file (someone put it there); an admin removes it")
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, mode)  # every user of the host locks the shared one
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise EnvironmentProblem(
                    f"another process has held {what} {path} for {seconds:.0f} s; try again"
                ) from None
            time.sleep(0.05)


def _single(fd: int | None) -> int | None:
    """`fd` where its file has one name only; None (closed) for a hard link someone made at a lock's name to
    another file (root would make `/etc/shadow` mode 0666 where the kernel lets users link files not theirs)."""
    if fd is not None and os.fstat(fd).st_nlink != 1:
        os.close(fd)
        return None
    return fd


def host_locks(state_dir: Path, name: str, what: str) -> list[int]:
    """The host's lock `name` in the state folder, as descriptors to close. Every user can open a shared lock
    file (users of the docker group run imgbuild as themselves), so any user can hold one to stall everyone. Root
    (imgbuild acting for users through sudo, and root's timers) therefore serialises on a lock of its own, in
    its own folder, and waits for the shared one only briefly: a user who holds it stalls nobody who comes
    through sudo."""
    if os.geteuid() != 0:
        return [hold_lock(state_dir / name, what)]
    own = hold_lock(reaper_dir(state_dir) / name, f"root's copy of {what}", shared=False)
    try:
        return [own, hold_lock(state_dir / name, what, SHARED_LOCK_SECONDS)]
    except EnvironmentProblem:
        return [own]  # held by a user past the bound: root's own lock orders root's runs


@dataclass
class Entry:
    """One run's hold on GPUs (UUIDs) and CPUs while it starts its container."""

    name: str  # the container it is starting
    user: str
    pid: int
    started: str  # the process's start time (/proc/PID/stat field 22): a reused PID is not the same run
    gpus: list[str] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)
    since: float = 0.0  # when the hold began, or when its waiter last looked (a queue place)
    ports: list[int] = field(default_factory=list)  # host ports it publishes (`--jupyter`, `-p`)
    waiting: str = ""  # a place in the queue (`run --wait`): what it waits for ("2 GPUs"); holds nothing
    uid: int = -1  # who wrote it (the owner of the file it is read from; -1: unknown)
    seen: float = 0.0  # a queue place: when its waiter last looked (it lapses unrefreshed)


@dataclass(frozen=True)
class Extension:
    """A container's deadline as `imgbuild extend` moved it, and who moved it (only its owner's counts)."""

    deadline: float
    user: str


def process_uid(pid: int, proc: Path = Path("/proc")) -> int | None:
    try:
        return os.stat(proc / str(pid)).st_uid
    except OSError:
        return None


def alive(entry: Entry) -> bool:
    """The process that wrote the entry still runs (the same process, not a later one with its PID), and,
    where the entry names its writer, it is that user's process."""
    if entry.pid <= 1:
        return False  # init is not a run of imgbuild: an entry naming it would live forever
    try:
        os.kill(entry.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    if entry.uid >= 0 and process_uid(entry.pid) != entry.uid:
        return False
    return process_start(entry.pid) == entry.started


def can_reach_engine(uid: int, socket: str | None = None) -> bool:
    """Can `uid` start containers on the local engine themself (root, the socket's owner, its group's members)?
    Only such a user runs imgbuild as themself and holds GPUs by a ledger file of their own; a user of enforced
    mode (not in the docker group) starts containers only through sudo, where root's file holds for them, so a
    file they write by hand (all GPUs, every port, a process of theirs kept alive) holds nothing. Where the
    engine is not a local socket this cannot be told, and every file is believed."""
    import grp

    host = os.environ.get("DOCKER_HOST", "")
    path = socket or (host.removeprefix("unix://") if host.startswith("unix://") else "" if host else DOCKER_SOCKET)
    try:
        info = os.stat(path) if path else None
    except OSError:
        info = None
    if info is None or uid in (0, info.st_uid) or info.st_mode & 0o002:
        return True
    try:
        entry = pwd.getpwuid(uid)
        groups = set(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except (KeyError, OSError):
        return False
    with contextlib.suppress(KeyError):
        groups |= {g.gr_gid for g in grp.getgrall() if entry.pw_name in g.gr_mem}
    return bool(info.st_mode & 0o020) and info.st_gid in groups


def user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


class Ledger:
    """The ledger in `state_dir`. `clock` and `is_alive` are injectable for tests."""

    def __init__(
        self,
        state_dir: str | Path,
        clock: Callable[[], float] = time.time,
        is_alive: Callable[[Entry], bool] = alive,
        holds_of: Callable[[int], bool] | None = None,
    ):
        self.dir = Path(state_dir)
        self.holds_of = holds_of or can_reach_engine
        self.uid = os.getuid()
        self.path = self.dir / f"ledger-{self.uid}.json"  # this user's own file
        self.clock = clock
        self.is_alive = is_alive

    def folder(self, create: bool = True) -> bool:
        """Check the state folder (made if missing and `create`): a real folder, owned by root or the caller.
        False when it does not exist."""
        try:
            if not os.path.lexists(self.dir):
                if not create:
                    return False
                self.dir.mkdir(parents=True, exist_ok=True)
            info = os.lstat(self.dir)
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot use the state folder {self.dir}: {exc.strerror} (run.state_dir; an admin makes it: "
                "sudo imgbuild admin setup)"
            ) from None
        if not stat.S_ISDIR(info.st_mode):
            raise EnvironmentProblem(f"{self.dir}: the state folder is not a folder or is a link (run.state_dir)")
        if info.st_uid not in (0, os.geteuid()):
            raise EnvironmentProblem(
                f"the state folder {self.dir} belongs to {user_name(info.st_uid) or info.st_uid}, who could delete or "
                f"replace what others keep there; an admin makes it root's: chown root {self.dir} (run.state_dir)"
            )
        if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o1777:
            with contextlib.suppress(OSError):
                os.chmod(self.dir, 0o1777)  # shared by every user of the host, like /tmp
        return True

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Book]:
        """Every user's live entries, the host locked; this user's own written back on the way out."""
        self.folder()
        fds = host_locks(self.dir, LOCK_FILE, "the GPU ledger's lock")
        try:
            book = self._book()
            yield book
            self._write([e for e in book.entries if e.uid == self.uid], book.own_extended(self.uid))
        finally:
            for fd in fds:
                os.close(fd)  # closing releases the lock

    def drop(self, name: str) -> None:
        """Forget `name`'s entry (its container now holds what it chose, by its labels)."""
        with contextlib.suppress(EnvironmentProblem), self.transaction() as book:
            book.entries = [e for e in book.entries if e.name != name]

    def read(self) -> Book:
        """The ledger as it stands (live runs' entries only); no lock (each file is replaced whole), nothing
        written, and a ledger not made yet reads as empty."""
        if not self.folder(create=False):
            return Book([], self.clock)
        return self._book()

    def entries(self) -> list[Entry]:
        """The live runs' entries."""
        with self.transaction() as book:
            return list(book.entries)

    def _book(self) -> Book:
        now = self.clock()
        entries: list[Entry] = []
        extended: dict[str, Extension] = {}
        for uid, path in self._user_files():
            name = user_name(uid)
            mine, moved = _read_user_file(path, uid)
            if uid != 0 and not self.holds_of(uid):
                mine = []  # a user who cannot start containers themself holds nothing by their own file
            for entry in mine:
                stale = now - max(entry.since, entry.seen) > (WAIT_SECONDS if entry.waiting else HOLD_SECONDS)
                # root's file may name any user (imgbuild acting for a user through sudo); anyone else's only them
                named = uid == 0 or entry.user == name
                if entry.uid == uid and named and not stale and self.is_alive(entry):
                    entries.append(entry)
            for cid, (deadline, who) in moved.items():
                owner = who if uid == 0 and who else name  # root extends for the container's owner
                if owner and (cid not in extended or extended[cid].deadline < deadline):
                    extended[cid] = Extension(deadline, owner)
        entries.sort(key=lambda e: e.since)
        return Book(entries, self.clock, extended)

    def _user_files(self) -> list[tuple[int, Path]]:
        """Each user's file, `ledger-<uid>.json` owned by that uid (root's `ledger-0.json` among them)."""
        from imgbuild.hostio.regular import files_of_uids

        try:
            return files_of_uids(self.dir, "ledger-", ".json")
        except OSError as exc:
            raise EnvironmentProblem(f"cannot read the state folder {self.dir}: {exc.strerror}") from None

    def _write(self, entries: list[Entry], extended: dict[str, dict[str, Any]]) -> None:
        """Replace this user's file whole, by the one writer. In a sticky folder nobody can replace a file another
        user owns: a planted one is refused, and root removes it (a folder or FIFO planted at root's name would
        stop every `run`)."""
        from imgbuild.hostio.regular import write_atomic

        data = json.dumps({"entries": [asdict(e) for e in entries], "extended": extended}).encode()
        try:
            write_atomic(self.path, data, 0o644, planted=True)
        except OSError as exc:
            raise EnvironmentProblem(
                f"cannot write {self.path}: {exc.strerror} (another user's file there? an admin removes it)"
            ) from None


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        else:
            os.unlink(path)


def _read_user_file(path: Path, uid: int) -> tuple[list[Entry], dict[str, tuple[float, str]]]:
    """One user's entries and extensions, believed only from a regular file that user owns; anything
    malformed reads as empty (nobody's hold is lost for more than the few seconds of a start)."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except OSError:
        return [], {}
    if fd is None:
        return [], {}
    try:
        info = os.fstat(fd)
        if info.st_uid != uid or info.st_nlink != 1:
            return [], {}
        data = os.read(fd, LEDGER_BYTES + 1)
    finally:
        os.close(fd)
    try:
        raw = json.loads(data) if len(data) <= LEDGER_BYTES else {}
        entries = [_entry(item) for item in raw.get("entries", [])]
        extended = raw.get("extended")
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        return [], {}
    if not isinstance(extended, dict):
        extended = {}
    moved: dict[str, tuple[float, str]] = {}
    for key, value in extended.items():
        deadline, who = (value.get("deadline"), value.get("user")) if isinstance(value, dict) else (value, "")
        if isinstance(deadline, int | float) and not isinstance(deadline, bool) and abs(deadline) < 1e12:
            moved[str(key)[:64]] = (float(deadline), who if isinstance(who, str) else "")
    return entries, moved


def _entry(item: Any) -> Entry:
    """An entry, every field of its type (a wrongly typed one crashed every user's `run`)."""
    entry = Entry(**item)
    kinds = {"name": str, "user": str, "started": str, "waiting": str}
    if not all(isinstance(getattr(entry, k), t) for k, t in kinds.items()):
        raise TypeError("malformed entry")
    numbers = (entry.pid, entry.uid)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        raise TypeError("malformed entry")
    if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in (entry.since, entry.seen)):
        raise TypeError("malformed entry")
    if not isinstance(entry.gpus, list) or not all(isinstance(g, str) for g in entry.gpus):
        raise TypeError("malformed entry")
    for values in (entry.cpus, entry.ports):
        if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise TypeError("malformed entry")
    return entry


@dataclass
class Book:
    entries: list[Entry]
    clock: Callable[[], float]
    #: container ID -> its deadline as `imgbuild extend` moved it, and by whom (only the container's owner's
    #: counts, and within the site's max_time: what anyone writes can move only their own containers' deadlines)
    extended: dict[str, Extension] = field(default_factory=dict)

    def own_extended(self, uid: int) -> dict[str, dict[str, Any]]:
        """What this user's file keeps: their own containers' extensions (root's: everyone's it made)."""
        name = user_name(uid)
        return {
            cid: {"deadline": e.deadline, "user": e.user}
            for cid, e in self.extended.items()
            if uid == 0 or e.user == name
        }

    def add(self, name: str, user: str, gpus: list[str], cpus: list[int], ports: list[int] | None = None) -> Entry:
        pid = os.getpid()
        started = process_start(pid)
        entry = Entry(
            name, user, pid, started, list(gpus), list(cpus), self.clock(), list(ports or []), uid=os.getuid()
        )
        self.entries = [e for e in self.entries if e.name != name] + [entry]
        return entry

    def holds(self) -> list[Entry]:
        return [e for e in self.entries if not e.waiting]

    def queue(self, use: Mapping[str, float] | None = None) -> list[Entry]:
        """Waiting runs: the user with the fewest GPU-hours of late first (`use`: fair share), then first come
        first."""
        return sorted((e for e in self.entries if e.waiting), key=lambda e: ((use or {}).get(e.user, 0.0), e.since))

    def enqueue(self, ticket: str, user: str, what: str) -> Entry:
        """A place at the end of the queue (kept, and refreshed, if `ticket` already has one)."""
        for entry in self.entries:
            if entry.name == ticket:
                entry.seen = self.clock()  # looked again: not stale, and its place kept
                return entry
        pid = os.getpid()
        now = self.clock()
        entry = Entry(ticket, user, pid, process_start(pid), since=now, waiting=what, uid=os.getuid(), seen=now)
        self.entries.append(entry)
        return entry

    def leave(self, name: str) -> None:
        self.entries = [e for e in self.entries if e.name != name]


# --- root's own files in the state folder: the reaper's, the audit log, usage ------------------------------

REAPER_DIR = ".reap"  # the reaper's own folder inside the state folder: root's alone (0700)


def reaper_dir(state_dir: Path) -> Path:
    """Where the reaper keeps its state and log: `<state_dir>/.reap`, made 0700 by the reaper; the state
    folder must be root's (or the caller's), and the reaper's folder the caller's and writable by no one
    else: every user of the host writes the state folder itself."""
    Ledger(state_dir).folder()
    folder = state_dir / REAPER_DIR
    if os.geteuid() == 0:
        _clear_planted_folder(folder)  # root's name: whatever a user put there goes
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:  # made before, or by a run started at the same moment: judged below, as any other
        pass
    except OSError as exc:
        raise EnvironmentProblem(f"cannot use the reaper's folder {folder}: {exc.strerror}") from None
    try:
        info = os.lstat(folder)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot use the reaper's folder {folder}: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise EnvironmentProblem(
            f"{folder} is not the reaper's own folder (a link, another user's, or writable by others); an admin "
            "removes it and the next run makes it again"
        )
    return folder


def _clear_planted_folder(folder: Path) -> None:
    """Root: remove `folder` unless it is root's own folder that nobody else can write (a user who made it first,
    in the sticky state folder, would own the reaper's state, the audit log and usage)."""
    from imgbuild.hostio.regular import clear_planted

    try:
        info = os.lstat(folder)
    except OSError:
        return
    if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022:
        return
    clear_planted(folder)


def append_record(path: Path, record: dict[str, Any], what: str, mode: int = 0o644) -> None:
    """One JSON line appended to a log of root's (or the reaper's): a regular file it owns, never a FIFO or a
    link (either would hang or redirect root's writes); `mode` when it is made."""
    try:
        fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write {what} {path}: {exc.strerror}") from None
    if fd is None:
        raise EnvironmentProblem(f"{what} {path} is not a regular file (someone put it there); remove it")
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_nlink != 1:
            raise EnvironmentProblem(f"{what} {path} is not the reaper's own file (another owner, or a link)")
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)
