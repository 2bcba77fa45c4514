"""GPU truth for real, without a GPU: the CUDA stand-in (NVIDIA's own CUDA 13 user space from the package
index, torch 2.13.0+cu130) on the test bed's dockerd and registry.

`smoke --for` gives the right verdict for every GPU model imgbuild knows, the library checks read the real
libraries, a fleet the image cannot serve stops promotion, and `bump` does not move past the fleet's driver.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgbuild.gpu.support import GPU_MODELS
from tests.conftest import run_cli

pytestmark = [pytest.mark.engine, pytest.mark.fidelity]

#: torch 2.13.0+cu130's own arch flags (torch._C._cuda_getArchFlags()): sm_75 sm_80 sm_86 sm_90 sm_100 sm_120.
SASS_MAJORS = {7: 5, 8: 0, 9: 0, 10: 0, 12: 0}  # per major, the lowest minor with native kernels


def _runs_here(capability: tuple[int, int]) -> bool:
    major, minor = capability
    return major in SASS_MAJORS and minor >= SASS_MAJORS[major]


@pytest.fixture
def standin(testbed) -> str:
    return f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:25.10-py3"


def test_smoke_for_every_known_gpu_on_the_cuda_standin(standin):
    models = ",".join(GPU_MODELS)
    res = run_cli("smoke", standin, "--for", models, "--driver", "580.95.05", "--json")
    data = json.loads(res.out)
    checks = {c["name"]: c for c in data["checks"]}
    libraries = checks["cuda libraries"]
    assert libraries["status"] == "pass", libraries
    assert libraries["details"]["cuda"] == "13.0" and libraries["details"]["cudnn"].startswith("9.")
    assert libraries["details"]["nccl"] and libraries["details"]["arch_list"][0] == "sm_75"
    verdicts = {v["target"]: v for v in checks["fleet"]["details"]["verdicts"]}
    assert set(verdicts) == set(GPU_MODELS)
    # arm64-only machines are judged on the tag's arm64 image (NGC's arm64 25.10 list: 8.0 8.6 9.0 10.0 11.0
    # 12.0+PTX), read from the registry: Orin (8.7, an iGPU) has nothing there, Thor (11.0) has its own
    arm64 = {"gh200": True, "gb200": True, "gb300": True, "gb10": True, "orin": False, "thor": True}
    for name, model in GPU_MODELS.items():
        runs = arm64[name] if model.cpu == "arm64" else _runs_here(model.capability)
        assert verdicts[name]["runs"] is runs, verdicts[name]
    assert res.code == 1  # V100 and P100 have no kernels in a CUDA 13 build
    assert "v100: sm_70: no kernels for this GPU" in res.out
    fits = run_cli("smoke", standin, "--for", "t4,l40s,h100,b300", "--driver", "580.95.05")
    assert fits.code == 0, fits.err
    assert "l40s" in fits.out and "native kernels (sm_86, binary-compatible within major 8)" in fits.out
    forward = run_cli("smoke", standin, "--for", "h100", "--driver", "570.124.06")  # NVIDIA's CUDA 13 branches
    assert forward.code == 0 and "forward compatibility" in forward.out, forward.out
    old_driver = run_cli("smoke", standin, "--for", "h100", "--driver", "560.35.03")
    assert old_driver.code == 1 and "older than 580.65.06" in old_driver.out


def test_a_cpu_build_runs_on_no_gpu(testbed):
    cpu = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    res = run_cli("smoke", cpu, "--for", "h100", "--json")
    assert res.code == 1
    data = json.loads(res.out)
    assert "no CUDA build" in data["checks"][-1]["reason"]
    assert {c["name"]: c["status"] for c in data["checks"]}["cuda libraries"] == "skip"


def test_bad_fleet_flags_are_usage_errors_before_any_engine(standin):
    for args in (["--for", "quantum9000"], ["--for", "h100", "--driver", "latest"], ["--driver", "580.95.05"]):
        res = run_cli("smoke", standin, *args, env={"DOCKER_HOST": "unix:///nonexistent.sock"})
        assert res.code == 2 and "Traceback" not in res.err, (args, res.err)


def test_a_fleet_the_image_cannot_serve_stops_promotion(testbed, tmp_path, docker_client, cleanup_images, unique):
    (tmp_path / ".git").mkdir()
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "cu.yaml"
    name = f"cu-{unique}"
    recipe.write_text(
        f'name: {name}\ntag: v1\nbase: {{framework: pytorch, tag: "25.10"}}\nsmoke: {{targets: [h100, v100]}}\n'
    )
    res = run_cli("build", str(recipe), cwd=tmp_path)
    assert res.code == 1 and "fleet: cannot run on v100: sm_70: no kernels" in res.err, res.err
    assert "was left as it was (not built before)" in res.err
    report = json.loads((tmp_path / "images" / name / "smoke.json").read_text())
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["cuda libraries"] == "pass" and statuses["fleet"] == "fail" and statuses["framework"] == "pass"
    tags = [t for image in docker_client.images.list() for t in image.tags]
    assert not [t for t in tags if t.split("/")[-1].startswith(f"{name}:")]  # nothing was tagged
    recipe.write_text(
        f'name: {name}\ntag: v1\nbase: {{framework: pytorch, tag: "25.10"}}\nsmoke: {{targets: [t4, h100]}}\n'
    )
    ok = run_cli("build", str(recipe), cwd=tmp_path, env={"IMGBUILD_FLEET_DRIVER": "580.95.05"})
    assert ok.code == 0, ok.err
    cleanup_images.append(ok.out.strip().splitlines()[-1].split(" -> ")[0])


def test_bump_does_not_move_past_the_fleets_driver(testbed, tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "lab.yaml"
    recipe.write_text('name: lab\nbase: {framework: pytorch, tag: "23.10", follow: latest}\n')
    held = run_cli("bump", "--json", cwd=tmp_path, env={"IMGBUILD_FLEET_DRIVER": "560.35.03"})
    assert held.code == 0, held.err
    moved = json.loads(held.out)[0]
    assert moved["newest"] == "24.05-py3" and moved["changed"]  # 25.10, 26.01 (CUDA 13): R580, or R535-R575 FC
    held_back = " ".join(moved["held_back"])
    assert "25.10-py3" in held_back and "26.01-py3" in held_back and "older than 580.65.06" in held_back
    assert 'tag: "24.05"' in recipe.read_text()
    free = run_cli("bump", "--json", cwd=tmp_path, env={"IMGBUILD_FLEET_DRIVER": "580.95.05"})
    assert json.loads(free.out)[0]["newest"] == "26.01-py3" and 'tag: "26.01"' in recipe.read_text()


def test_tags_judges_an_arm64_gpu_on_the_tags_arm64_image(testbed):
    """The bed's tags are manifest lists with NGC's arm64 config beside the amd64 image; Thor (11.0,
    arm64 only) is judged on the arm64 arch list, which has 11.0 (the amd64 one has not)."""
    res = run_cli(
        "tags", "pytorch", "--since", "25.10", "--compatible", "--driver", "580.95.05", "--arch", "thor", "--json"
    )
    assert res.code == 0, res.err
    tag = next(t for t in json.loads(res.out)["tags"] if t["tag"] == "25.10-py3")
    assert tag["platforms"] == ["amd64", "arm64"] and "11.0" in tag["variants"]["arm64"]["arch_list"]
    assert tag["compatible"] is True and "sm_110: native kernels" in tag["why"]


def test_smoke_for_arm64_gpus_on_an_amd64_only_image(testbed):
    """`smoke --for gh200,gb200,gb10` on an amd64-only image (here: the stand-in under a
    local name, which no registry lists for arm64) says it cannot run and why."""
    import subprocess

    local = "imgbuildtest/amd64-only:1"
    standin = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:25.10-py3"
    assert subprocess.run(["docker", "tag", standin, local], capture_output=True).returncode == 0
    try:
        res = run_cli("smoke", local, "--for", "gh200,gb200,gb10,h100", "--driver", "580.95.05", "--json")
    finally:
        subprocess.run(["docker", "rmi", local], capture_output=True)
    assert res.code == 1, res.err
    verdicts = {
        v["target"]: v
        for v in next(c for c in json.loads(res.out)["checks"] if c["name"] == "fleet")["details"]["verdicts"]
    }
    for name in ("gh200", "gb200", "gb10"):
        assert not verdicts[name]["runs"] and "no arm64 variant (only amd64)" in verdicts[name]["reason"]
    assert verdicts["h100"]["runs"]


def test_a_gpu_host_behind_the_socket_is_read_through_the_engine(
    testbed, tmp_path, docker_client, cleanup_images, unique
):
    """On the bed's dockerd: imgbuild in a container (or DOCKER_HOST elsewhere) cannot
    see the engine's GPUs in this machine's /dev. Read through the engine, an image whose nvidia-smi answers as a
    DGX's does makes the engine's host a GPU host, and the bed's engine (no toolkit) cannot pass them: the smoke
    test requires a GPU and does not pass. With the GPUs read from this machine, that host would pass untested."""
    from imgbuild.config.settings import load_settings
    from imgbuild.engine import Engine
    from imgbuild.pipeline.smoke import SmokeRequest, host_gpus, run_smoke

    data = Path(__file__).parent / "data"
    (tmp_path / "gpus.csv").write_text((data / "smi-dgx-a100-gpus.csv").read_text())
    (tmp_path / "apps.csv").write_text((data / "smi-dgx-a100-apps.csv").read_text())
    (tmp_path / "nvidia-smi").write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-compute-apps=*) cat /opt/smi/apps.csv ;;\n"
        "  --query-gpu=index,*) cat /opt/smi/gpus.csv ;;\n"
        "  *) exit 0 ;;\n"
        "esac\n"
    )
    base = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base}\nCOPY gpus.csv apps.csv /opt/smi/\nCOPY nvidia-smi /usr/local/bin/\nUSER root\nRUN chmod 755 /usr/local/bin/nvidia-smi\n"
    )
    tag = f"imgbuildtest/dgx-{unique}:1"
    cleanup_images.append(tag)
    docker_client.images.build(path=str(tmp_path), tag=tag, rm=True)
    engine = Engine.connect(testbed["IMGBUILD_DOCKER_CLI"])
    assert host_gpus(engine, tag, load_settings({"gpu_source": "local"})).present is False  # this machine: none
    found = host_gpus(engine, tag, load_settings({"gpu_source": "engine"}))
    assert found.present and found.source == "engine"
    assert [g.name for g in found.readings or []] == ["NVIDIA A100-SXM4-40GB"] * 8
    # the DGX's busy GPUs have processes whose owners cannot be read through the engine: someone else's. One free
    # GPU is chosen; `--gpus all` would be refused for the busy ones.
    report = run_smoke(
        engine, SmokeRequest(tag, gpus="1", libraries_only=False), load_settings({"gpu_source": "engine"})
    )
    assert not report.ok and "gpu access" in [c["name"] for c in report.failures()], report.summary()
    assert not [c.name for c in docker_client.containers.list(all=True, filters={"ancestor": tag})]


@pytest.mark.root("a PID namespace of its own (unshare)")
def test_whether_the_engine_shares_this_machine_is_asked_of_the_kernel(testbed):
    """The bed's dockerd runs in the same container as the tests (/.dockerenv is there): the marker file alone would
    call it remote. The socket's peer PID (SO_PEERCRED) and mount namespace decide: the same daemon seen from a PID
    namespace below its own (a container given the socket) is 0, and from another mount namespace sees another
    /dev; both read the GPUs through the engine."""
    import subprocess
    import sys

    from imgbuild.engine import Engine

    assert Engine.connect(testbed["IMGBUILD_DOCKER_CLI"]).shares_host()
    code = (
        "from imgbuild.engine.docker import _engine_pid\n"
        "from imgbuild.engine import Engine\n"
        "print(_engine_pid(), Engine.connect(None).shares_host())\n"
    )
    root = str(Path(__file__).parent.parent)
    for how, pid_zero in ((["--pid", "--fork", "--mount-proc"], True), (["--mount"], False)):
        proc = subprocess.run(
            ["unshare", *how, sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root
        )
        assert proc.returncode == 0, proc.stderr
        pid, shares = proc.stdout.split()
        assert (pid == "0") is pid_zero and shares == "False", (how, proc.stdout)
