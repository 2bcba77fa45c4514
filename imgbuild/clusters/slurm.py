"""Slurm: the sbatch script of a job that follows cluster conventions, for each runtime (Apptainer, pyxis/enroot
`srun --container-image`, Slurm's own OCI `srun --container`, docker): the header, staging, the launcher
(torchrun across nodes, one task per GPU alone), and what the job reports at its end.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from imgbuild.clusters.edf import edf_lines, nccl_hook
from imgbuild.clusters.launch import launcher, launches_itself
from imgbuild.clusters.launchers import Kind, launcher_of
from imgbuild.engine.noderun import NodeRun, bind_pair, docker_prefix, podman_hpc_prefix
from imgbuild.errors import UsageError
from imgbuild.shellwords import shell_words

#: Site settings for Slurm (config file `slurm:`), with defaults from the CSC/Puhti conventions.
RUNTIMES = ("apptainer", "singularity", "pyxis", "docker", "oci", "edf", "podman-hpc", "shifter")


# --- Slurm --------------------------------------------------------------------------------------------


@dataclass
class JobSpec:
    command: list[str]
    image: str  # .sif path (apptainer/singularity), image ref (pyxis, docker)
    gpus: int = 1  # per node
    nodes: int = 1
    gpu_type: str | None = None
    cpus_per_gpu: int = 10
    cpus: int | None = None  # per task, overrides cpus_per_gpu
    mem: str | None = None
    time: str = "01:00:00"
    partition: str | None = None
    account: str | None = None
    job_name: str = "imgbuild"
    output: str = "%x-%j.out"
    stage: list[str] = field(default_factory=list)  # dataset tars extracted to $SCRATCH on each node
    scratch_var: str = "LOCAL_SCRATCH"
    scratch_gres: str | None = None
    runtime: str = "apptainer"
    binds: list[str] = field(default_factory=list)
    nccl_debug: str | None = None
    rdzv_port: int = 29500
    rdzv_host_suffix: str = ""  # appended to the rendezvous node's name (JUWELS' InfiniBand names: jwb0038i)
    socket_ifname: str | None = None  # NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME, the site's fabric
    torchrun: bool | None = None  # default: for more than one GPU in all
    task_per_gpu: bool = False  # one task per GPU (MPI, Horovod), each seeing only its own GPU
    edf_annotations: dict[str, str] = field(default_factory=dict)  # the edf runtime: the site's hooks (slurm:)
    shifter_modules: list[str] = field(default_factory=list)  # the shifter runtime: the site's modules (slurm:)
    docker_gpu_flag: str = "gpus"  # the docker runtime: --gpus, or NVIDIA_VISIBLE_DEVICES (site run.gpu_flag)
    local_image: bool = False  # the docker runtime: a recipe's image, built here, never pulled from Docker Hub
    max_restarts: int = 0  # torchrun restarts its workers this often after a failure
    requeue: bool = False  # before the time limit: signal the step, wait for it, requeue the job
    signal_lead: int = 300  # seconds before the time limit the step gets SIGTERM (requeue)
    snapshot_dir: str | None = None  # persistent folder for snapshots, passed as SNAPSHOT_DIR
    usage: bool = True  # sample GPU use on each node; summarise it at the end of the job
    framework: str = ""  # the image's: pytorch, tensorflow, jax ("" unknown); decides the launcher
    cuda_major: str = ""  # the image's CUDA major ("" unknown): the EDF's NCCL plugin variant
    qos: str | None = None
    constraint: str | None = None
    sbatch_lines: list[str] = field(default_factory=list)  # the site's own #SBATCH options (checked in config)
    pass_env: list[str] = field(default_factory=list)  # the site's variables for containers of their own (docker)
    mpi: str | None = None  # srun --mpi for one task per GPU (the site's plugin: pmix)

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.nodes

    @property
    def self_launching(self) -> bool:
        """The command is a launcher itself (torchrun, accelerate launch, deepspeed, mpirun, ...)."""
        return launches_itself(list(self.command))

    @property
    def uses_torchrun(self) -> bool:
        if self.task_per_gpu or self.self_launching:
            return False  # one launcher, never two: torchrun around torchrun ran two trainings on the same GPUs
        if self.torchrun is None and self.framework in ("tensorflow", "jax"):
            return False  # TensorFlow and JAX start their own workers (MirroredStrategy, jax.distributed)
        return self.total_gpus > 1 if self.torchrun is None else self.torchrun

    @property
    def writes_hostfile(self) -> bool:
        """DeepSpeed across nodes: the job writes its hostfile (clusters.launchers.hostfile_lines)."""
        found = launcher_of(list(self.command))
        return self.nodes > 1 and found is not None and found[0] is Kind.DEEPSPEED

    @property
    def tasks_per_node(self) -> int:
        return max(self.gpus, 1) if self.task_per_gpu else 1

    @property
    def cpus_per_task(self) -> int:
        if self.cpus:
            return self.cpus
        return max(1, self.cpus_per_gpu * (1 if self.task_per_gpu else max(self.gpus, 1)))

    @property
    def threads(self) -> int:
        """Threads per process: a task's CPUs, shared among torchrun's workers (one per GPU)."""
        workers = max(self.gpus, 1) if self.uses_torchrun or self.self_launching else 1
        return max(1, self.cpus_per_task // workers)


def _binds(job: JobSpec) -> list[str]:
    """The folders every task sees: the site's and the user's, the staged data's, the snapshots'."""
    binds = list(job.binds)
    if job.stage:
        binds.append(f"${job.scratch_var}:${job.scratch_var}")
    if job.snapshot_dir:
        binds.append(f"{job.snapshot_dir}:{job.snapshot_dir}")
    return binds


def node_run(job: JobSpec, binds: list[str]) -> NodeRun:
    """What the docker and podman-hpc runtimes start each task's container with: the job, narrowed."""
    names = ["NCCL_DEBUG"] if job.nccl_debug else []
    names += ["SNAPSHOT_DIR"] if job.snapshot_dir else []
    names += [job.scratch_var] if job.stage else []
    return NodeRun(
        job.image, tuple(binds), job.gpus, job.nodes, job.cpus_per_task, job.local_image, job.docker_gpu_flag,
        tuple(names), tuple(job.pass_env),
    )  # fmt: skip


