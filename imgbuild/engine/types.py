"""The engine's own types and the protocol the pipeline asks of an engine (docker-py stays behind it)."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from imgbuild import limits
from imgbuild.engine.lease import LeaseStore
from imgbuild.hostio.acting import ContainerUser
from imgbuild.payload.probes import Probe
from imgbuild.text import printable

ProgressFn = Callable[[str], None]


class Redactor:
    """Replaces secret values in any text that goes to a log or a terminal."""

    def __init__(self, secrets: Iterable[str]):
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "****")
        return text


@dataclass
class BuildRequest:
    context: Path
    tag: str
    build_args: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, Path] = field(default_factory=dict)  # id -> file (BuildKit only)
    no_cache: bool = False
    log_path: Path | None = None
    builder: str | None = None
    iidfile: Path | None = None  # where BuildKit writes the image id; one per build, never shared
    timeout: float = limits.BUILD_SECONDS  # the build is stopped past this
    inline_cache: bool = False  # the image carries BuildKit's cache record, so a registry copy can seed another build
    cache_from: tuple[str, ...] = ()  # registry images whose inline cache seeds this build (a fresh CI runner)
    cache_to: str = ""  # a registry ref for a full cache export (buildx: mode=max; Buildah: a repository); "" none
    cache_auth: dict[str, str] | None = None  # credentials for cache_from/cache_to (Podman: an auth file, never argv)
    timestamp: int | None = None  # --reproducible: every layer's and the config's time (Podman); None: now
    platform: str = ""  # "" the engine's own; else one of platforms.PLATFORMS (Podman: a foreign one under qemu)


@dataclass(frozen=True)
class ImageInfo:
    """What the pipeline needs to know of a local image (the engine's own type, not docker-py's)."""

    id: str
    labels: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # the image config's Config block (Env, Entrypoint, ...)
    repo_digests: tuple[str, ...] = ()
    architecture: str = ""  # the CPU architecture its config names (amd64, arm64); "" unknown

    def inspected(self, ref: str) -> tuple[str, dict[str, Any]]:
        """(registry digest of `ref`'s repository or "", config with the image "Id"), as plan.InspectBase."""
        from imgbuild.imageref import BadReference, parse

        def same_repository(digested: str) -> bool:
            try:
                return parse(digested).name == parse(ref).name
            except BadReference:
                return False

        digests = [d.split("@", 1)[1] for d in self.repo_digests if "@" in d and same_repository(d)]
        return (digests[0] if digests else ""), {"config": self.config, "Id": self.id}


@dataclass(frozen=True)
class RunOptions:
    """A container to start, in imgbuild's words; only the engine turns it into its own (engine.runargs.run_argv).
    `env` values never reach an argv (every user of a host can read /proc/PID/cmdline)."""

    image: str
    command: tuple[str, ...] = ()
    name: str = ""
    user: str = ""  # "UID:GID"
    labels: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[str, ...] = ()  # HOST:CONTAINER[:ro]
    ports: tuple[str, ...] = ()
    workdir: str | None = None
    gpus: tuple[str, ...] = ()  # UUIDs; none: no GPU, hidden even where the default runtime is nvidia
    gpus_by_env: bool = False  # hand them to the nvidia runtime by variable (nvidia-docker2 hosts), not --gpus
    gpus_by_cdi: bool = False  # by CDI name (--device nvidia.com/gpu=UUID), where the host has only CDI
    cpus: float | None = None
    cpuset: str = ""  # a cpulist: "0-3,8"
    memory: int | None = None  # bytes, swap included (--memory and --memory-swap alike)
    pids_limit: int | None = None
    cgroup_parent: str = ""  # a systemd slice of the user's
    #: the house's values (config.site.RunRules, their one home), or None: the engine's own default
    ipc: str | None = None  # with shm_size: a private IPC namespace of that size
    shm_size: str | None = None
    ulimits: tuple[tuple[str, str], ...] = ()
    log_max_size: str | None = None  # json-file logs capped at this size ...
    log_max_file: str | None = None  # ... in this many files
    remove: bool = True
    detach: bool = False
    interactive: bool = False
    tty: bool = False
    pull: bool = True  # False: built here, never pulled (docker.io/<user>/<name> is a stranger's)
    hardened: bool = False  # no new privileges and no capabilities (a user acting through sudo)
    entrypoint: str | None = None


@dataclass(frozen=True)
class ContainerInfo:
    """A container as imgbuild reads it (`containers.rows()`): what `ps`, the reaper, the GPU holds, the queue and
    the job notices need. Times are seconds since the epoch (None: unknown); `gpus` and `gpu_uuids` are the
    comma-separated labels `run` set."""

    name: str
    id: str = ""
    labelled: bool = False  # started by `imgbuild run` (else: named by hand)
    smoke: bool = False  # a script container of imgbuild's own (`run` sets the label empty: an image cannot)
    deadline: float | None = None
    notify: bool = False
    exit_code: int | None = None
    started_ts: float | None = None
    created_ts: float | None = None
    finished_ts: float | None = None
    image: str = ""
    image_id: str = ""  # the image it was made from (sha256:...)
    status: str = ""
    user: str = ""
    gpus: str = ""
    gpu_uuids: str = ""
    cpuset: str = ""
    ports: tuple[int, ...] = ()
    cpus: float | None = None
    created: str = ""  # as `ps` shows it: YYYY-MM-DD HH:MM:SS
    memory: int | None = None  # its memory cap in bytes (None: none)
    pids_limit: int | None = None  # its processes cap (None: none)
    cgroup_parent: str = ""
    runs_as: str = ""  # "UID[:GID]" it runs as where it has no capabilities and no new privileges; "" otherwise

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ports": list(self.ports)}


@dataclass(frozen=True)
class LocalImage:
    """One tag of an image in the engine's store, as the reaper's disk hygiene and `usage --disk` read it."""

    ref: str  # as the engine names it: alice/x:1
    id: str
    size: int  # bytes (layers shared with other images counted in each)
    created_ts: float | None = None
    tagged_ts: float | None = None  # when the tag was last set (a rebuild moves it)


class ImageStore(Protocol):
    """The engine's images, by reference."""

    def image(self, ref: str) -> ImageInfo | None: ...
    def image_id(self, ref: str) -> str | None: ...
    def tag(self, image_id: str, ref: str) -> None: ...
    def untag(self, ref: str) -> None: ...
    def tags_of(self, repository: str) -> list[str]: ...
    def inspect_local(self, ref: str) -> tuple[str, dict[str, Any]] | None: ...
    def save(self, ref: str, path: Path) -> None: ...
    def pull(self, ref: str, quiet_seconds: float = ...) -> None: ...
    def push(self, ref: str, auth: dict[str, str] | None, progress: ProgressFn, quiet_seconds: float = ...) -> str: ...
    def local_images(self) -> list[LocalImage]: ...
    def discard(self, ref: str) -> str: ...


class ContainerRunner(Protocol):
    """Containers: the smoke test's run of a script, and what `imgbuild run` and friends need."""

    def run_script(
        self,
        image: str,
        probe: Probe,
        args: list[str],
        env: dict[str, str],
        *,
        stdin: bytes | None = None,
        gpus: list[str] | None,
        timeout: int = ...,
        ipc: str | None = ...,
        shm_size: str | None = ...,
        as_user: ContainerUser | None,
        cache: str | None = ...,
        on_line: Callable[[str], None] | None = ...,
    ) -> tuple[int, str, str]: ...
    def remove_labelled(self, label: str, value: str) -> None: ...
    def names(self) -> set[str]: ...
    def rows(self, name_prefix: str = "") -> list[ContainerInfo]: ...
    def cpu_percent(self, name: str) -> float | None: ...
    def stop(self, name: str, timeout: int = 30) -> None: ...
    def remove(self, name: str) -> None: ...
    def discard_unstarted(self, name: str) -> bool: ...
    def note(self, name: str, text: str) -> bool: ...
    def log_tail(self, name: str, lines: int = ...) -> str: ...
    def probe(self, name: str, command: list[str], timeout: float | None = None) -> tuple[int, str]: ...
    def run(self, options: RunOptions) -> tuple[int, str]: ...
    def attach(self, name: str) -> None: ...
    def logs(self, name: str, tail: str, follow: bool) -> None: ...
    def exec_in(self, name: str, command: tuple[str, ...], tty: bool) -> None: ...


class ImageEngine(Protocol):
    """What the build pipeline, the smoke test and rebuild ask of an engine: two build backends, an image
    store and a container runner. `Engine` talks to Docker, `PodmanEngine` to Podman;
    `imgbuild.engine.fake.FakeEngine` keeps images in memory for unit tests of the pipeline's logic. `name`:
    "docker" or "podman" (their registry caches differ)."""

    name: str

    @property
    def images(self) -> ImageStore: ...
    @property
    def containers(self) -> ContainerRunner: ...
    @property
    def leases(self) -> LeaseStore: ...

    def pick_backend(self, wanted: str) -> str: ...
    def build(self, backend: str, req: BuildRequest, progress: ProgressFn, redact: Redactor) -> str: ...
    def host_has_gpus(self) -> bool: ...
    def shares_host(self) -> bool: ...
    def host_info(self) -> dict[str, Any]: ...
    def host_platform(self) -> str: ...
    def platform_refusal(self, platform: str) -> str: ...


@dataclass
class StepTracker:
    """Follows build output: which step runs now, and the last lines of each step for error reports."""

    current: str = ""
    steps: dict[str, str] = field(default_factory=dict)  # BuildKit vertex id -> step title
    tails: dict[str, deque[str]] = field(default_factory=dict)
    failed: str = ""

    def tail(self, key: str, n: int = 15) -> list[str]:
        return list(self.tails.get(key, deque()))[-n:]


#: Engine output lines (newline already stripped), each matched whole (fullmatch).
_BK_STEP = re.compile(r"#([0-9]+) (\[[^\]]+\] .*)")
_BK_LINE = re.compile(r"#([0-9]+) (?:[0-9]+\.[0-9]+ )?(.*)")
_BK_ERROR = re.compile(r"#([0-9]+) ERROR: (.*)")
#: BuildKit's own failures, not a step's: the runc/containerd race of moby/buildkit#4483 and its kin. A step
#: whose command failed always says "exit code: N"; these say nothing of the command.
_ENGINE_FAULT = re.compile(
    r"rpc error: code = (?:Internal|Unavailable) desc = unexpected EOF|container process is already dead"
)


def engine_fault(error_lines: Iterable[str]) -> bool:
    """Whether a failed build failed in the engine itself (worth one more try), not in a step's command."""
    lines = list(error_lines)
    return any(_ENGINE_FAULT.search(ln) for ln in lines) and not any("exit code:" in ln for ln in lines)


_SDK_STEP = re.compile(r"Step ([0-9]+/[0-9]+) : (.*)")


#: What imgbuild's own steps are, by a word each step's instruction holds: named in a failure, instead of
#: a line of BuildKit mount flags.
_OWN_STEPS = (
    ("imgbuild-pip", "the pip step"),
    ("apt-get", "the apt step"),
    ("add-user.sh", "the user step"),
    ("pip-check.base", "the base check step"),
    ("stack_check.py", "the base-stack check"),
)


def own_status(text: str) -> str | None:
    """A status line of imgbuild's own scripts in a build step (`imgbuild: pip still resolving: ...`), made
    safe to show on a terminal (build output is the recipe's: no control characters, bounded); else None."""
    if not text.startswith("imgbuild: "):
        return None
    return printable(text)


#: The last word of one of imgbuild's own step scripts on why it failed (payload/pip_guard.py and its kin).
_OWN_VERDICT = re.compile(r"imgbuild: [a-z ]+ step failed: \S")


#: An instruction's own flags (`--mount=type=cache,id=...`, `--chown=1000:1000`, `--link`) and the variables a RUN
#: sets for its command alone (`IMGBUILD_INPUTS=sha256:...`): how a step is built, not what it does.
_STEP_NOISE = re.compile(r"(?<=\s)(?:--[a-z][a-z-]*(?:=\S*)?|[A-Z_][A-Z0-9_]*=\S*)\s+")


def step_name(step: str, limit: int = 120) -> str:
    """A build step as the build log and a failure name it: imgbuild's own steps by what they are
    (`[stage-0 4/6] RUN --mount=type=bind,source=imgbuild/pip,...` -> `the pip step [stage-0 4/6]`), any other by
    its instruction and what it runs, without the instruction's flags, on one line of at most `limit` characters.
    Every engine's step lines (BuildKit, the Engine API, podman) come here."""
    number = step.split("]", 1)[0] + "]" if step.startswith("[") else ""
    for word, name in _OWN_STEPS:
        if word in step:
            return f"{name} {number}".strip()
    text = " ".join(_STEP_NOISE.sub("", " ".join(step.split()) + " ").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _failure_text(step: str, tail: list[str], errors: list[str], log_path: Path | None) -> str:
    """The failure, cause first: the verdict of imgbuild's own step script where it gave one (`imgbuild: pip step
    failed: WHY`), else the engine's error; then the step's last lines."""
    head = f"build failed at {step_name(step)}" if step else "build failed"
    reason = next((e for e in reversed(errors) if e), "").strip()[:300]
    verdict = next((ln.split(" step failed: ", 1)[1] for ln in reversed(tail) if _OWN_VERDICT.match(ln)), "")
    if verdict or reason:
        head += f": {(verdict or reason)[:300]}"
    lines = [head] + ([f"  engine: {reason}"] if verdict and reason else [])
    lines += [f"  | {t}" for t in tail[-12:]]
    if log_path:
        lines.append(f"  full log: {log_path}")
    return "\n".join(lines)
