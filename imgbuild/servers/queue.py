"""A batch queue on a shared GPU server, with no daemon: jobs wait in the state folder and start like
`imgbuild run -d` when their GPUs are free.

`imgbuild queue add [run options] -- COMMAND` checks the job as `run --dry-run` would (flags, image, mounts, the
house rules) and files it; `queue ls` lists every user's jobs; `queue rm ID` takes one of yours back. The queue
advances whenever someone looks (`queue add`, `queue run`) and on every `imgbuild reap` run (root's timer): in
order, fairly across users (the user whose oldest waiting job is oldest goes first, one job each in turn; a user
whose next job does not fit waits behind it, others go on). Root can `queue drain` (jobs that run finish, none
start) and `queue resume`.

Each user's jobs are one file, `queue-<uid>.json`, in the state folder, replaced whole, mode 0600 (a job's `-e`
values are in it; `queue ls` shows their names only). A file is believed only when it is the user's own or
root's, and a job's user, uid and gid come from the file's name and the password database, never from its JSON:
nobody can queue for another, or as another group. Starting a job is `imgbuild run -d` in a child process, by
an isolated interpreter (`python -I`: no working folder, no PYTHON* variable on its path) whose arguments come on
its standard input (never an argv others can read) and whose environment is fixed (`rootside.environment`):

- a file root wrote (a user's `sudo imgbuild queue add`, or root's own) is started by root for the user, through
  sudo's variables: the enforced mode's rules apply to it as to the user;
- a file the user wrote themself is started as that user, root's privileges dropped first (their own groups,
  their own environment's HOME): it can do nothing the user could not do by typing `imgbuild run -d`.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgbuild.errors import EnvironmentProblem, UsageError

QUEUE_FILE_RE = re.compile(r"queue-([0-9]{1,10})\.json")
DRAIN_FILE = "queue-drained"  # in root's folder of the state folder: present while drained
QUEUE_BYTES = 1024 * 1024
MAX_JOBS = 200  # one user's waiting jobs
START_SECONDS = 900  # one job's start (an image pull included)
#: The exit code `run` gives a queued job whose GPUs are busy (sysexits' EX_TEMPFAIL): it stays queued.
BUSY = 75
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
    state: str = "queued"  # queued | started | failed
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
            and isinstance(job.uid, int) and isinstance(job.gid, int) and isinstance(job.submitted, (int, float))
            and isinstance(job.cwd, str) and isinstance(job.args, list) and all(isinstance(a, str) for a in job.args)
            and job.state in ("queued", "started", "failed")
        )  # fmt: skip
        return job if typed else None


# --- choosing what starts (pure) ----------------------------------------------------------------------------


def order(jobs: list[Job]) -> list[Job]:
    """The queued jobs in the order they are tried: users in turn, the one whose oldest waiting job is oldest
    first; each user's jobs first come, first served."""
    per_user: dict[str, list[Job]] = {}
    for job in sorted((j for j in jobs if j.state == "queued"), key=lambda j: (j.submitted, j.id)):
        per_user.setdefault(job.user, []).append(job)
    turns = sorted(per_user.values(), key=lambda js: (js[0].submitted, js[0].id))
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
        return self.state_dir / f"queue-{uid}.json"

    def load(self) -> Queue:
        """Every user's jobs, as far as they can be believed."""
        self.jobs = []
        self.root_filed = set()
        try:
            names = os.listdir(self.state_dir)
        except FileNotFoundError:
            return self
        except OSError as exc:
            raise EnvironmentProblem(f"cannot read the state folder {self.state_dir}: {exc.strerror}") from None
        for name in sorted(names)[:100_000]:
            if m := QUEUE_FILE_RE.fullmatch(name):
                jobs, by_root = _read(self.state_dir / name, int(m.group(1)))
                self.jobs += jobs
                if by_root:
                    self.root_filed.add(int(m.group(1)))
        return self

    def save(self, uid: int) -> None:
        """Replace `uid`'s file whole with their jobs (written beside it, renamed over it, 0600): root's when root
        filed them (a user's `sudo imgbuild queue add`: the user cannot change it), else the user's own."""
        from imgbuild.servers.ledger import Ledger

        Ledger(self.state_dir).folder()
        from imgbuild.servers.reap import write_whole

        owner = 0 if uid in self.root_filed or os.geteuid() != 0 else uid
        write_whole(self.path(uid), {"jobs": [asdict(j) for j in self.jobs if j.uid == uid]}, mode=0o600, owner=owner)

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


def _read(path: Path, uid: int) -> tuple[list[Job], bool]:
    """`uid`'s jobs in `path`, and whether root wrote the file. Who a job is for comes from the file's name and the
    password database: a job naming another user is dropped, and its gid is the user's own, never the file's."""
    from imgbuild.regular import open_regular

    try:
        fd = open_regular(path, os.O_RDONLY)
    except OSError:
        return [], False
    if fd is None:
        return [], False
    try:
        info = os.fstat(fd)
        if info.st_uid not in (0, uid) or info.st_mode & 0o022 or not stat.S_ISREG(info.st_mode):
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
        believed.append(job)
    return believed, info.st_uid == 0


#: Words of `run` that carry a variable's value: `-e NAME=VALUE`, `--env NAME=VALUE`, `-eNAME=VALUE`, `--env=...`.
_ENV_FLAGS = ("-e", "--env")


