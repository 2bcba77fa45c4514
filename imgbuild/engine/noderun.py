"""Runtimes that start a container of their own for each task on the node, outside Slurm's step: docker (a lab's
cluster) and NERSC's podman-hpc (Perlmutter), their CLIs' words kept here with the engine's others (runargs).
Each is told, by name, every variable the task's container must see (their containers do not inherit the step's
environment as Apptainer, pyxis and the Container Engine do), and binds as HOST:INSIDE."""

from __future__ import annotations

from dataclasses import dataclass

from imgbuild.engine.runargs import hide_gpus
from imgbuild.facts import Label
from imgbuild.shellwords import shell_words


@dataclass(frozen=True)
class NodeRun:
    """What a task's own container is started with on its node (clusters.slurm builds it from the job)."""

    image: str
    binds: tuple[str, ...] = ()  # HOST[:INSIDE][:ro], a user's as a shellwords.UserWord
    gpus: int = 0  # GPUs per node the job asked for (0: none)
    nodes: int = 1
    cpus: int = 1  # per task
    local_image: bool = False  # built on this machine: never pulled
    gpu_flag: str = "gpus"  # docker: how GPUs are given (`--gpus`, NVIDIA_VISIBLE_DEVICES, or CDI devices)
    job_env: tuple[str, ...] = ()  # variables the job's script sets that the container must see
    site_env: tuple[str, ...] = ()  # the site's own (slurm.pass_env): NAME, or PREFIX* for every one so named


def bind_pair(bind: str) -> str:
    """A bind as docker and an EDF must be told it, HOST:INSIDE[:ro]: `/scratch` is Apptainer's "the same path
    inside", but to docker a lone path is an anonymous volume that `--rm` deletes, with whatever the job wrote."""
    parts = bind.split(":")
    read_only = parts[-1] == "ro" and len(parts) > 1
    if read_only:
        parts = parts[:-1]
    host, inside = parts[0], (parts[1] if len(parts) > 1 else parts[0])
    # a user's --bind stays a UserWord: what it holds is quoted literally when the job starts
    return type(bind)(f"{host}:{inside}" + (":ro" if read_only else ""))


#: A Slurm job's containers, for a site's epilog: dockerd, not the job, is their parent, so a container whose
#: `docker run` was killed (past KillWait, a node's slurmd restarted) outlives the job and keeps its GPUs.
SLURM_EPILOG = (
    f'docker ps -q --filter "label={Label.SLURM_JOB}=$SLURM_JOB_ID" | xargs -r docker rm -f >/dev/null 2>&1 || true'
)


#: The step's Slurm variables a container must see: the ranks (torchrun's PET_* are set from them), and what
#: TensorFlow's SlurmClusterResolver (SLURM_PROCID, SLURM_STEP_NODELIST, SLURM_STEP_NUM_TASKS,
#: SLURM_STEP_TASKS_PER_NODE) and JAX's Slurm detection (SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS,
#: SLURM_PROCID, SLURM_LOCALID) read; Apptainer, pyxis and Slurm's OCI runtime pass the whole environment.
SLURM_PASSED = (
    "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NNODES", "SLURM_NODEID", "SLURM_LOCALID", "SLURM_NTASKS",
    "SLURM_RESTART_COUNT", "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
)  # fmt: skip


#: What a job's environment says that its container must see too, as Apptainer and pyxis pass it: NCCL's and
#: PyTorch's NCCL settings, the fabrics' (libfabric and Slingshot's CXI provider; UCX on InfiniBand), the sockets'
#: interfaces, Hugging Face's and PyTorch's caches, and each task's place in Slurm's PMIx server (`srun
#: --mpi=pmix`: its address, namespace and rank, without which every MPI rank starts alone). A site adds its own
#: (slurm.pass_env: HF_TOKEN, WANDB_*).
PASSED_ENV = (
    "NCCL_*", "TORCH_NCCL_*", "FI_*", "CXI_*", "UCX_*", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HF_HOME",
    "TORCH_HOME", "PMIX_*",
)  # fmt: skip
#: The PMIx server's folder (its rendezvous files and shared data), bound into a container of its own where the
#: task has one (a task of `srun --mpi=pmix`).
PMIX_FOLDER = ' ${PMIX_SERVER_TMPDIR:+-v "$PMIX_SERVER_TMPDIR:$PMIX_SERVER_TMPDIR"}'


