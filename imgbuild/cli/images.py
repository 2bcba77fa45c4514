"""Images: build, smoke, rebuild."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from imgbuild.cli.base import Section, emit_json, settings_of
from imgbuild.errors import EXIT_FAILED, UsageError

if TYPE_CHECKING:
    from imgbuild.annotation import Annotation

SECTION = Section("Images")

_SIGN_KEY = click.option(
    "--sign-key",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="IMGBUILD_SIGN_KEY",
    help="--push: sign each pushed image with this cosign key (password in IMGBUILD_SIGN_PASSWORD or "
    "COSIGN_PASSWORD) and attach its provenance and SBOM. IMGBUILD_SIGN_KEY: the key of every push (a CI "
    "runner's), ignored by a command that pushes nothing.",
)


def _signer(sign_key: Path | None, push: bool) -> Any:
    """The signing key, opened before any build: a wrong key or password stops here, in one line."""
    if sign_key is None:
        return None
    import os

    from click.core import ParameterSource

    from imgbuild.supply.attest import load_signer

    if not push:
        if click.get_current_context().get_parameter_source("sign_key") == ParameterSource.ENVIRONMENT:
            return None  # the runner's key for its pushes; this command pushes nothing
        raise UsageError("--sign-key signs what is pushed: add --push")
    password = os.environ.get("IMGBUILD_SIGN_PASSWORD", os.environ.get("COSIGN_PASSWORD", ""))
    return load_signer(sign_key, password.encode())


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
@_SIGN_KEY
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
    from imgbuild.ci.publish import publish, publish_platforms
    from imgbuild.engine import connect_engine
    from imgbuild.pipeline.build import build_platforms
    from imgbuild.platforms import parse_platforms
    from imgbuild.servers import enforce
    from imgbuild.servers.holds import gpu_claims, quota_check
    from imgbuild.ui import Progress, print_table

    platforms = parse_platforms(platform) if platform is not None else ()
    settings = settings_of(ctx, backend=backend, builder=builder)
    acting = enforce.acting(settings)  # through sudo: the user's files as theirs, the image in their namespace
    enforce.check_build(acting, push=push, builder=builder, sign_key=sign_key)
    signer = _signer(sign_key, push)
    with Progress(f"imgbuild build {file}", enabled=True) as progress:
        made = build_platforms(
            file,
            settings,
            platforms,
            backend=backend,
            require_gpu=require_gpu,
            skip_gpu=skip_gpu,
            no_cache=no_cache,
            out=out,
            progress=progress,
            seed_from_registry=push,
            acting=acting,
            claims=gpu_claims(settings),
            quota=quota_check(settings, acting.who.name) if acting else None,  # a user's smoke test is a run of theirs
            reproducible=reproducible,
            trusted_key=signer.public_key() if signer is not None else None,
        )
        own = made.own()
        smoke = own.smoke.to_json() if own.smoke else {}
        pushed = ""
        engine = connect_engine(settings) if push else None
        if engine is not None and made.emulated:
            builds = [(made.platform_of(r), r.image_id) for r in made.results]
            pushed = publish_platforms(own.plan, builds, smoke, settings, engine, backend, signer, progress)
        elif engine is not None:
            pushed = publish(own.plan, own.image_id, smoke, settings, engine, backend, signer, progress)
    if as_json:
        body = own.to_json() if len(made.results) == 1 else {"platforms": [r.to_json() for r in made.results]}
        emit_json({**body, **({"pushed_digest": pushed} if push else {})})
        return
    for result in made.results:
        if result.smoke:
            _smoke_table(result.smoke, print_table)
    for result in made.results:
        prev = (
            f" (previous {result.previous_id[:19]} kept as :{result.target.rsplit(':', 1)[-1]}-previous)"
            if result.previous_id and result.promoted
            else ""
        )
        click.echo(f"{result.target} -> {result.image_id[:19]}{prev}")
    if pushed and made.emulated:
        click.echo(f"{own.plan.target} -> manifest list {pushed} ({', '.join(map(made.platform_of, made.results))})")


def _verify_reproducible(ctx: click.Context, paths: list[str], backend: str | None, as_json: bool) -> None:
    from imgbuild.ci.reproduce import verify
    from imgbuild.ui import print_table

    verdicts = verify(paths, settings_of(ctx, backend=backend), lambda line: click.echo(line[:200], err=True))
    if as_json:
        emit_json([v.to_json() for v in verdicts])
    else:
        rows = [
            [v.recipe, v.image, v.promoted[:19], v.rebuilt[:19], "same" if v.same else v.error or "differs"]
            for v in verdicts
        ]
        print_table(["recipe", "image", "promoted", "rebuilt", "verdict"], rows)
    if not all(v.same for v in verdicts):
        sys.exit(1)


def _smoke_table(report: Any, print_table: Any) -> None:
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
    from imgbuild.acting import write_as
    from imgbuild.engine import connect_engine
    from imgbuild.gpu.fleet import check_driver, parse_targets
    from imgbuild.pipeline.smoke import SmokeRequest, fleet_report, run_smoke
    from imgbuild.servers import enforce
    from imgbuild.servers.holds import gpu_claims, quota_check
    from imgbuild.ui import Progress, print_table

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
            gpu_seconds=math.ceil(settings.smoke_gpu_seconds),
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
        _fleet_table(result, print_table)
    else:
        _smoke_table(result, print_table)
    if not result.ok:
        sys.exit(EXIT_FAILED)


def _fleet_table(report: Any, print_table: Any) -> None:
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


@SECTION.command()
@click.argument("paths", nargs=-1)
@click.option("--check", is_flag=True, help="Build nothing; exit 1 when images/ is stale against the recipes.")
@click.option("--dry-run", is_flag=True, help="Say what is stale and why; build nothing.")
@click.option(
    "--plan", "as_plan", is_flag=True,
    help="Build nothing: what a fresh runner must build, in waves a CI system fans out (with --json: its matrices).",
)  # fmt: skip
@click.option(
    "--gitlab-child", type=click.Path(dir_okay=False, path_type=Path),
    help="With --plan: also write the plan as a GitLab child pipeline to this file (docs/ci/gitlab-fanout.yml).",
)  # fmt: skip
@click.option(
    "--gitlab-include", default=".gitlab/imgbuild-runner.yml", show_default=True,
    help="The repository file the child pipeline includes: it defines the .imgbuild-runner job.",
)  # fmt: skip
@click.option("--push", is_flag=True, help="Push built images (and re-push ones the registry lacks).")
@_SIGN_KEY
@click.option(
    "-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Independent images built at once."
)
@click.option("--backend", type=click.Choice(["auto", "buildkit", "sdk"]), help="Build backend.")
@click.option("--report-json", type=click.Path(dir_okay=False, path_type=Path), help="Write a JSON report.")
@click.option("--junit-xml", type=click.Path(dir_okay=False, path_type=Path), help="Write a JUnit XML report.")
@click.option(
    "--verify-reproducible",
    is_flag=True,
    help="Build each recipe again from nothing (reproducibly, not promoted); exit 1 unless its id is the promoted one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def rebuild(
    ctx: click.Context,
    paths: tuple[str, ...],
    check: bool,
    dry_run: bool,
    as_plan: bool,
    gitlab_child: Path | None,
    gitlab_include: str,
    push: bool,
    sign_key: Path | None,
    jobs: int,
    backend: str | None,
    report_json: Path | None,
    junit_xml: Path | None,
    verify_reproducible: bool,
    as_json: bool,
) -> None:
    """Rebuild exactly the images whose inputs changed (recipes/ by default), in dependency order."""
    import threading

    if gitlab_child and not as_plan:
        raise UsageError("--gitlab-child: only with --plan (it writes the plan as a child pipeline)")
    if verify_reproducible:
        _verify_reproducible(ctx, list(paths) or ["recipes"], backend, as_json)
        return

    from imgbuild.ci import rebuild as rb
    from imgbuild.servers.holds import gpu_claims
    from imgbuild.ui import print_table, say

    lock = threading.Lock()

    def log(line: str) -> None:
        with lock:
            say(" ".join(line.split())[:200])

    signer = _signer(sign_key, push or as_plan)  # a plan judges the registry's copies by the key's signature
    settings = settings_of(ctx, backend=backend)
    report = rb.rebuild(
        list(paths) or ["recipes"],
        settings,
        rb.RebuildOptions(
            check=check,
            push=push or as_plan,  # a plan judges as a fresh runner does: against the registry
            jobs=jobs,
            backend=backend,
            dry_run=dry_run or as_plan,
            plan=as_plan,
            signer=signer,
            claims=gpu_claims(settings),
        ),
        log,
    )
    if as_plan:
        _print_plan(report.items, as_json, gitlab_child, gitlab_include)
        return
    _write_reports(report, report_json, junit_xml)
    if as_json:
        emit_json(report.to_json())
    else:
        print_table(
            ["recipe", "image", "status", "why", "time"],
            report.rows(),
            title=f"imgbuild rebuild{' --check' if check else ''}: {len(report.items)} recipe(s), "
            f"{report.seconds:.1f}s",
        )
        for item in report.items:
            if item.status == rb.FAILED and "\n" in item.error:
                say(f"--- {item.name}\n{item.error}")
    _annotate(rb.failure_annotations(report.items))
    if not report.ok:
        sys.exit(EXIT_FAILED)


def _annotate(notes: list[Annotation]) -> None:
    """Under GitHub Actions, each failure also as an annotation at its recipe's file (line and column where known)."""
    from imgbuild.annotation import annotating, workflow_command

    if annotating():
        for note in notes:
            click.echo(workflow_command(note), err=True)


