"""Settings: config."""

from __future__ import annotations

import click

from imgbuild.cli.base import Section, emit_json, settings_of

SECTION = Section("Settings")


@SECTION.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable settings.")
@click.pass_context
def config(ctx: click.Context, as_json: bool) -> None:
    """Show the effective settings and where each comes from (secrets masked)."""
    from imgbuild.ui import print_table

    view = settings_of(ctx).public_view()
    if as_json:
        emit_json(view)
        return
    print_table(["setting", "value", "from"], [[k, v["value"], v["source"]] for k, v in view.items()])
