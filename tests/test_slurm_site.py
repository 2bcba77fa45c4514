"""Jobs on a Slurm configured like a GPU site (tests/testbed/slurm-up: cons_tres with core and memory
tracking, task/affinity,task/cgroup with ConstrainCores, proctrack/cgroup, typed GRES, an epilog): what a
job really gets, asserted from inside it: the ranks torchrun starts for the command as typed, on one node
and on two, the CPUs each container may use, and no container left once the job has gone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from imgbuild.engine.noderun import SLURM_EPILOG
from tests import ngc_facts
from tests.conftest import ROOT, run_cli
from tests.support import wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slurm]

#: The user's script, as they would write it for one GPU or many: torch.distributed where torchrun started
#: it, plain otherwise; gloo on CPUs (the bed has no GPU). Every rank says what it got.
TRAIN = """\
import os
import torch
import torch.distributed as dist

if "RANK" in os.environ:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.ones(1)
    dist.all_reduce(total)
else:
    rank, world, total = 0, 1, torch.ones(1)
print(
    f"rank {rank} of {world} node {os.environ.get('GROUP_RANK', '-')} job {os.environ['SLURM_JOB_ID']} "
    f"cpus {len(os.sched_getaffinity(0))} threads {os.environ['OMP_NUM_THREADS']} sum {total.item():g} "
    f"port {os.environ.get('MASTER_PORT', '-')}",
    flush=True,
)
if "RANK" in os.environ:
    dist.destroy_process_group()
"""


def submit(tmp_path: Path, image: str, *flags: str, command: tuple[str, ...] = ("python3", "train.py")) -> str:
    res = run_cli(
        "slurm", image, "--runtime", "docker", *flags, "--output", str(tmp_path / "out-%j.txt"), "--submit",
        "--", *command, cwd=tmp_path,
    )  # fmt: skip
    assert res.code == 0, res.err
    return res.out.split()[-1]


def ended(job: str, conf: str, output: Path, timeout: float = 300) -> tuple[str, str]:
    """The job's last state and its output; a job still running at the timeout is cancelled, never left holding the
    bed's nodes for the next test."""
    try:
        state = wait_for(job, conf, timeout)
    finally:
        subprocess.run(["scancel", job], capture_output=True, env={**os.environ, "SLURM_CONF": conf})
    return state, output.read_text()


def ranks(output: str) -> list[str]:
    """Each rank's report (two ranks' writes to the job's output may land on one line)."""
    found = re.findall(
        r"rank [0-9]+ of [0-9]+ node \S+ job [0-9]+ cpus [0-9]+ threads [0-9]+ sum [0-9]+ port [0-9-]+", output
    )
    return sorted(re.sub(r" job [0-9]+| port [0-9-]+", "", report) for report in found)


def ports(output: str) -> set[str]:
    """The rendezvous ports the ranks were given."""
    return set(re.findall(r"rank [0-9]+ of [0-9]+ node .*? port ([0-9-]+)", output))


@pytest.fixture
def gpu_site(slurm, testbed, tmp_path, monkeypatch):  # noqa: F811
    """The bed's Slurm with its fake V100s; the engine has no GPU runtime, so GPUs go by variable."""
    monkeypatch.setenv("SLURM_CONF", slurm)
    config = tmp_path / "config.yaml"
    config.write_text("run: {gpu_flag: env}\n")
    monkeypatch.setenv("IMGBUILD_CONFIG", str(config))
    (tmp_path / "train.py").write_text(TRAIN)
    return f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"


def test_the_bed_is_configured_like_a_gpu_site(slurm):  # noqa: F811
    conf = Path(slurm).read_text()
    for line in (
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "TaskPlugin=task/affinity,task/cgroup",
        "ProctrackType=proctrack/cgroup",
        "GresTypes=gpu",
    ):
        assert line in conf.splitlines()
    cgroup = (Path(slurm).parent / "cgroup.conf").read_text().splitlines()
    assert "ConstrainCores=yes" in cgroup and "ConstrainRAMSpace=yes" in cgroup
    # the epilog a site adds for docker jobs is the one docs/slurm-sites.md gives
    assert SLURM_EPILOG in (Path(slurm).parent / "epilog.sh").read_text()
    assert SLURM_EPILOG in (ROOT / "docs" / "slurm-sites.md").read_text()


