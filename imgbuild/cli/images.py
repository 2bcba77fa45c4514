"""Images: build, smoke."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from imgbuild.cli.base import SIGN_KEY, Section, emit_json, open_signer, settings_of
from imgbuild.errors import EXIT_FAILED

if TYPE_CHECKING:
    from imgbuild.pipeline.smoke import SmokeReport

SECTION = Section("Images")


@SECTION.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--backend", type=click.Choice(["auto", "buildkit", "sdk"]), help="Build backend (default auto).")
@click.option("--builder", metavar="NAME", help="buildx builder to use (remote BuildKit).")
@click.option("--require-gpu", is_flag=True, help="Fail when no GPU is visible to the smoke test.")
@click.option("--skip-gpu", is_flag=True, help="Run no GPU check in the smoke test, even on a host with GPUs.")
@click.option("--no-cache", is_flag=True, help="Build without the layer cache.")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), help="Context folder.")
@click.option("--push", is_flag=True, help="Push the promoted image.")
@click.option(
    "--reproducible", is_flag=True, help="Stamp every time as SOURCE_DATE_EPOCH (0): same inputs, same digest (Podman)."
)
@click.option(
    "--platform",
    metavar="PLATFORM[,PLATFORM]",
    help="Build for linux/amd64, linux/arm64 or both; another than the engine's own is built and smoke-tested "
    "under qemu (Podman) and kept as <tag>-<arch>. With --push: one manifest list.",
)
@SIGN_KEY
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def build(
    ctx: click.Context,
    file: Path,
    backend: str | None,
    builder: str | None,
    require_gpu: bool,
    skip_gpu: bool,
    no_cache: bool,
    out: Path | None,
    push: bool,
    reproducible: bool,
    platform: str | None,
    sign_key: Path | None,
    as_json: bool,
) -> None:
    """Build a recipe, smoke-test it, and promote it to <user>/<name>:<tag> only if it works."""
    from imgbuild.engine import connect_engine
    from imgbuild.hostio.acting import as_user
    from imgbuild.pipeline.build import BuildJob, PublishTo, build_job
    from imgbuild.platforms import parse_platforms
    from imgbuild.recipe import load_recipe
    from imgbuild.servers import enforce
    from imgbuild.servers.holds import gpu_claims, quota_check
    from imgbuild.ui import Progress

    platforms = parse_platforms(platform) if platform is not None else ()
    settings = settings_of(ctx, backend=backend, builder=builder)
    acting = enforce.acting(settings)  # through sudo: the user's files as theirs, the image in their namespace
    enforce.check_build(acting, push=push, builder=builder, sign_key=sign_key)
    signer = open_signer(sign_key, push)  # a wrong key or password stops here, before any build
    with as_user(acting.who if acting else None):  # the user's recipe, read as they may read it
        loaded = load_recipe(file, secrets=settings.secrets())  # a bad recipe exits 2 before any engine is asked
    job = BuildJob(
        loaded,
        platforms,
        backend=backend,
        require_gpu=require_gpu,
        skip_gpu=skip_gpu,
        no_cache=no_cache,
        out=out,
        acting=acting,
        claims=gpu_claims(settings),
        quota=quota_check(settings, acting.who.name) if acting else None,  # a user's smoke test is a run of theirs
        reproducible=reproducible,
        publish=PublishTo(signer) if push else None,
    )
    engine = connect_engine(settings)
    with Progress(f"imgbuild build {file}", enabled=True) as progress:
        made = build_job(job, settings, engine, progress)
    own, pushed = made.own(), made.pushed
    if as_json:
        body = own.to_json() if len(made.results) == 1 else {"platforms": [r.to_json() for r in made.results]}
        emit_json({**body, **({"pushed_digest": pushed} if push else {})})
        return
    for result in made.results:
        if result.smoke:
            _smoke_table(result.smoke)
    for result in made.results:
        prev = (
            f" (previous {result.previous_id[:19]} kept as :{result.target.rsplit(':', 1)[-1]}-previous)"
            if result.previous_id and result.promoted
            else ""
        )
        click.echo(f"{result.target} -> {result.image_id[:19]}{prev}")
    if pushed and made.emulated:
        click.echo(f"{own.plan.target} -> manifest list {pushed} ({', '.join(map(made.platform_of, made.results))})")


def _smoke_table(report: SmokeReport) -> None:
    from imgbuild.ui import print_table

    print_table(
        ["check", "status", "detail"],
        [[c["name"], c["status"].upper(), c["reason"]] for c in report.checks],
        title=f"smoke test: {report.image}",
    )
    if report.note:
        click.echo(f"note: {report.note}", err=True)
    click.echo(report.summary(), err=True)


@SECTION.command()
@click.argument("image")
@click.option(
    "--for",
    "targets",
    metavar="GPU[,GPU...]",
    help="Judge without a GPU whether the image runs on these GPUs (v100, l40s, h100, sm_89, 8.9, ...).",
)
@click.option("--driver", metavar="VERSION", help="With --for: the driver those GPUs run (e.g. 535.104.05).")
@click.option("--require-gpu", is_flag=True, help="Fail when no GPU is visible.")
@click.option("--skip-gpu", is_flag=True, help="Run no GPU check, even on a host with GPUs.")
@click.option("--gpus", default="1", show_default=True, help="Which GPUs to test, as `imgbuild run --gpus`.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), help="Also write the JSON report here.")
@click.pass_context
def smoke(
    ctx: click.Context,
    image: str,
    targets: str | None,
    driver: str | None,
    require_gpu: bool,
    skip_gpu: bool,
    gpus: str,
    as_json: bool,
    report: Path | None,
) -> None:
    """Run the smoke test (CUDA, cuDNN, tensor-core AMP, framework intact) in any image.

    With --for, run only what needs no GPU and say, per GPU, whether the image runs there:

        imgbuild smoke nvcr.io/nvidia/pytorch:25.10-py3 --for v100,a100,h100 --driver 535.104.05
    """
    from imgbuild.engine import connect_engine
    from imgbuild.gpu.fleet import check_driver, parse_targets
    from imgbuild.hostio.acting import write_as
    from imgbuild.pipeline.smoke import SmokeRequest, fleet_report, run_smoke
    from imgbuild.registry.pypi import PYPI
    from imgbuild.servers import enforce
    from imgbuild.servers.holds import gpu_claims, quota_check
    from imgbuild.ui import Progress

    fleet = parse_targets(targets) if targets is not None else None
    driver = check_driver(driver)
    if driver and fleet is None:
        raise click.UsageError("--driver goes with --for")
    settings = settings_of(ctx)
    acting = enforce.acting(settings)
    if acting:
        acting.check_image(image)
    engine = connect_engine(settings)
    live = Progress(f"imgbuild smoke {image}", enabled=not as_json, live_only=True)
    if fleet is not None:
        with live as progress:
            progress("reading the image's CUDA and kernels")
            result = fleet_report(engine, image, fleet, driver, settings)
    else:
        wanted = SmokeRequest(
            image, require_gpu=require_gpu, skip_gpu=skip_gpu, gpus=gpus,
            import_seconds=math.ceil(settings.smoke_import_timeout),
            gpu_seconds=math.ceil(settings.smoke_gpu_seconds), index_url=settings.pip_index_url or PYPI,
        )  # fmt: skip
        quota = quota_check(settings, acting.who.name) if acting else None
        with live as progress:
            progress("the smoke test runs in the image")  # the clock runs while it imports and times the GPUs
            result = run_smoke(engine, wanted, settings, claims=gpu_claims(settings), quota=quota, on_step=progress)
    if report:
        write_as(acting.who if acting else None, report, json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")
    if as_json:
        emit_json(result.to_json())
    elif fleet is not None:
        _fleet_table(result)
    else:
        _smoke_table(result)
    if not result.ok:
        sys.exit(EXIT_FAILED)


def _fleet_table(report: SmokeReport) -> None:
    from imgbuild.ui import print_table

    checks = [c for c in report.checks if c["name"] != "fleet"]
    fleet = next((c for c in report.checks if c["name"] == "fleet"), None)
    verdicts = fleet["details"]["verdicts"] if fleet else []
    print_table(
        ["gpu", "sm", "verdict", "why"],
        [[v["target"], v["capability"], "runs" if v["runs"] else "DOES NOT RUN", v["reason"]] for v in verdicts],
        title=f"{report.image} on each GPU",
    )
    for check in checks:
        click.echo(f"{check['name']}: {check['status'].upper()} {check['reason']}", err=True)
    click.echo("every GPU can run it" if report.ok else "not every GPU can run it: " + report.summary(), err=True)
