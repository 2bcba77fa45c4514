"""Clusters: Apptainer definitions (parsed with spython) and sbatch scripts run by a real Slurm."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from spython.main.parse.parsers import SingularityParser

from imgbuild.clusters.jobs import JobFlags, check_image_present, job_from_flags
from imgbuild.clusters.slurm import JobSpec, sbatch_script
from imgbuild.config.settings import load_settings
from imgbuild.config.site import slurm_site
from imgbuild.errors import UsageError
from imgbuild.pipeline.render import apptainer_definition
from tests import ngc_facts
from tests.conftest import ROOT, run_cli, use_site_config
from tests.support import plan_of, step_line, wait_for

DIGEST = "sha256:" + "cd" * 32


def parse(text: str, tmp_path: Path):
    path = tmp_path / "x.def"
    path.write_text(text)
    return SingularityParser(str(path)).recipe["spython-base"]


def section(text: str, name: str) -> list[str]:
    lines = text.split(name + "\n", 1)[1].split("\n%", 1)[0].splitlines()
    return [line.strip() for line in lines if line.strip()]


def test_definition_from_the_built_image(tmp_path):
    plan = plan_of(ROOT / "recipes/pytorch-research.yaml")
    text = apptainer_definition(plan, "docker-daemon")
    assert text.splitlines()[1:3] == ["Bootstrap: docker-daemon", "From: lab/pytorch-research:24.05"]
    parsed = parse(text, tmp_path)
    assert parsed.fromHeader == "lab/pytorch-research:24.05"
    assert "python3 /opt/imgbuild/smoke --format table" in " ".join(parsed.install)  # %test
    runscript = section(text, "%runscript")
    assert runscript[0] == "cd /workspace 2>/dev/null || true" and runscript[-1] == "exec bash"  # the recipe's cmd
    assert "PYTHONNOUSERSITE=1" in parsed.environ
    archive = apptainer_definition(plan, "docker-archive", "pytorch-research.tar")
    assert "Bootstrap: docker-archive\nFrom: pytorch-research.tar\n" in archive


def test_native_definition_carries_the_recipe(tmp_path):
    plan = plan_of(ROOT / "recipes/pytorch-research.yaml")
    text = apptainer_definition(plan, "native")
    parsed = parse(text, tmp_path)
    assert parsed.fromHeader == f"nvcr.io/nvidia/pytorch:24.05-py3@{DIGEST}"
    post = "\n".join(parsed.install)
    assert "apt-get install -y --no-install-recommends git less tmux" in post
    assert "sh /opt/imgbuild/pip/install.sh" in post  # the base's framework stays pinned
    assert {"OMP_NUM_THREADS=8", "TORCH_HOME=/workspace/.cache/torch"} <= set(parsed.environ)
    assert "files/opt/research/train_smoke.py /opt/research/train_smoke.py" in text  # %files
    assert "imgbuild/smoke /opt/imgbuild/smoke\n" in text
    assert "python3 /opt/imgbuild/smoke --format table" in post  # %test


def test_native_definition_keeps_the_user_the_labels_and_the_file_modes(tmp_path):
    """The definition is rendered from a template like the Dockerfile: nothing the Dockerfile does is dropped."""
    plan = plan_of(ROOT / "recipes/pytorch-research.yaml")
    text = apptainer_definition(plan, "native")
    post = section(text, "%post")
    assert f"sh /opt/imgbuild/user/add-user.sh researcher {plan.uid} {plan.gid} /home/researcher /workspace" in post
    assert "find /opt/research/train_smoke.py -type f -exec chmod 0755 {} +" in post
    assert f"chown -R {plan.uid}:{plan.gid} /opt/research/train_smoke.py" in post
    assert post.index("PIP_NO_CACHE_DIR=1 sh /opt/imgbuild/pip/install.sh") > post.index(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends git less tmux"
    )
    labels = dict(line.split(" ", 1) for line in section(text, "%labels"))
    from imgbuild.pipeline.render import image_labels

    assert labels == image_labels(plan)  # the same labels as the Docker image
    with pytest.raises(UsageError, match="--from"):
        apptainer_definition(plan, "oras")


def test_export_cli_writes_the_definition_and_says_how_to_build(tmp_path):
    res = run_cli("export", str(ROOT / "recipes/tensorflow-keras.yaml"), "--apptainer", "-o", str(tmp_path / "tf.def"))
    assert res.code == 0, res.err
    assert (tmp_path / "tf.def").read_text().startswith("# Apptainer definition rendered by imgbuild")
    assert "apptainer is not installed here" in res.err


def test_sbatch_single_gpu_follows_cluster_conventions():
    script = sbatch_script(
        JobSpec(
            ["python3", "train.py", "--lr", "1e-3"],
            "research.sif",
            gpus=1,
            gpu_type="v100",
            partition="gpu",
            account="project_2001234",
            mem="64G",
        )
    )
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --account=project_2001234",
        "#SBATCH --gres=gpu:v100:1",
        "#SBATCH --cpus-per-task=10",
        "#SBATCH --mem=64G",
        "#SBATCH --nodes=1",
    ):
        assert line in script.splitlines()
    # every CPU of the task for the one process, on the command itself: an image's ENV cannot undo it
    # the step says its CPUs itself: Slurm 22.05-23.02 give a step one CPU otherwise
    last = "srun --cpus-per-task=10 apptainer exec --nv research.sif env OMP_NUM_THREADS=10 python3 train.py --lr 1e-3"
    assert step_line(script) == last
    assert "torchrun" not in script


def test_sbatch_multi_node_uses_torchrun_with_the_first_node_as_rendezvous():
    job = JobSpec(
        ["python", "ddp.py"],
        "research.sif",
        gpus=4,
        nodes=2,
        gpu_type="a100",
        stage=["/scratch/p/data.tar"],
        scratch_gres="nvme:100",
        nccl_debug="INFO",
    )
    script = sbatch_script(job)
    assert "#SBATCH --gres=gpu:a100:4,nvme:100" in script and "#SBATCH --cpus-per-task=40" in script
    assert "export NCCL_DEBUG=INFO" in script
    assert 'srun --ntasks="$SLURM_NNODES" --ntasks-per-node=1 tar xf /scratch/p/data.tar -C "$LOCAL_SCRATCH"' in script
    last = step_line(script)
    # 40 CPUs, 4 workers: 10 threads each (was 4 x 40 on 40 CPUs)
    prefix = (
        'srun --cpus-per-task=40 apptainer exec --nv --bind "$LOCAL_SCRATCH:$LOCAL_SCRATCH" research.sif '
        "env OMP_NUM_THREADS=10 torchrun "
    )
    assert last.startswith(prefix)
    assert '"--nnodes=$SLURM_NNODES" --nproc-per-node=4' in last
    # a port of the job's own (a fixed 29500 let two jobs on one node meet)
    # a port free on the head node now (job ids 10000 apart shared one), else below the ephemeral range
    rdzv = next(line for line in script.splitlines() if line.startswith("rdzv_port="))
    assert 's.bind(("", 0))' in rdzv and rdzv.endswith("|| echo $(( 29500 + SLURM_JOB_ID % 3000 )))")
    port = subprocess.run(["bash", "-c", rdzv + '\necho "$rdzv_port"'], capture_output=True, text=True, timeout=30)
    assert 1024 <= int(port.stdout) <= 65535
    # the command as typed: torchrun takes the script, not `python` ("can't open file python3")
    assert last.endswith('"--rdzv-endpoint=$head_node:$rdzv_port" "--rdzv-id=$SLURM_JOB_ID" ddp.py')
    single = step_line(sbatch_script(JobSpec(["python", "ddp.py"], "research.sif", gpus=4)))
    assert single.endswith("env OMP_NUM_THREADS=10 torchrun --standalone --nproc-per-node=4 ddp.py")
    pyxis = sbatch_script(JobSpec(["python", "t.py"], "nvcr.io#nvidia/pytorch:24.05-py3", runtime="pyxis"))
    assert step_line(pyxis).startswith(
        "srun --cpus-per-task=10 --container-image=nvcr.io#nvidia/pytorch:24.05-py3 --container-workdir=/workspace"
    )
    with pytest.raises(UsageError):
        sbatch_script(JobSpec(["x"], "i", runtime="podman"))


def test_bash_accepts_every_generated_script(tmp_path):
    for job in (
        JobSpec(["python", "a b.py", "--msg", "it's"], "x.sif"),
        JobSpec(["python", "d.py"], "x.sif", gpus=8, nodes=4, stage=["d.tar"]),
        JobSpec(["true"], "img", runtime="docker", gpus=0),
        JobSpec(["hvd.py"], "img", runtime="docker", gpus=4, nodes=2, task_per_gpu=True, docker_gpu_flag="env"),
        JobSpec(["t.py"], "x.sif", gpus=2, requeue=True, max_restarts=2, snapshot_dir="$SLURM_SUBMIT_DIR/s"),
        JobSpec(["t.py"], "x.sif", gpus=2, usage=False, runtime="pyxis"),
    ):
        path = tmp_path / "job.sh"
        path.write_text(sbatch_script(job))
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


# --- a real Slurm ---------------------------------------------------------------------------------------


@pytest.mark.engine
@pytest.mark.slurm
def test_generated_job_runs_to_completion_in_slurm(slurm, testbed, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm)
    monkeypatch.chdir(tmp_path)
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    (tmp_path / "train.py").write_text(
        "import os, torch\nprint('trained with torch', torch.__version__, "
        "'in', os.getcwd(), 'job', os.environ['SLURM_JOB_ID'])\n"
    )
    res = run_cli(
        "slurm",
        image,
        "--runtime",
        "docker",
        "--gpus",
        "0",
        "--cpus",
        "1",
        "--output",
        str(tmp_path / "out-%j.txt"),
        "--submit",
        "--",
        "python3",
        "train.py",
        cwd=tmp_path,
    )
    assert res.code == 0, res.err
    job_id = res.out.split()[-1]
    assert wait_for(job_id, slurm) == "COMPLETED"
    output = (tmp_path / f"out-{job_id}.txt").read_text()
    assert f"trained with torch {ngc_facts.BED_TORCH} in /workspace job {job_id}" in output


@pytest.mark.engine
@pytest.mark.slurm
def test_multi_node_torchrun_job_runs_across_two_slurm_nodes(slurm, testbed, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm)
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    (tmp_path / "ddp.py").write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.ones(1) * (dist.get_rank() + 1)\n"
        "dist.all_reduce(t)\n"
        "print(f'rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():g}', flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    res = run_cli(
        "slurm",
        image,
        "--runtime",
        "docker",
        "--gpus",
        "0",
        "--nodes",
        "2",
        "--torchrun",
        "--cpus",
        "1",
        "--output",
        str(tmp_path / "ddp-%j.txt"),
        "--submit",
        "--",
        "ddp.py",
        cwd=tmp_path,
    )
    assert res.code == 0, res.err
    job_id = res.out.split()[-1]
    state = wait_for(job_id, slurm)
    output = (tmp_path / f"ddp-{job_id}.txt").read_text()
    assert state == "COMPLETED", output[-3000:]
    assert "rank 0 of 2 sum 3" in output and "rank 1 of 2 sum 3" in output


@pytest.mark.slurm
@hypothesis_settings(max_examples=25, derandomize=True, deadline=None, database=None)
@given(
    runtime=st.sampled_from(["apptainer", "pyxis", "docker", "edf", "podman-hpc", "oci"]),
    gpus=st.integers(0, 2),
    nodes=st.integers(1, 2),
    task_per_gpu=st.booleans(),
    gpu_type=st.sampled_from([None, "v100"]),
    requeue=st.booleans(),
    time=st.sampled_from(["90", "30:00", "1:00:00", "2-", "1-12", "2-00:00:00", "UNLIMITED", "infinite", "0:30"]),
    mem=st.sampled_from([None, "1500M", "0.5G", "1G"]),
    account=st.sampled_from([None, "project_2001234", "abc@v100"]),
)
def test_every_header_imgbuild_writes_is_one_sbatch_accepts(
    slurm, runtime, gpus, nodes, task_per_gpu, gpu_type, requeue, time, mem, account
):
    """The bed's Slurm (22.05, cons_tres, typed GRES, 2 CPUs a node) reads every generated script's #SBATCH lines:
    runtimes x GPUs x nodes x one task per GPU x GPU type x requeue x each time form x memory x account."""
    from unittest import mock

    from imgbuild.clusters.jobs import submit_job

    requeue = requeue and time != "0:30"  # a minute's limit is no longer than the signal lead: refused before
    flags = JobFlags(["python3", "t.py"], "nvcr.io/nvidia/pytorch:24.05-py3", "x", gpus=gpus, nodes=nodes,
                     runtime=runtime, task_per_gpu=task_per_gpu, gpu_type=gpu_type, requeue=requeue, time=time,
                     mem=mem, account=account, cpus=1)  # fmt: skip
    script = sbatch_script(job_from_flags(flags, slurm_site({"qos": "normal"})))
    with mock.patch.dict(os.environ, {"SLURM_CONF": slurm}):
        assert "to start at" in submit_job(script, test_only=True)


@pytest.mark.engine  # `-m "not engine"` is the fast set: no engine, no Slurm
@pytest.mark.slurm
def test_sbatch_test_only_accepts_the_multi_node_gpu_form(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm)
    res = run_cli(
        "slurm",
        "research.sif",
        "--gpus",
        "4",
        "--nodes",
        "2",
        "--gpu-type",
        "v100",
        "--cpus",
        "1",
        "--stage",
        "/data/set.tar",
        "--test-only",
        "--",
        "python",
        "train.py",
        cwd=tmp_path,
    )
    assert res.code == 0, res.err
    assert "to start at" in res.out and "node[1-2]" in res.out
    too_big = run_cli(
        "slurm",
        "research.sif",
        "--gpus",
        "8",
        "--nodes",
        "2",
        "--gpu-type",
        "v100",
        "--cpus",
        "1",
        "--test-only",
        "--",
        "python",
        "train.py",
        cwd=tmp_path,
    )
    assert too_big.code == 1 and "sbatch refused the job" in too_big.err


def test_a_workdir_with_a_space_is_quoted_in_the_definition(tmp_path):
    """`workdir` may hold a space: %post and %runscript must pass it as one word."""
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: spaced\nbase: {framework: pytorch, tag: "24.05"}\nworkdir: /work space\nrun: [echo hi]\n')
    text = apptainer_definition(plan_of(recipe), "native")
    assert "    mkdir -p '/work space'" in text and "    cd '/work space' 2>/dev/null || true" in text


def test_the_docker_runtime_gives_the_container_the_steps_gpus_the_callers_ids_and_the_jobs_env(tmp_path):
    """`--gpus all` gave every GPU of the node; no --user wrote root's files; NCCL_DEBUG
    stayed outside. The srun line runs here with srun and docker replaced by recorders."""
    import json as jsonlib
    import os

    job = JobSpec(["python", "t.py", "--msg", "it's"], "img:1", runtime="docker", gpus=2, nccl_debug="INFO")
    line = step_line(sbatch_script(job))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bin_dir / "docker").write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    for tool in ("srun", "docker"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_STEP_GPUS": "2,3", "NCCL_DEBUG": "INFO"}
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    argv = jsonlib.loads(done.stdout)
    assert argv[argv.index("--gpus") + 1] == '"device=2,3"'  # the step's GPUs, not all of the node's
    assert argv[argv.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    assert argv[argv.index("NCCL_DEBUG") - 1] == "-e"
    image = argv.index("img:1")
    assert argv[image + 1 :] == [
        "env",
        "OMP_NUM_THREADS=10",
        "torchrun",
        "--standalone",
        "--nproc-per-node=2",
        "t.py",
        "--msg",
        "it's",
    ]
    assert not any("PMIX" in word for word in argv)  # no PMIx server: nothing of it passed or bound
    cpu_only = step_line(sbatch_script(JobSpec(["true"], "img:1", runtime="docker", gpus=0)))
    assert "NVIDIA_VISIBLE_DEVICES=void" in cpu_only and "--gpus" not in cpu_only
    # a task of `srun --mpi=pmix`: its place in Slurm's PMIx server, and the server's folder, reach the container
    mpi = JobSpec(["python3", "hvd.py"], "img:1", runtime="docker", gpus=2, task_per_gpu=True, mpi="pmix")
    pmix = tmp_path / "pmix.7.0"
    pmix.mkdir()
    env.update({"PMIX_RANK": "1", "PMIX_NAMESPACE": "slurm.pmix.7.0", "PMIX_SERVER_TMPDIR": str(pmix)})
    done = subprocess.run(["bash", "-c", step_line(sbatch_script(mpi))], capture_output=True, text=True, env=env,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    argv = jsonlib.loads(done.stdout)
    passed = {argv[i + 1] for i, word in enumerate(argv) if word == "-e"}
    assert {"PMIX_RANK", "PMIX_NAMESPACE", "PMIX_SERVER_TMPDIR"} <= passed
    assert argv[argv.index(f"{pmix}:{pmix}") - 1] == "-v"


def test_a_csc_like_site_config_describes_the_cluster():
    """Binds, a default GPU type, memory in Slurm's units, GPUs per node of each type."""
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site

    site = {
        "gpu_types": {"v100": "v100", "a100": "a100"},
        "gpu_type": "v100",
        "gpus_per_node": {"v100": 4, "a100": 4},
        "mem_per_gpu": "16000M",
        "binds": ["/scratch", "/projappl:/projappl:ro"],
        "sif_dir": "/projappl/p/images",
    }
    job = job_from_flags(JobFlags(["python", "t.py"], "lab/research:1", "research", gpus=4), slurm_site(site))
    script = sbatch_script(job)
    assert "#SBATCH --gres=gpu:v100:4" in script and "#SBATCH --mem=64000M" in script
    assert (
        "apptainer exec --nv --bind /scratch --bind /projappl:/projappl:ro /projappl/p/images/research_1.sif" in script
    )
    assert job_from_flags(JobFlags(["x"], "i", "i", gpus=2), slurm_site({**site, "mem_per_gpu": "64G"})).mem == "128G"
    with pytest.raises(UsageError, match=r"a v100 node has 4 GPUs; ask for --nodes 2 --gpus 4"):
        job_from_flags(JobFlags(["x"], "i", "i", gpus=8), slurm_site(site))
    for bad, message in (
        ({"mem_per_gpu": "lots"}, "not a Slurm memory size"),
        ({"binds": ["scratch"]}, "not /HOST"),
        ({"binds": "/scratch"}, "must be a list"),
        ({"gpus_per_node": 4}, "must be a mapping"),
    ):
        with pytest.raises(UsageError, match=message):
            job_from_flags(JobFlags(["x"], "i", "i"), slurm_site({**site, **bad}))


