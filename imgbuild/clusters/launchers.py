"""What a launcher the user typed is told, by its own rules, so that its processes on every node form one world:
`accelerate launch` its processes, machines, this machine's rank and the main process (never a second mode beside
the one the user chose by flag or config file), `deepspeed` a hostfile and its no-ssh form with this node's rank;
MPI launchers (mpirun, mpiexec, horovodrun) and others imgbuild cannot tell are refused across nodes with the cure.
Slurm's step (clusters.launch) and Kubernetes' TrainJob (clusters.k8s) both tell launchers from here.

Each told command is `sh -c SCRIPT LAUNCHER WORDS...`: the words that are known only on the node (its rank, and on
Kubernetes the rendezvous) are read by that shell, inside the task."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from imgbuild.errors import UsageError

PYTHON_RE = re.compile(r"(?:.*/)?python(?:3(?:\.[0-9]{1,2})?)?")


class Kind(Enum):
    """Launchers, by what they read to find the rest of their world."""

    TORCHRUN = "torchrun"  # torchrun's own PET_* variables
    ACCELERATE = "accelerate"  # its flags (or its config file)
    DEEPSPEED = "deepspeed"  # a hostfile and its flags
    MPI = "mpi"  # its own process manager: Slurm's tasks are the cure across nodes
    OTHER = "other"  # a launcher imgbuild knows of but cannot tell (composer)


#: Launchers by program name, and by `python -m MODULE`: (kind, how many words name the launcher).
PROGRAMS = {
    "torchrun": Kind.TORCHRUN,
    "accelerate": Kind.ACCELERATE,
    "deepspeed": Kind.DEEPSPEED,
    "mpirun": Kind.MPI,
    "mpiexec": Kind.MPI,
    "horovodrun": Kind.MPI,
    "srun": Kind.MPI,
    "composer": Kind.OTHER,
}
MODULES = {
    "torch.distributed.run": Kind.TORCHRUN,
    "torch.distributed.launch": Kind.TORCHRUN,
    "accelerate.commands.launch": Kind.ACCELERATE,
    "deepspeed": Kind.DEEPSPEED,
    "deepspeed.launcher.runner": Kind.DEEPSPEED,
}


def launcher_of(command: list[str]) -> tuple[Kind, int] | None:
    """(the kind of launcher `command` is, how many of its first words name it), or None for a plain command."""
    if not command:
        return None
    head = command[0].rsplit("/", 1)[-1]
    if head == "accelerate":  # its other commands (config, env, test) start no workers of the job's
        return (Kind.ACCELERATE, 2) if command[1:2] == ["launch"] else (Kind.OTHER, 1)
    if head in PROGRAMS:
        return PROGRAMS[head], 1
    if PYTHON_RE.fullmatch(command[0]) and command[1:2] == ["-m"] and command[2:3] and command[2] in MODULES:
        return MODULES[command[2]], 3
    return None


@dataclass(frozen=True)
class World:
    """The job's shape as each node's launcher is told it: counts known when the job is written, and shell words
    read inside the task for this node's rank and the rendezvous (`$SLURM_NODEID`, `$PET_MASTER_ADDR`)."""

    nodes: int
    per_node: int  # processes per node: one per GPU (at least one)
    node_rank: str
    addr: str  # "" where the launcher finds its own (one node)
    port: str  # "" where no other job can share the node's ports (a pod of its own)
    hostfile: str | None = None  # a DeepSpeed hostfile the job wrote (as the task sees it); None: the task writes one

    @property
    def processes(self) -> int:
        return self.nodes * self.per_node


# --- reading a launcher's own options ------------------------------------------------------------------------


@dataclass(frozen=True)
class Grammar:
    """A launcher's options as its own parser (argparse) reads them: every spelling of an option is one name (the
    first spelling its parser lists), whether it takes a value, and whether a unique prefix of a long option is
    that option (argparse's allow_abbrev, on for torchrun and deepspeed, off for accelerate)."""

    switches: frozenset[str]  # names of the options that take no value; every other option takes one
    aliases: Mapping[str, str] = field(default_factory=dict)  # another spelling -> the name
    separator: str = ""  # every long option spelled with either `-` or `_` inside; this one is the name's
    longs: frozenset[str] = frozenset()  # every long name, where a unique prefix is the option; empty: no prefixes

    def name(self, spelling: str) -> str:
        """The one name of the option `spelling` is (as typed where it is none of this launcher's)."""
        if self.separator and spelling.startswith("--"):
            other = "_" if self.separator == "-" else "-"
            spelling = "--" + spelling[2:].replace(other, self.separator)
        spelling = self.aliases.get(spelling, spelling)
        if self.longs and spelling.startswith("--") and spelling not in self.longs:
            found = [name for name in self.longs if name.startswith(spelling)]
            spelling = found[0] if len(found) == 1 else spelling
        return spelling