def test_python3_train_py_as_typed_runs_under_torchrun_on_two_nodes(gpu_site, slurm, tmp_path):  # noqa: F811
    """2 nodes x 2 GPUs, the command as the user types it; every rank reports its world,
    its node and the CPUs its container may use (the step's 2, one thread per worker)."""
    job = submit(tmp_path, gpu_site, "--gpus", "2", "--nodes", "2", "--gpu-type", "v100", "--cpus-per-gpu", "1")
    state = wait_for(job, slurm)
    output = (tmp_path / f"out-{job}.txt").read_text()
    assert state == "COMPLETED", output[-3000:]
    assert ranks(output) == [f"rank {r} of 4 node {r // 2} cpus 2 threads 1 sum 4" for r in range(4)], output[-3000:]
    # one rendezvous port for the job, one the head node's kernel gave it (not a fixed or job-id-derived one)
    (port,) = ports(output)
    assert 1024 <= int(port) <= 65535 and int(port) != 29500 + int(job) % 3000, port


#: A TensorFlow user's multi-worker script, as TensorFlow's guide writes it: MultiWorkerMirroredStrategy reads the
#: cluster from TF_CONFIG; each worker contributes 1 and reports the sum over all of them (ring all-reduce on CPUs).
TF_TRAIN = """\
import json, os
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]  # none on one node
total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
print(f"worker {task['index']} of {strategy.num_replicas_in_sync} sum {float(total):g}", flush=True)
"""


@pytest.mark.parametrize("gpus, nodes", [(2, 1), (1, 2)])
def test_a_tensorflow_job_runs_one_worker_per_node_that_all_reduce(gpus, nodes, slurm, testbed, tmp_path, monkeypatch):  # noqa: F811
    """N16 on the bed: the project's TensorFlow stand-in (real TensorFlow), no torchrun: on one node with 2 GPUs one
    process (MirroredStrategy's layout); on 2 nodes one task per node, each a MultiWorkerMirroredStrategy worker told
    the cluster in TF_CONFIG; both join and all-reduce."""
    monkeypatch.setenv("SLURM_CONF", slurm)
    config = tmp_path / "config.yaml"
    config.write_text("run: {gpu_flag: env}\n")
    monkeypatch.setenv("IMGBUILD_CONFIG", str(config))
    (tmp_path / "train.py").write_text(TF_TRAIN)
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/tensorflow:24.05-tf2-py3"
    job = submit(
        tmp_path, image, "--gpus", str(gpus), "--nodes", str(nodes), "--gpu-type", "v100", "--cpus-per-gpu", "1"
    )
    state, output = ended(job, slurm, tmp_path / f"out-{job}.txt", timeout=600)
    assert state == "COMPLETED", output[-3000:]
    assert "torchrun" not in output
    found = sorted(re.findall(r"worker [0-9] of [0-9]+ sum [0-9.]+", output))
    assert found == [f"worker {w} of {nodes} sum {nodes}" for w in range(nodes)], output[-3000:]


#: A JAX user's multi-process script, as JAX's own guide writes it: initialize() with no arguments, then every
#: process reports its place and the devices it owns (one CPU device each here; the bed has no GPU).
JAX_TRAIN = """\
import jax

jax.distributed.initialize()
print(f"process {jax.process_index()} of {jax.process_count()} local devices {jax.local_device_count()}", flush=True)
jax.distributed.shutdown()
"""


