"""From `imgbuild slurm` flags and the site's `slurm:` section to a JobSpec: the image's file for the runtime,
header values checked, memory per GPU, a dataset packed for node-local staging, and the submission (sbatch)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.clusters.apptainer import sif_name, sif_path
from imgbuild.clusters.slurm import JobSpec
from imgbuild.config.site import ACCOUNT_RE
from imgbuild.config.slurmtime import SLURM_TIME_RE, slurm_minutes
from imgbuild.errors import EnvironmentProblem, JobFailed, UsageError
from imgbuild.hostio.tree import TooDeep, walk
from imgbuild.imageref import FILE_RUNTIMES, IMAGE_FILES, file_kind, is_file_path
from imgbuild.shellwords import UserWord

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.config.site import SlurmSite


_MEM_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)B?", re.IGNORECASE)


def slurm_mem(per_gpu: str, gpus: int) -> str:
    """`mem_per_gpu` times the GPUs, in Slurm's units (a bare number is MB, as Slurm reads it)."""
    match = _MEM_RE.fullmatch(per_gpu.strip())
    if not match:
        raise UsageError(f"config slurm.mem_per_gpu: {per_gpu[:40]!r} is not a Slurm memory size (e.g. 64G, 16000M)")
    amount, unit = float(match.group(1)), (match.group(2) or "M").upper()
    total = amount * max(gpus, 1)
    if total != int(total):  # Slurm reads whole numbers only (strtoll): 7.5G x 3 is 23040M, never 22.5G
        total, unit = total * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit], "M"
        return f"{int(total + 0.999999)}M"
    return f"{int(total)}{unit}"


def image_file(image: str, sif_dir: str | None, ending: str) -> str:
    """`lab/pytorch-research:24.05` -> `<sif_dir>/pytorch-research_24.05<ending>` (absolute: the job finds it from
    any folder), the one name `export` writes for a runtime that runs a file (`.oci` bundles, `.sqsh` for pyxis);
    a path, or an image file's name (IMAGE_FILES), passes."""
    if image.startswith("$"):  # under a variable the job's shell expands (the site's folder)
        return image
    if is_file_path(image) or file_kind(image):
        return str(Path(image).expanduser().absolute())
    return str((Path(sif_dir) if sif_dir else Path.cwd()) / (sif_name(image).removesuffix(".sif") + ending))