def test_export_builds_the_sif_slurm_runs_and_submit_checks_it_is_there(tmp_path):
    """export suggested pytorch-research.sif, slurm ran pytorch-research_24.05.sif."""
    from imgbuild.clusters.apptainer import sif_name, sif_path

    assert sif_name("lab/pytorch-research:24.05") == "pytorch-research_24.05.sif"
    assert sif_path("lab/pytorch-research:24.05", "/projappl/p") == "/projappl/p/pytorch-research_24.05.sif"
    exported = run_cli("export", str(ROOT / "recipes/pytorch-research.yaml"), "--apptainer", "--no-build", cwd=tmp_path)
    assert exported.code == 0, exported.err
    definition = exported.out.strip().splitlines()[-1]
    assert definition.endswith("pytorch-research_24.05.def")
    missing = run_cli("slurm", "lab/pytorch-research:24.05", "--submit", "--", "python", "t.py", cwd=tmp_path)
    assert missing.code == 2 and "pytorch-research_24.05.sif: no such image here" in missing.err, missing.err


def test_one_task_per_gpu_layout_and_fault_tolerance_flags():
    """One task per GPU (CSC's 8 tasks x 1 GPU for MPI/Horovod) and the fault-tolerance take-over."""
    per_gpu = sbatch_script(JobSpec(["python", "hvd.py"], "x.sif", gpus=4, nodes=2, gpu_type="v100", cpus_per_gpu=10))
    assert "#SBATCH --gres=gpu:v100:4" in per_gpu  # the torchrun layout, for contrast
    job = JobSpec(["python", "hvd.py"], "x.sif", gpus=4, nodes=2, gpu_type="v100", cpus_per_gpu=10, task_per_gpu=True)
    script = sbatch_script(job)
    lines = script.splitlines()
    for line in ("#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-task=v100:1", "#SBATCH --cpus-per-task=10"):
        assert line in lines
    assert not any(line.startswith("#SBATCH --gres=gpu") for line in lines)
    step = step_line(script)
    assert step.startswith("srun --cpus-per-task=10 --gpus-per-task=1 --gpu-bind=per_task:1 apptainer exec --nv x.sif")
    assert step.endswith("env OMP_NUM_THREADS=10 python hvd.py") and "torchrun" not in step
    site: dict = {}
    with pytest.raises(UsageError, match="does not take --torchrun"):
        job_from_flags(JobFlags(["x"], "i.sif", "i", task_per_gpu=True, torchrun=True), slurm_site(site))
    with pytest.raises(UsageError, match="--max-restarts: torchrun restarts"):
        job_from_flags(JobFlags(["x"], "i.sif", "i", max_restarts=2, torchrun=False), slurm_site(site))
    restart = job_from_flags(JobFlags(["t.py"], "i.sif", "i", gpus=1, max_restarts=3), slurm_site(site))
    assert "torchrun --standalone --nproc-per-node=1 --max-restarts=3 t.py" in step_line(sbatch_script(restart))
    requeued = sbatch_script(job_from_flags(JobFlags(["t.py"], "i.sif", "i", gpus=2, requeue=True), slurm_site(site)))
    for line in (
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@300",
        "trap requeue USR1",
        'export SNAPSHOT_DIR="$SLURM_SUBMIT_DIR/snapshots"',
    ):
        assert line in requeued.splitlines()
    assert '--bind "$SLURM_SUBMIT_DIR/snapshots:$SLURM_SUBMIT_DIR/snapshots"' in step_line(requeued)
    for bad in ("$LOCAL_SCRATCH/snaps", "/tmp/x", "$TMPDIR", "rel/path", "/a b", "/x:/y", "/x;rm -rf ~", "$(id)"):
        with pytest.raises(UsageError, match="--snapshot-dir"):
            job_from_flags(JobFlags(["t.py"], "i.sif", "i", requeue=True, snapshot_dir=bad), slurm_site(site))


