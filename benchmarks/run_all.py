#!/usr/bin/env python3
"""Every speed target of the project in one run, each beside the alternative measured in the same run, and
whether it is met: one table (Markdown), after each benchmark's own output.

    s=$(tests/testbed/up) && eval "$s" && .venv/bin/pip install -q hpccm && .venv/bin/python benchmarks/run_all.py

`--no-engine` measures only what needs no engine (render's start against hpccm's generation); every other row then
says it was not measured. The engine benchmarks run one after another (dockerd 20.10's BuildKit panics under
concurrent builds). Each script also runs alone and prints its own tables (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from build_compare import hpccm_command, precompile

ROOT = Path(__file__).resolve().parent.parent
RESEARCH = ROOT / "recipes" / "pytorch-research.yaml"


@dataclass(frozen=True)
class Row:
    """One target: imgbuild's figure, the alternative's from the same run, and the target as a bound."""

    measure: str
    ours: float | None  # None: not measured in this run
    theirs: float | None  # the alternative's (hpccm, a pull, the floor); None where there is none
    unit: str
    bound: float  # met when ours (or ours / theirs, with `ratio`) <= bound
    ratio: bool
    why_not: str = ""  # why a row was not measured

    @property
    def value(self) -> float | None:
        if self.ours is None:
            return None
        if self.ratio:
            return None if not self.theirs else self.ours / self.theirs
        return self.ours

    def cells(self) -> list[str]:
        fmt = "{:.2f}" if self.unit == "s" else "{:.1f}"
        ours = fmt.format(self.ours) + f" {self.unit}" if self.ours is not None else "-"
        theirs = fmt.format(self.theirs) + f" {self.unit}" if self.theirs is not None else "-"
        target = f"<= {self.bound:g}x" if self.ratio else f"<= {self.bound:g} {self.unit}"
        value = self.value
        if value is None:
            return [self.measure, ours, theirs, "-", target, f"not measured: {self.why_not}"]
        shown = f"{value:.2f}x" if self.ratio else ours
        return [self.measure, ours, theirs, shown, target, "met" if value <= self.bound else "missed"]


def script(name: str, *args: str) -> tuple[str, dict]:
    """Run benchmarks/<name>; its tables (stdout) and the figures it writes as JSON on its last stderr line."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args], capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0:
        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip(), json.loads(proc.stderr.strip().splitlines()[-1])


def cpu_and_wall(cmd: list[str], repeats: int) -> tuple[list[float], list[float]]:
    """Wall seconds of each run, and its CPU seconds (user + system: what a busy neighbour does not add)."""
    import resource

    walls, cpus = [], []
    for _ in range(repeats):
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return walls, cpus


def render_rows(repeats: int) -> list[Row]:
    """`imgbuild render` (the base's registry answer cached, as in the edit loop) against hpccm's generation,
    taking turns so a slow minute of a shared machine falls on both."""
    precompile()
    hpccm = hpccm_command()
    with tempfile.TemporaryDirectory() as tmp:
        recipe = Path(tmp) / "hpccm-recipe.py"
        recipe.write_text(
            "Stage0 += baseimage(image='nvcr.io/nvidia/pytorch:24.05-py3', _distro='ubuntu22')\n"
            "Stage0 += packages(ospackages=['git', 'less'])\nStage0 += pip(packages=['einops'], pip='pip3')\n"
            "Stage0 += copy(src='train.py', dest='/workspace/train.py')\n"
        )
        render = [sys.executable, "-m", "imgbuild", "render", str(RESEARCH), "-o", f"{tmp}/ctx"]
        if not os.environ.get("IMGBUILD_NGC_REGISTRY"):
            render.append("--offline")
        subprocess.run(render, check=True, capture_output=True, cwd=ROOT)  # the registry's answer, cached
        ours_wall, ours_cpu, theirs_wall, theirs_cpu = [], [], [], []
        for _ in range(repeats):
            for cmd, wall, cpu in ((render, ours_wall, ours_cpu), (hpccm(recipe), theirs_wall, theirs_cpu)):
                w, c = cpu_and_wall(cmd, 1)
                wall += w
                cpu += c
    median = statistics.median
    return [
        Row("writing the Dockerfile: imgbuild render / hpccm, wall", median(ours_wall), median(theirs_wall), "s",
            1.0, True),
        Row("... the same in CPU time", median(ours_cpu), median(theirs_cpu), "s", 1.0, True),
    ]  # fmt: skip


