#!/usr/bin/env python3
"""The same environment five ways, side by side in one run: imgbuild's rendered Dockerfile (pip; uv; uv with a
lock, `imgbuild lock` timed with the cold build), hpccm's
Dockerfile for the equivalent recipe, and a hand-written Dockerfile as the NGC how-tos write it.

Environment: the test bed's stand-in PyTorch base + 6 pip packages + 3 apt packages + one copied file.
Measured for each (median, min, max over REPEATS): cold build (build cache pruned), size added over the
base, warm rebuild after adding one pip package, warm rebuild after changing the copied file (5 times a
repetition; also the part of it spent writing the Dockerfile), no-op rebuild. The ways take turns, repetition
by repetition. All build with the same BuildKit CLI. Needs `pip install hpccm` (benchmarks only).

    s=$(tests/testbed/up) && eval "$s" && .venv/bin/pip install -q hpccm && .venv/bin/python benchmarks/build_compare.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIP = ["einops", "tqdm", "rich", "tabulate", "pyyaml", "click"]
EXTRA_PIP = "toolz"
APT = ["jq", "less", "tmux"]
REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
FILE_CHANGES = 5  # file-change rebuilds per repetition
TRAIN = "import einops, torch\nprint('step', {n})\n"


def docker() -> str:
    return os.environ.get("IMGBUILD_DOCKER_CLI", "/usr/bin/docker")


def base_ref() -> str:
    return f"{os.environ['IMGBUILD_NGC_REGISTRY']}/nvidia/pytorch:24.05-py3"


def ca_bundle() -> str | None:
    return os.environ.get("IMGBUILD_PIP_CA_BUNDLE")


# --- the ways -------------------------------------------------------------------------------------


def write_imgbuild(ctx: Path, pip: list[str], n: int, installer: str = "pip", locked: bool = False) -> list[str]:
    project = ctx.parent / f"{ctx.name}-recipe"
    (project / "files").mkdir(parents=True, exist_ok=True)
    (project / "files" / "train.py").write_text(TRAIN.format(n=n))
    (project / "bench.yaml").write_text(
        'name: bench\nbase: {framework: pytorch, tag: "24.05"}\n'
        f"apt: {json.dumps(APT)}\npip: {{packages: {json.dumps(pip)}, installer: {installer}}}\n"
        "files: [{src: files/train.py, dest: /workspace/train.py}]\n"
    )
    if locked and not (project / "bench.lock.txt").exists():
        # The documented loop: lock once (committed with the recipe), then edit. Timed with the cold build.
        subprocess.run(
            [sys.executable, "-m", "imgbuild", "lock", str(project / "bench.yaml")], check=True, capture_output=True
        )
    subprocess.run(
        [sys.executable, "-m", "imgbuild", "render", str(project / "bench.yaml"), "-o", str(ctx)],
        check=True,
        capture_output=True,
    )
    return [f"--secret=id=imgbuild-ca.crt,src={ca_bundle()}"] if ca_bundle() else []


def _ca_lines(ctx: Path) -> str:
    """Hand-written and hpccm images behind a TLS-intercepting proxy bake the CA in (how-tos do this)."""
    if not ca_bundle():
        return ""
    shutil.copy(ca_bundle(), ctx / "proxy-ca.crt")
    return "COPY proxy-ca.crt /usr/local/share/proxy-ca.crt\nENV PIP_CERT=/usr/local/share/proxy-ca.crt\n"


def write_hpccm(ctx: Path, pip: list[str], n: int) -> list[str]:
    ctx.mkdir(parents=True, exist_ok=True)
    recipe = ctx.parent / f"{ctx.name}-hpccm.py"
    recipe.write_text(
        "Stage0 += baseimage(image=USERARG.get('base'), _distro='ubuntu22')\n"
        f"Stage0 += packages(ospackages={APT!r})\n"
        f"Stage0 += pip(packages={pip!r}, pip='pip3', ospackages=[])\n"
        "Stage0 += copy(src='train.py', dest='/workspace/train.py')\n"
    )
    hpccm_dockerfile(recipe, ctx)
    (ctx / "train.py").write_text(TRAIN.format(n=n))
    return []


def hpccm_command() -> Callable[[Path], list[str]]:
    """The command line that has hpccm write the Dockerfile of a recipe (its generation step)."""
    hpccm = shutil.which("hpccm", path=str(Path(sys.executable).parent)) or shutil.which("hpccm")
    if not hpccm:
        sys.exit("hpccm is not installed: .venv/bin/pip install hpccm")
    return lambda recipe: [hpccm, "--recipe", str(recipe), "--format", "docker"]


def precompile() -> None:
    """imgbuild's modules byte-compiled, as installing its wheel leaves them (pip compiles them) and as the first
    run leaves them: with PYTHONDONTWRITEBYTECODE set and no `__pycache__`, every timed run would compile
    imgbuild afresh (about 0.15 s a run here), a cost no installed copy pays and hpccm's installed one never
    does."""
    subprocess.run(
        [sys.executable, "-c", "import compileall, imgbuild, pathlib; "
         "compileall.compile_dir(pathlib.Path(imgbuild.__file__).parent, quiet=1)"],
        check=True, cwd=ROOT,
    )  # fmt: skip


def hpccm_dockerfile(recipe: Path, ctx: Path) -> None:
    """`ctx/Dockerfile` from the hpccm recipe at `recipe`, on the stand-in base (the proxy's CA baked in)."""
    dockerfile = subprocess.run(
        [*hpccm_command()(recipe), "--userarg", f"base={base_ref()}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    first, rest = dockerfile.split("\n", 1)
    (ctx / "Dockerfile").write_text(first + "\n" + _ca_lines(ctx) + rest)


def write_handwritten(ctx: Path, pip: list[str], n: int) -> list[str]:
    ctx.mkdir(parents=True, exist_ok=True)
    (ctx / "Dockerfile").write_text(
        f"FROM {base_ref()}\n"
        + _ca_lines(ctx)
        + "RUN apt-get update && apt-get install -y "
        + " ".join(APT)
        + "\n"
        + "RUN pip install "
        + " ".join(pip)
        + "\n"
        + "COPY train.py /workspace/train.py\n"
        + "WORKDIR /workspace\n"
    )
    (ctx / "train.py").write_text(TRAIN.format(n=n))
    return []


def write_imgbuild_uv(ctx: Path, pip: list[str], n: int) -> list[str]:
    return write_imgbuild(ctx, pip, n, installer="uv")


def write_imgbuild_locked(ctx: Path, pip: list[str], n: int) -> list[str]:
    return write_imgbuild(ctx, pip, n, installer="uv", locked=True)


WAYS: dict[str, Callable[[Path, list[str], int], list[str]]] = {
    "imgbuild": write_imgbuild,
    "imgbuild (uv)": write_imgbuild_uv,
    "imgbuild (uv, locked)": write_imgbuild_locked,
    "hpccm": write_hpccm,
    "hand-written": write_handwritten,
}


# --- measuring ------------------------------------------------------------------------------------------


def build(ctx: Path, tag: str, extra: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [docker(), "build", "-q", *extra, "-t", tag, str(ctx)],
        capture_output=True,
        text=True,
        env=dict(os.environ, DOCKER_BUILDKIT="1"),
    )
    if proc.returncode != 0:
        sys.exit(f"build of {ctx} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def size(ref: str) -> int:
    out = subprocess.run(
        [docker(), "image", "inspect", "-f", "{{.Size}}", ref], check=True, capture_output=True, text=True
    ).stdout
    return int(out.strip())


METRICS = ("cold", "size_mb", "add_pip", "change_file", "change_file_gen", "noop")


def measure_once(way: str, workdir: Path, rep: int, results: dict[str, list[float]]) -> None:
    """One repetition of every measurement for one way, appended to `results`."""
    write = WAYS[way]
    slug = re.sub(r"[^a-z0-9]+", "-", way).strip("-")
    tag = f"imgbuildbench/{slug}:bench"
    ctx = workdir / f"{slug}-{rep}"
    subprocess.run([docker(), "rmi", "-f", tag], capture_output=True)
    subprocess.run([docker(), "builder", "prune", "-af"], capture_output=True)
    start = time.perf_counter()
    extra = write(ctx, PIP, 1)
    render_s = time.perf_counter() - start
    results["cold"].append(render_s + build(ctx, tag, extra))
    results["size_mb"].append((size(tag) - size(base_ref())) / 1e6)
    results["noop"].append(build(ctx, tag, extra))

    start = time.perf_counter()
    extra = write(ctx, [*PIP, EXTRA_PIP], 1)
    results["add_pip"].append(time.perf_counter() - start + build(ctx, tag, extra))
    build(ctx, tag, write(ctx, PIP, 1))  # back to the original (not timed)

    for n in range(2, 2 + FILE_CHANGES):  # sub-second: several samples a repetition
        start = time.perf_counter()
        extra = write(ctx, PIP, n)
        results["change_file_gen"].append(time.perf_counter() - start)
        results["change_file"].append(results["change_file_gen"][-1] + build(ctx, tag, extra))
    print(f"  {way} run {rep + 1}/{REPEATS}: cold {results['cold'][-1]:.1f}s", file=sys.stderr, flush=True)
    subprocess.run([docker(), "rmi", "-f", tag], capture_output=True)


def measure_all(workdir: Path) -> dict[str, dict[str, list[float]]]:
    """Every way, repetition by repetition: the ways take turns, so a slow minute of this shared machine
    falls on all of them alike rather than on whichever way was being measured then."""
    results: dict[str, dict[str, list[float]]] = {way: {k: [] for k in METRICS} for way in WAYS}
    for rep in range(REPEATS):
        for way in WAYS:
            measure_once(way, workdir, rep, results[way])
    return results


def fmt(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    if not os.environ.get("IMGBUILD_NGC_REGISTRY"):
        sys.exit('bring the test bed up first: s=$(tests/testbed/up) && eval "$s"')
    precompile()
    with tempfile.TemporaryDirectory() as tmp:
        results = measure_all(Path(tmp))
    metrics = [
        ("cold build, s", "cold", 1),
        ("size added over base, MB", "size_mb", 1),
        ("rebuild after adding a pip package, s", "add_pip", 1),
        ("rebuild after changing the copied file, s", "change_file", 2),
        ("... of which writing the Dockerfile (render, hpccm), s", "change_file_gen", 2),
        ("no-op rebuild, s", "noop", 2),
    ]
    print(
        f"\nSame environment {len(WAYS)} ways: {len(PIP)} pip + {len(APT)} apt packages + 1 file on the stand-in "
        f"PyTorch base; median (min-max) of {REPEATS} runs\n"
    )
    print("| metric | " + " | ".join(WAYS) + " |")
    print("|---|" + "---|" * len(WAYS))
    for label, key, digits in metrics:
        print(f"| {label} | " + " | ".join(fmt(results[w][key], digits) for w in WAYS) + " |")
    median = {w: {k: statistics.median(v) for k, v in r.items()} for w, r in results.items()}
    for way in ("imgbuild", "imgbuild (uv)", "imgbuild (uv, locked)"):
        ratio = median[way]["add_pip"] / median["hpccm"]["add_pip"]
        print(f"\n{way}'s pip-change rebuild is {ratio:.2f}x hpccm's (target: at most 0.5x)")
    for key, what in (("cold", "cold build"), ("change_file", "file-change rebuild")):
        ours, theirs = median["imgbuild (uv)"][key], median["hpccm"][key]
        verdict = "met" if ours <= theirs else "missed"
        print(f"\nimgbuild (uv)'s {what}: {ours:.2f} s against hpccm's {theirs:.2f} s (target: no slower): {verdict}")
    print(json.dumps(median), file=sys.stderr)


if __name__ == "__main__":
    main()
