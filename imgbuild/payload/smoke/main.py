"""The command line: run the framework's checks, add what the recipe added, print the report."""

from __future__ import annotations

import json
import os
import sys
import time

from . import dists
from .dists import read_baseline
from .framework import detect_framework
from .report import Report, marker, table
from .runners import RUNNERS
from .sbom import added_with_licenses, installed_debs, written_by_run


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="imgbuild in-image smoke test")
    parser.add_argument("--framework", choices=sorted(RUNNERS))
    parser.add_argument("--require-gpu", action="store_true")
    parser.add_argument("--libraries-only", action="store_true", help="only what needs no GPU, and the arch list")
    parser.add_argument("--format", choices=("json", "table"), default="json")
    args = parser.parse_args(argv)
    # Real fp32 baselines: NGC images set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (TF32 in cuBLAS), so this is
    # assigned, not defaulted; set before the framework loads. The matmul precision used is reported.
    os.environ["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] = "0"
    os.environ["NVIDIA_TF32_OVERRIDE"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    report = Report()
    framework = args.framework or detect_framework()
    start = time.perf_counter()
    if framework is None:
        report.fail("framework", "neither PyTorch nor TensorFlow is installed")
    else:
        RUNNERS[framework](report, args.libraries_only)
    if args.require_gpu:
        gpu = next((c for c in report.checks if c["name"] == "cuda"), None)
        if gpu is None or gpu["status"] != "pass":
            why = f" ({gpu['reason']})" if gpu and gpu.get("reason") else ""
            report.fail("require gpu", f"a GPU is required (--require-gpu) but none is usable{why}")
    baseline = read_baseline(dists.DISTS_BASELINE)
    if baseline is not None:  # what the recipe added, for the image's SBOM
        report.meta["added"] = added_with_licenses(baseline)
    apt = installed_debs()
    if apt is not None:  # the Debian packages the recipe added, with versions, for the SBOM
        report.meta["debs"] = apt
    written = written_by_run()
    if written is not None:  # the files the recipe's run steps wrote, with their sha256, for the SBOM
        report.meta["run_files"] = written
    report.meta["seconds"] = round(time.perf_counter() - start, 2)
    payload = {"ok": report.ok, "meta": report.meta, "checks": report.checks}
    if args.format == "table":
        print(table(report))
        print(f"{'PASSED' if report.ok else 'FAILED'} in {report.meta['seconds']} s")
    else:
        sys.stdout.flush()
        print(marker() + json.dumps(payload, sort_keys=True))
    return 0 if report.ok else 1
