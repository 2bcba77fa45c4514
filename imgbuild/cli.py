"""The command line. One error path: every ImgbuildError becomes one line per problem and an exit code.

Exit codes: 0 success, 1 the job ran and failed, 2 bad input or usage, 3 environment.
Heavy modules are imported inside commands so `imgbuild --help` stays fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import click

from imgbuild import __version__
from imgbuild.errors import (
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    ImgbuildError,
    UsageError,
)

SECTIONS = [
    ("Recipes", ["validate", "render", "schema", "bump"]),
    ("Images", ["build", "smoke", "rebuild"]),
    ("Registry", ["tags"]),
    ("Servers", ["run", "ps", "attach", "logs", "exec", "stop", "gpus"]),
    ("Clusters", ["export", "slurm"]),
    ("Settings", ["config"]),
]


class SectionedGroup(click.Group):
    """Lists commands under headings, in the order of the pipeline."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        ordered = [name for _, names in SECTIONS for name in names if name in self.commands]
        return ordered + sorted(set(self.commands) - set(ordered))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        placed: set[str] = set()
        for title, names in SECTIONS:
            rows = [(n, self.commands[n].get_short_help_str(70)) for n in names if n in self.commands]
            placed.update(names)
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        rest = [(n, self.commands[n].get_short_help_str(70)) for n in sorted(set(self.commands) - placed)]
        if rest:
            with formatter.section("Other"):
                formatter.write_dl(rest)


def _settings(ctx: click.Context, **flags: Any) -> Any:
    from imgbuild.config import load_settings

    root = ctx.find_root().params
    merged = {"user": root.get("user"), "ngc_registry": root.get("ngc_registry"), **flags}
    return load_settings(merged)


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100, "terminal_width": 100}


@click.group(cls=SectionedGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", "-V", prog_name="imgbuild")
@click.option("--user", metavar="NAME", help="Image namespace (IMGBUILD_USER; default: your login name).")
@click.option("--ngc-registry", metavar="HOST", help="NGC registry or mirror (IMGBUILD_NGC_REGISTRY; default nvcr.io).")
def cli(user: str | None, ngc_registry: str | None) -> None:
    """Build NGC-based images from YAML recipes, prove they work on the GPU, run them on shared servers.

    \b
    Exit codes: 0 success, 1 the job ran and failed (build, smoke test, stale check),
                2 bad input or usage, 3 environment (no Docker engine, registry unreachable).
    Read commands take --json.
    """


# --- recipes ---------------------------------------------------------------------------------------

@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@click.pass_context
def validate(ctx: click.Context, files: tuple[Path, ...], as_json: bool) -> None:
    """Check recipes; every problem as FILE:LINE:COL: field: what is wrong (hint)."""
    from imgbuild.errors import RecipeError
    from imgbuild.recipe import display_path, load_recipe

    secrets = _settings(ctx).secrets()
    results = []
    problems: list[str] = []
    for path in files:
        try:
            loaded = load_recipe(path, secrets=secrets)
            results.append({"file": display_path(path), "ok": True, "name": loaded.recipe.name, "problems": []})
        except RecipeError as exc:
            results.append({"file": display_path(path), "ok": False, "problems": exc.lines()})
            problems.extend(exc.lines())
    if as_json:
        _emit_json(results)
    else:
        for line in problems:
            click.echo(line, err=True)
        for r in results:
            if r["ok"]:
                click.echo(f"{r['file']}: ok")
    if problems:
        sys.exit(EXIT_USAGE)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path),
              help="Context folder (default: images/<name>).")
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the Dockerfile instead of writing the context.")
@click.option("--backend", type=click.Choice(["buildkit", "sdk"]), default="buildkit", show_default=True,
              help="Render for this build backend.")
