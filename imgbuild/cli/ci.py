"""CI over many recipes: rebuild what is stale (its plan for fan-out), merge runners' reports, bump followed bases."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from imgbuild.cli.base import SIGN_KEY, Section, emit_json, open_signer, settings_of
from imgbuild.errors import EXIT_FAILED, UsageError

if TYPE_CHECKING:
    from imgbuild.annotation import Annotation
    from imgbuild.ci.rebuild import Report

SECTION = Section("CI over many recipes")


def _verify_reproducible(ctx: click.Context, paths: list[str], backend: str | None, as_json: bool) -> None:
    from imgbuild.ci.reproduce import verify
    from imgbuild.engine import connect_engine
    from imgbuild.ui import print_table, say

    settings = settings_of(ctx, backend=backend)
    verdicts = verify(paths, settings, lambda line: say(line[:200]), connect_engine(settings))
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
@click.option(
    "--gitlab-key", default="cosign.pub", show_default=True,
    help="The repository's public key the child pipeline's last job checks every built image's signature with.",
)  # fmt: skip
@click.option("--push", is_flag=True, help="Push built images (and re-push ones the registry lacks).")
@SIGN_KEY
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
    gitlab_key: str,
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

    from imgbuild.ci import outcome
    from imgbuild.ci import rebuild as rb
    from imgbuild.engine import connect_engine
    from imgbuild.servers.holds import gpu_claims
    from imgbuild.ui import print_table, say

    lock = threading.Lock()

    def log(line: str) -> None:
        with lock:
            say(" ".join(line.split())[:200])

    signer = open_signer(sign_key, push or as_plan)  # a plan judges the registry's copies by the key's signature
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
        None if check else connect_engine(settings),  # --check reads no engine
    )
    if as_plan:
        _print_plan(report.items, as_json, gitlab_child, gitlab_include, gitlab_key)
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
    _annotate(outcome.failure_annotations(report.items))
    if not report.ok:
        sys.exit(EXIT_FAILED)


def _annotate(notes: list[Annotation]) -> None:
    """Under GitHub Actions, each failure also as an annotation at its recipe's file (line and column where known)."""
    from imgbuild.annotation import annotating, workflow_command

    if annotating():
        for note in notes:
            click.echo(workflow_command(note), err=True)


def _write_reports(report: Report, report_json: Path | None, junit_xml: Path | None) -> None:
    from imgbuild.ci import outcome
    from imgbuild.hostio.regular import write_atomic

    if report_json:
        write_atomic(report_json, json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    if junit_xml:
        write_atomic(junit_xml, outcome.junit_xml(report.items, report.seconds))


def _print_plan(
    items: list[Any], as_json: bool, gitlab_child: Path | None = None, include: str = "", key: str = "cosign.pub"
) -> None:
    from imgbuild.ci import outcome
    from imgbuild.ci.fanout import plan_document
    from imgbuild.ui import print_table, say

    plan = plan_document(items)
    if gitlab_child:
        from imgbuild.ci.fanout import gitlab_child as child_pipeline
        from imgbuild.hostio.regular import write_atomic

        write_atomic(gitlab_child, child_pipeline(plan, include, key))
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
    _annotate(outcome.failure_annotations([i for i in items if i.name in {bad["recipe"] for bad in plan["invalid"]}]))
    if plan["invalid"]:
        sys.exit(EXIT_FAILED)


@SECTION.command("merge-reports")
@click.argument("reports", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--plan", "plan_file", type=click.Path(dir_okay=False, path_type=Path),
    help="The plan the runners built (rebuild --plan --json): each row is checked against it and the registry.",
)  # fmt: skip
@click.option(
    "--key", type=click.Path(dir_okay=False, path_type=Path),
    help="With --plan: each built or fresh image must be this key's (cosign.pub) build of the plan: signed, its "
    "signed provenance naming the recipe as it is here, built on what its base holds now.",
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
    (no report at all: each planned recipe) and a "built" image the registry's tag does not hold (signed by --key,
    where given) are failures too."""
    from imgbuild.ci import evidence
    from imgbuild.ci import rebuild as rb
    from imgbuild.ui import print_table, say

    if key is not None and plan_file is None:
        raise UsageError("--key: only with --plan (the built images of the plan are checked in the registry)")
    if not reports and plan_file is None:  # with a plan, no report at all is every planned recipe failed
        raise UsageError("merge-reports: name the runners' reports (REPORT...), or give --plan")
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
