"""Launch by framework and by command: TensorFlow and JAX never get torchrun; a command
that is a launcher itself is given the rendezvous, never wrapped in a second one; and every TrainJob passes the
Kubeflow Trainer's own admission rules, reimplemented here from its source:

- the CRD's CEL rule on `metadata.name` from v2.1.0: `self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')`
  (kubeflow/trainer `pkg/apis/trainer/v1alpha1/trainjob_types.go`);
- the JobSet plugin's webhook check from v2.2.0, `validation.IsDomainPrefixedPath(runtimePatches[].manager)`
  (kubeflow/trainer `pkg/runtime/framework/plugins/jobset/jobset.go`), which k8s apimachinery
  `util/validation/validation.go` defines: `host/path`, the host a DNS-1123 subdomain, the path
  `^[A-Za-z0-9/\\-._~%!$&'()*+,;=:]+$`.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from imgbuild.clusters.k8s import K8sJob, default_name, manifest
from imgbuild.clusters.launch import launcher, launches_itself
from imgbuild.clusters.slurm import JobSpec, sbatch_script
from imgbuild.config.site import K8sSite, checked_section
from imgbuild.errors import ImgbuildError, UsageError
from imgbuild.shellwords import shell_words
from tests.support import step_line

TRAINJOB_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
HTTP_PATH = re.compile(r"^[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")
IMAGE = "registry.example.org/lab/x:1@sha256:" + "a" * 64


def is_domain_prefixed_path(text: str) -> bool:
    host, sep, path = text.partition("/")
    return bool(sep and host and path and len(host) <= 253 and DNS1123_SUBDOMAIN.fullmatch(host)
                and HTTP_PATH.match(path))  # fmt: skip


@pytest.mark.parametrize(
    "command, launcher",
    [
        (["torchrun", "--nproc-per-node=2", "train.py"], True),
        (["/opt/conda/bin/torchrun", "train.py"], True),
        (["python", "-m", "torch.distributed.run", "train.py"], True),
        (["python3", "-m", "torch.distributed.launch", "train.py"], True),
        (["accelerate", "launch", "train.py"], True),
        (["deepspeed", "train.py"], True),
        (["mpirun", "-np", "4", "python", "train.py"], True),
        (["python3", "train.py"], False),
        (["python", "-m", "pkg.train"], False),
        (["bash", "run.sh"], False),
        (["train.py"], False),
        ([], False),
    ],
)
def test_a_launcher_is_known_by_its_program_or_module(command, launcher):
    assert launches_itself(command) is launcher


@pytest.mark.parametrize("framework", ["tensorflow", "jax"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_tensorflow_and_jax_get_no_torchrun(framework, nodes):
    """N16: the project's own tensorflow-keras recipe at --gpus 2 got torchrun (not in the image: exit 127).
    TensorFlow (MirroredStrategy, or SlurmClusterResolver across nodes) and JAX (jax.distributed reads Slurm's
    variables) start their own workers: one task per node, every GPU of the node visible to it."""
    job = JobSpec(["python3", "train.py"], "x.sif", gpus=2, nodes=nodes, framework=framework, cpus_per_gpu=8)
    step = step_line(sbatch_script(job))
    assert "torchrun" not in step and step.endswith("python3 train.py"), step
    assert "OMP_NUM_THREADS=16" in step  # one process per node: the whole task's CPUs


def _tf_config_of(script: str, rank: int, tmp_path, nodes: str = "node[1-2]") -> dict:
    """What one task of the job sees: the script's worker lines run by bash with Slurm's answers (two nodes,
    addresses 10.0.0.1 and 10.0.0.2), then the step's command run by sh as the task of rank `rank`."""
    import json
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\ncase "$2" in\n  hostnames) printf "node1\\nnode2\\n" ;;\n'
        '  node) echo "NodeName=$3 NodeAddr=10.0.0.${3#node} State=IDLE" ;;\nesac\n'
    )
    (bin_dir / "scontrol").chmod(0o755)
    lines = script.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("tf_port=")))
    end = lines.index("export IMGBUILD_TF_WORKERS")
    step = step_line(script)
    command = step[step.index("sh -c ") :].replace(
        "python3 train.py", "python3 -c 'import os; print(os.environ[\"TF_CONFIG\"])'"
    )
    program = "\n".join(["set -euo pipefail", *lines[start : end + 1], f"SLURM_PROCID={rank} {command}"])
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": nodes, "SLURM_JOB_ID": "77"}
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_multi_node_tensorflow_job_tells_each_task_the_cluster_in_tf_config(rank, tmp_path):
    """MultiWorkerMirroredStrategy's TF_CONFIG: every node's worker, at the node's Slurm address, each on a port of
    its own (nodes sharing an address never collide), and this task the worker whose index is its rank."""
    job = JobSpec(["python3", "train.py"], "x.sif", gpus=2, nodes=2, framework="tensorflow")
    config = _tf_config_of(sbatch_script(job), rank, tmp_path)
    workers = config["cluster"]["worker"]
    assert [w.rsplit(":", 1)[0] for w in workers] == ["10.0.0.1", "10.0.0.2"]
    ports = [int(w.rsplit(":", 1)[1]) for w in workers]
    assert ports[1] == ports[0] + 1 and 1024 <= ports[0] < 65535
    assert config["task"] == {"type": "worker", "index": rank}


def test_tensorflow_workers_follow_the_sites_fabric_name_and_a_task_per_gpu(tmp_path):
    """`slurm.rdzv_host_suffix` (JUWELS: `i`): the workers at the node's fabric name; one task per GPU: a worker each,
    ports counted across the whole job."""
    job = JobSpec(["python3", "train.py"], "x.sif", gpus=2, nodes=2, framework="tensorflow", task_per_gpu=True,
                  rdzv_host_suffix="i")  # fmt: skip
    config = _tf_config_of(sbatch_script(job), 3, tmp_path)
    hosts = [w.rsplit(":", 1)[0] for w in config["cluster"]["worker"]]
    assert hosts == ["node1i", "node1i", "node2i", "node2i"] and config["task"]["index"] == 3
    assert len({w.rsplit(":", 1)[1] for w in config["cluster"]["worker"]}) == 4


def test_one_node_tensorflow_and_pytorch_jobs_get_no_tf_config():
    for job in (
        JobSpec(["python3", "train.py"], "x.sif", gpus=2, nodes=1, framework="tensorflow"),
        JobSpec(["python3", "train.py"], "x.sif", gpus=2, nodes=2, framework="pytorch"),
        JobSpec(["python3", "train.py"], "x.sif", gpus=2, nodes=2, framework="jax"),
    ):
        assert "TF_CONFIG" not in sbatch_script(job)