@pytest.mark.parametrize("gpus, nodes", [(2, 1), (1, 2)])
def test_a_jax_job_joins_one_coordinator(gpus, nodes, slurm, testbed, tmp_path, monkeypatch):  # noqa: F811
    """JAX on the bed: an image of NGC's nvidia/jax repository name (the bed's: the 24.05 stand-in with PyPI's jax
    added by a recipe): no torchrun, one process per node, all joined to the coordinator imgbuild names (the first
    node's address, this node's loopback on one node; JAX's own Slurm guess, the node's host name, does not resolve
    in the bed's containers) and given every GPU of their node."""
    monkeypatch.setenv("SLURM_CONF", slurm)
    config = tmp_path / "config.yaml"
    config.write_text("run: {gpu_flag: env}\n")
    monkeypatch.setenv("IMGBUILD_CONFIG", str(config))
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "jaxbed.yaml"
    recipe.write_text('name: jaxbed\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\npip:\n  packages: [jax]\n')
    built = run_cli("build", str(recipe), cwd=tmp_path)
    assert built.code == 0, built.err
    made = built.out.strip().splitlines()[-1].split(" -> ")[0]
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/jax:bed-{tmp_path.name[-12:].lower()}"
    subprocess.run(["docker", "tag", made, image], check=True)
    try:
        (tmp_path / "train.py").write_text(JAX_TRAIN)
        flags = ("--gpus", str(gpus), "--nodes", str(nodes), "--gpu-type", "v100", "--cpus-per-gpu", "1")
        job = submit(tmp_path, image, *flags)
        state, output = ended(job, slurm, tmp_path / f"out-{job}.txt", timeout=600)
        assert state == "COMPLETED", output[-3000:]
        found = sorted(re.findall(r"process [0-9] of [0-9]+ local devices [0-9]+", output))
        assert found == [f"process {p} of {nodes} local devices 1" for p in range(nodes)], output[-3000:]
    finally:
        subprocess.run(["docker", "rmi", image, made], capture_output=True)


def test_a_command_that_is_torchrun_itself_runs_one_training_across_two_nodes(gpu_site, slurm, tmp_path):  # noqa: F811
    """N17 on the bed: `torchrun train.py` as typed, 2 nodes x 2 GPUs, never wrapped in a second torchrun (which ran
    two trainings on the same GPUs): torchrun is told the rendezvous by its PET_* variables, and the four ranks
    form one world whose all-reduce sums to 4."""
    job = submit(tmp_path, gpu_site, "--gpus", "2", "--nodes", "2", "--gpu-type", "v100", "--cpus-per-gpu", "1",
                 command=("torchrun", "train.py"))  # fmt: skip
    state = wait_for(job, slurm)
    output = (tmp_path / f"out-{job}.txt").read_text()
    assert state == "COMPLETED", output[-3000:]
    assert ranks(output) == [f"rank {r} of 4 node {r // 2} cpus 2 threads 1 sum 4" for r in range(4)], output[-3000:]


