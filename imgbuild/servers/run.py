"""Start containers the way shared GPU servers want: `<user>_<name>_<n>` names, your UID, --ipc host,
NVIDIA's ulimits, the current folder at /workspace, capped logs, free GPUs only, a CPU share per GPU.

`prepare` turns a RunRequest into a RunSpec under the house rules (and, through sudo, the enforced ones);
`reserved` holds its GPUs in the host's ledger until the container runs; then it starts, detached or not.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.config.checks import shm_size
from imgbuild.config.site import RunRules
from imgbuild.engine.runargs import env_file_text
from imgbuild.errors import EnvironmentProblem, ImgbuildError, JobFailed, UsageError
from imgbuild.gpu.allocate import pick_cpus
from imgbuild.hostio.host import Caller, expand, format_cpulist
from imgbuild.servers.admission import built_here, check_preload, check_signed, pull_to_inspect
from imgbuild.servers.caps import cpus_of, run_cpus
from imgbuild.servers.containers import deadline_of
from imgbuild.servers.holds import Held, OverQuota, check_count, choose_gpus, held_on_host
from imgbuild.servers.runwords import RunCall, RunRequest
from imgbuild.servers.spec import (
    JUPYTER_ENV,
    JUPYTER_PORT,
    SHORT_NAME_RE,
    RunSpec,
    free_port,
    gpu_affinity,
    home_of_uid,
    is_recipe,
    jupyter_command,
    jupyter_notes,
    next_name,
    parse_duration,
    published_ports,
    resolve_image,
)
from imgbuild.servers.startfail import DOCKER_START_CODES, explain_start_failure

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.engine.types import ImageEngine
    from imgbuild.gpu.read import Gpu

# --- starting a container -------------------------------------------------------------------------


def read_gpus_or_none(settings: Settings) -> list[Gpu]:
    from imgbuild.gpu.read import NoGpus, read_gpus

    try:
        return read_gpus(settings.gpu_snapshot)
    except NoGpus:
        return []


def _enforce(req: RunRequest, who: Caller, house: RunRules, ref: str) -> tuple[list[Any] | None, str | None]:
    """Enforced mode (a user through sudo): the flags, image and mounts checked as the caller; the workspace
    becomes one of the checked mounts, and the container's working folder. (None, None) where imgbuild runs
    as the user themself or as root."""
    from imgbuild.servers import enforce

    if not enforce.acting_for_user(who):
        return None, None
    enforce.check_run(req, who, house, ref)
    mounts = enforce.check_mounts(list(req.volumes), who, house)
    if req.no_workspace:
        return mounts, None
    try:
        mounts += enforce.check_mounts([f"{Path.cwd()}:{house.workspace}"], who, house)
    except UsageError as exc:
        raise UsageError(f"the current folder as {house.workspace}: {exc} (cd into it, or --no-workspace)") from None
    return mounts, house.workspace


def prepare(
    req: RunRequest,
    settings: Settings,
    held: Held | None = None,
    house: RunRules | None = None,
    gpus: list[Gpu] | None = None,
    resolved: tuple[str, str] | None = None,
) -> RunSpec:
    """The container to start: house rules, the caller's name and IDs, free GPUs (not `held` by anyone),
    a CPU share pinned near them (no engine yet). `gpus`: this host's GPUs where the caller has read them;
    `resolved`: the image and short name, where the caller resolved them once (a waiting run polls)."""
    from imgbuild.hostio.host import host_memory, usable_cpus

    house = house if house is not None else settings.run
    held = held or Held()
    if req.shm_size:  # this run's own /dev/shm instead of the house's IPC rule, checked as the site's is
        try:
            house = replace(house, shm_size=shm_size(req.shm_size))
        except ValueError as exc:
            raise UsageError(f"--shm-size: {exc}") from None
    if req.short is not None and not SHORT_NAME_RE.fullmatch(req.short):
        raise UsageError(f"--name: {req.short[:60]!r} is not a container name (letters, digits, _ . -; at most 64)")
    ref, default_short = resolved or resolve_image(req.image, settings)
    who = settings.caller
    user = who.name  # containers are named and owned by who runs imgbuild, never by --user
    enforced, workdir = _enforce(req, who, house, ref)
    check_count(user, held, house)
    gpus = read_gpus_or_none(settings) if gpus is None else gpus
    selection = choose_gpus(user, req.gpu_request, gpus, held, house, req.force)  # never-startable: refused now
    cpus = cpus_of(req.cpus, run_cpus(len(selection.gpus), os.cpu_count() or 1, len(gpus), house), enforced is not None)
    cpuset: list[int] = []
    if cpus and house.pin_cpus:
        near = sorted({c for g in selection.gpus for c in gpu_affinity(g)})
        cpuset = pick_cpus(math.ceil(cpus), near, usable_cpus(), held.cpus)
    uid, gid = who.uid, who.gid
    if req.as_user:
        if not re.fullmatch(r"[0-9]+(:[0-9]+)?", req.as_user):
            raise UsageError(f"--user: {req.as_user!r} is not UID or UID:GID")
        uid_text, _, gid_text = req.as_user.partition(":")
        uid, gid = int(uid_text), int(gid_text or uid_text)
    command, env, ports, detach = list(req.command), list(req.env), list(req.ports), req.detach
    if not is_recipe(req.image) and not any(item.startswith("HOME=") for item in env):
        # A stock image run as the caller has HOME=/, which is not writable: pip --user, ~/.cache (torch,
        # Hugging Face, Triton) all fail. Their own home where the site mounts it, else a writable one.
        own = home_of_uid(uid)  # the caller's home from the password database: under sudo $HOME is root's
        mounted = [expand(m, user=user, home=own, uid=uid).split(":") for m in house.mounts]
        home = own if any(len(m) > 1 and m[1] == own for m in mounted) else "/tmp/home"
        env = [f"HOME={home}", *env]
    clash = sorted(set(published_ports(ports)) & held.ports)
    if clash:  # a starting run holds it in the ledger (a --jupyter port chosen a moment ago) or a container has it
        raise UsageError(f"-p: host port {clash[0]} is another run's; publish another")
    jupyter_port = None
    if req.jupyter:
        jupyter_port = free_port(held.ports)
        command = command or jupyter_command(None if req.no_workspace else house.workspace)
        env = [*JUPYTER_ENV, f"JUPYTER_TOKEN={secrets.token_hex(24)}", *env]
        ports = [f"127.0.0.1:{jupyter_port}:{JUPYTER_PORT}", *ports]  # this host only: reached by an ssh tunnel
        detach = True
    env_file_text(dict(item.partition("=")[::2] for item in env))  # what the engine cannot carry: refused now
    return RunSpec(
        image=ref,
        short_name=req.short or default_short,
        user=user,
        uid=int(uid),
        gid=int(gid),
        command=command,
        gpus=selection,
        volumes=list(req.volumes),
        env=env,
        ports=ports,
        detach=detach,
        remove=not (req.keep or detach or req.notify),  # a detached job's output must outlive it: `imgbuild logs`
        notify=req.notify,
        interactive=req.interactive and not detach,
        tty=req.terminal and not detach,
        jupyter_port=jupyter_port,
        local_image=is_recipe(req.image) or built_here(ref, {user, str(settings.user or "").lower()}),
        deadline=deadline_of(req.time, house),
        house=house,
        entrypoint=req.entrypoint,
        cpus=cpus,
        cpuset=cpuset,
        memory=house.memory_bytes(host_memory()),
        enforced=enforced,
        workdir=workdir,
        workspace=not req.no_workspace and enforced is None,  # enforced: the workspace is a checked mount
    )


def gpu_path(flag: str, engine: ImageEngine) -> str:
    """How the engine is handed GPUs: the site's `run.gpu_flag` (gpus: --gpus; env: NVIDIA_VISIBLE_DEVICES for the
    nvidia runtime; cdi: --device nvidia.com/gpu=UUID); `gpus` on an engine that has NVIDIA's CDI devices but no
    nvidia runtime becomes `cdi`, as the smoke test's GPU path does (a CDI-only host: the GPU Operator, the
    toolkit in cdi mode), so `run` and the smoke test start containers the same way."""
    if flag != "gpus":
        return flag
    info = engine.host_info()
    cdi = any(str(d).startswith("nvidia.com/gpu") for d in info.get("cdi_devices") or [])
    return "cdi" if cdi and "nvidia" not in (info.get("runtimes") or []) else "gpus"


class WaitTimedOut(JobFailed):
    """`run --wait`: the GPUs did not come free in time (exit 1; the place in the queue is given up)."""


@contextlib.contextmanager
def reserved(
    req: RunRequest,
    settings: Settings,
    engine: ImageEngine,
    wait: float | None = None,
    on_wait: Callable[[int, str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    resolved: tuple[str, str] | None = None,
) -> Iterator[RunSpec]:
    """The container to start, its name, GPUs and CPUs chosen under the host's ledger lock and held there
    until the block ends (by then the container holds them by its name, labels and cpuset).

    `wait` (seconds): while the GPUs are busy, queue for them: only the head of the queue may take GPUs, and
    the queue goes in order of each user's GPU-hours over the site's window (fair share), then first come first
    served. A run held back by its own user's quota waits without a place (it holds nobody back); a run that
    could never start (past a quota, or the host) is refused before it waits. `on_wait(place, why)` is told
    each look; the place is given up on every way out (and, if this process dies, with it). `resolved`: the image
    and short name where the caller resolved them already."""
    from imgbuild.gpu.allocate import GpusBusy
    from imgbuild.servers.ledger import Ledger
    from imgbuild.servers.usage import fair_share

    house = settings.run
    ledger = Ledger(house.ledger_dir)
    ticket = f"wait-{os.getpid()}"
    wants_gpus = req.gpu_request.strip().lower() not in ("", "none")  # the queue is for GPUs only
    deadline = None if wait is None else clock() + wait
    # once (`resolved`: by the caller): a waiting run never re-reads and re-hashes the recipe
    resolved = resolved or resolve_image(req.image, settings)
    use = fair_share(house.ledger_dir, house.fair_share_window) if wants_gpus else {}
    try:
        while True:
            with ledger.transaction() as book:
                queue = [e.name for e in book.queue(use)]
                ahead = (queue.index(ticket) if ticket in queue else len(queue)) if wants_gpus else 0
                why = f"{ahead} ahead of you"
                own_quota = False
                if ahead == 0:
                    rows = engine.containers.rows()
                    book.extended = {k: v for k, v in book.extended.items() if k in {r.id for r in rows}}
                    gpus = read_gpus_or_none(settings)
                    held = held_on_host(rows, book.holds(), gpus)
                    try:
                        spec = prepare(req, settings, held, house, gpus, resolved)
                        spec.gpus_by = gpu_path(house.gpu_flag, engine) if spec.gpus.gpus else ""
                    except GpusBusy as busy:
                        if deadline is None:
                            raise
                        why, own_quota = str(busy), isinstance(busy, OverQuota)
                    else:
                        book.leave(ticket)
                        # Names are handed out here too: two starts at one moment would both take <user>_<name>_1.
                        taken = {r.name for r in rows} | {e.name for e in book.entries}
                        spec.name = next_name(spec.user, spec.short_name, taken)
                        book.add(spec.name, spec.user, spec.gpus.uuids, spec.cpuset, published_ports(spec.ports))
                        break
                if deadline is None:  # runs are queued for GPUs: first come, first served
                    raise GpusBusy(
                        f"{ahead} run(s) wait for GPUs before you (imgbuild run --wait); add --wait to queue"
                    )
                if own_quota:
                    book.leave(ticket)  # its own user's runs hold it back: it holds back nobody else
                    ahead = 0  # it looks again as if at the head: its quota, not a queue, decides
                else:
                    book.enqueue(ticket, settings.caller.name, f"--gpus {req.gpu_request}")
            if clock() >= deadline:
                raise WaitTimedOut(f"gave up waiting after {wait:g} s ({why})")
            if on_wait:
                on_wait(ahead + 1, why)
            sleep(house.wait_poll)
    finally:
        ledger.drop(ticket)
    try:
        yield spec
    finally:
        ledger.drop(spec.name)


def check_mount_sources(spec: RunSpec) -> None:
    """Every host folder the container mounts exists: docker would create a missing one as root, which the
    user then cannot write (a site's `/work/{user}` not made yet)."""
    for mount in [*spec.house.mounts, *spec.volumes]:
        source = expand(mount, user=spec.user, home=home_of_uid(spec.uid), uid=spec.uid).split(":")[0]
        if source.startswith("/") and not os.path.exists(source):
            raise UsageError(
                f"mount {source}: no such folder on this host; docker would create it as root (create it first, "
                "or ask your admin for it)"
            )


@contextlib.contextmanager
def _staged(spec: RunSpec, words: tuple[str, ...]) -> Iterator[None]:
    """Enforced mode: the checked mounts through root's staging binds, for as long as the start needs them; the
    start audited with the run's `words`."""
    if spec.enforced is None:
        yield
        return
    from imgbuild.servers import enforce

    with enforce.staged(spec.enforced) as volumes:
        spec.volumes = volumes
        enforce.audit(
            "run",
            ["run", *words],
            f"allowed: starting {spec.name} ({spec.image})",
            spec.house.ledger_dir,
            spec.user,
            spec.uid,  # as the caller: enforced mode refuses --user
        )
        yield


def start_detached(engine: ImageEngine, spec: RunSpec, words: tuple[str, ...] = ()) -> None:
    """Start the container in the background; `words`: the run's, as asked (the audit log's record)."""
    check_mount_sources(spec)
    with _staged(spec, words):
        code, err = engine.containers.run(spec.options())
    if code != 0:
        if "Conflict" not in err:  # a name taken by another container is never ours to remove
            engine.containers.discard_unstarted(spec.name)
        failure = EnvironmentProblem if "rlimit" in err else ImgbuildError  # the engine's limits: exit 3
        raise failure(explain_start_failure(err))


@dataclass
class RunOutcome:
    code: int
    seconds: float
    rows: list[dict[str, Any]] = field(default_factory=list)  # per GPU: mean/max utilisation and memory
    hint: str = ""
    start_failed: bool = False


def start_attached(engine: ImageEngine, spec: RunSpec, settings: Settings, words: tuple[str, ...] = ()) -> RunOutcome:
    """Run the container in the foreground, sampling its GPUs every 2 s for the job summary; `words`: the run's,
    as asked (the audit log's record)."""
    import subprocess
    import threading
    import time

    from imgbuild.gpu.allocate import Sample, summarize

    samples: list[Sample] = []
    stop = threading.Event()
    wanted = {g.index for g in spec.gpus.gpus}

    def sample() -> None:
        while not stop.wait(2.0):
            try:
                now = [g for g in read_gpus_or_none(settings) if g.index in wanted]
            except (ImgbuildError, OSError, subprocess.SubprocessError):  # a reading lost: the summary has gaps
                now = []
            samples.append(
                Sample(
                    {g.index: g.utilization or 0 for g in now},
                    {g.index: g.memory_used_mib for g in now},
                    engine.containers.cpu_percent(spec.name),
                )
            )

    check_mount_sources(spec)
    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    if wanted:
        sampler.start()
    with _staged(spec, words):
        code, _ = engine.containers.run(spec.options())
    stop.set()
    outcome = RunOutcome(DOCKER_START_CODES.get(code, code), time.monotonic() - started, start_failed=code == 125)
    if code in (125, 126, 127):  # docker's own codes: a container `Created`, never started, is not left behind
        engine.containers.discard_unstarted(spec.name)
    if wanted:
        sampler.join(timeout=5)
        outcome.rows, outcome.hint = summarize(samples, spec.cpus)
    return outcome


# --- `imgbuild run`, top to bottom ----------------------------------------------------------------------------


@dataclass
class Launched:
    """What `imgbuild run` did: its spec, and the outcome of an attached run (None detached, or with --dry-run)."""

    spec: RunSpec
    command_line: str = ""  # --dry-run: the command it would run
    notes: list[str] = field(default_factory=list)  # for the user's terminal (Jupyter's address and token)
    outcome: RunOutcome | None = None


def launch(call: RunCall, settings: Settings, say: Callable[[str], None]) -> Launched:
    """`imgbuild run` as `call` asks: the image checked (only a signed one where the site says so) and resolved once,
    and the spec made under the house rules; with `dry_run` only the command it would run. Else GPUs held in the
    ledger (waiting for them up to `wait`, saying each new place), then started detached or attached. `say`:
    progress for the user (stderr)."""
    import socket

    from imgbuild.engine import connect_engine
    from imgbuild.engine.runargs import run_command_line
    from imgbuild.servers import jupyter

    request, words, wait = call.request, call.words, call.wait
    resolved = resolve_image(check_signed(request.image, settings), settings)  # once, whatever follows
    if call.dry_run:
        spec = prepare(request, settings, resolved=resolved)
        spec.name = next_name(spec.user, spec.short_name, set())
        _say_chosen(spec, say)
        return Launched(spec, command_line=run_command_line(spec.options(), settings.docker_cli or "docker"))
    timeout = parse_duration(wait, "--wait") if wait is not None else None
    engine = connect_engine(settings)
    ref = resolved[0]
    from imgbuild.servers import enforce

    acting = enforce.acting(settings)
    if acting:  # the site's images only: nothing else is pulled as root
        acting.check_image(ref)
    local = is_recipe(request.image) or built_here(ref, {settings.caller.name, str(settings.user or "").lower()})
    if local and engine.images.image(ref) is None:
        raise UsageError(f"{ref}: no such image on this host (build it first: imgbuild build RECIPE)")
    pull_to_inspect(ref, engine, local)
    note = check_preload(ref, engine)
    if note:
        say(note)
    if request.jupyter and not request.command:  # imgbuild's own `jupyter lab`: the image must have it
        jupyter.check_present(engine, ref, settings)
    told: list[tuple[int, str]] = []

    def waiting(place: int, why: str) -> None:
        if not told or told[-1] != (place, why):
            say(f"waiting: place {place} in the queue ({why})")
            told.append((place, why))

    with reserved(request, settings, engine, wait=timeout, on_wait=waiting, resolved=resolved) as spec:
        _say_chosen(spec, say)
        say(f"starting {spec.name} ({spec.image}{_cpu_note(spec)})")
        if not spec.detach:
            return Launched(spec, outcome=start_attached(engine, spec, settings, words))
        start_detached(engine, spec, words)
    if not spec.jupyter_port:
        return Launched(spec)
    jupyter.wait_until_serving(engine, spec.name, spec.jupyter_port, progress=say)  # the address, once it answers
    return Launched(spec, notes=jupyter_notes(spec, socket.getfqdn()))


def _say_chosen(spec: RunSpec, say: Callable[[str], None]) -> None:
    for note in spec.gpus.forced:
        say(f"warning: sharing {note} (--force)")
    if spec.gpus.gpus:
        say(
            "GPUs: "
            + ", ".join(
                f"{g.index} {g.name} ({g.memory_used_mib}/{g.memory_total_mib} MiB, "
                f"{g.utilization if g.utilization is not None else '?'}%)"
                for g in spec.gpus.gpus
            )
        )


def _cpu_note(spec: RunSpec) -> str:
    if not spec.cpus:
        return ""
    pinned = f" on CPUs {format_cpulist(spec.cpuset)}" if spec.cpuset else ""
    return f", {spec.cpus:g} CPUs{pinned}, {spec.threads} threads per process"
