"""A run's caps, pure but for the host's memory: its CPUs (the GPUs' share, or one GPU's for a run without GPUs;
`--cpus` within the site's share under sudo) and its memory (the site's `run.memory`, else three quarters of the
host's). Processes and the user's slice come straight from the site (`RunSpec.options`)."""

from __future__ import annotations

import math
import os

from imgbuild.config.site import RunRules
from imgbuild.errors import UsageError
from imgbuild.servers.spec import MAX_CPUS


def cpus_of(wanted: float | None, share: float | None, enforced: bool) -> float | None:
    """`--cpus` where given (within the site's share where `enforced`: a user acting through sudo), else the share."""
    if wanted is None:
        return share
    if not (math.isfinite(wanted) and 0.01 <= wanted <= MAX_CPUS):  # the engine's least: 0.01
        raise UsageError(f"--cpus {wanted}: not a number of CPUs (from 0.01, the engine's least, to {MAX_CPUS})")
    if enforced and share is not None and wanted > share:
        raise UsageError(f"--cpus {wanted:g}: this run may have at most {share:g} (the site's share)")
    return wanted


def run_cpus(gpu_count: int, host_cores: int, total_gpus: int, house: RunRules) -> float | None:
    """A run's CPUs: the GPUs' share of the host's (run.cpus_per_gpu, else an even share); a run without GPUs
    the site's `run.cpus`, else one GPU's share: no run has every core of a shared host by default."""
    from imgbuild.gpu.allocate import cpus_for

    if gpu_count:
        return cpus_for(gpu_count, host_cores, total_gpus, house.cpus_per_gpu)
    return house.cpus if house.cpus is not None else cpus_for(1, host_cores, total_gpus, house.cpus_per_gpu)


def run_memory(house: RunRules, host_bytes: int | None) -> int | None:
    """A run's memory cap in bytes: the site's `run.memory`, else three quarters of the host's (None where the
    host's cannot be read)."""
    from imgbuild.config.checks import size_bytes

    if house.memory is not None:
        return size_bytes(house.memory)
    return host_bytes * 3 // 4 if host_bytes else None


def host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
