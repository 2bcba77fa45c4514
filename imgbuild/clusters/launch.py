"""How a cluster job's command is launched, by the image's framework and by the command itself: torchrun for a
PyTorch image on more than one GPU (the command as typed: `python3 train.py`, `python -m pkg.train`), none for
TensorFlow and JAX (they start their own workers), and a command that is a launcher itself (torchrun, accelerate
launch, deepspeed, mpirun) told its world by its own rules (clusters.launchers), never wrapped in another."""

from __future__ import annotations

from typing import TYPE_CHECKING

from imgbuild.clusters.launchers import (
    PYTHON_RE,
    TORCHRUN,
    Kind,
    World,
    hostfile_lines,
    launcher_of,
    launcher_options,
    told,
)
from imgbuild.errors import UsageError

if TYPE_CHECKING:
    from imgbuild.clusters.slurm import JobSpec


def launcher(job: JobSpec) -> tuple[list[str], list[str]]:
    """(script lines before the step, the command the container runs): torchrun or the command itself."""
    command = list(job.command)
    restarts = [f"--max-restarts={job.max_restarts}"] if job.max_restarts else []
    found = launcher_of(command)
    if found:  # a launcher itself: told by its own rules, never wrapped in another
        program = " ".join(command[: found[1]]).rsplit("/", 1)[-1]
        if job.task_per_gpu:  # Slurm's tasks are the processes: a launcher in each would start a world per GPU
            raise UsageError(
                f"--task-per-gpu: Slurm starts a process per GPU itself, and {program} would start its own in each "
                f"task; drop --task-per-gpu (imgbuild tells {program} the job's GPUs and nodes), or run the program "
                "itself (-- python3 train.py)"
            )
        if job.max_restarts:
            raise UsageError(f"--max-restarts: {program} is the job's launcher; give it its own restart option")
        return _launcher_told(job, command, found[0])
    if job.framework == "tensorflow" and job.nodes > 1 and not job.uses_torchrun:
        # one worker per task; its index, its Slurm rank, is known only inside the task
        return _tf_worker_lines(job), ["sh", "-c", TF_CONFIG_SCRIPT, "sh", *alone_command(command)]
    if job.framework == "jax" and not job.uses_torchrun:
        return _jax_launch(job, alone_command(command))
    if not job.uses_torchrun:
        return [], alone_command(command)
    command = torchrun_command(command)
    if job.nodes == 1:
        # One node: no rendezvous port at all (two jobs on one node would share a fixed one).
        return [], ["torchrun", "--standalone", f"--nproc-per-node={max(job.gpus, 1)}", *restarts, *command]
    return _rendezvous_lines(job), _hosting(job, [
        "torchrun",
        "--nnodes=$SLURM_NNODES",
        f"--nproc-per-node={max(job.gpus, 1)}",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=$head_node:$rdzv_port",
        "--rdzv-id=$SLURM_JOB_ID",
        *restarts,
        *command,
    ])  # fmt: skip


#: torchrun's c10d store is hosted where the endpoint's host matches the node's own name; a fabric name (JUWELS'
#: `jwb0038i`) never does, so the first node is told it hosts (`is_host`, read by torchrun from PET_RDZV_CONF).
IS_HOST = 'export PET_RDZV_CONF="is_host=$([ "$SLURM_NODEID" = 0 ] && echo 1 || echo 0)"; exec "$@"'


def _hosting(job: JobSpec, command: list[str]) -> list[str]:
    """torchrun's command across nodes, told on each node whether it hosts the rendezvous where the endpoint is a
    fabric name (slurm.rdzv_host_suffix)."""
    return ["sh", "-c", IS_HOST, "sh", *command] if job.rdzv_host_suffix else command


