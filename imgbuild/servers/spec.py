"""A run as it will start, pure: the RunSpec (and the `docker run` argument list it renders to, which `--dry-run`
prints), the limit and log flags of the house rules, names `<user>_<name>_<n>`, images named by recipe or
reference, and Jupyter's port, folders and notes."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgbuild.config.site import house_rules
from imgbuild.errors import UsageError
from imgbuild.facts import Label
from imgbuild.gpu.allocate import Selection, cpus_for
from imgbuild.host import expand, format_cpulist, parse_cpulist

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
    volumes: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    detach: bool = False
    remove: bool = True
    interactive: bool = False
    tty: bool = False
    name: str = ""
    house: dict[str, Any] = field(default_factory=lambda: house_rules({}))
    cwd: Path = field(default_factory=Path.cwd)
    entrypoint: str | None = None
    jupyter_port: int | None = None  # `--jupyter`: the host port on 127.0.0.1
    local_image: bool = False  # built here from a recipe: never pulled (docker.io/<user>/<name> is a stranger's)
    deadline: float | None = None  # when `imgbuild reap` stops it (seconds since the epoch)
    notify: bool = False  # `--notify`: kept after it ends, for the reaper's notice
    enforced: list[Any] | None = None  # enforced mode: the user's mounts as checked (enforce.Mount); None: not
    workdir: str | None = None  # enforced mode: the workspace, mounted among `enforced`

    def docker_args(self) -> list[str]:
        """`docker run ...` arguments (without the `docker` binary)."""
        identity = ["--name", self.name, "--user", f"{self.uid}:{self.gid}", "--label", f"{Label.USER}={self.user}"]
        if self.deadline is not None:
            identity += ["--label", f"{Label.DEADLINE}={self.deadline:.0f}"]
        if self.notify:
            identity += ["--label", f"{Label.NOTIFY}=1"]
        return [
            "run",
            *identity,
            *self._house_args(),
            *self._io_args(),
            *self.resource_args(),
            *self._mode_args(),
            self.image,
            *self.command,
        ]

    def _house_args(self) -> list[str]:
        """The site's house rules: IPC or shm, ulimits, the workspace and data mounts, capped logs, env."""
        h = self.house
        args = [word for flag in limit_flags(h) for word in flag]
        workspace = h.get("workspace")
        if workspace:
            args += ["-v", f"{self.cwd}:{workspace}", "-w", str(workspace)]
        for mount in h.get("mounts") or []:
            args += ["-v", expand(mount, user=self.user, home=home_of_uid(self.uid), uid=self.uid)]
        args += [word for flag in log_flags(h) for word in flag]
        for key, value in sorted((h.get("env") or {}).items()):
            args += ["-e", f"{key}={value}"]
        return args

    def _io_args(self) -> list[str]:
        """The user's own mounts, environment and ports."""
        args: list[str] = []
        for mount in self.volumes:
            args += ["-v", expand(mount, user=self.user, home=home_of_uid(self.uid), uid=self.uid)]
        for item in self.env:
            args += ["-e", item]
        for port in self.ports:
            args += ["-p", port]
        return args

    def resource_args(self) -> list[str]:
        """The GPUs (and their labels), CPUs and thread counts the house rules gave it."""
        args: list[str] = []
        if self.gpus.gpus:
            indices = ",".join(str(g.index) for g in self.gpus.gpus)
            uuids = ",".join(self.gpus.uuids)
            if self.house.get("gpu_flag") == "env":  # the nvidia runtime reads it (nvidia-docker2 servers)
                args += ["-e", f"NVIDIA_VISIBLE_DEVICES={uuids}"]
            else:
                args += ["--gpus", f'"device={uuids}"']
            args += ["--label", f"{Label.GPUS}={indices}", "--label", f"{Label.GPU_UUIDS}={uuids}"]
        else:
            # No GPU asked for: none seen either, even where the engine's default runtime is nvidia and the
            # image (NGC) says NVIDIA_VISIBLE_DEVICES=all.
            args += ["-e", "NVIDIA_VISIBLE_DEVICES=void"]
        if self.cpus:
            args += ["--cpus", f"{self.cpus:g}"]
        if self.cpuset:
            args += ["--cpuset-cpus", format_cpulist(self.cpuset)]
        threads = self.threads
        mine = {item.partition("=")[0] for item in self.env}
        for var in THREAD_VARS if threads else ():
            if var not in mine:  # the user's own -e wins
                args += ["-e", f"{var}={threads}"]
        return args

    @property
    def threads(self) -> int | None:
        """Threads per process: the CPUs per GPU (one process per GPU under torchrun), all for CPU jobs."""
        cpus = len(self.cpuset) or int(self.cpus or 0)
        return max(1, cpus // max(1, len(self.gpus.gpus))) if cpus else None

    def _mode_args(self) -> list[str]:
        flags = [("--rm", self.remove), ("-d", self.detach), ("-i", self.interactive), ("-t", self.tty)]
        args = [flag for flag, on in flags if on] + (["--pull", "never"] if self.local_image else [])
        if self.enforced is not None:  # a user acting through sudo: their own privileges and no more
            args += ["--security-opt", "no-new-privileges", "--cap-drop", "ALL"]
        if self.workdir:
            args += ["-w", self.workdir]
        return args + (["--entrypoint", self.entrypoint] if self.entrypoint is not None else [])

    def cli_invocation(self) -> tuple[list[str], dict[str, str]]:
        """The `docker run` argv to execute, and the values it takes from its own environment: each
        `-e NAME=VALUE` is passed as `-e NAME`, so no value (the Jupyter token, a user's HF_TOKEN) stands in an
        argv that every user of the host can read in /proc/PID/cmdline."""
        words = self.docker_args()
        options, rest = words[: -(len(self.command) + 1)], words[-(len(self.command) + 1) :]
        args: list[str] = []
        env: dict[str, str] = {}
        i = 0
        while i < len(options):
            if options[i] == "-e" and i + 1 < len(options) and "=" in options[i + 1]:
                name, value = options[i + 1].split("=", 1)
                env[name] = value
                args += ["-e", name]
                i += 2
                continue
            args.append(options[i])
            i += 1
        return args + rest, env

    def command_line(self, docker: str = "docker") -> str:
        return shlex.join([docker, *self.docker_args()])


def limit_flags(house: dict[str, Any]) -> list[tuple[str, str]]:
    """(flag, value) for the house rules' IPC or shm and ulimits: `imgbuild run` and dev containers alike."""
    flags = (
        [("--shm-size", str(house["shm_size"]))]
        if house.get("shm_size")
        else [("--ipc", str(house.get("ipc") or "host"))]
    )
    return flags + [("--ulimit", f"{key}={value}") for key, value in (house.get("ulimits") or {}).items()]


def log_flags(house: dict[str, Any]) -> list[tuple[str, str]]:
    """(flag, value) for the house rules' capped json-file logs."""
    return [
        ("--log-driver", "json-file"),
        ("--log-opt", f"max-size={house.get('log_max_size', '50m')}"),
        ("--log-opt", f"max-file={house.get('log_max_file', '3')}"),
    ]


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


#: Image files and folders a cluster runtime takes by path (Apptainer, enroot, OCI bundles).
IMAGE_FILE_SUFFIXES = (".sif", ".sqsh", ".squashfs", ".oci")


def resolve_image(arg: str, settings: Any, paths: bool = False) -> tuple[str, str]:
    """A recipe file means the image it builds; anything else must be an image reference (or, with `paths`,
    an image file or bundle folder by path). Refused here with one line, not by docker hours later."""
    from imgbuild.imageref import BadReference, parse
    from imgbuild.servers.enforce import acting_for_user

    if Path(arg).suffix in (".yaml", ".yml") and acting_for_user():  # not even looked at: root would read it
        raise UsageError(
            f"{arg[:120]}: through sudo a run names an image, not a recipe file (a file would be read as root); "
            "give the image the recipe builds, <user>/<name>:<tag>"
        )
    if is_recipe(arg):
        from imgbuild.build.plan import image_and_tag
        from imgbuild.recipe import load_recipe

        loaded = load_recipe(Path(arg), secrets=settings.secrets())
        image, tag = image_and_tag(loaded, settings)
        return f"{image}:{tag}", loaded.recipe.name
    if Path(arg).suffix in (".yaml", ".yml"):
        raise UsageError(f"{arg[:120]}: no such recipe file")
    if paths and (arg.startswith(("/", "./", "../")) or arg.endswith(IMAGE_FILE_SUFFIXES)):
        return arg, short_name_of(Path(arg).stem)
    try:
        parse(arg)
    except BadReference as exc:
        raise UsageError(f"image: {exc}; give REGISTRY/REPO:TAG or a recipe file") from None
    return arg, short_name_of(arg)


def default_cpus(selection: Selection, total_gpus: int, per_gpu: float | None) -> float | None:
    return cpus_for(len(selection.gpus), os.cpu_count() or 1, total_gpus, per_gpu)


def host_ids() -> tuple[int, int]:
    """The caller's UID:GID (the sudo caller's when run through sudo)."""
    from imgbuild.host import caller

    who = caller()
    return who.uid, who.gid


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


def _affinity(gpu: Any) -> list[int]:
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
    from imgbuild.config.site import duration_seconds

    try:
        return duration_seconds(text)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None
