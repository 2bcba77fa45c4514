"""For the admin of a shared GPU server: the host's health (doctor), the reaper, usage accounting, enforced mode."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from imgbuild.cli.base import Section, emit_json, settings_of
from imgbuild.cli.queue import say_tried

SECTION = Section("Server admin")


@SECTION.command()
@click.option("--dry-run", is_flag=True, help="List what it would do; do nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable actions.")
@click.pass_context
def reap(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Enforce the house rules (for admins, from cron or a systemd timer): warn, then stop containers past
    their deadline or idle too long; remove old exited ones where the site asks (config `reap:`)."""
    import time

    from imgbuild.engine import connect_engine
    from imgbuild.servers import reap as reaper
    from imgbuild.servers.run import read_gpus_or_none
    from imgbuild.ui import print_table

    settings = settings_of(ctx)
    engine = connect_engine(settings)
    report = reaper.reap(engine, read_gpus_or_none(settings), settings.run, settings.reap, time.time(), dry_run=dry_run)
    if not dry_run:  # the queue advances on every reaper run: no daemon needed
        from imgbuild.servers import queue as jobs

        say_tried(jobs.advance(settings.run.ledger_dir, settings.caller))
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

    from imgbuild.servers import usage as accounting
    from imgbuild.ui import print_table

    settings = settings_of(ctx)
    now = time.time()
    found = accounting.account(settings.run.ledger_dir, by, since, now)
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
@click.option("--json", "as_json", is_flag=True, help="Machine-readable lines.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """This host as a lab admin needs to see it: the driver, the NVIDIA Container Toolkit (and its known container
    escapes), the engine's default runtime, CDI, GPUs and MIG, memlock, cgroups, who is in the docker group.
    Each line ok, warn or fail with its fix; exit 1 when one fails. Changes nothing."""
    from imgbuild.engine import connect_engine
    from imgbuild.errors import EXIT_FAILED, ImgbuildError
    from imgbuild.servers import doctor as doc
    from imgbuild.ui import print_table

    settings = settings_of(ctx)
    try:
        engine_info = connect_engine(settings).host_info()
    except ImgbuildError as exc:
        engine_info = {"error": str(exc)}  # doctor's one line about an engine that did not answer
    lines = doc.judge(doc.collect(settings, engine_info))
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