@pytest.mark.parametrize(
    "gpus, nodes, per_gpu, facts",
    [
        (1, 1, False, []),  # one process, one GPU: nothing to tell JAX
        (
            4,
            1,
            False,
            ["JAX_LOCAL_DEVICE_IDS=0,1,2,3", "JAX_COORDINATOR_ADDRESS=127.0.0.1:$rdzv_port"],
        ),  # not GPU 0 alone
        (2, 1, True, ["JAX_LOCAL_DEVICE_IDS=0", "JAX_COORDINATOR_ADDRESS=127.0.0.1:$rdzv_port"]),
        (2, 2, False, ["JAX_LOCAL_DEVICE_IDS=0,1", "JAX_COORDINATOR_ADDRESS=$head_node:$rdzv_port"]),
        (2, 2, True, ["JAX_LOCAL_DEVICE_IDS=0", "JAX_COORDINATOR_ADDRESS=$head_node:$rdzv_port"]),  # its only GPU
    ],
)
def test_jax_processes_see_their_own_gpus_and_one_coordinator(gpus, nodes, per_gpu, facts):
    """jax.distributed.initialize() under Slurm gives a process the one GPU numbered as its local rank (with one
    task per node: GPU 0 of 4; with one task per GPU, each bound to its own: device 1 of 1, which does not exist)
    and a coordinator on a port derived from the job id; JAX reads JAX_LOCAL_DEVICE_IDS and
    JAX_COORDINATOR_ADDRESS first (jax/_src/distributed.py), so the job says both."""
    job = JobSpec(["python3", "train.py"], "x.sif", gpus=gpus, nodes=nodes, framework="jax", task_per_gpu=per_gpu)
    script = sbatch_script(job)
    step = step_line(script)
    assert step.endswith("python3 train.py"), step
    for fact in facts:
        assert f'"{fact}"' in step or f" {fact} " in step, step
    assert step.count("JAX_") == len(facts), step
    assert ("head_node=$(scontrol show hostnames" in script) is (nodes > 1)
    assert ("rdzv_port=$(python3" in script) is bool(facts)
    assert "torchrun" not in step and "TF_CONFIG" not in script


def test_the_docker_runtime_passes_the_slurm_facts_the_frameworks_resolvers_read():
    """TensorFlow's SlurmClusterResolver and JAX's Slurm detection read the step's variables; the docker runtime
    starts the container with an environment of its own, so each is passed by name (apptainer and pyxis pass all)."""
    step = step_line(sbatch_script(JobSpec(["python3", "train.py"], "lab/x:1", gpus=2, nodes=2, runtime="docker",
                                           framework="tensorflow")))  # fmt: skip
    for name in ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
                 "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_ID", "IMGBUILD_TF_WORKERS"):  # fmt: skip
        assert f" -e {name} " in step, name


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_launcher_command_is_passed_through_with_the_rendezvous(nodes):
    """N17: `torchrun ... train.py` became `torchrun --standalone ... torchrun ... train.py`: two trainings on the
    same GPUs. It runs as typed, told the rendezvous by the variables torchrun reads (PET_*)."""
    job = JobSpec(["torchrun", "train.py"], "x.sif", gpus=2, nodes=nodes, framework="pytorch")
    script = sbatch_script(job)
    step = step_line(script)
    assert step.count("torchrun") == 1 and step.endswith("torchrun train.py"), step
    assert "PET_NPROC_PER_NODE=2" in step
    if nodes > 1:
        assert "PET_RDZV_ENDPOINT=$head_node:$rdzv_port" in step and "PET_NNODES=$SLURM_NNODES" in step
        assert "MASTER_ADDR=$head_node" in step and "head_node=$(scontrol show hostnames" in script
    else:
        assert "PET_RDZV_ENDPOINT" not in step


LAUNCHERS = ("accelerate", "deepspeed", "torchrun", "python3")