@click.option("--offline", is_flag=True, help="Do not ask the registry to pin the base by digest.")
@click.pass_context
def render(ctx: click.Context, file: Path, out: Path | None, to_stdout: bool, backend: str, offline: bool) -> None:
    """Render a recipe into a reviewable build context under images/<name>/."""
    from imgbuild.build import context_dir, plan_recipe, write_context
    from imgbuild.context import check_no_secrets
    from imgbuild.errors import RegistryUnavailable
    from imgbuild.recipe import load_recipe
    from imgbuild.render import render as render_plan

    settings = _settings(ctx)
    loaded = load_recipe(file, secrets=settings.secrets())
    try:
        plan = plan_recipe(loaded, settings, offline=offline)
    except RegistryUnavailable as exc:
        raise RegistryUnavailable(f"{exc} (--offline renders without pinning the base by digest)") from None
    if to_stdout:
        context = render_plan(plan, backend)
        check_no_secrets(context, settings.secrets())
        click.echo(context.text("Dockerfile"), nl=False)
        return
    rendered = write_context(plan, context_dir(plan, settings, out), backend, settings)
    click.echo(f"{rendered}/ (base {plan.base.pinned}, {plan.content_hash[:19]})")


@cli.command()
def schema() -> None:
    """Print the recipe JSON schema (generated from the model)."""
    from imgbuild.recipe import json_schema

    _emit_json(json_schema())


# --- images ----------------------------------------------------------------------------------------

@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--backend", type=click.Choice(["auto", "buildkit", "sdk"]), help="Build backend (default auto).")
@click.option("--builder", metavar="NAME", help="buildx builder to use (remote BuildKit).")
@click.option("--require-gpu", is_flag=True, help="Fail when no GPU is visible to the smoke test.")
@click.option("--no-cache", is_flag=True, help="Build without the layer cache.")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), help="Context folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def build(ctx: click.Context, file: Path, backend: str | None, builder: str | None, require_gpu: bool,
          no_cache: bool, out: Path | None, as_json: bool) -> None:
    """Build a recipe, smoke-test it, and promote it to <user>/<name>:<tag> only if it works."""
    from imgbuild import build as pipeline
    from imgbuild.ui import Progress, print_table

    settings = _settings(ctx, backend=backend, builder=builder)
    with Progress(f"imgbuild build {file}", enabled=True) as progress:
        result = pipeline.build(file, settings, backend=backend, require_gpu=require_gpu, no_cache=no_cache,
                                out=out, progress=progress)
    if as_json:
        _emit_json(result.to_json())
        return
    if result.smoke:
        _smoke_table(result.smoke, print_table)
    prev = f" (previous {result.previous_id[:19]} kept as :{result.plan.tag}-previous)" \
        if result.previous_id and result.promoted else ""
    click.echo(f"{result.plan.target} -> {result.image_id[:19]}{prev}")


def _smoke_table(report: Any, print_table: Any) -> None:
    print_table(["check", "status", "detail"],
                [[c["name"], c["status"].upper(), c["reason"]] for c in report.checks],
                title=f"smoke test: {report.image}")
    if report.note:
        click.echo(f"note: {report.note}", err=True)
    click.echo(report.summary(), err=True)