def check_image_present(job: JobSpec) -> None:
    """Before a job is queued: the .sif or bundle it runs must exist (the job starts where sbatch is called; a
    folder under a variable, as this shell expands it)."""
    import os

    image = os.path.expandvars(job.image)
    if job.runtime in ("apptainer", "singularity") and not Path(image).is_file():
        raise UsageError(
            f"{job.image}: no such image here; build it with `imgbuild export RECIPE --apptainer` and copy the "
            ".sif there (slurm.sif_dir), or name the .sif to run"
        )
    if job.runtime in ("pyxis", "edf") and file_kind(image) and not Path(image).is_file():
        raise UsageError(
            f"{job.image}: no such image here; write it with `imgbuild export RECIPE --sqsh {job.image}` where the "
            "nodes see it (slurm.sif_dir), or push the image to a registry the nodes reach"
        )
    if job.runtime == "oci" and not (Path(image) / "config.json").is_file():
        raise UsageError(
            f"{job.image}: no OCI bundle here; write it with `imgbuild export RECIPE --oci DIR` "
            "where the nodes see it (slurm.sif_dir), or name the bundle to run"
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
    task_per_gpu: bool = False
    max_restarts: int = 0
    requeue: bool = False
    signal_lead: int = 300
    snapshot_dir: str | None = None
    usage: bool = True
    local_image: bool = False  # the image is a recipe's, built here (docker runtime: never pulled)
    framework: str = ""  # the image's framework (image_facts): decides the launcher
    cuda_major: str = ""  # the image's CUDA major (image_facts, where read): the EDF's NCCL plugin variant
    qos: str | None = None
    constraint: str | None = None


#: A snapshot folder: an absolute path or one under a job variable ($SLURM_SUBMIT_DIR/...), no spaces,
#: quotes or colons (it becomes a bind SRC:DEST).
_SNAPSHOT_RE = re.compile(r"(?:/|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?)[\w@%+=.,/-]*")


def _snapshot_dir(flags: JobFlags, scratch_var: str) -> str | None:
    wanted = flags.snapshot_dir or ("$SLURM_SUBMIT_DIR/snapshots" if flags.requeue else None)
    if wanted is None:
        return None
    if not _SNAPSHOT_RE.fullmatch(wanted):
        raise UsageError(f"--snapshot-dir: {wanted[:80]!r} is not an absolute path or $VAR/path (no spaces or colons)")
    local = (f"${scratch_var}", f"${{{scratch_var}}}", "$TMPDIR", "${TMPDIR}", "/tmp", "/dev/shm", "/var/tmp")
    if any(wanted == root or wanted.startswith(root + "/") for root in local):
        raise UsageError(
            f"--snapshot-dir {wanted}: node-local disk is wiped when the job ends or is requeued; use "
            "persistent storage (default $SLURM_SUBMIT_DIR/snapshots)"
        )
    return wanted


#: What an `#SBATCH` value may hold (each is one line of the script: a newline would end the header and run).
_HEADER_VALUES = {
    "job_name": (re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}"), "letters, digits, _ . + -"),
    "time": (SLURM_TIME_RE, "e.g. 01:00:00, 2-00:00:00"),
    "mem": (re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,3})?[KMGT]?", re.IGNORECASE), "e.g. 64G, 16000M"),
    "output": (re.compile(r"[A-Za-z0-9_.%/+=@-]{1,1024}"), "a path pattern such as %x-%j.out"),
    "partition": (re.compile(r"[A-Za-z0-9_.,-]{1,128}"), "a partition name"),
    "qos": (re.compile(r"[A-Za-z0-9_.-]{1,128}"), "a QOS name"),
    "constraint": (re.compile(r"[A-Za-z0-9_.:*&|!\[\]()-]{1,256}"), "node features such as a100&ib"),
    "account": (ACCOUNT_RE, "an account name (Jean Zay: abc@v100)"),
    "gpu_type": (re.compile(r"[A-Za-z0-9_.-]{1,64}"), "a GPU type"),
}


def _check_header_values(flags: JobFlags) -> None:
    """Flags that become `#SBATCH` lines: whole-string patterns, ASCII only (exit 2, never a script that runs
    what the header smuggled)."""
    for name, (pattern, example) in _HEADER_VALUES.items():
        value = getattr(flags, name)
        if value is not None and not pattern.fullmatch(str(value)):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag}: {str(value)[:40]!r} is not valid here ({example})")


def check_image_kind(runtime: str, image: str) -> None:
    """An image file the runtime cannot run (a .sif to pyxis, a .sqsh to Apptainer, any file to docker): refused
    with the file or image the runtime takes."""
    kind = file_kind(image)
    if kind is None and not (is_file_path(image) and runtime not in FILE_RUNTIMES):
        return
    runtimes, what, _ = IMAGE_FILES[kind] if kind else ((), "a file", "")
    if runtime not in runtimes:
        takes = [f"{ending[0]} ({export})" for ending, (names, _, export) in IMAGE_FILES.items() if runtime in names]
        wanted = f"a {takes[0]} file written by imgbuild export RECIPE" if takes else "an image name from a registry"
        raise UsageError(f"{image}: {what}, which --runtime {runtime} does not run; give it {wanted}")