def fake_nvidia_smi(bin_dir: Path) -> None:
    """The one fake here: a GPU's nvidia-smi (this machine has none), answering the sampler's query."""
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text("#!/bin/sh\nwhile :; do printf '0, 87, 30000\\n1, 45, 12000\\n'; sleep 1; done\n")
    tool.chmod(0o755)


@pytest.mark.engine
@pytest.mark.slurm
def test_one_task_per_gpu_on_two_real_nodes_each_container_sees_its_own_gpu(slurm, testbed, tmp_path, monkeypatch):
    """Issues 18 items 1 and 10 on the bed's real Slurm: 2 nodes x 2 tasks, the docker runtime; each
    container sees exactly its task's GPU (as the nvidia runtime reads it), runs as the caller, with the
    job's variables; the job's end prints the GPU use sampled on each node."""
    monkeypatch.setenv("SLURM_CONF", slurm)
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    config = tmp_path / "config.yaml"
    config.write_text("run: {gpu_flag: env}\n")  # the bed's engine has no GPU runtime: the variable form
    monkeypatch.setenv("IMGBUILD_CONFIG", str(config))
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    # `$VAR` in a command expands in the job script (`--data '$LOCAL_SCRATCH/set'`); `\\$` inside the container
    show = r"echo task=\$SLURM_PROCID local=\$SLURM_LOCALID gpus=\$NVIDIA_VISIBLE_DEVICES uid=\$(id -u) omp=\$OMP_NUM_THREADS"
    res = run_cli(
        "slurm", image, "--runtime", "docker", "--gpus", "2", "--nodes", "2", "--task-per-gpu", "--cpus-per-gpu", "1",
        "--gpu-type", "v100", "--output", str(tmp_path / "out-%j.txt"), "--submit", "--", "sh", "-c", show,
        cwd=tmp_path,
    )  # fmt: skip
    assert res.code == 0, res.err
    job_id = res.out.split()[-1]
    state = wait_for(job_id, slurm)
    output = (tmp_path / f"out-{job_id}.txt").read_text()
    assert state == "COMPLETED", output[-3000:]
    tasks = sorted(line for line in output.splitlines() if line.startswith("task="))
    assert tasks == [
        f"task=0 local=0 gpus=0 uid={os.getuid()} omp=1",
        f"task=1 local=1 gpus=1 uid={os.getuid()} omp=1",
        f"task=2 local=0 gpus=0 uid={os.getuid()} omp=1",
        f"task=3 local=1 gpus=1 uid={os.getuid()} omp=1",
    ], output[-3000:]
    assert "imgbuild: GPU use of job" in output
    summary = [line.split() for line in output.splitlines() if re.fullmatch(r"node[12] [01] \d+ \d+ \d+ \d+", line)]
    assert {(node, gpu) for node, gpu, *_ in summary} == {
        ("node1", "0"),
        ("node1", "1"),
        ("node2", "0"),
        ("node2", "1"),
    }
    assert all(int(n) >= 1 and (mean, top) in (("87", "87"), ("45", "45")) for _, _, n, mean, top, _ in summary)


