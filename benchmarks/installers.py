#!/usr/bin/env python3
"""pip against uv as the pip step's installer, side by side in one run, on a realistic ML set: the HF
transformers text-classification example's requirements (transformers, datasets, evaluate, accelerate,
scikit-learn, scipy, sentencepiece, protobuf; tests/realsets) plus tensorboard, on the stand-in PyTorch base.

For each installer: a cold build (build cache pruned, so the pip/uv caches start empty), the same build
again with the layer cache off but the download caches warm, and a rebuild after adding one package. Every
build is `imgbuild build` (render, build, smoke test), which promotes only an image in which the base's torch
is untouched and every added package imports.

    s=$(tests/testbed/up) && eval "$s" && .venv/bin/python benchmarks/installers.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SET = (ROOT / "tests" / "realsets" / "hf-text-classification.txt").read_text()


def docker() -> str:
    return os.environ.get("IMGBUILD_DOCKER_CLI", "/usr/bin/docker")


def build(project: Path, *flags: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "imgbuild", "build", str(project / "recipes" / "set.yaml"), *flags],
        cwd=project,
        capture_output=True,
        text=True,
        env=dict(os.environ, IMGBUILD_USER="imgbuildbench"),
    )
    if proc.returncode != 0:
        sys.exit(f"build failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def measure(installer: str, workdir: Path) -> dict[str, float]:
    project = workdir / installer
    (project / ".git").mkdir(parents=True)
    (project / "recipes").mkdir()
    (project / "recipes" / "set.txt").write_text(SET + "tensorboard\n")
    recipe = project / "recipes" / "set.yaml"
    recipe.write_text(
        f'name: set-{installer}\nbase: {{framework: pytorch, tag: "24.05"}}\n'
        f"pip: {{requirements: set.txt, installer: {installer}}}\n"
    )
    subprocess.run([docker(), "builder", "prune", "-af"], capture_output=True)
    result = {"cold": build(project), "warm caches, no layer cache": build(project, "--no-cache")}
    (project / "recipes" / "set.txt").write_text(SET + "tensorboard\nrich\n")
    result["+1 package"] = build(project)
    subprocess.run([docker(), "rmi", "-f", f"imgbuildbench/set-{installer}:latest"], capture_output=True)
    subprocess.run([docker(), "rmi", "-f", f"imgbuildbench/set-{installer}:latest-previous"], capture_output=True)
    print(f"  {installer}: {result}", file=sys.stderr, flush=True)
    return result


def main() -> None:
    if not os.environ.get("IMGBUILD_NGC_REGISTRY"):
        sys.exit('bring the test bed up first: s=$(tests/testbed/up) && eval "$s"')
    workdir = Path(tempfile.mkdtemp(prefix="imgbuild-installers-"))
    try:
        results = {installer: measure(installer, workdir) for installer in ("pip", "uv")}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nThe HF text-classification set + tensorboard, each time an `imgbuild build` (render, build, smoke), s\n")
    print("| build | pip | uv | uv / pip |")
    print("|---|---|---|---|")
    for key in results["pip"]:
        pip, uv = results["pip"][key], results["uv"][key]
        print(f"| {key} | {pip:.1f} | {uv:.1f} | {uv / pip:.2f} |")


if __name__ == "__main__":
    main()