def _container_prefix(job: JobSpec) -> tuple[list[str], list[str]]:
    """(extra srun options, command prefix) that run the command in the image with the runtime."""
    binds = _binds(job)
    if job.runtime in ("apptainer", "singularity"):
        opts = ["--nv"] if job.gpus else []
        for bind in binds:
            opts += ["--bind", bind]
        return [], [job.runtime, "exec", *opts, job.image]
    if job.runtime == "pyxis":
        srun = [
            f"--container-image={enroot_reference(job.image)}",
            "--container-workdir=/workspace",
            f"--container-mounts={','.join(['$PWD:/workspace', *binds])}",
        ]
        return srun, []
    if job.runtime == "docker":
        return [], docker_prefix(node_run(job, binds))
    if job.runtime == "edf":  # CSCS's Container Engine: the EDF the script wrote (imgbuild.clusters.edf)
        return ["--environment=$edf"], []
    if job.runtime == "podman-hpc":  # NERSC Perlmutter (imgbuild.engine.noderun)
        return [], podman_hpc_prefix(node_run(job, binds))
    if job.runtime == "shifter":  # NERSC: the image and fixed volumes are the job's (#SBATCH --image, --volume)
        varying = [f"--volume={bind_pair(b)}" for b in binds if "$" in b]  # no shell expands an #SBATCH line
        return [], ["shifter", *(f"--module={m}" for m in job.shifter_modules), *varying]
    if job.runtime == "oci":  # Slurm's own: srun --container runs the bundle with the site's runtime (oci.conf)
        needed = [f"${job.scratch_var}"] if job.stage else []
        needed += [job.snapshot_dir] if job.snapshot_dir else []
        return [f"--container={job.image}"], ["sh", "-c", _OCI_STEP, "imgbuild", "$PWD", *needed, "--"]
    raise UsageError(f"--runtime: {job.runtime!r} is not one of {', '.join(RUNTIMES)}")