@pytest.mark.engine
@pytest.mark.slurm
def test_requeue_stops_the_step_before_the_time_limit_and_the_job_resumes(slurm, testbed, tmp_path, monkeypatch):
    """The fault-tolerance take-over on the real Slurm: the step gets SIGTERM ahead of the limit, writes
    its snapshot to persistent storage, the job is requeued and the second start finds the snapshot."""
    monkeypatch.setenv("SLURM_CONF", slurm)
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    train = (
        'if [ -f "$SNAPSHOT_DIR/step" ]; then echo "resumed from step $(cat $SNAPSHOT_DIR/step) '
        'restart=$SLURM_RESTART_COUNT"; exit 0; fi; '
        'trap \'echo 41 > "$SNAPSHOT_DIR/step"; echo "snapshot written"; exit 0\' TERM; '
        "echo training; while :; do sleep 1; done"
    )
    res = run_cli(
        "slurm", image, "--runtime", "docker", "--gpus", "0", "--cpus", "1", "--time", "1", "--requeue",
        "--signal-lead", "55", "--output", str(tmp_path / "out-%j.txt"), "--submit", "--", "sh", "-c", train,
        cwd=tmp_path,
    )  # fmt: skip
    assert res.code == 0, res.err
    job_id = res.out.split()[-1]
    try:
        state = wait_for(job_id, slurm, timeout=300)  # Slurm holds a requeued job about 2 minutes
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    output = (tmp_path / f"out-{job_id}.txt").read_text()
    assert state == "COMPLETED", output[-3000:]
    assert "training" in output and "snapshot written" in output, output[-3000:]
    assert "requeueing job" in output and "resumed from step 41 restart=1" in output, output[-3000:]
    assert (tmp_path / "snapshots" / "step").read_text().strip() == "41"


def test_stage_a_folder_packs_it_once_and_repacks_only_when_it_changes(tmp_path):
    """The `--stage DIR` take-over: the tar is built by imgbuild, once per state of the folder."""
    import tarfile

    data = tmp_path / "imagenet-mini"
    (data / "train").mkdir(parents=True)
    (data / "train" / "a.jpg").write_bytes(b"\xff\xd8" + b"x" * 1000)
    (data / "labels.csv").write_text("a.jpg,cat\n")
    (data / "link").symlink_to("labels.csv")
    first = run_cli("slurm", "x.sif", "--stage", str(data), "--", "python", "t.py", cwd=tmp_path)
    assert first.code == 0, first.err
    tars = list((tmp_path / ".imgbuild-stage").glob("imagenet-mini-*.tar"))
    assert len(tars) == 1 and f"packed {tars[0]}: the job sees it as $LOCAL_SCRATCH/imagenet-mini" in first.err
    assert f'tar xf {tars[0]} -C "$LOCAL_SCRATCH"' in first.out
    with tarfile.open(tars[0]) as tar:
        names = sorted(tar.getnames())
        assert names == [
            "imagenet-mini",
            "imagenet-mini/labels.csv",
            "imagenet-mini/link",
            "imagenet-mini/train",
            "imagenet-mini/train/a.jpg",
        ]
        assert tar.getmember("imagenet-mini/link").issym()
    made = tars[0].stat().st_mtime_ns
    again = run_cli("slurm", "x.sif", "--stage", str(data), "--", "python", "t.py", cwd=tmp_path)
    assert again.code == 0 and f"reusing {tars[0]}" in again.err and tars[0].stat().st_mtime_ns == made
    (data / "labels.csv").write_text("a.jpg,dog\n")
    changed = run_cli("slurm", "x.sif", "--stage", str(data), "--", "python", "t.py", cwd=tmp_path)
    now = list((tmp_path / ".imgbuild-stage").glob("imagenet-mini-*.tar"))
    assert changed.code == 0 and len(now) == 1 and now != tars  # a new tar; the stale one removed
    assert not list((tmp_path / ".imgbuild-stage").glob(".*partial"))
    plain = run_cli("slurm", "x.sif", "--stage", "/scratch/p/set.tar", "--", "python", "t.py", cwd=tmp_path)
    assert "tar xf /scratch/p/set.tar" in plain.out