def _docker_env(names: tuple[str, ...]) -> str:
    """`-e NAME` for each variable, by name only (a value such as HF_TOKEN never reaches a command line), and for
    each one the task's environment holds under a PREFIX* when it starts (docker itself takes names only)."""
    exact = [f"-e {name}" for name in names if not name.endswith("*")]
    prefixes = "|".join(name[:-1] for name in names if name.endswith("*"))
    found = f"$(env | sed -nE 's/^(({prefixes})[A-Za-z0-9_]*)=.*/-e \\1/p')" if prefixes else ""
    return " ".join([found, *exact]).strip()


def docker_prefix(job: NodeRun) -> list[str]:
    """`docker run` on the node as the caller, with the step's GPUs, CPUs and memory and the job's variables.

    The container is dockerd's child, not the step's: Slurm's cgroup limits do not reach it, so the step's
    CPUs (its affinity, as task/affinity or task/cgroup set it) and memory are passed to docker; it is named
    and labelled with the job, removed when the step ends or is stopped (SIGTERM reaches it through the
    docker CLI first, so a snapshot can be written), and a site's epilog finds what a SIGKILL left
    (SLURM_EPILOG)."""
    # Like Apptainer: the host's network, IPC and PID namespaces (torchrun's node identity is
    # hostname + pid, which must differ between nodes that share a host in small lab clusters).
    opts = [
        "docker",
        "run",
        "--rm",
        "--sig-proxy=false",  # the step's trap stops it, once
        *(["--pull", "never"] if job.local_image else []),
        "--network",
        "host",
        "--ipc",
        "host",
        "--pid",
        "host",
        "-v",
        "$PWD:/workspace",
        "-w",
        "/workspace",
    ]
    # the step's Slurm facts (the frameworks' own cluster resolvers read them), the job's own network and cache
    # settings where it sets them, and TensorFlow's worker list (`-e NAME`: unset stays unset)
    for name in (*SLURM_PASSED, "IMGBUILD_TF_WORKERS"):
        opts += ["-e", name]
    # The caller's UID has no home in the image: a writable one, as `imgbuild run` gives (pip --user, ~/.cache).
    opts += ["-e", "HOME=/tmp/home"]
    opts += ["--user", "$(id -u):$(id -g)"]  # files in the working folder are the user's, not root's
    opts += [
        "--name",
        "$name",
        "--label",
        f"{Label.SLURM_JOB}=$SLURM_JOB_ID",
        # every other key imgbuild reads on a container, empty: an image's own `org.imgbuild.*` labels never make
        # a job's container another user's, hold GPUs or move a deadline (as `imgbuild run` sets them)
        *[word for key in Label.CONTAINER_KEYS if key != Label.SLURM_JOB for word in ("--label", f"{key}=")],
        "--cpus",
        str(job.cpus),
        "--cpuset-cpus",
        "$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)",
    ]
    opts += _job_words(job)
    passed = " " + _docker_env((*PASSED_ENV, *job.site_env))
    # The job's memory on this node, shared by its tasks here (set where the job asked for --mem).
    memory = " ${SLURM_MEM_PER_NODE:+--memory=$((SLURM_MEM_PER_NODE / ${SLURM_NTASKS_PER_NODE:-1}))m}"
    if not job.gpus:  # the hiding is the last word, after every variable passed by name (a site's pass_env too)
        gpus = " " + shell_words([word for key, value in hide_gpus([]) for word in ("-e", f"{key}={value}")]) + " "
    else:
        # The daemon sees every GPU of the node: give the container exactly the step's (or, one task per
        # GPU, the task's), read on each node inside the step (SLURM_STEP_GPUS: the host indices).
        step_gpus = "${SLURM_STEP_GPUS:-$SLURM_JOB_GPUS}"
        if job.gpu_flag == "env":
            gpus = f' -e "NVIDIA_VISIBLE_DEVICES={step_gpus}" '
        elif job.gpu_flag == "cdi":  # CDI names by index: nvidia.com/gpu=N (nvidia-ctk cdi generate)
            each = "printf -- '--device nvidia.com/gpu=%s ' \"$g\""
            gpus = f""" $(for g in $(echo "{step_gpus}" | tr , ' '); do {each}; done)"""
        else:
            gpus = f' --gpus "\\"device={step_gpus}\\"" '
    sources = [type(bind)(bind.split(":")[0]) for bind in job.binds]  # a user's bind stays a UserWord
    script = [
        'name="imgbuild-$SLURM_JOB_ID-${SLURM_STEP_ID:-0}-$SLURM_PROCID"',
        # docker would create a missing folder as root (and an empty one on a node that lacks the mount)
        *(
            [
                f'for d in {shell_words(sources)}; do [ -d "$d" ] || {{ echo "imgbuild: $d: no such folder on '
                '$(hostname); docker would create it as root" >&2; exit 2; }; done'
            ]
            if sources
            else []
        ),
        "trap 'docker rm -f \"$name\" >/dev/null 2>&1 || true' EXIT",
        # Cancelled, or at the time limit (or --requeue's stop): the container gets SIGTERM and its grace to
        # write a snapshot and exit, whether or not Slurm's signal reached the docker CLI too.
        'trap \'docker kill -s TERM "$name" >/dev/null 2>&1; docker wait "$name" >/dev/null 2>&1; exit 143\' TERM INT',
        shell_words(opts) + passed + PMIX_FOLDER + memory + gpus + shell_words([job.image]) + ' "$@" & wait "$!"',
    ]
    return ["sh", "-c", "; ".join(script), "sh"]


