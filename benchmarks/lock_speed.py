#!/usr/bin/env python3
"""`imgbuild lock` of two real requirement sets (tests/realsets: HF text classification, 58 distributions; notebook
tools, 115), four ways side by side in one run: pip with no cache (how every lock ran before: pip's cache off, a
fresh container), pip with the caller's cache volume, uv from nothing (the volume removed: uv itself is fetched
too), and uv warm (the volume as the last lock left it). Each lock resolves afresh (`--upgrade`), so no old pin
helps. Target: a 60-package set locked in at most 30 s warm.

Needs the test bed:  s=$(tests/testbed/up) && eval "$s" && .venv/bin/python benchmarks/lock_speed.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SETS = ("hf-text-classification", "notebook-tools")
WARM_REPEATS = 3


def engine(*args: str) -> None:
    cli = os.environ.get("IMGBUILD_DOCKER_CLI") or "docker"
    subprocess.run([cli, *args], capture_output=True, check=False)


def lock(imgbuild: str, recipe: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run([imgbuild, "lock", "--upgrade", "--json", str(recipe)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"imgbuild lock {recipe.name}: {done.stderr.strip()[-2000:]}")
    return time.perf_counter() - start


def stage(project: Path, name: str, installer: str) -> tuple[Path, int]:
    recipes = project / "recipes"
    recipes.mkdir(parents=True, exist_ok=True)
    for path in (ROOT / "tests" / "realsets").glob(f"{name}.*"):
        shutil.copyfile(path, recipes / path.name)
    recipe = recipes / f"{name}.yaml"
    data = yaml.safe_load(recipe.read_text())
    pip = data["pip"] if isinstance(data["pip"], dict) else {"packages": data["pip"]}
    data["pip"] = {**pip, "installer": installer}
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    count = sum(1 for line in recipe.with_name(f"{name}.lock.txt").read_text().splitlines() if "==" in line)
    return recipe, count


def main() -> None:
    imgbuild = str(Path(sys.executable).parent / "imgbuild")
    volume = f"imgbuild-lock-cache-{os.getuid()}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in SETS:
            project = Path(tmp) / name
            (project / ".git").mkdir(parents=True)
            times: dict[str, str] = {}
            for installer in ("pip", "uv"):
                recipe, count = stage(project, name, installer)
                engine("volume", "rm", "-f", volume)
                times[f"{installer}, cold"] = f"{lock(imgbuild, recipe):.1f}"
                warm = [lock(imgbuild, recipe) for _ in range(WARM_REPEATS)]
                times[f"{installer}, warm"] = f"{statistics.median(warm):.1f} ({min(warm):.1f}-{max(warm):.1f})"
            rows.append((f"{name} ({count} locked)", times))
    ways = list(rows[0][1])
    print(f"imgbuild lock --upgrade, seconds; warm: median (min-max) of {WARM_REPEATS}; {os.cpu_count()} CPUs")
    print("| set | " + " | ".join(ways) + " |")
    print("|---|" + "---|" * len(ways))
    for label, times in rows:
        print(f"| {label} | " + " | ".join(times[w] for w in ways) + " |")
    print("pip, cold is how every lock ran before (pip's cache off, nothing kept between locks).")
    print("target: a 60-package set at most 30 s warm")


if __name__ == "__main__":
    main()