#: The step's command under the oci runtime: Slurm starts it in the image's WORKDIR, so it moves to the job's
#: folder (the same path inside, as Apptainer has it) after checking each folder the job needs is there.
_OCI_MISSING = "is not in the container: export the bundle with --bind for a folder above it"
#: The image's own search paths, which Slurm's job environment hides: kept aside in the bundle (IMGBUILD_IMAGE_*)
#: and put back by the step.
OCI_KEPT_ENV = ("PATH", "LD_LIBRARY_PATH")
OCI_KEPT_PREFIX = "IMGBUILD_IMAGE_"
_OCI_RESTORE = "".join(
    f'if [ -n "${{{OCI_KEPT_PREFIX}{name}:-}}" ]; then export {name}="${OCI_KEPT_PREFIX}{name}"; '
    + ("fi; " if name == "PATH" else f"else unset {name}; fi; ")  # an image without PATH keeps the job's
    for name in OCI_KEPT_ENV
)
_OCI_STEP = (
    _OCI_RESTORE
    # the bundle's root is read-only and the job's HOME a host path it lacks: a HOME of the step's own, made by
    # mktemp in the node's /tmp (never a fixed name another user could have made first)
    + '[ -d "${HOME:-/nonexistent}" ] && [ -w "$HOME" ] || { HOME=$(mktemp -d /tmp/imgbuild-home-XXXXXXXX) '
    "&& export HOME || exit 2; }; "
    + f'cd "$1" 2>/dev/null || {{ echo "imgbuild: the job folder $1 {_OCI_MISSING}" >&2; exit 2; }}; shift; '
    f'while [ "$1" != -- ]; do [ -d "$1" ] || {{ echo "imgbuild: $1 {_OCI_MISSING}" >&2; exit 2; }}; shift; done; '
    'shift; exec "$@"'
)


def enroot_reference(image: str) -> str:
    """An image as pyxis/enroot names it: `nvcr.io/nvidia/pytorch:24.05-py3` -> `nvcr.io#nvidia/pytorch:24.05-py3`
    (enroot's `[REGISTRY#]IMAGE`; the docker form is looked up on Docker Hub). A path (a .sqsh) passes."""
    if "#" in image or image.startswith(("/", "./")):
        return image
    first, sep, rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def sbatch_script(job: JobSpec) -> str:
    """An sbatch script: resources per the site, data staged to node-local disk, one launcher per node
    (or one task per GPU), GPU use sampled, and a requeue before the time limit when asked."""
    if job.gpus < 0 or job.nodes < 1:
        raise UsageError("--gpus must be >= 0 and --nodes >= 1")
    body = ["set -euo pipefail"]
    if job.socket_ifname:  # the site's fabric for NCCL's and Gloo's sockets (passed into every runtime)
        body += [f"export NCCL_SOCKET_IFNAME={job.socket_ifname} GLOO_SOCKET_IFNAME={job.socket_ifname}"]
    if job.nccl_debug:
        body += [f"export NCCL_DEBUG={job.nccl_debug}"]
    if job.snapshot_dir:
        body += [
            "",
            "# Snapshots go to persistent storage (node-local scratch vanishes with the job).",
            f"export SNAPSHOT_DIR={shell_words([job.snapshot_dir])}",
            'mkdir -p "$SNAPSHOT_DIR"',
        ]
    body += _stage_lines(job)
    if job.usage and job.gpus:
        body += USAGE_START
    srun_opts, prefix = _container_prefix(job)
    # The step's CPUs said on the step itself: Slurm 22.05-23.02 (Debian 12 ships 22.05.8) give a step one CPU
    # per task unless told, whatever #SBATCH --cpus-per-task says.
    per_task = [f"--cpus-per-task={job.cpus_per_task}"]
    srun = [
        "srun",
        *per_task,
        *(["--gpus-per-task=1", "--gpu-bind=per_task:1"] if job.task_per_gpu else []),
        *([f"--mpi={job.mpi}"] if job.mpi and job.task_per_gpu else []),
        *srun_opts,
    ]
    if job.runtime == "edf":
        body += edf_lines(
            enroot_reference(job.image),
            [bind_pair(b) for b in _binds(job)],
            nccl_hook(job.cuda_major) if job.gpus else {},
            job.edf_annotations,
        )
    launch, command = launcher(job)
    body += launch
    # Threads per process: the task's CPUs for one process, the CPUs per GPU for each torchrun worker.
    # Set on the command itself (env ... inside the container), so it wins over an image's own ENV in
    # every runtime (Apptainer keeps the image's value over the host's).
    step = shell_words([*srun, *prefix, "env", f"OMP_NUM_THREADS={job.threads}", *command])
    if job.requeue:
        body += [
            "",
            f"# {job.signal_lead} s before the time limit Slurm signals this script (USR1): the step gets SIGTERM",
            "# (torchrun passes it to its workers: write a snapshot to $SNAPSHOT_DIR and exit), then the job",
            "# goes back to the queue and starts again with SLURM_RESTART_COUNT raised.",
            "requeue() {",
            '  echo "imgbuild: time limit near: stopping the step and requeueing job $SLURM_JOB_ID" >&2',
            '  scancel --signal=TERM "$SLURM_JOB_ID"  # the steps\' tasks (not this script): srun would SIGKILL them',
            '  wait "$step" || true',
            '  scontrol requeue "$SLURM_JOB_ID"',
            "  exit 0",
            "}",
            "trap requeue USR1",
            f"{step} &",
            "step=$!",
            'status=0; wait "$step" || status=$?',
        ]
    else:
        body += ["", "status=0", f"{step} || status=$?"]
    body += _after_step(job)
    return "\n".join(_header(job) + ["", f"# Generated by imgbuild: {_layout(job)}."] + body) + "\n"


