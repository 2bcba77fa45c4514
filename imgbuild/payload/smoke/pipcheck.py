"""The `pip check` check: problems the recipe's layers added over the base's own, less those the recipe accepts."""

from __future__ import annotations

import os
import subprocess
import sys

from .dists import _canonical, top_level_modules
from .report import Fail, Skip, Warn

PIP_CHECK_BASELINE = "/opt/imgbuild/pip-check.base"  # `pip check` of the base, written by the Dockerfile


def new_problems(current: list, baseline: list | None) -> list:
    """`pip check` lines the image has and its base did not."""
    if baseline is None:
        return list(current)
    seen = set(baseline)
    return [line for line in current if line not in seen]


def module_owners(module_name: str) -> list:
    """`name version` of every installed distribution that provides the top-level module."""
    import importlib.metadata as md

    owners = set()
    for dist in md.distributions():
        top = dist.read_text("top_level.txt")
        if module_name in top_level_modules(None if top else dist.files, top):
            owners.add(f"{dist.metadata['Name']} {dist.version}")
    return sorted(owners)


def _pip_check_lines(text: str) -> list:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("No broken requirements")]


def check_pip() -> dict:
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    if "No module named pip" in proc.stderr:
        raise Skip("pip is not installed in the image")
    lines = _pip_check_lines(proc.stdout + proc.stderr) if proc.returncode != 0 else []
    try:
        with open(PIP_CHECK_BASELINE, encoding="utf-8") as handle:
            baseline = _pip_check_lines(handle.read())
    except OSError:
        baseline = None
    added = new_problems(lines, baseline)
    added, accepted = accepted_pip_check(added, os.environ.get("IMGBUILD_SMOKE_ACCEPT_PIP_CHECK", ""))
    if added and baseline is not None:
        first = sorted({_canonical(line.split()[0]) for line in added})
        raise Fail(
            f"pip check found {len(added)} new problem(s): " + "; ".join(added[:3]) + " (if the image works as it "
            f"is, as its smoke.run shows, accept them: smoke.accept_pip_check: [{', '.join(first)}])",
            {"problems": added},
        )
    if added:  # no baseline: an image imgbuild did not build; nothing says which layer broke it
        raise Warn(f"pip check found {len(added)} problem(s) (no baseline of the base): " + "; ".join(added[:3]))
    if accepted:  # said, never dropped: the report keeps what the recipe accepted
        return {"accepted": accepted, "reason": f"{len(accepted)} problem(s) accepted by smoke.accept_pip_check"}
    if lines:
        return {"base_problems": lines, "reason": f"nothing new ({len(lines)} problem(s) the base already had)"}
    return {"reason": "no broken requirements"}


def accepted_pip_check(lines: list, accepted: str) -> tuple:
    """(lines not accepted, lines accepted): a line is accepted when the distribution it is about (its first
    word, as `pip check` writes it) is one the recipe names in smoke.accept_pip_check."""
    names = {_canonical(name) for name in accepted.split()}
    kept: list = []
    taken: list = []
    for line in lines:
        (taken if line.split() and _canonical(line.split()[0]) in names else kept).append(line)
    return kept, taken
