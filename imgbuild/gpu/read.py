"""GPUs on a shared server, read: NVML, nvidia-smi, or a saved snapshot (gpu.snapshot), with who runs what on
each (and MIG).

Readers fill one shape (`Gpu`, `GpuProcess`); choosing among them is gpu.allocate's, pure over that shape, so both
are tested with readings shaped like real servers.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imgbuild.errors import EnvironmentProblem
from imgbuild.gpu.shapes import PCI_DEVICE_ID, SNAPSHOT_SOURCE, Gpu, GpuProcess, PciGpu
from imgbuild.gpu.snapshot import SnapshotReader


class NoGpus(EnvironmentProblem):
    """No NVIDIA GPU or driver here; the message says what was tried."""


# --- who owns a process ---------------------------------------------------------------------------

_CGROUP_ID = re.compile(r"(?:docker[-/]|/containers/)([0-9a-f]{64})")


def process_owner(
    pid: int, proc: Path = Path("/proc"), container_name: Callable[[str], str] | None = None
) -> tuple[str, str]:
    """(user, container) of a host PID: the process's owner, and the Docker container it runs in."""
    user = container = ""
    try:
        uid = (proc / str(pid)).stat().st_uid
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = f"uid{uid}"
        match = _CGROUP_ID.search((proc / str(pid) / "cgroup").read_text())
        if match:
            cid = match.group(1)
            container = container_name(cid) if container_name else cid[:12]
    except OSError:
        pass
    if container and "_" in container and user in ("root", ""):
        user = container.split("_", 1)[0]  # the server convention: <user>_...
    return user, container


# --- readers ----------------------------------------------------------------------------------------


def _first_line(path: Path) -> str:
    return path.read_text()[:16].strip()


def nvidia_pci_devices(root: str = "/sys/bus/pci/devices") -> tuple[PciGpu, ...]:
    """The NVIDIA display-class devices (GPUs) on this machine's bus with their device ids and the driver each is
    bound to, whether a driver drives them or not: a driver branch that dropped an architecture binds none of its
    GPUs, a GPU given to virtual machines is bound to vfio-pci."""
    found = []
    for device in sorted(Path(root).glob("*"))[:4096]:
        try:
            vendor, kind = _first_line(device / "vendor"), _first_line(device / "class")
        except OSError:
            continue
        if vendor != "0x10de" or not kind.startswith("0x03"):
            continue
        try:
            ident = _first_line(device / "device")
        except OSError:
            ident = ""
        driver = os.path.basename(os.readlink(device / "driver")) if (device / "driver").is_symlink() else ""
        found.append(PciGpu(device.name, ident if PCI_DEVICE_ID.fullmatch(ident) else "", driver[:40]))
    return tuple(found)


def gpu_devices_present() -> bool:
    """This machine has NVIDIA device nodes (a driver is loaded), whether or not it can be read."""
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"))


def _int(text: str) -> int | None:
    text = text.strip()
    return int(float(text)) if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) else None


GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
EXTRA_FIELDS = ("compute_cap", "driver_version")  # nvidia-smi from R510 on
GPU_QUERY = ",".join(GPU_FIELDS + EXTRA_FIELDS)
APP_QUERY = "gpu_uuid,pid,process_name,used_memory"


