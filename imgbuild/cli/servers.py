"""Shared GPU servers, for their users: run, ps, attach, logs, exec, stop, extend, shell, gpus."""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

import click

from imgbuild.cli.base import Section, emit_json, settings_of
from imgbuild.errors import UsageError
from imgbuild.servers.runwords import RunCall, RunCommand, grammar

SECTION = Section("Servers")

if TYPE_CHECKING:
    from imgbuild.engine import ImageEngine
    from imgbuild.gpu.read import Gpu


@SECTION.command(cls=RunCommand)
@grammar
def run(call: RunCall) -> None:
    """Start a container of IMAGE (or of a RECIPE's image) with the shared-server conventions.

    Options go before `--`; the command after it.

    \b
    imgbuild run recipes/pytorch-research.yaml --gpus 2 -- python train.py
    imgbuild run nvcr.io/nvidia/pytorch:24.05-py3 --gpus 0,3 --dry-run
    """
    from imgbuild.servers.run import launch
    from imgbuild.servers.startfail import rlimit_cure
    from imgbuild.ui import print_table, say

    done = launch(call, settings_of(click.get_current_context()), say=say)
    if done.command_line:  # --dry-run
        click.echo(done.command_line)
        return
    for line in done.notes:
        click.echo(line)
    if done.outcome is None:  # detached
        return
    outcome = done.outcome
    if outcome.start_failed:
        click.echo(
            "imgbuild: docker could not start the container; if it said 'error setting rlimit', " + rlimit_cure(),
            err=True,
        )
    if outcome.rows:
        print_table(
            ["GPU", "util mean %", "util max %", "mem mean MiB", "mem max MiB"],
            [[r["gpu"], r["util_mean"], r["util_max"], r["mem_mean_mib"], r["mem_max_mib"]] for r in outcome.rows],
            title=f"{done.spec.name}: {outcome.seconds:.0f} s",
        )
    if outcome.hint:
        click.echo(f"hint: {outcome.hint}", err=True)
    sys.exit(outcome.code)


