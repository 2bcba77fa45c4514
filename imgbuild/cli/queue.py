"""The batch queue: jobs that start like `run -d` when their GPUs are free, in order, fairly across users."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from imgbuild.cli.base import Section, emit_json, settings_of, who_of
from imgbuild.errors import UsageError

SECTION = Section("Batch queue")


@SECTION.group()
def queue() -> None:
    """A batch queue: jobs that start like `run -d` when their GPUs are free, in turn across users."""


def _queue_dir(ctx: click.Context) -> Path:
    return settings_of(ctx).run.ledger_dir


def _use(ctx: click.Context) -> dict[str, float]:
    """Each user's GPU-hours of late: the queue's order (fair share)."""
    from imgbuild.servers.usage import fair_share

    house = settings_of(ctx).run
    return fair_share(house.ledger_dir, house.fair_share_window)


def say_tried(tried: list[Any]) -> None:
    for job in tried:
        what = f"started {job.container}" if job.state == "started" else f"failed: {job.detail}"
        click.echo(f"job {job.id} ({job.user}): {what}", err=True)


@queue.command(name="add", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, required=True)
@click.pass_context
def queue_add(ctx: click.Context, args: tuple[str, ...]) -> None:
    """File a job: `imgbuild queue add --gpus 2 IMAGE -- python train.py` (run's options; it starts detached)."""
    import os

    from imgbuild.servers import queue as jobs

    state = _queue_dir(ctx)
    job = jobs.add(state, who_of(ctx), list(args), os.getcwd())
    click.echo(job.id)
    say_tried(jobs.advance(state, who_of(ctx), use=_use(ctx)))


@queue.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@click.pass_context
def queue_ls(ctx: click.Context, as_json: bool) -> None:
    """The jobs: waiting, started and failed; others' only by id, user, state and place (a variable's value is
    never shown, only its name). `--json`: your own jobs (root's: everyone's)."""
    import time

    from imgbuild.servers import queue as jobs
    from imgbuild.ui import print_table

    found = jobs.Queue(_queue_dir(ctx)).load().jobs
    who = who_of(ctx)
    if as_json:
        emit_json([jobs.shown(j) for j in sorted(found, key=lambda j: j.submitted) if jobs.is_theirs(j, who)])
        return
    if not found:
        click.echo("the queue is empty")
        return
    place = {j.id: n for n, j in enumerate(jobs.order(found, use=_use(ctx)), 1)}
    print_table(
        ["id", "user", "state", "place", "submitted", "container / why", "command"],
        [
            [
                j.id,
                j.user,
                j.state,
                str(place.get(j.id, "")),
                time.strftime("%m-%d %H:%M", time.localtime(j.submitted)),
                (j.container or j.detail) if jobs.is_theirs(j, who) else "",
                " ".join(jobs.shown_args(j.args))[:80] if jobs.is_theirs(j, who) else "",
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
    from imgbuild.servers import queue as jobs

    job = jobs.remove(_queue_dir(ctx), who_of(ctx), job_id)
    click.echo(f"removed job {job.id}", err=True)


@queue.command(name="run")
@click.pass_context
def queue_run(ctx: click.Context) -> None:
    """Start what fits now (root: every user's jobs; a user: their own). `imgbuild reap` does this on each run."""
    from imgbuild.servers import queue as jobs

    tried = jobs.advance(_queue_dir(ctx), who_of(ctx), use=_use(ctx))
    say_tried(tried)
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
    from imgbuild.servers import queue as jobs

    if not who_of(ctx).is_admin:
        raise UsageError(f"queue {'drain' if on else 'resume'}: the admin's (root)")
    jobs.set_drained(_queue_dir(ctx), on)
    click.echo(said, err=True)