def test_a_podman_hpc_job_on_two_nodes_is_one_training_with_the_steps_variables(gpu_site, slurm, tmp_path, monkeypatch):  # noqa: F811
    """`--runtime podman-hpc` (NERSC) on the bed: real Podman runs each task's container (rootful here; podman-hpc's
    own flags for NERSC's modules, `--gpu` and `--nccl`, are what a stand-in `podman-hpc` on PATH drops before
    calling podman). The step's Slurm variables reach the containers through podman's `-e 'SLURM_*'`, the job's
    folder is /workspace, and the four ranks on two nodes form one world."""
    wrapper = tmp_path / "bin" / "podman-hpc"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/bash\n# stands in for NERSC's wrapper: its module flags dropped, the rest is podman's\n"
        'args=(); for a in "$@"; do case "$a" in --gpu|--nccl) ;; *) args+=("$a") ;; esac; done\n'
        'exec podman "${args[@]}"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    res = run_cli("slurm", gpu_site, "--runtime", "podman-hpc", "--gpus", "2", "--nodes", "2", "--gpu-type", "v100",
                  "--cpus-per-gpu", "1", "--output", str(tmp_path / "pod-%j.txt"), "--submit", "--", "python3",
                  "train.py", cwd=tmp_path)  # fmt: skip
    assert res.code == 0, res.err
    podman_job = res.out.split()[-1]
    state, output = ended(podman_job, slurm, tmp_path / f"pod-{podman_job}.txt")
    assert state == "COMPLETED", output[-3000:]
    found = sorted(re.findall(r"rank ([0-9]) of ([0-9]) node ([0-9]) job ([0-9]+)", output))
    assert found == [(str(r), "4", str(r // 2), podman_job) for r in range(4)], output[-3000:]


#: Launchers as the user types them, and the nodes each runs on (2 GPUs per node).
TYPED_LAUNCHERS = (
    (("accelerate", "launch", "train.py"), 1),
    (("accelerate", "launch", "train.py"), 2),
    (("accelerate", "launch", "--config_file", "fsdp.yaml", "train.py"), 2),
    (("deepspeed", "train.py"), 2),
)


def test_a_launcher_typed_by_the_user_forms_one_world(gpu_site, slurm, launchers_image, tmp_path):  # noqa: F811
    """accelerate (in its DDP and FSDP modes) and deepspeed as typed, told by their own rules: one process per GPU,
    and across nodes each node's rank and the first node's address (deepspeed: the job's hostfile and its no-ssh
    form); every rank is one of one world whose all-reduce counts them all. The image: the 24.05 stand-in with
    PyPI's accelerate and deepspeed added by a recipe (built once a session, shared with the launchers' parsers'
    test, for all four jobs), run by the docker runtime."""
    recipe = launchers_image.recipe
    (tmp_path / "fsdp.yaml").write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\n")
    jobs = [
        (submit(tmp_path, str(recipe), "--gpus", "2", "--nodes", str(nodes), "--gpu-type", "v100",
                "--cpus-per-gpu", "1", command=command), command, nodes)
        for command, nodes in TYPED_LAUNCHERS
    ]  # fmt: skip
    for job, command, nodes in jobs:
        state, output = ended(job, slurm, tmp_path / f"out-{job}.txt")
        assert state == "COMPLETED", (command, output[-3000:])
        world = 2 * nodes
        found = sorted(re.findall(r"rank ([0-9]) of ([0-9]) node \S+ job [0-9]+ cpus [0-9]+ threads [0-9]+ "
                                  r"sum ([0-9])", output))  # fmt: skip
        assert found == [(str(r), str(world), str(world)) for r in range(world)], (command, output[-3000:])


def test_the_same_command_at_one_node_and_one_gpu(gpu_site, slurm, tmp_path):  # noqa: F811
    """The same `python3 train.py` at 2 GPUs on one node (torchrun --standalone) and at 1 GPU (no torchrun).
    One CPU asked for: the container gets one of the node's two (the step's, through --cpuset-cpus)."""
    two = submit(tmp_path, gpu_site, "--gpus", "2", "--cpus", "1")
    one = submit(tmp_path, gpu_site, "--gpus", "1", "--cpus", "1")
    for job, expected in (
        (two, ["rank 0 of 2 node 0 cpus 1 threads 1 sum 2", "rank 1 of 2 node 0 cpus 1 threads 1 sum 2"]),
        (one, ["rank 0 of 1 node - cpus 1 threads 1 sum 1"]),
    ):
        state = wait_for(job, slurm)
        output = (tmp_path / f"out-{job}.txt").read_text()
        assert state == "COMPLETED", output[-3000:]
        assert ranks(output) == expected, output[-3000:]


def _job_containers(job: str) -> list[str]:
    found = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=org.imgbuild.slurm-job={job}"], capture_output=True, text=True
    )
    return found.stdout.split()


def test_a_cancelled_jobs_container_stops_with_it_and_the_epilog_sweeps_a_leftover(gpu_site, slurm, tmp_path):  # noqa: F811
    """The container is dockerd's child, not the job's. It is named and labelled with the job,
    capped to the job's memory, stopped when the job is cancelled, and the site's epilog removes one that a
    killed `docker run` left (planted here as such a leftover)."""
    job = submit(tmp_path, gpu_site, "--gpus", "0", "--cpus", "1", "--mem", "600M", command=("sleep", "600"))
    deadline = time.monotonic() + 120
    while not _job_containers(job) and time.monotonic() < deadline:
        time.sleep(1)
    running = _job_containers(job)
    assert running, (tmp_path / f"out-{job}.txt").read_text()[-2000:]
    inspect = subprocess.run(
        ["docker", "inspect", "-f", "{{.Name}} {{.HostConfig.Memory}} {{.HostConfig.CpusetCpus}}", running[0]],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert inspect[0] == f"/imgbuild-{job}-0-0" and inspect[1] == str(600 * 2**20) and len(inspect[2]) == 1
    # a leftover of this job: what a SIGKILLed `docker run` leaves behind
    planted = subprocess.run(
        ["docker", "run", "-d", "--label", f"org.imgbuild.slurm-job={job}", "--entrypoint", "sleep", gpu_site, "600"],
        capture_output=True,
        text=True,
    )
    assert planted.returncode == 0, planted.stderr
    subprocess.run(["scancel", job], check=True)
    assert wait_for(job, slurm, timeout=120) == "CANCELLED"
    deadline = time.monotonic() + 60
    while _job_containers(job) and time.monotonic() < deadline:
        time.sleep(1)
    left = _job_containers(job)
    subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
    assert not left


def test_a_bind_whose_folder_is_missing_on_the_node_fails_the_step_not_roots_mkdir(gpu_site, slurm, tmp_path):  # noqa: F811
    """Under Slurm: docker would create a missing bind source as root on the node."""
    missing = tmp_path / "not-made-yet"
    job = submit(tmp_path, gpu_site, "--gpus", "0", "--cpus", "1", "--bind", f"{missing}:/data", command=("true",))
    state = wait_for(job, slurm)
    output = (tmp_path / f"out-{job}.txt").read_text()
    assert state == "FAILED" and f"imgbuild: {missing}: no such folder on" in output, output[-2000:]
    assert not missing.exists()


def test_staged_data_reaches_the_container_and_a_scratch_of_the_jobs_own_is_removed(
    gpu_site,
    slurm,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """Where the site sets no $LOCAL_SCRATCH, the job makes one under $TMPDIR on every node and
    now removes it at the end (it was left behind, a copy of the data set per job)."""
    import tarfile

    data = tmp_path / "data"
    data.mkdir()
    (data / "hello.txt").write_text("staged\n")
    with tarfile.open(tmp_path / "data.tar", "w") as tar:
        tar.add(data / "hello.txt", arcname="hello.txt")
    node_tmp = tmp_path / "node-tmp"
    node_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(node_tmp))  # what the nodes' jobs get (sbatch exports it)
    monkeypatch.delenv("LOCAL_SCRATCH", raising=False)
    job = submit(
        tmp_path, gpu_site, "--gpus", "0", "--nodes", "2", "--cpus", "1", "--stage", str(tmp_path / "data.tar"),
        command=("sh", "-c", "echo read $(cat $LOCAL_SCRATCH/hello.txt) in $LOCAL_SCRATCH"),
    )  # fmt: skip
    state = wait_for(job, slurm)
    output = (tmp_path / f"out-{job}.txt").read_text()
    assert state == "COMPLETED", output[-3000:]
    assert f"read staged in {node_tmp}/imgbuild-{job}" in output, output[-2000:]
    assert list(node_tmp.iterdir()) == []


def test_an_oci_bundle_runs_under_srun_container_on_every_node(
    gpu_site,
    slurm,  # noqa: F811
    plain_image,
    tmp_path,
    unique,
):
    """Containers on Slurm without Apptainer. `export --oci` writes the built image as a
    bundle; `slurm --runtime oci` runs it with Slurm's own `srun --container` (runc, from oci.conf) on both
    nodes: torchrun's ranks, the step's CPUs (Slurm's cgroup holds the container), the step's GPUs, the
    caller's UID, a site bind, the job's folder; a job from a folder the bundle does not hold says so."""
    recipe = plain_image.recipe
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "marker").write_text("site data\n")
    bundle = tmp_path / "bundle.oci"
    exported = run_cli("export", str(recipe), "--oci", str(bundle), "--bind", f"{shared}:/shared:ro", cwd=tmp_path)
    assert exported.code == 0 and exported.out.strip() == str(bundle), exported.err
    assert "unpacking the bundle" in exported.err  # progress, step by step
    flags = ("--runtime", "oci", "--gpu-type", "v100", "--no-usage", "--output", str(tmp_path / "out-%j.txt"))
    two = run_cli(
        "slurm", str(bundle), *flags, "--gpus", "2", "--nodes", "2", "--cpus-per-gpu", "1", "--submit", "--",
        "python3", "train.py", cwd=tmp_path,
    )  # fmt: skip
    show = (
        "echo uid=$(id -u) cpus=$(nproc) in=$(pwd) path=$PATH $(cat /shared/marker) "
        "$(touch /usr/imgbuild-probe 2>/dev/null && echo root-writable || echo root-read-only) "
        "$(mkdir -p /workspace/.cache/torch && echo workspace-writable)"
    )
    one = run_cli(
        "slurm", str(bundle), *flags, "--gpus", "1", "--cpus", "1", "--submit", "--", "sh", "-c", show, cwd=tmp_path
    )  # fmt: skip
    elsewhere = Path("/var/tmp") / f"imgbuild-oci-{unique}"  # not under /tmp, nor a bind of the bundle
    elsewhere.mkdir()
    try:
        away = run_cli(
            "slurm", str(bundle), *flags, "--gpus", "0", "--cpus", "1", "--output", str(tmp_path / "away-%j.txt"),
            "--submit", "--", "true", cwd=elsewhere,
        )  # fmt: skip
        jobs = [res.out.split()[-1] for res in (two, one, away)]
        states = [wait_for(job, slurm) for job in jobs]
    finally:
        elsewhere.rmdir()
    outputs = [(tmp_path / f"out-{jobs[0]}.txt"), (tmp_path / f"out-{jobs[1]}.txt"), (tmp_path / f"away-{jobs[2]}.txt")]
    texts = [path.read_text() for path in outputs]
    assert states[:2] == ["COMPLETED", "COMPLETED"], texts[0][-2000:] + texts[1][-2000:]
    assert ranks(texts[0]) == [f"rank {r} of 4 node {r // 2} cpus 2 threads 1 sum 4" for r in range(4)], texts[0]
    # the image's PATH (Slurm's job environment had hidden it: no /usr/local/cuda/bin)
    inspect = ["docker", "image", "inspect", "-f", "{{json .Config.Env}}", plain_image.image]
    image_env = json.loads(subprocess.run(inspect, capture_output=True, text=True).stdout)
    image_path = next(item for item in image_env if item.startswith("PATH="))[5:]
    assert "/usr/local/cuda/bin" in image_path
    assert f"uid={os.getuid()} cpus=1 in={tmp_path} path={image_path} site data" in texts[1], texts[1][-2000:]
    # the bundle is every job's and none may change it: a read-only root, /workspace a job's tmpfs
    assert "root-read-only workspace-writable" in texts[1], texts[1][-2000:]
    assert not (bundle / "rootfs" / "usr" / "imgbuild-probe").exists()
    assert not any((bundle / "rootfs" / "workspace").iterdir())
    assert states[2] == "FAILED" and f"the job folder {elsewhere} is not in the container" in texts[2], texts[2]


def test_every_generated_job_script_passes_shellcheck(slurm, tmp_path):  # noqa: F811  (slurm-up installs it)
    """Each runtime's and layout's script passes `bash -n` and `shellcheck -S warning`."""
    from imgbuild.clusters.slurm import JobSpec, sbatch_script

    jobs = {
        "apptainer-multi": JobSpec(["python3", "t.py"], "x.sif", gpus=4, nodes=2, stage=["/d/a.tar"], requeue=True),
        "apptainer-alone": JobSpec(["bash", "run.sh"], "x.sif", gpus=1, snapshot_dir="/p/snaps"),
        "pyxis": JobSpec(["python", "-m", "pkg.train"], "nvcr.io/nvidia/pytorch:24.05-py3", gpus=2, runtime="pyxis"),
        "docker": JobSpec(["t.py"], "lab/x:1", gpus=2, nodes=2, runtime="docker", binds=["/scratch"], mem="64G"),
        "docker-per-gpu": JobSpec(["hvd.py"], "lab/x:1", gpus=4, task_per_gpu=True, runtime="docker"),
        "docker-cpu": JobSpec(["true"], "lab/x:1", gpus=0, runtime="docker", stage=["/d/a.tar"]),
        "oci": JobSpec(["python3", "t.py"], "/b/x.oci", gpus=2, nodes=2, runtime="oci", stage=["/d/a.tar"]),
        "edf": JobSpec(
            ["python3", "t.py"], "lab/x:1", gpus=4, nodes=2, runtime="edf", binds=["$SCRATCH"], requeue=True
        ),  # fmt: skip
        "tensorflow": JobSpec(["python3", "t.py"], "x.sif", gpus=2, nodes=2, framework="tensorflow"),
        "podman-hpc": JobSpec(["t.py"], "r.io/lab/x:1", gpus=4, nodes=2, runtime="podman-hpc", stage=["/d/a.tar"]),
        "shifter": JobSpec(
            ["t.py"],
            "r.io/lab/x:1",
            gpus=4,
            nodes=2,
            runtime="shifter",
            binds=["/p", "$SCRATCH"],
            shifter_modules=["gpu"],
        ),  # fmt: skip
        "jax": JobSpec(["python3", "t.py"], "lab/x:1", gpus=2, nodes=2, framework="jax", runtime="docker"),
        "deepspeed": JobSpec(["deepspeed", "t.py"], "x.sif", gpus=4, nodes=2, runtime="apptainer"),
        "accelerate": JobSpec(["accelerate", "launch", "t.py"], "x.sif", gpus=4, nodes=2, rdzv_host_suffix="i"),
        "juwels": JobSpec(["python3", "t.py"], "x.sif", gpus=4, nodes=2, framework="pytorch", rdzv_host_suffix="i"),
    }
    for name, job in jobs.items():
        path = tmp_path / f"{name}.sh"
        path.write_text(sbatch_script(job))
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0, name
        check = subprocess.run(["shellcheck", "-S", "warning", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, f"{name}:\n{check.stdout[-3000:]}"


def test_an_enroot_squashfs_image_carries_enroots_files_and_its_rc_starts_the_image(
    slurm,  # noqa: F811  (slurm-up installs skopeo, umoci and squashfs-tools)
    testbed,
    plain_image,
    tmp_path,
):
    """`export --sqsh` for pyxis/enroot, in enroot's documented image format (a squashfs
    with /etc/rc, /etc/environment, /etc/fstab). enroot cannot run here: the image is inspected, and its
    /etc/rc run in a chroot of the unpacked tree with the image's /etc/environment, as enroot starts it."""
    recipe = plain_image.recipe
    image = tmp_path / "x.sqsh"
    exported = run_cli("export", str(recipe), "--sqsh", str(image), cwd=tmp_path)
    assert exported.code == 0 and exported.out.strip() == str(image), exported.err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".imgbuild-")] == []  # no work left behind
    assert subprocess.run(["file", "-b", str(image)], capture_output=True, text=True).stdout.startswith("Squashfs")

    def cat(name: str) -> str:
        return subprocess.run(["unsquashfs", "-cat", str(image), name], capture_output=True, text=True).stdout

    environment = cat("etc/environment").splitlines()
    assert "NVIDIA_PYTORCH_VERSION=24.05" in environment and any(v.startswith("PATH=") for v in environment)
    assert 'exec /opt/nvidia/nvidia_entrypoint.sh "$@"' in cat("etc/rc") and "cd /workspace" in cat("etc/rc")
    tree = tmp_path / "tree"
    unpacked = subprocess.run(["unsquashfs", "-q", "-n", "-d", str(tree), str(image)], capture_output=True, text=True)
    assert unpacked.returncode == 0, unpacked.stderr[-2000:]
    env = dict(line.split("=", 1) for line in environment)
    probe = "import torch, os; print('torch', torch.__version__, 'in', os.getcwd())"
    started = subprocess.run(
        ["chroot", str(tree), "/bin/sh", "/etc/rc", "python3", "-c", probe],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert started.returncode == 0, started.stderr[-2000:]
    assert started.stdout.strip().splitlines()[-1] == f"torch {ngc_facts.BED_TORCH} in /workspace"
