#!/usr/bin/env python3
"""Every real requirement set (tests/realsets: ten projects and four known conflicts) built on the test
bed's stand-in bases, one after another, and how each ended against what tests/realsets/sets.yaml expects:
a built image in which every added package imports, or one line naming the package and the cause.

    s=$(tests/testbed/up) && eval "$s" && .venv/bin/python benchmarks/realsets.py [--size small|heavy] [NAME ...]

Columns: the set, its base, the expected ending, the exit code, seconds, whether it ended as expected, and
the line it ended with. The heavy sets download GBs of wheels (ultralytics, diffusers, vLLM): minutes each.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.realsets import load  # noqa: E402


def last_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("imgbuild: ") or " -> " in ln]
    return (lines[-1] if lines else err.strip().splitlines()[-1] if err.strip() else "")[:110]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "heavy"])
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    sets = [
        s
        for s in load().values()
        if (not args.size or s.size == args.size) and (not args.names or s.name in args.names)
    ]
    rows = []
    for realset in sets:
        with tempfile.TemporaryDirectory(prefix=f"realset-{realset.name}-") as tmp:
            recipe = realset.stage(Path(tmp))
            start = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "imgbuild", "build", str(recipe)], cwd=tmp, capture_output=True, text=True
            )
            took = time.monotonic() - start
            problems = realset.problems(proc.returncode, proc.stderr + proc.stdout, Path(tmp))
        ended = last_line(proc.stderr + proc.stdout)
        rows.append(
            (
                realset.name,
                realset.size,
                realset.expect[:40],
                str(proc.returncode),
                f"{took:.0f}",
                "yes" if not problems else "NO: " + "; ".join(problems)[:60],
                ended,
            )
        )
        print(f"{realset.name}: exit {proc.returncode} in {took:.0f} s", file=sys.stderr, flush=True)
    header = ("set", "size", "expected", "exit", "s", "as expected", "ended with")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0 if all(r[5] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
