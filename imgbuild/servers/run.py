"""Start containers the way shared GPU servers want: `<user>_<name>_<n>` names, your UID, --ipc host,
NVIDIA's ulimits, the current folder at /workspace, capped logs, free GPUs only, a CPU share per GPU.

The spec renders to a `docker run` argument list; `--dry-run` prints exactly what is executed.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgbuild.config.site import house_rules
from imgbuild.errors import ImgbuildError, JobFailed, UsageError
from imgbuild.facts import Label
from imgbuild.gpu.allocate import Claim, Claims, Selection, cpus_for, pick_cpus
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
            args += ["-v", expand(mount, user=self.user, home=_home(self.uid), uid=self.uid)]
        args += [word for flag in log_flags(h) for word in flag]
        for key, value in sorted((h.get("env") or {}).items()):
            args += ["-e", f"{key}={value}"]
        return args

    def _io_args(self) -> list[str]:
        """The user's own mounts, environment and ports."""
        args: list[str] = []
        for mount in self.volumes:
            args += ["-v", expand(mount, user=self.user, home=_home(self.uid), uid=self.uid)]
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


# --- your containers, by short name ---------------------------------------------------------------


def find_container(rows: list[dict[str, Any]], name: str, user: str) -> dict[str, Any]:
    """The container `name` means: an exact name, `<user>_<name>`, or the one `<user>_<name>_<n>`."""
    by_name = {r["name"]: r for r in rows}
    for candidate in (name, f"{user}_{name}"):
        if candidate in by_name:
            return by_name[candidate]
    matches = sorted(n for n in by_name if n.startswith(f"{user}_{name}_"))
    if len(matches) == 1:
        return by_name[matches[0]]
    if matches:
        raise UsageError(f"{name!r} matches {', '.join(matches)}: say which")
    raise UsageError(f"no container {name!r} (yours are named {user}_...; see imgbuild ps)")


def check_owner(row: dict[str, Any], who: Any, verb: str, force: bool) -> None:
    """Every verb on a container follows one rule: it is the caller's, or an admin says --force.

    The owner is the `org.imgbuild.user` label `imgbuild run` writes (else the `<user>_` name prefix);
    the caller is who really runs imgbuild (sudo-aware), never a --user flag."""
    if row["user"] == who.name:
        return
    if force and who.is_admin:
        return
    if force:
        raise UsageError(
            f"{row['name']} belongs to {row['user'] or 'nobody known'}: only root may {verb} other users' containers"
        )
    raise UsageError(
        f"{row['name']} belongs to {row['user'] or 'nobody known'}, not to {who.name}"
        + ("; --force to " + verb + " it anyway" if who.is_admin else "")
    )


# --- starting a container -------------------------------------------------------------------------

RLIMIT_HINT = (
    "the engine may not raise the memlock/stack ulimits NVIDIA recommends: start dockerd with "
    "LimitMEMLOCK=infinity, or set run.ulimits in the imgbuild config"
)


@dataclass
class RunRequest:
    """What the user asked `imgbuild run` for, as flags."""

    image: str
    command: list[str] = field(default_factory=list)
    gpu_request: str = "none"
    force: bool = False
    cpus: float | None = None
    volumes: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    short: str | None = None
    detach: bool = False
    keep: bool = False
    shm_size: str | None = None
    no_workspace: bool = False
    as_user: str | None = None
    entrypoint: str | None = None
    interactive: bool = False
    terminal: bool = False
    jupyter: bool = False
    time: str | None = None  # --time: how long the container may run ("2d")
    notify: bool = False  # --notify: a notice when it ends (the reaper's next run)


def read_gpus_or_none(settings: Any) -> list[Any]:
    from imgbuild.gpu.read import NoGpus, read_gpus

    try:
        return read_gpus(settings.gpu_snapshot)
    except NoGpus:
        return []