def _launcher_told(job: JobSpec, command: list[str], kind: Kind) -> tuple[list[str], list[str]]:
    """A launcher the user typed, told the job's world (clusters.launchers): torchrun by the PET_* variables it
    reads, across nodes the rendezvous here; accelerate and deepspeed by their own flags, with a port of the job's
    own on one node too; an MPI launcher across nodes is refused there, on one node it runs as typed."""
    world = World(
        nodes=job.nodes,
        per_node=max(job.gpus, 1),
        node_rank="$SLURM_NODEID",
        addr="$MASTER_ADDR" if job.nodes > 1 else "",
        port="$MASTER_PORT",
        hostfile=HOSTFILE if kind is Kind.DEEPSPEED and job.nodes > 1 else None,
    )
    found = launcher_of(command)
    typed = launcher_options(command[found[1] :], TORCHRUN) if found and kind is Kind.TORCHRUN else {}
    command = told(command, world)
    if job.nodes > 1 and job.rdzv_host_suffix and "--rdzv-conf" in typed:  # it would replace is_host's
        raise UsageError(
            f"torchrun --rdzv-conf={typed['--rdzv-conf']}: with slurm.rdzv_host_suffix imgbuild gives torchrun its "
            "rendezvous configuration (is_host on the first node, which a fabric name needs); drop it"
        )
    if kind in (Kind.ACCELERATE, Kind.DEEPSPEED):
        if job.nodes == 1:
            return ["", *_port_lines(job)], ["env", "MASTER_PORT=$rdzv_port", *command]
        lines = _rendezvous_lines(job)
        lines += hostfile_lines(world.per_node, HOSTFILE) if world.hostfile else []
        return lines, ["env", "MASTER_ADDR=$head_node", "MASTER_PORT=$rdzv_port", *command]
    if job.nodes == 1:  # torchrun told its GPUs and a standalone rendezvous on a free port; MPI as typed
        return [], command
    facts = [
        f"PET_NPROC_PER_NODE={max(job.gpus, 1)}",
        "PET_NNODES=$SLURM_NNODES",
        "PET_RDZV_BACKEND=c10d",
        "PET_RDZV_ENDPOINT=$head_node:$rdzv_port",
        "PET_RDZV_ID=$SLURM_JOB_ID",
        "MASTER_ADDR=$head_node",
        "MASTER_PORT=$rdzv_port",
    ]
    return _rendezvous_lines(job), _hosting(job, ["env", *facts, *command])


#: DeepSpeed's hostfile, in the job's folder (every runtime's working folder), as the task sees it.
HOSTFILE = ".imgbuild-hostfile-$SLURM_JOB_ID"


def _address_line(var: str, node: str, suffix: str) -> str:
    """`var=` the node `$node` names as the job reaches it: the site's name on its fabric (JUWELS: the host name and
    `i`), else Slurm's NodeAddr for it (else its name)."""
    if suffix:
        return f'{var}="${{{node}}}{suffix}"'
    return f'{var}=$(scontrol show node "${node}" -o | grep -o "NodeAddr=[^ ]*" | cut -d= -f2 || echo "${node}")'


def _rendezvous_lines(job: JobSpec) -> list[str]:
    """Script lines that find the rendezvous: the allocation's first node, and a port free there now."""
    return [
        "",
        "# The rendezvous (torchrun's store, JAX's coordinator) is the first node of the allocation, on a port",
        "# of this job's own, so two jobs sharing a node never join each other's.",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        _address_line("head_node", "head_node", job.rdzv_host_suffix),
        *_port_lines(job),
    ]


def _port_lines(job: JobSpec, var: str = "rdzv_port") -> list[str]:
    return [
        "# This script runs on the first node: a port free there now, from the kernel (job ids 10000 apart",
        "# shared one before); a fixed offset below the ephemeral range where the node has no python3.",
        f"{var}=$(python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])' "
        f"2>/dev/null || echo $(( {job.rdzv_port} + SLURM_JOB_ID % 3000 )))",
    ]