def test_a_staged_tar_is_written_whole_beside_a_link_and_a_failed_pack_leaves_nothing(tmp_path, monkeypatch):
    """The packed tar is written as every whole file is: a dangling link planted at its name is replaced, never
    written through, and a pack that fails midway leaves no tar and no partial file in the stage folder."""
    import tarfile

    from imgbuild.clusters.jobs import pack_dataset
    from imgbuild.errors import EnvironmentProblem

    data, into = tmp_path / "set", tmp_path / "stage"
    data.mkdir()
    (data / "a.txt").write_text("a\n")
    target, made = pack_dataset(data, into)
    assert made
    target.unlink()
    victim = tmp_path / "victim.tar"
    target.symlink_to(victim)
    assert pack_dataset(data, into) == (target, True)
    assert not victim.exists() and not target.is_symlink() and tarfile.is_tarfile(target)

    target.unlink()

    def fails(self, *args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(tarfile.TarFile, "add", fails)
    with pytest.raises(EnvironmentProblem, match="cannot write"):
        pack_dataset(data, into)
    assert os.listdir(into) == []


@pytest.mark.parametrize(
    ("typed", "under_torchrun", "alone"),
    [
        (["python3", "train.py", "--lr", "1"], ["train.py", "--lr", "1"], ["python3", "train.py", "--lr", "1"]),
        (["python", "-m", "pkg.train"], ["-m", "pkg.train"], ["python", "-m", "pkg.train"]),
        (["/usr/bin/python3.12", "t.py"], ["t.py"], ["/usr/bin/python3.12", "t.py"]),
        (["train.py", "--x"], ["train.py", "--x"], ["python3", "train.py", "--x"]),
        (["bash", "run.sh"], ["--no-python", "bash", "run.sh"], ["bash", "run.sh"]),
        (["python3", "-u", "t.py"], ["--no-python", "python3", "-u", "t.py"], ["python3", "-u", "t.py"]),
        (["./bin/trainer"], ["--no-python", "./bin/trainer"], ["./bin/trainer"]),
    ],
)
def test_the_command_a_user_types_works_at_one_gpu_and_at_many(typed, under_torchrun, alone):
    """`-- python3 train.py` became `torchrun ... python3 train.py` ("can't open file
    '/workspace/python3'"), and a bare script was not found at one GPU: no one command worked at both sizes."""
    from imgbuild.clusters.launch import alone_command, torchrun_command

    assert torchrun_command(typed) == under_torchrun
    assert alone_command(typed) == alone


@pytest.mark.parametrize(
    ("bind", "docker"),
    [
        ("/scratch", "/scratch:/scratch"),
        ("/data:ro", "/data:/data:ro"),
        ("/projappl:/projappl:ro", "/projappl:/projappl:ro"),
        ("/a:/b", "/a:/b"),
    ],
)
def test_a_site_bind_is_a_bind_for_docker_never_an_anonymous_volume(bind, docker):
    """`binds: [/scratch]` became `-v /scratch`, an anonymous volume --rm deleted with the job's data."""
    from imgbuild.engine.noderun import bind_pair

    assert bind_pair(bind) == docker
    line = step_line(sbatch_script(JobSpec(["true"], "img:1", runtime="docker", gpus=0, binds=[bind])))
    assert f"-v {docker}" in line


@pytest.mark.parametrize(
    ("image", "enroot"),
    [
        ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io#nvidia/pytorch:24.05-py3"),
        ("registry.lab:5000/lab/research:1", "registry.lab:5000#lab/research:1"),
        ("localhost/x:1", "localhost#x:1"),
        ("lab/research:1", "lab/research:1"),
        ("nvcr.io#nvidia/pytorch:24.05-py3", "nvcr.io#nvidia/pytorch:24.05-py3"),
        ("/scratch/p/images/research.sqsh", "/scratch/p/images/research.sqsh"),
    ],
)
def test_pyxis_gets_enroots_registry_hash_form(image, enroot):
    """`--container-image=nvcr.io/nvidia/...` is looked up on Docker Hub by enroot."""
    line = step_line(sbatch_script(JobSpec(["python3", "t.py"], image, runtime="pyxis")))
    assert f"--container-image={enroot} " in line


@pytest.mark.parametrize(
    ("image", "local", "runs"),
    [
        ("root/pytorch-research:24.05", True, "{dir}/pytorch-research_24.05.sqsh"),  # only this engine has it
        ("registry.lab:5000/lab/research:1", True, "registry.lab:5000#lab/research:1"),  # pushed where nodes pull
        ("nvcr.io/nvidia/pytorch:24.05-py3", False, "nvcr.io#nvidia/pytorch:24.05-py3"),
        ("ubuntu:24.04", False, "ubuntu:24.04"),  # enroot's docker form: Docker Hub
    ],
)
def test_pyxis_runs_a_recipes_local_image_from_the_squashfs_export_writes(tmp_path, image, local, runs):
    """`slurm RECIPE --runtime pyxis` named `root/pytorch-research:24.05`, an image only this
    machine's engine has. A recipe's image with no registry runs from the .sqsh `export --sqsh` writes in the
    site's image folder, checked before the job is queued, with the command that writes it."""
    from imgbuild.clusters.jobs import check_image_present

    site = {"runtime": "pyxis", "sif_dir": str(tmp_path)}
    job = job_from_flags(JobFlags(["python3", "t.py"], image, "research", local_image=local), slurm_site(site))
    expected = runs.format(dir=tmp_path)
    assert f"--container-image={expected} " in step_line(sbatch_script(job))
    if expected.endswith(".sqsh"):
        with pytest.raises(UsageError) as missing:
            check_image_present(job)
        assert f"imgbuild export RECIPE --sqsh {expected}" in str(missing.value)
        Path(expected).write_bytes(b"hsqs")
        check_image_present(job)


def test_requeue_needs_a_time_limit_longer_than_its_signal_lead():
    """--time 00:04:00 --requeue was signalled at once and requeued with no work done."""
    with pytest.raises(UsageError, match="no longer than the signal lead"):
        job_from_flags(JobFlags(["t"], "x.sif", "x", time="00:04:00", requeue=True), slurm_site({}))
    with pytest.raises(UsageError, match="no longer than the signal lead"):
        job_from_flags(
            JobFlags(["t"], "x.sif", "x", time="5", requeue=True), slurm_site({})
        )  # Slurm's bare number: minutes
    assert job_from_flags(JobFlags(["t"], "x.sif", "x", time="1-00:00", requeue=True), slurm_site({})).requeue

    # a lead Slurm cannot hold (16 bits) is refused where it is typed, not by sbatch at submission
    from click.testing import CliRunner

    from imgbuild.cli import cli

    done = CliRunner().invoke(cli, ["slurm", "x.sif", "--requeue", "--signal-lead", "65536", "--", "t.py"])
    assert done.exit_code == 2 and "--signal-lead" in done.output and "65535" in done.output
    # no limit at all (sbatch takes 0 and -1 as none): nothing to requeue before
    for unlimited in ("unlimited", "Infinite", "-1", "0"):
        assert job_from_flags(JobFlags(["t"], "x.sif", "x", time=unlimited, requeue=True), slurm_site({})).requeue


def _slurm_library():
    import ctypes
    import glob

    found = glob.glob("/usr/lib/*/slurm-wlm/libslurmfull.so") + glob.glob("/usr/lib*/slurm/libslurmfull.so")
    return ctypes.CDLL(found[0]) if found else None


@pytest.fixture(scope="module")
def slurm_time_str2mins(request):
    """Slurm's own time parser, `slurm_time_str2mins` of libslurmfull (what sbatch's --time runs): from the Slurm
    installed here, else the one the bed installs (tests/testbed/slurm-up)."""
    import ctypes

    library = _slurm_library()
    if library is None:
        request.getfixturevalue("slurm")
        library = _slurm_library()
    assert library is not None, "no libslurmfull.so after tests/testbed/slurm-up"
    parse = library.slurm_time_str2mins
    parse.argtypes, parse.restype = [ctypes.c_char_p], ctypes.c_int
    return lambda text: parse(text.encode())


#: Slurm's answers that sbatch takes as no limit (INFINITE, and 0: "no time limit be imposed").
SLURM_INFINITE = (-1, 0)


@pytest.mark.slurm
@hypothesis_settings(max_examples=120, derandomize=True, deadline=None, database=None)
@given(
    text=st.one_of(
        st.lists(st.sampled_from(["0", "1", "7", "30", "59", "60", "99", "1234", ":", "-"]), max_size=6)
        .map("".join)
        .filter(lambda text: all(len(field) <= 4 for field in re.split("[-:]", text))),
        st.sampled_from(["UNLIMITED", "unlimited", "Infinite", "-1", "1-", "00:30", "1:5:0", "1-1:", "-5", " 60"]),
    )
)
def test_a_time_limit_is_taken_exactly_where_slurm_takes_it_and_read_as_slurm_reads_it(text, slurm_time_str2mins):
    """Every time the site config and --time take, sbatch takes, in the same minutes (seconds rounded up; none for
    UNLIMITED, INFINITE, -1 and 0), and every one Slurm refuses is refused (up to 4 digits a field)."""
    from imgbuild.config.slurmtime import SLURM_TIME_RE, slurm_minutes

    slurms = slurm_time_str2mins(text)
    if slurms < 0 and slurms not in SLURM_INFINITE:
        assert not SLURM_TIME_RE.fullmatch(text), (text, slurms)
        return
    assert SLURM_TIME_RE.fullmatch(text), (text, slurms)
    assert slurm_minutes(text) == (None if slurms in SLURM_INFINITE else slurms), text


@pytest.mark.parametrize(
    ("per_gpu", "gpus", "mem"), [("7.5G", 3, "23040M"), ("7.5G", 2, "15G"), ("16000M", 4, "64000M")]
)
def test_memory_is_written_in_whole_units_slurm_reads(per_gpu, gpus, mem):
    """7.5G x 3 rendered --mem=22.5G, which Slurm rejects."""
    from imgbuild.clusters.jobs import slurm_mem

    assert slurm_mem(per_gpu, gpus) == mem


def test_an_unknown_gpu_type_is_refused_where_the_site_lists_its_types():
    """--gpu-type h100 on a V100-only site rendered --gres=gpu:h100:8."""
    site = {"gpu_types": {"v100": "v100", "a100": "a100_40g"}}
    with pytest.raises(UsageError, match="this site has a100, v100"):
        job_from_flags(JobFlags(["t"], "x.sif", "x", gpu_type="h100"), slurm_site(site))
    assert job_from_flags(JobFlags(["t"], "x.sif", "x", gpu_type="a100"), slurm_site(site)).gpu_type == "a100_40g"


def test_a_recipes_image_is_never_pulled_from_docker_hub(tmp_path):
    """A recipe's `<user>/<name>:<tag>` missing on a node was pulled from docker.io, a namespace
    the site does not control."""
    from tests.conftest import run_cli

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: research\nbase: {framework: pytorch, tag: "24.05"}\n')
    job = run_cli("slurm", str(recipe), "--runtime", "docker", "--", "python3", "t.py", cwd=tmp_path)
    assert job.code == 0, job.err
    assert "docker run --rm --sig-proxy=false --pull never" in job.out
    plain = run_cli("slurm", "nvcr.io/nvidia/pytorch:24.05-py3", "--runtime", "docker", "--", "true", cwd=tmp_path)
    assert "--pull never" not in plain.out
    run = run_cli("run", "--dry-run", str(recipe), "--", "true", cwd=tmp_path)
    assert run.code == 0 and "--pull never" in run.out, run.err
    assert "--pull never" not in run_cli("run", "--dry-run", "ubuntu:22.04", "--", "true", cwd=tmp_path).out


def test_the_usage_sampler_does_not_inherit_one_gpu_per_task():
    """sbatch exports SLURM_GPUS_PER_TASK and srun reads it back: in --task-per-gpu jobs the sampler
    step asked for one GPU per node."""
    script = sbatch_script(JobSpec(["python", "hvd.py"], "x.sif", gpus=4, task_per_gpu=True))
    sampler = next(line for line in script.splitlines() if "srun --overlap" in line)
    assert sampler.startswith("env -u SLURM_GPUS_PER_TASK srun --overlap")


def test_a_stock_image_gets_a_writable_home_and_a_missing_mount_source_is_refused(tmp_path, monkeypatch):
    """A stock image run as the caller had HOME=/ (not writable: pip --user, ~/.cache
    failed); a site mount whose folder did not exist yet was created by dockerd as root."""
    import json

    from imgbuild.engine.fake import FakeEngine
    from imgbuild.servers.run import prepare, start_detached
    from imgbuild.servers.runwords import RunRequest

    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": []}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    site = tmp_path / "site.yaml"
    site.write_text(f"run: {{mounts: ['{tmp_path}/work/{{user}}:/work/{{user}}']}}\n")
    use_site_config(monkeypatch, str(site))
    spec = prepare(RunRequest("nvcr.io/nvidia/pytorch:24.05-py3", ["true"]), load_settings({}), gpus=[])
    assert "HOME=/tmp/home" in spec.env
    own = prepare(RunRequest("x:1", ["true"], env=["HOME=/data/me"]), load_settings({}), gpus=[])
    assert "HOME=/tmp/home" not in own.env  # the user's own -e wins
    with pytest.raises(UsageError, match=r"mount .*/work/.*: no such folder on this host; docker would create it"):
        start_detached(FakeEngine(), spec)


def test_a_sif_carries_no_empty_labels_and_a_job_leaves_no_usage_folder():
    """`export --apptainer` wrote empty base labels over the built image's real ones; every job
    left an imgbuild-usage-<jobid>/ folder in the submit directory."""
    plan = plan_of(ROOT / "recipes/pytorch-research.yaml")
    labels = section(apptainer_definition(plan, "docker-daemon"), "%labels")
    assert labels and all(len(line.split(None, 1)) == 2 for line in labels)
    script = sbatch_script(JobSpec(["python3", "t.py"], "x.sif", gpus=2))
    assert 'rm -rf "$usage_dir"' in script.split("imgbuild: GPU use of job", 1)[1]


def test_a_job_without_gpus_goes_to_the_sites_cpu_partition():
    """CPU-only jobs went to the site's GPU partition, holding a GPU node's CPUs."""
    site = {"partition": "gpu", "cpu_partition": "small"}
    cpu = sbatch_script(job_from_flags(JobFlags(["true"], "i.sif", "i", gpus=0), slurm_site(site)))
    gpu = sbatch_script(job_from_flags(JobFlags(["true"], "i.sif", "i", gpus=1), slurm_site(site)))
    named = sbatch_script(job_from_flags(JobFlags(["true"], "i.sif", "i", gpus=0, partition="test"), slurm_site(site)))
    assert "#SBATCH --partition=small" in cpu and "#SBATCH --partition=gpu" in gpu
    assert "#SBATCH --partition=test" in named  # the user's own --partition wins
    plain = sbatch_script(job_from_flags(JobFlags(["true"], "i.sif", "i", gpus=0), slurm_site({"partition": "gpu"})))
    assert "#SBATCH --partition=gpu" in plain  # a site with one partition: that one


def test_an_oci_bundle_is_made_a_cluster_jobs():
    """umoci's config has the container's own network, hostname, PID and IPC namespaces and a
    64 MB /dev/shm; a cluster job needs the node's (torchrun, NCCL, shared memory), the binds, and the image's
    search paths kept aside from the job's environment that Slurm puts over them."""
    from imgbuild.clusters.oci import cluster_config

    umoci = {
        "process": {"terminal": True, "env": ["PATH=/usr/local/cuda/bin:/usr/bin", "HOME=/root"]},
        "hostname": "umoci-default",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["size=65536k"]},
        ],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "user")]},
    }
    config = cluster_config(umoci, ["/scratch", "/data:/d:ro"])
    assert [ns["type"] for ns in config["linux"]["namespaces"]] == ["mount", "user"]
    assert "hostname" not in config and config["process"]["terminal"] is False
    by_destination = {m["destination"]: m for m in config["mounts"]}
    assert by_destination["/dev/shm"] == {
        "destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind", "rw"]
    }  # fmt: skip
    assert by_destination["/d"]["source"] == "/data" and by_destination["/d"]["options"] == ["rbind", "ro"]
    assert by_destination["/scratch"]["source"] == "/scratch" and "/tmp" in by_destination
    assert by_destination["/etc/hosts"]["options"] == ["rbind", "ro"] and by_destination["/proc"]["type"] == "proc"
    assert "IMGBUILD_IMAGE_PATH=/usr/local/cuda/bin:/usr/bin" in config["process"]["env"]
    assert "IMGBUILD_IMAGE_LD_LIBRARY_PATH=" in config["process"]["env"]
    assert cluster_config(config, [])["process"]["env"].count("IMGBUILD_IMAGE_PATH=/usr/local/cuda/bin:/usr/bin") == 1


