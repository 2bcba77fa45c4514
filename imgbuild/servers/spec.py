"""A run as it will start, pure: the RunSpec (and the `docker run` argument list it renders to, which `--dry-run`
prints), the limit and log flags of the house rules, names `<user>_<name>_<n>`, images named by recipe or
reference, and Jupyter's port, folders and notes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.config.site import RunRules
from imgbuild.engine.types import RunOptions
from imgbuild.errors import UsageError
from imgbuild.facts import Label
from imgbuild.gpu.allocate import Selection
from imgbuild.hostio.host import expand, format_cpulist, parse_cpulist

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.gpu.read import Gpu

#: `--name`: the <name> in <user>_<name>_<n>.
SHORT_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

MAX_CPUS = 4096  # more than any host has: a bound on what reaches docker and the thread variables
#: Thread pools that size themselves to every CPU of the host unless told (PyTorch, NumPy, MKL, OpenBLAS).
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass
class RunSpec:
    image: str
    short_name: str
    user: str
    uid: int
    gid: int
    command: list[str] = field(default_factory=list)
    gpus: Selection = field(default_factory=lambda: Selection([]))
    cpus: float | None = None
    cpuset: list[int] = field(default_factory=list)  # pinned CPUs ([]: not pinned)
    memory: int | None = None  # bytes (run.memory, else three quarters of the host's)
    volumes: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    detach: bool = False
    remove: bool = True
    interactive: bool = False
    tty: bool = False
    name: str = ""
    house: RunRules = field(default_factory=RunRules)
    cwd: Path = field(default_factory=Path.cwd)
    entrypoint: str | None = None
    jupyter_port: int | None = None  # `--jupyter`: the host port on 127.0.0.1
    local_image: bool = False  # built here from a recipe: never pulled (docker.io/<user>/<name> is a stranger's)
    deadline: float | None = None  # when `imgbuild reap` stops it (seconds since the epoch)
    notify: bool = False  # `--notify`: kept after it ends, for the reaper's notice
    enforced: list[Any] | None = None  # enforced mode: the user's mounts as checked (enforce.Mount); None: not
    workdir: str | None = None  # enforced mode: the workspace, mounted among `enforced`
    workspace: bool = True  # the current folder at the house's `run.workspace` (`--no-workspace`: not mounted)
    gpus_by: str = "gpus"  # how the engine is handed them: gpus | env | cdi (run.gpu_path)

    def options(self) -> RunOptions:
        """The container as the engine starts it: the house rules (IPC or shm, ulimits, the workspace, the site's
        mounts and variables, capped logs), the user's mounts, variables and ports, the GPUs and CPUs chosen
        (labelled, with thread counts), and the mode."""
        h = self.house
        labels = [(Label.USER, self.user)]
        labels += [(Label.DEADLINE, f"{self.deadline:.0f}")] if self.deadline is not None else []
        labels += [(Label.NOTIFY, "1")] if self.notify else []
        if self.gpus.gpus:
            labels += [(Label.GPUS, ",".join(str(g.index) for g in self.gpus.gpus))]
            labels += [(Label.GPU_UUIDS, ",".join(self.gpus.uuids))]
        labels += [(key, "") for key in Label.CONTAINER_KEYS if key not in dict(labels)]  # none inherited
        home = home_of_uid(self.uid)
        mounts = [f"{self.cwd}:{h.workspace}"] if self.workspace else []
        mounts += [expand(m, user=self.user, home=home, uid=self.uid) for m in [*h.mounts, *self.volumes]]
        env = sorted(h.env.items())
        env += [(item.partition("=")[0], item.partition("=")[2]) for item in self.env]
        mine = {item.partition("=")[0] for item in self.env}
        env += [(var, str(self.threads)) for var in (THREAD_VARS if self.threads else ()) if var not in mine]
        return RunOptions(
            image=self.image,
            command=tuple(self.command),
            name=self.name,
            user=f"{self.uid}:{self.gid}",
            labels=tuple(labels),
            env=tuple(env),
            mounts=tuple(mounts),
            ports=tuple(self.ports),
            workdir=self.workdir or (h.workspace if self.workspace else None),
            gpus=tuple(self.gpus.uuids),
            gpus_by_env=(self.gpus_by or h.gpu_flag) == "env",  # the nvidia runtime reads it (nvidia-docker2)
            gpus_by_cdi=self.gpus_by == "cdi",  # --device nvidia.com/gpu=UUID (a CDI-only host)
            cpus=self.cpus,
            cpuset=format_cpulist(self.cpuset) if self.cpuset else "",
            memory=self.memory,
            pids_limit=h.pids_limit,
            cgroup_parent=h.cgroup_parent_of(self.user, self.uid, self.gid),
            ipc=h.ipc_mode,
            shm_size=h.shm_size,
            ulimits=tuple(h.ulimits.items()),
            log_max_size=h.log_max_size,
            log_max_file=h.log_max_file,
            remove=self.remove,
            detach=self.detach,
            interactive=self.interactive,
            tty=self.tty,
            pull=not self.local_image,
            hardened=self.enforced is not None,  # a user acting through sudo: their own privileges and no more
            entrypoint=self.entrypoint,
        )

    @property
    def threads(self) -> int | None:
        """Threads per process: the CPUs per GPU (one process per GPU under torchrun), all for CPU jobs."""
        cpus = len(self.cpuset) or int(self.cpus or 0)
        return max(1, cpus // max(1, len(self.gpus.gpus))) if cpus else None


def next_name(user: str, short: str, existing: set[str]) -> str:
    """`<user>_<short>_<n>` with the smallest n that no container (running or stopped) has."""
    n = 1
    while f"{user}_{short}_{n}" in existing:
        n += 1
    return f"{user}_{short}_{n}"


def short_name_of(image: str) -> str:
    from imgbuild.imageref import BadReference, parse

    try:
        last = parse(image).path.rsplit("/", 1)[-1]
    except BadReference:
        last = image.rsplit("/", 1)[-1].split("@")[0].split(":")[0]
    return re.sub(r"[^a-z0-9_.-]", "-", last.lower())[:64].strip("-._") or "job"


def is_recipe(arg: str) -> bool:
    """Does `arg` name a recipe (whose image is built here), rather than an image reference?"""
    path = Path(arg)
    return path.suffix in (".yaml", ".yml") and path.is_file()


def resolve_image(arg: str, settings: Settings, paths: bool = False) -> tuple[str, str]:
    """A recipe file means the image it builds; anything else must be an image reference (or, with `paths`,
    an image file or bundle folder by path). Refused here with one line, not by docker hours later."""
    from imgbuild.imageref import BadReference, file_kind, is_file_path, parse
    from imgbuild.servers.enforce import acting_for_user

    # through sudo a recipe file is not even looked at: root would read it
    if Path(arg).suffix in (".yaml", ".yml") and acting_for_user(settings.caller):
        raise UsageError(
            f"{arg[:120]}: through sudo a run names an image, not a recipe file (a file would be read as root); "
            "give the image the recipe builds, <user>/<name>:<tag>"
        )
    if is_recipe(arg):
        from imgbuild.pipeline.plan import image_and_tag
        from imgbuild.recipe import load_recipe

        loaded = load_recipe(Path(arg), secrets=settings.secrets())
        image, tag = image_and_tag(loaded, settings)
        return f"{image}:{tag}", loaded.recipe.name
    if Path(arg).suffix in (".yaml", ".yml"):
        raise UsageError(f"{arg[:120]}: no such recipe file")
    if paths and (is_file_path(arg) or file_kind(arg)):  # an image file or bundle folder (imageref)
        return arg, short_name_of(Path(arg).stem)
    try:
        parse(arg)
    except BadReference as exc:
        raise UsageError(f"image: {exc}; give REGISTRY/REPO:TAG or a recipe file") from None
    return arg, short_name_of(arg)


#: `--jupyter`: the server's port in the container, its writable folders (the container runs as the caller,
#: whose home may not exist there), and the host ports it may be published on.
JUPYTER_PORT = 8888
JUPYTER_ENV = (
    "JUPYTER_RUNTIME_DIR=/tmp/jupyter/runtime",
    "JUPYTER_DATA_DIR=/tmp/jupyter/data",
    "JUPYTER_CONFIG_DIR=/tmp/jupyter/config",
    "IPYTHONDIR=/tmp/jupyter/ipython",
)
JUPYTER_HOST_PORTS = range(8888, 9888)


def jupyter_command(workspace: str | None) -> list[str]:
    return [
        "jupyter",
        "lab",
        "--ip=0.0.0.0",
        f"--port={JUPYTER_PORT}",
        "--no-browser",
        f"--ServerApp.root_dir={workspace or '/'}",
    ]


def published_ports(specs: list[str]) -> list[int]:
    """The host ports `-p` words publish (`[IP:]HOST[-HIGH]:CONTAINER[/PROTO]`; none where the engine picks one),
    at most 1024 of a range: what a starting run holds in the ledger until its container does."""
    found: list[int] = []
    for spec in specs:
        parts = spec.split("/", 1)[0].rsplit(":", 2)
        low, _, high = (parts[-2] if len(parts) > 1 else "").partition("-")
        if low.isascii() and low.isdigit() and (not high or (high.isascii() and high.isdigit())):
            first = int(low[:5])
            found += range(first, min(int((high or low)[:5]), 65535, first + 1023) + 1)
    return found


def free_port(taken: set[int], candidates: range = JUPYTER_HOST_PORTS) -> int:
    """A host port no container publishes and nothing on 127.0.0.1 listens on."""
    import socket

    for port in candidates:
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise UsageError(f"--jupyter: no free port in {candidates.start}-{candidates.stop - 1} on this host")


def jupyter_notes(spec: RunSpec, host: str) -> list[str]:
    """How to reach a `--jupyter` container from a laptop: the tunnel, then the address with its token."""
    token = next((e.split("=", 1)[1] for e in spec.env if e.startswith("JUPYTER_TOKEN=")), "")
    port = spec.jupyter_port
    return [
        f"on your laptop: ssh -N -L {port}:127.0.0.1:{port} {spec.user}@{host}",
        f"then open:      http://127.0.0.1:{port}/lab?token={token}",
        f"stop it with:   imgbuild stop --rm {spec.name}",
    ]


def gpu_affinity(gpu: Gpu) -> list[int]:
    return cpulist_of(gpu.cpu_affinity or "")


def home_of_uid(uid: int) -> str:
    """`{home}` in a mount: the caller's own home (under sudo $HOME is root's)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return str(Path.home())


def cpulist_of(text: str) -> list[int]:
    try:
        return parse_cpulist(text)
    except ValueError:
        return []


def parse_duration(text: str, what: str) -> float:
    """`90`, `90s`, `30m`, `2h`, `7d` -> seconds (the one grammar: siteconfig.duration_seconds); `what` names
    the flag in the error."""
    from imgbuild.config.checks import duration_seconds

    try:
        return duration_seconds(text)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None
