"""Clusters: export (Apptainer), slurm."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from imgbuild.cli.base import Section, settings_of
from imgbuild.config.slurmtime import MAX_SIGNAL_LEAD
from imgbuild.errors import UsageError

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.pipeline.plan import Plan

SECTION = Section("Clusters")


@SECTION.command()
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--apptainer", is_flag=True, help="Write an Apptainer definition file.")
@click.option(
    "--devcontainer", is_flag=True, help="Write .devcontainer/devcontainer.json for VS Code and the Dev Containers CLI."
)
@click.option(
    "--oci",
    "oci_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the built image as an OCI bundle in this new folder, for srun --container (slurm --runtime oci).",
)
@click.option(
    "--sqsh",
    "sqsh_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the built image as an enroot squashfs image (pyxis: --container-image=FILE).",
)
@click.option(
    "--bind",
    "binds",
    multiple=True,
    help="--oci: a folder jobs see (SRC[:DEST][:ro]), besides slurm.binds and /tmp; the job's folder must be in one.",
)
@click.option(
    "--from",
    "bootstrap",
    type=click.Choice(["docker-daemon", "docker-archive", "native"]),
    default="docker-daemon",
    show_default=True,
    help="Apptainer: bootstrap from the built image (daemon, or a docker save archive) or render natively.",
)
@click.option(
    "-o", "--out", type=click.Path(path_type=Path), help="Definition file (Apptainer) or folder (dev container)."
)
@click.option(
    "--gpus",
    "gpus",
    help="Dev container on a shared server: the GPUs, as `imgbuild run --gpus` takes them (N, 0,3, none).",
)
@click.option(
    "--build/--no-build",
    default=True,
    show_default=True,
    help="Build the .sif and run its %test when apptainer is installed.",
)
@click.pass_context
def export(
    ctx: click.Context,
    recipe: Path,
    apptainer: bool,
    devcontainer: bool,
    oci_dir: Path | None,
    sqsh_file: Path | None,
    binds: tuple[str, ...],
    bootstrap: str,
    out: Path | None,
    gpus: str | None,
    build: bool,
) -> None:
    """Export a recipe: an Apptainer definition for clusters (and the .sif where apptainer exists), an OCI
    bundle for Slurm's srun --container, or a dev container for VS Code."""
    from imgbuild.pipeline.resolve import plan_recipe
    from imgbuild.recipe import load_recipe

    if [apptainer, devcontainer, oci_dir is not None, sqsh_file is not None].count(True) != 1:
        raise UsageError("export: give one of --apptainer, --devcontainer, --oci DIR or --sqsh FILE")
    settings = settings_of(ctx)
    loaded = load_recipe(recipe, secrets=settings.secrets())
    if gpus is not None and not devcontainer:
        raise UsageError("export: --gpus is for --devcontainer")
    if binds and oci_dir is None:
        raise UsageError("export: --bind is for --oci (Apptainer binds at run time: slurm --bind)")
    if oci_dir is not None or sqsh_file is not None:
        _export_oci(plan_recipe(loaded, settings, offline=True).target, oci_dir, sqsh_file, list(binds), settings)
    elif devcontainer:
        _export_devcontainer(plan_recipe(loaded, settings, offline=True), recipe, settings, out, gpus)
    else:
        to_stdout = out is not None and str(out) == "-"
        if to_stdout and bootstrap == "docker-archive":
            raise UsageError("-o -: the docker-archive bootstrap writes a tar beside the definition; name a file")
        plan = plan_recipe(loaded, settings, offline=bootstrap != "native")
        _export_apptainer(plan, settings, bootstrap, None if to_stdout else out, to_stdout, build)


def _export_apptainer(
    plan: Plan, settings: Settings, bootstrap: str, out: Path | None, to_stdout: bool, build: bool
) -> None:
    from imgbuild.clusters.apptainer import export_definition
    from imgbuild.ui import say

    done = export_definition(plan, settings, bootstrap, out, to_stdout=to_stdout, build=build, say=say)
    if done.path is None:
        click.echo(done.exported.definition, nl=False)
        return
    click.echo(str(done.path))
    if done.sif:
        click.echo(str(done.sif))


def _export_oci(target: str, folder: Path | None, sqsh: Path | None, binds: list[str], settings: Settings) -> None:
    from imgbuild.clusters.oci import export_bundle, export_sqsh
    from imgbuild.config.site import BIND_RE
    from imgbuild.engine import connect_engine
    from imgbuild.text import unsafe_character

    for bind in binds:
        if unsafe_character(bind) or not BIND_RE.fullmatch(bind):
            raise UsageError(f"--bind {bind[:80]!r}: not /HOST[:/CONTAINER][:ro]")

    def say(line: str) -> None:
        from imgbuild import ui

        ui.say(f"export: {line}")

    engine = connect_engine(settings)
    if sqsh is not None:
        if binds:
            raise UsageError("export: --bind is for --oci (pyxis mounts at run time: slurm --bind)")
        click.echo(str(export_sqsh(target, sqsh, engine, settings.build_timeout, say)))
        return
    assert folder is not None
    all_binds = [*settings.slurm.binds, *binds]
    click.echo(str(export_bundle(target, folder, all_binds, engine, settings.build_timeout, say)))