def _image_for(runtime: str, image: str, sif_dir: str | None, local: bool = False) -> str:
    """What the runtime runs: a .sif, an OCI bundle, or for pyxis a recipe's image as the .sqsh `export --sqsh`
    writes (a name with no registry exists only in this machine's engine, which no node reads; N21)."""
    from imgbuild.imageref import parse

    check_image_kind(runtime, image)
    if runtime in ("apptainer", "singularity"):
        return sif_path(image, sif_dir)
    if runtime == "shifter" and local and not parse(image).host:
        raise UsageError(
            f"{image}: built on this machine only; Shifter's image gateway would look it up on Docker Hub. Push it "
            "(imgbuild build --push, with image_registry set) and run the pushed name"
        )
    if runtime in ("pyxis", "edf") and (file_kind(image) or (local and not parse(image).host)):
        return image_file(image, sif_dir, ".sqsh")
    return image_file(image, sif_dir, ".oci") if runtime == "oci" else image


def whole_mem(text: str) -> str:
    """sbatch takes whole numbers only: `7.5G` -> `7680M`; a whole one as written (checked before)."""
    match = re.fullmatch(r"([0-9]+)\.([0-9]+)([KMGT]?)", text, re.IGNORECASE)
    if not match:
        return text
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(3).upper()]
    return f"{max(1, int(float(match.group(1) + '.' + match.group(2)) * scale))}M"


@dataclass(frozen=True)
class ImageFacts:
    """What decides how an image's job is launched and hooked: its framework (pytorch, tensorflow, jax; "" unknown)
    and its CUDA major ("" unknown)."""

    framework: str = ""
    cuda_major: str = ""


def framework_by_name(image: str, settings: Settings) -> str:
    """The framework a recipe's base names, else an NGC repository's name (nvidia/pytorch, nvidia/tensorflow,
    nvidia/jax); "" where the name does not say."""
    from imgbuild.ngc import FRAMEWORKS
    from imgbuild.servers.spec import is_recipe

    if is_recipe(image):
        from imgbuild.recipe import load_recipe

        base = load_recipe(image, secrets=settings.secrets()).recipe.base
        if base.framework:
            return str(base.framework)
        image = base.image or ""
    path = image.split("@")[0].rsplit(":", 1)[0] if "/" in image else image
    for name, framework in FRAMEWORKS.items():
        if path.endswith("/" + framework.repository) or path == framework.repository:
            return name
    return "jax" if path.rsplit("/", 1)[-1] == "jax" else ""


def facts_of_config(config: dict[str, Any]) -> ImageFacts:
    """An image config's own word: imgbuild's base-framework label, else the framework its Env names (NGC's
    PYTORCH_VERSION, TENSORFLOW_VERSION, ...); the CUDA major of its CUDA_VERSION."""
    from imgbuild.facts import Label
    from imgbuild.ngc import config_env, cuda_major, describe_config

    block = config.get("config") or config.get("Config") or config
    labels = block.get("Labels") if isinstance(block, dict) else None
    label = str((labels or {}).get(Label.BASE_FRAMEWORK, "")) if isinstance(labels, dict) else ""
    framework = label if label in ("pytorch", "tensorflow", "jax") else describe_config(config)["framework"]
    return ImageFacts(framework, cuda_major(config_env(config)) or "")


#: How long a job's writing waits for a registry to say what an image is (then: by its name alone).
IMAGE_FACTS_SECONDS = 20


def image_facts(
    image: str, settings: Settings, *, read_image: bool, engine_of: Callable[[], Any] | None = None
) -> ImageFacts:
    """The image's facts: by its name where that says the framework and nothing more is needed (`read_image`
    False); else from the image's own config, this machine's engine first, then its registry (a name without one
    is never looked up on Docker Hub); by name alone where neither answers."""
    from imgbuild.errors import ImgbuildError
    from imgbuild.imageref import BadReference, parse
    from imgbuild.servers.spec import resolve_image

    by_name = framework_by_name(image, settings)
    if by_name and not read_image:
        return ImageFacts(by_name)
    try:
        ref, _ = resolve_image(image, settings)
        parsed = parse(ref)
    except (ImgbuildError, BadReference):
        return ImageFacts(by_name)
    config: dict[str, Any] | None = None
    try:
        info = engine_of().images.image(ref) if engine_of else None
        if info is not None:
            config = {"config": info.config}
        elif parsed.host:
            from imgbuild.registry.client import RegistryClient

            client = RegistryClient.for_host(parsed.host, settings, command_seconds=IMAGE_FACTS_SECONDS)
            config = client.image_config(parsed.repository, parsed.reference)[1]
    except (ImgbuildError, OSError):
        config = None
    if config is None:
        return ImageFacts(by_name)
    found = facts_of_config(config)
    return ImageFacts(by_name or found.framework, found.cuda_major)


