"""Stage 5: run the in-image smoke test (smoke_image.py) through the engine and read its report."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgbuild.engine import ImageEngine
from imgbuild.errors import ImgbuildError
from imgbuild.facts import Label

SCRIPT = Path(__file__).parent / "smoke_image.py"
MARKER = "IMGBUILD-SMOKE-REPORT "


@dataclass
class SmokeReport:
    image: str
    ok: bool
    checks: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def failures(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c["status"] == "fail"]

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "ok": self.ok, "note": self.note, "meta": self.meta, "checks": self.checks}

    def summary(self) -> str:
        failed = self.failures()
        if not failed:
            counts = {s: sum(c["status"] == s for c in self.checks) for s in ("pass", "skip", "warn")}
            return f"smoke test passed ({counts['pass']} passed, {counts['skip']} skipped, {counts['warn']} warned)"
        return "smoke test failed: " + "; ".join(f"{c['name']}: {c['reason']}" for c in failed)


def parse_output(image: str, code: int, output: str, note: str = "") -> SmokeReport:
    for line in reversed(output.splitlines()):
        if line.startswith(MARKER):
            data = json.loads(line[len(MARKER) :])
            return SmokeReport(image, bool(data["ok"]) and code == 0, data["checks"], data.get("meta", {}), note)
    tail = " | ".join(ln for ln in output.strip().splitlines()[-5:])
    return SmokeReport(
        image,
        False,
        [
            {
                "name": "smoke script",
                "status": "fail",
                "details": {},
                "seconds": 0,
                "reason": f"exited {code} without a report: {tail[:400]}",
            }
        ],
        {},
        note,
    )


def run_smoke(
    engine: ImageEngine, image: str, *, require_gpu: bool = False, min_speedup: float | None = None, timeout: int = 1800
) -> SmokeReport:
    img = engine.images.image(image)
    if img is None:
        raise ImgbuildError(f"no image {image} in the engine (build or pull it first)")
    labels = img.labels
    env = {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "0", "NVIDIA_TF32_OVERRIDE": "0"}
    if labels.get(Label.BASE_FRAMEWORK_VERSION):
        env["IMGBUILD_EXPECT_FRAMEWORK_VERSION"] = labels[Label.BASE_FRAMEWORK_VERSION]
    if min_speedup:
        env["IMGBUILD_SMOKE_MIN_SPEEDUP"] = str(min_speedup)
    args = ["--require-gpu"] if require_gpu else []
    code, output, note = engine.containers.run_script(
        image, SCRIPT.read_text(), args, env, gpus=engine.host_has_gpus(), timeout=timeout
    )
    report = parse_output(image, code, output, note)
    if note and require_gpu:
        report.ok = False
    return report
