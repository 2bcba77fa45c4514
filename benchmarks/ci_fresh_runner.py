#!/usr/bin/env python3
"""A fresh CI runner after a copied-file edit, with and without the registry cache, side by side in one run.

The recipe is the realistic ML set `benchmarks/installers.py` uses (the HF text-classification example's
requirements plus tensorboard, on the stand-in PyTorch base) with one copied file. Each round:
edit the copied file, make the runner fresh (the image, its `-previous` and every build cache, pip's and uv's
download caches included, removed: `docker builder prune -af`), then time `imgbuild rebuild --push` (render,
build, smoke test, push). With the registry cache (`registry_cache: inline`, the default) the build is seeded from
the registry's copy of the target; without it (`off`) the runner has nothing to start from.
The third column is the time a fresh runner takes to pull the pushed image (`docker pull`): the floor for any
cache that lives in the registry. Bytes pulled are the pushed image's layers above the base's (compressed,
from the registry's manifest): what the seeded build fetches. The table gives the median of 3 rounds.

Targets (issue 33): 0 pip steps re-run; wall time at most 0.3x the cache-less rebuild and at most 1.3x the pull.

The Podman columns (`engine: podman`, needs `tests/testbed/up --all`) make their runner fresh the same way: the
image and every other image but the base removed, and Buildah's cache-mount folders with them. With the
registry cache, Buildah pushes every step's layer to `<image>-imgbuild-cache` and pulls back those whose inputs
did not change; without it (`off`) it rebuilds.

    s=$(tests/testbed/up --all) && eval "$s" && .venv/bin/python benchmarks/ci_fresh_runner.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SET = (ROOT / "tests" / "realsets" / "hf-text-classification.txt").read_text()


def docker() -> str:
    return os.environ.get("IMGBUILD_DOCKER_CLI", "/usr/bin/docker")


def quiet(*args: str) -> None:
    subprocess.run([docker(), *args], capture_output=True)


def fresh_runner(target: str, engine: str = "docker") -> None:
    if engine == "podman":  # every image but the base, and Buildah's cache mounts
        base = f"{os.environ['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
        keep = subprocess.run(["podman", "image", "inspect", "-f", "{{.Id}}", base], capture_output=True, text=True)
        ids = subprocess.run(["podman", "images", "-aq", "--no-trunc"], capture_output=True, text=True).stdout.split()
        doomed = sorted({i.removeprefix("sha256:") for i in ids} - {keep.stdout.strip()})
        if doomed:
            subprocess.run(["podman", "rmi", "-f", *doomed], capture_output=True)
        for folder in Path("/var/tmp").glob("buildah-cache*"):
            shutil.rmtree(folder, ignore_errors=True)
        return
    for ref in (target, f"{target}-previous", f"{target}-candidate"):
        quiet("rmi", "-f", ref)
    quiet("builder", "prune", "-af")


#: `--sign`: each push signed with this key (made once per run), so the next fresh runner may believe the smoke
#: record the push attached, as a CI that signs does (an unsigned record is not believed: everything is imported)
SIGN_KEY: Path | None = None


def rebuild(project: Path, cache: str, engine: str = "docker") -> float:
    start = time.perf_counter()
    env = dict(os.environ, IMGBUILD_REGISTRY_CACHE=cache, IMGBUILD_CACHE_DIR=str(project / "cache"))
    env["IMGBUILD_ENGINE"] = engine
    signing = ["--sign-key", str(SIGN_KEY)] if SIGN_KEY else []
    env["IMGBUILD_SIGN_PASSWORD"] = "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "imgbuild", "rebuild", "--push", *signing, "--report-json", "report.json", "recipes"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
    )
    seconds = time.perf_counter() - start
    report = json.loads((project / "report.json").read_text()) if (project / "report.json").is_file() else {}
    statuses = [i.get("status") for i in report.get("images", [])]
    if proc.returncode != 0 or statuses != ["built"]:
        sys.exit(f"rebuild --push failed ({statuses}):\n{proc.stderr[-3000:]}")
    return seconds


def pip_step(log: Path) -> str:
    text = log.read_text()
    lines = text.splitlines()
    if not any(line.startswith("#") for line in lines):  # Buildah's: "Using cache" after the step's line
        at = next(n for n, line in enumerate(lines) if "STEP" in line and "install.sh" in line)
        return "cached" if any(line.startswith("--> Using cache") for line in lines[at + 1 : at + 3]) else "ran"
    step = next(line.split()[0] for line in lines if line.startswith("#") and "install.sh" in line)
    return "cached" if f"{step} CACHED" in text else "ran"


def layer_bytes(registry: str, repo: str, tag: str) -> list[tuple[str, int]]:
    req = urllib.request.Request(
        f"http://{registry}/v2/{repo}/manifests/{tag}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        manifest = json.load(resp)
    return [(layer["digest"], int(layer["size"])) for layer in manifest["layers"]]


def measure(cache: str, workdir: Path, rounds: int, engine: str = "docker") -> dict[str, object]:
    registry = os.environ["IMGBUILD_TESTBED_REGISTRY"]
    project = workdir / f"{cache}-{engine}"
    (project / ".git").mkdir(parents=True)
    (project / "recipes" / "files").mkdir(parents=True)
    (project / "recipes" / "set.txt").write_text(SET + "tensorboard\n")
    (project / "recipes" / "files" / "train.py").write_text("print('round 0')\n")
    repo = f"imgbuildbench/fresh-{cache}-{engine}-{os.getpid()}"
    target = f"{registry}/{repo}:v1"
    (project / "recipes" / "set.yaml").write_text(
        f"name: fresh-{cache}\nimage: {registry}/{repo}\ntag: v1\n"
        f'base: {{framework: pytorch, tag: "24.05"}}\npip: {{requirements: set.txt}}\n'
        "files:\n  - {src: files/train.py, dest: /opt/train/train.py}\n"
    )
    log = project / "cache" / "logs" / (target.replace("/", "_").replace(":", "_") + ".log")
    fresh_runner(target, engine)
    rebuild(project, "inline", engine)  # the first push (with the cache, so the registry has it for the cached column)
    times, pulls, steps, smokes = [], [], [], []
    for n in range(1, rounds + 1):
        (project / "recipes" / "files" / "train.py").write_text(f"print('round {n}')\n")
        fresh_runner(target, engine)
        times.append(rebuild(project, cache, engine))
        steps.append(pip_step(log))
        report = json.loads((project / "images" / f"fresh-{cache}" / "smoke.json").read_text())
        smokes.append(sum(float(c.get("seconds") or 0) for c in report.get("checks", [])))
        fresh_runner(target, engine)
        start = time.perf_counter()
        subprocess.run([docker() if engine == "docker" else "podman", "pull", target], capture_output=True)
        pulls.append(time.perf_counter() - start)
        print(
            f"  {engine} {cache} round {n}: {times[-1]:.1f} s, pip step {steps[-1]}, pull {pulls[-1]:.1f} s",
            file=sys.stderr,
        )
    base = layer_bytes(registry, "nvidia/pytorch", "24.05-py3")
    above = [size for digest, size in layer_bytes(registry, repo, "v1") if digest not in dict(base)]
    fresh_runner(target, engine)
    return {
        "seconds": statistics.median(times),
        "pull": statistics.median(pulls),
        "pip_reruns": steps.count("ran"),
        "smoke": statistics.median(smokes),
        "bytes": sum(above),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sign", action="store_true", help="sign each push (the smoke record is then believed)")
    parser.add_argument("--docker-only", action="store_true", help="no Podman columns")
    args = parser.parse_args()
    rounds = args.rounds
    if not os.environ.get("IMGBUILD_TESTBED_REGISTRY"):
        sys.exit('bring the test bed up first: s=$(tests/testbed/up) && eval "$s"')
    workdir = Path(tempfile.mkdtemp(prefix="imgbuild-fresh-runner-"))
    if args.sign:
        global SIGN_KEY
        sys.path.insert(0, str(ROOT))
        from tests.cosign_keys import write_key_pair  # cosign's format; cosign itself cannot run here

        SIGN_KEY, _ = write_key_pair(workdir, b"bench")
    try:
        seeded = measure("inline", workdir, rounds)
        bare = measure("off", workdir, rounds)
        podman = podman_off = None
        if os.environ.get("IMGBUILD_TESTBED_PODMAN") and not args.docker_only:
            podman = measure("inline", workdir, rounds, "podman")
            podman_off = measure("off", workdir, rounds, "podman")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ratio = seeded["seconds"] / bare["seconds"]  # type: ignore[operator]
    to_pull = seeded["seconds"] / seeded["pull"]  # type: ignore[operator]
    signed = ", each push signed (the smoke record believed)" if args.sign else ""
    head = f"A fresh runner, copied-file edit, `imgbuild rebuild --push` (median of {rounds}), docker engine"
    print(f"\n{head}{signed}\n")
    print("| | registry cache (inline) | no registry cache | target |")
    print("|---|---|---|---|")
    print(f"| wall time, s | {seeded['seconds']:.1f} | {bare['seconds']:.1f} | |")
    print(f"| of which the smoke test, s | {seeded['smoke']:.1f} | {bare['smoke']:.1f} | |")
    without = (seeded["seconds"] - seeded["smoke"]) / (bare["seconds"] - bare["smoke"])  # type: ignore[operator]
    print(f"| pip steps re-run | {seeded['pip_reruns']} of {rounds} | {bare['pip_reruns']} of {rounds} | 0 |")
    print(f"| bytes pulled above the base | {seeded['bytes'] / 1e6:.0f} MB | 0 (rebuilt) | |")
    print(f"| pull of the pushed image, s | {seeded['pull']:.1f} | | |")
    print(f"| cached / cache-less | {ratio:.2f} | | <= 0.3: {'met' if ratio <= 0.3 else 'missed'} |")
    print(f"| cached / pull | {to_pull:.2f} | | <= 1.3: {'met' if to_pull <= 1.3 else 'missed'} |")
    print(f"| the same without the smoke test: cached / cache-less | {without:.2f} | | |")
    print(json.dumps({"cached": seeded["seconds"], "bare": bare["seconds"], "pull": seeded["pull"]}), file=sys.stderr)
    if podman is None or podman_off is None:
        print("\n(no Podman columns: bring the bed up with --all)")
        return
    p_ratio = podman["seconds"] / podman_off["seconds"]  # type: ignore[operator]
    p_pull = podman["seconds"] / podman["pull"]  # type: ignore[operator]
    print(f"\nThe same on Podman 4.3 (Buildah 1.28), median of {rounds}, beside Docker's:\n")
    print("| | podman, registry cache | podman, none | docker, registry cache | docker, none | target |")
    print("|---|---|---|---|---|---|")
    cells = [podman, podman_off, seeded, bare]
    print("| wall time, s | " + " | ".join(f"{c['seconds']:.1f}" for c in cells) + " | |")
    print("| of which the smoke test, s | " + " | ".join(f"{c['smoke']:.1f}" for c in cells) + " | |")
    print("| pip steps re-run | " + " | ".join(f"{c['pip_reruns']} of {rounds}" for c in cells) + " | 0 |")
    print(f"| pull of the pushed image, s | {podman['pull']:.1f} | | {seeded['pull']:.1f} | | |")
    met = {True: "met", False: "missed"}
    print(f"| cached / cache-less | {p_ratio:.2f} | | {ratio:.2f} | | <= 0.3: podman {met[p_ratio <= 0.3]} |")
    print(f"| cached / pull | {p_pull:.2f} | | {to_pull:.2f} | | <= 1.3: podman {met[p_pull <= 1.3]} |")


if __name__ == "__main__":
    main()
