"""Shared GPU servers: run, ps, attach, logs, exec, stop, gpus."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from imgbuild.cli.base import Section, emit_json, settings_of
from imgbuild.errors import UsageError

SECTION = Section("Servers")

if TYPE_CHECKING:
    from imgbuild.servers.run import RunSpec


class _RunCommand(click.Command):
    """`--wait` takes an optional TIMEOUT: a bare `--wait` before the image must not swallow the image."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from imgbuild.config.site import DURATION_RE

        out: list[str] = []
        rest = list(args)
        while rest:
            word = rest.pop(0)
            if word == "--":
                out += [word, *rest]
                break
            if word == "--wait" and not (rest and DURATION_RE.fullmatch(rest[0].strip().lower())):
                word = "--wait=30d"
            out.append(word)
        return super().parse_args(ctx, out)


@SECTION.command(cls=_RunCommand)
@click.argument("image")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--gpus",
    "gpu_request",
    default="none",
    show_default=True,
    help="N least-loaded free GPUs, a list like 0,3, all, or none.",
)
@click.option("--force", is_flag=True, help="Take GPUs other users' processes are on.")
@click.option("--cpus", type=float, help="CPU limit (default: a fair share per GPU, 8-24 each).")
@click.option("-v", "--volume", "volumes", multiple=True, help="Extra mounts, as docker -v.")
@click.option("-e", "--env", "env", multiple=True, help="Environment, as docker -e.")
@click.option("-p", "--publish", "ports", multiple=True, help="Ports, as docker -p.")
@click.option("--name", "short", help="The <name> in <user>_<name>_<n> (default: recipe or image name).")
@click.option("-d", "--detach", is_flag=True, help="Run in the background.")
@click.option("--keep", is_flag=True, help="Keep the container after it exits (no --rm; detached runs always are).")
@click.option("--shm-size", help="Private /dev/shm of this size instead of --ipc host.")
@click.option("--no-workspace", is_flag=True, help="Do not mount the current folder at /workspace.")
@click.option("--user", "as_user", metavar="UID:GID", help="Run as this user instead of yours.")
@click.option("--entrypoint", help="Override the image's entrypoint.")
@click.option(
    "--wait",
    "wait",
    default=None,
    metavar="[TIMEOUT]",
    help="Queue for busy GPUs (first come, first served) instead of refusing; give up after TIMEOUT (e.g. 2h).",
)
@click.option("--time", "walltime", metavar="DURATION", help="Deadline: `imgbuild reap` stops it after this (e.g. 2d).")
@click.option(
    "--notify", is_flag=True, help="When it ends, a line in ~/imgbuild-notices.txt (and the site's notify_command)."
)
@click.option(
    "--jupyter", is_flag=True, help="JupyterLab in the background on a free port of 127.0.0.1; prints the ssh tunnel."
)
@click.option("--dry-run", is_flag=True, help="Print the equivalent docker run line; start nothing.")
@click.pass_context
def run(
    ctx: click.Context,
    image: str,
    command: tuple[str, ...],
    gpu_request: str,
    force: bool,
    cpus: float | None,
    volumes: tuple[str, ...],
    env: tuple[str, ...],
    ports: tuple[str, ...],
    short: str | None,
    detach: bool,
    keep: bool,
    shm_size: str | None,
    no_workspace: bool,
    as_user: str | None,
    entrypoint: str | None,
    wait: str | None,
    walltime: str | None,
    notify: bool,
    jupyter: bool,
    dry_run: bool,
) -> None:
    """Start a container of IMAGE (or of a RECIPE's image) with the shared-server conventions.

    Options go before `--`; the command after it.

    \b
    imgbuild run recipes/pytorch-research.yaml --gpus 2 -- python train.py
    imgbuild run nvcr.io/nvidia/pytorch:24.05-py3 --gpus 0,3 --dry-run
    """
    from imgbuild.engine import Engine
    from imgbuild.servers import run as runmod
    from imgbuild.ui import print_table

    settings = settings_of(ctx)
    request = runmod.RunRequest(
        image=runmod.check_signed(image, settings),
        command=list(command),
        gpu_request=gpu_request,
        force=force,
        cpus=cpus,
        volumes=list(volumes),
        env=list(env),
        ports=list(ports),
        short=short,
        detach=detach,
        keep=keep,
        shm_size=shm_size,
        no_workspace=no_workspace,
        as_user=as_user,
        entrypoint=entrypoint,
        interactive=sys.stdin.isatty(),
        terminal=sys.stdin.isatty() and sys.stdout.isatty(),
        jupyter=jupyter,
        time=walltime,
        notify=notify,
    )
    if dry_run:
        with _queued_busy():  # `queue add` checks a job this way: busy GPUs now are no reason to refuse it
            spec = runmod.prepare(request, settings)
        spec.name = runmod.next_name(spec.user, spec.short_name, set())
        _say_chosen(spec)
        click.echo(spec.command_line(settings.docker_cli or "docker"))
        return
    engine = Engine.connect(settings.docker_cli)
    _note(runmod.check_preload(runmod.resolve_image(request.image, settings)[0], engine))
    told: list[tuple[int, str]] = []

    def waiting(place: int, why: str) -> None:
        if not told or told[-1] != (place, why):
            click.echo(f"waiting: place {place} in the queue ({why})", err=True)
            told.append((place, why))

    timeout = runmod.parse_duration(wait, "--wait") if wait is not None else None
    with _queued_busy(), runmod.reserved(request, settings, engine, wait=timeout, on_wait=waiting) as spec:
        _say_chosen(spec)
        click.echo(f"starting {spec.name} ({spec.image}{_cpu_note(spec)})", err=True)
        if spec.detach:
            runmod.start_detached(engine, spec)
            if spec.jupyter_port:
                import socket

                for line in runmod.jupyter_notes(spec, socket.getfqdn()):
                    click.echo(line)
            return
        outcome = runmod.start_attached(engine, spec, settings)
    if outcome.start_failed:
        click.echo(
            f"imgbuild: docker could not start the container; if it said 'error setting rlimit', {runmod.RLIMIT_HINT}",
            err=True,
        )
    if outcome.rows:
        print_table(
            ["GPU", "util mean %", "util max %", "mem mean MiB", "mem max MiB"],
            [[r["gpu"], r["util_mean"], r["util_max"], r["mem_mean_mib"], r["mem_max_mib"]] for r in outcome.rows],
            title=f"{spec.name}: {outcome.seconds:.0f} s",
        )
    if outcome.hint:
        click.echo(f"hint: {outcome.hint}", err=True)
    sys.exit(outcome.code)


