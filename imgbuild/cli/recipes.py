"""Recipes: validate, render, schema, bump, lock."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from imgbuild.cli.base import Section, emit_json, settings_of
from imgbuild.errors import EXIT_USAGE

SECTION = Section("Recipes")


@SECTION.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@click.pass_context
def validate(ctx: click.Context, files: tuple[Path, ...], as_json: bool) -> None:
    """Check recipes; every problem as FILE:LINE:COL: field: what is wrong (hint)."""
    from imgbuild.annotation import Annotation, shown
    from imgbuild.errors import Problem, RecipeError
    from imgbuild.pipeline.plan import check_offline
    from imgbuild.pipeline.resolve import check_known
    from imgbuild.recipe import display_path, load_recipe

    settings = settings_of(ctx)
    results = []
    problems: list[Problem] = []
    for path in files:
        try:
            loaded = load_recipe(path, secrets=settings.secrets())
            check_offline(loaded)
            base = check_known(loaded, settings)
            results.append(
                {"file": display_path(path), "ok": True, "name": loaded.recipe.name, "problems": [], "base": base}
            )
        except RecipeError as exc:
            results.append({"file": display_path(path), "ok": False, "problems": exc.lines()})
            problems.extend(exc.problems)
    if as_json:
        emit_json(results)
    else:
        for problem in problems:  # under GitHub Actions each an annotation at its file, line and column
            click.echo(shown(Annotation.of(problem)), err=True)
        for r in results:
            if r["ok"]:
                click.echo(f"{r['file']}: ok ({r['base']})")
    if problems:
        sys.exit(EXIT_USAGE)


@SECTION.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o", "--out", type=click.Path(file_okay=False, path_type=Path), help="Context folder (default: images/<name>)."
)
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the Dockerfile instead of writing the context.")
@click.option(
    "--backend",
    type=click.Choice(["buildkit", "sdk"]),
    default="buildkit",
    show_default=True,
    help="Render for this build backend.",
)
@click.option("--offline", is_flag=True, help="Do not ask the registry to pin the base by digest.")
@click.pass_context
def render(ctx: click.Context, file: Path, out: Path | None, to_stdout: bool, backend: str, offline: bool) -> None:
    """Render a recipe into a reviewable build context under images/<name>/."""
    from imgbuild.pipeline.context import context_dir, render_checked, render_into
    from imgbuild.pipeline.resolve import plan_file

    settings = settings_of(ctx)
    plan = plan_file(file, settings, offline=offline)
    if to_stdout:
        click.echo(render_checked(plan, backend, settings).text("Dockerfile"), nl=False)
        return
    rendered = render_into(plan, context_dir(plan, settings, out), backend, settings)
    click.echo(f"{rendered}/ (base {plan.base.pinned}, {plan.content_hash[:19]})")


@SECTION.command()
@click.option("--config", "of_config", is_flag=True, help="The config file's schema instead (docs/config.schema.json).")
@click.option("--table", is_flag=True, help="With --config: the flat settings as README's Markdown table.")
def schema(of_config: bool, table: bool) -> None:
    """Print the recipe JSON schema, or the config file's (generated from the models)."""
    if table and not of_config:
        raise click.UsageError("--table goes with --config")
    if of_config:
        from imgbuild.config.model import json_schema as config_schema
        from imgbuild.config.model import settings_table

        if table:
            click.echo(settings_table(), nl=False)
        else:
            emit_json(config_schema())
        return
    from imgbuild.recipe import json_schema

    emit_json(json_schema())


@SECTION.command("lock")
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--upgrade", is_flag=True, help="Resolve afresh, ignoring the versions locked before.")
@click.option("--upgrade-package", "packages", multiple=True, metavar="PKG", help="Free only this package (repeat).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@click.pass_context
def lock_command(ctx: click.Context, recipe: Path, upgrade: bool, packages: tuple[str, ...], as_json: bool) -> None:
    """Resolve the recipe's pip packages in its base and write <recipe>.lock.txt (builds install exactly that)."""
    from imgbuild.engine import connect_engine
    from imgbuild.pipeline.pins import lock, lockable
    from imgbuild.ui import Progress, print_table

    settings = settings_of(ctx)
    loaded = lockable(recipe, settings)  # a bad recipe, or one with nothing to lock, exits 2 before any engine
    engine = connect_engine(settings)
    with Progress(f"imgbuild lock {recipe}", enabled=not as_json, live_only=True) as progress:
        progress("resolving the recipe's packages in its base")  # the clock runs while the resolver works
        result = lock(loaded, settings, engine, upgrade=upgrade, upgrade_packages=packages, on_line=progress)
    for note in result.notes:
        click.echo(f"imgbuild lock: {note}", err=True)
    if as_json:
        emit_json(result.to_json())
        return
    how = result.resolver + (", with hashes" if result.hashed else "")
    rows = [["+", p] for p in result.added] + [["-", p] for p in result.removed] + [["~", c] for c in result.changed]
    if rows:
        print_table(["", "package"], rows, title=f"{result.path}: {len(result.pins)} package(s) locked by {how}")
    else:
        click.echo(f"{result.path}: {len(result.pins)} package(s) locked by {how}, unchanged", err=True)
    click.echo(str(result.path))


@SECTION.command()
@click.argument("name")
@click.option(
    "--from", "source", type=click.Path(dir_okay=False, path_type=Path),
    help="Start from a requirements file (referenced) or a pyproject.toml ([project].dependencies).",
)  # fmt: skip
@click.option("--framework", type=click.Choice(["pytorch", "tensorflow"]), default="pytorch", show_default=True)
@click.option(
    "--dir", "folder", type=click.Path(file_okay=False, path_type=Path), default=Path("recipes"), show_default=True,
    help="Where the recipe goes.",
)  # fmt: skip
@click.option("--ci", type=click.Choice(["github", "gitlab"]), help="Also write the CI workflow that builds it.")
@click.option(
    "--for", "for_gpus", metavar="GPU[,GPU...]",
    help="Choose the base for these GPUs (v100, l40s, sm_89, ...) instead of this host's and the site fleet's.",
)  # fmt: skip
@click.option("--driver", metavar="VERSION", help="With --for: the driver those GPUs run (e.g. 535.104.05).")
@click.option("--base", metavar="TAG", help="The NGC release to start from (e.g. 24.05), not the newest that runs.")
@click.pass_context
def init(
    ctx: click.Context,
    name: str,
    source: Path | None,
    framework: str,
    folder: Path,
    ci: str | None,
    for_gpus: str | None,
    driver: str | None,
    base: str | None,
) -> None:
    """Write a starting recipe (recipes/NAME.yaml) on the newest NGC release the registry lists that this host's
    GPUs (or --for) run with their driver, render its context, and print what comes next; never over a file."""
    from imgbuild.pipeline.starter import InitRequest, plan_starter, start

    settings = settings_of(ctx)
    request = InitRequest(name, framework, folder, source, ci, for_gpus, driver, base)
    starter = plan_starter(request, settings)
    done = start(starter, settings)
    click.echo(f"base {framework} {starter.release}: {starter.base_why}", err=True)
    click.echo(f"  {starter.base_detail}", err=True)
    for path in done.written:
        click.echo(f"wrote {path}", err=True)
    if done.rendered:
        click.echo(f"rendered {done.rendered}/ (commit it with the recipe: CI checks it is current)", err=True)
    else:
        click.echo(f"not rendered: {done.not_rendered}", err=True)
    click.echo("next:", err=True)
    for command in done.next_commands:
        click.echo(f"  {command}", err=True)