def _after_step(job: JobSpec) -> list[str]:
    """What the job does once its step has ended: the files it wrote removed, its GPU use summarised, its
    step's exit status its own."""
    lines = ['rm -f "$ds_hostfile"'] if job.writes_hostfile else []
    lines += USAGE_END if job.usage and job.gpus else []
    if job.stage:
        lines += [
            'if [ -n "${own_scratch:-}" ]; then',
            f'  srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 rm -rf "${job.scratch_var}" || true',
            "fi",
        ]
    return [*lines, 'exit "$status"']


def _layout(job: JobSpec) -> str:
    if job.task_per_gpu:
        return f"{job.tasks_per_node} tasks per node, one GPU each"
    return "one task per node; on each, the container runs " + ("torchrun" if job.uses_torchrun else "the command")


def _header(job: JobSpec) -> list[str]:
    gres = []
    if job.gpus and not job.task_per_gpu:
        gres.append(f"gpu:{job.gpu_type}:{job.gpus}" if job.gpu_type else f"gpu:{job.gpus}")
    if job.scratch_gres:
        gres.append(job.scratch_gres)
    head = ["#!/bin/bash", f"#SBATCH --job-name={job.job_name}"]
    head += [f"#SBATCH --partition={job.partition}"] if job.partition else []
    head += [f"#SBATCH --account={job.account}"] if job.account else []
    head += [f"#SBATCH --qos={job.qos}"] if job.qos else []
    head += [f"#SBATCH --constraint={job.constraint}"] if job.constraint else []
    head += [f"#SBATCH {line}" for line in job.sbatch_lines]
    head += [
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.tasks_per_node}",
        f"#SBATCH --cpus-per-task={job.cpus_per_task}",
    ]
    if job.task_per_gpu and job.gpus:
        head += [f"#SBATCH --gpus-per-task={job.gpu_type + ':' if job.gpu_type else ''}1"]
    head += [f"#SBATCH --gres={','.join(gres)}"] if gres else []
    head += [f"#SBATCH --mem={job.mem}"] if job.mem else []
    if job.runtime == "shifter":  # Shifter's Slurm plugin sets the image up on every node before the job starts
        head += [f"#SBATCH --image=docker:{_sbatch_word(job.image, 'the image')}"]
        head += [f"#SBATCH --volume={_sbatch_word(bind_pair(b), '--bind')}" for b in _binds(job) if "$" not in b]
    head += [f"#SBATCH --time={job.time}", f"#SBATCH --output={job.output}"]
    if job.requeue:
        head += ["#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{job.signal_lead}", "#SBATCH --open-mode=append"]
    return head


