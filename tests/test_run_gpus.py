"""Shared-server conventions: GPU readings and selection (real server shapes), and real containers."""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess

import pytest

from imgbuild.errors import UsageError
from imgbuild.gpu import read as gpus_module
from imgbuild.gpu.allocate import Sample, cpus_for, select_gpus, summarize
from imgbuild.gpu.read import SmiReader, process_owner
from imgbuild.gpu.snapshot import SnapshotReader
from imgbuild.hostio.host import caller
from imgbuild.registry import tags as tags_module
from tests import ngc_facts
from tests.conftest import run_cli, run_words, use_site_config
from tests.support import DATA, server

ME = caller().name  # containers are named after who runs imgbuild, never after IMGBUILD_USER


def test_nvidia_smi_csv_parses_real_output():
    gpus = server("dgx-a100")
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].name == "NVIDIA A100-SXM4-40GB" and gpus[0].memory_used_mib == 38012
    assert gpus[0].memory_total_mib == 40960 and gpus[0].utilization == 97
    assert gpus[7].utilization is None  # [N/A]
    assert [p.pid for p in gpus[1].processes] == [2391]
    assert gpus[1].processes[0].name == "/opt/conda/envs/rapids/bin/python"
    t4 = server("t4")
    assert t4[1].utilization is None and len(t4[0].processes) == 2  # [Not Supported]


def test_one_reader_gives_capability_and_driver_and_survives_old_drivers(monkeypatch):
    t4 = server("t4")
    assert [(g.compute_cap, g.driver) for g in t4] == [("7.5", "550.54.15")] * 2
    # A driver before R510 refuses the compute_cap field: the reader asks again without it.
    old_gpus = "\n".join(line.rsplit(",", 2)[0] for line in (DATA / "smi-t4-gpus.csv").read_text().splitlines())

    def old_smi(args):
        if args[0].startswith("--query-gpu"):
            if "compute_cap" in args[0]:
                raise gpus_module.NoGpus('Field "compute_cap" is not a valid field to query.')
            return old_gpus
        return ""

    old = SmiReader(run=old_smi).read()
    assert [(g.name, g.utilization, g.compute_cap) for g in old] == [("Tesla T4", 93, ""), ("Tesla T4", None, "")]
    # `tags --compatible` reads the host through the same reader.
    monkeypatch.setattr(tags_module, "read_devices", lambda snapshot: (server("dgx-a100"), "nvidia-smi"))
    host = tags_module.host_gpus()
    assert (host.driver, host.capabilities, host.source) == ("535.104.05", ("8.0",), "nvidia-smi")
    assert host.targets[0].model == "a100" and host.targets[0].datacenter  # with its model's facts
    monkeypatch.setattr(tags_module, "read_devices", lambda snapshot: (_ for _ in ()).throw(gpus_module.NoGpus("x")))
    assert tags_module.host_gpus().source == "none"


def test_a_broken_gpu_snapshot_is_an_input_error(tmp_path):
    for text in ("{not json", '{"gpus": [{"index": 0}]}', '["x"]', ""):
        snapshot = tmp_path / "snap.json"
        snapshot.write_text(text)
        result = run_cli("gpus", env={"IMGBUILD_GPU_SNAPSHOT": str(snapshot)})
        assert result.code == 2 and "snap.json" in result.err and "not a GPU snapshot" in result.err
        assert result.err.count("\n") == 1 and "Traceback" not in result.err


def _snapshot_text(**change) -> str:
    gpus = [g.to_json() for g in server("dgx-a100")[:2]]
    bus = [{"address": "0000:07:00.0", "device": "0x20b0", "driver": "nvidia"}]
    for where, value in change.items():
        part, field = where.split("__")
        (gpus[1] if part == "gpu" else gpus[1]["processes"][0] if part == "process" else bus[0])[field] = value
    return json.dumps({"gpus": gpus, "pci": bus}, indent=2)


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"gpu__driver": "banana"}, "gpus[1].driver", "'banana' is not an NVIDIA driver version"),
        ({"gpu__driver": "999"}, "gpus[1].driver", "'999' is not an NVIDIA driver version"),
        ({"gpu__compute_cap": "sm_80"}, "gpus[1].compute_cap", "is not a compute capability"),
        ({"gpu__compute_cap": "99.0"}, "gpus[1].compute_cap", "is not a compute capability"),
        ({"gpu__index": "1"}, "gpus[1].index", "is not a whole number"),
        ({"gpu__utilization": 250}, "gpus[1].utilization", "up to 100"),
        ({"gpu__model": "h900"}, "gpus[1].model", "is no field"),
        ({"gpu__name": "A100\x1b[2J"}, "gpus[1].name", "is not a line of text"),
        ({"process__pid": -4}, "gpus[1].processes[0].pid", "is not a whole number"),
        ({"pci__device": "0x20bz"}, "pci[0].device", "is not a PCI device id"),
        ({"pci__device": "20b0"}, "pci[0].device", "is not a PCI device id"),
        ({"pci__address": "07:00.0"}, "pci[0].address", "is not a PCI address"),
        ({"pci__driver": "vfio pci"}, "pci[0].driver", "is not a kernel driver's name"),
    ],
)
def test_a_snapshot_field_gpus_would_never_write_is_one_line_naming_file_line_and_field(tmp_path, change, field, words):
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(_snapshot_text(**change))
    with pytest.raises(UsageError) as caught:
        SnapshotReader(snapshot).snapshot()
    said = str(caught.value)
    line = int(said.split("snap.json:", 1)[1].split(":", 1)[0])
    assert line > 1 and f" {field}: not a GPU snapshot: " in said and words in said, said
    assert "\n" not in said and "\x1b" not in said