def compare_rows(engine: bool) -> list[Row]:
    """benchmarks/build_compare.py: the same environment built by imgbuild and by hpccm, taking turns."""
    keys = [
        ("+1 pip package, uv with a lock", "imgbuild (uv, locked)", "add_pip", 0.3),
        ("+1 pip package, uv, no lock", "imgbuild (uv)", "add_pip", 0.5),
        ("cold build, uv", "imgbuild (uv)", "cold", 1.0),
        ("cold build with `imgbuild lock`", "imgbuild (uv, locked)", "cold", 1.0),
        ("copied-file edit (render and build)", "imgbuild (uv)", "change_file", 1.0),
        ("no-op rebuild (keep)", "imgbuild (uv)", "noop", 1.0),
        ("size added over the base (keep)", "imgbuild (uv)", "size_mb", 1.0),
    ]
    if not engine:
        return [Row(label, None, None, "s", bound, True, "--no-engine") for label, _, _, bound in keys]
    print("build comparison, imgbuild and hpccm taking turns (several minutes)...", file=sys.stderr, flush=True)
    table, median = script("build_compare.py")
    print(table)
    return [
        Row(label, median[way][key], median["hpccm"][key], "MB" if key == "size_mb" else "s", bound, True)
        for label, way, key, bound in keys
    ]


def import_check_row(engine: bool) -> Row:
    label = "import check, 100 distributions, against the floor"
    if not engine:
        return Row(label, None, None, "s", 1.5, True, "--no-engine")
    print("the smoke test's import check (a few minutes)...", file=sys.stderr, flush=True)
    table, figures = script("smoke_imports.py", "100")
    print(table)
    return Row(label, figures["server"], figures["floor"], "s", 1.5, True)


def fresh_runner_row(engine: bool) -> Row:
    label = "fresh CI runner, signed: cached rebuild / pull"
    if not engine:
        return Row(label, None, None, "s", 1.3, True, "--no-engine")
    print("a fresh runner's rebuild, signed (several minutes)...", file=sys.stderr, flush=True)
    table, figures = script("ci_fresh_runner.py", "--sign", "--docker-only")
    print(table)
    return Row(label, figures["cached"], figures["pull"], "s", 1.3, True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-engine", action="store_true", help="only what needs no engine (render's start)")
    parser.add_argument("--repeats", type=int, default=11, help="renders timed, each way (default 11)")
    args = parser.parse_args()
    engine = not args.no_engine
    if engine and not os.environ.get("IMGBUILD_NGC_REGISTRY"):
        sys.exit('bring the test bed up first: s=$(tests/testbed/up) && eval "$s" (or --no-engine)')
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = [
        *compare_rows(engine),
        *render_rows(args.repeats),
        import_check_row(engine),
        fresh_runner_row(engine),
        Row("README main command on a fresh machine", None, None, "s", 180, False,
            "needs a machine with nothing cached: sudo benchmarks/fresh_machine.sh, the bed down"),
    ]  # fmt: skip
    print(f"\nTargets, {started}, {os.cpu_count()} cores {platform.machine()}; medians; the alternative measured in "
          "the same run (hpccm; for the import check the floor, one interpreter importing the whole set; for the "
          "fresh runner a pull of the pushed image)\n")  # fmt: skip
    print("| measure | imgbuild | alternative | imgbuild / alternative | target | |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")


if __name__ == "__main__":
    main()