def _jax_launch(job: JobSpec, command: list[str]) -> tuple[list[str], list[str]]:
    """JAX: `jax.distributed.initialize()` finds Slurm by itself, but gives each process the one GPU numbered as
    its local rank and a coordinator at the first node's host name, on a port from the job id. So: every GPU the
    task sees is its own (one task per node: all of them; one task per GPU: its only one, device 0), and the
    coordinator is the first node's address (on one node, its loopback) on a port free there now
    (JAX_COORDINATOR_ADDRESS and JAX_LOCAL_DEVICE_IDS, which JAX reads before asking Slurm)."""
    facts = []
    if job.gpus > 1 or job.task_per_gpu:
        devices = "0" if job.task_per_gpu else ",".join(str(i) for i in range(job.gpus))
        facts.append(f"JAX_LOCAL_DEVICE_IDS={devices}")
    if not facts and job.nodes == 1:
        return [], command
    if job.nodes == 1:  # this node: its loopback, a port of its own (Slurm's guess is the node's host name)
        return ["", *_port_lines(job)], ["env", *facts, "JAX_COORDINATOR_ADDRESS=127.0.0.1:$rdzv_port", *command]
    return _rendezvous_lines(job), ["env", *facts, "JAX_COORDINATOR_ADDRESS=$head_node:$rdzv_port", *command]


#: Each TensorFlow task's TF_CONFIG (MultiWorkerMirroredStrategy reads it): the job's workers (ADDRESS:PORT,
#: comma-separated, in IMGBUILD_TF_WORKERS), and this task as the worker whose index is its Slurm rank
#: (`--distribution=block`, Slurm's default: ranks fill a node first).
TF_CONFIG_SCRIPT = (
    'w=""; IFS=,; for a in $IMGBUILD_TF_WORKERS; do w="$w${w:+, }\\"$a\\""; done; '
    'export TF_CONFIG="{\\"cluster\\": {\\"worker\\": [$w]}, '
    '\\"task\\": {\\"type\\": \\"worker\\", \\"index\\": $SLURM_PROCID}}"; exec "$@"'
)


def _tf_worker_lines(job: JobSpec) -> list[str]:
    """Script lines that list the TensorFlow workers, rank order: each node's address (as the rendezvous is
    found), a port per worker counted up from one free on this node now (ports differ across nodes too, so
    nodes that share an address, as a lab's small cluster may, never collide)."""
    return [
        "",
        "# TensorFlow's MultiWorkerMirroredStrategy: every task is one worker, told the cluster in TF_CONFIG",
        "# (written inside each task, where its rank is known); the workers' ports are this job's own.",
        *_port_lines(job, "tf_port"),
        "IMGBUILD_TF_WORKERS=''",
        "tf_rank=0",
        'for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
        f"  {_address_line('addr', 'node', job.rdzv_host_suffix)}",
        f"  for _ in $(seq {job.tasks_per_node}); do",
        '    IMGBUILD_TF_WORKERS="$IMGBUILD_TF_WORKERS${IMGBUILD_TF_WORKERS:+,}$addr:$((tf_port + tf_rank))"',
        "    tf_rank=$((tf_rank + 1))",
        "  done",
        "done",
        "export IMGBUILD_TF_WORKERS",
    ]


def launches_itself(command: list[str]) -> bool:
    """`torchrun ...`, `accelerate launch ...`, `deepspeed ...`, `mpirun ...`, `python -m torch.distributed.run`:
    the command is a launcher, to be told its world, never wrapped in another."""
    return launcher_of(command) is not None


def torchrun_command(command: list[str]) -> list[str]:
    """What follows torchrun's options for the command the user typed, so one command works at 1 GPU and at N:
    `python3 train.py --lr 1` -> `train.py --lr 1`; `python -m pkg.train` -> `-m pkg.train`; a script ->
    itself; anything else (`bash run.sh`, `python3 -u x.py`, a binary) -> `--no-python` and the command."""
    if not command:
        return command
    head, rest = command[0], command[1:]
    if PYTHON_RE.fullmatch(head):
        if rest[:1] == ["-m"] and len(rest) > 1:
            return ["-m", *rest[1:]]
        if rest and not rest[0].startswith("-"):
            return rest
        return ["--no-python", *command]
    if head.endswith(".py"):
        return command
    return ["--no-python", *command]


def alone_command(command: list[str]) -> list[str]:
    """The command on one GPU (no torchrun): a bare `train.py` runs as torchrun would run it, with python3."""
    if command and command[0].endswith(".py") and not PYTHON_RE.fullmatch(command[0]):
        return ["python3", *command]
    return command
