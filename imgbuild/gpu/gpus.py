"""GPUs on a shared server: read them (NVML, nvidia-smi, or a saved snapshot), say who uses them, pick free ones.

Readers fill one shape (`Gpu`, `GpuProcess`); selection and refusal are pure functions over it, so they
are tested with readings shaped like real servers.
"""

from __future__ import annotations

import json
import pwd
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from imgbuild import limits
from imgbuild.errors import EnvironmentProblem, UsageError


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

    @property
    def users(self) -> set[str]:
        return {p.user for p in self.processes if p.user}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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
        apps_call, full_call, short_call, bus_call, list_call = self.CALLS
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
                    GpuProcess(p.pid, "", int((p.usedGpuMemory or 0) // 2**20))
                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                ]
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                name, uuid = _text(pynvml.nvmlDeviceGetName(h)), _text(pynvml.nvmlDeviceGetUUID(h))
                used, total = int(mem.used // 2**20), int(mem.total // 2**20)
                gpu = Gpu(i, uuid, name, used, total, util, procs, f"{major}.{minor}", driver)
                gpu.cpu_affinity = numa_cpus(_text(pynvml.nvmlDeviceGetPciInfo(h).busId))
                slices = _mig_slices(pynvml, h, gpu)
                out.extend(slices or [gpu])  # a MIG GPU is its slices: each is given, and busy, on its own
            return out
        except pynvml.NVMLError as exc:
            raise NoGpus(f"NVML: {exc}") from exc
        finally:
            pynvml.nvmlShutdown()


_MIG_PROFILE = re.compile(r"MIG ([0-9]+g\.[0-9]+gb(?:\+[a-z]+)?)")


def _mig_slices(pynvml: Any, handle: Any, parent: Gpu) -> list[Gpu]:
    """The MIG devices of a GPU in MIG mode, each with its own memory and processes; [] when MIG is off."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # a GPU without MIG
        return []
    if current != getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return []
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
    from imgbuild.host import parse_cpulist

    try:
        parse_cpulist(text)
    except ValueError:
        return ""
    return text.strip()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class SnapshotReader:
    """Readings saved as JSON (`imgbuild gpus --json > snap.json`): to plan or test without the server."""

    source = "snapshot"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def read(self) -> list[Gpu]:
        try:
            with self.path.open("rb") as handle:
                data = json.loads(handle.read(limits.HTTP_BODY_BYTES + 1)[: limits.HTTP_BODY_BYTES])
            gpus = data["gpus"] if isinstance(data, dict) else data
            return [Gpu(**{**g, "processes": [GpuProcess(**p) for p in g.get("processes", [])]}) for g in gpus]
        except OSError as exc:
            raise UsageError(f"{self.path}: cannot read the GPU snapshot: {exc.strerror}") from exc
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise UsageError(f"{self.path}: not a GPU snapshot (`imgbuild gpus --json` writes one)") from exc


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


def read_gpus(snapshot: str | None = None, owner: Callable[[int], tuple[str, str]] | None = None) -> list[Gpu]:
    """The GPUs, each process annotated with its user and container (a snapshot keeps those it recorded)."""
    gpus, source = read_devices(snapshot)
    if source == SnapshotReader.source:
        return gpus
    for gpu in gpus:
        for proc in gpu.processes:
            proc.user, proc.container = (owner or process_owner)(proc.pid)
    return gpus


# --- GPUs read through the engine -------------------------------------------------------------------
#
# Where the engine is not on this machine's kernel (DOCKER_HOST=tcp:// or ssh://, or imgbuild itself in a
# container with the socket mounted), this machine's /dev, driver and NVML say nothing of the engine's GPUs.
# They are read in a short-lived container of the image at hand, given every GPU: nvidia-smi (the toolkit
# mounts it) answers SmiReader's calls, and the host's PCI bus (/sys is not namespaced) says whether NVIDIA
# GPUs are there at all, even where the engine cannot pass them.

ENGINE_READ_MARKER = "IMGBUILD-ENGINE-GPUS "
#: Runs in the image: stdlib only. Bounded: 30 s per call, 256 KiB kept per answer.
ENGINE_READ_SCRIPT = """
import glob, json, os, shutil, subprocess
nvidia = 0
for dev in glob.glob("/sys/bus/pci/devices/*")[:4096]:
    try:
        with open(dev + "/vendor") as v, open(dev + "/class") as c:
            if v.read(16).strip() == "0x10de" and c.read(16).strip().startswith("0x03"):
                nvidia += 1
    except OSError:
        pass
smi = shutil.which("nvidia-smi")
answers = {}
for args in json.loads(os.environ.get("IMGBUILD_SMI_CALLS", "[]"))[:8]:
    key = " ".join(args)
    if not smi:
        answers[key] = {"code": 127, "out": "", "err": "nvidia-smi not found in the container"}
        continue
    try:
        p = subprocess.run([smi, *args], capture_output=True, text=True, timeout=30)
        answers[key] = {"code": p.returncode, "out": p.stdout[:262144], "err": p.stderr[-2000:]}
    except (OSError, subprocess.TimeoutExpired) as exc:
        answers[key] = {"code": 126, "out": "", "err": str(exc)[:200]}
print("IMGBUILD-ENGINE-GPUS " + json.dumps({"pci_nvidia": nvidia, "smi": answers}), flush=True)
"""

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
    data: Any = None
    for line in output.splitlines():
        if line.startswith(ENGINE_READ_MARKER):
            try:
                data = json.loads(line[len(ENGINE_READ_MARKER) :][: limits.HTTP_BODY_BYTES])
            except ValueError:
                data = None
    if not isinstance(data, dict) or code != 0:
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
    others = [p for p in gpu.processes if p.user and p.user != me]
    held = [f"{p.user} (pid {p.pid} {p.name or '?'}{' in ' + p.container if p.container else ''})" for p in others] + [
        f"{c.user} ({c.what})" for c in (claims or {}).get(gpu.uuid, []) if c.user != me
    ]
    return ", ".join(dict.fromkeys(held))


def _mine(gpu: Gpu, me: str, claims: Claims | None) -> str:
    return ", ".join(c.what for c in (claims or {}).get(gpu.uuid, []) if c.user == me)


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
    by_index = {g.index: g for g in gpus}
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
        wanted = [int(x) for x in request.removeprefix("device=").split(",") if x]
        missing = [i for i in wanted if i not in by_index]
        if missing:
            raise UsageError(f"--gpus {request}: no GPU {missing[0]} (this host has {len(gpus)}: 0-{len(gpus) - 1})")
        chosen = [by_index[i] for i in dict.fromkeys(wanted)]
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