@dataclass
class Held:
    """What is taken on this host: GPUs given to containers or to starting runs, and pinned CPUs."""

    gpus: Claims = field(default_factory=dict)
    cpus: dict[int, int] = field(default_factory=dict)  # CPU -> how many containers are pinned to it
    ports: set[int] = field(default_factory=set)  # host ports published by containers or starting runs


def gpu_claims(settings: Any) -> Callable[[Any, list[Any]], dict[str, list[Claim]]]:
    """Who else holds which GPU on this host, for a smoke test's choice (build.smoke.ClaimsOf): the ledger's entries
    and the engine's live containers. An unreadable ledger counts for nothing (the GPUs' own processes still do)."""
    from imgbuild.servers.ledger import DEFAULT_STATE_DIR, Ledger

    def read(engine: Any, readings: list[Any]) -> dict[str, list[Claim]]:
        try:
            book = Ledger(house_rules(settings.run)["state_dir"] or DEFAULT_STATE_DIR).read()
            return held_on_host(engine.containers.rows(), book.holds(), readings).gpus
        except ImgbuildError:
            return {}

    return read


def held_on_host(rows: list[dict[str, Any]], entries: list[Any], gpus: list[Any]) -> Held:
    """Claims from the engine's live containers (their labels and cpusets) and the ledger's entries."""
    held = Held()
    uuid_of = {g.index: g.uuid for g in gpus}

    def claim(uuid: str, user: str, what: str) -> None:
        held.gpus.setdefault(uuid, []).append(Claim(user, what))

    for row in rows:
        if row.get("status") not in ("running", "restarting", "paused"):
            continue
        for uuid in container_gpus(row, uuid_of):
            claim(uuid, row["user"], f"container {row['name']}")
        for cpu in _cpulist(row.get("cpuset") or ""):
            held.cpus[cpu] = held.cpus.get(cpu, 0) + 1
        held.ports.update(row.get("ports") or [])
    for entry in entries:
        held.ports.update(entry.ports)
        for uuid in entry.gpus:
            claim(uuid, entry.user, f"{entry.name} starting")
        for cpu in entry.cpus:
            held.cpus[cpu] = held.cpus.get(cpu, 0) + 1
    return held


def container_gpus(row: dict[str, Any], uuid_of: dict[int, str]) -> list[str]:
    """The UUIDs of a container's GPUs, from its labels (indices, for containers started before UUIDs)."""
    uuids = [u for u in (row.get("gpu_uuids") or "").split(",") if u]
    if uuids:
        return uuids
    indices = [int(i) for i in (row.get("gpus") or "").split(",") if i.isdigit()]
    return [uuid_of[i] for i in indices if i in uuid_of]


def running_with_gpus(rows: list[dict[str, Any]], gpus: list[Any]) -> list[tuple[dict[str, Any], list[Any]]]:
    """Each running container with GPUs this host reads, and those GPUs (the reaper's samples, the usage log)."""
    uuid_of = {g.index: g.uuid for g in gpus}
    by_uuid = {g.uuid: g for g in gpus}
    found = []
    for row in rows:
        if row.get("status") == "running":
            held = [by_uuid[u] for u in container_gpus(row, uuid_of) if u in by_uuid]
            if held:
                found.append((row, held))
    return found


def _cpulist(text: str) -> list[int]:
    try:
        return parse_cpulist(text)
    except ValueError:
        return []


def deadline_of(wanted: str | None, house: dict[str, Any], now: float | None = None) -> float | None:
    """`--time` (else the site's default_time) from now, within the site's max_time."""
    seconds = parse_duration(wanted, "--time") if wanted else house.get("default_time")
    if seconds is None:
        return None
    if seconds <= 0:
        raise UsageError(f"--time {wanted}: a deadline must be later than now (e.g. 2h)")
    most = house.get("max_time")
    if most is not None and seconds > most:
        raise UsageError(f"--time {wanted}: this site allows at most {human_duration(most)} (run.max_time)")
    return (time.time() if now is None else now) + seconds


def human_duration(seconds: float) -> str:
    """1d 2h, 45m, 30s."""
    seconds = int(round(seconds))
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "m")]
    text = " ".join(f"{n}{unit}" for n, unit in parts if n)
    return text or f"{seconds}s"


