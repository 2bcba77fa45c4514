#!/usr/bin/env python3
"""The smoke test's import check of ~100 added distributions, side by side in one run, inside the test bed's
PyTorch base (torch and numpy, as NGC's): each distribution's modules import torch and numpy, as most of what
people add to an NGC image does.

  (a) one interpreter per distribution (the check before issue 48: each pays for torch again);
  (b) the import server (issue 48: torch and numpy once, a forked child per distribution);
  (c) the floor: one interpreter importing the whole set (no isolation at all).

Target: (b) at most 15 s for ~100 distributions on the 2-core machine.

Needs the bed (tests/testbed/up) and docker:  .venv/bin/python benchmarks/smoke_imports.py [COUNT]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / "imgbuild" / "payload" / "smoke"  # the in-image smoke package, mounted beside its siblings
IMAGE = f"{os.environ.get('IMGBUILD_TESTBED_REGISTRY', '127.0.0.1:5000')}/nvidia/pytorch:24.05-py3"

INSIDE = r"""
import json, sys, time
sys.path.insert(0, "/bench/payload")
from smoke import importing as s
count = int(sys.argv[1])
work = [("dist%03d" % i, "1.0", ["mod%03d" % i]) for i in range(count)]
workers = s.import_workers()
rows = []
t = time.monotonic()
budget = s.import_budget(120, s.framework_seconds(120))
a = s.import_all(work, budget, workers)
rows.append(("one interpreter per distribution", time.monotonic() - t, sum(1 for r in a if not r)))
t = time.monotonic()
b = s.import_served(work, 120, workers, "pytorch")
rows.append(("import server (torch once, a fork each)", time.monotonic() - t, sum(1 for r in b or [] if not r)))
t = time.monotonic()
import subprocess
subprocess.run([sys.executable, "-c", "import " + ", ".join(m for _, _, ms in work for m in ms)], check=True)
rows.append(("floor: one interpreter, the whole set", time.monotonic() - t, count))
print(json.dumps({"rows": rows, "workers": workers, "served": b is not None}))
"""


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with tempfile.TemporaryDirectory() as tmp:
        mods = Path(tmp) / "mods"
        mods.mkdir()
        for i in range(count):  # a package built on the framework: it imports torch and numpy, then itself
            (mods / f"mod{i:03d}.py").write_text(f"import numpy, torch\nVALUE = {i}\n")
        done = subprocess.run(
            [
                "docker", "run", "--rm", "--cpus", "2", "-e", "PYTHONPATH=/bench/mods",
                "-v", f"{PAYLOAD.parent}:/bench/payload:ro", "-v", f"{mods}:/bench/mods:ro",
                "--entrypoint", "python3", IMAGE, "-c", INSIDE, str(count),
            ],
            capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
    if done.returncode != 0:
        sys.exit(done.stderr[-2000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"import check of {count} added distributions in {IMAGE} ({result['workers']} workers)")
    print(f"{'way':44} {'seconds':>8} {'imported':>9}")
    for way, seconds, ok in result["rows"]:
        print(f"{way:44} {seconds:8.1f} {ok:9d}")
    if not result["served"]:
        print("the import server refused here (Python threads after the preload): the check fell back to (a)")
    seconds = [row[1] for row in result["rows"]]  # (a), (b), (c): for benchmarks/run_all.py
    print(json.dumps({"each": seconds[0], "server": seconds[1], "floor": seconds[2]}), file=sys.stderr)


if __name__ == "__main__":
    main()