@contextlib.contextmanager
def _queued_busy() -> Iterator[None]:
    """A queued job's start (`imgbuild queue`): busy GPUs exit 75 (it stays queued), not 2 (it failed)."""
    import os

    from imgbuild.gpu.allocate import GpusBusy

    try:
        yield
    except GpusBusy as busy:
        if os.environ.get("IMGBUILD_QUEUE_JOB") != "1":
            raise
        click.echo(f"imgbuild: {busy}", err=True)
        sys.exit(75)


def _say_chosen(spec: RunSpec) -> None:
    for note in spec.gpus.forced:
        click.echo(f"warning: sharing {note} (--force)", err=True)
    if spec.gpus.gpus:
        click.echo(
            "GPUs: "
            + ", ".join(
                f"{g.index} {g.name} ({g.memory_used_mib}/{g.memory_total_mib} MiB, "
                f"{g.utilization if g.utilization is not None else '?'}%)"
                for g in spec.gpus.gpus
            ),
            err=True,
        )


def _cpu_note(spec: RunSpec) -> str:
    from imgbuild.host import format_cpulist

    if not spec.cpus:
        return ""
    pinned = f" on CPUs {format_cpulist(spec.cpuset)}" if spec.cpuset else ""
    return f", {spec.cpus:g} CPUs{pinned}, {spec.threads} threads per process"