def effective_deadline(row: dict[str, Any], extended: dict[str, Any], house: dict[str, Any]) -> float | None:
    """A container's deadline: its label, moved by `extend` (never past its start + the site's max_time), by
    its owner only (`extended`: container ID -> ledger.Extension)."""
    label = row.get("deadline")
    extension = extended.get(row.get("id") or "")
    moved = extension.deadline if extension is not None and extension.user == row.get("user") else None
    if label is None or moved is None or moved <= label:
        return label
    most = house.get("max_time")
    created = row.get("created_ts")
    if most is not None and created is not None:
        moved = min(moved, created + most)
    return max(label, moved)


def extend(row: dict[str, Any], by: str, house: dict[str, Any]) -> float:
    """Move one container's deadline by `by`, within the site's max_time from its start; the new deadline."""
    from imgbuild.servers.ledger import DEFAULT_STATE_DIR, Extension, Ledger

    seconds = parse_duration(by, "extend")
    if row.get("deadline") is None:
        raise UsageError(f"{row['name']} has no deadline to extend")
    ledger = Ledger(house["state_dir"] or DEFAULT_STATE_DIR)
    with ledger.transaction() as book:
        current = effective_deadline(row, book.extended, house) or 0.0
        wanted = current + seconds
        most = house.get("max_time")
        created = row.get("created_ts")
        if most is not None and created is not None and wanted > created + most + 1:
            raise UsageError(
                f"extend {row['name']} {by}: the site allows {human_duration(most)} from its start (run.max_time); "
                f"at most {human_duration(max(0.0, created + most - current))} more"
            )
        book.extended[row["id"]] = Extension(wanted, row.get("user") or "")
    return wanted


#: What a container says when the host's GPUs were re-attached under it (a `systemctl daemon-reload`
#: rewrites the device cgroup of containers started with NVIDIA's hook).
LOST_GPU_SIGNS = ("NVML: Unknown Error", "Failed to initialize NVML")
LOST_GPU_FIX = (
    "GPUs lost (NVML: Unknown Error, typically after `systemctl daemon-reload` on the host): save your work, "
    "then `imgbuild stop --rm {name}` and start it again (admins: use CDI devices to prevent it)"
)


def gpus_lost(engine: Any, row: dict[str, Any]) -> str:
    """The one-line fix when a running container with GPUs can no longer reach them; "" otherwise."""
    if row.get("status") != "running" or not (row.get("gpus") or row.get("gpu_uuids")):
        return ""
    code, output = engine.containers.probe(row["name"], ["nvidia-smi", "-L"])
    if code != 0 and any(sign in output for sign in LOST_GPU_SIGNS):
        return LOST_GPU_FIX.format(name=row["name"])
    return ""


def lost_containers(engine: Any) -> list[dict[str, str]]:
    """Running containers whose GPUs vanished under them, each with the fix (`imgbuild gpus`)."""
    found = [(r["name"], gpus_lost(engine, r)) for r in engine.containers.rows() if not r.get("smoke")]
    return [{"name": name, "fix": fix} for name, fix in found if fix]


def container_view(engine: Any, settings: Any, now: float | None = None) -> list[dict[str, Any]]:
    """`ps`'s rows: the engine's, with each deadline (as `extend` moved it), the time left, lost GPUs."""
    from imgbuild.errors import EnvironmentProblem
    from imgbuild.servers.ledger import DEFAULT_STATE_DIR, Ledger

    house = house_rules(settings.run)
    try:
        extended = Ledger(house["state_dir"] or DEFAULT_STATE_DIR).read().extended
    except EnvironmentProblem:
        extended = {}
    now = time.time() if now is None else now
    rows = []
    for row in engine.containers.rows():
        if row.get("smoke"):
            continue
        deadline = effective_deadline(row, extended, house)
        left = "" if deadline is None else ("passed" if deadline <= now else human_duration(deadline - now))
        rows.append({**row, "deadline": deadline, "time_left": left, "gpus_lost": gpus_lost(engine, row)})
    return rows


