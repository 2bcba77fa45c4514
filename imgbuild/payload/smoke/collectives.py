"""The collectives: an NCCL all-reduce across every visible GPU, one process per GPU, and P2P copies between each pair
of GPUs that reports peer access."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from .budget import Budget
from .cuda import mig_instance
from .report import Child, Fail, Skip

NCCL_BYTES = 64 * 1024 * 1024  # the all-reduced tensor
#: One NCCL rank of the all-reduce: it answers {"rank", "ok", "seconds"} after its marker.
NCCL_RANK = Child(
    r"""
import json, os, sys, time
import torch
import torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", rank=rank, world_size=world)
x = torch.full((int(os.environ["IMGBUILD_NCCL_ELEMENTS"]),), float(rank + 1), device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
ok = bool((x == world * (world + 1) / 2).all().item())
start = time.perf_counter()
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
seconds = (time.perf_counter() - start) / 5
dist.destroy_process_group()
print(os.environ["IMGBUILD_PROBE_MARKER"] + json.dumps({"rank": rank, "ok": ok, "seconds": seconds}), flush=True)
""",
    "IMGBUILD-NCCL ",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(world: int, timeout: float, elements: int, python: str = "") -> list:
    """One process per GPU, each an NCCL rank of one all-reduce; their reports (or Fail with the first error)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(world)}
    env["IMGBUILD_NCCL_ELEMENTS"] = str(elements)
    procs = [
        subprocess.Popen(
            [python or sys.executable, "-c", NCCL_RANK.script],
            env=NCCL_RANK.env({**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    deadline, outputs = time.monotonic() + timeout, []
    try:
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise Fail(
                    f"the all-reduce across {world} GPU(s) did not finish in {timeout:.0f} s (a P2P hang? "
                    "try NCCL_P2P_DISABLE=1 to tell)"
                ) from None
            outputs.append((proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    reports = []
    for rank, (code, out) in enumerate(outputs):
        line = NCCL_RANK.answer(out)
        if code != 0 or line is None:
            said = [x for x in out.splitlines() if x.strip()][-1:] or ["no output"]
            raise Fail(f"NCCL rank {rank} of {world} failed: {said[0][:300]}")
        reports.append(json.loads(line))
    return reports


def torch_nccl(torch, budget: Budget) -> dict:
    """An all-reduce across every visible GPU, one process per GPU (one rank on a single GPU), checked and timed:
    NCCL and the driver agree, P2P does not hang, /dev/shm holds the ranks."""
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        raise Skip(f"torch {torch.__version__} is built without NCCL")
    if mig_instance(torch):
        raise Skip("a MIG instance: NCCL does not run across MIG instances, and a process sees one")
    world = torch.cuda.device_count()
    reports = run_ranks(world, budget.left("the NCCL all-reduce"), NCCL_BYTES // 4)
    if not all(r.get("ok") for r in reports):
        raise Fail(f"the all-reduce across {world} GPU(s) gave a wrong sum")
    seconds = max(float(r.get("seconds") or 0) for r in reports)
    bus = 2 * (world - 1) / world * NCCL_BYTES / max(seconds, 1e-9) / 1e9
    details = {"ranks": world, "seconds": round(seconds, 6), "bus_gbps": round(bus, 1)}
    details["reason"] = f"all-reduce of {NCCL_BYTES >> 20} MiB across {world} GPU(s) correct" + (
        f", {bus:.1f} GB/s bus bandwidth" if world > 1 else " (one rank)"
    )
    return details


def torch_p2p(torch, budget: Budget) -> dict:
    """Each pair of GPUs that reports peer access copies 256 MiB both ways, checked, with its bandwidth."""
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    count = torch.cuda.device_count()
    if count < 2:
        raise Skip("one GPU: no peer to copy to")
    rows, size = [], 256 * 1024 * 1024
    for i in range(count):
        for j in range(count):
            if i == j or not torch.cuda.can_device_access_peer(i, j):
                continue
            budget.left(f"the P2P copy {i}->{j}")
            src = torch.arange(size // 4, device=f"cuda:{i}", dtype=torch.int32)
            torch.cuda.synchronize(i)
            start = time.perf_counter()
            dst = src.to(f"cuda:{j}")
            torch.cuda.synchronize(j)
            seconds = time.perf_counter() - start
            if not bool((dst.cpu() == src.cpu()).all().item()):
                raise Fail(f"a P2P copy from GPU {i} to GPU {j} arrived wrong")
            rows.append(f"{i}->{j} {size / max(seconds, 1e-9) / 1e9:.0f} GB/s")
    if not rows:
        raise Skip(f"no pair of the {count} GPUs offers peer access (PCIe with ACS or an IOMMU?)")
    return {"pairs": len(rows), "reason": "P2P copies correct: " + ", ".join(rows[:8])}