def parse_smi(
    gpu_csv: str, apps_csv: str, extra: bool = True, elsewhere: dict[str, list[GpuProcess]] | None = None
) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=GPU_QUERY` (without EXTRA_FIELDS when `extra` is false) and
    `--query-compute-apps=APP_QUERY` (`--format=csv,noheader,nounits`); `[N/A]` and `[Not Supported]`
    become None / 0. A GPU name may hold commas: the columns are counted from both ends."""
    tail = 3 + (len(EXTRA_FIELDS) if extra else 0)
    gpus: dict[str, Gpu] = {}
    for line in gpu_csv.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 + tail or not parts[0].isdigit():
            raise NoGpus(f"unexpected nvidia-smi output: {line[:120]!r}")
        index, uuid, name = parts[0], parts[1], ", ".join(parts[2:-tail])
        used, total, util = parts[-tail : len(parts) - tail + 3]
        cap, driver = (parts[-2], parts[-1]) if extra else ("", "")
        gpu = Gpu(int(index), uuid, name, _int(used) or 0, _int(total) or 0, _int(util))
        gpu.compute_cap = cap if re.fullmatch(r"[0-9]+\.[0-9]+", cap) else ""
        gpu.driver = driver if re.fullmatch(r"[0-9]+(\.[0-9]+)+", driver) else ""
        gpus[uuid] = gpu
    for line in apps_csv.splitlines():
        if not line.strip() or line.startswith("No running"):
            continue
        parts = [p.strip() for p in line.split(",")]
        uuid, pid, used = parts[0], parts[1], parts[-1]
        name = ", ".join(parts[2:-1])
        if uuid in gpus and pid.isdigit():
            gpus[uuid].processes.append(GpuProcess(int(pid), name, _int(used) or 0))
        elif elsewhere is not None and pid.isdigit():  # on a device that is no GPU of the list: a MIG slice
            elsewhere.setdefault(uuid, []).append(GpuProcess(int(pid), name, _int(used) or 0))
    return sorted(gpus.values(), key=lambda g: g.index)


class SmiReader:
    source = "nvidia-smi"

    #: Every nvidia-smi call `read` may make (the GPU read through the engine runs them all in the image at once).
    CALLS = (
        [f"--query-compute-apps={APP_QUERY}", "--format=csv,noheader,nounits"],
        [f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
        [f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"],
        ["--query-gpu=uuid,pci.bus_id", "--format=csv,noheader,nounits"],
        ["-L"],
        ["--query-gpu=uuid,mig.mode.current", "--format=csv,noheader,nounits"],
    )

    def __init__(
        self, run: Callable[[list[str]], str] | None = None, binary: str | None = None, numa: bool = True
    ) -> None:
        self.binary = binary or shutil.which("nvidia-smi")
        self._run = run or self._subprocess
        self.numa = numa  # False where the GPUs are another machine's (this machine's /sys says nothing of them)

    def _subprocess(self, args: list[str]) -> str:
        if not self.binary:
            raise NoGpus("nvidia-smi not found")
        try:
            proc = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NoGpus(f"nvidia-smi: {exc}") from exc
        if proc.returncode != 0:
            raise NoGpus(f"nvidia-smi failed: {(proc.stderr or proc.stdout).strip().splitlines()[:1]}")
        return proc.stdout

    def read(self) -> list[Gpu]:
        apps_call, full_call, short_call, bus_call, list_call, mig_call = self.CALLS
        apps = self._run(apps_call)
        on_slices: dict[str, list[GpuProcess]] = {}
        try:
            gpus = parse_smi(self._run(full_call), apps, elsewhere=on_slices)
        except NoGpus:  # drivers before R510 know no compute_cap field
            on_slices.clear()
            gpus = parse_smi(self._run(short_call), apps, False, on_slices)
        buses: dict[str, str] = {}
        try:
            for line in self._run(bus_call).splitlines() if self.numa else []:
                uuid, _, bus = line.partition(",")
                if bus and "," not in bus:
                    buses[uuid.strip()] = bus.strip()
        except NoGpus:
            pass
        for gpu in gpus:
            gpu.cpu_affinity = numa_cpus(buses.get(gpu.uuid, ""))
        try:
            layout = mig_layout(self._run(list_call))
        except NoGpus:
            layout = {}
        try:
            enabled = {
                u.strip()
                for u, _, m in (ln.partition(",") for ln in self._run(mig_call).splitlines())
                if m.strip() == "Enabled"
            }
        except NoGpus:  # an nvidia-smi that knows no MIG field
            enabled = set()
        for gpu in gpus:
            gpu.mig_unsliced = gpu.uuid in enabled and not layout.get(gpu.uuid)
        return split_mig(gpus, layout, on_slices)


class NvmlReader:
    source = "NVML"

    def read(self) -> list[Gpu]:
        try:
            import pynvml
        except ImportError as exc:
            raise NoGpus("nvidia-ml-py is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoGpus(f"NVML: {exc}") from exc
        try:
            out = []
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                try:
                    util: int | None = int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
                except pynvml.NVMLError:
                    util = None
                procs = [
                    GpuProcess(p.pid, _process_name(pynvml, p.pid), int((p.usedGpuMemory or 0) // 2**20))
                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                ]
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                name, uuid = _text(pynvml.nvmlDeviceGetName(h)), _text(pynvml.nvmlDeviceGetUUID(h))
                used, total = int(mem.used // 2**20), int(mem.total // 2**20)
                gpu = Gpu(i, uuid, name, used, total, util, procs, f"{major}.{minor}", driver)
                gpu.cpu_affinity = numa_cpus(_text(pynvml.nvmlDeviceGetPciInfo(h).busId))
                slices = _mig_slices(pynvml, h, gpu)
                gpu.mig_unsliced = slices == []  # MIG on, no instance made: nothing to give
                out.extend(slices or [gpu])  # a MIG GPU is its slices: each is given, and busy, on its own
            return out
        except pynvml.NVMLError as exc:
            raise NoGpus(f"NVML: {exc}") from exc
        finally:
            pynvml.nvmlShutdown()


def _process_name(pynvml: Any, pid: int) -> str:
    """A GPU process's name as nvidia-smi's `process_name` gives it (measured on an H200: "" before, `python3` by
    nvidia-smi); "" where NVML cannot tell (another PID namespace, a process gone)."""
    try:
        name = _text(pynvml.nvmlSystemGetProcessName(pid))
    except (pynvml.NVMLError, AttributeError):
        return ""
    return name if name.isprintable() and len(name) <= 256 else ""


_MIG_PROFILE = re.compile(r"MIG ([0-9]+g\.[0-9]+gb(?:\+[a-z]+)?)")


def _mig_slices(pynvml: Any, handle: Any, parent: Gpu) -> list[Gpu] | None:
    """The MIG devices of a GPU in MIG mode, each with its own memory and processes ([] when none is made);
    None when MIG is off."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # a GPU without MIG
        return None
    if current != getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return None
    slices = []
    for j in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except pynvml.NVMLError:  # an empty slot
            continue
        name = _text(pynvml.nvmlDeviceGetName(mig))
        mem = pynvml.nvmlDeviceGetMemoryInfo(mig)
        procs = [
            GpuProcess(p.pid, "", int((p.usedGpuMemory or 0) // 2**20))
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)
        ]
        profile = _MIG_PROFILE.search(name)
        slices.append(
            Gpu(
                parent.index,
                _text(pynvml.nvmlDeviceGetUUID(mig)),
                name,
                int(mem.used // 2**20),
                int(mem.total // 2**20),
                None,  # NVML reports no utilisation for a MIG device
                procs,
                parent.compute_cap,
                parent.driver,
                parent.cpu_affinity,
                mig_parent=parent.uuid,
                mig_profile=profile.group(1) if profile else "",
            )
        )
    return slices


_SMI_GPU_LINE = re.compile(r"GPU ([0-9]+): .* \(UUID: (GPU-[0-9a-fA-F-]+)\)")
_SMI_MIG_LINE = re.compile(r"\s+MIG (\S+)\s+Device\s+([0-9]+): \(UUID: (MIG-[0-9a-fA-F/-]+)\)")


def mig_layout(listing: str) -> dict[str, list[tuple[str, str]]]:
    """`nvidia-smi -L`: each MIG-mode GPU's UUID -> its slices as (profile, MIG- UUID)."""
    layout: dict[str, list[tuple[str, str]]] = {}
    parent = ""
    for line in listing.splitlines()[:4096]:
        gpu = _SMI_GPU_LINE.match(line)
        if gpu:
            parent = gpu.group(2)
            continue
        mig = _SMI_MIG_LINE.match(line)
        if mig and parent:
            layout.setdefault(parent, []).append((mig.group(1), mig.group(3)))
    return layout


def split_mig(
    gpus: list[Gpu], layout: dict[str, list[tuple[str, str]]], on_slices: dict[str, list[GpuProcess]] | None = None
) -> list[Gpu]:
    """nvidia-smi's GPUs with each MIG-mode GPU replaced by its slices. A process nvidia-smi reports on a slice's
    MIG UUID (`on_slices`) is that slice's; one it names only by the GPU counts on every slice of it (it cannot
    be placed, and a free-looking slice that is not would be worse)."""
    out: list[Gpu] = []
    for gpu in gpus:
        slices = layout.get(gpu.uuid)
        if not slices:
            out.append(gpu)
            continue
        for profile, uuid in slices:
            placed = [*gpu.processes, *(on_slices or {}).get(uuid, [])]
            share = gpu.memory_total_mib // max(1, len(slices))
            out.append(
                Gpu(
                    gpu.index,
                    uuid,
                    f"{gpu.name} MIG {profile}",
                    0,
                    share,
                    None,
                    placed,
                    gpu.compute_cap,
                    gpu.driver,
                    gpu.cpu_affinity,
                    mig_parent=gpu.uuid,
                    mig_profile=profile,
                )  # fmt: skip
            )
    return out


def numa_cpus(bus_id: str, sys: Path = Path("/sys")) -> str:
    """The CPUs near a PCI device (`00000000:07:00.0`, as NVIDIA writes it), from sysfs; "" unknown."""
    match = re.fullmatch(r"(?:[0-9a-fA-F]{4})?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])", bus_id.strip())
    if not match:
        return ""
    try:
        text = (sys / "bus/pci/devices" / match.group(1).lower() / "local_cpulist").read_text(errors="replace")
    except OSError:
        return ""
    from imgbuild.hostio.host import parse_cpulist

    try:
        parse_cpulist(text)
    except ValueError:
        return ""
    return text.strip()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_devices(snapshot: str | None = None) -> tuple[list[Gpu], str]:
    """This host's GPUs and where the answer came from: a snapshot when given, else NVML, else
    nvidia-smi. The one reader of GPUs: `gpus`, `run` and `tags --compatible` all come here."""
    readers: list[SnapshotReader | NvmlReader | SmiReader] = (
        [SnapshotReader(snapshot)] if snapshot else [NvmlReader(), SmiReader()]
    )
    errors = []
    for reader in readers:
        try:
            return reader.read(), reader.source
        except NoGpus as exc:
            errors.append(str(exc))
    raise NoGpus("; ".join(errors))


def read_pci(snapshot: str | None = None) -> tuple[PciGpu, ...]:
    """The NVIDIA GPUs on the PCI bus: a snapshot's where it recorded them (`gpus --json` does), else this
    machine's."""
    recorded = SnapshotReader(snapshot).snapshot().pci if snapshot else None
    return nvidia_pci_devices() if recorded is None else recorded


def read_gpus(snapshot: str | None = None, owner: Callable[[int], tuple[str, str]] | None = None) -> list[Gpu]:
    """The GPUs, each process annotated with its user and container (a snapshot keeps those it recorded)."""
    gpus, source = read_devices(snapshot)
    if source == SNAPSHOT_SOURCE:
        return gpus
    for gpu in gpus:
        for proc in gpu.processes:
            proc.user, proc.container = (owner or process_owner)(proc.pid)
    return gpus
