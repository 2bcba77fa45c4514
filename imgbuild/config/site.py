"""The config file's sections, declared once: `run:` (house rules), `reap:` (the reaper), `slurm:` (the cluster
site) and `fleet:` (the GPUs images must run on). Each field's check, default and text live here; the JSON
schema (`docs/config.schema.json`), `imgbuild config` and every reader take them from here.

Some settings belong to the site alone (quotas, deadlines, the ledger folder, the reaper): a user's config
may tighten a limit (a lower quota, a shorter deadline), never loosen it or move a folder, so a value the
user's config holds that would loosen one is set aside and `imgbuild config` says so.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from imgbuild.config.checks import (
    COUNT,
    DURATION,
    LOWER,
    NEVER,
    ONE_LINE,
    PATH,
    POSITIVE_DURATION,
    SIZE_RE,
    Between,
    duration_seconds,
    memory_cap,
    shm_size,
    site_only,
    size_bytes,
)
from imgbuild.config.slurmtime import SLURM_TIME_RE
from imgbuild.fields import (
    Flag,
    Integer,
    ListOf,
    MapOf,
    Maybe,
    OneOf,
    Text,
    matches,
    typed,
)

#: The host-wide GPU ledger's folder where the site names none (`run.state_dir`): in a folder only root may write,
#: so nobody but root can make it first (`imgbuild admin setup` makes it, as root's first run would).
DEFAULT_STATE_DIR = "/var/lib/imgbuild"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_REPO_PREFIX = re.compile(r"[a-z0-9.-]{1,253}(?::[0-9]{1,5})?(?:/[a-z0-9._-]{1,128}){0,8}")
BIND_RE = re.compile(r"/[^:,\s]*(?::/[^:,\s]*)?(?::ro)?")
#: A Slurm account: a name, and Jean Zay's GPU partition after `@` (abc@v100, abc@a100); the flag's rule too.
ACCOUNT_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}(?:@[A-Za-z0-9_.-]{1,64})?")
#: A folder on the cluster: absolute, or under a variable the site's docs name (`$SINGULARITY_ALLOWED_DIR`, Jean
#: Zay), which the job's shell expands; no spaces, colons or commas (it becomes part of a bind or a mount list).
SITE_DIR_RE = re.compile(r"(?:/|\$\{?[A-Za-z_][A-Za-z0-9_]{0,63}\}?(?=/|$))[A-Za-z0-9_@%+=./-]{0,4095}")
#: A variable passed into a container of its own by name, or every one with a prefix (`NCCL_*`).
PASSED_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\*?")


@dataclass(frozen=True, kw_only=True)
class RunRules:
    """`run:` the house rules of `imgbuild run` (and of dev containers) on a shared GPU server."""

    ipc: str = typed(OneOf("host", "private", "shareable", "none"), "host", doc="--ipc (NVIDIA's advice: host)")
    shm_size: str | None = typed(Maybe(Text(shm_size)), None, doc="--shm-size instead of ipc host")
    ulimits: dict[str, str] = typed(
        MapOf(
            Text(matches(_NAME, "not a ulimit name")),
            Text(matches(re.compile(r"-?[0-9]{1,20}"), "not a number"), numbers=True),
        ),
        factory=lambda: {"memlock": "-1", "stack": "67108864"},
        doc="--ulimit NAME=VALUE for every container",
    )
    workspace: str = typed(PATH, "/workspace", doc="where the current folder is mounted")
    mounts: list[str] = typed(
        ListOf(ONE_LINE, max_length=64),
        factory=list,
        doc="data folders every run sees: HOST:CONTAINER[:ro], {user} and {home} expanded",
    )
    log_max_size: str = typed(Text(matches(SIZE_RE, "not a size such as 50m"), numbers=True), "50m")
    log_max_file: str = typed(Text(matches(re.compile(r"[0-9]{1,3}"), "not a count"), numbers=True), "3")
    cpus_per_gpu: float | None = typed(
        Maybe(Between(0.1, 4096)), None, doc="CPUs per GPU (default: the host's fair share, within 8..24)"
    )
    pin_cpus: bool = typed(Flag(), True, doc="--cpuset-cpus near the GPUs, thread variables to match")
    memory: str | None = site_only(
        Maybe(Text(memory_cap, numbers=True)),
        None,
        doc="--memory of every run, swap included (default: three quarters of the host's memory)",
    )
    cpus: float | None = site_only(
        Maybe(Between(0.01, 4096)), None, doc="--cpus of a run without GPUs (default: one GPU's share)"
    )
    pids_limit: int = site_only(
        Integer(ge=16, le=4_194_304), 4096, doc="--pids-limit of every run: processes and threads at once"
    )
    cgroup_parent: str | None = site_only(
        Maybe(Text(matches(re.compile(r"[A-Za-z0-9_.@{}-]*\{(?:user|uid)\}[A-Za-z0-9_.@{}-]*\.slice"),
                           "not a systemd slice naming {user} or {uid}, such as imgbuild-{gid}-{uid}.slice"))),
        None,
        doc="--cgroup-parent of every run, {user}, {uid} and {gid} expanded: each user's runs in a slice of their "
        "own (systemd's cgroup driver; a dash nests: imgbuild-{gid}-{uid}.slice sits in the group's "
        "imgbuild-{gid}.slice), whose limits the admin sets (systemctl set-property imgbuild-1001.slice "
        "MemoryMax=...)",
    )  # fmt: skip
    fair_share_window: str | None = site_only(
        Maybe(POSITIVE_DURATION),
        "7d",
        doc="waiting runs and queued jobs go in order of each user's GPU-hours over this window, least first (fair "
        "share); none: first come, first served",
    )
    gpu_flag: str = typed(
        OneOf("gpus", "env", "cdi"),
        "gpus",
        doc="gpus: docker --gpus (CDI by itself where the engine has only CDI); env: NVIDIA_VISIBLE_DEVICES (nvidia "
        "default runtime); cdi: --device nvidia.com/gpu=UUID",
    )
    state_dir: str | None = site_only(PATH, None, doc=f"the host-wide GPU ledger (default {DEFAULT_STATE_DIR})")
    max_gpus_per_user: int | None = site_only(Maybe(COUNT), None, how=LOWER, doc="GPUs one user may hold at once")
    max_containers_per_user: int | None = site_only(Maybe(COUNT), 64, how=LOWER, doc="containers one user may have "
        "at once, running or stopped: each run's memory and pids caps together, and the engine's disk")  # fmt: skip
    max_commands_per_user: int = site_only(Integer(ge=1, le=4096), 16, doc="imgbuild commands one user may run "
        "through sudo at once (root processes their own limits do not count: waiters, builds, logs -f)")  # fmt: skip
    max_gpus_per_group: dict[str, int] = site_only(
        MapOf(Text(matches(_NAME, "not a group name")), COUNT),
        how=LOWER,
        factory=dict,
        doc="GPUs all members of a group may hold at once",
    )
    wait_poll: float = typed(Between(0.05, 600), 5, doc="seconds between looks while `run --wait` queues")
    default_time: str | None = site_only(
        Maybe(POSITIVE_DURATION), None, how=LOWER, doc="a run's deadline when --time is not given (2d)"
    )
    max_time: str | None = site_only(
        Maybe(POSITIVE_DURATION), None, how=LOWER, doc="the longest --time, and how far extend may go (7d)"
    )
    env: dict[str, str] = typed(
        MapOf(Text(matches(_ENV_NAME, "not a variable name")), ONE_LINE), factory=dict, doc="-e NAME=VALUE"
    )
    signed_only: list[str] = site_only(
        ListOf(Text(matches(_REPO_PREFIX, "not REGISTRY[/NAMESPACE]")), max_length=64),
        factory=list,
        doc="images under these prefixes run only when signed by signing_key (imgbuild verify), by digest",
    )
    signing_key: str | None = site_only(Maybe(PATH), None, doc="the public key (cosign.pub) of signed_only")
    allowed_images: list[str] = site_only(
        ListOf(ONE_LINE, max_length=256),
        factory=lambda: ["nvcr.io/nvidia/*", "{user}/*"],
        doc="enforced mode (users through sudo): the images a run may use, fnmatch patterns, {user} expanded",
    )
    allowed_mounts: list[str] = site_only(
        ListOf(ONE_LINE, max_length=64),
        factory=lambda: ["{home}"],
        doc="enforced mode: the host folders a run may mount (and use as its workspace), {user} and {home} expanded",
    )

    @property
    def ledger_dir(self) -> Path:
        """The host-wide GPU ledger's folder: the site's `state_dir`, else the default."""
        return Path(self.state_dir or DEFAULT_STATE_DIR)

    @property
    def default_seconds(self) -> float | None:
        """A run's deadline without `--time`, in seconds (None: no deadline)."""
        return duration_seconds(self.default_time) if self.default_time is not None else None

    @property
    def max_seconds(self) -> float | None:
        """The longest `--time`, and how far `extend` may go, in seconds (None: no limit)."""
        return duration_seconds(self.max_time) if self.max_time is not None else None

    @property
    def ipc_mode(self) -> str | None:
        """`--ipc`: None where a `shm_size` is set (a private /dev/shm of that size instead)."""
        return None if self.shm_size else self.ipc

    def memory_bytes(self, host_bytes: int | None) -> int | None:
        """A run's memory cap in bytes: `memory`, else three quarters of `host_bytes` (None: unknown)."""
        if self.memory is not None:
            return size_bytes(self.memory)
        return host_bytes * 3 // 4 if host_bytes else None

    def cgroup_parent_of(self, user: str, uid: int, gid: int) -> str:
        """The slice a run of `user` goes in (`cgroup_parent` with {user}, {uid}, {gid} given); "" for none."""
        if not self.cgroup_parent:
            return ""
        from imgbuild.hostio.host import expand

        return expand(self.cgroup_parent, user=user, uid=uid, gid=gid)


