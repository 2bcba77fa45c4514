"""The GPU checks' time budget beyond one device's arithmetic (IMGBUILD_SMOKE_GPU_SECONDS, the setting
smoke_gpu_seconds): each check takes its share, and one that finds none left is skipped, saying so."""

from __future__ import annotations

import os
import time

from .report import Skip

GPU_SECONDS = 300  # the budget of the checks below together (IMGBUILD_SMOKE_GPU_SECONDS: the setting)


def configured_gpu_seconds(text: str) -> float:
    """The GPU checks' budget (IMGBUILD_SMOKE_GPU_SECONDS, set by imgbuild): ASCII digits, 1 to 86400; else the
    default."""
    return float(text) if text.isascii() and text.isdigit() and 1 <= int(text) <= 86400 else float(GPU_SECONDS)


class Budget:
    """What is left of the GPU checks' budget: each check takes its share, and one that finds none left is skipped,
    saying so, never left to run past it."""

    def __init__(self, seconds: float, clock=time.monotonic) -> None:
        self.clock = clock
        self.deadline = clock() + seconds
        self.seconds = seconds

    def left(self, check: str) -> float:
        left = self.deadline - self.clock()
        if left < 1:
            raise Skip(
                f"the GPU checks' budget ({self.seconds:.0f} s, setting smoke_gpu_seconds) is spent before {check}"
            )
        return left


def gpu_budget() -> Budget:
    """The budget imgbuild set for this run (IMGBUILD_SMOKE_GPU_SECONDS), starting now."""
    return Budget(configured_gpu_seconds(os.environ.get("IMGBUILD_SMOKE_GPU_SECONDS", "")))