def test_the_oci_runtime_takes_its_folders_from_the_bundle(tmp_path, monkeypatch):
    step = step_line(sbatch_script(JobSpec(["python3", "t.py"], "/b/x.oci", gpus=2, runtime="oci")))
    assert step.startswith("srun --cpus-per-task=20 --container=/b/x.oci sh -c ")
    assert step.endswith('imgbuild "$PWD" -- env OMP_NUM_THREADS=10 torchrun --standalone --nproc-per-node=2 t.py')
    with pytest.raises(UsageError, match="fixed when it is written: imgbuild export RECIPE --oci DIR --bind"):
        job_from_flags(JobFlags(["t.py"], "/b/x.oci", "x", runtime="oci", binds=["/data"]), slurm_site({}))
    job = job_from_flags(JobFlags(["t.py"], "lab/x:1", "x", runtime="oci"), slurm_site({"sif_dir": "/proj/images"}))
    assert job.image == "/proj/images/x_1.oci"
    with pytest.raises(UsageError, match="no OCI bundle here; write it with `imgbuild export RECIPE --oci DIR`"):
        check_image_present(job)
    (tmp_path / "ok.oci").mkdir()
    (tmp_path / "ok.oci" / "config.json").write_text("{}")
    check_image_present(
        job_from_flags(JobFlags(["t.py"], str(tmp_path / "ok.oci"), "x", runtime="oci"), slurm_site({}))
    )