def shown_args(args: list[str]) -> list[str]:
    """A job's arguments as `queue ls` prints them to every user: each variable's value hidden, its name kept."""
    shown: list[str] = []
    after_flag = False
    for arg in args:
        if after_flag:
            shown.append(_hide_value(arg))
            after_flag = False
        elif arg == "--":
            return [*shown, *args[len(shown) :]]
        elif arg in _ENV_FLAGS:
            shown.append(arg)
            after_flag = True
        elif arg.startswith("--env="):
            shown.append("--env=" + _hide_value(arg[len("--env=") :]))
        elif arg.startswith("-e") and len(arg) > 2 and not arg.startswith("--"):
            shown.append("-e" + _hide_value(arg[2:]))
        else:
            shown.append(arg)
    return shown


def _hide_value(item: str) -> str:
    name, eq, _ = item.partition("=")
    return f"{name}=***" if eq else name


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


def add(state_dir: Path, who: Any, args: list[str], cwd: str, check: Any = None) -> Job:
    """File a job for `who`, after `run --dry-run ARGS` accepted it (as the user: the same rules as a start)."""
    if "-d" in args or "--detach" in args or "--wait" in args:
        raise UsageError("queue add: a queued job starts detached, and waits in the queue: leave out -d and --wait")
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


def remove(state_dir: Path, who: Any, job_id: str) -> Job:
    with Queue(state_dir).locked() as queue:
        job = next((j for j in queue.jobs if j.id == job_id), None)
        if job is None:
            raise UsageError(f"queue rm: no job {job_id[:20]!r} (imgbuild queue ls)")
        if job.uid != who.uid and not who.is_admin:
            raise UsageError(f"queue rm: job {job.id} is {job.user}'s, not yours")
        queue.jobs.remove(job)
        queue.save(job.uid)
    return job


def advance(state_dir: Path, who: Any, start: Any = None) -> list[Job]:
    """Start what fits, in order (`order`): every user's jobs when root (or an admin), else the caller's own.
    Returns the jobs tried, with their new state. Nothing starts while the queue is drained."""
    if drained(state_dir):
        return []
    tried: list[Job] = []
    with Queue(state_dir).locked() as queue:
        blocked: set[str] = set()  # users whose next job waits: their later jobs wait behind it
        for job in order(queue.jobs):
            if job.user in blocked or not (who.is_admin or job.uid == who.uid):
                continue
            if start is None:
                code, said = _start(job, as_root=os.geteuid() == 0, root_filed=job.uid in queue.root_filed)
            else:
                code, said = start(job, as_root=os.geteuid() == 0)
            if code == BUSY:
                blocked.add(job.user)
                continue
            job.state, job.ended = ("started", time.time()) if code == 0 else ("failed", time.time())
            job.container, job.detail = (said, "") if code == 0 else ("", said)
            tried.append(job)
            queue.save(job.uid)
    return tried


def _child_env(job: Job | None) -> dict[str, str]:
    """The child's whole environment. Root's child: fixed (`rootside.environment`), with the job's user as sudo's
    variables when root starts a job for them; a user's own child: their environment."""
    from imgbuild.rootside import environment

    if os.geteuid() != 0:
        env = dict(os.environ)
    else:
        env = environment(dict(os.environ), sudo=job is None)  # the dry run acts for the caller sudo named
        if job is not None and job.uid != 0:  # root starts it for the user: as the user, under the rules
            env.update(SUDO_UID=str(job.uid), SUDO_GID=str(job.gid), SUDO_USER=job.user)
    env["IMGBUILD_QUEUE_JOB"] = "1"  # busy GPUs exit BUSY, not 2
    return env


def _dry_run(args: list[str], cwd: str) -> tuple[int, str]:
    return _imgbuild(["run", "--dry-run", *args], cwd, _child_env(None))


def _start(job: Job, as_root: bool, root_filed: bool = True) -> tuple[int, str]:
    """`imgbuild run -d ARGS` as the job's user; (exit code, the container's name or the last line said). Root
    starts a job it filed for the user under sudo's variables, and a job from a file the user wrote as the user,
    its privileges dropped."""
    if as_root and not root_filed and job.uid != 0:
        code, said = _imgbuild(["run", "-d", *job.args], job.cwd, _user_env(job), as_user=job)
    else:
        code, said = _imgbuild(["run", "-d", *job.args], job.cwd, _child_env(job if as_root else None))
    if code == 0:
        match = re.search(r"starting (\S+) \(", said)
        return 0, match.group(1) if match else ""
    return code, said


def _user_env(job: Job) -> dict[str, str]:
    from imgbuild.rootside import SECURE_PATH

    home = pwd.getpwuid(job.uid).pw_dir
    return {"PATH": SECURE_PATH, "HOME": home, "USER": job.user, "LOGNAME": job.user, "IMGBUILD_QUEUE_JOB": "1"}


#: The child: an isolated interpreter (no working folder, no PYTHON* variable, no user site on its path) that takes
#: its arguments on standard input, so no job's words (a `-e` value) stand in an argv every user can read.
_CHILD = "import json,sys;sys.argv=['imgbuild',*json.load(sys.stdin)];from imgbuild.cli import main;main()"


def _imgbuild(args: list[str], cwd: str, env: dict[str, str], as_user: Job | None = None) -> tuple[int, str]:
    ids: dict[str, Any] = {}
    if as_user is not None:  # in the child, before exec: the user's own groups and IDs, nothing of root's
        ids = {"user": as_user.uid, "group": as_user.gid,
               "extra_groups": os.getgrouplist(as_user.user, as_user.gid)}  # fmt: skip
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD], cwd=cwd if os.path.isdir(cwd) else "/",
            env=env, capture_output=True, text=True, timeout=START_SECONDS, input=json.dumps(args),
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
