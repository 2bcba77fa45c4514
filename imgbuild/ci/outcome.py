"""A rebuild's items as a CI system shows them: one JUnit XML report, and annotations on the run's page."""

from __future__ import annotations

from imgbuild import escape
from imgbuild.annotation import Annotation
from imgbuild.ci.rebuild import FAILED, INVALID, SKIPPED, Item


def failure_annotations(items: list[Item]) -> list[Annotation]:
    """What failed, as annotations on the CI run's page: a recipe's problems each at its file, line and column;
    any other failure at the recipe's file, its first line (the cause) as the message."""
    found: list[Annotation] = []
    for item in items:
        if item.status not in (FAILED, INVALID, SKIPPED):
            continue
        if item.problems:
            found += [Annotation.of(p) for p in item.problems]
        else:
            first = (item.error.splitlines() or [item.status])[0]
            found.append(Annotation(f"{item.name}: {first}", file=item.name))
    return found


def junit_xml(items: list[Item], seconds: float) -> str:
    failures = sum(i.status in (FAILED, INVALID) for i in items)
    skipped = sum(i.status == SKIPPED for i in items)
    cases = []
    for item in items:
        name = escape.xml_attr(f"{item.name} ({item.target or 'invalid'})")
        body = ""
        if item.status in (FAILED, INVALID):
            first = item.error.splitlines()[0] if item.error else item.status
            body = f"<failure message={escape.xml_attr(first)}>{escape.xml_text(item.error)}</failure>"
        elif item.status == SKIPPED:
            body = f"<skipped message={escape.xml_attr(item.error)}/>"
        else:
            said = item.status + ": " + ("; ".join(item.reasons) or "up to date")
            body = f"<system-out>{escape.xml_text(said)}</system-out>"
        cases.append(
            f'  <testcase classname="imgbuild.ci.rebuild" name={name} time="{item.seconds:.2f}">{body}</testcase>'
        )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name="imgbuild rebuild" tests="{len(items)}" failures="{failures}" errors="0" '
        f'skipped="{skipped}" time="{seconds:.2f}">\n' + "\n".join(cases) + "\n</testsuite>\n"
    )