def check_quota(user: str, selection: Selection, held: Held, house: dict[str, Any]) -> None:
    """The site's `max_gpus_per_user` and `max_gpus_per_group` ({group: GPUs all its members hold})."""
    from imgbuild.gpu.allocate import GpusBusy

    if not selection.gpus:
        return
    wanted = set(selection.uuids)

    limits = [("run.max_gpus_per_user", house.get("max_gpus_per_user"), {user}, "you hold")]
    for group, limit in sorted((house.get("max_gpus_per_group") or {}).items()):
        members = group_members(group)
        if user in members:
            limits.append((f"run.max_gpus_per_group {group}", limit, members, f"group {group} holds"))
    for key, limit, members, who in limits:
        if limit is None:
            continue
        have = _holding(held, members)
        total = len(set(have) | wanted)
        if total > int(limit):
            listed = "; ".join(sorted(w for ws in have.values() for w in ws)) or "none"
            raise GpusBusy(
                f"quota: at most {limit} GPUs at once ({key}); {who} {len(have)} ({listed}) and this run asks "
                f"for {len(wanted - set(have))} more"
            )


def _holding(held: Held, members: set[str]) -> dict[str, set[str]]:
    """GPU UUID -> what of `members` holds it."""
    out: dict[str, set[str]] = {}
    for uuid, claims in held.gpus.items():
        for c in claims:
            if c.user in members:
                out.setdefault(uuid, set()).add(f"{c.user}: {c.what}")
    return out


def group_members(group: str) -> set[str]:
    """Users in a Unix group: its listed members and those whose primary group it is."""
    import grp
    import pwd

    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return set()
    return set(entry.gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == entry.gr_gid}


