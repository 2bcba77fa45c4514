"""`imgbuild doctor`: the host as a lab admin needs to see it before users arrive, each line ok, warn or fail
with its fix.

Pure in the middle: `judge(HostFacts)` decides every line from recorded facts (tests feed snapshots of real
hosts); `collect()` at the edge reads this machine and its engine (the driver's version file, the toolkit's
own version commands, the engine's info, CDI spec folders, cgroups, the docker group). Nothing is changed.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from imgbuild.gpu.fleet import branch_outside
from imgbuild.gpu.read import PciGpu
from imgbuild.gpu.toolkit import TOOLKIT_ADVISORIES, toolkit_version, version_tuple

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings

#: The memlock limit NCCL and RDMA want in a container: unlimited; below this, say so.
MEMLOCK_WANTED = 64 * 2**30


@dataclass(frozen=True)
class HostFacts:
    driver: str | None = None  # "580.95.05"; None: no NVIDIA kernel module
    gpus: tuple[dict[str, Any], ...] = ()  # {"index", "name", "capability" "8.0", "mig": bool}
    gpu_error: str = ""  # why the GPUs could not be read
    toolkit: str | None = None  # "1.17.8"; None: not installed
    engine: dict[str, Any] = field(default_factory=dict)  # Engine.host_info()
    cdi_specs: tuple[str, ...] = ()  # spec files in /etc/cdi and /var/run/cdi
    memlock: int | None = 0  # bytes the engine's containers may lock (its daemon's limit); None: unlimited
    cgroup: str = ""  # "v2", "v1", "hybrid"
    docker_group: tuple[str, ...] = ()  # the users in the docker group (root-equivalent on the host)
    pci_gpus: tuple[PciGpu, ...] = ()  # the NVIDIA GPUs on the PCI bus, driven or not, with their driver binding


@dataclass(frozen=True)
class Line:
    check: str
    status: str  # ok | warn | fail | info
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def judge(facts: HostFacts) -> list[Line]:
    """Every line, from the facts alone."""
    return [
        *_driver_lines(facts),
        *_toolkit_lines(facts),
        *_engine_lines(facts),
        _memlock_line(facts),
        _cgroup_line(facts),
        _docker_group_line(facts),
    ]


def _driver_lines(facts: HostFacts) -> list[Line]:
    if facts.driver is None:
        return [Line("driver", "info", "no NVIDIA driver: a build host without GPUs (the GPU lines are skipped)")]
    branch = version_tuple(facts.driver)[0]
    lines = [Line("driver", "ok", f"NVIDIA driver {facts.driver} (R{branch})")]
    if facts.gpu_error:
        lines.append(
            Line(
                "gpus",
                "fail",
                f"the driver is loaded but the GPUs cannot be read: {facts.gpu_error}",
                "check nvidia-smi; a fabric manager that is down (HGX, DGX) leaves CUDA error 802",
            )
        )
        return lines
    names = ", ".join(f"{g.get('index')}: {g.get('name')}" for g in facts.gpus) or "none"
    lines.append(Line("gpus", "ok" if facts.gpus else "warn", f"{len(facts.gpus)} GPU(s): {names}"))
    lines += _bus_lines(facts, branch)
    for gpu in facts.gpus:
        capability = version_tuple(str(gpu.get("capability") or ""))
        outside = branch_outside((capability[0], capability[1]), facts.driver) if len(capability) >= 2 else None
        if outside:
            where, _, bound = outside
            need = f"R{bound} or later" if where == "before" else f"R{bound} at the latest"
            lines.append(
                Line(
                    "gpus",
                    "fail",
                    f"GPU {gpu.get('index')} ({gpu.get('name')}) needs {need}; this is R{branch}",
                    "install a driver branch that supports this GPU",
                )
            )
    mig = [str(g.get("index")) for g in facts.gpus if g.get("mig")]
    if mig:
        lines.append(
            Line(
                "mig",
                "warn",
                f"MIG is enabled on GPU {', '.join(mig)}",
                "imgbuild gives each slice on its own (by MIG- UUID); with nvidia-ml-py it also sees which slice a "
                "process runs on (nvidia-smi alone counts a process on every slice of its GPU)",
            )
        )
    return lines


def _bus_lines(facts: HostFacts, branch: int) -> list[Line]:
    """What the PCI bus has that the driver does not list, each by its cause: a GPU passed to virtual machines
    (vfio-pci), one bound to another driver (nouveau), one bound to nvidia that the driver lost (fallen off the
    bus, Xid 79), and one no driver binds (a branch that dropped, or predates, its architecture)."""
    lines = []
    vfio = [g for g in facts.pci_gpus if g.driver == "vfio-pci"]
    if vfio:
        names = ", ".join(g.label for g in vfio)
        lines.append(Line("gpus", "info", f"{len(vfio)} GPU(s) passed to virtual machines (vfio-pci): {names}"))
    other = [g for g in facts.pci_gpus if g.driver not in ("", "nvidia", "vfio-pci")]
    for gpu in other:
        lines.append(
            Line(
                "gpus",
                "fail",
                f"GPU {gpu.label} is bound to {gpu.driver}, not nvidia: containers cannot use it",
                f"blacklist {gpu.driver} (/etc/modprobe.d) and reload the nvidia driver",
            )
        )
    bound = [g for g in facts.pci_gpus if g.driver == "nvidia"]
    if len(bound) > len(facts.gpus):
        lines.append(
            Line(
                "gpus",
                "fail",
                f"{len(bound)} GPU(s) bound to nvidia ({', '.join(g.label for g in bound)}), the driver lists "
                f"{len(facts.gpus)}: {len(bound) - len(facts.gpus)} fell off the bus or failed to start",
                "dmesg | grep -i xid (Xid 79: fallen off the bus); reset it (nvidia-smi -r -i N) or reboot, and check "
                "its power and cooling",
            )
        )
    if any(g.driver for g in facts.pci_gpus):  # a sysfs that shows bindings: each GPU judged by its own
        unbound = [g for g in facts.pci_gpus if not g.driver]
        missing = len(unbound)
    else:  # no bindings to read: only a count against what the driver lists
        unbound, missing = [], len(facts.pci_gpus) - len(facts.gpus)
    if missing > 0:
        lines.append(_undriven(unbound, missing, branch))
    return lines


def _undriven(gpus: list[PciGpu], missing: int, branch: int) -> Line:
    """GPUs on the PCI bus no driver binds: a branch that dropped (or predates) their architecture."""
    from imgbuild.gpu.support import ARCH_DRIVER_BRANCHES

    ended = sorted({last for first, last in ARCH_DRIVER_BRANCHES.values() if last is not None and last < branch})
    newer = sorted({first for first, _ in ARCH_DRIVER_BRANCHES.values() if first > branch})
    why = []
    if ended:
        archs = ", ".join(
            f"sm_{c[0]}{c[1]}" for c, (_, last) in sorted(ARCH_DRIVER_BRANCHES.items()) if last and last < branch
        )
        why.append(f"R{branch} no longer drives {archs} (their last branches: {', '.join(f'R{e}' for e in ended)})")
    if newer:
        why.append(f"GPUs newer than R{branch} need R{newer[0]} or later")
    which = f": {', '.join(g.label for g in gpus)}," if gpus else ""
    cause = "; ".join(why) or "see dmesg for NVRM"
    return Line(
        "gpus",
        "fail",
        f"{missing} NVIDIA GPU(s) on the PCI bus{which} that no driver binds ({cause})",
        "run a driver branch that drives every GPU of the machine, or move the older GPUs to a host that keeps "
        "their branch",
    )


def _toolkit_lines(facts: HostFacts) -> list[Line]:
    if facts.toolkit is None:
        if facts.driver is None:
            return [Line("toolkit", "info", "no NVIDIA Container Toolkit (no GPU here to pass to containers)")]
        return [
            Line(
                "toolkit",
                "fail",
                "the NVIDIA Container Toolkit is not installed: containers get no GPU",
                "install nvidia-container-toolkit, then nvidia-ctk runtime configure --runtime=docker",
            )
        ]
    for fixed, advisory in TOOLKIT_ADVISORIES:
        if version_tuple(facts.toolkit) < version_tuple(fixed):
            return [
                Line(
                    "toolkit",
                    "fail",
                    f"NVIDIA Container Toolkit {facts.toolkit} is vulnerable to {advisory}",
                    f"upgrade to {TOOLKIT_ADVISORIES[0][0]} or later",
                )
            ]
    return [Line("toolkit", "ok", f"NVIDIA Container Toolkit {facts.toolkit} (no known container escape)")]


def _engine_lines(facts: HostFacts) -> list[Line]:
    engine = facts.engine
    if engine.get("error"):
        return [
            Line(
                "engine",
                "fail",
                f"the container engine does not answer: {engine['error']}",
                "start it (systemctl start docker), or set DOCKER_HOST",
            )
        ]
    lines = [
        Line(
            "engine", "ok", f"engine {engine.get('version') or '?'}, runtimes {', '.join(engine.get('runtimes') or [])}"
        )
    ]
    if engine.get("default_runtime") == "nvidia":
        lines.append(
            Line(
                "default runtime",
                "warn",
                "the default runtime is nvidia: any container of an NGC image (NVIDIA_VISIBLE_DEVICES=all) "
                "sees every GPU, other users' too, unless told void (imgbuild does; docker run does not)",
                "set default-runtime back to runc in /etc/docker/daemon.json; GPUs by --gpus or CDI",
            )
        )
    cdi = list(facts.cdi_specs) + [d for d in engine.get("cdi_devices") or [] if d]
    if cdi:
        lines.append(Line("cdi", "ok", f"CDI: {', '.join(cdi[:6])}"))
    elif facts.driver is not None:
        lines.append(
            Line(
                "cdi",
                "info",
                "no CDI specs (the legacy --gpus path is used)",
                "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml, for Podman and CDI-only engines",
            )
        )
    return lines


def _memlock_line(facts: HostFacts) -> Line:
    if facts.memlock is None or facts.memlock >= MEMLOCK_WANTED:
        return Line("memlock", "ok", "containers may lock memory without limit (NCCL, RDMA)")
    return Line(
        "memlock",
        "warn",
        f"containers may lock {facts.memlock // 2**20} MiB: NCCL and RDMA want unlimited, "
        "and `--ulimit memlock=-1` fails to start",
        "LimitMEMLOCK=infinity for the engine (systemd), or "
        "lower the site's run.ulimits.memlock to what the engine allows",
    )


def _cgroup_line(facts: HostFacts) -> Line:
    if facts.cgroup == "v2":
        return Line("cgroups", "ok", "cgroup v2")
    return Line(
        "cgroups",
        "warn",
        f"cgroup {facts.cgroup or 'unknown'}: CPU and memory limits per container and per "
        "Slurm step are v2's strength; current toolkits and Slurm expect it",
        "boot with systemd.unified_cgroup_hierarchy=1",
    )


def _docker_group_line(facts: HostFacts) -> Line:
    if not facts.docker_group:
        return Line("docker group", "ok", "no user is in the docker group")
    users = ", ".join(facts.docker_group[:12]) + (" ..." if len(facts.docker_group) > 12 else "")
    return Line(
        "docker group",
        "warn",
        f"{len(facts.docker_group)} user(s) in the docker group, each root on this "
        f"host (docker run -v /:/host): {users}; the house rules are advisory to them",
        "remove them from the group where the site's rules must hold",
    )


# --- the edge: this machine ---------------------------------------------------------------------------------


def _driver_version() -> str | None:
    from pathlib import Path

    try:
        text = Path("/proc/driver/nvidia/version").read_text()[:4096]
    except OSError:
        return None
    found = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+([0-9]{3}\.[0-9]{1,3}(?:\.[0-9]{1,3})?)", text)
    return found.group(1) if found else None


def _engine_memlock() -> int | None:
    """The engine daemon's own memlock limit (its containers cannot be given more); this process's if no daemon
    is found. None: unlimited."""
    from pathlib import Path

    limits = Path("/proc/self/limits")
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() in ("dockerd", "podman"):
                limits = proc / "limits"
                break
        except OSError:
            continue
    try:
        for line in limits.read_text().splitlines():
            if line.startswith("Max locked memory"):
                soft = line.split()[3]
                return None if soft == "unlimited" else int(soft)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _cgroup_version() -> str:
    from pathlib import Path

    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "v2"
    return "hybrid" if Path("/sys/fs/cgroup/unified").is_dir() else "v1"


def _docker_group() -> tuple[str, ...]:
    import grp
    import pwd

    try:
        group = grp.getgrnam("docker")
    except KeyError:
        return ()
    members = set(group.gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == group.gr_gid}
    return tuple(sorted(members))


def collect(settings: Settings, engine_info: dict[str, Any]) -> HostFacts:
    """This machine, read (nothing changed), with what its engine said of itself (`host_info()`)."""
    from pathlib import Path

    from imgbuild.gpu.read import NoGpus, read_gpus, read_pci

    driver = _driver_version()
    gpus: list[dict[str, Any]] = []
    gpu_error = ""
    if driver is not None:
        try:
            seen: dict[int, dict[str, Any]] = {}
            for gpu in read_gpus(settings.gpu_snapshot):  # a MIG GPU's slices: one line
                entry = seen.setdefault(
                    gpu.index, {"index": gpu.index, "name": gpu.name, "capability": gpu.compute_cap}
                )
                entry["mig"] = entry.get("mig", False) or bool(gpu.mig_parent)
                if gpu.mig_parent:
                    entry["name"] = gpu.name.split(" MIG ")[0]
            gpus = list(seen.values())
        except NoGpus as exc:
            gpu_error = str(exc)[:200]
    specs = tuple(
        str(p) for folder in ("/etc/cdi", "/var/run/cdi") for p in sorted(Path(folder).glob("*")) if p.is_file()
    )
    return HostFacts(
        driver=driver,
        gpus=tuple(gpus),
        gpu_error=gpu_error,
        toolkit=toolkit_version(),
        engine=engine_info,
        cdi_specs=specs[:20],
        memlock=_engine_memlock(),
        cgroup=_cgroup_version(),
        docker_group=_docker_group(),
        pci_gpus=read_pci(settings.gpu_snapshot) if driver is not None else (),
    )
