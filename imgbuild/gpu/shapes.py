"""The shapes GPU readings take, whichever reader fills them (NVML, nvidia-smi, a saved snapshot), and the forms of
what the PCI bus says of a GPU."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

#: What gpu.read.read_devices says it read from a saved snapshot (gpu.snapshot.SnapshotReader).
SNAPSHOT_SOURCE = "snapshot"


@dataclass
class GpuProcess:
    pid: int
    name: str
    used_mib: int
    user: str = ""
    container: str = ""


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    memory_used_mib: int
    memory_total_mib: int
    utilization: int | None  # percent; None where the driver does not report it (MIG)
    processes: list[GpuProcess] = field(default_factory=list)
    compute_cap: str = ""  # "8.0"; empty where the reader cannot tell (old nvidia-smi)
    driver: str = ""  # the host driver's version, the same on every GPU
    cpu_affinity: str = ""  # the CPUs of the GPU's NUMA node, as a list like 0-31,64-95 ("" unknown)
    mig_parent: str = ""  # a MIG slice: its GPU's UUID (the slice is the unit a container is given, by MIG- UUID)
    mig_profile: str = ""  # "1g.10gb"
    #: MIG mode is on but no instance is made: the GPU cannot run a CUDA process whole, nor be given as a slice
    mig_unsliced: bool = False

    @property
    def users(self) -> set[str]:
        return {p.user for p in self.processes if p.user}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: A PCI device id as sysfs writes it (0x1db4), a PCI address (0000:0f:00.0), a kernel driver's name (vfio-pci).
PCI_DEVICE_ID = re.compile(r"0x[0-9a-f]{4}")
PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
KERNEL_DRIVER = re.compile(r"[a-z0-9_.-]{0,40}")


@dataclass(frozen=True)
class PciGpu:
    """An NVIDIA GPU on this machine's PCI bus, as the kernel sees it, whatever drives it."""

    address: str  # 0000:0f:00.0
    device: str  # the PCI device id, 0x1db4 (a V100 SXM2)
    driver: str  # the kernel driver bound to it: nvidia, vfio-pci (passed to VMs), nouveau; "" none

    @property
    def label(self) -> str:
        return f"{self.address} (10de:{self.device.removeprefix('0x') or '?'})"