def _home(uid: int) -> str:
    """`{home}` in a mount: the caller's own home (under sudo $HOME is root's)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return str(Path.home())


def _enforce(req: RunRequest, who: Any, house: dict[str, Any], ref: str) -> list[Any] | None:
    """Enforced mode (a user through sudo): the flags, image and mounts checked as the caller; the workspace
    becomes one of the checked mounts. None where imgbuild runs as the user themself or as root."""
    from imgbuild.servers import enforce

    if not enforce.acting_for_user(who):
        return None
    enforce.check_run(req, who, house, ref)
    mounts = enforce.check_mounts(list(req.volumes), who, house)
    if house.get("workspace"):
        try:
            mounts += enforce.check_mounts([f"{Path.cwd()}:{house['workspace']}"], who, house)
        except UsageError as exc:
            raise UsageError(
                f"the current folder as {house['workspace']}: {exc} (cd into it, or --no-workspace)"
            ) from None
        house["enforced_workdir"], house["workspace"] = house["workspace"], None
    return mounts


def prepare(
    req: RunRequest,
    settings: Any,
    held: Held | None = None,
    house: dict[str, Any] | None = None,
    gpus: list[Any] | None = None,
) -> RunSpec:
    """The container to start: house rules, the caller's name and IDs, free GPUs (not `held` by anyone),
    a CPU share pinned near them (no engine yet). `gpus`: this host's GPUs where the caller has read them."""
    from imgbuild.gpu.allocate import select_gpus
    from imgbuild.host import caller, usable_cpus

    house = dict(house if house is not None else house_rules(settings.run))
    held = held or Held()
    if req.shm_size:
        house["shm_size"] = req.shm_size
    if req.no_workspace:
        house["workspace"] = None
    if req.short is not None and not SHORT_NAME_RE.fullmatch(req.short):
        raise UsageError(f"--name: {req.short[:60]!r} is not a container name (letters, digits, _ . -; at most 64)")
    ref, default_short = resolve_image(req.image, settings)
    who = caller()
    user = who.name  # containers are named and owned by who runs imgbuild, never by --user
    enforced = _enforce(req, who, house, ref)
    gpus = read_gpus_or_none(settings) if gpus is None else gpus
    selection = select_gpus(req.gpu_request, gpus, user, force=req.force, claims=held.gpus)
    check_quota(user, selection, held, house)
    if req.cpus is not None and not (math.isfinite(req.cpus) and 0 < req.cpus <= MAX_CPUS):
        raise UsageError(f"--cpus {req.cpus}: not a number of CPUs (above 0, at most {MAX_CPUS})")
    cpus = req.cpus if req.cpus is not None else default_cpus(selection, len(gpus), house.get("cpus_per_gpu"))
    cpuset: list[int] = []
    if cpus and house.get("pin_cpus"):
        near = sorted({c for g in selection.gpus for c in _affinity(g)})
        cpuset = pick_cpus(math.ceil(cpus), near, usable_cpus(), held.cpus)
    uid, gid = host_ids()
    if req.as_user:
        if not re.fullmatch(r"[0-9]+(:[0-9]+)?", req.as_user):
            raise UsageError(f"--user: {req.as_user!r} is not UID or UID:GID")
        uid_text, _, gid_text = req.as_user.partition(":")
        uid, gid = int(uid_text), int(gid_text or uid_text)
    command, env, ports, detach = list(req.command), list(req.env), list(req.ports), req.detach
    if not is_recipe(req.image) and not any(item.startswith("HOME=") for item in env):
        # A stock image run as the caller has HOME=/, which is not writable: pip --user, ~/.cache (torch,
        # Hugging Face, Triton) all fail. Their own home where the site mounts it, else a writable one.
        own = _home(uid)  # the caller's home from the password database: under sudo $HOME is root's
        mounted = [expand(m, user=user, home=own, uid=uid).split(":") for m in house.get("mounts") or []]
        home = own if any(len(m) > 1 and m[1] == own for m in mounted) else "/tmp/home"
        env = [f"HOME={home}", *env]
    jupyter_port = None
    if req.jupyter:
        jupyter_port = free_port(held.ports)
        command = command or jupyter_command(house.get("workspace"))
        env = [*JUPYTER_ENV, f"JUPYTER_TOKEN={secrets.token_hex(24)}", *env]
        ports = [f"127.0.0.1:{jupyter_port}:{JUPYTER_PORT}", *ports]  # this host only: reached by an ssh tunnel
        detach = True
    return RunSpec(
        image=ref,
        short_name=req.short or default_short,
        user=user,
        uid=int(uid),
        gid=int(gid),
        command=command,
        gpus=selection,
        volumes=list(req.volumes),
        env=env,
        ports=ports,
        detach=detach,
        remove=not (req.keep or detach or req.notify),  # a detached job's output must outlive it: `imgbuild logs`
        notify=req.notify,
        interactive=req.interactive and not detach,
        tty=req.terminal and not detach,
        jupyter_port=jupyter_port,
        local_image=is_recipe(req.image),
        deadline=deadline_of(req.time, house),
        house=house,
        entrypoint=req.entrypoint,
        cpus=cpus,
        cpuset=cpuset,
        enforced=enforced,
        workdir=house.get("enforced_workdir"),
    )


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
    return _cpulist(gpu.cpu_affinity or "")


class WaitTimedOut(JobFailed):
    """`run --wait`: the GPUs did not come free in time (exit 1; the place in the queue is given up)."""


def parse_duration(text: str, what: str) -> float:
    """`90`, `90s`, `30m`, `2h`, `7d` -> seconds (the one grammar: siteconfig.duration_seconds); `what` names
    the flag in the error."""
    from imgbuild.config.site import duration_seconds

    try:
        return duration_seconds(text)
    except ValueError as exc:
        raise UsageError(f"{what}: {exc}") from None