@SECTION.command()
@click.argument("image")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--gpus", type=click.IntRange(min=0), default=1, show_default=True, help="GPUs per node.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes.")
@click.option("--gpu-type", help="GRES type (e.g. v100, a100), or a site alias from slurm.gpu_types.")
@click.option("--cpus-per-gpu", type=click.IntRange(min=1), help="CPUs per GPU (site default, else 10).")
@click.option("--cpus", type=click.IntRange(min=1), help="CPUs per task, instead of a share per GPU.")
@click.option("--mem", help="Memory per node (e.g. 64G).")
@click.option("--time", "walltime", help="Time limit (e.g. 1:00:00).")
@click.option("--partition", help="Partition (site default).")
@click.option("--account", help="Account/project (site default).")
@click.option("--qos", help="Quality of service (site default).")
@click.option("--constraint", help="Node features, Slurm's syntax: a100&ib (site default).")
@click.option("--job-name", help="Job name (default: the image name).")
@click.option("--output", "job_output", default="%x-%j.out", show_default=True, help="Slurm output file.")
@click.option(
    "--stage",
    multiple=True,
    metavar="TAR|DIR",
    help="Dataset tar (or folder, packed once) to extract to node-local scratch.",
)
@click.option("--bind", "binds", multiple=True, help="Extra mount (SRC:DEST) into the container.")
@click.option(
    "--runtime",
    type=click.Choice(["apptainer", "singularity", "pyxis", "docker", "oci", "edf", "podman-hpc", "shifter"]),
    help="Container runtime on the nodes (site default apptainer).",
)
@click.option("--torchrun/--no-torchrun", default=None, help="Launch with torchrun (default: more than one GPU).")
@click.option("--nccl-debug", type=click.Choice(["WARN", "INFO", "TRACE"]), help="Set NCCL_DEBUG.")
@click.option("--task-per-gpu", is_flag=True, help="One task per GPU, each seeing only its GPU (MPI, Horovod).")
@click.option(
    "--max-restarts", type=click.IntRange(min=0), default=0, help="torchrun restarts failed workers this often."
)
@click.option("--requeue", is_flag=True, help="Before the time limit: SIGTERM the step, then requeue the job.")
@click.option(
    "--signal-lead",
    type=click.IntRange(min=10, max=MAX_SIGNAL_LEAD),
    default=300,
    show_default=True,
    help="With --requeue: seconds before the time limit the step is stopped.",
)
@click.option(
    "--snapshot-dir", help="Persistent folder for snapshots, as $SNAPSHOT_DIR (--requeue: submit dir/snapshots)."
)
@click.option("--usage/--no-usage", default=True, show_default=True, help="Sample GPU use; summarise it at the end.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the script here.")
@click.option("--submit", is_flag=True, help="Submit with sbatch and print the job id.")
@click.option("--test-only", is_flag=True, help="Ask sbatch --test-only whether it would schedule the job.")
@click.pass_context
def slurm(
    ctx: click.Context,
    image: str,
    command: tuple[str, ...],
    gpus: int,
    nodes: int,
    gpu_type: str | None,
    cpus_per_gpu: int | None,
    cpus: int | None,
    mem: str | None,
    walltime: str | None,
    partition: str | None,
    account: str | None,
    qos: str | None,
    constraint: str | None,
    job_name: str | None,
    job_output: str,
    stage: tuple[str, ...],
    binds: tuple[str, ...],
    runtime: str | None,
    torchrun: bool | None,
    nccl_debug: str | None,
    task_per_gpu: bool,
    max_restarts: int,
    requeue: bool,
    signal_lead: int,
    snapshot_dir: str | None,
    usage: bool,
    out: Path | None,
    submit: bool,
    test_only: bool,
) -> None:
    """Write (and --submit) an sbatch script running COMMAND in IMAGE or a RECIPE's image: imgbuild slurm IMG -- CMD"""
    from imgbuild.clusters.jobs import (
        JobFlags,
        check_image_present,
        image_facts,
        job_from_flags,
        stage_datasets,
        submit_job,
    )
    from imgbuild.clusters.slurm import sbatch_script
    from imgbuild.engine import connect_engine
    from imgbuild.servers.spec import is_recipe, resolve_image

    settings = settings_of(ctx)
    ref, short = resolve_image(image, settings, paths=True)
    # the EDF's NCCL plugin must match the image's CUDA: read from the image itself for that runtime only
    edf = (runtime or settings.slurm.runtime) == "edf"
    facts = image_facts(image, settings, read_image=edf, engine_of=lambda: connect_engine(settings))
    tars, packed = stage_datasets(stage, settings.slurm)
    job = job_from_flags(
        JobFlags(
            command=list(command),
            image=ref,
            short_name=short,
            gpus=gpus,
            nodes=nodes,
            gpu_type=gpu_type,
            cpus_per_gpu=cpus_per_gpu,
            cpus=cpus,
            mem=mem,
            time=walltime,
            partition=partition,
            account=account,
            qos=qos,
            constraint=constraint,
            job_name=job_name,
            output=job_output,
            stage=tars,
            binds=list(binds),
            runtime=runtime,
            torchrun=torchrun,
            nccl_debug=nccl_debug,
            task_per_gpu=task_per_gpu,
            max_restarts=max_restarts,
            requeue=requeue,
            signal_lead=signal_lead,
            snapshot_dir=snapshot_dir,
            usage=usage,
            local_image=is_recipe(image),
            framework=facts.framework,
            cuda_major=facts.cuda_major,
        ),
        settings.slurm,
        settings.run.gpu_flag,
    )
    for tar, made in packed:
        folder = tar.name.rsplit("-", 1)[0]
        click.echo(f"{'packed' if made else 'reusing'} {tar}: the job sees it as ${job.scratch_var}/{folder}", err=True)
    script = sbatch_script(job)
    if out:
        from imgbuild.hostio.regular import write_atomic

        write_atomic(out, script)
        click.echo(f"wrote {out}", err=True)
    elif not (submit or test_only):
        click.echo(script, nl=False)
    if submit:
        check_image_present(job)  # fail now, not when the job starts after hours in the queue
    if submit or test_only:
        click.echo(submit_job(script, test_only=test_only))


