"""The test bed is real: an engine that builds FROM the stand-in base, real PyTorch inside, a registry."""

from __future__ import annotations

import io
import json
import subprocess
import urllib.request

import pytest

from tests.conftest import TESTBED_UP, in_image

pytestmark = pytest.mark.engine


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
        import os, torch
        x = torch.randn(64, 64)
        assert torch.allclose(x @ torch.eye(64), x)
        print(torch.__version__, os.environ["PYTORCH_VERSION"], os.environ["NVIDIA_PYTORCH_VERSION"], open("/built.txt").read().strip())
        """,
    )
    assert out.split() == ["2.13.0+cpu", "2.13.0+cpu", "24.05", "built"]
    labels = image.attrs["Config"]["Labels"]
    assert labels["com.nvidia.pytorch.version"] == "2.13.0+cpu"
    assert "PIP_CONSTRAINT=/etc/pip/constraint.txt" in image.attrs["Config"]["Env"]


def test_registry_lists_the_pushed_standin_tags(testbed):
    reg = testbed["IMGBUILD_TESTBED_REGISTRY"]
    with urllib.request.urlopen(f"http://{reg}/v2/nvidia/pytorch/tags/list", timeout=10) as resp:
        tags = json.load(resp)["tags"]
    assert {"24.05-py3", "23.10-py3"} <= set(tags)
    with urllib.request.urlopen(f"http://{reg}/v2/nvidia/tensorflow/tags/list", timeout=10) as resp:
        assert "24.05-tf2-py3" in json.load(resp)["tags"]


def test_tensorflow_standin_carries_real_tensorflow(testbed, docker_client):
    out = in_image(
        docker_client,
        f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/tensorflow:24.05-tf2-py3",
        """
        import os
        import tensorflow as tf
        assert float(tf.reduce_sum(tf.ones([3, 3]))) == 9.0
        print(tf.__version__ == os.environ["TENSORFLOW_VERSION"])
        """,
    )
    assert out.strip() == "True"


def test_second_run_of_up_is_fast_and_prints_settings(testbed):
    proc = subprocess.run([str(TESTBED_UP)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pairs = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line and " " not in line)
    assert pairs["IMGBUILD_NGC_REGISTRY"] == testbed["IMGBUILD_TESTBED_REGISTRY"]
    seconds = int(proc.stderr.strip().splitlines()[-1].split("s]")[0].split()[-1])
    assert seconds < 60, proc.stderr