@pytest.mark.parametrize(
    "bind", ["data", "/data:relative", "/a:/b:rw", "/da\u202eta", "/data\n", "/a,b", "/data:/d:ro:x", "/x y"]
)
def test_export_oci_refuses_a_bind_that_is_not_a_folder_mount(bind, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: dev\nbase: {framework: pytorch, tag: "24.05"}\n')
    res = run_cli("export", str(recipe), "--oci", str(tmp_path / "b.oci"), "--bind", bind)
    assert res.code == 2 and "--bind" in res.err and "Traceback" not in res.err, res.err
    assert not (tmp_path / "b.oci").exists()


def test_export_oci_without_skopeo_or_umoci_is_an_environment_problem(tmp_path, monkeypatch):
    from imgbuild.clusters.oci import export_bundle
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.errors import EnvironmentProblem

    monkeypatch.setenv("PATH", str(tmp_path))  # neither tool
    with pytest.raises(EnvironmentProblem, match="needs skopeo and umoci"):
        export_bundle("lab/x:1", tmp_path / "b.oci", [], FakeEngine(), 60)


def test_enroots_files_follow_its_image_format_and_never_write_through_a_link(tmp_path):
    from imgbuild.clusters.oci import _write_inside, enroot_files

    files = enroot_files(
        {
            "Env": ["PATH=/usr/bin", "A=b c"],
            "WorkingDir": "/work space",
            "Entrypoint": ["/entry.sh"],
            "Cmd": ["python3", "-c", "print('x')"],
            "Volumes": {"/data": {}},
            "Labels": {"org.example": "v"},
        }
    )
    assert files["etc/environment"] == "PATH=/usr/bin\nA=b c\n"
    assert files["etc/fstab"] == "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n"
    rc = files["etc/rc"]
    assert "cd '/work space' && unset OLDPWD || exit 1" in rc and '    exec /entry.sh "$@"' in rc
    assert "    exec /entry.sh python3 -c 'print('\"'\"'x'\"'\"')'" in rc and rc.startswith("# org.example v\n")
    assert subprocess.run(["sh", "-n"], input=rc, text=True).returncode == 0
    assert "exec /bin/sh" in enroot_files({})["etc/rc"]  # nothing to run: a shell, as enroot does
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    outside = tmp_path / "host-etc"
    outside.mkdir()
    (rootfs / "etc").symlink_to(outside)
    with pytest.raises(UsageError, match="is a link out of the image"):
        _write_inside(rootfs, "etc/rc", "x")
    assert list(outside.iterdir()) == []


def test_the_docker_steps_script_keeps_every_bind_as_written():
    """The step's script was joined with '; ' and then '&;' replaced by '&': a bind holding '&;' lost its ';'."""
    line = step_line(sbatch_script(JobSpec(["true"], "img:1", runtime="docker", gpus=0, binds=["/d&;x"])))
    assert "/d&;x:/d&;x" in line and "/d&x" not in line


@pytest.mark.parametrize("kind", ["oci", "sqsh"])
def test_export_never_writes_through_a_link_at_its_target(kind, tmp_path, monkeypatch):
    """A dangling symbolic link at the folder or file to write is refused like an existing one (mksquashfs and
    umoci would write where it points)."""
    from imgbuild.clusters.oci import export_bundle, export_sqsh
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.engine.types import ImageInfo

    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("skopeo", "umoci", "mksquashfs"):
        (tools / tool).write_text("#!/bin/sh\nexit 1\n")
        (tools / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(tools))
    link = tmp_path / f"out.{kind}"
    link.symlink_to(tmp_path / "elsewhere")
    engine = FakeEngine()
    engine.images.add("sha256:x", ImageInfo("sha256:x", {}, {}), "lab/x:1")
    with pytest.raises(UsageError, match="already there"):
        if kind == "oci":
            export_bundle("lab/x:1", link, [], engine, 60)
        else:
            export_sqsh("lab/x:1", link, engine, 60)
    assert not (tmp_path / "elsewhere").exists()


def _fake_oci_tools(folder: Path) -> None:
    """skopeo that does nothing, and an umoci that writes its own config, says so, then takes its time."""
    folder.mkdir()
    (folder / "skopeo").write_text("#!/bin/sh\nexit 0\n")
    (folder / "umoci").write_text(
        '#!/bin/sh\nfor a; do last=$a; done\nmkdir -p "$last/rootfs"\n'
        'echo \'{"process": {"terminal": true}, "hostname": "umoci"}\' > "$last/config.json"\n'
        'touch "$MARK"\nsleep "${UMOCI_SLEEP:-0}"\ntouch "$last/finished"\n'
    )
    for tool in ("skopeo", "umoci"):
        (folder / tool).chmod(0o755)


EXPORT = """
import sys
from pathlib import Path
from imgbuild.clusters.oci import export_bundle
from imgbuild.engine.fake import FakeEngine
engine = FakeEngine()
engine.add_image("lab/x:1")
export_bundle("lab/x:1", Path(sys.argv[1]), ["/scratch"], engine, 60)
"""


def test_a_killed_oci_export_leaves_no_bundle_and_the_next_one_sweeps_its_work(tmp_path):
    """SIGKILL during umoci left a bundle umoci finished with its own config (own namespaces, a
    terminal, no /tmp bind) that the next export called 'already there', and a 332 MB work folder."""
    import signal
    import sys

    _fake_oci_tools(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "MARK": str(tmp_path / "mark")}
    out = tmp_path / "b.oci"
    proc = subprocess.Popen(
        [sys.executable, "-c", EXPORT, str(out)], env={**env, "UMOCI_SLEEP": "3"}, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "mark").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "mark").exists(), proc.stderr.read() if proc.poll() is not None else "umoci never ran"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(4)  # past the fake umoci's sleep: had it lived on, it would have finished its bundle
    assert not out.exists() and not out.is_symlink()
    left = list(tmp_path.glob(".imgbuild-oci-*"))
    assert len(left) == 1 and not list(left[0].rglob("finished")), left  # umoci died with its parent
    done = subprocess.run([sys.executable, "-c", EXPORT, str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob(".imgbuild-oci-*"))  # the orphan's work folder swept, this one's removed
    config = json.loads((out / "config.json").read_text())
    assert config["process"]["terminal"] is False and "hostname" not in config  # the cluster's config, not umoci's
    assert "/scratch" in {m["destination"] for m in config["mounts"]}


def test_a_cdi_site_hands_the_docker_step_its_gpus_by_cdi_name(tmp_path):
    """`gpu_flag: cdi` (a CDI-only host) gives the docker runtime's step
    `--device nvidia.com/gpu=N` for each GPU of the step, read on the node as --gpus is."""
    from imgbuild.engine.noderun import NodeRun, docker_prefix

    argv = docker_prefix(NodeRun("img", gpus=2, gpu_flag="cdi"))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text('#!/bin/sh\nprintf "%s\\n" "$@" >> "$OUT"\n')
    (fake / "docker").chmod(0o755)
    out = tmp_path / "argv.txt"
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(out), "SLURM_STEP_GPUS": "0,2", "SLURM_JOB_ID": "7"}
    done = subprocess.run([*argv, "python", "t.py"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    words = out.read_text().splitlines()
    run = words[: words.index("python")] if "python" in words else words
    assert [w for w in run if w.startswith("nvidia.com/gpu=")] == ["nvidia.com/gpu=0", "nvidia.com/gpu=2"], run
    assert run.count("--device") == 2 and "--gpus" not in run


def test_an_oci_bundle_is_read_only_to_its_jobs_with_a_scratch_workspace_and_each_bind_once():
    """A bundle on shared storage is run by every job on every node: none may write into it (a recipe's
    TORCH_HOME=/workspace/.cache/torch had written into rootfs/); an empty /workspace is each job's own tmpfs, and a
    folder given both by the site and by --bind is mounted once, the last given."""
    from imgbuild.clusters.oci import cluster_config

    config = cluster_config({"process": {"env": []}}, ["/data:/d:ro", "/data:/d"], ("/workspace",))
    assert config["root"]["readonly"] is True
    mounts = [m for m in config["mounts"] if m["destination"] == "/d"]
    assert mounts == [{"destination": "/d", "type": "bind", "source": "/data", "options": ["rbind", "rw"]}]
    (workspace,) = [m for m in config["mounts"] if m["destination"] == "/workspace"]
    assert workspace["type"] == "tmpfs" and "mode=1777" in workspace["options"] and "nosuid" in workspace["options"]
    assert not [m for m in cluster_config({}, [])["mounts"] if m["destination"] == "/workspace"]  # not empty: kept


def test_the_oci_step_gives_a_job_without_a_home_a_private_one_never_a_fixed_name(tmp_path):
    """The job's HOME is a host path the bundle lacks: the step makes one with mktemp (a co-user cannot plant it)."""
    import subprocess

    from imgbuild.clusters.slurm import _OCI_STEP

    job = tmp_path / "job"
    job.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent/alice"}
    done = subprocess.run(
        ["sh", "-c", _OCI_STEP, "imgbuild", str(job), "--", "sh", "-c", 'echo "$HOME"; touch "$HOME/ok"; pwd'],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    home, cwd = done.stdout.split()
    assert done.returncode == 0 and home.startswith("/tmp/imgbuild-home-") and cwd == str(job)
    assert (Path(home) / "ok").exists() and oct(Path(home).stat().st_mode & 0o777) == "0o700"
    Path(home, "ok").unlink()
    Path(home).rmdir()
    kept = subprocess.run(["sh", "-c", _OCI_STEP, "imgbuild", str(job), "--", "sh", "-c", 'echo "$HOME"'],
                          capture_output=True, text=True, env={**env, "HOME": str(tmp_path)})  # fmt: skip
    assert kept.stdout.strip() == str(tmp_path)  # a writable HOME the job has is kept


def test_a_site_names_its_fabric_for_the_rendezvous_and_the_sockets_as_juwels_does(tmp_path):
    """The rendezvous host is the node's InfiniBand name (the hostname and `i`, as JSC's own job
    templates write MASTER_ADDR), and NCCL's and Gloo's sockets use ib0: both as site settings."""
    site = {"rdzv_host_suffix": "i", "socket_ifname": "ib0"}
    job = job_from_flags(JobFlags(["python3", "train.py"], "x.sif", "x", gpus=4, nodes=2), slurm_site(site))
    script = sbatch_script(job)
    assert 'head_node="${head_node}i"' in script and "NodeAddr" not in script
    assert "export NCCL_SOCKET_IFNAME=ib0 GLOO_SOCKET_IFNAME=ib0" in script
    assert "--rdzv-endpoint=$head_node:$rdzv_port" in script
    path = tmp_path / "job.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    plain = sbatch_script(
        job_from_flags(JobFlags(["python3", "train.py"], "x.sif", "x", gpus=4, nodes=2), slurm_site({}))
    )
    assert "NodeAddr" in plain and "SOCKET_IFNAME" not in plain  # without them, Slurm's NodeAddr as before


@pytest.mark.parametrize(
    "key, value",
    [
        ("rdzv_host_suffix", "i; rm -rf ~"),
        ("rdzv_host_suffix", "$(id)"),
        ("rdzv_host_suffix", "i" * 33),
        ("socket_ifname", "ib0 eth0"),
        ("socket_ifname", "ib0;reboot"),
        ("socket_ifname", "a" * 16),
        ("socket_ifname", ""),
        ("socket_ifname", "ib0\nexport X=1"),
    ],
)
def test_the_fabric_settings_are_checked_whole_before_they_reach_a_script(key, value):
    from imgbuild.config.site import SlurmSite, checked_section

    with pytest.raises(UsageError) as refused:
        checked_section(SlurmSite, "slurm", {key: value})
    assert f"slurm.{key}" in str(refused.value) and "\n" not in str(refused.value)