@dataclass(frozen=True, kw_only=True)
class ReapPolicy:
    """`reap:` what `imgbuild reap` (root, from a timer) stops and removes. The site's alone."""

    idle_timeout: str | None = site_only(
        Maybe(POSITIVE_DURATION), None, doc="GPUs idle this long: warn, then stop (None: never)"
    )
    idle_percent: float = site_only(Between(0, 100), 5, doc="a GPU at or below this utilisation is idle")
    warn_lead: str = site_only(DURATION, "30m", doc="warn this long before stopping")
    exited_max_age: str | None = site_only(
        Maybe(POSITIVE_DURATION), None, doc="exited <user>_ containers older than this are removed (with remove)"
    )
    remove: bool = site_only(Flag(), False, doc="remove what is reaped (default: stop only)")
    image_max_age: str | None = site_only(
        Maybe(POSITIVE_DURATION),
        None,
        doc="users' images (<user>/...) no container has used for this long are removed (never one a container "
        "uses, never the -previous of a tag in use; None: never)",
    )
    unnamed: bool = site_only(Flag(), False, doc="also stop containers that follow no <user>_ convention")
    exempt: list[str] = site_only(
        ListOf(ONE_LINE, max_length=256), factory=list, doc="container name patterns never touched (fnmatch)"
    )
    log: str | None = site_only(
        Maybe(PATH), None, doc="the action log, JSON lines (default <state_dir>/.reap/reap.log)"
    )
    notify_command: list[str] = site_only(
        ListOf(ONE_LINE, max_length=32),
        factory=list,
        doc="run for each `run --notify` job that ended: a program by absolute path, then its arguments; the facts "
        "in IMGBUILD_NOTICE_* variables, never through a shell",
    )

    def checked(self) -> ReapPolicy:
        """The whole section's rule, run when it is read: the notice program by absolute path (no shell, no PATH)."""
        if self.notify_command and not self.notify_command[0].startswith("/"):
            raise ValueError(
                f"notify_command: {self.notify_command[0][:60]!r}: the program by absolute path (no shell, no PATH "
                "search)"
            )
        return self

    @property
    def idle_seconds(self) -> float | None:
        return duration_seconds(self.idle_timeout) if self.idle_timeout is not None else None

    @property
    def warn_seconds(self) -> float:
        return duration_seconds(self.warn_lead)

    @property
    def image_seconds(self) -> float | None:
        return duration_seconds(self.image_max_age) if self.image_max_age is not None else None

    @property
    def exited_seconds(self) -> float | None:
        return duration_seconds(self.exited_max_age) if self.exited_max_age is not None else None