def _export_devcontainer(plan: Plan, recipe: Path, settings: Settings, out: Path | None, gpus: str | None) -> None:
    from imgbuild.clusters.devcontainer import export_devcontainer
    from imgbuild.engine import connect_engine

    path, notes = export_devcontainer(plan, recipe, settings, out, gpus, lambda: connect_engine(settings))
    for note in notes:
        click.echo(f"note: {note}", err=True)
    click.echo(str(path))


@SECTION.command()
@click.argument("image")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--gpus", type=click.IntRange(min=0), default=1, show_default=True, help="GPUs per node.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes (pods).")
@click.option("--cpus", type=click.IntRange(min=1), help="CPUs per node (default: k8s.cpus_per_gpu per GPU).")
@click.option("--mem", help="Memory per node, a quantity (e.g. 64Gi; default: k8s.mem_per_gpu per GPU).")
@click.option("--name", help="The object's name (default: generateName from the image's name, for kubectl create).")
@click.option("--torchrun/--no-torchrun", default=None, help="One node: launch with torchrun (default: >1 GPU).")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the manifest here.")
@click.pass_context
def k8s(
    ctx: click.Context,
    image: str,
    command: tuple[str, ...],
    gpus: int,
    nodes: int,
    cpus: int | None,
    mem: str | None,
    name: str | None,
    torchrun: bool | None,
    out: Path | None,
) -> None:
    """Write a Kubernetes manifest running COMMAND in IMAGE or a RECIPE's pushed image: a Kubeflow Trainer
    TrainJob across nodes (torchrun), else a Job of one pod. Checked offline against the published schemas;
    apply it with kubectl create -f. imgbuild k8s IMG -- CMD"""
    import yaml

    from imgbuild.clusters import k8s as k8smod
    from imgbuild.clusters.jobs import image_facts
    from imgbuild.config.site import QUANTITY_RE
    from imgbuild.engine import connect_engine
    from imgbuild.servers.spec import resolve_image

    settings = settings_of(ctx)
    if mem is not None and not QUANTITY_RE.fullmatch(mem):
        raise UsageError(f"--mem {mem[:40]!r}: not a Kubernetes quantity such as 64Gi")
    pinned = k8smod.pinned_image(image, settings, lambda: connect_engine(settings))
    uid, gid = settings.caller.uid, settings.caller.gid
    job = k8smod.K8sJob(
        image=pinned,
        command=list(command),
        name=name or k8smod.default_name(resolve_image(image, settings)[1]),
        uid=uid,
        gid=gid,
        gpus=gpus,
        nodes=nodes,
        cpus=cpus,
        mem=mem,
        torchrun=torchrun,
        generate=name is None,
        site=settings.k8s,
        framework=image_facts(image, settings, read_image=False, engine_of=lambda: connect_engine(settings)).framework,
    )
    text = yaml.safe_dump(k8smod.manifest(job), sort_keys=False)
    for note in k8smod.notes(job):
        click.echo(f"note: {note}", err=True)
    if out:
        from imgbuild.hostio.regular import write_atomic

        write_atomic(out, text)
        click.echo(str(out))
    else:
        click.echo(text, nl=False)