def test_every_door_that_reads_a_snapshot_refuses_a_malformed_one_in_one_line(tmp_path):
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(_snapshot_text(gpu__driver="banana"))
    env = {"IMGBUILD_GPU_SNAPSHOT": str(snapshot), "IMGBUILD_NGC_REGISTRY": "127.0.0.1:9"}
    for command in (("gpus",), ("run", "--dry-run", "--gpus", "1", "x:1", "true"), ("tags", "--compatible")):
        result = run_cli(*command, env=env)
        assert result.code == 2 and result.err.count("\n") == 1, (command, result.err)
        assert "snap.json:" in result.err and "gpus[1].driver: not a GPU snapshot" in result.err, result.err


def test_what_gpus_json_writes_reads_back_as_a_snapshot_with_its_pci_bus(tmp_path):
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(_snapshot_text())
    from click.testing import CliRunner

    from imgbuild.cli import cli

    written = CliRunner().invoke(cli, ["gpus", "--json"], env={"IMGBUILD_GPU_SNAPSHOT": str(snapshot)})
    again = tmp_path / "again.json"
    again.write_text(written.output)
    reread = SnapshotReader(again).snapshot()
    assert written.exit_code == 0 and [g.uuid for g in reread.gpus] == [g.uuid for g in server("dgx-a100")[:2]]
    assert reread.pci == (gpus_module.PciGpu("0000:07:00.0", "0x20b0", "nvidia"),)
    assert gpus_module.read_pci(str(again)) == reread.pci


def test_pick_least_loaded_gpus_free_of_other_users():
    gpus = server("dgx-a100")
    # 0 alice, 1 bob: never picked; 3 and 5 are mine (busy but allowed); 2, 4, 7 idle; 6 lightly used.
    assert [g.index for g in select_gpus("2", gpus, "me").gpus] == [2, 4]
    assert [g.index for g in select_gpus("4", gpus, "me").gpus] == [2, 4, 6, 7]
    assert [g.index for g in select_gpus("0,3", gpus, "me", force=True).gpus] == [0, 3]
    assert select_gpus("device=6", gpus, "me").uuids == ["GPU-5d6e7f8a-9b0c-1d2e-3f4a-5b6c7d8e9f0a"]


def test_busy_gpu_is_refused_naming_who_holds_it():
    gpus = server("dgx-a100")
    with pytest.raises(UsageError, match=r"GPU 0 is in use by alice \(pid 122956 python3 in alice_bert_1\)"):
        select_gpus("0,3", gpus, "me")
    forced = select_gpus("0,2", gpus, "me", force=True)
    assert forced.forced == ["GPU 0 (alice (pid 122956 python3 in alice_bert_1))"]
    with pytest.raises(UsageError, match="only 6 of 8 GPUs are free"):
        select_gpus("7", gpus, "me")
    with pytest.raises(UsageError, match="no GPU 9"):
        select_gpus("9,", gpus, "me")


def test_two_gpu_t4_box():
    gpus = server("t4")
    with pytest.raises(UsageError, match="only 0 of 2 GPUs are free"):
        select_gpus("1", gpus, "me")
    assert [g.index for g in select_gpus("1", gpus, "carol").gpus] == [1]  # carol's own jobs do not block her
    assert [g.index for g in select_gpus("all", gpus, "carol").gpus] == [0, 1]
    with pytest.raises(UsageError, match="no NVIDIA GPU"):
        select_gpus("1", [], "me")
    assert select_gpus("none", gpus, "me").gpus == []


