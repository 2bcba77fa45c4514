"""The test bed is real: an engine that builds FROM the stand-in base, real PyTorch inside, a registry."""

from __future__ import annotations

import io
import json
import subprocess
import urllib.request

import pytest

from tests import ngc_facts
from tests.conftest import TESTBED_UP, in_image

pytestmark = [pytest.mark.engine, pytest.mark.fidelity]


def test_image_from_standin_base_runs_real_torch(testbed, docker_client, unique, cleanup_images):
    reg = testbed["IMGBUILD_TESTBED_REGISTRY"]
    tag = f"imgbuildtest/tiny:{unique}"
    cleanup_images.append(tag)
    dockerfile = f"FROM {reg}/nvidia/pytorch:24.05-py3\nRUN echo built > /built.txt\n"
    image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    out = in_image(
        docker_client,
        tag,
        """
        import os, torch, importlib.metadata as md
        x = torch.randn(64, 64)
        assert torch.allclose(x @ torch.eye(64), x)
        print(torch.__version__, md.version("torch"), os.environ["PYTORCH_VERSION"], os.environ["NVIDIA_PYTORCH_VERSION"], open("/built.txt").read().strip())
        """,
    )
    # NGC 24.05's shapes [B24.05][T24.05]: a short env, torch's .nv24.05 local version, pip's nv24.5
    assert out.split() == [
        "2.13.0a0+07cecf4168.nv24.05",
        "2.13.0a0+07cecf4168.nv24.5",
        "2.13.0a0+07cecf4",
        "24.05",
        "built",
    ]
    labels = image.attrs["Config"]["Labels"]
    assert labels["com.nvidia.pytorch.version"] == "2.13.0a0+07cecf4"
    assert labels["com.nvidia.cuda.version"] == "9.0"  # as in every real release
    env = dict(item.split("=", 1) for item in image.attrs["Config"]["Env"])
    assert "PIP_CONSTRAINT" not in env  # NGC's constraint file starts with 25.03
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_REQUIRE_CUDA"] == "cuda>=9.0"
    assert image.attrs["Config"]["Entrypoint"] == ["/opt/nvidia/nvidia_entrypoint.sh"]


@pytest.mark.parametrize("key", [*ngc_facts.STANDIN_KEYS, ngc_facts.CUDA_STANDIN_KEY])
def test_every_standin_carries_its_release_s_recorded_facts(testbed, key):
    """The bed is the real world's twin: each release's config says what tests/ngc_facts.py records, on
    both platforms of its manifest list (the arm64 config differs, as NGC's does)."""
    reg = testbed["IMGBUILD_TESTBED_REGISTRY"]
    real = ngc_facts.REAL[key]
    listing = _get(f"http://{reg}/v2/{real.repo}/manifests/{real.tag}", LIST_TYPES)
    assert {m["platform"]["architecture"] for m in listing["manifests"]} == {"amd64", "arm64"}
    for entry in listing["manifests"]:
        platform = entry["platform"]["architecture"]
        manifest = _get(f"http://{reg}/v2/{real.repo}/manifests/{entry['digest']}", LIST_TYPES)
        config = _get(f"http://{reg}/v2/{real.repo}/blobs/{manifest['config']['digest']}", "*/*")
        env = dict(item.split("=", 1) for item in config["config"]["Env"])
        want = real.config_env(platform)
        for name in (
            "CUDA_VERSION",
            "CUDA_DRIVER_VERSION",
            "NVIDIA_REQUIRE_CUDA",
            "NVIDIA_VISIBLE_DEVICES",
            "NVIDIA_PYTORCH_VERSION",
            "NVIDIA_TENSORFLOW_VERSION",
            "PIP_CONSTRAINT",
            "NVIDIA_BUILD_ID",
        ):
            assert env.get(name) == want.get(name), (platform, name)
        if key != ngc_facts.CUDA_STANDIN_KEY:  # the CUDA stand-in says what it has installed (README's table)
            for name in ("CUDNN_VERSION", "NCCL_VERSION", "TORCH_CUDA_ARCH_LIST"):
                assert env.get(name) == want.get(name), (platform, name)
        elif platform == "arm64":
            assert env["TORCH_CUDA_ARCH_LIST"] == want["TORCH_CUDA_ARCH_LIST"]
        version = env[real.version_env]
        assert version.partition("+")[2] == want[real.version_env].partition("+")[2], platform
        assert config["config"]["Labels"]["com.nvidia.cuda.version"] == "9.0"


PYTORCH_STANDINS = [k for k in (*ngc_facts.STANDIN_KEYS, ngc_facts.CUDA_STANDIN_KEY) if k.startswith("pytorch:")]


