"""Clusters: Apptainer definition files for a recipe, and sbatch scripts that follow cluster conventions.

Docker is not allowed on most Slurm clusters; Apptainer runs the image (`--nv` for GPUs), or pyxis/enroot
(`srun --container-image`). One recipe, three outputs: the Docker image, an Apptainer definition, a job.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgbuild.errors import EnvironmentProblem, JobFailed, UsageError
from imgbuild.plan import Plan
from imgbuild.render import apptainer_definition

#: Site settings for Slurm (config file `slurm:`), with defaults from the CSC/Puhti conventions.
SLURM_DEFAULTS: dict[str, Any] = {
    "partition": None,
    "account": None,
    "gpu_types": {},  # friendly name -> gres type, e.g. {v100: v100, a100: a100_40g}
    "gpu_type": None,  # the GRES type asked for when --gpu-type is not given
    "gpus_per_node": {},  # GPUs a node of each type has, e.g. {v100: 4, a100: 8}: more per node is refused
    "binds": [],  # folders every job sees, in every runtime (CSC: /scratch, /projappl)
    "cpus_per_gpu": 10,
    "mem_per_gpu": None,  # e.g. "64G"
    "time": "01:00:00",
    "scratch_var": "LOCAL_SCRATCH",
    "scratch_gres": None,  # e.g. "nvme:100" (CSC: fast local disk is requested as gres)
    "runtime": "apptainer",  # apptainer | singularity | pyxis | docker
    "sif_dir": None,  # where .sif files live on the cluster
    "rdzv_port": 29500,
}
RUNTIMES = ("apptainer", "singularity", "pyxis", "docker")


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
    torchrun: bool | None = None  # default: for more than one GPU in all

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.nodes

    @property
    def uses_torchrun(self) -> bool:
        return self.total_gpus > 1 if self.torchrun is None else self.torchrun


def _container_prefix(job: JobSpec) -> tuple[list[str], list[str]]:
    """(extra srun options, command prefix) that run the command in the image with the runtime."""
    binds = list(job.binds)
    if job.stage:
        binds.append(f"${job.scratch_var}:${job.scratch_var}")
    if job.runtime in ("apptainer", "singularity"):
        opts = ["--nv"] if job.gpus else []
        for bind in binds:
            opts += ["--bind", bind]
        return [], [job.runtime, "exec", *opts, job.image]
    if job.runtime == "pyxis":
        srun = [
            f"--container-image={job.image}",
            "--container-workdir=/workspace",
            f"--container-mounts={','.join(['$PWD:/workspace', *binds])}",
        ]
        return srun, []
    if job.runtime == "docker":
        # Like Apptainer: the host's network, IPC and PID namespaces (torchrun's node identity is
        # hostname + pid, which must differ between nodes that share a host in small lab clusters).
        opts = [
            "docker",
            "run",
            "--rm",
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
            "-e",
            "SLURM_JOB_ID",
            "-e",
            "SLURM_PROCID",
            "-e",
            "SLURM_NNODES",
        ]
        opts += ["--user", "$(id -u):$(id -g)"]  # files in the working folder are the user's, not root's
        if job.nccl_debug:
            opts += ["-e", "NCCL_DEBUG"]
        for bind in binds:
            opts += ["-v", bind]
        if not job.gpus:
            return [], [*opts, "-e", "NVIDIA_VISIBLE_DEVICES=void", job.image]
        # The daemon sees every GPU of the node: give the container exactly the step's, read on each node
        # inside the step (SLURM_STEP_GPUS: the allocated GPUs' host indices).
        script = _words(opts) + ' --gpus "\\"device=${SLURM_STEP_GPUS:-$SLURM_JOB_GPUS}\\"" ' + _words([job.image])
        return [], ["sh", "-c", "exec " + script + ' "$@"', "sh"]
    raise UsageError(f"--runtime: {job.runtime!r} is not one of {', '.join(RUNTIMES)}")


def _words(words: list[str]) -> str:
    """Shell words; $VARS stay expandable (they are the job's own variables), the rest is quoted."""
    out = []
    for word in words:
        if re.fullmatch(r"[\w@%+=:,./${}-][\w@%+=:,./${}#-]*", word):  # '#' starts a comment only at a word's start
            out.append(word)
        elif "$" in word and '"' not in word and "`" not in word:
            out.append(f'"{word}"')
        else:
            out.append(shlex.quote(word))
    return " ".join(out)


def sbatch_script(job: JobSpec) -> str:
    """An sbatch script: resources per the site, data staged to node-local disk, one launcher per node."""
    if job.gpus < 0 or job.nodes < 1:
        raise UsageError("--gpus must be >= 0 and --nodes >= 1")
    gres = []
    if job.gpus:
        gres.append(f"gpu:{job.gpu_type}:{job.gpus}" if job.gpu_type else f"gpu:{job.gpus}")
    if job.scratch_gres:
        gres.append(job.scratch_gres)
    cpus = job.cpus or max(1, job.cpus_per_gpu * max(job.gpus, 1))
    head = ["#!/bin/bash", f"#SBATCH --job-name={job.job_name}"]
    head += [f"#SBATCH --partition={job.partition}"] if job.partition else []
    head += [f"#SBATCH --account={job.account}"] if job.account else []
    head += [f"#SBATCH --nodes={job.nodes}", "#SBATCH --ntasks-per-node=1", f"#SBATCH --cpus-per-task={cpus}"]
    head += [f"#SBATCH --gres={','.join(gres)}"] if gres else []
    head += [f"#SBATCH --mem={job.mem}"] if job.mem else []
    head += [f"#SBATCH --time={job.time}", f"#SBATCH --output={job.output}", ""]
    body = [
        "# Generated by imgbuild: one task per node; on each, the container runs the launcher.",
        "set -euo pipefail",
    ]
    if job.nccl_debug:
        body += [f"export NCCL_DEBUG={job.nccl_debug}"]
    # Threads per process: all the task's CPUs for one process, the CPUs per GPU for each torchrun worker.
    # Set on the command itself (env ... inside the container), so it wins over an image's own ENV in
    # every runtime (Apptainer keeps the image's value over the host's).
    workers = max(job.gpus, 1) if job.uses_torchrun else 1
    threads = max(1, cpus // workers)
    if job.stage:
        body += [
            "",
            f"# Stage the data once per node to the node's fast local disk (${job.scratch_var}).",
            f'export {job.scratch_var}="${{{job.scratch_var}:-${{TMPDIR:-/tmp}}/$SLURM_JOB_ID}}"',
            f'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 mkdir -p "${job.scratch_var}"',
        ]
        for tar in job.stage:
            body += [
                f'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 tar xf {shlex.quote(tar)} -C "${job.scratch_var}"'
            ]
    srun_opts, prefix = _container_prefix(job)
    command = list(job.command)
    if job.uses_torchrun and job.nodes == 1:
        # One node: no rendezvous port at all (two jobs on one node would share a fixed one).
        command = ["torchrun", "--standalone", f"--nproc-per-node={max(job.gpus, 1)}", *command]
    elif job.uses_torchrun:
        body += [
            "",
            "# torchrun on every node; the rendezvous is the first node of the allocation, on a port of this",
            "# job's own (from its id), so two jobs sharing a node never join each other's store.",
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            'head_node=$(scontrol show node "$head_node" -o | grep -o "NodeAddr=[^ ]*" | cut -d= -f2 '
            '|| echo "$head_node")',
            f"rdzv_port=$(( {job.rdzv_port} + SLURM_JOB_ID % 10000 ))",
        ]
        command = [
            "torchrun",
            "--nnodes=$SLURM_NNODES",
            f"--nproc-per-node={max(job.gpus, 1)}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=$head_node:$rdzv_port",
            "--rdzv-id=$SLURM_JOB_ID",
            *command,
        ]
    command = ["env", f"OMP_NUM_THREADS={threads}", *command]
    body += ["", _words(["srun", *srun_opts, *prefix, *command])]
    return "\n".join(head + body) + "\n"


def site_slurm(site: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(site) - set(SLURM_DEFAULTS))
    if unknown:
        raise UsageError(f"config slurm: unknown setting {unknown[0]!r} (known: {', '.join(sorted(SLURM_DEFAULTS))})")
    merged = {**SLURM_DEFAULTS, **site}
    for key, kind in (("gpu_types", dict), ("gpus_per_node", dict), ("binds", list)):
        if not isinstance(merged[key] or kind(), kind):
            raise UsageError(f"config slurm.{key}: must be a {'mapping' if kind is dict else 'list'}")
    for bind in merged["binds"] or []:
        if not isinstance(bind, str) or not re.fullmatch(r"/[^:,\s]*(:/[^:,\s]*)?(:ro)?", bind):
            raise UsageError(f"config slurm.binds: {str(bind)[:80]!r} is not /HOST[:/CONTAINER][:ro]")
    if merged["mem_per_gpu"] is not None:
        slurm_mem(str(merged["mem_per_gpu"]), 1)  # a bad size is reported now, not as a traceback later
    return merged


_MEM_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)B?", re.IGNORECASE)


def slurm_mem(per_gpu: str, gpus: int) -> str:
    """`mem_per_gpu` times the GPUs, in Slurm's units (a bare number is MB, as Slurm reads it)."""
    match = _MEM_RE.fullmatch(per_gpu.strip())
    if not match:
        raise UsageError(f"config slurm.mem_per_gpu: {per_gpu[:40]!r} is not a Slurm memory size (e.g. 64G, 16000M)")
    amount, unit = float(match.group(1)), (match.group(2) or "M").upper()
    total = amount * max(gpus, 1)
    return f"{int(total) if total == int(total) else round(total, 2)}{unit}"


def sif_name(image: str) -> str:
    """The one name of an image's .sif: `lab/pytorch-research:24.05` -> `pytorch-research_24.05.sif`
    (what `export --apptainer` builds and what `slurm` runs)."""
    from imgbuild.imageref import parse

    ref = parse(image)
    return ref.path.rsplit("/", 1)[-1] + (f"_{ref.tag}" if ref.tag else "") + ".sif"


def sif_path(image: str, sif_dir: str | None) -> str:
    """`lab/pytorch-research:24.05` -> `<sif_dir>/pytorch-research_24.05.sif`; a .sif passes through."""
    if image.endswith(".sif"):
        return image
    return str(Path(sif_dir) / sif_name(image)) if sif_dir else sif_name(image)


def check_image_present(job: JobSpec) -> None:
    """Before a job is queued: the .sif it runs must exist (the job starts where sbatch is called)."""
    if job.runtime in ("apptainer", "singularity") and not Path(job.image).is_file():
        raise UsageError(
            f"{job.image}: no such image here; build it with `imgbuild export RECIPE --apptainer` and copy the "
            ".sif there (slurm.sif_dir), or name the .sif to run"
        )


@dataclass
class JobFlags:
    """`imgbuild slurm`'s flags; None means: the site's default."""

    command: list[str]
    image: str
    short_name: str
    gpus: int = 1
    nodes: int = 1
    gpu_type: str | None = None
    cpus_per_gpu: int | None = None
    cpus: int | None = None
    mem: str | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    job_name: str | None = None
    output: str = "%x-%j.out"
    stage: list[str] = field(default_factory=list)
    binds: list[str] = field(default_factory=list)
    runtime: str | None = None
    torchrun: bool | None = None
    nccl_debug: str | None = None


def job_from_flags(flags: JobFlags, site_config: dict[str, Any]) -> JobSpec:
    """The job: each flag, else the site's `slurm:` setting, else imgbuild's default."""
    site = site_slurm(site_config)
    runtime = flags.runtime or site["runtime"]
    per_gpu_mem = site["mem_per_gpu"]
    friendly = flags.gpu_type or site["gpu_type"]
    limit = (site["gpus_per_node"] or {}).get(friendly) if friendly else None
    if limit and flags.gpus > int(limit):
        nodes = -(-flags.gpus // int(limit))
        raise UsageError(
            f"--gpus {flags.gpus} --gpu-type {friendly}: a {friendly} node has {limit} GPUs; ask for "
            f"--nodes {nodes * flags.nodes} --gpus {-(-flags.gpus // nodes)} (GPUs are per node)"
        )
    return JobSpec(
        command=flags.command,
        image=sif_path(flags.image, site["sif_dir"]) if runtime in ("apptainer", "singularity") else flags.image,
        gpus=flags.gpus,
        nodes=flags.nodes,
        gpu_type=(site["gpu_types"] or {}).get(friendly, friendly) if friendly else None,
        cpus_per_gpu=flags.cpus_per_gpu or int(site["cpus_per_gpu"]),
        cpus=flags.cpus,
        mem=flags.mem or (slurm_mem(str(per_gpu_mem), flags.gpus) if per_gpu_mem else None),
        time=flags.time or site["time"],
        partition=flags.partition or site["partition"],
        account=flags.account or site["account"],
        job_name=flags.job_name or flags.short_name,
        output=flags.output,
        stage=flags.stage,
        scratch_var=site["scratch_var"],
        scratch_gres=site["scratch_gres"] if flags.stage else None,
        runtime=runtime,
        binds=[*(site["binds"] or []), *flags.binds],
        nccl_debug=flags.nccl_debug,
        rdzv_port=int(site["rdzv_port"]),
        torchrun=flags.torchrun,
    )


def submit_job(script: str, *, test_only: bool = False) -> str:
    """Hand the script to sbatch on standard input; the job id, or what --test-only says."""
    args = ["sbatch", *(["--test-only"] if test_only else ["--parsable"])]
    try:
        proc = subprocess.run(args, input=script, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise EnvironmentProblem("sbatch is not installed here: copy the script to a login node") from None
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem("sbatch did not answer within 60 s: is slurmctld up?") from None
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise JobFailed(f"sbatch refused the job: {text.splitlines()[-1] if text else proc.returncode}")
    return text if test_only else f"submitted job {proc.stdout.strip().split(';')[0]}"


@dataclass
class Exported:
    definition: str
    archive: str | None = None  # the docker save tar, for the docker-archive bootstrap
    context: Path | None = None  # the rendered context, for the native bootstrap
    sif: Path | None = None  # the built image, where apptainer is installed


def export_apptainer(plan: Plan, settings: Any, bootstrap: str, out: Path | None, engine: Any = None) -> Exported:
    """The Apptainer definition for `plan` (plus what its bootstrap needs: a saved archive, a context)."""
    from imgbuild.build import context_dir, render_into

    archive = None
    context = None
    if bootstrap == "docker-archive":
        if engine is None or engine.images.image(plan.target) is None:
            raise UsageError(f"{plan.target} is not built: run imgbuild build on its recipe first")
        archive = str((out or Path(sif_name(plan.target))).with_suffix(".tar"))
        engine.images.save(plan.target, Path(archive))
    if bootstrap == "native":
        context = render_into(plan, context_dir(plan, settings), "buildkit", settings)
    return Exported(apptainer_definition(plan, bootstrap, archive), archive, context)


def export_devcontainer(plan: Plan, out: Path | None) -> Path:
    """Write `OUT/devcontainer.json` (default `.devcontainer/`) for `plan`'s image with the site's run rules."""
    import json

    from imgbuild.config import site_section
    from imgbuild.devcontainer import devcontainer
    from imgbuild.run import house_rules

    folder = out or Path(".devcontainer")
    path = folder / "devcontainer.json"
    document = json.dumps(devcontainer(plan, house_rules(site_section("run"))), indent=2) + "\n"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(document)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write {path}: {exc.strerror}") from None
    return path


def apptainer_tool() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")


def build_sif(tool: str, definition: Path, cwd: Path | None) -> Path:
    """`apptainer build` the definition, then `apptainer test` it (the %test section runs the smoke test)."""
    sif = definition.with_suffix(".sif")
    steps = (
        [tool, "build", "--force", str(sif.resolve()), str(definition.resolve())],
        [tool, "test", str(sif.resolve())],
    )
    for args in steps:
        if subprocess.run(args, cwd=cwd).returncode != 0:
            raise JobFailed(f"{' '.join(args[:2])} failed for {definition}")
    return sif