def podman_hpc_prefix(job: NodeRun) -> list[str]:
    """NERSC's podman-hpc (NERSC/podman-hpc): podman, rootless, with the site's modules as flags (`--gpu` mounts
    the driver and the GPUs, `--nccl` the Slingshot NCCL plugin; its `etc/modules.d`). The image runs from the
    squashed store `podman-hpc pull` fills on a login node: never pulled by every node (`--pull never`). Podman's
    `-e PREFIX*` passes every host variable that starts so; the host's network for the rendezvous and NCCL's
    sockets, its IPC and PID namespaces as under docker; the job's folder at /workspace."""
    opts = ["podman-hpc", "run", "--rm", "--pull", "never"]
    opts += ["--gpu"] if job.gpus else []
    opts += ["--nccl"] if job.gpus and job.nodes > 1 else []
    # the host's PID namespace too: with the host's network the container has the node's host name, and
    # torchrun tells nodes apart by host name and PID (nodes of a small cluster may share a host)
    opts += ["--network", "host", "--ipc", "host", "--pid", "host", "-v", "$PWD:/workspace", "-w", "/workspace"]
    for name in ("SLURM_*", *PASSED_ENV, *job.site_env, "IMGBUILD_TF_WORKERS"):
        opts += ["-e", name]
    return [*opts, *_job_words(job), job.image]


def _job_words(job: NodeRun) -> list[str]:
    """What a container of its own must be told of the job: the variables the job's script sets (NCCL_DEBUG, the
    snapshot folder, the staged data's folder, as Apptainer and pyxis pass them from the host's environment) and
    every bind as HOST:INSIDE."""
    env = (w for name in job.job_env for w in ("-e", name))
    return [*env, *(w for bind in job.binds for w in ("-v", bind_pair(bind)))]
