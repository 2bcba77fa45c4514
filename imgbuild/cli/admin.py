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
        from imgbuild.servers.usage import fair_share

        house = settings.run
        say_tried(
            jobs.advance(house.ledger_dir, settings.caller, use=fair_share(house.ledger_dir, house.fair_share_window))
        )
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
@click.option("--disk", is_flag=True, help="Instead: each user's images (<user>/...) on the engine's disk.")
@click.pass_context
def usage(ctx: click.Context, since: str | None, by: str, prometheus: Path | None, as_json: bool, disk: bool) -> None:
    """GPU-hours held and used per user, group or GPU, from what `imgbuild reap` recorded on each run; `--disk`:
    each user's image bytes."""
    import time

    from imgbuild.servers import usage as accounting
    from imgbuild.ui import print_table

    settings = settings_of(ctx)
    if disk:
        from imgbuild.engine import connect_engine
        from imgbuild.servers.reap import known_user

        rows = accounting.disk_use(connect_engine(settings).images.local_images(), known_user)
        if as_json:
            emit_json([r.to_json() for r in rows])
        elif not rows:
            click.echo("no user's images on this engine")
        else:
            table = [[r.user, str(r.images), str(r.tags), f"{r.size / 1e9:.2f}"] for r in rows]
            title = "users' images on the engine's disk (layers two images share counted in each)"
            print_table(["user", "images", "tags", "GB"], table, title=title)
        return
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
    from imgbuild.config.settings import config_files
    from imgbuild.servers import setup as set_up

    layout = set_up.Layout.of(settings.run.ledger_dir, config_files()[0], installed_binary(None))
    lines = doc.judge(doc.collect(settings, engine_info)) + set_up.judge(set_up.collect(layout))
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


def installed_binary(given: str | None) -> str:
    """imgbuild's absolute path as the drop-in and the reaper's service name it: `--binary`, else the one on PATH
    (or running now), its links resolved (one path, whichever link the admin typed)."""
    import os
    import shutil

    return given or os.path.realpath(shutil.which("imgbuild") or sys.argv[0])


@admin.command()
@click.option("--binary", metavar="PATH", help="imgbuild's absolute path (default: the one on PATH, links resolved).")
@click.option("--root", "root", type=click.Path(file_okay=False, path_type=Path), help="Make it all under this folder.")
@click.option("--dry-run", is_flag=True, help="Say what it would do; change nothing.")
@click.option("--print", "show", is_flag=True, help="Print each file as setup writes it; change nothing.")
@click.pass_context
def setup(ctx: click.Context, binary: str | None, root: Path | None, dry_run: bool, show: bool) -> None:
    """Set this server up as the docs describe: the state folder (root's, 1777), a minimal enforced-mode site
    config, the sudoers drop-in and the reaper's systemd timer. Run it again at will: it changes only its own
    unedited files, and keeps what an admin edited."""
    from imgbuild.config.settings import config_files
    from imgbuild.servers import setup as set_up

    layout = set_up.Layout.of(settings_of(ctx).run.ledger_dir, config_files()[0], installed_binary(binary), root)
    if show:
        for piece in set_up.plan(layout):
            click.echo(f"==> {piece.path} (mode {piece.mode:o})\n{set_up.marked(piece.text)}")
        return
    for what, happened in set_up.apply(layout, dry_run=dry_run):
        click.echo(f"{what}: {happened}")
    if not dry_run and root is None:
        click.echo("next: systemctl daemon-reload && systemctl enable --now imgbuild-reap.timer; imgbuild doctor")


@admin.command()
@click.option("--binary", metavar="PATH", help="imgbuild's absolute path (default: the one on PATH, links resolved).")
def sudoers(binary: str | None) -> None:
    """Print the sudoers drop-in for enforced mode: users run imgbuild's user commands as root, nothing else."""

    from imgbuild.servers.enforce import sudoers as drop_in

    click.echo(drop_in(installed_binary(binary)), nl=False)