def _write_reports(report: Any, report_json: Path | None, junit_xml: Path | None) -> None:
    from imgbuild.ci import rebuild as rb
    from imgbuild.regular import write_atomic

    if report_json:
        write_atomic(report_json, json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    if junit_xml:
        write_atomic(junit_xml, rb.junit_xml(report.items, report.seconds))


def _print_plan(items: list[Any], as_json: bool, gitlab_child: Path | None = None, include: str = "") -> None:
    from imgbuild.ci import rebuild as rb
    from imgbuild.ci.fanout import plan_document
    from imgbuild.ui import print_table, say

    plan = plan_document(items)
    if gitlab_child:
        from imgbuild.ci.fanout import gitlab_child as child_pipeline
        from imgbuild.regular import write_atomic

        write_atomic(gitlab_child, child_pipeline(plan, include))
    if as_json:
        emit_json(plan)
    else:
        rows = [
            [str(row["wave"]), row["recipe"], row["image"], "; ".join(row["reasons"])]
            for w in plan["waves"]
            for row in w
        ]
        print_table(
            ["wave", "recipe", "image", "why"], rows, title=f"imgbuild rebuild --plan: {plan['images']} to build"
        )
        for bad in plan["invalid"]:
            say(f"imgbuild: {bad['recipe']}: {bad['error'].splitlines()[0] if bad['error'] else 'invalid'}")
    _annotate(rb.failure_annotations([i for i in items if i.name in {bad["recipe"] for bad in plan["invalid"]}]))
    if plan["invalid"]:
        sys.exit(EXIT_FAILED)


@SECTION.command("merge-reports")
@click.argument("reports", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--plan", "plan_file", type=click.Path(dir_okay=False, path_type=Path),
    help="The plan the runners built (rebuild --plan --json): each row is checked against it and the registry.",
)  # fmt: skip
@click.option(
    "--key", type=click.Path(dir_okay=False, path_type=Path),
    help="With --plan: each built image must be signed by this public key (cosign.pub) in the registry.",
)  # fmt: skip
@click.option("--report-json", type=click.Path(dir_okay=False, path_type=Path), help="Write the merged JSON report.")
@click.option("--junit-xml", type=click.Path(dir_okay=False, path_type=Path), help="Write one JUnit XML report.")
@click.option("--json", "as_json", is_flag=True, help="Print the merged report as JSON.")
@click.pass_context
def merge_reports(
    ctx: click.Context,
    reports: tuple[Path, ...],
    plan_file: Path | None,
    key: Path | None,
    report_json: Path | None,
    junit_xml: Path | None,
    as_json: bool,
) -> None:
    """Join the JSON reports of runners that each built part of a `rebuild --plan` into one (exit 1 on a failure,
    a report that cannot be read included). With --plan, a recipe nobody planned, a planned recipe no report names
    and a "built" image the registry's tag does not hold (signed by --key, where given) are failures too."""
    from imgbuild.ci import evidence
    from imgbuild.ci import rebuild as rb
    from imgbuild.ui import print_table, say

    if key is not None and plan_file is None:
        raise UsageError("--key: only with --plan (the built images of the plan are checked in the registry)")
    settings = settings_of(ctx)
    verifier = None
    if key is not None:
        from imgbuild.supply.attest import load_verifier

        verifier = load_verifier(key)
    try:
        plan = evidence.read_plan(plan_file, settings) if plan_file is not None else None
    except UsageError as exc:  # CI still gets a JUnit file: one failure, the plan's
        refused = rb.Item(Path(str(plan_file)), status=rb.FAILED, error=str(exc))
        _write_reports(rb.Report("merged", [refused], 0.0), report_json, junit_xml)
        raise
    items = evidence.merged(list(reports), plan, settings, verifier)
    report = rb.Report("merged", items, sum(i.seconds for i in items))
    _write_reports(report, report_json, junit_xml)
    if as_json:
        emit_json(report.to_json())
    else:
        print_table(
            ["recipe", "image", "status", "why", "time"], report.rows(), title=f"{len(reports)} report(s) merged"
        )
        if plan is None:
            say("imgbuild: without --plan the runners' reports are taken on their word (no plan or registry check)")
    if not report.ok:
        sys.exit(EXIT_FAILED)


@SECTION.command()
@click.argument("paths", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Show the moves; change no file.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@click.pass_context
def bump(ctx: click.Context, paths: tuple[str, ...], dry_run: bool, as_json: bool) -> None:
    """Move recipes with base.follow to the newest matching NGC tag (edits the YAML, re-renders)."""
    from imgbuild.ci.bump import bump_and_render
    from imgbuild.ci.rebuild import discover
    from imgbuild.ui import print_table

    results = bump_and_render(discover(list(paths) or ["recipes"]), settings_of(ctx), dry_run=dry_run)
    if as_json:
        emit_json([r.to_json() for r in results])
        return
    print_table(
        ["recipe", "follows", "from", "to", "moved", "held back (the fleet cannot run it)"],
        [
            [
                r.recipe,
                r.pattern,
                r.current,
                r.newest or "(no match)",
                "yes" if r.changed else "no",
                "; ".join(r.held_back),
            ]
            for r in results
        ],
        title="imgbuild bump" + (" --dry-run" if dry_run else ""),
    )