def node_call(command: list[str], tmp_path, node: int = 0, env: dict[str, str] | None = None):
    """What the launcher at the head of a told `command` receives on node `node`, (its arguments, the PET_* and
    MASTER_* variables it sees): the command run by bash as the script and then the task run it, with a stand-in
    launcher that writes them down."""
    from imgbuild.shellwords import shell_words

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    out = tmp_path / f"argv-{node}"
    for name in LAUNCHERS:
        fake = bin_dir / name
        fake.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {out}\nenv | grep -E "^(PET|MASTER)_" > {out}.env\n')
        fake.chmod(0o755)
    run_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_NODEID": str(node),
               "SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "head_node": "10.0.0.1", "rdzv_port": "41000",
               "PET_NODE_RANK": str(node), "PET_MASTER_ADDR": "10.0.0.9", "PET_MASTER_PORT": "29400",
               **(env or {})}  # fmt: skip
    done = subprocess.run(["bash", "-c", shell_words(command)], env=run_env, capture_output=True, text=True,
                          timeout=30, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    told = dict(line.split("=", 1) for line in Path(f"{out}.env").read_text().splitlines())
    told = {k: v for k, v in told.items() if k not in ("PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")}
    return out.read_text().split("\0")[:-1], told


def node_argv(command: list[str], tmp_path, node: int = 0, env: dict[str, str] | None = None) -> list[str]:
    return node_call(command, tmp_path, node, env)[0]


def slurm_argv(words: list[str], tmp_path, gpus: int, nodes: int, node: int = 0) -> list[str]:
    return node_argv(launcher(JobSpec(words, "x.sif", gpus=gpus, nodes=nodes))[1], tmp_path, node)


def test_accelerate_launch_is_told_one_process_per_gpu_and_a_port_of_the_jobs_own(tmp_path):
    assert slurm_argv(["accelerate", "launch", "train.py", "--lr", "1"], tmp_path, gpus=2, nodes=1) == [
        "launch", "--num_processes=2", "--main_process_port=41000", "--multi_gpu", "train.py", "--lr", "1"
    ]  # fmt: skip
    alone = slurm_argv(["accelerate", "launch", "train.py"], tmp_path, gpus=1, nodes=1)
    assert alone == ["launch", "--num_processes=1", "--main_process_port=41000", "train.py"]


@pytest.mark.parametrize(
    "mode",
    [["--use_fsdp"], ["--use_deepspeed"], ["--multi_gpu"], ["--config_file", "fsdp.yaml"], ["--config_file=ds.yaml"]],
)
def test_accelerate_keeps_the_mode_the_user_chose_and_is_never_given_a_second(mode, tmp_path):
    """accelerate refuses two modes, and with a forced --multi_gpu it reads no mode from a config file."""
    argv = slurm_argv(["accelerate", "launch", *mode, "train.py"], tmp_path, gpus=4, nodes=2, node=1)
    assert argv[: argv.index(mode[0])] == [
        "launch", "--num_processes=8", "--num_machines=2", "--machine_rank=1", "--main_process_ip=10.0.0.1",
        "--main_process_port=41000", "--deepspeed_multinode_launcher=standard",
    ]  # fmt: skip
    assert argv.count("--multi_gpu") == (mode == ["--multi_gpu"]) and argv[-1] == "train.py"


def test_accelerates_own_default_config_decides_the_mode_where_the_task_finds_one(tmp_path):
    words = launcher(JobSpec(["accelerate", "launch", "train.py"], "x.sif", gpus=2))[1]
    assert "--multi_gpu" in node_argv(words, tmp_path)
    config = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("distributed_type: FSDP\n")
    assert "--multi_gpu" not in node_argv(words, tmp_path, env={"HF_HOME": str(tmp_path / "hf")})


@pytest.mark.parametrize(
    "words, refused",
    [
        (["accelerate", "launch", "--use_fsdp", "--multi_gpu", "t.py"], "one mode at a time"),
        (["accelerate", "launch", "--num_processes=2", "t.py"], "--num_processes=2: imgbuild sets it"),
        (["accelerate", "launch", "--machine_rank", "0", "t.py"], "--machine_rank=0: imgbuild sets it"),
        (["accelerate", "launch", "--deepspeed_multinode_launcher", "pdsh", "t.py"], "deepspeed_multinode_launcher"),
        (["deepspeed", "--hostfile", "h", "t.py"], "deepspeed --hostfile"),
        (["deepspeed", "--num_gpus=4", "t.py"], "deepspeed --num_gpus"),
        (["mpirun", "-np", "8", "python3", "t.py"], "mpirun across nodes.*--task-per-gpu"),
        (["horovodrun", "-np", "8", "python3", "t.py"], "horovodrun across nodes"),
        (["composer", "t.py"], "composer across nodes.*torchrun"),
        # each spelling the launcher's own parser takes: accelerate's `-` forms, deepspeed's and torchrun's aliases
        # and prefixes (argparse reads a unique prefix as the option)
        (["accelerate", "launch", "--num-processes", "3", "t.py"], "--num_processes=3: imgbuild sets it"),
        (["accelerate", "launch", "--machine-rank=0", "t.py"], "--machine_rank=0: imgbuild sets it"),
        (["accelerate", "launch", "--use-fsdp", "--multi-gpu", "t.py"], "--multi_gpu --use_fsdp: one mode"),
        (["deepspeed", "-H", "h", "t.py"], "deepspeed --hostfile"),
        (["deepspeed", "--num_accelerators=4", "t.py"], "deepspeed --num_gpus"),
        (["deepspeed", "--num_gp", "4", "t.py"], "deepspeed --num_gpus"),
        (["torchrun", "--standalone", "t.py"], "torchrun --standalone: .*each node training alone"),
        (["torchrun", "--stand", "t.py"], "torchrun --standalone"),
        (["torchrun", "--nproc_per_node=8", "t.py"], "torchrun --nproc-per-node=8: .*one process per GPU: 4"),
        (["python3", "-m", "torch.distributed.run", "--nproc", "2", "t.py"], "--nproc-per-node=2"),
        (["torchrun", "--nnodes", "1", "t.py"], "torchrun --nnodes=1: the job has 2 node"),
        (["torchrun", "--rdzv_endpoint=h:1", "t.py"], "torchrun --rdzv-endpoint"),
        (["torchrun", "--master-addr", "h", "--node-rank", "0", "t.py"], "torchrun --node-rank"),
    ],
)
def test_a_launcher_flag_imgbuild_sets_or_a_launcher_it_cannot_tell_is_refused_by_name(words, refused):
    with pytest.raises(UsageError, match=refused):
        launcher(JobSpec(words, "x.sif", gpus=4, nodes=2))
    with pytest.raises(UsageError, match=refused):
        manifest(K8sJob(IMAGE, words, "job", 1000, 1000, gpus=4, nodes=2))


@pytest.mark.parametrize(
    "words", [["torchrun", "t.py"], ["accelerate", "launch", "t.py"], ["deepspeed", "t.py"], ["mpirun", "t.py"]]
)
def test_a_launcher_under_one_task_per_gpu_or_imgbuilds_restarts_is_refused_by_name(words):
    """Each of the node's tasks would start the launcher's own processes: a world per GPU on one GPU each."""
    with pytest.raises(UsageError, match=f"--task-per-gpu: .*{words[0]}[a-z ]* would start its own"):
        launcher(JobSpec(words, "x.sif", gpus=4, nodes=1, task_per_gpu=True))
    with pytest.raises(UsageError, match=f"--max-restarts: {words[0]}"):
        launcher(JobSpec(words, "x.sif", gpus=4, nodes=2, max_restarts=2))


def test_a_typed_torchrun_on_one_pod_is_told_its_gpus_and_a_rendezvous_of_its_own(tmp_path):
    """torchrun's own default is one process: a one-pod Job of 4 GPUs trained on one."""
    doc = manifest(K8sJob(IMAGE, ["torchrun", "--max_restarts=1", "t.py"], "t", 1000, 1000, gpus=4))
    argv, env = node_call(doc["spec"]["template"]["spec"]["containers"][0]["command"], tmp_path)
    assert argv == ["--max_restarts=1", "t.py"] and env == {"PET_NPROC_PER_NODE": "4", "PET_STANDALONE": "1"}


def test_the_same_value_the_user_typed_is_kept_once():
    step = step_line(sbatch_script(JobSpec(["accelerate", "launch", "--num_processes", "4", "t.py"], "x.sif", gpus=4)))
    assert "--num_processes=" not in step and "--num_processes 4 t.py" in step


def test_deepspeed_across_nodes_gets_the_jobs_hostfile_and_its_no_ssh_form_with_each_nodes_rank(tmp_path):
    """Without a hostfile deepspeed trains on its own node at 127.0.0.1: one training per node."""
    job = JobSpec(["deepspeed", "train.py", "--deepspeed_config", "ds.json"], "x.sif", gpus=4, nodes=2)
    script = sbatch_script(job)
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ds_hostfile="))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\nprintf "gpu-a1\\ngpu-a2\\n"\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu-a[1-2]"}
    subprocess.run(["bash", "-c", "\n".join(lines[start : start + 2])], env=env, cwd=tmp_path, check=True, timeout=30)
    assert (tmp_path / ".imgbuild-hostfile-42").read_text() == "gpu-a1 slots=4\ngpu-a2 slots=4\n"
    assert 'rm -f "$ds_hostfile"' in script
    assert node_argv(launcher(job)[1], tmp_path, node=1) == [
        "--hostfile=.imgbuild-hostfile-42", "--no_ssh", "--node_rank=1", "--master_addr=10.0.0.1",
        "--master_port=41000", "train.py", "--deepspeed_config", "ds.json",
    ]  # fmt: skip
    one = node_argv(launcher(JobSpec(["deepspeed", "train.py"], "x.sif", gpus=4))[1], tmp_path)
    assert one == ["--master_port=41000", "train.py"]  # its own GPUs, found by itself; a port of the job's own


def test_a_fabric_rendezvous_name_tells_the_first_node_it_hosts(tmp_path):
    """torchrun hosts the c10d store only where the endpoint's name is the node's own; JUWELS' `jwb0038i` is
    not, so every node waited for a host."""
    for words in (["python3", "train.py"], ["torchrun", "train.py"]):
        job = JobSpec(words, "x.sif", gpus=4, nodes=2, framework="pytorch", rdzv_host_suffix="i")
        command = launcher(job)[1]
        printed = [*command[:4], "sh", "-c", 'printf "%s" "$PET_RDZV_CONF"']
        for node, hosts in ((0, "1"), (1, "0")):
            done = subprocess.run(["bash", "-c", shell_words(printed)], capture_output=True, text=True, timeout=30,
                                  env={"PATH": "/usr/bin:/bin", "SLURM_NODEID": str(node)})  # fmt: skip
            assert done.stdout == f"is_host={hosts}", (command, done.stderr)
    plain = launcher(JobSpec(["python3", "t.py"], "x.sif", gpus=4, nodes=2, framework="pytorch"))[1]
    assert "PET_RDZV_CONF" not in str(plain)
    # a typed --rdzv-conf (any spelling) would replace it: refused by name
    for typed in (["--rdzv_conf", "join_timeout=900"], ["--rdzv-conf=read_timeout=60"]):
        job = JobSpec(["torchrun", *typed, "t.py"], "x.sif", gpus=4, nodes=2, rdzv_host_suffix="i")
        with pytest.raises(UsageError, match="torchrun --rdzv-conf=.*is_host on the first node"):
            launcher(job)


