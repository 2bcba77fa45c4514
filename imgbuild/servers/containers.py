"""Your containers, by short name: finding one, whose it is, its deadline and moving it (`extend`), GPUs it has
lost (a re-attached driver), and the `ps` view of them all."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from imgbuild.config.site import RunRules
from imgbuild.engine.types import ContainerInfo
from imgbuild.errors import ImgbuildError, UsageError
from imgbuild.hostio.acting import acting_for_user
from imgbuild.servers.spec import parse_duration

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.engine.types import ImageEngine
    from imgbuild.hostio.host import Caller

# --- your containers, by short name ---------------------------------------------------------------


def find_container(rows: list[ContainerInfo], name: str, user: str) -> ContainerInfo:
    """The container `name` means: an exact name, `<user>_<name>`, or the one `<user>_<name>_<n>`."""
    by_name = {r.name: r for r in rows}
    for candidate in (name, f"{user}_{name}"):
        if candidate in by_name:
            return by_name[candidate]
    matches = sorted(n for n in by_name if n.startswith(f"{user}_{name}_"))
    if len(matches) == 1:
        return by_name[matches[0]]
    if matches:
        raise UsageError(f"{name!r} matches {', '.join(matches)}: say which")
    raise UsageError(f"no container {name!r} (yours are named {user}_...; see imgbuild ps)")


#: The verbs that put the caller inside a container (a process of theirs in it, or its terminal).
ENTERING = ("exec", "attach")


def check_owner(row: ContainerInfo, who: Caller, verb: str, force: bool) -> None:
    """Every verb on a container follows one rule: it is the caller's, or an admin says --force.

    The owner is the `org.imgbuild.user` label `imgbuild run` writes (else the `<user>_` name prefix);
    the caller is who really runs imgbuild (sudo-aware), never a --user flag. Through sudo, a user enters (`exec`,
    `shell`, `attach`) only a container that runs as them without privileges, as `imgbuild run` starts theirs:
    never one named theirs by hand, root inside with Docker's capabilities; and no verb reaches a script
    container (labelled theirs for its GPUs and quota), whose output imgbuild believes."""
    if row.smoke and acting_for_user(who):  # its output is imgbuild's answer (a smoke test, a base's pins)
        raise UsageError(f"{row.name} is a container imgbuild runs for a check; it ends with the check")
    if row.user == who.name:
        if verb in ENTERING and acting_for_user(who) and row.runs_as.split(":")[0] != str(who.uid):
            raise UsageError(
                f"{row.name} does not run as you ({who.uid}) without privileges: through sudo you {verb} only into "
                "containers imgbuild run started for you (an admin may)"
            )
        return
    if force and who.is_admin:
        return
    if force:
        raise UsageError(
            f"{row.name} belongs to {row.user or 'nobody known'}: only root may {verb} other users' containers"
        )
    raise UsageError(
        f"{row.name} belongs to {row.user or 'nobody known'}, not to {who.name}"
        + ("; --force to " + verb + " it anyway" if who.is_admin else "")
    )


def deadline_of(wanted: str | None, house: RunRules, now: float | None = None) -> float | None:
    """`--time` (else the site's default_time) from now, within the site's max_time."""
    seconds = parse_duration(wanted, "--time") if wanted else house.default_seconds
    if seconds is None:
        return None
    if seconds <= 0:
        raise UsageError(f"--time {wanted}: a deadline must be later than now (e.g. 2h)")
    most = house.max_seconds
    if most is not None and seconds > most:
        raise UsageError(f"--time {wanted}: this site allows at most {human_duration(most)} (run.max_time)")
    return (time.time() if now is None else now) + seconds


def human_duration(seconds: float) -> str:
    """1d 2h, 45m, 30s."""
    seconds = int(round(seconds))
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "m")]
    text = " ".join(f"{n}{unit}" for n, unit in parts if n)
    return text or f"{seconds}s"


def effective_deadline(row: ContainerInfo, extended: dict[str, Any], house: RunRules) -> float | None:
    """A container's deadline: its label, moved by `extend` (never past its start + the site's max_time), by
    its owner only (`extended`: container ID -> ledger.Extension)."""
    label = row.deadline
    extension = extended.get(row.id or "")
    moved = extension.deadline if extension is not None and extension.user == row.user else None
    if label is None or moved is None or moved <= label:
        return label
    most = house.max_seconds
    created = row.created_ts
    if most is not None and created is not None:
        moved = min(moved, created + most)
    return max(label, moved)


def extend(row: ContainerInfo, by: str, house: RunRules) -> float:
    """Move one container's deadline by `by`, within the site's max_time from its start; the new deadline."""
    from imgbuild.servers.ledger import Extension, Ledger

    seconds = parse_duration(by, "extend")
    if row.deadline is None:
        raise UsageError(f"{row.name} has no deadline to extend")
    ledger = Ledger(house.ledger_dir)
    with ledger.transaction() as book:
        current = effective_deadline(row, book.extended, house) or 0.0
        wanted = current + seconds
        most = house.max_seconds
        created = row.created_ts
        if most is not None and created is not None and wanted > created + most + 1:
            raise UsageError(
                f"extend {row.name} {by}: the site allows {human_duration(most)} from its start (run.max_time); "
                f"at most {human_duration(max(0.0, created + most - current))} more"
            )
        book.extended[row.id] = Extension(wanted, row.user or "")
    return wanted


#: What a container says when the host's GPUs were re-attached under it (a `systemctl daemon-reload`
#: rewrites the device cgroup of containers started with NVIDIA's hook).
LOST_GPU_SIGNS = ("NVML: Unknown Error", "Failed to initialize NVML")
LOST_GPU_FIX = (
    "GPUs lost (NVML: Unknown Error, typically after `systemctl daemon-reload` on the host): save your work, "
    "then `imgbuild stop --rm {name}` and start it again (admins: use CDI devices to prevent it)"
)


#: Where NVIDIA's container toolkit puts the host's nvidia-smi in every container given GPUs (a bind of the
#: host's binary): named by this path, never looked up on the container's PATH.
NVIDIA_SMI = "/usr/bin/nvidia-smi"


def gpus_lost(engine: ImageEngine, row: ContainerInfo) -> str:
    """The one-line fix when a running container with GPUs can no longer reach them; "" otherwise (or when the
    container does not answer within its bound)."""
    if row.status != "running" or not (row.gpus or row.gpu_uuids):
        return ""
    code, output = engine.containers.probe(row.name, [NVIDIA_SMI, "-L"])
    if code != 0 and any(sign in output for sign in LOST_GPU_SIGNS):
        return LOST_GPU_FIX.format(name=row.name)
    return ""


def _lost_of(engine: ImageEngine, rows: list[ContainerInfo]) -> dict[str, str]:
    """Container name -> the fix for its lost GPUs, probed side by side: a container that does not answer costs
    one bound, not one per container."""
    from concurrent.futures import ThreadPoolExecutor

    probed = [r for r in rows if r.status == "running" and (r.gpus or r.gpu_uuids) and not r.smoke]
    if not probed:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(probed))) as pool:
        return dict(zip((r.name for r in probed), pool.map(lambda r: gpus_lost(engine, r), probed), strict=True))


def lost_containers(engine: ImageEngine, who: Caller) -> list[dict[str, str]]:
    """Running containers of `who` (every user's for an admin) whose GPUs vanished under them, each with the fix
    (`imgbuild gpus`). Nobody's `gpus` execs into another user's container."""
    rows = [r for r in engine.containers.rows() if who.is_admin or r.user == who.name]
    return [{"name": name, "fix": fix} for name, fix in sorted(_lost_of(engine, rows).items()) if fix]


def container_view(
    engine: ImageEngine, settings: Settings, now: float | None = None, all_users: bool = False
) -> list[dict[str, Any]]:
    """`ps`'s rows: the caller's containers (`all_users`: everyone's), with each deadline (as `extend` moved it),
    the time left, lost GPUs (probed in the caller's own containers only, or every one for an admin)."""
    from imgbuild.errors import EnvironmentProblem
    from imgbuild.servers.ledger import Ledger

    house = settings.run
    try:
        extended = Ledger(house.ledger_dir).read().extended
    except EnvironmentProblem:
        extended = {}
    now = time.time() if now is None else now
    who = settings.caller
    shown = [r for r in engine.containers.rows() if all_users or r.user == who.name]
    lost = _lost_of(engine, [r for r in shown if who.is_admin or r.user == who.name])
    rows = []
    for row in shown:
        deadline = effective_deadline(row, extended, house)
        left = "" if deadline is None else ("passed" if deadline <= now else human_duration(deadline - now))
        rows.append({**row.to_json(), "deadline": deadline, "time_left": left, "gpus_lost": lost.get(row.name, "")})
    return rows


def watch_gpus(
    settings: Settings, interval: float | None, count: int | None = None, sleep: Callable[[float], None] = time.sleep
) -> Iterator[tuple[list[Any], list[dict[str, str]]]]:
    """This host's GPUs and the containers that lost theirs (`imgbuild gpus`): one reading, or one every `interval`
    seconds (`count` at most). The engine is asked from the first reading on, where it answers; a host without
    GPUs raises NoGpus."""
    from imgbuild.engine import connect_engine
    from imgbuild.gpu.read import read_gpus

    engine: ImageEngine | None = None
    shown = 0
    while True:
        readings = read_gpus(settings.gpu_snapshot)
        if shown == 0:
            with contextlib.suppress(ImgbuildError):
                engine = connect_engine(settings)
        try:
            lost = lost_containers(engine, settings.caller) if engine else []
        except ImgbuildError:
            lost = []
        yield readings, lost
        shown += 1
        if interval is None or (count and shown >= count):
            return
        sleep(interval)
