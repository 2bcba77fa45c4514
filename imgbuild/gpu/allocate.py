"""Choosing GPUs and CPUs for a run: free GPUs by load, never another user's (their processes, containers and
starting runs: claims), CPUs near the GPUs, and the summary of a job's samples. Pure over gpu.read's shapes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from imgbuild.errors import UsageError
from imgbuild.gpu.read import Gpu

# --- choosing GPUs ----------------------------------------------------------------------------------


def load_score(gpu: Gpu) -> float:
    """Lower is freer: memory in use (share), utilisation, and a penalty per running process."""
    memory = gpu.memory_used_mib / gpu.memory_total_mib if gpu.memory_total_mib else 0.0
    util = (gpu.utilization or 0) / 100
    return round(memory + util + 0.25 * len(gpu.processes), 4)


@dataclass
class Selection:
    gpus: list[Gpu]
    forced: list[str] = field(default_factory=list)  # "GPU 3 (alice: pid 4242 python)"

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]


class GpusBusy(UsageError):
    """The GPUs asked for are held now (by others, or past a quota): `run --wait` waits on this, and only this."""


@dataclass(frozen=True)
class Claim:
    """A hold on a GPU by other means than a process on it: a container given it, a run starting on it."""

    user: str
    what: str  # "container bob_train_1", "bob_lm_2 starting"


Claims = dict[str, list[Claim]]  # GPU UUID -> its claims


def _holders(gpu: Gpu, me: str, claims: Claims | None = None) -> str:
    # a process whose owner cannot be read (/proc hidepid=2, imgbuild in a container, a remote engine) is someone
    # else's: never a free GPU
    others = [p for p in gpu.processes if p.user != me]
    held = [
        f"{p.user or 'an unknown user'} (pid {p.pid} {p.name or '?'}{' in ' + p.container if p.container else ''})"
        for p in others
    ] + [f"{c.user} ({c.what})" for c in (claims or {}).get(gpu.uuid, []) if c.user != me]
    return ", ".join(dict.fromkeys(held))


def _mine(gpu: Gpu, me: str, claims: Claims | None) -> str:
    return ", ".join(c.what for c in (claims or {}).get(gpu.uuid, []) if c.user == me)


def _unsliced(gpus: list[Gpu]) -> str:
    names = ", ".join(f"GPU {g.index}" for g in gpus)
    return (
        f"{names} has MIG mode on but no MIG instance, so nothing can run on it: an admin makes instances "
        "(nvidia-smi mig -cgi PROFILE -C) or turns MIG off (nvidia-smi -mig 0)"
    )


def _named(request: str, by_index: dict[int, Gpu], count: int, unsliced: list[Gpu]) -> list[Gpu]:
    """The GPUs a list names (`0,3`, `device=3`), each once, in order."""
    wanted = [int(x) for x in request.removeprefix("device=").split(",") if x]
    missing = [i for i in wanted if i not in by_index]
    if missing and any(g.index == missing[0] for g in unsliced):
        raise UsageError(f"--gpus {request}: {_unsliced([g for g in unsliced if g.index == missing[0]])}")
    if missing:
        raise UsageError(f"--gpus {request}: no GPU {missing[0]} (this host has {count}: 0-{count - 1})")
    return [by_index[i] for i in dict.fromkeys(wanted)]


def requested_count(request: str, gpus: list[Gpu]) -> int:
    """How many GPUs `--gpus REQUEST` asks for on a host with `gpus` (0 for none, or a request select_gpus
    refuses in words of its own)."""
    request = request.strip().lower()
    if request == "all":
        return len([g for g in gpus if not g.mig_unsliced])
    if re.fullmatch(r"[0-9]+", request):
        return int(request)
    if re.fullmatch(r"(device=)?[0-9]+(,[0-9]+)*,?", request):
        return len({int(x) for x in request.removeprefix("device=").split(",") if x})
    return 0


def select_gpus(request: str, gpus: list[Gpu], me: str, force: bool = False, claims: Claims | None = None) -> Selection:
    """`request`: N (the N least-loaded GPUs free of other users, as `docker run --gpus N`), a list
    `0,3` or `device=3` (those GPUs), `all`, or `none`.

    `claims`: GPUs given to containers or being handed to a starting run (the ledger). Another user's claim
    refuses a GPU like their process on it; for N GPUs, the caller's own claimed GPUs are not free either
    (two of your jobs on one GPU is a mistake more often than a plan); naming them is allowed."""
    request = request.strip().lower()
    if request in ("", "none"):
        return Selection([])
    if request == "0":  # `./run_docker 0` on lab servers means GPU 0; docker's `--gpus 0` means none
        raise UsageError("--gpus 0 is ambiguous: write --gpus none for no GPU, or --gpus device=0 (or 0,) for GPU 0")
    if not gpus:
        raise UsageError("--gpus: this host has no NVIDIA GPU (run without --gpus to use the CPU)")
    unsliced = [g for g in gpus if g.mig_unsliced]  # MIG on, no instance: no CUDA process can run on it
    gpus = [g for g in gpus if not g.mig_unsliced]
    by_index = {g.index: g for g in gpus}
    if not gpus:
        raise UsageError(f"--gpus: {_unsliced(unsliced)}")
    if request == "all":
        chosen = list(gpus)
    elif re.fullmatch(r"[0-9]+", request):
        count = int(request)
        free = [g for g in gpus if force or not (_holders(g, me, claims) or _mine(g, me, claims))]
        if count > len(free):
            held = "; ".join(
                f"GPU {g.index}: {_holders(g, me, claims) or 'your ' + _mine(g, me, claims)}"
                for g in gpus
                if _holders(g, me, claims) or _mine(g, me, claims)
            )
            raise GpusBusy(
                f"--gpus {count}: only {len(free)} of {len(gpus)} GPUs are free ({held}); use --force to share"
            )
        chosen = sorted(free, key=lambda g: (load_score(g), g.index))[:count]
        chosen.sort(key=lambda g: g.index)
    elif re.fullmatch(r"(device=)?[0-9]+(,[0-9]+)*,?", request):
        chosen = _named(request, by_index, len(gpus), unsliced)
    else:
        raise UsageError(f"--gpus: {request!r} is not N, a list like 0,3, all or none")
    busy = [(g, _holders(g, me, claims)) for g in chosen if _holders(g, me, claims)]
    if busy and not force:
        first, holders = busy[0]
        raise GpusBusy(f"GPU {first.index} is in use by {holders}; choose another or use --force")
    return Selection(chosen, [f"GPU {g.index} ({h})" for g, h in busy])


def pick_cpus(count: int, near: list[int], host: list[int], taken: dict[int, int]) -> list[int]:
    """`count` CPUs to pin a container to: free ones near its GPUs first, then free ones elsewhere, then
    the least shared. `taken`: CPU -> containers (and starting runs) pinned to it. [] when `count` covers
    every usable CPU anyway (nothing to pin)."""
    if count <= 0 or count >= len(host):
        return []
    usable = set(host)
    near_set = set(near) & usable

    def rank(cpu: int) -> tuple[int, int, int]:
        return (taken.get(cpu, 0), 0 if cpu in near_set else 1, cpu)

    return sorted(sorted(usable, key=rank)[:count])


def cpus_for(gpu_count: int, host_cores: int, total_gpus: int, per_gpu: float | None = None) -> float | None:
    """The DGX rule of thumb: 8 to 24 CPUs per GPU (the host's fair share within that), never more than
    the host has. None (no limit) for a CPU-only container."""
    if gpu_count <= 0:
        return None
    if per_gpu is None:
        fair = host_cores / max(total_gpus, 1)
        per_gpu = min(24.0, max(8.0, fair))
    return float(min(host_cores, per_gpu * gpu_count))


# --- summaries over a job --------------------------------------------------------------------------


@dataclass
class Sample:
    gpu_util: dict[int, int]  # index -> percent
    gpu_mem_mib: dict[int, int]
    cpu_percent: float | None  # of the container's CPU limit (100 = saturated)


def summarize(samples: list[Sample], cpu_limit: float | None) -> tuple[list[dict[str, Any]], str]:
    """Per GPU mean/max utilisation and memory (like Slurm's seff), and a hint when the GPUs starved."""
    rows = []
    indices = sorted({i for s in samples for i in s.gpu_util})
    for i in indices:
        utils = [s.gpu_util[i] for s in samples if i in s.gpu_util]
        mems = [s.gpu_mem_mib.get(i, 0) for s in samples if i in s.gpu_util]
        rows.append(
            {
                "gpu": i,
                "util_mean": round(sum(utils) / len(utils), 1),
                "util_max": max(utils),
                "mem_mean_mib": round(sum(mems) / len(mems)),
                "mem_max_mib": max(mems),
                "samples": len(utils),
            }
        )
    cpu = [s.cpu_percent for s in samples if s.cpu_percent is not None]
    hint = ""
    if rows and cpu:
        mean_util = sum(r["util_mean"] for r in rows) / len(rows)
        cpu_mean = sum(cpu) / len(cpu)
        if mean_util < 50 and cpu_mean >= 85:
            hint = (
                f"GPUs averaged {mean_util:.0f}% while the container's CPUs were saturated "
                f"({cpu_mean:.0f}%{f' of {cpu_limit:g} CPUs' if cpu_limit else ''}): the input pipeline "
                "is the bottleneck; raise DataLoader num_workers or give more CPUs per GPU (--cpus)"
            )
        elif mean_util < 50:
            hint = (
                f"GPUs averaged {mean_util:.0f}% (sites ask for 90%+): check batch size, data loading and sync points"
            )
    return rows, hint
