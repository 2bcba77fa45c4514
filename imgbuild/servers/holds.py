"""Who holds what on this host: GPUs, CPUs and ports of live containers (their labels and cpusets) and of the
ledger's starting runs, and the quotas over them (per user, per group)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from imgbuild.config.site import RunRules
from imgbuild.engine.types import ContainerInfo
from imgbuild.errors import ImgbuildError, UsageError
from imgbuild.gpu.allocate import Claim, Claims, GpusBusy, Selection, requested_count, select_gpus
from imgbuild.gpu.read import Gpu
from imgbuild.servers.spec import cpulist_of

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.engine.types import ImageEngine
    from imgbuild.pipeline.smoke import QuotaCheck


@dataclass
class Held:
    """What is taken on this host: GPUs given to containers or to starting runs, and pinned CPUs."""

    gpus: Claims = field(default_factory=dict)
    cpus: dict[int, int] = field(default_factory=dict)  # CPU -> how many containers are pinned to it
    ports: set[int] = field(default_factory=set)  # host ports published by containers or starting runs
    containers: dict[str, int] = field(default_factory=dict)  # user -> their containers, any state, and starts


def gpu_claims(settings: Settings) -> Callable[[Any, list[Any]], dict[str, list[Claim]]]:
    """Who else holds which GPU on this host, for a smoke test's choice (build.smoke.ClaimsOf): the ledger's entries
    and the engine's live containers. An unreadable ledger counts for nothing (the GPUs' own processes still do)."""
    from imgbuild.servers.ledger import Ledger

    def read(engine: ImageEngine, readings: list[Any]) -> dict[str, list[Claim]]:
        try:
            book = Ledger(settings.run.ledger_dir).read()
            return held_on_host(engine.containers.rows(), book.holds(), readings).gpus
        except ImgbuildError:
            return {}

    return read


def quota_check(settings: Settings, user: str) -> QuotaCheck:
    """The site's GPU quota for `user`'s smoke test (build.smoke.QuotaCheck): the GPUs it would take count as
    a run of theirs, against what they (and their groups) hold already."""
    house = settings.run

    def check(selection: Selection, claims: dict[str, list[Claim]]) -> None:
        check_quota(user, selection, Held(gpus=claims), house)

    return check


def held_on_host(rows: list[ContainerInfo], entries: list[Any], gpus: list[Any]) -> Held:
    """Claims from the engine's live containers (their labels and cpusets) and the ledger's entries."""
    held = Held()
    uuid_of = {g.index: g.uuid for g in gpus}

    def claim(uuid: str, user: str, what: str) -> None:
        held.gpus.setdefault(uuid, []).append(Claim(user, what))

    mine = Counter(row.user for row in rows if not row.smoke)  # a script container ends with its check
    held.containers = dict(mine + Counter(entry.user for entry in entries))  # starts: not listed yet
    for row in rows:
        if row.status not in ("running", "restarting", "paused"):
            continue
        for uuid in container_gpus(row, uuid_of):
            claim(uuid, row.user, f"container {row.name}")
        for cpu in cpulist_of(row.cpuset or ""):
            held.cpus[cpu] = held.cpus.get(cpu, 0) + 1
        held.ports.update(row.ports or [])
    for entry in entries:
        held.ports.update(entry.ports)
        for uuid in entry.gpus:
            claim(uuid, entry.user, f"{entry.name} starting")
        for cpu in entry.cpus:
            held.cpus[cpu] = held.cpus.get(cpu, 0) + 1
    return held


def container_gpus(row: ContainerInfo, uuid_of: dict[int, str]) -> list[str]:
    """The UUIDs of a container's GPUs, from its labels (indices, for containers started before UUIDs)."""
    uuids = [u for u in (row.gpu_uuids or "").split(",") if u]
    if uuids:
        return uuids
    indices = [int(i) for i in (row.gpus or "").split(",") if i.isdigit()]
    return [uuid_of[i] for i in indices if i in uuid_of]