def job_from_flags(flags: JobFlags, site: SlurmSite, docker_gpu_flag: str = "gpus") -> JobSpec:
    """The job: each flag, else the site's `slurm:` setting, else imgbuild's default. `docker_gpu_flag`:
    how the site's engines take GPUs (the `run.gpu_flag` house rule), for the docker runtime."""
    runtime = flags.runtime or site.runtime
    if flags.task_per_gpu and flags.torchrun:
        raise UsageError("--task-per-gpu starts one task per GPU itself (MPI, Horovod): it does not take --torchrun")
    if runtime == "oci" and flags.binds:
        raise UsageError(
            "--bind: an OCI bundle's folders are fixed when it is written: imgbuild export RECIPE --oci DIR --bind ..."
        )
    if flags.max_restarts and (flags.task_per_gpu or flags.torchrun is False):
        raise UsageError("--max-restarts: torchrun restarts the workers; this job does not use torchrun")
    _check_header_values(flags)
    per_gpu_mem = site.mem_per_gpu
    friendly = flags.gpu_type or site.gpu_type
    known = site.gpu_types
    if flags.gpu_type and known and flags.gpu_type not in known and flags.gpu_type not in known.values():
        raise UsageError(f"--gpu-type {flags.gpu_type}: this site has {', '.join(sorted(known))} (slurm.gpu_types)")
    if flags.requeue:
        limit = slurm_minutes(flags.time or site.time)
        if limit is not None and limit * 60 <= flags.signal_lead:
            raise UsageError(
                f"--requeue: the time limit ({flags.time or site.time}) is no longer than the signal lead "
                f"({flags.signal_lead} s): the job would be requeued before doing any work"
            )
    limit = site.gpus_per_node.get(friendly) if friendly else None
    if limit and flags.gpus > int(limit):
        nodes = -(-flags.gpus // int(limit))
        raise UsageError(
            f"--gpus {flags.gpus} --gpu-type {friendly}: a {friendly} node has {limit} GPUs; ask for "
            f"--nodes {nodes * flags.nodes} --gpus {-(-flags.gpus // nodes)} (GPUs are per node)"
        )
    return JobSpec(
        command=[UserWord(word) for word in flags.command],
        image=_image_for(runtime, flags.image, site.sif_dir, flags.local_image),
        gpus=flags.gpus,
        nodes=flags.nodes,
        gpu_type=site.gpu_types.get(friendly, friendly) if friendly else None,
        cpus_per_gpu=flags.cpus_per_gpu or site.cpus_per_gpu,
        cpus=flags.cpus,
        mem=whole_mem(flags.mem) if flags.mem else (slurm_mem(str(per_gpu_mem), flags.gpus) if per_gpu_mem else None),
        time=flags.time or site.time,
        # a job without GPUs does not hold a GPU node's CPUs where the site has a partition for it
        partition=flags.partition or (flags.gpus == 0 and site.cpu_partition) or site.partition,
        account=flags.account or site.account,
        job_name=flags.job_name or flags.short_name,
        output=flags.output,
        stage=flags.stage,
        scratch_var=site.scratch_var,
        scratch_gres=site.scratch_gres if flags.stage else None,
        runtime=runtime,
        binds=[*site.binds, *(UserWord(b) for b in flags.binds)],
        nccl_debug=flags.nccl_debug,
        rdzv_port=site.rdzv_port,
        rdzv_host_suffix=site.rdzv_host_suffix,
        socket_ifname=site.socket_ifname,
        torchrun=True if flags.max_restarts and flags.torchrun is None else flags.torchrun,
        task_per_gpu=flags.task_per_gpu,
        docker_gpu_flag=docker_gpu_flag,
        local_image=flags.local_image,
        max_restarts=flags.max_restarts,
        requeue=flags.requeue,
        signal_lead=flags.signal_lead,
        snapshot_dir=_snapshot_dir(flags, site.scratch_var),
        usage=flags.usage,
        framework=flags.framework,
        cuda_major=flags.cuda_major,
        qos=flags.qos or site.qos,
        constraint=flags.constraint or site.constraint,
        sbatch_lines=list(site.sbatch_lines),
        pass_env=list(site.pass_env),
        mpi=site.mpi,
        edf_annotations=dict(site.edf_annotations),
        shifter_modules=list(site.shifter_modules),
    )


def _dataset_entries(folder: Path) -> tuple[list[Path], str]:
    """Every data entry under `folder` (links, files, folders; not sockets, FIFOs or devices), in walk order,
    and the digest of their paths, sizes, modification times and modes."""
    import hashlib

    digest = hashlib.sha256()
    entries: list[Path] = []
    try:
        tree = list(walk(folder))
    except TooDeep as exc:
        raise UsageError(f"--stage {exc}") from None
    for root, dirs, files in tree:
        for name in dirs + files:
            path = Path(root) / name
            info = path.lstat()
            if not (path.is_symlink() or path.is_file() or path.is_dir()):
                continue  # sockets, fifos, devices: not data
            entries.append(path)
            rel = path.relative_to(folder).as_posix()
            digest.update(f"{rel}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_mode}\n".encode())
    return entries, digest.hexdigest()


def pack_dataset(folder: Path, into: Path) -> tuple[Path, bool]:
    """`folder` as one tar in `into` (for `--stage`), made once: (the tar, whether it was made now).

    The tar's name carries a digest of every entry's path, size, modification time and mode, so an
    unchanged folder reuses its tar and a changed one gets a new one (the older tar of the same folder is
    removed). Entries sit under the folder's own name: `--stage data/` appears as `$LOCAL_SCRATCH/data`."""
    import tarfile

    from imgbuild.hostio.regular import whole_file

    folder = folder.resolve()
    if not folder.is_dir():
        raise UsageError(f"--stage {folder}: not a folder or a tar")
    entries, digest = _dataset_entries(folder)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", folder.name) or "data"
    target = into / f"{stem}-{digest[:16]}.tar"
    if target.is_file():
        return target, False
    try:
        into.mkdir(parents=True, exist_ok=True)
        with whole_file(target) as handle, tarfile.open(fileobj=handle, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(folder, arcname=stem, recursive=False)
            for path in entries:
                tar.add(path, arcname=f"{stem}/{path.relative_to(folder).as_posix()}", recursive=False)
        for old in into.glob(f"{stem}-" + "[0-9a-f]" * 16 + ".tar"):
            if old != target:
                old.unlink(missing_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(f"--stage {folder}: cannot write {target}: {exc.strerror}") from None
    return target, True


def stage_dir(site: SlurmSite) -> Path:
    configured = site.stage_dir
    return Path(configured) if configured else Path.cwd() / ".imgbuild-stage"


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


def stage_datasets(items: tuple[str, ...] | list[str], site: SlurmSite) -> tuple[list[str], list[tuple[Path, bool]]]:
    """`--stage` items as the job stages them: a tar as it is, a folder packed once into the site's stage folder.
    (the tars, [(a packed tar, whether it was made now rather than reused)])."""
    tars: list[str] = []
    packed: list[tuple[Path, bool]] = []
    for item in items:
        if Path(item).is_dir():
            tar, made = pack_dataset(Path(item), stage_dir(site))
            packed.append((tar, made))
            tars.append(str(tar))
        else:
            tars.append(item)
    return tars, packed
