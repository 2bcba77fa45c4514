"""The host's ledger of GPUs and CPUs being handed out: selection and start made atomic across users.

`imgbuild run` reads the GPUs, picks free ones and starts a container; two users doing that at the same
moment would pick the same GPUs (a container holds its GPUs only once its process touches CUDA). Under
one host-wide lock, a run records what it chose before it lets go of the lock; the next run sees that
entry (and every running container's labels) as taken. An entry lives while the process that wrote it
lives: a killed `imgbuild run` leaves nothing that blocks anyone.

The ledger is one small JSON file in the site's state folder (`run.state_dir`), rewritten in place under
`flock`, so that every user can write it in a sticky, world-writable folder without being able to
replace or remove another user's file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgbuild.errors import EnvironmentProblem

#: Where the ledger lives unless the site says (`run.state_dir`); created sticky and world-writable.
DEFAULT_STATE_DIR = "/var/tmp/imgbuild"
LEDGER_FILE = "ledger.json"
#: The ledger is a few KB; a larger file is not ours (or was vandalised) and is read as empty.
LEDGER_BYTES = 1024 * 1024


@dataclass
class Entry:
    """One run's hold on GPUs (UUIDs) and CPUs while it starts its container."""

    name: str  # the container it is starting
    user: str
    pid: int
    started: str  # the process's start time (/proc/PID/stat field 22): a reused PID is not the same run
    gpus: list[str] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)
    since: float = 0.0
    ports: list[int] = field(default_factory=list)  # host ports it publishes (`run --jupyter`)
    waiting: str = ""  # a place in the queue (`run --wait`): what it waits for ("2 GPUs"); holds nothing


def process_start(pid: int, proc: Path = Path("/proc")) -> str:
    """A PID's start time in clock ticks since boot ("" when the process is gone)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: count from its closing one.
    fields = text[text.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def alive(entry: Entry) -> bool:
    """The process that wrote the entry still runs (the same process, not a later one with its PID)."""
    try:
        os.kill(entry.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    return process_start(entry.pid) == entry.started


class Ledger:
    """The ledger in `state_dir`. `clock` and `is_alive` are injectable for tests."""

    def __init__(
        self,
        state_dir: str | Path,
        clock: Callable[[], float] = time.time,
        is_alive: Callable[[Entry], bool] = alive,
    ):
        self.dir = Path(state_dir)
        self.path = self.dir / LEDGER_FILE
        self.clock = clock
        self.is_alive = is_alive

    def _open(self) -> int:
        """The ledger file, opened read-write without following links; the folder made if missing."""
        try:
            if not os.path.lexists(self.dir):
                self.dir.mkdir(parents=True, exist_ok=True)
            info = os.lstat(self.dir)
            if not stat.S_ISDIR(info.st_mode):
                raise EnvironmentProblem(f"{self.dir}: the state folder is not a folder or is a link (run.state_dir)")
            if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o1777:
                with contextlib.suppress(OSError):
                    os.chmod(self.dir, 0o1777)  # shared by every user of the host, like /tmp
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise EnvironmentProblem(f"{self.path} is a symbolic link; remove it (run.state_dir)") from None
            raise EnvironmentProblem(
                f"cannot use the GPU ledger {self.path}: {exc.strerror}; an admin creates {self.dir} with "
                "mode 1777 or sets run.state_dir in /etc/imgbuild/config.yaml"
            ) from None
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, 0o666)  # every user of the host writes it
        return fd

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Book]:
        """The ledger, locked host-wide, with dead runs' entries dropped; written back on the way out."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            entries, extended = _read(fd)
            book = Book(entries, self.clock, extended)
            book.entries = [e for e in book.entries if self.is_alive(e)]
            yield book
            _write(fd, book.entries, book.extended)
        finally:
            os.close(fd)  # closing releases the lock

    def drop(self, name: str) -> None:
        """Forget `name`'s entry (its container now holds what it chose, by its labels)."""
        with contextlib.suppress(EnvironmentProblem), self.transaction() as book:
            book.entries = [e for e in book.entries if e.name != name]

    def read(self) -> Book:
        """The ledger as it stands (live runs' entries only), under a shared lock; nothing is written, and a
        ledger not made yet reads as empty."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return Book([], self.clock)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise EnvironmentProblem(f"{self.path} is a symbolic link; remove it (run.state_dir)") from None
            raise EnvironmentProblem(f"cannot read the GPU ledger {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            entries, extended = _read(fd)
        finally:
            os.close(fd)
        return Book([e for e in entries if self.is_alive(e)], self.clock, extended)

    def entries(self) -> list[Entry]:
        """The live runs' entries, the dead ones dropped from the file (and a malformed file rewritten)."""
        with self.transaction() as book:
            return list(book.entries)


@dataclass
class Book:
    entries: list[Entry]
    clock: Callable[[], float]
    #: container ID -> its deadline as `imgbuild extend` moved it (bounded by the site's max_time, so what
    #: anyone writes here can only move a deadline within what `extend` itself allows)
    extended: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, user: str, gpus: list[str], cpus: list[int], ports: list[int] | None = None) -> Entry:
        pid = os.getpid()
        entry = Entry(name, user, pid, process_start(pid), list(gpus), list(cpus), self.clock(), list(ports or []))
        self.entries = [e for e in self.entries if e.name != name] + [entry]
        return entry

    def holds(self) -> list[Entry]:
        return [e for e in self.entries if not e.waiting]

    def queue(self) -> list[Entry]:
        """Waiting runs, first come first."""
        return [e for e in self.entries if e.waiting]

    def enqueue(self, ticket: str, user: str, what: str) -> Entry:
        """A place at the end of the queue (kept if `ticket` already has one)."""
        for entry in self.entries:
            if entry.name == ticket:
                return entry
        pid = os.getpid()
        entry = Entry(ticket, user, pid, process_start(pid), since=self.clock(), waiting=what)
        self.entries.append(entry)
        return entry

    def leave(self, name: str) -> None:
        self.entries = [e for e in self.entries if e.name != name]


def _read(fd: int) -> tuple[list[Entry], dict[str, float]]:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while len(data) <= LEDGER_BYTES:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    try:
        raw = json.loads(data or b"{}") if len(data) <= LEDGER_BYTES else {}
        entries = [_entry(item) for item in raw.get("entries", [])]
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        return [], {}  # unreadable: nobody's hold is lost for more than the few seconds of a start
    extended = raw.get("extended")
    if not isinstance(extended, dict):
        extended = {}
    return entries, {
        str(k)[:64]: float(v) for k, v in extended.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _entry(item: Any) -> Entry:
    entry = Entry(**item)
    if not all(isinstance(v, list) for v in (entry.gpus, entry.cpus, entry.ports)) or not isinstance(entry.pid, int):
        raise TypeError("malformed entry")
    return entry


def _write(fd: int, entries: list[Entry], extended: dict[str, float]) -> None:
    data = json.dumps({"entries": [asdict(e) for e in entries], "extended": extended}).encode()
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, data)