SBATCH_CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_.:*&|!\[\]()-]{1,256}")
SBATCH_LINE_RE = re.compile(r"--[a-z][a-z0-9-]{0,40}(?:=[A-Za-z0-9_.,:@%+/&|!\[\]()*-]{1,256})?")


#: NCCL's interface choice: names or prefixes, `^` to exclude, `=` for exact names (NCCL's environment docs)
SOCKET_IFNAME_RE = re.compile(r"[=^]?[A-Za-z0-9_.:-]{1,15}(?:,[A-Za-z0-9_.:-]{1,15}){0,7}")


@dataclass(frozen=True, kw_only=True)
class SlurmSite:
    """`slurm:` how `imgbuild slurm` writes jobs for this cluster."""

    partition: str | None = typed(Maybe(Text(matches(_NAME, "not a partition name"))), None)
    cpu_partition: str | None = typed(
        Maybe(Text(matches(_NAME, "not a partition name"))), None, doc="for jobs without GPUs (else partition)"
    )
    account: str | None = typed(Maybe(Text(matches(ACCOUNT_RE, "not an account name (Jean Zay: abc@v100)"))), None)
    gpu_types: dict[str, str] = typed(
        MapOf(Text(matches(_NAME, "not a name")), Text(matches(_NAME, "not a GRES type"))),
        factory=dict,
        doc="--gpu-type alias -> GRES type",
    )
    gpu_type: str | None = typed(
        Maybe(Text(matches(_NAME, "not a GRES type"))), None, doc="when --gpu-type is not given"
    )
    gpus_per_node: dict[str, int] = typed(
        MapOf(Text(matches(_NAME, "not a name")), Integer(ge=1, le=1024)), factory=dict, doc="more is refused"
    )
    binds: list[str] = typed(
        ListOf(Text(matches(BIND_RE, "not /HOST[:/CONTAINER][:ro]")), max_length=64),
        factory=list,
        doc="folders every job sees, in every runtime",
    )
    cpus_per_gpu: int = typed(Integer(ge=1, le=4096), 10)
    mem_per_gpu: str | None = typed(
        Maybe(Text(matches(SIZE_RE, "not a Slurm memory size (e.g. 64G, 16000M)"), numbers=True)),
        None,
        doc="Slurm's units: 16000M, 64G (a bare number is MB)",
    )
    time: str = typed(Text(matches(SLURM_TIME_RE, "not a Slurm time (01:00:00, 2-00:00:00)")), "01:00:00")
    scratch_var: str = typed(Text(matches(_ENV_NAME, "not a variable name")), "LOCAL_SCRATCH")
    scratch_gres: str | None = typed(
        Maybe(Text(matches(re.compile(r"[A-Za-z0-9_]{1,64}(?::[A-Za-z0-9_]{1,64}){0,2}"), "not a GRES"))),
        None,
        doc="requested with --stage (CSC: nvme:100)",
    )
    runtime: str = typed(
        OneOf("apptainer", "singularity", "pyxis", "docker", "oci", "edf", "podman-hpc", "shifter"), "apptainer"
    )
    sif_dir: str | None = typed(
        Maybe(Text(matches(SITE_DIR_RE, "not an absolute path or $VAR/path"))),
        None,
        doc="where .sif, .sqsh files and OCI bundles live on the cluster (Jean Zay: $SINGULARITY_ALLOWED_DIR)",
    )
    rdzv_port: int = typed(Integer(ge=1024, le=65535), 29500)
    rdzv_host_suffix: str = typed(
        Text(matches(re.compile(r"[A-Za-z0-9.-]{0,32}"), "not a host name suffix")),
        "",
        doc="appended to the rendezvous node's name (JUWELS: i, its InfiniBand name)",
    )
    socket_ifname: str | None = typed(
        Maybe(Text(matches(SOCKET_IFNAME_RE, "not an interface list such as ib0 or ^docker0,lo"))),
        None,
        doc="NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME for every job (JUWELS: ib0)",
    )
    stage_dir: str | None = typed(Maybe(ONE_LINE), None, doc="where --stage writes its tars")
    qos: str | None = typed(Maybe(Text(matches(_NAME, "not a QOS name"))), None, doc="#SBATCH --qos")
    constraint: str | None = typed(
        Maybe(Text(matches(SBATCH_CONSTRAINT_RE, "not a Slurm constraint (a100&ib, [rack1|rack2])"))),
        None,
        doc="#SBATCH --constraint (node features)",
    )
    edf_annotations: dict[str, str] = typed(
        MapOf(
            Text(
                matches(
                    re.compile(r"[a-z0-9][a-z0-9_.-]{0,127}"), "not an annotation key such as com.hooks.cxi.enabled"
                )
            ),
            Text(matches(re.compile(r"[A-Za-z0-9_./:@+=-]{0,256}"), "not a plain annotation value"), numbers=True),
        ),
        factory=dict,
        doc="runtime edf (CSCS's Container Engine): hooks for every job's EDF, over the NCCL hook's "
        "(com.hooks.aws_ofi_nccl.variant: cuda12)",
    )
    shifter_modules: list[str] = typed(
        ListOf(Text(matches(_NAME, "not a module name")), max_length=16),
        factory=list,
        doc="runtime shifter: the site's Shifter modules every job loads (shifter --module=NAME)",
    )
    pass_env: list[str] = typed(
        ListOf(Text(matches(PASSED_NAME_RE, "not a variable name or PREFIX*")), max_length=64),
        factory=list,
        doc="more variables the docker and podman-hpc runtimes pass from the job into its containers, by name "
        "(HF_TOKEN, WANDB_*), beside NCCL's, libfabric's and UCX's",
    )
    mpi: str | None = typed(
        Maybe(Text(matches(_NAME, "not an MPI plugin name"))),
        None,
        doc="srun --mpi for jobs of one task per GPU (pmix, for Open MPI in a container)",
    )
    sbatch_lines: list[str] = typed(
        ListOf(Text(matches(SBATCH_LINE_RE, "not an sbatch option such as --hint=nomultithread")), max_length=32),
        factory=list,
        doc="more #SBATCH options every job gets (--hint=nomultithread, --exclusive, --reservation=R)",
    )