def running_with_gpus(rows: list[ContainerInfo], gpus: list[Any]) -> list[tuple[ContainerInfo, list[Any]]]:
    """Each running container with GPUs this host reads, and those GPUs (the reaper's samples, the usage log)."""
    uuid_of = {g.index: g.uuid for g in gpus}
    by_uuid = {g.uuid: g for g in gpus}
    found = []
    for row in rows:
        if row.status == "running":
            held = [by_uuid[u] for u in container_gpus(row, uuid_of) if u in by_uuid]
            if held:
                found.append((row, held))
    return found


class OverQuota(GpusBusy):
    """The run would take its user (or group) past a quota now: it may start once their own runs end, and while
    it waits it holds no place ahead of anyone else."""


def _limits(user: str, house: RunRules) -> list[tuple[str, int | None, set[str], str]]:
    """(setting, limit, the users it counts, how to say what they hold) of every quota `user` is under."""
    limits: list[tuple[str, int | None, set[str], str]] = [
        ("run.max_gpus_per_user", house.max_gpus_per_user, {user}, "you hold")
    ]
    for group, most in sorted(house.max_gpus_per_group.items()):
        members = group_members(group)
        if user in members:
            limits.append((f"run.max_gpus_per_group {group}", most, members, f"group {group} holds"))
    return limits


def choose_gpus(
    user: str, request: str, gpus: list[Gpu], held: Held, house: RunRules, force: bool = False
) -> Selection:
    """The GPUs `--gpus REQUEST` gives a run of `user` on a host with `gpus`, under the site's quotas, in one step:
    a request that could never start, whoever holds what (more GPUs than the host has, or than a quota of the
    user's allows), is refused at once (exit 2), never waited for nor queued; then the GPUs are chosen (busy ones:
    GpusBusy, a run may wait); then what the user (or their group) holds with them must stay within each quota
    (OverQuota: it may start once their own runs end)."""
    if gpus:
        count = requested_count(request, gpus)
        if count > len(gpus):
            raise UsageError(f"--gpus {request}: this host has {len(gpus)} GPUs; this run could never start")
        for key, limit, _, _ in _limits(user, house):
            if limit is not None and count > int(limit):
                raise UsageError(f"--gpus {request}: at most {limit} GPUs at once ({key}); this run could never start")
    selection = select_gpus(request, gpus, user, force=force, claims=held.gpus)
    _check_quota(user, set(selection.uuids), held, house)
    return selection


def check_count(user: str, held: Held, house: RunRules) -> None:
    """One more container keeps `user` within the site's `max_containers_per_user` (refused at once: their own
    containers, not others', are what stands in the way)."""
    most = house.max_containers_per_user
    have = held.containers.get(user, 0)
    if most is not None and have >= most:
        raise UsageError(
            f"you have {have} containers, running or stopped, and this site allows {most} "
            "(run.max_containers_per_user): remove some first (imgbuild ps; imgbuild stop --rm NAME)"
        )


def check_quota(user: str, selection: Selection, held: Held, house: RunRules) -> None:
    """The site's `max_gpus_per_user` and `max_gpus_per_group` ({group: GPUs all its members hold})."""
    _check_quota(user, set(selection.uuids), held, house)


def _check_quota(user: str, wanted: set[str], held: Held, house: RunRules) -> None:
    """Whether taking the GPUs `wanted` (their UUIDs) keeps `user` and each group of theirs within its quota."""
    if not wanted:
        return
    for key, limit, members, who in _limits(user, house):
        if limit is None:
            continue
        have = _holding(held, members)
        total = len(set(have) | wanted)
        if total > int(limit):
            listed = "; ".join(sorted(w for ws in have.values() for w in ws)) or "none"
            raise OverQuota(
                f"quota: at most {limit} GPUs at once ({key}); {who} {len(have)} ({listed}) and this run asks "
                f"for {len(wanted - set(have))} more"
            )


def _holding(held: Held, members: set[str]) -> dict[str, set[str]]:
    """GPU UUID -> what of `members` holds it."""
    out: dict[str, set[str]] = {}
    for uuid, claims in held.gpus.items():
        for c in claims:
            if c.user in members:
                out.setdefault(uuid, set()).add(f"{c.user}: {c.what}")
    return out


def group_members(group: str) -> set[str]:
    """Users in a Unix group: its listed members and those whose primary group it is."""
    import grp
    import pwd

    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return set()
    return set(entry.gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == entry.gr_gid}