#: accelerate launch: every long option in `_` and `-` spellings (`--use-fsdp`, `--config-file`), no prefixes.
ACCELERATE = Grammar(
    switches=frozenset({
        "--cpu", "--debug", "--downcast_bf16", "--dynamo_use_dynamic", "--dynamo_use_fullgraph",
        "--dynamo_use_regional_compilation", "--enable_cpu_affinity", "--fp8_use_autocast_during_eval", "--module",
        "--multi_gpu", "--no_python", "--no_tpu_cluster", "--quiet", "--same_network", "--tpu", "--tpu_cluster",
        "--tpu_use_sudo", "--use_deepspeed", "--use_fsdp", "--use_megatron_lm", "--use_parallelism_config",
        "--help",
    }),
    aliases={"-m": "--module", "-q": "--quiet", "-h": "--help", "-t": "--tee"},
    separator="_",
)  # fmt: skip
#: deepspeed's runner: one spelling each (but -H, -i, -e, --num_accelerators), any unique prefix.
DEEPSPEED = Grammar(
    switches=frozenset({
        "--module", "--no_python", "--no_local_rank", "--no_ssh", "--no_ssh_check", "--force_multi", "--save_pid",
        "--bind_cores_to_rank", "--quiet", "--help",
    }),
    aliases={"-H": "--hostfile", "-i": "--include", "-e": "--exclude", "--num_accelerators": "--num_gpus",
             "-q": "--quiet", "-h": "--help"},
    longs=frozenset({
        "--help", "--hostfile", "--include", "--exclude", "--num_nodes", "--num_gpus", "--num_accelerators",
        "--master_port", "--master_addr", "--node_rank", "--launcher", "--launcher_args", "--module",
        "--no_python", "--no_local_rank", "--no_ssh", "--no_ssh_check", "--force_multi", "--save_pid",
        "--enable_each_rank_log", "--autotuning", "--bind_cores_to_rank", "--bind_core_list", "--ssh_port",
        "--venv_script", "--log_level", "--quiet",
    }),
)  # fmt: skip
#: torchrun (torch.distributed.run): every long option in `-` and `_` spellings but a few, any unique prefix.
TORCHRUN = Grammar(
    switches=frozenset({"--standalone", "--module", "--no-python", "--run-path", "--virtual-local-rank", "--help"}),
    aliases={"-m": "--module", "-h": "--help", "-r": "--redirects", "-t": "--tee"},
    separator="-",
    longs=frozenset({
        "--help", "--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
        "--standalone", "--max-restarts", "--monitor-interval", "--start-method", "--event-log-handler", "--role",
        "--module", "--no-python", "--run-path", "--log-dir", "--redirects", "--tee", "--log-line-prefix-template",
        "--local-ranks-filter", "--duplicate-stdout-filters", "--duplicate-stderr-filters", "--node-rank",
        "--master-addr", "--master-port", "--local-addr", "--logs-specs", "--numa-binding", "--signals-to-handle",
        "--shutdown-timeout", "--virtual-local-rank", "--print-completion",
    }),
)  # fmt: skip
#: accelerate's distributed modes, as flags, and as a config file's `distributed_type` names them.
ACCELERATE_MODES = {
    "--multi_gpu": "MULTI_GPU",
    "--use_fsdp": "FSDP",
    "--use_deepspeed": "DEEPSPEED",
    "--use_megatron_lm": "MEGATRON_LM",
    "--cpu": "NO",
    "--tpu": "XLA",
}


