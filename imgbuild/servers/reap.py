"""`imgbuild reap`: the house rules of a shared GPU server, enforced from cron or a systemd timer.

Each run reads the containers and the GPUs, records a sample of each container's GPU use, decides
(`decide`, pure: rows, samples, the time and the policy in; actions out) and acts: it warns an owner
first (a line in the container's own log and a notice file in their home), stops only after the lead
time, and records every action in a log. Stopping is the default; removing is a separate setting.
Running it twice does nothing more the second time; `--dry-run` prints exactly what it would do.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import pwd
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.config.site import ReapPolicy, RunRules
from imgbuild.engine.types import ContainerInfo, LocalImage
from imgbuild.errors import EnvironmentProblem
from imgbuild.servers import usage
from imgbuild.servers.ledger import REAPER_DIR, append_record, reaper_dir

if TYPE_CHECKING:
    from imgbuild.engine.types import ImageEngine

STATE_FILE = "reap-state.json"
STATE_BYTES = 4 * 1024 * 1024
#: Samples kept per container (a run every 5 minutes keeps 2 days).
SAMPLES_KEPT = 576
NOTICE_FILE = "imgbuild-notices.txt"


@dataclass
class Action:
    verb: str  # warn | stop | remove | notice | discard (an image)
    name: str
    user: str
    reason: str
    rule: str  # deadline | idle | exited | unnamed | image
    id: str = ""


@dataclass
class State:
    """What earlier runs saw: GPU samples per container ID, and which warnings were given (and when)."""

    samples: dict[str, list[list[float]]] = field(default_factory=dict)  # id -> [[time, busy 0/1], ...]
    warned: dict[str, dict[str, float]] = field(default_factory=dict)  # id -> {rule: when}
    last_run: float | None = None  # when the previous run sampled (the usage log's intervals)
    noticed: dict[str, float] = field(default_factory=dict)  # id -> when its `--notify` notice was given
    images_used: dict[str, float] = field(default_factory=dict)  # image id -> when a container last had it


# --- deciding (pure) ----------------------------------------------------------------------------------


def idle_since(samples: list[list[float]]) -> float | None:
    """When the trailing run of idle samples began (None when the newest sample is busy, or none)."""
    since = None
    for when, busy in reversed(samples):
        if busy:
            break
        since = when
    return since


def decide(
    rows: list[ContainerInfo],
    state: State,
    now: float,
    rules: ReapPolicy,
    deadlines: dict[str, float | None],
    known_user: Callable[[str], bool],
) -> list[Action]:
    """The actions one run takes. A running container past its deadline, or idle past idle_timeout, is
    warned first and stopped once the warning is warn_lead old; `deadlines`: each container's deadline as
    `extend` moved it."""
    actions: list[Action] = []
    for row in rows:
        if row.smoke or any(fnmatch.fnmatchcase(row.name, p) for p in rules.exempt):
            continue
        owned = bool(row.labelled or ("_" in row.name and known_user(row.name.split("_", 1)[0])))
        if row.status in ("exited", "created", "dead"):
            action = _exited(row, owned, now, rules)
        elif row.status == "running":
            action = _running(row, owned, state, now, rules, deadlines.get(row.id))
        else:
            action = None
        if action:
            actions.append(action)
    return actions


def decide_images(
    images: list[LocalImage], rows: list[ContainerInfo], state: State, now: float, rules: ReapPolicy,
    known_user: Callable[[str], bool],
) -> list[Action]:  # fmt: skip
    """Users' images (`<user>/...`) that no container has used for the site's `image_max_age`: discarded. Never
    one a container (running or not) was made from, nor `<tag>-previous` while `<tag>`'s image is in use (the
    way back from a rebuild). Last use: the latest of its creation, its tagging and a container seen with it."""
    most = rules.image_seconds
    if most is None:
        return []
    in_use = {r.image_id for r in rows if r.image_id} | {r.image for r in rows if r.image}
    ids = {i.ref: i.id for i in images}
    actions = []
    for image in images:
        user = usage.image_owner(image.ref, known_user)
        if not user or image.id in in_use or image.ref in in_use:
            continue
        if image.ref.endswith("-previous"):
            current = image.ref.removesuffix("-previous")
            if current in in_use or ids.get(current) in in_use:
                continue
        last = max(image.created_ts or 0.0, image.tagged_ts or 0.0, state.images_used.get(image.id, 0.0))
        if now - last >= most:
            actions.append(Action("discard", image.ref, user, f"no container used it for {human(now - last)}", "image"))
    return actions


def _exited(row: ContainerInfo, owned: bool, now: float, rules: ReapPolicy) -> Action | None:
    """An old exited or never-started container of a user: removed, where the site asked for removal."""
    ended = row.finished_ts or row.created_ts
    max_age = rules.exited_seconds
    if not (rules.remove and max_age is not None and owned and ended is not None):
        return None
    if now - ended < max_age:
        return None
    reason = f"{'never started' if row.status == 'created' else 'exited'} {human(now - ended)} ago"
    return Action("remove", row.name, row.user or "", reason, "exited", row.id)


def _running(
    row: ContainerInfo, owned: bool, state: State, now: float, rules: ReapPolicy, deadline: float | None
) -> Action | None:
    name, cid, user = row.name, row.id, row.user or ""
    lead = rules.warn_seconds
    final = "remove" if rules.remove else "stop"
    if not owned:
        reason = "not named <user>_... and not started by imgbuild run"
        return Action(final, name, user, reason, "unnamed", cid) if rules.unnamed else None
    warned = dict(state.warned.get(cid, {}))
    if deadline is not None and warned.get("deadline", deadline) < deadline - lead:
        del warned["deadline"]  # warned of an earlier deadline; `extend` moved it: warn again
    if deadline is not None and now >= deadline - lead:
        verb = _warn_then(final, warned, "deadline", now, lead, deadline)
        if verb:
            when = "passed" if now >= deadline else f"in {human(deadline - now)}"
            return Action(verb, name, user, f"its deadline {when}", "deadline", cid)
    timeout = rules.idle_seconds
    since = idle_since(state.samples.get(cid, []))
    if timeout is not None and since is not None and now - since >= timeout:
        verb = _warn_then(final, warned, "idle", now, lead, None)
        if verb:
            return Action(verb, name, user, f"its GPUs idle for {human(now - since)}", "idle", cid)
    return None


def _warn_then(final: str, warned: dict[str, float], rule: str, now: float, lead: float, due: float | None) -> str:
    """ "warn" the first time, `final` once the warning is `lead` old (and a deadline has come), else ""."""
    if rule not in warned:
        return "warn"
    if now - warned[rule] >= lead and (due is None or now >= due):
        return final
    return ""


def human(seconds: float) -> str:
    from imgbuild.servers.containers import human_duration

    return human_duration(max(0.0, seconds))


# --- sampling ------------------------------------------------------------------------------------------


def sample(rows: list[ContainerInfo], gpus: list[Any], rules: ReapPolicy, now: float, state: State) -> None:
    """Add one sample per running container with GPUs: busy when any of its GPUs is above idle_percent
    (a GPU whose use cannot be read, as on MIG, counts as busy: never stop what cannot be measured)."""
    from imgbuild.servers.holds import running_with_gpus

    alive = set()
    for row, held in running_with_gpus(rows, gpus):
        alive.add(row.id)
        busy = any(g.utilization is None or g.utilization > rules.idle_percent for g in held)
        kept = state.samples.setdefault(row.id, [])
        kept.append([now, 1.0 if busy else 0.0])
        del kept[:-SAMPLES_KEPT]
        if busy:
            state.warned.get(row.id, {}).pop("idle", None)  # busy again: a later idleness is warned anew
    state.samples = {k: v for k, v in state.samples.items() if k in alive}
    present = {r.id for r in rows}
    state.warned = {k: v for k, v in state.warned.items() if k in present and v}


# --- state, log and notices (I/O) ------------------------------------------------------------------------


def load_state(path: Path) -> State:
    """The reaper's own state. Written only by the reaper (an admin); one that someone else owns is not
    believed (forged idle samples would stop a busy user's job)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return State()
    except OSError as exc:
        raise EnvironmentProblem(f"cannot read {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or not stat.S_ISREG(info.st_mode) or info.st_mode & 0o022:
            return State()
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(STATE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        raw = json.loads(data) if len(data) <= STATE_BYTES else {}
        last = raw.get("last_run")
        return State(
            {str(k): [[float(t), float(b)] for t, b in v] for k, v in dict(raw.get("samples", {})).items()},
            {str(k): {str(r): float(w) for r, w in dict(v).items()} for k, v in dict(raw.get("warned", {})).items()},
            float(last) if isinstance(last, (int, float)) and not isinstance(last, bool) else None,
            {str(k): float(w) for k, w in dict(raw.get("noticed", {})).items()},
            {str(k): float(w) for k, w in dict(raw.get("images_used", {})).items()},
        )
    except (ValueError, TypeError, AttributeError, RecursionError):
        return State()


def save_state(path: Path, state: State) -> None:
    """Replace the state file (written beside it, renamed over it: never half written)."""
    write_whole(path, asdict(state))


def write_whole(path: Path, data: Any, mode: int = 0o644, owner: int = 0) -> None:
    """`data` as JSON in `path`, written whole by the one writer (never through a link, synced, renamed over it);
    given to `owner` where root writes a user's own file. Root first removes what someone else planted at the name
    (a folder, a FIFO, a link: the state folder is sticky and world-writable, and only root may take another
    user's entry away)."""
    from imgbuild.hostio.regular import write_atomic

    try:
        write_atomic(path, json.dumps(data), mode, owner, planted=True)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write {path}: {exc.strerror}") from None


def append_log(path: Path, now: float, action: Action, outcome: str) -> None:
    """One JSON line in the action log."""
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)), **asdict(action), "outcome": outcome}
    append_record(path, record, "the reap log")