def _sbatch_word(text: str, what: str) -> str:
    """A value for an #SBATCH line, which sbatch reads up to the first space and no shell ever sees."""
    if not re.fullmatch(r"[A-Za-z0-9._/:@+=,-]{1,1024}", text):
        raise UsageError(f"{what} {text[:80]!r}: not a plain path or image name, which an #SBATCH line needs")
    return text


def _stage_lines(job: JobSpec) -> list[str]:
    if not job.stage:
        return []
    lines = [
        "",
        f"# Stage the data once per node to the node's fast local disk (${job.scratch_var}).",
        f'if [ -z "${{{job.scratch_var}:-}}" ]; then  # none from the site: a folder of the job, removed at the end',
        f'  export {job.scratch_var}="${{TMPDIR:-/tmp}}/imgbuild-$SLURM_JOB_ID"',
        "  own_scratch=1",
        "fi",
        f'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 mkdir -p "${job.scratch_var}"',
    ]
    per_node = 'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1'
    for tar in job.stage:
        lines += [f'{per_node} tar xf {shlex.quote(tar)} -C "${job.scratch_var}"']
    return lines


#: GPU use sampled every 30 s on each node (nvidia-smi, where the node has it), beside the job's output.
USAGE_START = [
    "",
    "# Sample GPU use on every node (like `imgbuild run`'s summary; seff gives CPU and memory afterwards).",
    'usage_dir="${SLURM_SUBMIT_DIR:-$PWD}/imgbuild-usage-$SLURM_JOB_ID"',
    'mkdir -p "$usage_dir"',
    # env -u: sbatch exports SLURM_GPUS_PER_TASK, which srun would read back (one GPU per node for the sampler).
    # --mem=0: where the site tracks memory (CR_Core_Memory) the job's step holds all of it; a sampler asking
    # for its own share would not start ("Memory required by task is not available").
    'env -u SLURM_GPUS_PER_TASK srun --overlap --mem=0 --ntasks="$SLURM_NNODES" --ntasks-per-node=1 '
    "sh -c 'command -v nvidia-smi >/dev/null && "
    # -i: the step's own GPUs (host indices); a node without device constraints would list its neighbours' too
    'exec nvidia-smi ${SLURM_STEP_GPUS:+-i "$SLURM_STEP_GPUS"} '
    "--query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits -l 30 "
    '> "$0/${SLURMD_NODENAME:-$(hostname -s)}.csv"\' "$usage_dir" 2>/dev/null &',
    "sampler=$!",
]
USAGE_END = [
    "",
    "# The job's GPU summary: per node and GPU, mean and max utilisation and the most memory used.",
    'kill "$sampler" 2>/dev/null || true',
    'wait "$sampler" 2>/dev/null || true',
    'echo "imgbuild: GPU use of job $SLURM_JOB_ID (node GPU samples util-mean% util-max% mem-max-MiB):"',
    'for f in "$usage_dir"/*.csv; do',
    '  [ -s "$f" ] || continue',
    '  awk -F\', *\' -v node="$(basename "$f" .csv)" \'$1 ~ /^[0-9]+$/ { n[$1]++; s[$1]+=$2; '
    'if ($2>u[$1]) u[$1]=$2; if ($3>m[$1]) m[$1]=$3 } END { for (g in n) printf "%s %s %d %.0f %d %d\\n", '
    'node, g, n[g], s[g]/n[g], u[g], m[g] }\' "$f"',
    "done",
    'rm -rf "$usage_dir"  # summarised above: nothing left in the submit folder',
    'command -v seff >/dev/null && echo "imgbuild: CPU and memory efficiency: seff $SLURM_JOB_ID (after the job)"',
]