@cli.command()
@click.argument("image")
@click.option("--require-gpu", is_flag=True, help="Fail when no GPU is visible.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), help="Also write the JSON report here.")
@click.pass_context
def smoke(ctx: click.Context, image: str, require_gpu: bool, as_json: bool, report: Path | None) -> None:
    """Run the smoke test (CUDA, cuDNN, tensor-core AMP, framework intact) in any image."""
    from imgbuild.engine import Engine
    from imgbuild.smoke import run_smoke
    from imgbuild.ui import print_table

    settings = _settings(ctx)
    engine = Engine.connect(settings.docker_cli)
    result = run_smoke(engine, image, require_gpu=require_gpu)
    if report:
        report.write_text(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")
    if as_json:
        _emit_json(result.to_json())
    else:
        _smoke_table(result, print_table)
    if not result.ok:
        sys.exit(EXIT_FAILED)


@cli.command()
@click.argument("paths", nargs=-1)
@click.option("--check", is_flag=True, help="Build nothing; exit 1 when images/ is stale against the recipes.")
@click.option("--dry-run", is_flag=True, help="Say what is stale and why; build nothing.")
@click.option("--push", is_flag=True, help="Push built images (and re-push ones the registry lacks).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Independent images built at once.")
@click.option("--backend", type=click.Choice(["auto", "buildkit", "sdk"]), help="Build backend.")
@click.option("--report-json", type=click.Path(dir_okay=False, path_type=Path), help="Write a JSON report.")
@click.option("--junit-xml", type=click.Path(dir_okay=False, path_type=Path), help="Write a JUnit XML report.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def rebuild(ctx: click.Context, paths: tuple[str, ...], check: bool, dry_run: bool, push: bool, jobs: int,
            backend: str | None, report_json: Path | None, junit_xml: Path | None, as_json: bool) -> None:
    """Rebuild exactly the images whose inputs changed (recipes/ by default), in dependency order."""
    import threading

    from imgbuild import rebuild as rb
    from imgbuild.ui import print_table

    lock = threading.Lock()

    def log(line: str) -> None:
        with lock:
            click.echo(" ".join(line.split())[:200], err=True)

    report = rb.rebuild(list(paths) or ["recipes"], _settings(ctx, backend=backend),
                        rb.RebuildOptions(check=check, push=push, jobs=jobs, backend=backend, dry_run=dry_run), log)
    if report_json:
        report_json.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    if junit_xml:
        junit_xml.write_text(rb.junit_xml(report.items, report.seconds))
    if as_json:
        _emit_json(report.to_json())
    else:
        print_table(["recipe", "image", "status", "why", "time"], report.rows(),
                    title=f"imgbuild rebuild{' --check' if check else ''}: {len(report.items)} recipe(s), "
                          f"{report.seconds:.1f}s")
        for item in report.items:
            if item.status == rb.FAILED and "\n" in item.error:
                click.echo(f"--- {item.name}\n{item.error}", err=True)
    if not report.ok:
        sys.exit(EXIT_FAILED)


@cli.command()
@click.argument("paths", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Show the moves; change no file.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@click.pass_context
def bump(ctx: click.Context, paths: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Move recipes with base.follow to the newest matching NGC tag (edits the YAML, re-renders)."""
    from imgbuild.bump import bump_and_render
    from imgbuild.rebuild import discover
    from imgbuild.ui import print_table

    results = bump_and_render(discover(list(paths) or ["recipes"]), _settings(ctx), dry_run=dry_run)
    if as_json:
        _emit_json([r.to_json() for r in results])
        return
    print_table(["recipe", "follows", "from", "to", "moved"],
                [[r.recipe, r.pattern, r.current, r.newest or "(no match)", "yes" if r.changed else "no"]
                 for r in results], title="imgbuild bump" + (" --dry-run" if dry_run else ""))


# --- registry --------------------------------------------------------------------------------------

@cli.command()
@click.argument("repository", default="pytorch")
@click.option("--since", metavar="YY.MM", help="Only releases from this one on (e.g. 24.01).")
@click.option("--variant", default="none", show_default=True,
              help="'none' for plain tags, 'all', or a variant such as igpu.")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Newest N tags.")
@click.option("--all", "show_all", is_flag=True, help="No limit.")
@click.option("--details", is_flag=True, help="CUDA, cuDNN, framework, Python, driver, size, digest per tag.")
@click.option("--compatible", is_flag=True, help="Only tags this host's driver and GPUs can run.")
@click.option("--driver", metavar="VERSION", help="Driver version to check against (default: NVML / nvidia-smi).")
@click.option("--arch", metavar="X.Y[,X.Y]", help="GPU compute capabilities to check against.")
@click.option("--refresh", is_flag=True, help="Ignore the cached tag list.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable listing.")
@click.pass_context
def tags(ctx: click.Context, repository: str, since: str | None, variant: str, limit: int, show_all: bool,
         details: bool, compatible: bool, driver: str | None, arch: str | None, refresh: bool,
         as_json: bool) -> None:
    """List NGC tags (pytorch, tensorflow or ORG/REPO), newest first, from the registry itself."""
    from imgbuild import tags as tagmod
    from imgbuild.ui import print_table

    listing = tagmod.listing(_settings(ctx), tagmod.Query(
        repository, since=since, variant=variant, limit=None if show_all else limit, details=details,
        compatible=compatible, driver=driver, arch=arch, refresh=refresh))
    infos = listing.tags
    if as_json:
        _emit_json(listing.to_json())
        return
    if details or compatible:
        columns = ["tag", "CUDA", "cuDNN", "framework", "python", "driver", "size", "digest"]
        rows = [[i.tag, i.cuda, i.cudnn, f"{i.framework} {i.framework_version}".strip(), i.python, i.driver,
                 f"{i.size / 1e9:.1f} GB" if i.size else "", i.digest[:19]] for i in infos]
        if compatible:
            columns.append("why")
            for row, info in zip(rows, infos, strict=True):
                row.append(info.why)
    else:
        columns = ["tag", "release", "variant"]
        rows = [[i.tag, i.release, i.variant or ""] for i in infos]
    print_table(columns, rows, title=f"{listing.repository}: {len(infos)} of {listing.total} tags")
    for note in listing.notes:
        click.echo(f"note: {note}", err=True)


# --- shared GPU servers ----------------------------------------------------------------------------

@cli.command()
@click.argument("image")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--gpus", "gpu_request", default="none", show_default=True,
              help="N least-loaded free GPUs, a list like 0,3, all, or none.")
@click.option("--force", is_flag=True, help="Take GPUs other users' processes are on.")
@click.option("--cpus", type=float, help="CPU limit (default: a fair share per GPU, 8-24 each).")
@click.option("-v", "--volume", "volumes", multiple=True, help="Extra mounts, as docker -v.")
@click.option("-e", "--env", "env", multiple=True, help="Environment, as docker -e.")
@click.option("-p", "--publish", "ports", multiple=True, help="Ports, as docker -p.")
@click.option("--name", "short", help="The <name> in <user>_<name>_<n> (default: recipe or image name).")
@click.option("-d", "--detach", is_flag=True, help="Run in the background.")
@click.option("--keep", is_flag=True, help="Keep the container after it exits (no --rm).")
@click.option("--shm-size", help="Private /dev/shm of this size instead of --ipc host.")
@click.option("--no-workspace", is_flag=True, help="Do not mount the current folder at /workspace.")
@click.option("--user", "as_user", metavar="UID:GID", help="Run as this user instead of yours.")
@click.option("--entrypoint", help="Override the image's entrypoint.")
@click.option("--dry-run", is_flag=True, help="Print the equivalent docker run line; start nothing.")
@click.pass_context
def run(ctx: click.Context, image: str, command: tuple[str, ...], gpu_request: str, force: bool,
        cpus: float | None, volumes: tuple[str, ...], env: tuple[str, ...], ports: tuple[str, ...],
        short: str | None, detach: bool, keep: bool, shm_size: str | None, no_workspace: bool,
        as_user: str | None, entrypoint: str | None, dry_run: bool) -> None:
    """Start a container of IMAGE (or of a RECIPE's image) with the shared-server conventions.

    Options go before `--`; the command after it.

    \b
    imgbuild run recipes/pytorch-research.yaml --gpus 2 -- python train.py
    imgbuild run nvcr.io/nvidia/pytorch:24.05-py3 --gpus 0,3 --dry-run
    """
    from imgbuild import run as runmod
    from imgbuild.engine import Engine
    from imgbuild.ui import print_table

    settings = _settings(ctx)
    spec = runmod.prepare(runmod.RunRequest(
        image=image, command=list(command), gpu_request=gpu_request, force=force, cpus=cpus, volumes=list(volumes),
        env=list(env), ports=list(ports), short=short, detach=detach, keep=keep, shm_size=shm_size,
        no_workspace=no_workspace, as_user=as_user, entrypoint=entrypoint,
        interactive=sys.stdin.isatty(), terminal=sys.stdin.isatty() and sys.stdout.isatty()), settings)
    engine = None if dry_run else Engine.connect(settings.docker_cli)
    spec.name = runmod.next_name(spec.user, spec.short_name, engine.container_names() if engine else set())
    for note in spec.gpus.forced:
        click.echo(f"warning: sharing {note} (--force)", err=True)
    if spec.gpus.gpus:
        click.echo("GPUs: " + ", ".join(f"{g.index} {g.name} ({g.memory_used_mib}/{g.memory_total_mib} MiB, "
                                        f"{g.utilization if g.utilization is not None else '?'}%)"
                                        for g in spec.gpus.gpus), err=True)
    if engine is None:
        click.echo(spec.command_line(settings.docker_cli or "docker"))
        return
    click.echo(f"starting {spec.name} ({spec.image}{f', {spec.cpus:g} CPUs' if spec.cpus else ''})", err=True)
    if detach:
        runmod.start_detached(engine, spec)
        return
    outcome = runmod.start_attached(engine, spec, settings)
    if outcome.start_failed:
        click.echo(f"imgbuild: docker could not start the container; if it said 'error setting rlimit', "
                   f"{runmod.RLIMIT_HINT}", err=True)
    if outcome.rows:
        print_table(["GPU", "util mean %", "util max %", "mem mean MiB", "mem max MiB"],
                    [[r["gpu"], r["util_mean"], r["util_max"], r["mem_mean_mib"], r["mem_max_mib"]]
                     for r in outcome.rows], title=f"{spec.name}: {outcome.seconds:.0f} s")
    if outcome.hint:
        click.echo(f"hint: {outcome.hint}", err=True)
    sys.exit(outcome.code)


@cli.command()
@click.option("--all", "all_users", is_flag=True, help="Every user's containers.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable list.")
@click.pass_context
def ps(ctx: click.Context, all_users: bool, as_json: bool) -> None:
    """Your containers (or --all users'), with their GPUs and CPU limits."""
    from imgbuild.engine import Engine
    from imgbuild.host import caller
    from imgbuild.ui import print_table

    settings = _settings(ctx)
    who = caller()
    rows = [r for r in Engine.connect(settings.docker_cli).containers() if all_users or r["user"] == who.name]
    if as_json:
        _emit_json(rows)
        return
    print_table(["name", "user", "image", "status", "GPUs", "CPUs", "created"],
                [[r["name"], r["user"], r["image"], r["status"], r["gpus"], r["cpus"] or "", r["created"]]
                 for r in rows])


def _on_container(ctx: click.Context, verb: str, name: str, flags: list[str] | None = None,
                  args: tuple[str, ...] = (), force: bool = False) -> None:
    """`docker VERB [flags] CONTAINER [args]` on one of your containers, found by its short name."""
    from imgbuild.engine import Engine
    from imgbuild.host import caller
    from imgbuild.run import check_owner, find_container

    settings = _settings(ctx)
    engine = Engine.connect(settings.docker_cli)
    who = caller()
    row = find_container(engine.containers(), name, who.name)
    check_owner(row, who, verb, force)
    engine.exec_cli([verb, *(flags or []), row["name"], *args])


_FORCE = click.option("--force", is_flag=True, help="Root only: act on another user's container.")


@cli.command()
@click.argument("name")
@_FORCE
@click.pass_context
def attach(ctx: click.Context, name: str, force: bool) -> None:
    """Attach to one of your containers (detach with Ctrl-P Ctrl-Q)."""
    _on_container(ctx, "attach", name, force=force)


@cli.command()
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output.")
@click.option("--tail", default="all", show_default=True, help="Lines from the end.")
@_FORCE
@click.pass_context
def logs(ctx: click.Context, name: str, follow: bool, tail: str, force: bool) -> None:
    """Print a container's output."""
    if not re.fullmatch(r"all|\d{1,9}", tail):
        raise UsageError(f"--tail: {tail!r} is not a number of lines or 'all'")
    _on_container(ctx, "logs", name, ["--tail", tail, *(["-f"] if follow else [])], force=force)


@cli.command(name="exec")
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@_FORCE
@click.pass_context
def exec_(ctx: click.Context, name: str, command: tuple[str, ...], force: bool) -> None:
    """Run a command in one of your running containers: imgbuild exec NAME -- COMMAND..."""
    _on_container(ctx, "exec", name, ["-it"] if sys.stdin.isatty() else ["-i"], command, force=force)


@cli.command()
@click.argument("name")
@_FORCE
@click.pass_context
def stop(ctx: click.Context, name: str, force: bool) -> None:
    """Stop one of your containers."""
    _on_container(ctx, "stop", name, force=force)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable readings.")
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds between refreshes.")
@click.option("--count", type=click.IntRange(min=1), help="With --watch: stop after N readings.")
@click.pass_context
def gpus(ctx: click.Context, as_json: bool, watch: bool, interval: float, count: int | None) -> None:
    """GPUs: memory, utilisation, and who runs what on each (NVML, or nvidia-smi)."""
    import time

    from imgbuild.gpus import NoGpus, read_gpus
    from imgbuild.ui import print_table

    settings = _settings(ctx)
    shown = 0
    while True:
        try:
            readings = read_gpus(settings.gpu_snapshot)
        except NoGpus as exc:
            click.echo(f"no NVIDIA GPU or driver on this host ({exc}); imgbuild run uses the CPU")
            return
        if as_json:
            _emit_json({"gpus": [g.to_json() for g in readings]})
        else:
            rows = []
            for g in readings:
                procs = "; ".join(f"{p.user or '?'} {p.container or p.name or p.pid} {p.used_mib} MiB"
                                  for p in g.processes) or "-"
                util = "?" if g.utilization is None else f"{g.utilization}%"
                rows.append([g.index, g.name, f"{g.memory_used_mib}/{g.memory_total_mib} MiB", util, procs])
            print_table(["GPU", "name", "memory", "util", "processes (user container memory)"], rows,
                        title=time.strftime("%H:%M:%S") if watch else None)
        shown += 1
        if not watch or (count and shown >= count):
            return
        time.sleep(interval)


# --- clusters --------------------------------------------------------------------------------------

@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--apptainer", is_flag=True, required=True, help="Write an Apptainer definition file.")
@click.option("--from", "bootstrap", type=click.Choice(["docker-daemon", "docker-archive", "native"]),
              default="docker-daemon", show_default=True,
              help="Bootstrap from the built image (daemon, or a docker save archive) or render natively.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), help="Definition file to write.")
@click.option("--build/--no-build", default=True, show_default=True,
              help="Build the .sif and run its %test when apptainer is installed.")
@click.pass_context
def export(ctx: click.Context, recipe: Path, apptainer: bool, bootstrap: str, out: Path | None, build: bool) -> None:
    """Export a recipe for clusters: an Apptainer definition (and the .sif where apptainer exists)."""
    from imgbuild.build import plan_recipe
    from imgbuild.cluster import apptainer_tool, build_sif, export_apptainer
    from imgbuild.engine import Engine
    from imgbuild.recipe import load_recipe

    settings = _settings(ctx)
    loaded = load_recipe(recipe, secrets=settings.secrets())
    to_stdout = out is not None and str(out) == "-"
    if to_stdout and bootstrap == "docker-archive":
        raise UsageError("-o -: the docker-archive bootstrap writes a tar beside the definition; name a file")
    plan = plan_recipe(loaded, settings, offline=bootstrap != "native")
    out = None if to_stdout else (out or Path(f"{plan.name}.def"))
    engine = Engine.connect(settings.docker_cli) if bootstrap == "docker-archive" else None
    exported = export_apptainer(plan, settings, bootstrap, out, engine)
    if exported.archive:
        click.echo(f"saved {plan.target} to {exported.archive}", err=True)
    if exported.context:
        click.echo(f"rendered {exported.context}: run apptainer build from that folder (%files paths are "
                   "relative)", err=True)
    if out is None:
        click.echo(exported.definition, nl=False)
        return
    out.write_text(exported.definition)
    click.echo(str(out))
    if not build:
        return
    tool = apptainer_tool()
    if not tool:
        click.echo("note: apptainer is not installed here: copy the definition to a machine that has it and run "
                   f"`apptainer build {plan.name}.sif {out.name}`", err=True)
        return
    click.echo(str(build_sif(tool, out, exported.context)))


@cli.command()
@click.argument("image")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--gpus", type=click.IntRange(min=0), default=1, show_default=True, help="GPUs per node.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes.")
@click.option("--gpu-type", help="GRES type (e.g. v100, a100), or a site alias from slurm.gpu_types.")
@click.option("--cpus-per-gpu", type=click.IntRange(min=1), help="CPUs per GPU (site default, else 10).")
@click.option("--cpus", type=click.IntRange(min=1), help="CPUs per task, instead of a share per GPU.")
@click.option("--mem", help="Memory per node (e.g. 64G).")
@click.option("--time", "walltime", help="Time limit (e.g. 1:00:00).")
@click.option("--partition", help="Partition (site default).")
@click.option("--account", help="Account/project (site default).")
@click.option("--job-name", help="Job name (default: the image name).")
@click.option("--output", "job_output", default="%x-%j.out", show_default=True, help="Slurm output file.")
@click.option("--stage", multiple=True, metavar="TAR", help="Dataset tar to extract to node-local scratch.")
@click.option("--bind", "binds", multiple=True, help="Extra mount (SRC:DEST) into the container.")
@click.option("--runtime", type=click.Choice(["apptainer", "singularity", "pyxis", "docker"]),
              help="Container runtime on the nodes (site default apptainer).")
@click.option("--torchrun/--no-torchrun", default=None, help="Launch with torchrun (default: more than one GPU).")
@click.option("--nccl-debug", type=click.Choice(["WARN", "INFO", "TRACE"]), help="Set NCCL_DEBUG.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the script here.")
@click.option("--submit", is_flag=True, help="Submit with sbatch and print the job id.")
@click.option("--test-only", is_flag=True, help="Ask sbatch --test-only whether it would schedule the job.")
@click.pass_context
def slurm(ctx: click.Context, image: str, command: tuple[str, ...], gpus: int, nodes: int, gpu_type: str | None,
          cpus_per_gpu: int | None, cpus: int | None, mem: str | None, walltime: str | None,
          partition: str | None, account: str | None, job_name: str | None, job_output: str,
          stage: tuple[str, ...], binds: tuple[str, ...], runtime: str | None, torchrun: bool | None,
          nccl_debug: str | None, out: Path | None, submit: bool, test_only: bool) -> None:
    """Write (and --submit) an sbatch script running COMMAND in IMAGE or a RECIPE's image: imgbuild slurm IMG -- CMD"""
    from imgbuild.cluster import JobFlags, job_from_flags, sbatch_script, submit_job
    from imgbuild.config import site_section
    from imgbuild.run import resolve_image

    settings = _settings(ctx)
    ref, short = resolve_image(image, settings)
    job = job_from_flags(JobFlags(
        command=list(command), image=ref, short_name=short, gpus=gpus, nodes=nodes, gpu_type=gpu_type,
        cpus_per_gpu=cpus_per_gpu, cpus=cpus, mem=mem, time=walltime, partition=partition, account=account,
        job_name=job_name, output=job_output, stage=list(stage), binds=list(binds), runtime=runtime,
        torchrun=torchrun, nccl_debug=nccl_debug), site_section("slurm"))
    script = sbatch_script(job)
    if out:
        out.write_text(script)
        click.echo(f"wrote {out}", err=True)
    elif not (submit or test_only):
        click.echo(script, nl=False)
    if submit or test_only:
        click.echo(submit_job(script, test_only=test_only))


# --- settings --------------------------------------------------------------------------------------

@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable settings.")
@click.pass_context
def config(ctx: click.Context, as_json: bool) -> None:
    """Show the effective settings and where each comes from (secrets masked)."""
    from imgbuild.ui import print_table

    view = _settings(ctx).public_view()
    if as_json:
        _emit_json(view)
        return
    print_table(["setting", "value", "from"], [[k, v["value"], v["source"]] for k, v in view.items()])


# --- entry point -----------------------------------------------------------------------------------

# click >= 8.2 raises this for a bare `imgbuild`; older versions print the help themselves.
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C: candidate tags, smoke containers, secret files


def main(argv: list[str] | None = None) -> None:
    import signal

    with contextlib.suppress(ValueError):  # not the main thread (tests calling main())
        signal.signal(signal.SIGTERM, _terminate)
    try:
        cli.main(args=argv, prog_name="imgbuild", standalone_mode=False)
    except _NO_ARGS_IS_HELP as exc:  # `imgbuild` alone prints help (click >= 8.2 raises this)
        click.echo(exc.format_message())
        sys.exit(EXIT_OK)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("imgbuild: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        message = " ".join(exc.format_message().split())
        click.echo(f"imgbuild: {message} (see imgbuild --help)", err=True)
        sys.exit(EXIT_USAGE)
    except ImgbuildError as exc:
        lines = exc.lines()
        click.echo(f"imgbuild: {lines[0]}", err=True)
        for line in lines[1:]:
            click.echo(line if line.startswith("  ") else f"imgbuild: {line}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("imgbuild: interrupted", err=True)
        sys.exit(130)
    except OSError as exc:  # a disk, folder or device the environment refused: read-only, full, no access
        where = f" {exc.filename}" if exc.filename else ""
        click.echo(f"imgbuild: cannot use{where}: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_ENVIRONMENT)
    except Exception as exc:  # a bug or an unexpected engine answer: still one line, no traceback
        if os.environ.get("IMGBUILD_DEBUG"):
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        click.echo(f"imgbuild: unexpected {type(exc).__name__}: {first} "
                   "(set IMGBUILD_DEBUG=1 for the traceback)", err=True)
        sys.exit(EXIT_FAILED)
    sys.exit(EXIT_OK)


if __name__ == "__main__":  # pragma: no cover
    main()