def test_cpu_share_per_gpu():
    assert cpus_for(2, host_cores=256, total_gpus=8) == 48  # DGX A100: 32 fair, capped at 24 per GPU
    assert cpus_for(1, host_cores=40, total_gpus=4) == 10  # CSC Puhti node: 10 per GPU
    assert cpus_for(2, host_cores=16, total_gpus=2) == 16  # T4 box: 8 each
    assert cpus_for(1, host_cores=4, total_gpus=1) == 4  # never more than the host has
    assert cpus_for(0, host_cores=64, total_gpus=8) is None  # CPU-only: no limit
    assert cpus_for(3, host_cores=64, total_gpus=8, per_gpu=12) == 36


def test_job_summary_and_starved_gpu_hint():
    starved = [Sample({0: 17, 1: 20}, {0: 9000, 1: 9100}, 98.0) for _ in range(5)]
    rows, hint = summarize(starved, 16)
    assert rows[0] == {
        "gpu": 0,
        "util_mean": 17.0,
        "util_max": 17,
        "mem_mean_mib": 9000,
        "mem_max_mib": 9000,
        "samples": 5,
    }
    assert "DataLoader num_workers" in hint and "16 CPUs" in hint
    busy = [Sample({0: u}, {0: 30000}, 40.0) for u in (90, 95, 100)]
    rows, hint = summarize(busy, 8)
    assert rows[0]["util_mean"] == 95.0 and rows[0]["util_max"] == 100 and hint == ""


def test_process_owner_reads_cgroup_and_owner(tmp_path):
    cid = "a" * 64
    proc = tmp_path / "4242"
    proc.mkdir()
    (proc / "cgroup").write_text(f"12:memory:/docker/{cid}\n0::/system.slice/docker-{cid}.scope\n")
    user, container = process_owner(4242, proc=tmp_path, container_name=lambda c: "alice_bert_1")
    assert container == "alice_bert_1"
    # A root-owned process in a container is credited to the container's <user>_ prefix; otherwise its owner.
    import os
    import pwd

    assert user == ("alice" if os.getuid() == 0 else pwd.getpwuid(os.getuid()).pw_name)
    assert process_owner(999999, proc=tmp_path) == ("", "")


def test_gpus_command_without_gpus_says_so_in_one_line():
    res = run_cli("gpus")
    assert res.code == 0 and len(res.out.strip().splitlines()) == 1 and "no NVIDIA GPU" in res.out


def test_gpus_command_reads_a_snapshot_as_table_and_json(tmp_path, monkeypatch):
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [g.to_json() for g in server("dgx-a100")]}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    table = run_cli("gpus")
    assert table.code == 0 and "alice alice_bert_1 37996 MiB" in table.out and "38012/40960 MiB" in table.out
    data = json.loads(run_cli("gpus", "--json").out)
    assert len(data["gpus"]) == 8 and data["gpus"][0]["processes"][0]["user"] == "alice"
    watch = run_cli("gpus", "--watch", "--count", "2", "--interval", "0.1")
    assert watch.out.count("NVIDIA A100-SXM4-40GB") == 16


# --- real containers ----------------------------------------------------------------------------------


