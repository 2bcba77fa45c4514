#!/usr/bin/env python3
"""`imgbuild validate` on a recipe whose lock has 1,000, 10,000 and 60,000 lines, side by side with the floor: the
same interpreter doing nothing but start and import imgbuild's CLI. Target: 60,000 lines under 1 s, and time
growing with the lock's length, not its square (round 3's scan took 40-80 s at 60,000 lines).

Needs no test bed:  .venv/bin/python benchmarks/validate_locks.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = (1_000, 10_000, 60_000)
REPEATS = 3


def timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return time.perf_counter() - start


def main() -> None:
    imgbuild = str(Path(sys.executable).parent / "imgbuild")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / ".git").mkdir()
        (project / "recipes").mkdir()
        floor = statistics.median(timed([imgbuild, "--version"], project) for _ in range(REPEATS))
        for size in SIZES:
            recipe = project / "recipes" / f"lock{size}.yaml"
            recipe.write_text(f'name: lock{size}\nbase: {{framework: pytorch, tag: "24.05"}}\npip: [p0]\n')
            lock = recipe.with_name(f"lock{size}.lock.txt")
            lock.write_text("".join(f"p{i}==1.{i % 97}\n" for i in range(size)))
            took = statistics.median(timed([imgbuild, "validate", str(recipe)], project) for _ in range(REPEATS))
            rows.append((size, took, took - floor))
    print(f"imgbuild validate, median of {REPEATS}, {os.cpu_count()} CPUs")
    print(f"{'lock lines':>10} | {'validate s':>10} | {'over start-up s':>15} | {'s per 10k lines':>15}")
    print(f"{'(start-up)':>10} | {floor:10.3f} | {0:15.3f} | {'':>15}")
    for size, took, over in rows:
        print(f"{size:10d} | {took:10.3f} | {over:15.3f} | {over / size * 10_000:15.3f}")
    print("target: 60,000 lines under 1 s:", "met" if rows[-1][1] < 1.0 else f"missed by {rows[-1][1] - 1.0:.2f} s")


if __name__ == "__main__":
    main()