def test_a_trainjobs_accelerate_and_deepspeed_are_told_each_pods_rank(tmp_path):
    """The Trainer's torch runtime gives each pod PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT, which only
    torchrun reads."""
    acc = manifest(K8sJob(IMAGE, ["accelerate", "launch", "--use_fsdp", "t.py"], "a", 1000, 1000, gpus=2, nodes=2))
    assert node_argv(acc["spec"]["trainer"]["command"], tmp_path, node=1) == [
        "launch", "--num_processes=4", "--num_machines=2", "--machine_rank=1", "--main_process_ip=10.0.0.9",
        "--main_process_port=29400", "--deepspeed_multinode_launcher=standard", "--use_fsdp",
        "t.py",
    ]  # fmt: skip
    ds = manifest(K8sJob(IMAGE, ["deepspeed", "t.py"], "d", 1000, 1000, gpus=2, nodes=2))
    argv = node_argv(ds["spec"]["trainer"]["command"], tmp_path, node=1)
    hostfile = argv[0].removeprefix("--hostfile=")
    assert Path(hostfile).read_text() == "node0 slots=2\nnode1 slots=2\n"
    assert argv[1:] == ["--no_ssh", "--node_rank=1", "--master_addr=10.0.0.9", "--master_port=29400", "t.py"]
    one = manifest(K8sJob(IMAGE, ["accelerate", "launch", "t.py"], "o", 1000, 1000, gpus=2))
    assert one["kind"] == "Job"
    assert node_argv(one["spec"]["template"]["spec"]["containers"][0]["command"], tmp_path)[:2] == [
        "launch", "--num_processes=2"
    ]  # fmt: skip


def test_the_natural_pytorch_command_still_gets_torchrun():
    step = step_line(sbatch_script(JobSpec(["python3", "train.py"], "x.sif", gpus=2, framework="pytorch")))
    assert "torchrun --standalone --nproc-per-node=2 train.py" in step


SITE = checked_section(K8sSite, "k8s", {"namespace": "ml"})


@pytest.mark.parametrize("short", ["3dunet", "research", "7", "_x_"])
def test_every_trainjob_passes_the_trainers_admission_rules(short):
    """N15: `manager: imgbuild` failed IsDomainPrefixedPath (v2.2+), and `generateName: 3dunet-` the CEL name rule
    (v2.1+)."""
    name = default_name(short)
    doc = manifest(K8sJob(IMAGE, ["python3", "train.py"], name, 1000, 1000, gpus=2, nodes=2, generate=True, site=SITE))
    assert doc["kind"] == "TrainJob"
    assert TRAINJOB_NAME.fullmatch(doc["metadata"]["generateName"] + "x7k2p"), doc["metadata"]
    for patch in doc["spec"]["runtimePatches"]:
        assert is_domain_prefixed_path(patch["manager"]), patch["manager"]
    assert not is_domain_prefixed_path("imgbuild") and is_domain_prefixed_path("example.io/platform-team")


@pytest.mark.parametrize("version", ["2.0", "2.1"])
def test_a_trainer_without_runtime_patches_is_refused_by_name(version):
    site = checked_section(K8sSite, "k8s", {"trainer_version": version})
    with pytest.raises(UsageError, match="Trainer v2.2 or later"):
        manifest(K8sJob(IMAGE, ["python3", "train.py"], "job", 1000, 1000, gpus=2, nodes=2, site=site))
    # a one-pod Job needs no Trainer at all
    assert manifest(K8sJob(IMAGE, ["python3", "t.py"], "job", 1000, 1000, gpus=1, site=site))["kind"] == "Job"


def test_kubernetes_tensorflow_and_launchers():
    tf = manifest(K8sJob(IMAGE, ["python3", "train.py"], "tf", 1000, 1000, gpus=2, framework="tensorflow"))
    assert tf["kind"] == "Job" and "torchrun" not in str(tf)
    with pytest.raises(UsageError, match="tensorflow job across nodes"):
        manifest(K8sJob(IMAGE, ["python3", "train.py"], "tf", 1000, 1000, gpus=2, nodes=2, framework="tensorflow"))
    own = manifest(K8sJob(IMAGE, ["torchrun", "train.py"], "pt", 1000, 1000, gpus=2, nodes=2, framework="pytorch"))
    assert own["spec"]["trainer"]["command"] == ["torchrun", "train.py"]
    with pytest.raises(UsageError, match="a lower-case letter"):
        manifest(K8sJob(IMAGE, ["python3", "t.py"], "3dunet", 1000, 1000))


@pytest.mark.parametrize(
    "mem, header",
    [
        ("7.5G", "#SBATCH --mem=7680M"),
        ("64G", "#SBATCH --mem=64G"),
        ("0.5T", "#SBATCH --mem=524288M"),
        ("1500.5M", "#SBATCH --mem=1500M"),
    ],
)
def test_a_fractional_memory_is_written_as_sbatch_takes_it(mem, header):
    """`--mem 7.5G` was passed on and sbatch rejected it (whole numbers only)."""
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site

    job = job_from_flags(JobFlags(["t.py"], "x.sif", "x", mem=mem), slurm_site({}))
    assert header in sbatch_script(job)


def test_a_jean_zay_account_is_accepted():
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site

    job = job_from_flags(JobFlags(["t.py"], "x.sif", "x", account="abc@v100"), slurm_site({}))
    assert "#SBATCH --account=abc@v100" in sbatch_script(job)
    with pytest.raises(UsageError, match="--account"):
        job_from_flags(JobFlags(["t.py"], "x.sif", "x", account="abc@v100;rm"), slurm_site({}))