@SECTION.command()
@click.option("--all", "all_users", is_flag=True, help="Every user's containers.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
@click.pass_context
def ps(ctx: click.Context, all_users: bool, as_json: bool) -> None:
    """Your containers (or --all users'), with their GPUs, CPU limits and deadlines."""
    from imgbuild.engine import connect_engine
    from imgbuild.servers.containers import container_view
    from imgbuild.ui import print_table

    settings = settings_of(ctx)
    engine = connect_engine(settings)
    rows = container_view(engine, settings, all_users=all_users)
    if as_json:
        emit_json(rows)
        return
    print_table(
        ["name", "user", "image", "status", "GPUs", "CPUs", "memory", "pids", "created", "time left"],
        [
            [
                r["name"],
                r["user"],
                r["image"],
                r["status"],
                r["gpus"],
                r["cpus"] or "",
                _gib(r["memory"]),
                str(r["pids_limit"] or ""),
                r["created"],
                r["time_left"],
            ]
            for r in rows
        ],  # fmt: skip
    )
    for r in rows:
        if r.get("gpus_lost"):
            click.echo(f"{r['name']}: {r['gpus_lost']}", err=True)


def _gib(size: int | None) -> str:
    return f"{size / 2**30:.1f}G" if size else ""


def _on_container(ctx: click.Context, verb: str, name: str, force: bool) -> tuple[ImageEngine, str]:
    """(the engine, the container's full name) for one of your containers, found by its short name; another user's
    only for root with --force."""
    from imgbuild.engine import connect_engine
    from imgbuild.servers.containers import check_owner, find_container

    settings = settings_of(ctx)
    engine, who = connect_engine(settings), settings.caller
    row = find_container(engine.containers.rows(), name, who.name)
    check_owner(row, who, verb, force)
    return engine, row.name


_FORCE = click.option("--force", is_flag=True, help="Root only: act on another user's container.")


@SECTION.command()
@click.argument("name")
@_FORCE
@click.pass_context
def attach(ctx: click.Context, name: str, force: bool) -> None:
    """Attach to one of your containers (detach with Ctrl-P Ctrl-Q)."""
    engine, full = _on_container(ctx, "attach", name, force)
    engine.containers.attach(full)


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
    engine, full = _on_container(ctx, "logs", name, force)
    engine.containers.logs(full, tail, follow)


@SECTION.command(name="exec")
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_FORCE
@click.pass_context
def exec_(ctx: click.Context, name: str, command: tuple[str, ...], force: bool) -> None:
    """Run a command in one of your running containers: imgbuild exec NAME -- COMMAND..."""
    engine, full = _on_container(ctx, "exec", name, force)
    engine.containers.exec_in(full, command, sys.stdin.isatty())


@SECTION.command()
@click.argument("name")
@click.option("--rm", "remove", is_flag=True, help="Remove it too (detached runs keep their container).")
@_FORCE
@click.pass_context
def stop(ctx: click.Context, name: str, remove: bool, force: bool) -> None:
    """Stop one of your containers (--rm: and remove it)."""
    engine, full = _on_container(ctx, "rm" if remove else "stop", name, force)
    if remove:
        engine.containers.remove(full)  # killed and removed at once, as `docker rm -f` does
    else:
        engine.containers.stop(full)
    click.echo(full)


@SECTION.command()
@click.argument("name")
@click.argument("duration")
@_FORCE
@click.pass_context
def extend(ctx: click.Context, name: str, duration: str, force: bool) -> None:
    """Move one of your containers' deadline: imgbuild extend NAME 1d (within the site's run.max_time)."""
    import time

    from imgbuild.engine import connect_engine
    from imgbuild.servers.containers import check_owner, find_container, human_duration
    from imgbuild.servers.containers import extend as extend_deadline

    settings = settings_of(ctx)
    who = settings.caller
    row = find_container(connect_engine(settings).containers.rows(), name, who.name)
    check_owner(row, who, "extend", force)
    deadline = extend_deadline(row, duration, settings.run)
    click.echo(
        f"{row.name}: deadline {time.strftime('%Y-%m-%d %H:%M', time.localtime(deadline))} "
        f"(in {human_duration(deadline - time.time())})"
    )


@SECTION.command()
@click.argument("name")
@_FORCE
@click.pass_context
def shell(ctx: click.Context, name: str, force: bool) -> None:
    """Another shell in one of your running containers, as you (bash, else sh)."""
    engine, full = _on_container(ctx, "exec", name, force)
    engine.containers.exec_in(
        full, ("sh", "-c", "command -v bash >/dev/null && exec bash -l || exec sh -l"), sys.stdin.isatty()
    )


@SECTION.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable readings.")
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="Seconds between refreshes."
)
@click.option("--count", type=click.IntRange(min=1), help="With --watch: stop after N readings.")
@click.pass_context
def gpus(ctx: click.Context, as_json: bool, watch: bool, interval: float, count: int | None) -> None:
    """GPUs: memory, utilisation, and who runs what on each (NVML, or nvidia-smi)."""
    import time
    from dataclasses import asdict

    from imgbuild.gpu.read import NoGpus, read_pci
    from imgbuild.servers.containers import watch_gpus

    settings = settings_of(ctx)
    readings_of = watch_gpus(settings, interval if watch else None, count)
    bus = [asdict(p) for p in read_pci(settings.gpu_snapshot)] if as_json else []  # a snapshot records the bus too
    try:
        for readings, lost in readings_of:
            title = time.strftime("%H:%M:%S") if watch else None
            _show_gpus(readings, lost, as_json, title, bus)
    except NoGpus as exc:
        click.echo(f"no NVIDIA GPU or driver on this host ({exc}); imgbuild run uses the CPU")


def _show_gpus(
    readings: list[Gpu], lost: list[dict[str, str]], as_json: bool, title: str | None, bus: list[dict[str, str]]
) -> None:
    from imgbuild.ui import print_table

    if as_json:
        emit_json({"gpus": [g.to_json() for g in readings], "lost": lost, "pci": bus})
        return
    rows = []
    for g in readings:
        procs = "; ".join(f"{p.user or '?'} {p.container or p.name or p.pid} {p.used_mib} MiB" for p in g.processes)
        util = "?" if g.utilization is None else f"{g.utilization}%"
        rows.append([g.index, g.name, f"{g.memory_used_mib}/{g.memory_total_mib} MiB", util, procs or "-"])
    print_table(["GPU", "name", "memory", "util", "processes (user container memory)"], rows, title=title)
    for item in lost:
        click.echo(f"{item['name']}: {item['fix']}", err=True)
