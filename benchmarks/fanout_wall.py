#!/usr/bin/env python3
"""The rebuild fanned out across runners against one runner, side by side in one run (issue 47).

Five recipes in three waves on the test bed (two on the stand-in PyTorch base; two children of one of them; a
grandchild), each with a pip package of its own, so that each build does real work. Each is built from nothing
(its image removed, the whole build cache pruned: a fresh runner), once as one runner would (`imgbuild rebuild
--push` of the whole folder, the images in order) and once job by job as the plan fans them out (`rebuild --plan`,
then `imgbuild rebuild RECIPE --push` per planned image, each on a fresh runner). This machine has one engine and
two cores: the fanned-out jobs run one after another, each timed alone, and the fan-out's wall time is what the
runners would take side by side: the plan's time plus, for each wave, its slowest job (a wave starts when the
one before it ends, as docs/ci/github-actions-fanout.yml runs them; GitLab's `needs` can only start sooner).

    s=$(tests/testbed/up) && eval "$s" && .venv/bin/python benchmarks/fanout_wall.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

RECIPES = {  # name: (builds on, pip package)
    "parent": ("", "einops"),
    "other": ("", "tabulate"),
    "child-a": ("parent", "rich"),
    "child-b": ("parent", "tqdm"),
    "grandchild": ("child-a", "pyyaml"),
}


def docker() -> str:
    return os.environ.get("IMGBUILD_DOCKER_CLI") or shutil.which("docker") or "docker"


def imgbuild(*args: str, cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "imgbuild", *args], cwd=cwd, capture_output=True, text=True)
    return time.monotonic() - start, proc


def fresh(targets: list[str]) -> None:
    subprocess.run([docker(), "rmi", "-f", *targets], capture_output=True)
    subprocess.run([docker(), "builder", "prune", "-af"], capture_output=True)


def project(tmp: Path, registry: str, run: str) -> list[str]:
    (tmp / ".git").mkdir()
    (tmp / "recipes").mkdir()
    targets = []
    for name, (parent, package) in RECIPES.items():
        base = f'{{image: "{registry}/fanout-{run}/{parent}:v1"}}' if parent else '{framework: pytorch, tag: "24.05"}'
        (tmp / "recipes" / f"{name}.yaml").write_text(
            f"name: {name}\nimage: {registry}/fanout-{run}/{name}\ntag: v1\nbase: {base}\npip: [{package}]\n"
        )
        targets.append(f"{registry}/fanout-{run}/{name}:v1")
    return targets


def main() -> int:
    registry = os.environ.get("IMGBUILD_TESTBED_REGISTRY")
    if not registry:
        sys.exit('bring the bed up first: s=$(tests/testbed/up) && eval "$s"')
    rows = []
    with tempfile.TemporaryDirectory(prefix="fanout-one-") as one, tempfile.TemporaryDirectory(prefix="fanout-") as fan:
        targets = project(Path(one), registry, uuid.uuid4().hex[:8])
        fresh(targets)
        single, proc = imgbuild("rebuild", "--push", cwd=Path(one))
        if proc.returncode:
            sys.exit(f"one runner failed:\n{proc.stderr[-2000:]}{proc.stdout[-2000:]}")
        rows.append(("one runner: rebuild --push recipes/", f"{single:.1f}", "5 images, one after another"))
        fan_targets = project(Path(fan), registry, uuid.uuid4().hex[:8])
        fresh(fan_targets)
        planned, proc = imgbuild("rebuild", "--plan", "--json", cwd=Path(fan))
        if proc.returncode:
            sys.exit(f"the plan failed:\n{proc.stderr[-2000:]}")
        plan = json.loads(proc.stdout)
        wall, detail = planned, []
        for n, wave in enumerate(plan["waves"], 1):
            times = []
            for row in wave:
                fresh(fan_targets)
                took, proc = imgbuild("rebuild", row["recipe"], "--push", cwd=Path(fan))
                if proc.returncode:
                    sys.exit(f"{row['recipe']} failed:\n{proc.stderr[-2000:]}")
                times.append(took)
            wall += max(times)
            detail.append(f"wave {n}: " + ", ".join(f"{t:.1f}" for t in times))
        rows.append(("plan", f"{planned:.1f}", "rebuild --plan --json, judged against the registry"))
        rows.append(("fanned out: plan + slowest job per wave", f"{wall:.1f}", "; ".join(detail)))
        subprocess.run([docker(), "rmi", "-f", *targets, *fan_targets], capture_output=True)
    print("| way | seconds | what |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\nfanned out / one runner: {wall / single:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