def write_notice(user: str, text: str) -> bool:
    """Append a line to NOTICE_FILE in the user's home, as a file they own; never through a link."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return False
    home = Path(entry.pw_dir)
    try:
        if os.lstat(home).st_uid != entry.pw_uid:
            return False  # not their own folder: write nothing there
        # O_NONBLOCK: a FIFO there (the user's own plant) must not hang root's reaper
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(home / NOTICE_FILE, flags, 0o600)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            return False
        if info.st_uid != entry.pw_uid:
            if info.st_uid != os.geteuid() or info.st_size:
                return False
            with contextlib.suppress(OSError):
                os.fchown(fd, entry.pw_uid, entry.pw_gid)
        os.write(fd, (text + "\n").encode())
        return True
    finally:
        os.close(fd)


def primary_group(user: str) -> str:
    """The user's primary group's name ("" for a name this host does not know)."""
    import grp

    try:
        gid = pwd.getpwnam(user).pw_gid
    except KeyError:
        return ""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def known_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# --- one run --------------------------------------------------------------------------------------------


@dataclass
class Report:
    actions: list[Action]
    outcomes: list[str]


def reap(
    engine: ImageEngine,
    gpus: list[Any],
    house: RunRules,
    rules: ReapPolicy,
    now: float,
    dry_run: bool = False,
    notify: Callable[[str, str], bool] = write_notice,
) -> Report:
    """One reaper run at time `now` (injectable): sample, decide, then (unless `dry_run`) warn, stop,
    remove, and record each action in the log."""
    from imgbuild.servers.containers import effective_deadline
    from imgbuild.servers.ledger import Ledger

    state_dir = house.ledger_dir
    ledger = Ledger(state_dir)
    extended = ledger.read().extended
    # a dry run makes nothing: the reaper's folder is read where it exists, made only by a real run
    own = reaper_dir(state_dir) if not dry_run or (state_dir / REAPER_DIR).exists() else state_dir / REAPER_DIR
    state_path = own / STATE_FILE
    state = load_state(state_path)
    rows = engine.containers.rows()
    sample(rows, gpus, rules, now, state)
    deadlines = {r.id: effective_deadline(r, extended, house) for r in rows}
    actions = decide(rows, state, now, rules, deadlines, known_user)
    if rules.image_seconds is not None:
        images = engine.images.local_images()
        present = {i.id for i in images}
        state.images_used = {k: v for k, v in state.images_used.items() if k in present}
        state.images_used.update({r.image_id: now for r in rows if r.image_id in present})
        actions += decide_images(images, rows, state, now, rules, known_user)
    if dry_run:
        return Report(actions, ["dry run"] * len(actions))
    log = Path(rules.log) if rules.log else own / "reap.log"
    outcomes = []
    try:
        for action in actions:
            if action.verb == "warn":  # recorded first: a warning that fails half-way is not given twice
                state.warned.setdefault(action.id, {})[action.rule] = now
            outcome = _act(engine, action, rules, now, notify)
            append_log(log, now, action, outcome)
            outcomes.append(outcome)
        # what the GPUs were held for since the last run (imgbuild usage), once the rules are enforced
        usage.append(own, usage.record(now, state.last_run, usage.holds_of(rows, gpus, primary_group)))
        state.last_run = now
        present = {r.id for r in rows}
        state.noticed = {k: v for k, v in state.noticed.items() if k in present}
        for row in rows:
            notice = job_notice(row, state.noticed)
            if notice is None:
                continue
            state.noticed[row.id] = now  # given once, whatever its channels say
            text, facts = notice
            outcome = _give_notice(row.user, text, facts, rules, notify)
            append_log(log, now, Action("notice", row.name, row.user, text, "notify", row.id), outcome)
    finally:
        save_state(state_path, state)  # whatever failed, what was done is remembered
    return Report(actions, outcomes)


def job_notice(row: ContainerInfo, noticed: dict[str, float]) -> tuple[str, dict[str, str]] | None:
    """The notice of a `run --notify` job that ended and has none yet: (its line, the facts for notify_command).
    Only for a container named for the user its label names (`<user>_...`): a hand-made one cannot send
    another user notices."""
    user, name = str(row.user or ""), str(row.name or "")
    if not row.notify or row.status not in ("exited", "dead") or row.id in noticed:
        return None
    if not user or not name.startswith(user + "_"):
        return None
    code = row.exit_code
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    started, finished = row.started_ts, row.finished_ts
    seconds = max(0.0, finished - started) if isinstance(started, float) and isinstance(finished, float) else 0.0
    gpus = len([g for g in str(row.gpu_uuids or row.gpus or "").split(",") if g])
    gpu_hours = gpus * seconds / 3600
    outcome = "finished" if code == 0 else f"failed (exit {code if code is not None else 'unknown'})"
    text = f"imgbuild: {name} {outcome} after {human(seconds)}, {gpu_hours:.2f} GPU-hours on {gpus} GPU(s)"
    facts = {
        "IMGBUILD_NOTICE_USER": user,
        "IMGBUILD_NOTICE_CONTAINER": name,
        "IMGBUILD_NOTICE_EXIT": "" if code is None else str(code),
        "IMGBUILD_NOTICE_SECONDS": f"{seconds:.0f}",
        "IMGBUILD_NOTICE_GPU_HOURS": f"{gpu_hours:.4f}",
        "IMGBUILD_NOTICE_TEXT": text,
    }
    return text, facts


NOTIFY_SECONDS = 30  # the site's notify_command, once


def _give_notice(
    user: str, text: str, facts: dict[str, str], rules: ReapPolicy, notify: Callable[[str, str], bool]
) -> str:
    """A line in the user's notice file, and the site's notify_command run with the facts in its environment
    (argv as configured, no shell; bounded in time, its output discarded)."""
    import subprocess

    channels = ["notice file" if notify(user, text) else "no notice file"]
    argv = list(rules.notify_command)
    if argv:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **facts}
        try:
            done = subprocess.run(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                timeout=NOTIFY_SECONDS, check=False,
            )  # fmt: skip
            channels.append(f"notify_command exit {done.returncode}")
        except subprocess.TimeoutExpired:
            channels.append(f"notify_command ran past {NOTIFY_SECONDS} s")
        except OSError as exc:
            channels.append(f"notify_command failed: {exc.strerror}")
    return "noticed (" + ", ".join(channels) + ")"


def _act(engine: ImageEngine, action: Action, rules: ReapPolicy, now: float, notify: Callable[[str, str], bool]) -> str:
    if action.verb == "discard":
        return engine.images.discard(action.name)
    if action.verb == "warn":
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(now + rules.warn_seconds))
        then = "removed" if rules.remove else "stopped"
        text = (
            f"imgbuild reap: {action.name} will be {then} at about {when}: {action.reason} "
            f"(this server's house rules; `imgbuild extend {action.name} 1d` where a deadline allows it)"
        )
        logged = engine.containers.note(action.name, text)
        noticed = notify(action.user, text) if action.user else False
        channels = ["container log" if logged else "no container log", "notice file" if noticed else "no notice file"]
        return f"warned ({', '.join(channels)})"
    try:
        engine.containers.stop(action.name)
        if action.verb == "remove":
            engine.containers.remove(action.name)
    except Exception as exc:  # noqa: BLE001 - one container's failure must not stop the run; it is logged
        return f"failed: {str(exc)[:200]}"
    return "stopped" if action.verb == "stop" else "removed"