@pytest.mark.parametrize("key", PYTORCH_STANDINS)
def test_every_pytorch_standin_carries_ngc_s_bundled_distributions_in_its_freeze_and_constraint_file(
    testbed, docker_client, key
):
    """What NGC ships beside torch is installed as far as pip can tell, and pinned where NGC's constraint file is."""
    real = ngc_facts.REAL[key]
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/{real.repo}:{real.tag}"
    out = in_image(
        docker_client,
        image,
        """
        import json, os, subprocess, sys
        freeze = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True,
                                text=True, check=True).stdout.split()
        path = os.environ.get("PIP_CONSTRAINT", "")
        pinned = open(path).read().split() if path else []
        print(json.dumps({"freeze": freeze, "constraint": pinned}))
        """,
    )
    found = json.loads(out.strip().splitlines()[-1])
    want = ngc_facts.standin(key, ngc_facts.BED_TORCH_PUBLIC)["bundled"]
    assert want and set(want) <= set(found["freeze"])
    assert set(want) <= set(found["constraint"]) if real.constraint_file else found["constraint"] == []


def test_the_cuda_standin_has_nvcc_of_its_cuda_major_and_a_torchvision_that_imports(testbed, docker_client):
    real = ngc_facts.REAL[ngc_facts.CUDA_STANDIN_KEY]
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/{real.repo}:{real.tag}"
    out = in_image(
        docker_client,
        image,
        """
        import subprocess, torchvision
        print(torchvision.__version__)
        print(subprocess.run(["/usr/local/cuda/bin/nvcc", "-V"], capture_output=True, text=True, check=True).stdout)
        """,
    )
    assert out.splitlines()[0] == ngc_facts.standin(ngc_facts.CUDA_STANDIN_KEY, "0")["bundled"][0].split("==")[1]
    assert f"release {real.env['CUDA_VERSION'].split('.')[0]}." in out


def test_the_entrypoint_prints_ngc_s_banner_and_runs_the_command(testbed, docker_client):
    """NGC's entrypoint: the banner on stdout first, NVIDIA_CPU_ONLY=1 without a driver, then the command."""
    out = docker_client.containers.run(
        f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:26.01-py3",
        ["sh", "-c", "echo CPU_ONLY=$NVIDIA_CPU_ONLY"],
        remove=True,
    ).decode()
    assert "== PyTorch ==" in out and "NVIDIA Release 26.01" in out and "PyTorch Version 2.13.0a0+a36e1d3" in out
    assert "GOVERNING TERMS" in out  # the license text of the 26.x releases
    assert "WARNING: The NVIDIA Driver was not detected." in out
    assert out.rstrip().splitlines()[-1] == "CPU_ONLY=1"


LIST_TYPES = (
    "application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json"
)


def _get(url: str, accept: str) -> dict:
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.load(resp)


def test_registry_lists_the_pushed_standin_tags(testbed):
    reg = testbed["IMGBUILD_TESTBED_REGISTRY"]
    with urllib.request.urlopen(f"http://{reg}/v2/nvidia/pytorch/tags/list", timeout=10) as resp:
        tags = json.load(resp)["tags"]
    assert {"23.10-py3", "24.05-py3", "25.10-py3", "26.01-py3"} <= set(tags)
    with urllib.request.urlopen(f"http://{reg}/v2/nvidia/tensorflow/tags/list", timeout=10) as resp:
        assert {"24.05-tf2-py3", "25.02-tf2-py3"} <= set(json.load(resp)["tags"])


def test_tensorflow_standin_carries_real_tensorflow(testbed, docker_client):
    """NGC's TensorFlow is the `tensorflow` distribution with an +nvYY.M version; tf.__version__ and the env
    are bare [TF25.02b]."""
    out = in_image(
        docker_client,
        f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/tensorflow:25.02-tf2-py3",
        """
        import os, importlib.metadata as md
        import tensorflow as tf
        assert float(tf.reduce_sum(tf.ones([3, 3]))) == 9.0
        print(tf.__version__ == os.environ["TENSORFLOW_VERSION"], md.version("tensorflow").endswith("+nv25.2"))
        """,
    )
    assert out.split()[-2:] == ["True", "True"]


def test_second_run_of_up_is_fast_and_prints_settings(testbed):
    proc = subprocess.run([str(TESTBED_UP), "--all"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pairs = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line and " " not in line)
    assert pairs["IMGBUILD_NGC_REGISTRY"] == testbed["IMGBUILD_TESTBED_REGISTRY"]
    seconds = int(proc.stderr.strip().splitlines()[-1].split("s]")[0].split()[-1])
    assert seconds < 60, proc.stderr