def test_the_docker_runtime_passes_the_fabrics_and_the_sites_variables_by_name_and_a_writable_home(tmp_path):
    """docker's container has an environment of its own: NCCL's, libfabric's and UCX's variables pass (every one the
    task holds), and the site's own (slurm.pass_env), by name: a token's value never reaches a command line."""
    from imgbuild.engine.noderun import NodeRun, docker_prefix

    argv = docker_prefix(NodeRun("img", gpus=1, site_env=("HF_TOKEN", "WANDB_*")))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text('#!/bin/sh\nprintf "%s\\n" "$@" >> "$OUT"\n')
    (fake / "docker").chmod(0o755)
    out = tmp_path / "argv.txt"
    env = {"PATH": f"{fake}:/usr/bin:/bin", "OUT": str(out), "SLURM_STEP_GPUS": "0", "SLURM_JOB_ID": "7",
           "NCCL_SOCKET_IFNAME": "ib0", "NCCL_NET": "AWS Libfabric", "FI_CXI_DEFAULT_CQ_SIZE": "131072",
           "HF_TOKEN": "hf_secret", "WANDB_API_KEY": "w_secret", "UNRELATED": "x"}  # fmt: skip
    done = subprocess.run([*argv, "python3", "t.py"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    words = out.read_text().splitlines()
    passed = {b for a, b in zip(words, words[1:], strict=False) if a == "-e"}
    assert {"NCCL_SOCKET_IFNAME", "NCCL_NET", "FI_CXI_DEFAULT_CQ_SIZE", "HF_TOKEN", "WANDB_API_KEY"} <= passed
    assert "HOME=/tmp/home" in passed and "UNRELATED" not in passed
    assert "hf_secret" not in out.read_text() and "w_secret" not in out.read_text()


def test_the_sites_passed_variables_reach_the_docker_and_podman_hpc_runtimes():
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site

    for runtime, word in (("docker", "-e HF_TOKEN"), ("podman-hpc", "-e HF_TOKEN")):
        site = slurm_site({"runtime": runtime, "pass_env": ["HF_TOKEN"]})
        assert word in step_line(sbatch_script(job_from_flags(JobFlags(["t.py"], "lab/x:1", "x"), site)))
    with pytest.raises(ImgbuildError, match="pass_env"):
        slurm_site({"pass_env": ["HF_TOKEN=abc"]})


@pytest.mark.parametrize("account, good", [("abc@v100", True), ("project_2001234", True), ("abc@v100;rm", False),
                                           ("a b", False)])  # fmt: skip
def test_an_account_is_one_rule_in_the_site_config_and_the_flag(account, good):
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site

    if good:
        by_site = sbatch_script(job_from_flags(JobFlags(["t.py"], "x.sif", "x"), slurm_site({"account": account})))
        by_flag = sbatch_script(job_from_flags(JobFlags(["t.py"], "x.sif", "x", account=account), slurm_site({})))
        assert f"#SBATCH --account={account}" in by_site and by_site == by_flag
    else:
        with pytest.raises(ImgbuildError, match="slurm.account"):
            slurm_site({"account": account})
        with pytest.raises(UsageError, match="--account"):
            job_from_flags(JobFlags(["t.py"], "x.sif", "x", account=account), slurm_site({}))


def test_a_site_folder_under_a_variable_is_expanded_by_the_job_and_checked_as_this_shell_sees_it(tmp_path, monkeypatch):
    """Jean Zay runs images only from $SINGULARITY_ALLOWED_DIR."""
    from imgbuild.clusters.jobs import JobFlags, check_image_present, job_from_flags
    from imgbuild.config.site import slurm_site

    job = job_from_flags(JobFlags(["t.py"], "lab/x:1", "x"), slurm_site({"sif_dir": "$SINGULARITY_ALLOWED_DIR"}))
    assert job.image == "$SINGULARITY_ALLOWED_DIR/x_1.sif"
    assert '"$SINGULARITY_ALLOWED_DIR/x_1.sif"' in step_line(sbatch_script(job))
    monkeypatch.setenv("SINGULARITY_ALLOWED_DIR", str(tmp_path))
    with pytest.raises(UsageError, match="no such image"):
        check_image_present(job)
    (tmp_path / "x_1.sif").write_text("")
    check_image_present(job)
    for bad in ("$(id)/x", "relative/dir", "$HOME dir"):
        with pytest.raises(ImgbuildError, match="slurm.sif_dir"):
            slurm_site({"sif_dir": bad})


@pytest.mark.parametrize(
    "image, runtime, refused",
    [
        ("/d/x.sif", "pyxis", "an Apptainer image, which --runtime pyxis does not run; give it a .sqsh"),
        ("/d/x.sqsh", "apptainer", "an enroot squashfs, which --runtime apptainer does not run; give it a .sif"),
        ("/d/x.sqsh", "oci", "--runtime oci does not run; give it a .oci"),
        ("/d/b.oci", "docker", "an OCI bundle, which --runtime docker does not run; give it an image name"),
        ("/d/x.sif", "podman-hpc", "an image name from a registry"),
        ("/d/x.sif", "apptainer", ""),
        ("/d/x.sqsh", "edf", ""),
        ("/d/b.oci", "oci", ""),
        # every ending of a kind, in any case; and a path of no known kind where only a registry's image runs
        ("/d/x.simg", "pyxis", "an Apptainer image, which --runtime pyxis does not run"),
        ("/d/X.SIF", "edf", "an Apptainer image, which --runtime edf does not run"),
        ("/d/x.sqfs", "apptainer", "an enroot squashfs, which --runtime apptainer does not run"),
        ("/d/x.squashfs", "shifter", "an enroot squashfs, which --runtime shifter does not run"),
        ("/d/image", "docker", "/d/image: a file, which --runtime docker does not run; give it an image name"),
        ("/d/x.simg", "apptainer", ""),
        ("/d/X.SIF", "singularity", ""),
        ("/d/sandbox", "apptainer", ""),  # a sandbox folder, or a SquashFS image: apptainer reads what it is
        ("/d/x.sqfs", "pyxis", ""),
    ],
)
def test_an_image_file_is_matched_to_the_runtime_that_runs_it(image, runtime, refused):
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site

    flags = JobFlags(["t.py"], image, "x", runtime=runtime)
    if refused:
        with pytest.raises(UsageError, match=re.escape(refused)):
            job_from_flags(flags, slurm_site({}))
    else:
        assert job_from_flags(flags, slurm_site({})).image == image  # the file as named, never renamed


@pytest.mark.parametrize("name", ["x.simg", "X.SIF", "x.sqfs", "b.oci"])
def test_an_image_file_named_without_a_folder_is_the_file_at_every_door(name, tmp_path, monkeypatch):
    """`x.simg` became `x.simg.sif`, and to pyxis Docker Hub's image `x.simg`: a name ending as an image file does
    is that file, from the folder it was named in, to the command line's reading and to the job's."""
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site
    from imgbuild.servers.spec import resolve_image
    from tests.support import settings

    monkeypatch.chdir(tmp_path)
    image, _ = resolve_image(name, settings(), paths=True)
    assert image == name
    runtime = {"x.simg": "apptainer", "X.SIF": "singularity", "x.sqfs": "pyxis", "b.oci": "oci"}[name]
    job = job_from_flags(JobFlags(["t.py"], image, "x", runtime=runtime), slurm_site({}))
    assert job.image in (name, str(tmp_path / name))
    with pytest.raises(UsageError, match="which --runtime docker does not run"):
        job_from_flags(JobFlags(["t.py"], image, "x", runtime="docker"), slurm_site({}))


def test_the_usage_sampler_reads_only_the_steps_gpus(tmp_path):
    """Where the site does not constrain devices, nvidia-smi lists the node's other jobs' GPUs too."""
    from imgbuild.clusters.slurm import USAGE_START

    line = next(line for line in USAGE_START if "nvidia-smi" in line)
    sampler = line[line.index("sh -c ") : line.index(" 2>/dev/null &")]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (fake / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "SLURM_STEP_GPUS": "2,3", "SLURMD_NODENAME": "n1"}
    subprocess.run(["bash", "-c", sampler.replace('"$usage_dir"', str(tmp_path))], env=env, timeout=30, check=True)
    assert (tmp_path / "n1.csv").read_text().splitlines()[:2] == ["-i", "2,3"]


def restricted_violations(pod_spec: dict) -> list[str]:
    """The restricted Pod Security Standard's checks (kubernetes.io/docs/concepts/security/pod-security-standards,
    profile "Restricted", and k8s.io/pod-security-admission's policy checks): what a pod spec breaks."""
    broken = []
    pod = pod_spec.get("securityContext") or {}
    allowed_volumes = {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
    for volume in pod_spec.get("volumes") or []:
        if set(volume) - {"name"} - allowed_volumes:
            broken.append(f"volume {volume.get('name')}: type not allowed")
    for container in pod_spec.get("containers") or []:
        own = container.get("securityContext") or {}
        if own.get("allowPrivilegeEscalation") is not False:
            broken.append("allowPrivilegeEscalation != false")
        if "ALL" not in ((own.get("capabilities") or {}).get("drop") or []):
            broken.append("capabilities.drop lacks ALL")
        if set((own.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}:
            broken.append("capabilities added")
        if not (own.get("runAsNonRoot") or pod.get("runAsNonRoot")):
            broken.append("runAsNonRoot != true")
        if own.get("runAsUser", pod.get("runAsUser")) == 0:
            broken.append("runAsUser = 0")
        seccomp = (own.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            broken.append("seccompProfile not RuntimeDefault or Localhost")
        if own.get("privileged"):
            broken.append("privileged")
    return broken


@pytest.mark.parametrize("gpus, nodes", [(1, 1), (0, 1), (2, 2)])
def test_every_pod_meets_the_restricted_pod_security_standard(gpus, nodes):
    """The pods failed the restricted standard (no seccomp profile, capabilities kept)."""
    site = checked_section(K8sSite, "k8s", {"volumes": ["datasets:/datasets:ro"]})
    doc = manifest(K8sJob(IMAGE, ["python3", "t.py"], "job", 1000, 1000, gpus=gpus, nodes=nodes, site=site))
    if doc["kind"] == "TrainJob":
        patch = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod_spec = patch["template"]["spec"]["template"]["spec"]
    else:
        pod_spec = doc["spec"]["template"]["spec"]
    assert restricted_violations(pod_spec) == []
    assert restricted_violations({"containers": [{}], "securityContext": {}}) != []  # the check can fail


def test_site_sbatch_options_qos_and_constraints_reach_the_header():
    """No --qos, --constraint or site #SBATCH lines (Jean Zay's --hint=nomultithread, JUWELS' QOS)."""
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site

    site = {"qos": "normal", "constraint": "v100-32g", "sbatch_lines": ["--hint=nomultithread", "--exclusive"]}
    script = sbatch_script(job_from_flags(JobFlags(["t.py"], "x.sif", "x"), slurm_site(site)))
    for line in ("#SBATCH --qos=normal", "#SBATCH --constraint=v100-32g", "#SBATCH --hint=nomultithread",
                 "#SBATCH --exclusive"):  # fmt: skip
        assert line in script.splitlines()
    mine = sbatch_script(
        job_from_flags(JobFlags(["t.py"], "x.sif", "x", qos="qos_gpu-t4", constraint="a100&ib"), slurm_site(site))
    )
    assert "#SBATCH --qos=qos_gpu-t4" in mine and "#SBATCH --constraint=a100&ib" in mine  # the flags win


@pytest.mark.parametrize(
    "section, key",
    [
        ({"sbatch_lines": ["--hint=nomultithread\n#SBATCH --uid=0"]}, "sbatch_lines"),
        ({"sbatch_lines": ["hint=nomultithread"]}, "sbatch_lines"),
        ({"sbatch_lines": ["--x=$(id)"]}, "sbatch_lines"),
        ({"sbatch_lines": ["--x=a b"]}, "sbatch_lines"),
        ({"constraint": "a100;reboot"}, "constraint"),
        ({"qos": "high normal"}, "qos"),
    ],
)
def test_a_hostile_site_sbatch_value_is_refused_naming_it(section, key):
    from imgbuild.clusters.jobs import JobFlags, job_from_flags
    from imgbuild.config.site import slurm_site

    with pytest.raises(UsageError, match=key):
        job_from_flags(JobFlags(["t.py"], "x.sif", "x"), slurm_site(section))


def test_the_images_own_label_decides_the_launcher_where_its_name_does_not(tmp_path):
    """A recipe's image named by its tag (root/tensorflow-keras:24.05) got torchrun: its base-framework label was
    never read. Its CUDA major, from the same config, picks the EDF's NCCL plugin."""
    from imgbuild.clusters.jobs import ImageFacts, image_facts
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.facts import Label
    from tests.support import settings

    engine = FakeEngine()
    engine.add_image("root/tensorflow-keras:24.05", {Label.BASE_FRAMEWORK: "tensorflow"}, ["CUDA_VERSION=13.0.2.006"])
    found = image_facts("root/tensorflow-keras:24.05", settings(), read_image=False, engine_of=lambda: engine)
    assert found == ImageFacts("tensorflow", "13")
    job = JobSpec(["python3", "train.py"], "x.sif", gpus=2, framework=found.framework)
    assert "torchrun" not in step_line(sbatch_script(job))
    # nowhere to read it (no such image here, no registry in the name): unknown, never a guess
    assert image_facts("root/other:1", settings(), read_image=True, engine_of=lambda: engine) == ImageFacts()
    # the name decides where it says the framework, and nothing is read unless asked
    named = image_facts("nvcr.io/nvidia/pytorch:25.10-py3", settings(), read_image=False, engine_of=None)
    assert named == ImageFacts("pytorch")


#: The launchers' own code as a judge: run where torch, accelerate and deepspeed are installed, it reads one JSON
#: request a line and answers one line: `{"grammar": true}` -> each launcher's option table (every action's
#: spellings, whether it takes a value, whether prefixes are read); a list of node lines -> what each launcher's
#: own parser (accelerate's with its validator, deepspeed's runner with its hostfile reader, torchrun's with its
#: launch config) understood from each.
LAUNCHERS_OWN_CODE = r"""
import argparse, json, os, sys, tempfile
answer = os.fdopen(os.dup(1), "w")  # the answers' own stream: the launchers log to stdout
os.dup2(2, 1)
sys.stdout = sys.stderr
os.chdir(tempfile.mkdtemp())
open("fsdp.yaml", "w").write("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\n")
open("ds.yaml", "w").write("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n"
                           "deepspeed_config: {zero_stage: 2}\n")
from accelerate.commands.launch import launch_command_parser, _validate_launch_command
from deepspeed.launcher import runner
from torch.distributed import run as torchrun

made = []
real_init = argparse.ArgumentParser.__init__
def init(self, *args, **kwargs):
    real_init(self, *args, **kwargs)
    made.append(self)
argparse.ArgumentParser.__init__ = init


def table(parser):
    return {"abbrev": parser.allow_abbrev, "options": [[list(a.option_strings), a.nargs == 0]
            for a in parser._actions if a.option_strings]}


def grammar():
    made.clear()
    runner.parse_args(["x.py"])
    deepspeed = made[-1]
    return {"accelerate": table(launch_command_parser()), "deepspeed": table(deepspeed),
            "torchrun": table(torchrun.get_args_parser())}


def view(case):
    argv = case["argv"]
    if case["launcher"] == "accelerate":
        args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
        modes = [m for m in ("multi_gpu", "use_fsdp", "use_deepspeed") if getattr(args, m)]
        return {"processes": args.num_processes, "machines": args.num_machines, "rank": args.machine_rank,
                "ip": args.main_process_ip, "port": args.main_process_port, "modes": modes,
                "ds_launcher": args.deepspeed_multinode_launcher if args.num_machines > 1 else None,
                "script": [args.training_script, *args.training_script_args]}
    if case["launcher"] == "deepspeed":
        args = runner.parse_args(argv)
        if case.get("hostfile"):
            open(args.hostfile, "w").write(case["hostfile"])
        pool = runner.fetch_hostfile(args.hostfile) or {}
        return {"no_ssh": args.no_ssh, "rank": args.node_rank, "ip": args.master_addr, "port": args.master_port,
                "hosts": len(pool), "slots": sorted(set(pool.values())), "script": [args.user_script, *args.user_args]}
    args = torchrun.get_args_parser().parse_args(argv)
    config, _, cmd_args = torchrun.config_from_args(args)  # (run() itself puts --standalone's in first)
    return {"nodes": [config.min_nodes, config.max_nodes], "nproc": config.nproc_per_node,
            "endpoint": "standalone" if args.standalone else config.rdzv_endpoint,
            "rank": None if args.standalone else config.rdzv_configs.get("rank"),
            "is_host": config.rdzv_configs.get("is_host"),
            "script": cmd_args}


saved = dict(os.environ)
print(json.dumps({"ready": True}), file=answer, flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if isinstance(request, dict):
        print(json.dumps(grammar()), file=answer, flush=True)
        continue
    answers = []
    for case in request:
        os.environ.clear()
        os.environ.update({**saved, **case["env"]})
        try:
            answers.append(view(case))
        except (Exception, SystemExit) as exc:
            answers.append({"refused": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(answers), file=answer, flush=True)
"""


class LaunchersJudge:
    """The launchers' own code, running in a process of its own (`command`), asked one line at a time."""

    def __init__(self, command: list[str]) -> None:
        import json

        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.process.stdout.readline()  # type: ignore[union-attr]
        assert json.loads(ready or "{}").get("ready"), f"the launchers' judge did not start: {command[:4]}"

    def ask(self, request: object):
        import json

        self.process.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.process.stdout.readline())  # type: ignore[union-attr]

    def close(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def launchers_judge(request):
    """The launchers' own code: torch is too large for the test extras (PyPI's wheel brings CUDA), so it runs in an
    image that has it, the 24.05 stand-in with PyPI's accelerate and deepspeed added by a recipe (built once a
    session, shared with the Slurm jobs' test); or, where IMGBUILD_LAUNCHERS_PYTHON names a Python that has all
    three, in that (seconds, no engine)."""
    import os

    python = os.environ.get("IMGBUILD_LAUNCHERS_PYTHON")
    if python:
        command = [python, "-u", "-c", LAUNCHERS_OWN_CODE]
    else:
        from tests.conftest import testbed_settings

        image = request.getfixturevalue("launchers_image").image
        docker = testbed_settings().get("IMGBUILD_DOCKER_CLI", "docker")
        command = [docker, "run", "-i", "--rm", "--entrypoint", "python3", image, "-u", "-c", LAUNCHERS_OWN_CODE]
    judge = LaunchersJudge(command)
    yield judge
    judge.close()


#: Each launcher as the user may name it: its program, or `python3 -m` its module.
NAMED = {
    "accelerate": (["accelerate", "launch"], ["python3", "-m", "accelerate.commands.launch"]),
    "deepspeed": (["deepspeed"], ["python3", "-m", "deepspeed.launcher.runner"]),
    "torchrun": (["torchrun"], ["python3", "-m", "torch.distributed.run"]),
}
#: accelerate's modes as a user chooses them, each spelling its parser takes: (words, the mode it means).
ACCELERATE_CHOICES = [
    ([], None), (["--multi_gpu"], "multi_gpu"), (["--multi-gpu"], "multi_gpu"), (["--use_fsdp"], "use_fsdp"),
    (["--use-fsdp"], "use_fsdp"), (["--use_deepspeed"], "use_deepspeed"), (["--use-deepspeed"], "use_deepspeed"),
    (["--config_file", "fsdp.yaml"], "use_fsdp"), (["--config-file=fsdp.yaml"], "use_fsdp"),
    (["--config_file=ds.yaml"], "use_deepspeed"), (["--config-file", "ds.yaml"], "use_deepspeed"),
]  # fmt: skip


@dataclass(frozen=True)
class Drawn:
    """One job as a user types it: where it runs, its shape, the launcher, the user's own launcher words."""

    where: str  # slurm, k8s
    nodes: int
    gpus: int
    launcher: str  # accelerate, deepspeed, torchrun, python (imgbuild's torchrun)
    named: tuple[str, ...]
    typed: tuple[str, ...]  # the user's own options, before the script
    mode: str | None = None  # accelerate's, chosen by flag or config file
    suffix: str = ""  # slurm.rdzv_host_suffix
    module: str = ""  # the launcher's flag that runs the script as a module (`-m`, `--module`), "" a file


@st.composite
def drawn_jobs(draw) -> Drawn:
    where = draw(st.sampled_from(["slurm", "k8s"]))
    nodes, gpus = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    launcher = draw(st.sampled_from(["accelerate", "deepspeed", "torchrun", "python"]))
    if launcher == "python":  # imgbuild's own torchrun (more than one GPU in all)
        suffix = draw(st.sampled_from(["", "i"])) if where == "slurm" else ""
        module = draw(st.sampled_from(["", "-m"]))
        return Drawn(where, nodes, max(gpus, 3 - nodes), launcher, ("python3",), (), None, suffix, module)
    named = tuple(draw(st.sampled_from(NAMED[launcher])))
    typed: list[str] = []
    mode = None
    if launcher == "accelerate":
        words, mode = draw(st.sampled_from(ACCELERATE_CHOICES))
        if mode == "multi_gpu" and nodes * gpus == 1:
            words, mode = [], None  # accelerate's own rule: --multi_gpu needs two processes
        typed += words
        if draw(st.booleans()):  # the job's own count, as the user may type it too
            typed += draw(
                st.sampled_from([["--num_processes", str(nodes * gpus)], [f"--num-processes={nodes * gpus}"]])
            )
        typed += draw(st.sampled_from([[], ["--mixed_precision", "bf16"], ["--mixed-precision=no"]]))
    elif launcher == "deepspeed":
        typed += draw(st.sampled_from([[], ["--no_local_rank"], ["--bind_cores_to_rank"]]))
    else:
        typed += draw(st.sampled_from([[], [f"--nproc_per_node={gpus}"], ["--nproc-per-node", str(gpus)],
                                       [f"--nnodes={nodes}"], ["--max_restarts", "2"]]))  # fmt: skip
    suffix = draw(st.sampled_from(["", "i"])) if where == "slurm" and launcher == "torchrun" else ""
    module = draw(st.sampled_from(["", "--module", *(["-m"] if launcher != "deepspeed" else [])]))
    return Drawn(where, nodes, gpus, launcher, named, tuple(typed), mode, suffix, module)


def script(job: Drawn) -> list[str]:
    """The user's script and its arguments, as the launcher must pass them on."""
    return ["pkg.train" if job.module else "train.py", "--lr", "1"]


def drawn_command(job: Drawn) -> list[str]:
    return [*job.named, *job.typed, *([job.module] if job.module else []), *script(job)]


def drawn_lines(job: Drawn) -> list[str]:
    """The command each node's container runs (before its shell has read it)."""
    if job.where == "slurm":
        spec = JobSpec(drawn_command(job), "x.sif", gpus=job.gpus, nodes=job.nodes, framework="pytorch",
                       rdzv_host_suffix=job.suffix)  # fmt: skip
        return launcher(spec)[1]
    return k8s_command(drawn_command(job), job.gpus, job.nodes)


def trainjob(job: Drawn) -> bool:
    """A TrainJob (the Trainer's torch runtime): across nodes, or imgbuild's own torchrun."""
    return job.where == "k8s" and (job.nodes > 1 or job.launcher == "python")


def trainer_env(job: Drawn, node: int) -> dict[str, str]:
    """What a TrainJob's pods are given by the Trainer's torch runtime (PET_*, from numNodes and numProcPerNode)."""
    if not trainjob(job):
        return {}
    return {"PET_NNODES": str(job.nodes), "PET_NPROC_PER_NODE": str(job.gpus), "PET_NODE_RANK": str(node),
            "PET_MASTER_ADDR": "10.0.0.9", "PET_MASTER_PORT": "29400"}  # fmt: skip


def node_case(job: Drawn, command: list[str], node: int, tmp_path) -> dict:
    """Node `node`'s line as its launcher receives it (the launcher's naming words taken off)."""
    argv, env = node_call(command, tmp_path, node, {"SLURM_NNODES": str(job.nodes)})
    env = {**env, **trainer_env(job, node)}
    kind = "torchrun" if job.launcher == "python" else job.launcher
    if job.named[0] == "python3" and kind == job.launcher:
        argv = argv[2:]  # python3 -m MODULE
    elif kind == "accelerate":
        argv = argv[1:]  # accelerate launch
    case = {"launcher": kind, "argv": argv, "env": env}
    if kind == "deepspeed" and job.nodes > 1:
        hostfile = next(a.split("=", 1)[1] for a in argv if a.startswith("--hostfile="))
        case["hostfile"] = (
            "".join(f"gpu-a{i} slots={job.gpus}\n" for i in range(job.nodes))  # what the Slurm script writes
            if hostfile.startswith(".")
            else Path(hostfile).read_text()
        )
    return case


def meant(job: Drawn, node: int) -> dict:
    """The world each node's launcher must understand: the job's processes, nodes and this node's rank, the
    rendezvous (Slurm: the script's first node on a port of the job's own; Kubernetes: the Trainer's), the
    accelerate mode the user chose, and the user's script."""
    multi, processes = job.nodes > 1, job.nodes * job.gpus
    ip, port = ("10.0.0.1", 41000) if job.where == "slurm" else ("10.0.0.9", 29400)
    if job.launcher == "accelerate":
        return {
            "processes": processes, "machines": job.nodes,
            # one machine: its rank is accelerate's own (a config file's default, 0)
            "rank": node if multi else (0 if "config" in str(job.typed) else None),
            "ip": ip if multi else None, "port": port if job.where == "slurm" or multi else None,
            "modes": [job.mode or "multi_gpu"] if job.mode or processes > 1 else [],
            "ds_launcher": "standard" if multi else None, "script": script(job),
        }  # fmt: skip
    if job.launcher == "deepspeed":
        return {
            "no_ssh": multi, "rank": node if multi else -1, "ip": ip if multi else "",
            "port": port if job.where == "slurm" or multi else 29500, "hosts": job.nodes if multi else 0,
            "slots": [job.gpus] if multi else [], "script": script(job),
        }  # fmt: skip
    trainer = trainjob(job)  # the Trainer's static rendezvous: each pod its rank at the master
    return {
        "nodes": [job.nodes, job.nodes], "nproc": job.gpus,
        "endpoint": f"{ip}:{port}" if multi or trainer else "standalone",
        "rank": node if trainer else None,
        "is_host": ("1" if node == 0 else "0") if multi and job.suffix else None,
        "script": ["-u", *(["-m"] if job.module else []), *script(job)],
    }  # fmt: skip


RANKS = ("rank", "is_host")


@pytest.mark.engine
@hypothesis_settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(job=drawn_jobs())
@example(job=Drawn("slurm", 2, 4, "accelerate", ("accelerate", "launch"), ("--use-fsdp",), "use_fsdp"))
@example(job=Drawn("slurm", 2, 4, "accelerate", ("accelerate", "launch"), ("--config-file", "fsdp.yaml"), "use_fsdp"))
@example(job=Drawn("k8s", 1, 4, "torchrun", ("torchrun",), ()))
@example(job=Drawn("k8s", 2, 2, "deepspeed", ("deepspeed",), ()))
@example(job=Drawn("slurm", 2, 4, "torchrun", ("torchrun",), (), None, "i"))
def test_every_nodes_launcher_line_is_read_by_the_launchers_own_code_as_the_jobs_world(
    job, launchers_judge, tmp_path_factory
):
    """nodes x GPUs x launcher (as program or module) x mode (flag or config file, each spelling) x Slurm or a
    Kubernetes Job/TrainJob: every node's line, parsed and validated by the launcher's own code, is the job's one
    world; and the nodes' lines differ only in what differs between nodes (the rank, which node hosts)."""
    tmp = tmp_path_factory.mktemp("node")
    command = drawn_lines(job)
    cases = [node_case(job, command, node, tmp) for node in range(job.nodes)]
    views = launchers_judge.ask(cases)
    for node, view in enumerate(views):
        assert view == meant(job, node), (job, cases[node])
    shared = [{k: v for k, v in view.items() if k not in RANKS} for view in views]
    assert all(view == shared[0] for view in shared), job


@pytest.mark.engine
def test_imgbuilds_grammar_of_each_launcher_is_the_launchers_own(launchers_judge):
    """Every spelling each launcher's parser takes reads as one option in imgbuild, taking a value exactly where the
    parser's does, with prefixes read where the parser reads them."""
    from imgbuild.clusters.launchers import ACCELERATE, DEEPSPEED, TORCHRUN

    tables = launchers_judge.ask({"grammar": True})
    for name, grammar in (("accelerate", ACCELERATE), ("deepspeed", DEEPSPEED), ("torchrun", TORCHRUN)):
        assert bool(grammar.longs) == tables[name]["abbrev"], name
        for spellings, switch in tables[name]["options"]:
            names = {grammar.name(spelling) for spelling in spellings}
            assert len(names) == 1, (name, spellings, names)
            assert (names.pop() in grammar.switches) == switch, (name, spellings)
            if grammar.longs:
                assert all(grammar.name(s) in grammar.longs for s in spellings if s.startswith("--")), spellings


def k8s_command(words: list[str], gpus: int, nodes: int) -> list[str]:
    doc = manifest(K8sJob(IMAGE, words, "job", 1000, 1000, gpus=gpus, nodes=nodes))
    if doc["kind"] == "Job":
        return doc["spec"]["template"]["spec"]["containers"][0]["command"]
    return doc["spec"]["trainer"]["command"]
