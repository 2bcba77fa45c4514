"""A batch queue on a shared GPU server, with no daemon: jobs wait in the state folder and start like
`imgbuild run -d` when their GPUs are free.

`imgbuild queue add [run options] -- COMMAND` checks the job as `run --dry-run` would (flags, image, mounts, the
house rules) and files it; `queue ls` lists every user's jobs; `queue rm ID` takes one of yours back. The queue
advances whenever someone looks (`queue add`, `queue run`) and on every `imgbuild reap` run (root's timer): in
order, fairly across users (the user whose oldest waiting job is oldest goes first, one job each in turn; a user
whose next job does not fit waits behind it, others go on). Root can `queue drain` (jobs that run finish, none
start) and `queue resume`.

Each user's jobs are one file, `queue-<uid>.json`, replaced whole, mode 0600 (a job's `-e` values are in it;
`queue ls` shows their names only): root's, in root's own folder of the state folder (`.reap/`, where no user can
put anything at its name first), for jobs a user filed through sudo; the user's own, in the state folder, for jobs
they filed without it. A file is believed only when it is the user's own or root's, and a job's user, uid and gid
come from the file's name and the password database, never from its JSON: nobody can queue for another, or as
another group. A job's folder must be absolute, and the time a job of a user's own file was filed is never earlier
than the kernel's last change of the file (its ctime, which no user sets): a hand-written `submitted` cannot jump
the queue. Starting a job is `imgbuild run -d` in a child process (`servers/queuechild.py`: run's own grammar and
checks, the same as the command line's), by an isolated interpreter (`python -I`: no working folder, no PYTHON*
variable on its path) whose arguments come on its standard input (never an argv others can read) and whose
environment is fixed (`rootside.environment`):

- a file root wrote (a user's `sudo imgbuild queue add`, or root's own) is started by root for the user, through
  sudo's variables: the enforced mode's rules apply to it as to the user;
- a file the user wrote themself is started as that user, root's privileges dropped first (their own groups,
  their own environment's HOME): it can do nothing the user could not do by typing `imgbuild run -d`.

A folder the job's user cannot enter is refused before anything starts, checked as them; every child starts in
`/` and enters the job's folder with the user's permissions only (theirs already, or their IDs for that `chdir`).
Jobs are claimed under the queue's lock and started outside it: a stalling start holds nobody's `queue add`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgbuild.errors import EnvironmentProblem, UsageError
from imgbuild.hostio.host import Caller
from imgbuild.hostio.regular import files_of_uids
from imgbuild.servers.queuechild import BUSY

DRAIN_FILE = "queue-drained"  # in root's folder of the state folder: present while drained
QUEUE_BYTES = 1024 * 1024
MAX_JOBS = 200  # one user's waiting jobs
START_SECONDS = 900  # one job's start (an image pull included)
MAX_CWD = 4096  # a job's folder, in characters (PATH_MAX)
_ID = re.compile(r"[0-9a-f]{8}")


@dataclass
class Job:
    id: str
    user: str
    uid: int
    gid: int
    submitted: float
    cwd: str
    args: list[str]
    state: str = "queued"  # queued | starting (claimed by a start under way) | started | failed
    container: str = ""
    detail: str = ""
    ended: float = 0.0

    @classmethod
    def from_json(cls, data: Any) -> Job | None:
        """A job as a queue file holds it; None for anything that is not one (a torn or forged entry)."""
        try:
            job = cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except (TypeError, KeyError):
            return None
        typed = (
            isinstance(job.id, str) and _ID.fullmatch(job.id) and isinstance(job.user, str)
            and isinstance(job.uid, int) and isinstance(job.gid, int) and _a_time(job.submitted) and _a_time(job.ended)
            and isinstance(job.cwd, str) and job_folder(job.cwd) == job.cwd
            and isinstance(job.args, list) and all(isinstance(a, str) for a in job.args)
            and job.state in ("queued", "starting", "started", "failed")
        )  # fmt: skip
        return job if typed else None


def _a_time(value: Any) -> bool:
    """Seconds since the epoch as a file may hold them: a number from 0 to year ~33000 (no inf, NaN or 10**400)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e12


