"""A run's CPUs, pure: the GPUs' share, or one GPU's for a run without GPUs; `--cpus` within the site's share
under sudo. Its memory, processes and the user's slice are the site's (`RunRules.memory_bytes`,
`RunRules.cgroup_parent_of`), for a run and a script container alike."""

from __future__ import annotations

import math

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