def launcher_options(words: list[str], grammar: Grammar) -> dict[str, str | None]:
    """A launcher's own options, up to its script, by their one names: {name: its value, None for a switch}."""
    found: dict[str, str | None] = {}
    at = 0
    while at < len(words):
        word = words[at]
        if not word.startswith("-") or word in ("-", "--"):
            break
        spelling, eq, value = word.partition("=")
        name = grammar.name(spelling if eq and spelling.startswith("--") else word)
        if eq and spelling.startswith("--"):
            found[name], at = value, at + 1
        elif name in grammar.switches:
            found[name], at = None, at + 1
        else:
            found[name], at = (words[at + 1] if at + 1 < len(words) else ""), at + 2
    return found


# --- telling each launcher --------------------------------------------------------------------------------------


def told(command: list[str], world: World) -> list[str]:
    """`command`, a launcher, told what it needs to join its world. A plain command or torchrun (told by its
    PET_* variables) is returned as it is; an MPI launcher across nodes is refused with the cure."""
    found = launcher_of(command)
    if found is None:
        return command
    kind, length = found
    head, rest = command[:length], command[length:]
    if kind is Kind.TORCHRUN:
        return _torchrun(command, rest, world)
    if kind is Kind.ACCELERATE:
        return _accelerate(head, rest, world)
    if kind is Kind.DEEPSPEED:
        return _deepspeed(head, rest, world)
    if world.nodes > 1:
        program = command[length - 1] if length > 1 else command[0].rsplit("/", 1)[-1]
        cure = (
            "run the program as Slurm's tasks instead: --task-per-gpu -- python3 train.py (srun --mpi=pmix with "
            "slurm.mpi: pmix)"
            if kind is Kind.MPI
            else "run the script under torchrun (-- python3 train.py)"
        )
        raise UsageError(f"{program} across nodes would start one world on each node: {cure}")
    return command


#: torchrun's options that find its rendezvous: across nodes the job's (its PET_* variables), never another.
TORCHRUN_RENDEZVOUS = (
    "--standalone", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--node-rank", "--master-addr", "--master-port",
)  # fmt: skip


def _torchrun(command: list[str], rest: list[str], world: World) -> list[str]:
    """torchrun, told by the PET_* variables it reads: across nodes the job's script (Slurm) or the Trainer's
    runtime sets them; on one node, here, its GPUs and a standalone rendezvous on a free port. A flag of its own
    that would put another world over them (more or fewer processes or nodes, a rendezvous of one node's own) is
    refused by name."""
    options = launcher_options(rest, TORCHRUN)
    per_node = options.get("--nproc-per-node")
    if per_node is not None and per_node not in (str(world.per_node), "gpu", "auto"):
        raise UsageError(
            f"torchrun --nproc-per-node={per_node}: imgbuild sets it for the job (one process per GPU: "
            f"{world.per_node}); drop it, or ask for --gpus {per_node}"
        )
    nnodes = options.get("--nnodes")
    if nnodes is not None and nnodes not in (str(world.nodes), f"{world.nodes}:{world.nodes}"):
        raise UsageError(f"torchrun --nnodes={nnodes}: the job has {world.nodes} node(s), which imgbuild sets; drop it")
    typed = [name for name in TORCHRUN_RENDEZVOUS if name in options]
    if world.nodes > 1 and typed:
        raise UsageError(
            f"torchrun {typed[0]}: imgbuild gives every node the job's one rendezvous (PET_* variables); "
            f"{typed[0]} would make another, each node training alone or waiting: drop it"
        )
    if world.nodes > 1:
        return command
    return ["env", f"PET_NPROC_PER_NODE={world.per_node}", "PET_STANDALONE=1", *command]


def _in_task(head: list[str], flags: list[str], rest: list[str], before: str = "") -> list[str]:
    """`sh -c` that runs the launcher with `flags` (read by the task's shell, after `before`) ahead of the user's
    own words."""
    script = before + 'exec "$0" ' + " ".join([*(shlex.quote(w) for w in head[1:]), *flags, '"$@"'])
    return ["sh", "-c", script, *head[:1], *rest]


def _refuse_set(program: str, options: dict[str, str | None], ours: dict[str, str]) -> None:
    """A flag the user typed that imgbuild sets from the job: the same value passes, another is refused by name."""
    for name, value in ours.items():
        if name in options and (options[name] != value or "$" in value):
            told = value if "$" not in value else "each node's own, from the job"
            raise UsageError(f"{program} {name}={options[name]}: imgbuild sets it for the job ({told}); drop it")


