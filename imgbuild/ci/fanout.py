"""`rebuild` as a plan a CI system fans out across its runners (GitHub Actions matrices, GitLab child pipelines).

`imgbuild rebuild --plan` judges every recipe as a fresh runner would (against the registry, building nothing)
and groups what must be built into waves: an image is in the wave after the last of the images it builds on
that are rebuilt too (a child of a rebuilt parent is due even where its own inputs did not change: its base
moves). Each runner then builds one planned recipe (`imgbuild rebuild RECIPE --push`), wave by wave, and
`imgbuild merge-reports` joins the runners' JSON reports into one report and one JUnit file.

Pure: the plan is made from the items a dry run judged; the reports are read as untrusted JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgbuild import boundedjson
from imgbuild.ci.rebuild import BUILT, FAILED, FRESH, INVALID, SKIPPED, STALE, Item
from imgbuild.errors import UsageError
from imgbuild.text import unsafe_character

#: A plan's or a report's size, past which it is not one imgbuild wrote (a lab has tens of recipes).
MAX_IMAGES = 5000
STATUSES = (FRESH, STALE, BUILT, FAILED, SKIPPED, INVALID)


@dataclass(frozen=True)
class Planned:
    item: Item
    wave: int  # 1 for the first wave
    reasons: tuple[str, ...]


def waves(items: list[Item]) -> list[list[Planned]]:
    """What must be built, wave by wave: a stale image, and every image built on one that is rebuilt (its base
    moves), each in the wave after the last rebuilt image it builds on. Linear in the graph, and iterative: a
    chain of any length is no recursion to exhaust."""
    by_target = {item.target: item for item in items if item.target}
    judged: dict[str, tuple[int, tuple[str, ...]]] = {}
    for item in _parents_first(items, by_target):
        after, reasons = 0, list(item.reasons) if item.status == STALE else []
        for dep in item.deps:
            parent_wave = judged.get(by_target[dep].name, (0, ()))[0] if dep in by_target else 0
            if parent_wave:
                after = max(after, parent_wave)
                reasons.append(f"builds on {dep}, rebuilt in wave {parent_wave}")
        due = item.status == STALE or after > 0
        judged[item.name] = (after + 1, tuple(reasons)) if due else (0, ())
    grouped: dict[int, list[Planned]] = {}
    for item in items:
        wave, why = judged[item.name]
        if wave:
            grouped.setdefault(wave, []).append(Planned(item, wave, why))
    return [grouped[n] for n in sorted(grouped)]


def _parents_first(items: list[Item], by_target: dict[str, Item]) -> list[Item]:
    """`items`, each after the images it builds on (a depth-first walk with a stack of its own; a cycle, refused
    when the graph was loaded, cannot loop here either: an item is entered once)."""
    entered: set[str] = set()
    order: list[Item] = []
    for root in items:
        if root.name in entered:
            continue
        entered.add(root.name)
        stack = [(root, iter(root.deps))]
        while stack:
            node, deps = stack[-1]
            parent = next((by_target[d] for d in deps if d in by_target and by_target[d].name not in entered), None)
            if parent is None:
                stack.pop()
                order.append(node)
            else:
                entered.add(parent.name)
                stack.append((parent, iter(parent.deps)))
    return order


def plan_document(items: list[Item]) -> dict[str, Any]:
    """The plan as JSON: its waves, each as a matrix a CI system takes as it is (GitHub: `fromJSON(...)` in
    `strategy.matrix`), and the recipes that could not be judged (the plan fails on those)."""
    planned = waves(items)
    due = {p.item.name for wave in planned for p in wave}
    by_target = {p.item.target: p.item.name for wave in planned for p in wave}
    rows = [
        [
            {
                "recipe": p.item.name,
                "image": p.item.target,
                "wave": p.wave,
                "reasons": list(p.reasons),
                "after": [by_target[d] for d in p.item.deps if d in by_target],  # planned images it builds on
            }
            for p in wave
        ]
        for wave in planned
    ]
    return {
        "waves": rows,
        "matrix": [{"include": [{"recipe": row["recipe"]} for row in wave]} for wave in rows],
        "images": sum(len(wave) for wave in rows),
        # a recipe that could not be judged because its base is an image this plan builds first is planned, not
        # invalid: it is judged again on its runner, after that wave
        "invalid": [
            {"recipe": i.name, "error": i.error} for i in items if i.status in (FAILED, INVALID) and i.name not in due
        ],
    }


def read_json(path: Path) -> Any:
    """A JSON file another job wrote (a report, a plan), read as untrusted input: bounded, a regular file, one line
    naming the file where it is not JSON (UsageError: exit 2)."""
    from imgbuild.hostio.regular import read_named

    shown = str(path)
    try:
        return boundedjson.loads(read_named(path, 16 << 20), shown)
    except (ValueError, OSError) as exc:  # NotJson is a ValueError; read_named says why a file is refused
        why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        raise UsageError(why if why.startswith(shown) else f"{shown}: {why}") from None


def read_report(path: Path) -> list[Item]:
    """The images of one runner's `--report-json`, checked as untrusted input: one line naming the file and the
    field that is wrong (UsageError: exit 2)."""
    shown = str(path)
    data = read_json(path)
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list) or len(images) > MAX_IMAGES:
        raise UsageError(f"{shown}: not a report of imgbuild rebuild (no list of at most {MAX_IMAGES} images)")
    return [_item(row, f"{shown}: images[{n}]") for n, row in enumerate(images)]


def _item(row: Any, where: str) -> Item:
    if not isinstance(row, dict):
        raise UsageError(f"{where}: not an object")

    def text(key: str, limit: int = 4096) -> str:
        value = row.get(key, "")
        # control characters (C0 and C1), bidi controls and separators refused as everywhere (imgbuild.text);
        # an error may hold several lines
        lines = value.split("\n") if isinstance(value, str) and key == "error" else [value]
        if not isinstance(value, str) or len(value) > limit or any(unsafe_character(line) for line in lines):
            raise UsageError(f"{where}.{key}: not a line of text")
        return value

    status = text("status")
    if status not in STATUSES:
        raise UsageError(f"{where}.status: {status[:40]!r} is not one of {', '.join(STATUSES)}")
    reasons = row.get("reasons", [])
    if not isinstance(reasons, list) or len(reasons) > 100:
        raise UsageError(f"{where}.reasons: not a list of lines")
    if not all(isinstance(r, str) and not unsafe_character(r) for r in reasons):
        raise UsageError(f"{where}.reasons: not a list of lines")
    seconds = row.get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < 10**7:
        raise UsageError(f"{where}.seconds: not a number of seconds")
    recipe = text("recipe", 1024)
    if not recipe or "\n" in recipe:
        raise UsageError(f"{where}.recipe: not a recipe's path")
    item = Item(Path(recipe), target=text("image", 1024), status=status, error=text("error", 65536))
    item.reasons, item.seconds = [r[:500] for r in reasons], float(seconds)
    item.image_id, item.pushed = text("image_id", 200), text("pushed_digest", 200)
    return item


#: When two reports name one recipe (a retried runner): the outcome that says most wins.
_WEIGHT = {FAILED: 5, INVALID: 5, BUILT: 4, SKIPPED: 3, STALE: 2, FRESH: 1}


def merge(reports: list[list[Item]]) -> list[Item]:
    """One list of images from the runners' reports, in the order first seen; a recipe in several reports keeps
    the outcome that says most (failed over built over fresh)."""
    merged: dict[str, Item] = {}
    for items in reports:
        for item in items:
            kept = merged.get(item.name)
            if kept is None or _WEIGHT[item.status] > _WEIGHT[kept.status]:
                merged[item.name] = item
    return list(merged.values())


#: The file a child pipeline includes: a relative path of the repository (GitLab's `include: local`).
INCLUDE_RE = re.compile(r"[A-Za-z0-9_.-]{1,100}(?:/[A-Za-z0-9_.-]{1,100}){0,15}")


def gitlab_child(plan: dict[str, Any], include: str, key: str = "cosign.pub") -> str:
    """The plan as a GitLab dynamic child pipeline: a stage per wave, a job per image that `needs` the jobs of the
    images it builds on (so it starts as soon as they are pushed), each extending the `.imgbuild-runner` job that
    `include` (a file of the repository) defines for the site (its tags, image, registry login), and a last job
    that merges the runners' reports against the plan itself (written into that job: a recipe nobody planned, a
    planned one no report names, an image the registry does not hold or `key` did not sign, each a failed row).
    Recipe paths are quoted for the shell: a file name is data, never code."""
    import shlex

    import yaml

    for option, path in (("--gitlab-include", include), ("--gitlab-key", key)):
        if not INCLUDE_RE.fullmatch(path) or ".." in path.split("/"):
            raise UsageError(f"{option} {path[:80]!r}: a file of the repository, as a relative path (a/b.yml)")
    rows = [row for wave in plan["waves"] for row in wave]
    names = {row["recipe"]: f"build {n}: {row['recipe'][:200]}" for n, row in enumerate(rows, 1)}  # GitLab: 255
    jobs: dict[str, Any] = {}
    for n, row in enumerate(rows, 1):
        jobs[names[row["recipe"]]] = {
            "extends": ".imgbuild-runner",
            "stage": f"wave-{row['wave']}",
            "needs": [names[a] for a in row["after"] if a in names],
            "script": [f"imgbuild rebuild {shlex.quote(row['recipe'])} --push --report-json report-{n}.json"],
            "artifacts": {"when": "always", "paths": [f"report-{n}.json"]},
        }
    reports = [f"report-{n}.json" for n in range(1, len(rows) + 1)]
    stages = [f"wave-{n}" for n in range(1, len(plan["waves"]) + 1)]
    merge = " ".join(
        ["imgbuild merge-reports", *reports, f"--plan plan.json --key {key}"]
        + ["--junit-xml rebuild.xml --report-json rebuild.json"]
    )
    # what merge-reports checks against: the plan's rows as planned (JSON of letters, digits and . _ / - : @)
    fields = ("recipe", "image", "wave", "after")
    planned = {"waves": [[{k: row[k] for k in fields} for row in wave] for wave in plan["waves"]]}
    jobs["report"] = {
        "extends": ".imgbuild-runner",
        "stage": "report",
        "when": "always",  # in the last stage: it has every earlier job's artifacts (no `needs`: no 50-job limit)
        "script": [f"printf '%s\\n' {shlex.quote(json.dumps(planned))} > plan.json", merge]
        if reports
        else ["echo 'imgbuild: nothing to build'"],
        "artifacts": {"when": "always", "paths": ["rebuild.json"], "reports": {"junit": "rebuild.xml"}},
    }
    document = {"include": [{"local": include}], "stages": [*stages, "report"], **jobs}
    header = "# imgbuild rebuild --plan --gitlab-child: generated; a child pipeline of one run, never edited\n"
    return header + yaml.safe_dump(document, sort_keys=False, width=1000)