@pytest.fixture
def engine_limits(tmp_path, monkeypatch):
    """This sandbox's engine cannot raise memlock above 8 MiB (no CAP_SYS_RESOURCE); real servers run
    dockerd with LimitMEMLOCK=infinity. The documented config override keeps the rest of the house rules."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "run:\n  ulimits: {memlock: 8388608, stack: 67108864}\n  log_max_size: 20m\n"
        f"  state_dir: {tmp_path / 'state'}\n"
    )
    monkeypatch.setenv("IMGBUILD_CONFIG", str(config))
    use_site_config(monkeypatch, str(config))  # the site's rules
    return config


@pytest.fixture
def started(docker_client):
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(Exception):
            docker_client.containers.get(name).remove(force=True)


def inspect(client, name: str) -> dict:
    return client.containers.get(name).attrs


@pytest.mark.alone
@pytest.mark.engine
def test_run_applies_the_house_rules(testbed, docker_client, tmp_path, engine_limits, started, unique):
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text("print('hello from /workspace')\n")
    data = tmp_path / "data"
    data.mkdir()
    name = f"job{unique}"
    args = [
        "run",
        "-d",
        "--name",
        name,
        "--cpus",
        "1.5",
        "-v",
        f"{data}:/data:ro",
        "-e",
        "FOO=bar",
        image,
        "--",
        "sleep",
        "120",
    ]
    first = run_cli(*args, cwd=work)
    started.append(f"{ME}_{name}_1")
    assert first.code == 0, first.err
    second = run_cli(*args, cwd=work)
    started.append(f"{ME}_{name}_2")
    assert second.code == 0, second.err  # the name clash picks the next free number
    attrs = inspect(docker_client, f"{ME}_{name}_1")
    assert docker_client.containers.get(f"{ME}_{name}_2").status == "running"
    host = attrs["HostConfig"]
    import os

    assert attrs["Config"]["User"] == f"{os.getuid()}:{os.getgid()}"
    assert host["IpcMode"] == "host"
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]} == {
        "memlock": (8388608, 8388608),
        "stack": (67108864, 67108864),
    }
    mounts = {m["Destination"]: (m["Source"], m["RW"]) for m in attrs["Mounts"]}
    assert mounts["/workspace"] == (str(work), True) and mounts["/data"] == (str(data), False)
    assert attrs["Config"]["WorkingDir"] == "/workspace"
    assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "20m", "max-file": "3"}}
    assert host["NanoCpus"] == 1_500_000_000
    # detached: kept when it exits, so `imgbuild logs` still has its output
    assert "FOO=bar" in attrs["Config"]["Env"] and host["AutoRemove"] is False
    assert attrs["Config"]["Labels"]["org.imgbuild.user"] == ME

    ps = json.loads(run_cli("ps", "--json").out)
    assert {f"{ME}_{name}_1", f"{ME}_{name}_2"} <= {r["name"] for r in ps}
    out = run_cli("exec", f"{name}_1", "--", "cat", "/workspace/train.py")
    assert out.code == 0 and "hello from /workspace" in out.out
    assert run_cli("stop", f"{name}_2").code == 0
    assert docker_client.containers.get(f"{ME}_{name}_2").status == "exited"  # stopped, kept
    assert run_cli("stop", "--rm", f"{name}_2").code == 0
    assert f"{ME}_{name}_2" not in {c.name for c in docker_client.containers.list(all=True)}
    assert run_cli("stop", "nobody_else_1").code == 2


@pytest.mark.alone
@pytest.mark.engine
def test_dry_run_line_starts_an_equivalent_container(testbed, docker_client, tmp_path, engine_limits, started, unique):
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    name = f"dry{unique}"
    res = run_cli(
        "run",
        "--dry-run",
        "--name",
        name,
        "--keep",
        "-e",
        "X=1",
        "--cpus",
        "1",
        image,
        "--",
        "python3",
        "-c",
        "import torch, os; print(torch.__version__, os.environ['X'], os.getcwd())",
        cwd=tmp_path,
    )
    assert res.code == 0, res.err
    line = res.out.strip()
    assert f"--name {ME}_{name}_1" in line and "--ipc host" in line and "--ulimit memlock=8388608" in line
    started.append(f"{ME}_{name}_1")
    by_hand = subprocess.run(line, shell=True, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert by_hand.returncode == 0, by_hand.stderr
    # NGC's entrypoint prints its banner first, as on a real image; the command's line is the last
    assert by_hand.stdout.split("\n\n")[-1].split() == [ngc_facts.BED_TORCH, "1", "/workspace"], by_hand.stdout
    attrs = inspect(docker_client, f"{ME}_{name}_1")
    assert attrs["HostConfig"]["IpcMode"] == "host" and attrs["HostConfig"]["NanoCpus"] == 1_000_000_000
    logs = run_cli("logs", f"{name}_1")
    assert ngc_facts.BED_TORCH in logs.out


@pytest.mark.alone
@pytest.mark.engine
def test_default_rules_are_nvidias_and_gpus_become_device_requests(
    testbed, docker_client, tmp_path, started, unique, monkeypatch
):
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [g.to_json() for g in server("dgx-a100")]}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    res = run_cli("run", "--dry-run", "--gpus", "2", "--name", f"gpu{unique}", image, cwd=tmp_path)
    assert res.code == 0, res.err
    argv = shlex.split(res.out.strip())
    assert (
        argv[argv.index("--gpus") + 1] == '"device=GPU-1f3e5d7c-9b8a-4c6d-2e1f-0a9b8c7d6e5f,'
        'GPU-2c3d4e5f-6a7b-8c9d-0e1f-2a3b4c5d6e7f"'
    )
    assert "GPUs: 2 NVIDIA A100-SXM4-40GB" in res.err
    import os

    assert float(argv[argv.index("--cpus") + 1]) == min(os.cpu_count(), 16.0)  # 2 GPUs x 8..24 CPUs, host-bound
    assert "--ulimit" in argv and "memlock=-1" in argv and "stack=67108864" in argv
    refused = run_cli("run", "--dry-run", "--gpus", "0,1", image)
    assert refused.code == 2 and "GPU 0 is in use by alice" in refused.err
    # NVIDIA's memlock=-1 is accepted by the engine's API (the container is created, not started here).
    name = f"imgbuildtest_create{unique}"
    started.append(name)
    line = run_cli("run", "--dry-run", image, "--", "true").out
    create = ["create" if a == "run" else a for a in shlex.split(line)]
    create[create.index("--name") + 1] = name
    subprocess.run(create, check=True, capture_output=True, cwd=tmp_path)
    ulimits = {u["Name"]: u["Soft"] for u in inspect(docker_client, name)["HostConfig"]["Ulimits"]}
    assert ulimits == {"memlock": -1, "stack": 67108864}


def test_gpus_0_is_refused_as_ambiguous_and_no_gpu_means_none_seen(tmp_path, monkeypatch):
    """`./run_docker 0` means GPU 0 on lab servers, `--gpus 0` none in docker."""
    from imgbuild.servers.run import prepare
    from imgbuild.servers.runwords import RunRequest

    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [g.to_json() for g in server("dgx-a100")]}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    with pytest.raises(UsageError, match="--gpus 0 is ambiguous: write --gpus none .* --gpus device=0"):
        select_gpus("0", server("dgx-a100"), "me")
    assert [g.index for g in select_gpus("device=2", server("dgx-a100"), "me").gpus] == [2]
    from imgbuild.config.settings import load_settings

    settings = load_settings({"user": "lab"})
    none = run_words(prepare(RunRequest("ubuntu:22.04", ["true"]), settings))
    values = [none[i + 1] for i, word in enumerate(none) if word == "-e"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in values and "--gpus" not in none
    some = run_words(prepare(RunRequest("ubuntu:22.04", ["true"], gpu_request="device=2"), settings))
    assert "NVIDIA_VISIBLE_DEVICES=void" not in some and "--gpus" in some
    # a detached run keeps its container, so its output and traceback survive it.
    detached = run_words(prepare(RunRequest("ubuntu:22.04", ["true"], detach=True), settings))
    assert "-d" in detached and "--rm" not in detached
    attached = run_words(prepare(RunRequest("ubuntu:22.04", ["true"]), settings))
    assert "--rm" in attached


# --- MIG ------------------------------------------------------------------


def _fake_nvml(monkeypatch, busy_slice: int):
    """NVML of a host with GPU 0 an H100 in MIG mode (three 1g.10gb slices; `busy_slice` runs bob's job) and
    GPU 1 a whole H100."""
    import sys
    import types

    class NVMLError(Exception):
        pass

    class Handle:
        def __init__(self, uuid, name, mig=None, procs=()):
            self.uuid, self.name, self.mig, self.procs = uuid, name, mig, list(procs)

    slices = [
        Handle(f"MIG-{j}aaaaaaa-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
               procs=[types.SimpleNamespace(pid=4242, usedGpuMemory=2**30)] if j == busy_slice else [])
        for j in range(3)
    ]  # fmt: skip
    gpus = [
        Handle("GPU-00000000-0000-0000-0000-00000000aaaa", "NVIDIA H100 80GB HBM3", mig=slices),
        Handle("GPU-00000000-0000-0000-0000-00000000bbbb", "NVIDIA H100 80GB HBM3"),
    ]

    def mig_mode(h):
        if h.mig is None:
            raise NVMLError("not supported")
        return 1, 1

    def mig_handle(h, j):
        if j >= len(h.mig):
            raise NVMLError("not found")
        return h.mig[j]

    nvml = types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_DEVICE_MIG_ENABLE=1,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.95.05",
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: gpus[i],
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=0, total=(10 if h.mig is None and "MIG" in h.name else 80) * 2**30),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=0),
        nvmlDeviceGetComputeRunningProcesses=lambda h: h.procs,
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetName=lambda h: h.name,
        nvmlDeviceGetUUID=lambda h: h.uuid,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=""),
        nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return slices


def test_a_mig_gpu_is_its_slices_and_one_busy_slice_leaves_the_others_free(monkeypatch):
    """The parent UUID of a MIG GPU is no device CUDA can use, and one busy slice marked the whole GPU busy: the
    slices are the units now, each with its own processes, chosen by MIG- UUID."""
    from imgbuild.gpu.allocate import select_gpus
    from imgbuild.gpu.read import NvmlReader

    slices = _fake_nvml(monkeypatch, busy_slice=0)
    gpus = NvmlReader().read()
    assert [g.uuid for g in gpus] == [s.uuid for s in slices] + ["GPU-00000000-0000-0000-0000-00000000bbbb"]
    assert {g.mig_profile for g in gpus[:3]} == {"1g.10gb"} and gpus[0].mig_parent.endswith("aaaa")
    for gpu in gpus:
        for proc in gpu.processes:
            proc.user = "bob"
    chosen = select_gpus("2", gpus, "alice")
    assert slices[0].uuid not in chosen.uuids and len(chosen.uuids) == 2  # bob's slice is his alone
    named = select_gpus("3", gpus, "alice")  # the whole GPU 1 and the two free slices
    assert set(named.uuids) == {slices[1].uuid, slices[2].uuid, "GPU-00000000-0000-0000-0000-00000000bbbb"}


def test_nvidia_smi_lists_mig_slices_and_places_processes_it_can():
    from imgbuild.gpu.read import Gpu, GpuProcess, mig_layout, split_mig

    listing = (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-1111-2222-3333-444455556666)\n"
        "  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-aaaa-bbbb-cccc-ddddeeeeffff)\n"
        "  MIG 1g.5gb      Device  1: (UUID: MIG-11111111-aaaa-bbbb-cccc-ddddeeeeffff)\n"
        "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-77777777-1111-2222-3333-444455556666)\n"
    )
    layout = mig_layout(listing)
    assert layout == {
        "GPU-5d5ba0d6-1111-2222-3333-444455556666": [
            ("3g.20gb", "MIG-c6d4f1ef-aaaa-bbbb-cccc-ddddeeeeffff"),
            ("1g.5gb", "MIG-11111111-aaaa-bbbb-cccc-ddddeeeeffff"),
        ]
    }
    parent = Gpu(0, "GPU-5d5ba0d6-1111-2222-3333-444455556666", "NVIDIA A100-SXM4-40GB", 0, 40960, None)
    whole = Gpu(1, "GPU-77777777-1111-2222-3333-444455556666", "NVIDIA A100-SXM4-40GB", 0, 40960, 0)
    on_slices = {"MIG-11111111-aaaa-bbbb-cccc-ddddeeeeffff": [GpuProcess(99, "python", 900)]}
    gpus = split_mig([parent, whole], layout, on_slices)
    assert [g.uuid for g in gpus] == [
        "MIG-c6d4f1ef-aaaa-bbbb-cccc-ddddeeeeffff",
        "MIG-11111111-aaaa-bbbb-cccc-ddddeeeeffff",
        "GPU-77777777-1111-2222-3333-444455556666",
    ]
    assert gpus[0].processes == [] and [p.pid for p in gpus[1].processes] == [99]
    assert gpus[0].mig_profile == "3g.20gb" and gpus[1].name.endswith("MIG 1g.5gb")


def test_a_gpu_whose_process_owner_cannot_be_read_is_never_handed_out_as_free():
    """Under /proc hidepid=2, with imgbuild in a container, or through a remote engine, a process's owner is
    unknown: two H100s at 97-99 % were given out as free. Unknown is someone else; --force still takes it."""
    from imgbuild.gpu.allocate import GpusBusy
    from imgbuild.gpu.read import Gpu, GpuProcess

    busy = [
        Gpu(i, f"GPU-{i}", "NVIDIA H100 80GB HBM3", 70_000, 81_559, 98, [GpuProcess(4242 + i, "python", 69_000)])
        for i in range(2)
    ]
    with pytest.raises(GpusBusy, match="an unknown user"):
        select_gpus("1", busy, "alice")
    with pytest.raises(GpusBusy, match="an unknown user"):
        select_gpus("device=0", busy, "alice")
    assert select_gpus("device=0", busy, "alice", force=True).uuids == ["GPU-0"]
    free = [*busy, Gpu(2, "GPU-2", "NVIDIA H100 80GB HBM3", 0, 81_559, 0, [])]
    assert select_gpus("1", free, "alice").uuids == ["GPU-2"]


@pytest.mark.alone
@pytest.mark.engine
@pytest.mark.parametrize("detached", [True, False])
def test_a_run_whose_start_fails_leaves_no_created_container(
    testbed, docker_client, tmp_path, engine_limits, started, unique, detached
):
    """A `docker run` whose start fails (here the engine refuses an unlimited memlock, as this
    test bed's dockerd, without CAP_SYS_RESOURCE, does) left a `Created` container, and the next run's name
    moved on to `_2`. It is removed; a second try gets the same name."""
    engine_limits.write_text(engine_limits.read_text().replace("memlock: 8388608", "memlock: -1"))
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    name = f"nostart{unique}"
    args = ["run", *(["-d"] if detached else []), "--name", name, image, "--", "true"]
    for _ in range(2):
        done = run_cli(*args, cwd=tmp_path)
        started.append(f"{ME}_{name}_1")
        assert done.code != 0 and "rlimit" in done.err and "Traceback" not in done.err, done.err
        left = docker_client.containers.list(all=True, filters={"name": f"{ME}_{name}"})
        assert left == [], [(c.name, c.status) for c in left]


@pytest.mark.parametrize(
    "flag, info, path",
    [
        (
            "gpus",
            {"runtimes": ["io.containerd.runc.v2", "runc"], "cdi_devices": ["nvidia.com/gpu=0", "nvidia.com/gpu=all"]},
            "cdi",
        ),
        ("gpus", {"runtimes": ["nvidia", "runc"], "cdi_devices": ["nvidia.com/gpu=0"]}, "gpus"),  # the runtime is there
        ("gpus", {"runtimes": ["runc"], "cdi_devices": []}, "gpus"),
        ("gpus", {"error": "engine down"}, "gpus"),
        ("env", {"runtimes": ["runc"], "cdi_devices": ["nvidia.com/gpu=0"]}, "env"),  # the site's word
        ("cdi", {"runtimes": ["nvidia"]}, "cdi"),
    ],
)
def test_run_hands_gpus_the_way_the_engine_takes_them(flag, info, path):
    """On a CDI-only Docker host `run` passed --gpus (it fails there) while the smoke
    test fell back to CDI; both now take the same path."""
    import types

    from imgbuild.engine.runargs import run_argv
    from imgbuild.engine.types import RunOptions
    from imgbuild.servers.run import gpu_path

    engine = types.SimpleNamespace(host_info=lambda: info)
    chosen = gpu_path(flag, engine)
    assert chosen == path
    argv, env = run_argv(
        RunOptions(
            image="img", command=("true",), name="n", user="1000:1000", gpus=("GPU-a", "GPU-b"),
            gpus_by_env=chosen == "env", gpus_by_cdi=chosen == "cdi",
        )
    )  # fmt: skip
    line = " ".join(argv)
    if path == "cdi":
        assert "--device nvidia.com/gpu=GPU-a --device nvidia.com/gpu=GPU-b" in line and "--gpus" not in line
    elif path == "env":
        assert env.get("NVIDIA_VISIBLE_DEVICES") == "GPU-a,GPU-b" and "--gpus" not in line
    else:
        assert '--gpus "device=GPU-a,GPU-b"' in line


def _flag(words: list[str], flag: str) -> str | None:
    return next((words[i + 1] for i, word in enumerate(words) if word == flag), None)


def test_every_run_is_capped_in_memory_processes_and_cpus_with_or_without_gpus(tmp_path, monkeypatch):
    from imgbuild.config.settings import load_settings
    from imgbuild.servers.run import prepare
    from imgbuild.servers.runwords import RunRequest

    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [g.to_json() for g in server("dgx-a100")]}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    config = tmp_path / "site.yaml"
    config.write_text("run:\n  memory: 4g\n  pids_limit: 100\n  cpus: 3\n  cgroup_parent: imgbuild-{gid}-{uid}.slice\n")
    use_site_config(monkeypatch, config)
    settings = load_settings({"user": "lab"})
    for request in ("none", "device=2"):
        words = run_words(prepare(RunRequest("ubuntu:22.04", ["true"], gpu_request=request), settings))
        assert _flag(words, "--memory") == _flag(words, "--memory-swap") == f"{4 << 30}b"
        assert _flag(words, "--pids-limit") == "100"
        assert _flag(words, "--cgroup-parent") == f"imgbuild-{caller().gid}-{caller().uid}.slice"  # the group's, nested
        assert _flag(words, "--cpus") is not None
    cpu_only = run_words(prepare(RunRequest("ubuntu:22.04", ["true"]), settings))
    assert _flag(cpu_only, "--cpus") == "3"


def test_without_site_caps_a_run_gets_three_quarters_of_the_memory_and_one_gpus_cpus():
    from imgbuild.config.site import run_rules
    from imgbuild.servers.caps import run_cpus

    assert run_rules({}).memory_bytes(64 << 30) == 48 << 30
    assert run_rules({"memory": "2g"}).memory_bytes(64 << 30) == 2 << 30
    assert run_cpus(0, 128, 8, run_rules({})) == 16.0  # a GPU's share of a DGX, for a run without GPUs
    assert run_cpus(0, 128, 8, run_rules({"cpus": 2})) == 2.0
    assert run_rules({}).pids_limit == 4096


@pytest.mark.parametrize(
    "line, says",
    [
        ("memory: 5m", "run.memory: must be from 6m"),
        ("memory: 999999999999999t", "run.memory: must be from 6m"),
        ("pids_limit: 8", "run.pids_limit: must be greater than or equal to 16"),
        ("pids_limit: 99999999999999999999", "run.pids_limit"),
        ("cpus: 0.001", "run.cpus: must be from 0.01"),
        ("cgroup_parent: ../../system.slice", "run.cgroup_parent: not a systemd slice"),
    ],
)
def test_a_cap_below_the_engines_least_or_past_its_most_is_one_line_exit_2(line, says, tmp_path, monkeypatch):
    from imgbuild.config.settings import load_settings

    config = tmp_path / "site.yaml"
    config.write_text(f"run:\n  {line}\n")
    use_site_config(monkeypatch, config)
    with pytest.raises(UsageError, match=says) as refused:  # UsageError: one line, exit 2
        load_settings({})
    assert len(str(refused.value).splitlines()) == 1


#: Forks up to 100 sleeps and says how many started, then grows its memory in touched 16 MiB steps until stopped.
_PAST_THE_CAPS = (
    "import subprocess\nstarted = []\n"
    "for _ in range(100):\n"
    "    try:\n        started.append(subprocess.Popen(['sleep', '30']))\n"
    "    except OSError:\n        break\n"
    "print('STARTED', len(started), flush=True)\n"
    "for p in started:\n    p.kill()\n    p.wait()\n"
    "held = []\n"
    "while len(held) < 64:\n"
    "    held.append(bytearray(b'x') * (16 << 20))\n    print('MIB', 16 * len(held), flush=True)\n"
)


@pytest.mark.alone
@pytest.mark.engine
@pytest.mark.parametrize("gpus", ["none", "1"])
def test_a_run_with_or_without_gpus_is_stopped_at_its_memory_and_process_caps(
    testbed, docker_client, tmp_path, engine_limits, started, unique, monkeypatch, gpus
):
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [g.to_json() for g in server("dgx-a100")]}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    site = tmp_path / "site.yaml"
    site.write_text(engine_limits.read_text() + "  memory: 96m\n  pids_limit: 32\n  gpu_flag: env\n")
    use_site_config(monkeypatch, site)
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    name = f"caps{gpus}{unique}"
    started.append(f"{ME}_{name}_1")
    done = run_cli("run", "--no-workspace", "--keep", "--gpus", gpus, "--name", name, image, "--",
                   "python3", "-c", _PAST_THE_CAPS, cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.code == 137 and "Traceback" not in done.err, done.out[-1000:] + done.err  # killed, as docker run says
    assert int(done.out.split("STARTED", 1)[1].split()[0]) < 32, done.out[-1000:]
    grown = [int(line.split()[1]) for line in done.out.splitlines() if line.startswith("MIB ")]
    assert grown and max(grown) < 96, done.out[-500:]  # stopped before it held the cap
    seen = inspect(docker_client, f"{ME}_{name}_1")
    assert seen["State"]["OOMKilled"] is True and seen["HostConfig"]["Memory"] == 96 << 20
    assert seen["HostConfig"]["MemorySwap"] == 96 << 20 and seen["HostConfig"]["PidsLimit"] == 32
    visible = next(e for e in seen["Config"]["Env"] if e.startswith("NVIDIA_VISIBLE_DEVICES="))
    assert visible.startswith("NVIDIA_VISIBLE_DEVICES=void" if gpus == "none" else "NVIDIA_VISIBLE_DEVICES=GPU-"), (
        visible
    )


@pytest.mark.parametrize(
    ("size", "says"),
    [
        ("--privileged", "--shm-size: '--privileged' is not a size such as 512m or 64g"),
        ("1g --privileged", "is not a size"),
        ("9" * 17 + "t", "is not a size"),
        ("999999999999999t", "--shm-size: must be more than 0 and at most 4194304t"),
        ("0", "--shm-size: must be more than 0"),
    ],
)
def test_a_shm_size_the_engine_cannot_take_is_refused_before_the_run_as_the_sites_is(size, says, tmp_path):
    from imgbuild.config.settings import load_settings
    from imgbuild.config.site import run_rules
    from imgbuild.servers.run import prepare
    from imgbuild.servers.runwords import RunRequest

    with pytest.raises(UsageError) as refused:
        prepare(RunRequest("ubuntu:22.04", ["true"], shm_size=size), load_settings({"user": "lab"}))
    assert says in str(refused.value) and len(str(refused.value).splitlines()) == 1
    with pytest.raises(UsageError, match="config run.shm_size: "):
        run_rules({"shm_size": size})
    assert run_words(prepare(RunRequest("ubuntu:22.04", ["true"], shm_size="16g"), load_settings({"user": "lab"})))


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("1\nLD_PRELOAD=/x.so", "a value with a line break or NUL"),
        ("1\rB=2", "a value with a line break or NUL"),
        ("x" * 70_000, "a value of 70,003 bytes; a container's variable holds at most 65,000"),
    ],
)
def test_a_variable_the_engine_cannot_carry_is_refused_when_the_run_is_prepared(value, says):
    """Before anything is held or said to start (and for --dry-run alike), by the env file's own rule."""
    from imgbuild.config.settings import load_settings
    from imgbuild.servers.run import prepare
    from imgbuild.servers.runwords import RunRequest

    with pytest.raises(UsageError, match=f"^-e A: {says}"):
        prepare(RunRequest("ubuntu:22.04", ["true"], env=[f"A={value}"]), load_settings({"user": "lab"}))