#: accelerate's own default config file (`accelerate config` writes it), as the task's shell finds it.
ACCELERATE_DEFAULT_CONFIG = '"${HF_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/huggingface}/accelerate/default_config.yaml"'


def _accelerate(head: list[str], rest: list[str], world: World) -> list[str]:
    """accelerate launch told the world, in the mode the user chose: a mode flag, else a config file's
    distributed_type (the one named, else accelerate's default one where the task finds it), else several
    processes are multi-GPU. Told: its processes and machines, and across machines each one's rank, the main
    process and the standard per-node launcher for DeepSpeed (no ssh, no pdsh); never a second mode."""
    options = launcher_options(rest, ACCELERATE)
    modes = [flag for flag in ACCELERATE_MODES if flag in options]
    if len(modes) > 1:
        raise UsageError(f"accelerate launch {' '.join(modes)}: one mode at a time (accelerate refuses two)")
    ours = {"--num_processes": str(world.processes)}
    if world.nodes > 1:
        ours.update({
            "--num_machines": str(world.nodes),
            "--machine_rank": world.node_rank,
            "--main_process_ip": world.addr,
            "--main_process_port": world.port,
            "--deepspeed_multinode_launcher": "standard",
        })  # fmt: skip
    elif world.port and "--main_process_port" not in options:
        ours["--main_process_port"] = world.port  # a port of the job's own: another job may share the node
    _refuse_set("accelerate launch", options, ours)
    flags = [f'{name}="{value}"' for name, value in ours.items() if name not in options]
    if modes or "--config_file" in options or world.processes == 1:
        return _in_task(head, flags, rest)
    # no mode named: multi-GPU, unless the user's default config file names one (accelerate then reads it)
    before = f"mode=--multi_gpu; if [ -f {ACCELERATE_DEFAULT_CONFIG} ]; then mode=; fi; "
    return _in_task(head, [*flags, "$mode"], rest, before)


#: deepspeed's options that place its processes, which the job's hostfile and each node's rank decide.
DEEPSPEED_PLACEMENT = frozenset({
    "--num_nodes", "--num_gpus", "--include", "--exclude", "--launcher", "--force_multi",
})  # fmt: skip


def _deepspeed(head: list[str], rest: list[str], world: World) -> list[str]:
    """deepspeed's runner: on one node it finds the task's GPUs itself (told only a port of the job's own); across
    nodes, a hostfile of every node with its GPUs as slots, and its no-ssh form: each node starts its own
    processes as this node's rank in the hostfile, at the first node's address (without a hostfile it trains on
    its own node at 127.0.0.1: one training per node)."""
    options = launcher_options(rest, DEEPSPEED)
    if world.nodes == 1:
        if world.port and "--master_port" not in options:
            return _in_task(head, [f'--master_port="{world.port}"'], rest)
        return [*head, *rest]
    ours = {
        "--hostfile": world.hostfile or "$h",
        "--no_ssh": "",
        "--node_rank": world.node_rank,
        "--master_addr": world.addr,
        "--master_port": world.port,
    }
    typed = [name for name in options if name != "--no_ssh" and (name in ours or name in DEEPSPEED_PLACEMENT)]
    if typed:
        raise UsageError(
            f"deepspeed {typed[0]}: imgbuild starts deepspeed on every node with a hostfile of the job's nodes "
            "(--no_ssh, each node its own rank); drop it"
        )
    flags = [f'{name}="{value}"' if value else name for name, value in ours.items() if name not in options]
    command = _in_task(head, flags, rest)
    if world.hostfile:
        return command
    slots = "".join(f"node{i} slots={world.per_node}\\n" for i in range(world.nodes))
    command[2] = f"h=$(mktemp) && printf '{slots}' > \"$h\" && " + command[2]
    return command


def hostfile_lines(per_node: int, path: str) -> list[str]:
    """Slurm script lines that write DeepSpeed's hostfile when the job starts: every node of the job, in Slurm's
    node order (each node's rank, SLURM_NODEID, is its line), with its GPUs as slots."""
    return [
        "",
        "# DeepSpeed's hostfile: the job's nodes in Slurm's order (a node's SLURM_NODEID is its line), each with",
        "# its GPUs as slots; every node starts its own processes (--no_ssh).",
        f"ds_hostfile={path}",
        f'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\\$/ slots={per_node}/" > "$ds_hostfile"',
    ]