def _gpu_name(value: str) -> str:
    from imgbuild.gpu.fleet import target_rule  # loaded only for a config that names a fleet

    return target_rule(value)


def _driver(value: str) -> str:
    from imgbuild.gpu.fleet import driver_rule

    return driver_rule(value)


@dataclass(frozen=True, kw_only=True)
class Fleet:
    """`fleet:` the GPUs images must run on (the settings fleet_gpus and fleet_driver)."""

    gpus: list[str] = typed(ListOf(Text(_gpu_name), max_length=64), factory=list, doc="v100, a100, sm_89, 8.9")
    driver: str | None = typed(Maybe(Text(_driver, numbers=True)), None, doc="the oldest driver among them")


#: The sections a config file may hold, by key.
#: A Kubernetes quantity (`16Gi`, `500m`, `2`), and a data volume: a PersistentVolumeClaim at a path.
#: (Kubernetes' suffixes, apimachinery's resource.Quantity: binary Ki..Ei, decimal k M G T P E, milli m; no `K`.)
QUANTITY_RE = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,6})?(?:[KMGTPE]i|[kMGTPE]|m)?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
K8S_VOLUME_RE = re.compile(r"([a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?):(/[A-Za-z0-9_./@%+=,-]{0,1023})(:ro)?")


@dataclass(frozen=True, kw_only=True)
class K8sSite:
    """`k8s:` how `imgbuild k8s` writes jobs for this Kubernetes cluster (checked offline, never applied)."""

    namespace: str | None = typed(Maybe(Text(matches(_DNS_LABEL, "not a namespace name"))), None)
    queue: str | None = typed(
        Maybe(Text(matches(_LABEL_VALUE, "not a label value"))),
        None,
        doc="the scheduler's queue: Kueue LocalQueue, Volcano queue, Run:ai project queue",
    )
    scheduler: str = typed(
        OneOf("kueue", "volcano", "runai"),
        "kueue",
        doc="who schedules the pods: kueue (queue-name label), volcano (schedulerName, queue annotation), runai "
        "(runai-scheduler, runai/queue label)",
    )
    priority_class: str | None = typed(
        Maybe(Text(matches(_LABEL_VALUE, "not a label value"))),
        None,
        doc="Kueue WorkloadPriorityClass (kueue.x-k8s.io/priority-class label)",
    )
    pull_secrets: list[str] = typed(
        ListOf(Text(matches(_DNS_LABEL, "not a Secret name")), max_length=16),
        factory=list,
        doc="Secrets the pods pull the image with (imagePullSecrets)",
    )
    runtime: str = typed(
        Text(matches(_DNS_LABEL, "not a runtime name")), "torch-distributed", doc="Trainer ClusterTrainingRuntime"
    )
    trainer_version: str = typed(
        OneOf("2.0", "2.1", "2.2", "2.3"), "2.2", doc="the Kubeflow Trainer release the cluster runs (2.2 and later)"
    )
    gpu_resource: str = typed(
        Text(matches(re.compile(r"[a-z0-9.-]{1,253}/[a-z0-9][a-z0-9_.-]{0,62}"), "not a resource name")),
        "nvidia.com/gpu",
    )
    volumes: list[str] = typed(
        ListOf(Text(matches(K8S_VOLUME_RE, "not CLAIM:/PATH[:ro]")), max_length=64),
        factory=list,
        doc="PersistentVolumeClaims every job mounts: CLAIM:/PATH[:ro]",
    )
    shm_size: str = typed(Text(matches(QUANTITY_RE, "not a quantity such as 16Gi"), numbers=True), "16Gi")
    cpus_per_gpu: int = typed(Integer(ge=1, le=4096), 8)
    mem_per_gpu: str | None = typed(
        Maybe(Text(matches(QUANTITY_RE, "not a quantity such as 64Gi"), numbers=True)), None
    )