def job_folder(cwd: str) -> str:
    """The folder a job starts in, as a queue file may name it: absolute, already normal (no `.`, `..` or `//`
    to read two ways), one line, bounded; "" for anything else."""
    ok = cwd.startswith("/") and len(cwd) <= MAX_CWD and "\0" not in cwd and "\n" not in cwd
    return cwd if ok and os.path.normpath(cwd) == cwd and not cwd.startswith("//") else ""


# --- choosing what starts (pure) ----------------------------------------------------------------------------


def waiting(job: Job, now: float) -> bool:
    """A job that may be started: queued, or claimed by a start that died without saying (past its bound)."""
    return job.state == "queued" or (job.state == "starting" and now - job.ended > START_SECONDS + 60)


def order(jobs: list[Job], now: float | None = None, use: Mapping[str, float] | None = None) -> list[Job]:
    """The waiting jobs in the order they are tried: users in turn, the one with the fewest GPU-hours of late
    first (`use`: fair share over the site's window), then the one whose oldest waiting job is oldest; each
    user's jobs first come, first served."""
    now = time.time() if now is None else now
    per_user: dict[str, list[Job]] = {}
    for job in sorted((j for j in jobs if waiting(j, now)), key=lambda j: (j.submitted, j.id)):
        per_user.setdefault(job.user, []).append(job)
    turns = sorted(per_user.values(), key=lambda js: ((use or {}).get(js[0].user, 0.0), js[0].submitted, js[0].id))
    ordered: list[Job] = []
    while any(turns):
        for queue in turns:
            if queue:
                ordered.append(queue.pop(0))
    return ordered


# --- the files (I/O) -----------------------------------------------------------------------------------------


@dataclass
class Queue:
    """The queue in `state_dir`."""

    state_dir: Path
    jobs: list[Job] = field(default_factory=list)

    #: uids whose file is root's (written by root for them): root starts their jobs under the enforced rules
    root_filed: set[int] = field(default_factory=set)

    def path(self, uid: int) -> Path:
        """`uid`'s file: root's (in root's folder) when root filed their jobs, else their own."""
        from imgbuild.servers.ledger import REAPER_DIR

        if uid in self.root_filed:
            return self.state_dir / REAPER_DIR / f"queue-{uid}.json"
        return self.state_dir / f"queue-{uid}.json"

    def load(self) -> Queue:
        """Every user's jobs, as far as they can be believed: root's file for a user where there is one, else
        the user's own."""
        from imgbuild.servers.ledger import REAPER_DIR

        self.jobs = []
        self.root_filed = set()
        found: dict[int, tuple[list[Job], bool]] = {}
        for folder, roots in ((self.state_dir / REAPER_DIR, True), (self.state_dir, False)):
            try:  # in the shared folder, a user's own file or root's of an earlier version; in root's, root's
                files = files_of_uids(folder, "queue-", ".json", root_too=True)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if roots:
                    continue  # root's folder, unreadable to a user without sudo: their own file only
                raise EnvironmentProblem(f"cannot read the state folder {self.state_dir}: {exc.strerror}") from None
            for uid, path in files:
                if uid not in found:
                    jobs, by_root = _read(path, uid, root_only=roots)
                    if jobs or by_root:
                        found[uid] = (jobs, by_root)
        for uid, (jobs, by_root) in sorted(found.items()):
            self.jobs += jobs
            if by_root:
                self.root_filed.add(uid)
        return self

    def save(self, uid: int) -> None:
        """Replace `uid`'s file whole with their jobs (written beside it, renamed over it, 0600): root's, in root's
        folder, when root filed them (a user's `sudo imgbuild queue add`: the user cannot change it, nor put
        anything at its name first), else the user's own."""
        from imgbuild.servers.ledger import Ledger, reaper_dir
        from imgbuild.servers.reap import write_whole

        Ledger(self.state_dir).folder()
        data = {"jobs": [asdict(j) for j in self.jobs if j.uid == uid]}
        if uid in self.root_filed and os.geteuid() == 0:
            reaper_dir(self.state_dir)
            write_whole(self.path(uid), data, mode=0o600)
            _drop_roots_old_file(self.state_dir / f"queue-{uid}.json")
        else:
            write_whole(self.state_dir / f"queue-{uid}.json", data, mode=0o600, owner=uid)

    @contextlib.contextmanager
    def locked(self):  # type: ignore[no-untyped-def]
        """The queue's own lock (never the GPU ledger's: a job's start takes that one), bounded."""
        from imgbuild.servers.ledger import Ledger, host_locks

        Ledger(self.state_dir).folder()
        fds = host_locks(self.state_dir, "queue.lock", "the queue's lock")
        try:
            yield self.load()
        finally:
            for fd in fds:
                os.close(fd)


