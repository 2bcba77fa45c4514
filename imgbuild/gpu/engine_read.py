"""GPUs read through the engine, where the engine is not on this machine's kernel: a short script run in the image
(imgbuild/payload/engine_gpus.py) and the pure verdict on what it printed (judge_engine_read)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from imgbuild.gpu.read import Gpu, NoGpus, SmiReader
from imgbuild.payload.probes import ENGINE_GPUS

# --- GPUs read through the engine -------------------------------------------------------------------
#
# Where the engine is not on this machine's kernel (DOCKER_HOST=tcp:// or ssh://, or imgbuild itself in a
# container with the socket mounted), this machine's /dev, driver and NVML say nothing of the engine's GPUs.
# They are read in a short-lived container of the image at hand, given every GPU: nvidia-smi (the toolkit
# mounts it) answers SmiReader's calls, and the host's PCI bus (/sys is not namespaced) says whether NVIDIA
# GPUs are there at all, even where the engine cannot pass them.


#: What nvidia-smi or the engine says where a host has no NVIDIA GPU (as opposed to one it cannot pass).
_NO_GPU_WORDS = ("no devices were found", "driver not loaded", "couldn't communicate with the nvidia driver")


@dataclass(frozen=True)
class EngineGpus:
    """The engine's host's GPUs: whether it has NVIDIA GPUs, and from where they are read. `source` "local": this
    machine is the engine's host (its GPUs are read when needed); "engine": read through the engine, `readings`
    None where they could not be (`why`)."""

    present: bool
    source: str = "local"
    readings: list[Gpu] | None = None
    why: str = ""


def engine_read_env() -> dict[str, str]:
    """The read container's environment: nvidia-smi's calls, and the toolkit told to mount nvidia-smi."""
    return {
        "IMGBUILD_SMI_CALLS": json.dumps([list(c) for c in SmiReader.CALLS]),
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }


def judge_engine_read(code: int, output: str, note: str, cdi_gpus: bool) -> EngineGpus:
    """The read container's exit code, output and note (why the engine gave it no GPUs): GPUs present when
    nvidia-smi listed some, the host's PCI bus has NVIDIA display devices, or the engine lists CDI GPU devices;
    an engine that only has an NVIDIA runtime registered is no GPU host. Pure; hostile output reads as none."""
    data = ENGINE_GPUS.answer(output)  # as every probe's answer is read
    if data is None or code != 0:
        why = f"the GPU read in the image failed (exit {code})" + (f"; {note}" if note else "")
        return EngineGpus(cdi_gpus, "engine", None, why)
    pci = data.get("pci_nvidia")
    pci_gpus = isinstance(pci, int) and not isinstance(pci, bool) and pci > 0
    smi = data.get("smi")
    answers: dict[str, Any] = smi if isinstance(smi, dict) else {}

    def recorded(args: list[str]) -> str:
        answer = answers.get(" ".join(args))
        if not isinstance(answer, dict) or not isinstance(answer.get("out"), str):
            raise NoGpus("nvidia-smi gave no answer")
        if answer.get("code") != 0:
            err = str(answer["err"]) if isinstance(answer.get("err"), str) else ""
            first = (err.strip() or str(answer["out"]).strip()).splitlines()[:1]
            raise NoGpus(f"nvidia-smi in the container: {first[0][:200] if first else 'failed'}")
        return str(answer["out"])

    try:
        readings = SmiReader(run=recorded, numa=False).read()
    except NoGpus as exc:
        why = note or str(exc)
        said_none = any(words in why.lower() for words in _NO_GPU_WORDS) or "not found" in why
        # the engine gave the container GPUs (no note) and nvidia-smi failed for another reason: a GPU host
        return EngineGpus(pci_gpus or cdi_gpus or (not note and not said_none), "engine", None, why)
    if not readings:
        return EngineGpus(pci_gpus or cdi_gpus, "engine", None, note or "nvidia-smi listed no GPU")
    return EngineGpus(True, "engine", readings)