SECTIONS: dict[str, type] = {"run": RunRules, "reap": ReapPolicy, "slurm": SlurmSite, "k8s": K8sSite}


def fields_of(model: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(model) if "check" in f.metadata]


def looser(how: str, user: Any, site: Any, name: str) -> bool:
    """Would the user's value loosen the site's? (NEVER: any value differing from the site's does.)"""
    if how == NEVER:
        return user != site
    if site is None or site == {}:
        return False  # no limit at the site: any user limit is a tighter one
    if user is None:
        return True
    if isinstance(site, dict):
        return any(k not in user or user[k] > v for k, v in site.items())
    if name.endswith("_time"):
        return duration_seconds(user) > duration_seconds(site)
    return bool(user > site)


def as_text(model: Any) -> dict[str, Any]:
    """The section as a config file would write it."""
    return {f.name: getattr(model, f.name) for f in fields_of(type(model))}


Section = TypeVar("Section")


def checked_section(model: type[Section], name: str, value: Section | Mapping[str, Any] | None) -> Section:
    """`value` as the section's model: a model passes; a mapping (a caller's own rules, a test's) is checked
    as the config file's section would be, its first issue a UsageError naming `config NAME.KEY`."""
    from imgbuild import fields
    from imgbuild.errors import UsageError
    from imgbuild.yamlpos import dotted

    if isinstance(value, model):
        return value
    made, issues = fields.validate(model, value if value is not None else {})
    if issues:
        issue = issues[0]
        message = "unknown setting" if issue.message == "unknown key" else issue.message
        hint = f" ({issue.hint})" if issue.hint else ""
        raise UsageError(f"config {dotted((name, *issue.at))}: {message}{hint}")
    return made  # type: ignore[no-any-return]


def run_rules(value: RunRules | Mapping[str, Any] | None = None) -> RunRules:
    """The house rules from a mapping written as the config's `run:` section (a test's, a caller's own)."""
    return checked_section(RunRules, "run", value)


def reap_policy(value: ReapPolicy | Mapping[str, Any] | None = None) -> ReapPolicy:
    """The reaper's rules from a mapping written as the config's `reap:` section."""
    return checked_section(ReapPolicy, "reap", value)


def slurm_site(value: SlurmSite | Mapping[str, Any] | None = None) -> SlurmSite:
    """The cluster site from a mapping written as the config's `slurm:` section."""
    return checked_section(SlurmSite, "slurm", value)