def _drop_roots_old_file(path: Path) -> None:
    """A root-filed queue file of an earlier version, in the shared folder: its jobs now live in root's folder."""
    with contextlib.suppress(OSError):
        if os.lstat(path).st_uid == 0:
            path.unlink()


def _read(path: Path, uid: int, root_only: bool = False) -> tuple[list[Job], bool]:
    """`uid`'s jobs in `path`, and whether root wrote the file (`root_only`: believed only then). Who a job is for
    comes from the file's name and the password database: a job naming another user is dropped, and its gid is
    the user's own, never the file's. A user's own file says when its jobs were filed no earlier than the
    kernel's last change of it (its ctime)."""
    from imgbuild.hostio.regular import open_regular

    try:
        fd = open_regular(path, os.O_RDONLY)
    except OSError:
        return [], False
    if fd is None:
        return [], False
    try:
        info = os.fstat(fd)
        owners = (0,) if root_only else (0, uid)
        if info.st_uid not in owners or info.st_mode & 0o022 or not stat.S_ISREG(info.st_mode):
            return [], False  # not the user's own or root's: its jobs are not believed
        data = os.read(fd, QUEUE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        raw = json.loads(data) if len(data) <= QUEUE_BYTES else {}
    except (ValueError, RecursionError):
        return [], False
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return [], False  # no such user on this host: nobody to start it for
    jobs = [Job.from_json(j) for j in (raw.get("jobs") if isinstance(raw, dict) else None) or [] if isinstance(j, dict)]
    believed = []
    for job in jobs[:MAX_JOBS]:
        if job is None:
            continue
        if job.uid != uid or job.user != entry.pw_name:
            continue  # a job naming someone else: forged, or torn
        job.gid = entry.pw_gid  # never the file's: a gid of an admin group would make its user an admin
        if info.st_uid != 0:
            job.submitted = max(job.submitted, info.st_ctime)  # the kernel's clock, not the user's JSON
        believed.append(job)
    return believed, info.st_uid == 0


def shown_args(args: list[str]) -> list[str]:
    """A job's arguments as `queue ls` prints them: each variable's value hidden, its name kept, wherever run's own
    grammar reads one."""
    from imgbuild.servers.runwords import hide_values

    return hide_values(args)


def is_theirs(job: Job, who: Caller) -> bool:
    """`who` may see the job whole: it is theirs, or they are the admin."""
    return bool(job.uid == who.uid or who.is_admin)


def shown(job: Job) -> dict[str, Any]:
    """A job of the caller's own as `queue ls --json` prints it: whole but for variables' values."""
    return {**asdict(job), "args": shown_args(job.args)}


def drained(state_dir: Path) -> bool:
    from imgbuild.servers.ledger import REAPER_DIR

    return (state_dir / REAPER_DIR / DRAIN_FILE).exists()


def set_drained(state_dir: Path, on: bool) -> None:
    from imgbuild.servers.ledger import reaper_dir

    flag = reaper_dir(state_dir) / DRAIN_FILE
    if on:
        flag.touch(mode=0o644)
    else:
        flag.unlink(missing_ok=True)


# --- what the commands do --------------------------------------------------------------------------------------


def add(
    state_dir: Path,
    who: Caller,
    args: list[str],
    cwd: str,
    check: Callable[[list[str], str], tuple[int, str]] | None = None,
) -> Job:
    """File a job for `who`, after `run --dry-run ARGS` accepted it (as the user: the same rules as a start; run's
    own parser refuses a queued job's `--wait` in any spelling)."""
    if not job_folder(cwd):
        raise UsageError(f"queue add: the current folder {cwd[:200]!r} cannot be a job's folder (an absolute path)")
    code, said = (check or _dry_run)(args, cwd)
    if code not in (0, BUSY):  # busy GPUs now are why it queues
        raise UsageError(f"queue add: {said or 'the run was refused'}")
    with Queue(state_dir).locked() as queue:
        if os.geteuid() == 0:
            if any(j.uid == who.uid for j in queue.jobs) and who.uid not in queue.root_filed:
                raise UsageError(
                    f"queue add: {queue.path(who.uid)} is your own file (jobs you queued without sudo): "
                    "take them back with `imgbuild queue rm`, or queue this one without sudo"
                )
            queue.root_filed.add(who.uid)
        if sum(j.uid == who.uid and j.state == "queued" for j in queue.jobs) >= MAX_JOBS:
            raise UsageError(f"queue add: you have {MAX_JOBS} jobs waiting already")
        job = Job(secrets.token_hex(4), who.name, who.uid, who.gid, time.time(), cwd, list(args))
        queue.jobs.append(job)
        queue.save(who.uid)
    return job


def remove(state_dir: Path, who: Caller, job_id: str) -> Job:
    with Queue(state_dir).locked() as queue:
        job = next((j for j in queue.jobs if j.id == job_id), None)
        if job is None:
            raise UsageError(f"queue rm: no job {job_id[:20]!r} (imgbuild queue ls)")
        if job.uid != who.uid and not who.is_admin:
            raise UsageError(f"queue rm: job {job.id} is {job.user}'s, not yours")
        queue.jobs.remove(job)
        queue.save(job.uid)
    return job


def advance(
    state_dir: Path,
    who: Caller,
    start: Callable[[Job, bool], tuple[int, str]] | None = None,
    use: Mapping[str, float] | None = None,
) -> list[Job]:
    """Start what fits, in order (`order`, by `use`): every user's jobs when root (or an admin), else the caller's
    own.
    Returns the jobs tried, with their new state. Nothing starts while the queue is drained.

    Each job is claimed under the queue's lock (`starting`), started with the lock let go, and its outcome
    recorded under the lock again: a start that takes long holds nobody's `queue add` or `queue rm`."""
    tried: list[Job] = []
    blocked: set[str] = set()  # users whose next job waits: their later jobs wait behind it
    done: set[str] = set()
    while not drained(state_dir):
        with Queue(state_dir).locked() as queue:
            job = next(
                (j for j in order(queue.jobs, use=use) if j.user not in blocked and j.id not in done
                 and (who.is_admin or j.uid == who.uid)),
                None,
            )  # fmt: skip
            if job is None:
                break
            root_filed = job.uid in queue.root_filed
            job.state, job.ended = "starting", time.time()
            queue.save(job.uid)
        done.add(job.id)
        if start is None:
            code, said = _start(job, as_root=os.geteuid() == 0, root_filed=root_filed)
        else:
            code, said = start(job, os.geteuid() == 0)  # as root
        with Queue(state_dir).locked() as queue:
            mine = next((j for j in queue.jobs if j.id == job.id and j.uid == job.uid), None)
            if mine is None:
                continue  # taken back (queue rm) while it started
            if code == BUSY:
                blocked.add(mine.user)
                mine.state, mine.ended = "queued", 0.0
            else:
                mine.state, mine.ended = ("started" if code == 0 else "failed"), time.time()
                mine.container, mine.detail = (said, "") if code == 0 else ("", said)
                tried.append(mine)
            queue.save(mine.uid)
    return tried


def _child_env(job: Job | None) -> dict[str, str]:
    """The child's whole environment. Root's child: fixed (`rootside.environment`), with the job's user as sudo's
    variables when root starts a job for them; a user's own child: their environment."""
    from imgbuild.hostio.rootside import environment

    if os.geteuid() != 0:
        env = dict(os.environ)
    else:
        env = environment(dict(os.environ), sudo=job is None)  # the dry run acts for the caller sudo named
        if job is not None and job.uid != 0:  # root starts it for the user: as the user, under the rules
            env.update(SUDO_UID=str(job.uid), SUDO_GID=str(job.gid), SUDO_USER=job.user)
    return env


def _dry_run(args: list[str], cwd: str) -> tuple[int, str]:
    return _child(["--dry-run", *args], cwd, _child_env(None))


def _start(job: Job, as_root: bool, root_filed: bool = True) -> tuple[int, str]:
    """`imgbuild run -d ARGS` as the job's user; (exit code, the container's name or the last line said). Root
    starts a job it filed for the user under sudo's variables, and a job from a file the user wrote as the user,
    its privileges dropped. Root first checks as the job's user that they may enter the job's folder; either
    child then enters it with their permissions only, so a link swapped in between changes nothing."""
    if as_root and job.uid != 0:
        from imgbuild.servers.enforce import resolve_as

        seen = resolve_as(Caller(job.user, job.uid, job.gid), job.cwd)
        if "error" in seen or not seen.get("dir"):
            return 2, f"the job's folder {job.cwd[:200]}: {seen.get('error') or 'not a folder'} (checked as {job.user})"
    if as_root and not root_filed and job.uid != 0:
        code, said = _child(["-d", *job.args], job.cwd, _user_env(job), as_user=job)
    else:  # where root stays root to act for them, it enters the folder as them
        enter = job if as_root and job.uid != 0 else None
        code, said = _child(["-d", *job.args], job.cwd, _child_env(job if as_root else None), enter_as=enter)
    if code == 0:
        match = re.search(r"starting (\S+) \(", said)
        return 0, match.group(1) if match else ""
    return code, said


def _user_env(job: Job) -> dict[str, str]:
    from imgbuild.hostio.rootside import SECURE_PATH

    home = pwd.getpwuid(job.uid).pw_dir
    return {"PATH": SECURE_PATH, "HOME": home, "USER": job.user, "LOGNAME": job.user}


#: The child: an isolated interpreter (no working folder, no PYTHON* variable, no user site on its path) that takes
#: its folder and `run`'s words on standard input, so no job's words (a `-e` value) stand in an argv every user can
#: read. It starts in `/` as whoever it runs as, and enters the job's folder itself (`servers/queuechild.py`): a
#: process that is already the user's (never root on its way to becoming them) is what opens a folder the user named.
_CHILD = "from imgbuild.servers.queuechild import main;main()"


def _child(
    words: list[str], cwd: str, env: dict[str, str], as_user: Job | None = None, enter_as: Job | None = None
) -> tuple[int, str]:
    """`imgbuild run WORDS` in the job's folder `cwd`, by the queue's child (`_CHILD`) with the environment `env`
    (`as_user`: with that job's user's own IDs and groups; `enter_as`: root, entering `cwd` with that user's IDs and
    groups for the one `chdir`): (exit code, all it said on success, else its last line)."""
    ids: dict[str, Any] = {}
    if as_user is not None:  # in the child, before exec: the user's own groups and IDs, nothing of root's
        ids = {"user": as_user.uid, "group": as_user.gid,
               "extra_groups": os.getgrouplist(as_user.user, as_user.gid)}  # fmt: skip
    job = as_user or enter_as
    work: dict[str, Any] = {"cwd": cwd, "words": words, "user": job.user if job else ""}
    if enter_as is not None:
        work["enter_as"] = [enter_as.uid, enter_as.gid, os.getgrouplist(enter_as.user, enter_as.gid)]
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD], cwd="/",
            env=env, capture_output=True, text=True, timeout=START_SECONDS,
            input=json.dumps(work),
            **ids,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return 1, f"the start ran past {START_SECONDS} s"
    except OSError as exc:
        return 1, f"cannot start the job: {exc.strerror}"
    lines = [ln.removeprefix("imgbuild: ") for ln in proc.stderr.strip().splitlines() if ln.strip()]
    if proc.returncode == 0:
        return 0, proc.stderr
    return proc.returncode, (lines[-1] if lines else f"exit {proc.returncode}")[:300]
