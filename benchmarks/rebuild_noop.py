#!/usr/bin/env python3
"""No-op rebuild: 20 recipes built once, then `imgbuild rebuild` (nothing changed) against a plain loop of
`docker build` over the same 20 rendered contexts, in one run. Target: the no-op rebuild starts no build
and takes under 2 s.

Run after the test bed is up:  s=$(tests/testbed/up) && eval "$s" && .venv/bin/python benchmarks/rebuild_noop.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COUNT = 20
REPEATS = 3


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    if not os.environ.get("IMGBUILD_TESTBED_REGISTRY"):
        sys.exit('bring the test bed up first: s=$(tests/testbed/up) && eval "$s"')
    docker = os.environ.get("IMGBUILD_DOCKER_CLI", "docker")
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "recipes").mkdir()
        for i in range(COUNT):
            (project / "recipes" / f"bench{i:02d}.yaml").write_text(
                f'name: bench{i:02d}\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\n'
                f'user: true\nenv: {{BENCH_INDEX: "{i}"}}\n'
            )
        env = dict(os.environ, IMGBUILD_USER="imgbuildbench", IMGBUILD_CACHE_DIR=str(project / ".cache"))
        imgbuild = [sys.executable, "-m", "imgbuild", "rebuild", "--report-json", str(project / "report.json")]
        first = run([*imgbuild, "--jobs", "2"], project, env)
        noop_times = []
        for _ in range(REPEATS):
            noop_times.append(run(imgbuild, project, env))
            report = json.loads((project / "report.json").read_text())
            built = sum(i["status"] == "built" for i in report["images"])
            assert built == 0, f"a no-op rebuild built {built} image(s)"
        loop_times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            for i in range(COUNT):
                ctx = project / "images" / f"bench{i:02d}"
                subprocess.run(
                    [
                        docker,
                        "build",
                        "-q",
                        "--build-arg",
                        "IMGBUILD_UID=1000",
                        "--build-arg",
                        "IMGBUILD_GID=1000",
                        "-t",
                        f"imgbuildbench/bench{i:02d}:loop",
                        str(ctx),
                    ],
                    env=dict(env, DOCKER_BUILDKIT="1"),
                    check=True,
                    capture_output=True,
                )
            loop_times.append(time.perf_counter() - start)
        subprocess.run(
            [docker, "rmi", *[f"imgbuildbench/bench{i:02d}:{t}" for i in range(COUNT) for t in ("v1", "loop")]],
            capture_output=True,
        )

    header = f"{'scenario (20 recipes, nothing changed)':<44} {'builds started':>14}"
    print(f"{header} {'median s':>9} {'min':>7} {'max':>7}")
    rows = [
        ("imgbuild rebuild (no-op)", 0, noop_times),
        ("plain loop of docker build (all layers cached)", COUNT, loop_times),
    ]
    for name, builds, times in rows:
        print(f"{name:<44} {builds:>14} {statistics.median(times):>9.2f} {min(times):>7.2f} {max(times):>7.2f}")
    print(f"\nfirst build of all 20 with imgbuild rebuild --jobs 2 (build + smoke test each): {first:.1f} s")
    print(f"target: no-op under 2 s -> {'met' if statistics.median(noop_times) < 2 else 'MISSED'}")


if __name__ == "__main__":
    main()