@SECTION.command()
@click.option("--all", "all_users", is_flag=True, help="Every user's containers.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
@click.pass_context
def ps(ctx: click.Context, all_users: bool, as_json: bool) -> None:
    """Your containers (or --all users'), with their GPUs, CPU limits and deadlines."""
    from imgbuild.engine import Engine
    from imgbuild.host import caller
    from imgbuild.servers.run import container_view
    from imgbuild.ui import print_table

    settings = settings_of(ctx)
    who = caller()
    engine = Engine.connect(settings.docker_cli)
    rows = [r for r in container_view(engine, settings) if all_users or r["user"] == who.name]
    if as_json:
        emit_json(rows)
        return
    print_table(
        ["name", "user", "image", "status", "GPUs", "CPUs", "created", "time left"],
        [
            [r["name"], r["user"], r["image"], r["status"], r["gpus"], r["cpus"] or "", r["created"], r["time_left"]]
            for r in rows
        ],
    )
    for r in rows:
        if r.get("gpus_lost"):
            click.echo(f"{r['name']}: {r['gpus_lost']}", err=True)


def _on_container(
    ctx: click.Context,
    verb: str,
    name: str,
    flags: list[str] | None = None,
    args: tuple[str, ...] = (),
    force: bool = False,
) -> None:
    """`docker VERB [flags] CONTAINER [args]` on one of your containers, found by its short name."""
    from imgbuild.engine import Engine
    from imgbuild.host import caller
    from imgbuild.servers.run import check_owner, find_container

    settings = settings_of(ctx)
    engine = Engine.connect(settings.docker_cli)
    who = caller()
    row = find_container(engine.containers.rows(), name, who.name)
    check_owner(row, who, verb, force)
    engine.containers.exec_cli([verb, *(flags or []), row["name"], *args])


_FORCE = click.option("--force", is_flag=True, help="Root only: act on another user's container.")


@SECTION.command()
@click.argument("name")
@_FORCE
@click.pass_context
def attach(ctx: click.Context, name: str, force: bool) -> None:
    """Attach to one of your containers (detach with Ctrl-P Ctrl-Q)."""
    _on_container(ctx, "attach", name, force=force)


@SECTION.command()
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output.")
@click.option("--tail", default="all", show_default=True, help="Lines from the end.")
@_FORCE
@click.pass_context
def logs(ctx: click.Context, name: str, follow: bool, tail: str, force: bool) -> None:
    """Print a container's output."""
    if not re.fullmatch(r"all|[0-9]{1,9}", tail):
        raise UsageError(f"--tail: {tail!r} is not a number of lines or 'all'")
    _on_container(ctx, "logs", name, ["--tail", tail, *(["-f"] if follow else [])], force=force)


@SECTION.command(name="exec")
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_FORCE
@click.pass_context
def exec_(ctx: click.Context, name: str, command: tuple[str, ...], force: bool) -> None:
    """Run a command in one of your running containers: imgbuild exec NAME -- COMMAND..."""
    _on_container(ctx, "exec", name, ["-it"] if sys.stdin.isatty() else ["-i"], command, force=force)


@SECTION.command()
@click.argument("name")
@click.option("--rm", "remove", is_flag=True, help="Remove it too (detached runs keep their container).")
@_FORCE
@click.pass_context
def stop(ctx: click.Context, name: str, remove: bool, force: bool) -> None:
    """Stop one of your containers (--rm: and remove it)."""
    if remove:
        _on_container(ctx, "rm", name, ["-f"], force=force)
    else:
        _on_container(ctx, "stop", name, force=force)


@SECTION.command()
@click.option("--dry-run", is_flag=True, help="List what it would do; do nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable actions.")
@click.pass_context
def reap(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Enforce the house rules (for admins, from cron or a systemd timer): warn, then stop containers past
    their deadline or idle too long; remove old exited ones where the site asks (config `reap:`)."""
    import time

    from imgbuild.config.site import house_rules
    from imgbuild.engine import Engine
    from imgbuild.servers import reap as reaper
    from imgbuild.servers.run import read_gpus_or_none
    from imgbuild.ui import print_table

    settings = settings_of(ctx)
    house, rules = house_rules(settings.run), reaper.policy(settings.reap)
    engine = Engine.connect(settings.docker_cli)
    report = reaper.reap(engine, read_gpus_or_none(settings), house, rules, time.time(), dry_run=dry_run)
    if not dry_run:  # the queue advances on every reaper run: no daemon needed
        from imgbuild.host import caller
        from imgbuild.servers import queue as jobs
        from imgbuild.servers.ledger import DEFAULT_STATE_DIR

        _say_tried(jobs.advance(Path(house["state_dir"] or DEFAULT_STATE_DIR), caller()))
    rows = [{**a.__dict__, "outcome": o} for a, o in zip(report.actions, report.outcomes, strict=True)]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("nothing to do")
        return
    print_table(
        ["action", "container", "user", "rule", "why", "outcome"],
        [[r["verb"], r["name"], r["user"], r["rule"], r["reason"], r["outcome"]] for r in rows],
    )


@SECTION.command()
@click.option("--since", metavar="DURATION", help="Only the last DURATION (30d, 12h); default: all of the log.")
@click.option("--by", type=click.Choice(["user", "group", "gpu"]), default="user", show_default=True)
@click.option("--prometheus", type=click.Path(dir_okay=False, path_type=Path), help="Also write a textfile for "
              "node_exporter's textfile collector (per-user and per-GPU gauges).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.pass_context
def usage(ctx: click.Context, since: str | None, by: str, prometheus: Path | None, as_json: bool) -> None:
    """GPU-hours held and used per user, group or GPU, from what `imgbuild reap` recorded on each run."""
    import time

    from imgbuild.config.site import house_rules
    from imgbuild.servers import usage as accounting
    from imgbuild.ui import print_table

    settings = settings_of(ctx)
    now = time.time()
    found = accounting.account(house_rules(settings.run)["state_dir"], by, since, now)
    if prometheus:
        accounting.write_textfile(prometheus, accounting.prometheus(found.by_user, found.by_gpu, found.since, now))
    if as_json:
        emit_json([r.to_json() for r in found.rows])
        return
    if not found.rows:
        click.echo(f"no GPU use recorded ({found.records} reaper runs read)")
        return
    print_table(
        [by, "GPU-h held", "GPU-h used", "mean util", "containers"],
        [
            [
                r.key,
                f"{r.held_hours:.2f}",
                f"{r.used_hours:.2f}",
                "n/a" if r.mean_util is None else f"{r.mean_util:.0f}%",
                str(len(r.containers)),
            ]
            for r in found.rows
        ],  # fmt: skip
        title=f"GPU usage per {by}" + (f" since {since}" if since else "") + f" ({found.records} reaper runs)",
    )


@SECTION.command()
@click.argument("name")
@click.argument("duration")
@_FORCE
@click.pass_context
def extend(ctx: click.Context, name: str, duration: str, force: bool) -> None:
    """Move one of your containers' deadline: imgbuild extend NAME 1d (within the site's run.max_time)."""
    import time

    from imgbuild.config.site import house_rules
    from imgbuild.engine import Engine
    from imgbuild.host import caller
    from imgbuild.servers.run import check_owner, find_container, human_duration
    from imgbuild.servers.run import extend as extend_deadline

    settings = settings_of(ctx)
    who = caller()
    row = find_container(Engine.connect(settings.docker_cli).containers.rows(), name, who.name)
    check_owner(row, who, "extend", force)
    deadline = extend_deadline(row, duration, house_rules(settings.run))
    click.echo(
        f"{row['name']}: deadline {time.strftime('%Y-%m-%d %H:%M', time.localtime(deadline))} "
        f"(in {human_duration(deadline - time.time())})"
    )


@SECTION.command()
@click.argument("name")
@_FORCE
@click.pass_context
def shell(ctx: click.Context, name: str, force: bool) -> None:
    """Another shell in one of your running containers, as you (bash, else sh)."""
    _on_container(
        ctx, "exec", name, ["-it"] if sys.stdin.isatty() else ["-i"],
        ("sh", "-c", "command -v bash >/dev/null && exec bash -l || exec sh -l"), force=force,
    )  # fmt: skip


@SECTION.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable readings.")
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds between refreshes.")
@click.option("--count", type=click.IntRange(min=1), help="With --watch: stop after N readings.")
@click.pass_context
def gpus(ctx: click.Context, as_json: bool, watch: bool, interval: float, count: int | None) -> None:
    """GPUs: memory, utilisation, and who runs what on each (NVML, or nvidia-smi)."""
    import functools
    import time

    from imgbuild.engine import Engine
    from imgbuild.errors import ImgbuildError
    from imgbuild.gpu.read import NoGpus, read_gpus
    from imgbuild.servers.run import lost_containers
    from imgbuild.ui import print_table

    settings = settings_of(ctx)

    @functools.cache
    def engine() -> Engine | None:
        """Connected once, at the first reading: containers whose GPUs vanished are flagged where it answers."""
        try:
            return Engine.connect(settings.docker_cli)
        except ImgbuildError:
            return None

    shown = 0
    while True:
        try:
            readings = read_gpus(settings.gpu_snapshot)
        except NoGpus as exc:
            click.echo(f"no NVIDIA GPU or driver on this host ({exc}); imgbuild run uses the CPU")
            return
        connected = engine()
        try:
            lost = lost_containers(connected) if connected else []
        except ImgbuildError:
            lost = []
        if as_json:
            emit_json({"gpus": [g.to_json() for g in readings], "lost": lost})
        else:
            rows = []
            for g in readings:
                procs = (
                    "; ".join(f"{p.user or '?'} {p.container or p.name or p.pid} {p.used_mib} MiB" for p in g.processes)
                    or "-"
                )
                util = "?" if g.utilization is None else f"{g.utilization}%"
                rows.append([g.index, g.name, f"{g.memory_used_mib}/{g.memory_total_mib} MiB", util, procs])
            print_table(
                ["GPU", "name", "memory", "util", "processes (user container memory)"],
                rows,
                title=time.strftime("%H:%M:%S") if watch else None,
            )
            for item in lost:
                click.echo(f"{item['name']}: {item['fix']}", err=True)
        shown += 1
        if not watch or (count and shown >= count):
            return
        time.sleep(interval)


@SECTION.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable lines.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """This host as a lab admin needs to see it: the driver, the NVIDIA Container Toolkit (and its known container
    escapes), the engine's default runtime, CDI, GPUs and MIG, memlock, cgroups, who is in the docker group.
    Each line ok, warn or fail with its fix; exit 1 when one fails. Changes nothing."""
    from imgbuild.engine import Engine
    from imgbuild.errors import EXIT_FAILED, ImgbuildError
    from imgbuild.servers import doctor as doc
    from imgbuild.ui import print_table

    settings = settings_of(ctx)
    try:
        engine: Any = Engine.connect(settings.docker_cli)
    except ImgbuildError as exc:
        engine = _Unreachable(str(exc))
    lines = doc.judge(doc.collect(settings, engine))
    if as_json:
        emit_json({"lines": [line.to_json() for line in lines]})
    else:
        print_table(
            ["check", "status", "detail", "fix"],
            [[line.check, line.status.upper(), line.detail, line.fix] for line in lines],
            title="imgbuild doctor",
        )
    if any(line.status == "fail" for line in lines):
        raise SystemExit(EXIT_FAILED)


class _Unreachable:
    """An engine that did not answer, for doctor's one line about it."""

    def __init__(self, why: str) -> None:
        self.why = why

    def host_info(self) -> dict[str, Any]:
        return {"error": self.why}


def _note(text: str) -> None:
    """A note for the user on stderr, when there is one."""
    if text:
        click.echo(text, err=True)


@SECTION.group()
def admin() -> None:
    """For the admin of a shared GPU server."""


@admin.command()
@click.option("--binary", metavar="PATH", help="imgbuild's absolute path (default: the one running now).")
def sudoers(binary: str | None) -> None:
    """Print the sudoers drop-in for enforced mode: users run imgbuild's user commands as root, nothing else."""
    import os
    import shutil

    from imgbuild.servers.enforce import sudoers as drop_in

    found = binary or shutil.which("imgbuild") or os.path.abspath(sys.argv[0])
    click.echo(drop_in(found), nl=False)


@SECTION.group()
def queue() -> None:
    """A batch queue: jobs that start like `run -d` when their GPUs are free, in turn across users."""


def _queue_dir(ctx: click.Context) -> Path:
    from imgbuild.config.site import house_rules
    from imgbuild.servers.ledger import DEFAULT_STATE_DIR

    return Path(house_rules(settings_of(ctx).run)["state_dir"] or DEFAULT_STATE_DIR)


def _say_tried(tried: list[Any]) -> None:
    for job in tried:
        what = f"started {job.container}" if job.state == "started" else f"failed: {job.detail}"
        click.echo(f"job {job.id} ({job.user}): {what}", err=True)


@queue.command(name="add", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_context
def queue_add(ctx: click.Context, args: tuple[str, ...]) -> None:
    """File a job: `imgbuild queue add --gpus 2 IMAGE -- python train.py` (run's options; it starts detached)."""
    import os

    from imgbuild.host import caller
    from imgbuild.servers import queue as jobs

    state = _queue_dir(ctx)
    job = jobs.add(state, caller(), list(args), os.getcwd())
    click.echo(job.id)
    _say_tried(jobs.advance(state, caller()))


@queue.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@click.pass_context
def queue_ls(ctx: click.Context, as_json: bool) -> None:
    """Every user's jobs: waiting, started and failed."""
    import time
    from dataclasses import asdict

    from imgbuild.servers import queue as jobs
    from imgbuild.ui import print_table

    found = jobs.Queue(_queue_dir(ctx)).load().jobs
    if as_json:
        emit_json([asdict(j) for j in sorted(found, key=lambda j: j.submitted)])
        return
    if not found:
        click.echo("the queue is empty")
        return
    place = {j.id: n for n, j in enumerate(jobs.order(found), 1)}
    print_table(
        ["id", "user", "state", "place", "submitted", "container / why", "command"],
        [
            [
                j.id,
                j.user,
                j.state,
                str(place.get(j.id, "")),
                time.strftime("%m-%d %H:%M", time.localtime(j.submitted)),
                j.container or j.detail,
                " ".join(j.args)[:80],
            ]
            for j in sorted(found, key=lambda j: j.submitted)
        ],  # fmt: skip
        title="imgbuild queue" + (" (drained: nothing starts)" if jobs.drained(_queue_dir(ctx)) else ""),
    )


@queue.command(name="rm")
@click.argument("job_id")
@click.pass_context
def queue_rm(ctx: click.Context, job_id: str) -> None:
    """Take one of your waiting (or ended) jobs out of the queue."""
    from imgbuild.host import caller
    from imgbuild.servers import queue as jobs

    job = jobs.remove(_queue_dir(ctx), caller(), job_id)
    click.echo(f"removed job {job.id}", err=True)


@queue.command(name="run")
@click.pass_context
def queue_run(ctx: click.Context) -> None:
    """Start what fits now (root: every user's jobs; a user: their own). `imgbuild reap` does this on each run."""
    from imgbuild.host import caller
    from imgbuild.servers import queue as jobs

    tried = jobs.advance(_queue_dir(ctx), caller())
    _say_tried(tried)
    if not tried:
        click.echo("nothing started", err=True)


@queue.command(name="drain")
@click.pass_context
def queue_drain(ctx: click.Context) -> None:
    """Root: jobs that run finish, no job starts (before maintenance)."""
    _set_drained(ctx, True, "drained: no queued job starts until `imgbuild queue resume`")


@queue.command(name="resume")
@click.pass_context
def queue_resume(ctx: click.Context) -> None:
    """Root: queued jobs start again."""
    _set_drained(ctx, False, "resumed")


def _set_drained(ctx: click.Context, on: bool, said: str) -> None:
    from imgbuild.host import caller
    from imgbuild.servers import queue as jobs

    if not caller().is_admin:
        raise UsageError(f"queue {'drain' if on else 'resume'}: the admin's (root)")
    jobs.set_drained(_queue_dir(ctx), on)
    click.echo(said, err=True)