@contextlib.contextmanager
def reserved(
    req: RunRequest,
    settings: Any,
    engine: Any,
    wait: float | None = None,
    on_wait: Callable[[int, str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[RunSpec]:
    """The container to start, its name, GPUs and CPUs chosen under the host's ledger lock and held there
    until the block ends (by then the container holds them by its name, labels and cpuset).

    `wait` (seconds): while the GPUs are busy (other users, or the caller's quota), queue for them, first
    come first served across users: only the head of the queue may take GPUs. `on_wait(place, why)` is
    told each look; the place is given up on every way out (and, if this process dies, with it)."""
    from imgbuild.gpu.allocate import GpusBusy
    from imgbuild.host import caller
    from imgbuild.servers.ledger import DEFAULT_STATE_DIR, Ledger

    house = house_rules(settings.run)
    ledger = Ledger(house["state_dir"] or DEFAULT_STATE_DIR)
    ticket = f"wait-{os.getpid()}"
    wants_gpus = req.gpu_request.strip().lower() not in ("", "none")  # the queue is for GPUs only
    deadline = None if wait is None else clock() + wait
    try:
        while True:
            with ledger.transaction() as book:
                queue = [e.name for e in book.queue()]
                ahead = (queue.index(ticket) if ticket in queue else len(queue)) if wants_gpus else 0
                why = f"{ahead} ahead of you"
                if ahead == 0:
                    rows = engine.containers.rows()
                    book.extended = {k: v for k, v in book.extended.items() if k in {r["id"] for r in rows}}
                    gpus = read_gpus_or_none(settings)
                    held = held_on_host(rows, book.holds(), gpus)
                    try:
                        spec = prepare(req, settings, held, house, gpus)
                    except GpusBusy as busy:
                        if deadline is None:
                            raise
                        why = str(busy)
                    else:
                        book.leave(ticket)
                        # Names are handed out here too: two starts at one moment would both take <user>_<name>_1.
                        taken = {r["name"] for r in rows} | {e.name for e in book.entries}
                        spec.name = next_name(spec.user, spec.short_name, taken)
                        ports = [spec.jupyter_port] if spec.jupyter_port else []
                        book.add(spec.name, spec.user, spec.gpus.uuids, spec.cpuset, ports)
                        break
                if deadline is None:  # runs are queued for GPUs: first come, first served
                    raise GpusBusy(
                        f"{ahead} run(s) wait for GPUs before you (imgbuild run --wait); add --wait to queue"
                    )
                book.enqueue(ticket, caller().name, f"--gpus {req.gpu_request}")
            if clock() >= deadline:
                raise WaitTimedOut(f"gave up waiting after {wait:g} s ({why})")
            if on_wait:
                on_wait(ahead + 1, why)
            sleep(float(house["wait_poll"]))
    finally:
        ledger.drop(ticket)
    try:
        yield spec
    finally:
        ledger.drop(spec.name)


def check_signed(image: str, settings: Any) -> str:
    """The image to run: under the site's `run.signed_only` prefixes, only one signed by `run.signing_key`, and
    then by its digest (the tag cannot move between the check and the pull); any other image as it is."""
    from imgbuild import imageref
    from imgbuild.build import attest, verify
    from imgbuild.errors import EnvironmentProblem
    from imgbuild.registry.client import RegistryClient

    rules = settings.run
    if not rules.signed_only or is_recipe(image):
        return image
    try:
        ref = imageref.parse(image)
    except imageref.BadReference as exc:
        raise UsageError(f"image: {exc}; give REGISTRY/REPO:TAG or a recipe file") from None
    prefix = next((p for p in rules.signed_only if ref.name == p or ref.name.startswith(p.rstrip("/") + "/")), None)
    if prefix is None:
        return image
    if not rules.signing_key:
        raise EnvironmentProblem("the site sets run.signed_only but no run.signing_key to check against")
    client = RegistryClient.for_host(ref.registry, settings)
    digest = ref.digest or client.manifest_digest(ref.repository, ref.reference)
    if not digest:
        raise UsageError(f"{image}: the registry has no such image")
    verdict = verify.check_signature(
        client, ref.repository, ref.name, digest, attest.load_verifier(Path(rules.signing_key))
    )
    if not verdict.ok:
        raise UsageError(
            f"{image}: this site runs images under {prefix} only when signed by its key ({verdict.detail})"
        )
    return f"{ref.name}@{digest}"


def check_preload(image: str, engine: Any) -> str:
    """Refuse to start an image whose config sets LD_PRELOAD where the host's toolkit would run it on the host
    (NVIDIAScape); elsewhere, a warning for the caller to print ("" when there is nothing to say)."""
    from imgbuild.gpu.toolkit import image_preload_verdict

    info = engine.images.image(image)
    verdict = image_preload_verdict(list((info.config if info else {}).get("Env") or []), engine.host_has_gpus)
    if verdict is None:
        return ""
    if verdict[0] == "fail":
        raise UsageError(f"{image}: {verdict[1]}")
    return f"note: {image}: {verdict[1]}"


def check_mount_sources(spec: RunSpec) -> None:
    """Every host folder the container mounts exists: docker would create a missing one as root, which the
    user then cannot write (a site's `/work/{user}` not made yet)."""
    for mount in [*(spec.house.get("mounts") or []), *spec.volumes]:
        source = expand(mount, user=spec.user, home=_home(spec.uid), uid=spec.uid).split(":")[0]
        if source.startswith("/") and not os.path.exists(source):
            raise UsageError(
                f"mount {source}: no such folder on this host; docker would create it as root (create it first, "
                "or ask your admin for it)"
            )


@contextlib.contextmanager
def _staged(spec: RunSpec) -> Iterator[None]:
    """Enforced mode: the checked mounts through root's staging binds, for as long as the start needs them."""
    if spec.enforced is None:
        yield
        return
    from imgbuild.servers import enforce

    with enforce.staged(spec.enforced) as volumes:
        spec.volumes = volumes
        enforce.audit("run", sys.argv[1:], f"allowed: starting {spec.name} ({spec.image})", spec.house["state_dir"])
        yield


def start_detached(engine: Any, spec: RunSpec) -> None:
    from imgbuild.errors import ImgbuildError

    check_mount_sources(spec)
    with _staged(spec):
        code, err = engine.containers.run_cli_captured(*spec.cli_invocation())
    if code != 0:
        raise ImgbuildError(explain_start_failure(err))


@dataclass
class RunOutcome:
    code: int
    seconds: float
    rows: list[dict[str, Any]] = field(default_factory=list)  # per GPU: mean/max utilisation and memory
    hint: str = ""
    start_failed: bool = False


def start_attached(engine: Any, spec: RunSpec, settings: Any) -> RunOutcome:
    """Run the container in the foreground, sampling its GPUs every 2 s for the job summary."""
    import subprocess
    import threading
    import time

    from imgbuild.errors import ImgbuildError
    from imgbuild.gpu.allocate import Sample, summarize

    samples: list[Sample] = []
    stop = threading.Event()
    wanted = {g.index for g in spec.gpus.gpus}

    def sample() -> None:
        while not stop.wait(2.0):
            try:
                now = [g for g in read_gpus_or_none(settings) if g.index in wanted]
            except (ImgbuildError, OSError, subprocess.SubprocessError):  # a reading lost: the summary has gaps
                now = []
            samples.append(
                Sample(
                    {g.index: g.utilization or 0 for g in now},
                    {g.index: g.memory_used_mib for g in now},
                    engine.containers.cpu_percent(spec.name),
                )
            )

    check_mount_sources(spec)
    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    if wanted:
        sampler.start()
    with _staged(spec):
        code = engine.containers.run_cli(*spec.cli_invocation())
    stop.set()
    outcome = RunOutcome(code, time.monotonic() - started, start_failed=code in (125, 126))
    if wanted:
        sampler.join(timeout=5)
        outcome.rows, outcome.hint = summarize(samples, spec.cpus)
    return outcome


def explain_start_failure(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else "docker run failed"
    if "rlimit" in text:
        reason = text[text.find("error setting rlimit") :].removesuffix(": unknown.")
        return f"the container did not start ({reason}); {RLIMIT_HINT}"
    return f"the container did not start: {text[-300:]}"
