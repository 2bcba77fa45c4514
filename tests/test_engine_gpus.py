"""imgbuild.engine: how a container is kept from the host's GPUs, on every path that starts one."""

from __future__ import annotations

import shlex

from imgbuild.engine.noderun import NodeRun, docker_prefix
from imgbuild.engine.runargs import GPUS_HIDDEN, run_argv
from imgbuild.engine.scriptrun import script_env
from imgbuild.engine.types import RunOptions


def _flagged(words: list[str]) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words) if word == "-e"]


def _node_variables(job: NodeRun) -> list[str]:
    """The `-e` values of the `docker run` a Slurm step's shell runs, as that shell splits them."""
    script = docker_prefix(job)[2]
    return _flagged(shlex.split(script.split("docker run ", 1)[1].split(" & wait", 1)[0]))


def test_every_path_that_starts_a_container_without_gpus_hides_them_the_same_way():
    """`run`, a script (smoke test, probe) and a Slurm node's docker: NVIDIA's runtime and CUDA both told none,
    the hiding the last word over an image's or a user's own value."""
    hidden = [f"{key}={value}" for key, value in GPUS_HIDDEN]
    assert hidden == ["NVIDIA_VISIBLE_DEVICES=void", "CUDA_VISIBLE_DEVICES="]
    mine = (("CUDA_VISIBLE_DEVICES", "0"), ("A", "1"))
    _argv, run_env = run_argv(RunOptions(image="img", env=mine))
    assert run_env == {"A": "1", **dict(GPUS_HIDDEN)} and list(run_env)[-2:] == [k for k, _ in GPUS_HIDDEN]
    assert script_env(dict(mine), None) == run_env
    node = _node_variables(NodeRun(image="img"))
    assert node[-2:] == hidden


def test_a_container_given_gpus_sees_exactly_those_however_the_engine_is_handed_them():
    """By `--gpus`, by CDI device or by the variable alone: NVIDIA_VISIBLE_DEVICES names the GPUs given, the last
    word over a user's or an NGC image's `all` (a default nvidia runtime reads it beside a CDI request)."""
    mine = (("NVIDIA_VISIBLE_DEVICES", "all"), ("A", "1"))
    for how in ({}, {"gpus_by_cdi": True}, {"gpus_by_env": True}):
        _argv, env = run_argv(RunOptions(image="img", env=mine, gpus=("GPU-1", "GPU-3"), **how))  # type: ignore[arg-type]
        assert env == {"A": "1", "NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-3"} and "CUDA_VISIBLE_DEVICES" not in env
    assert script_env({"A": "1"}, ["GPU-2"]) == {"A": "1", "NVIDIA_VISIBLE_DEVICES": "GPU-2"}
    assert script_env({"A": "1"}, []) == {"A": "1"}  # all GPUs asked for
    node = _node_variables(NodeRun(image="img", gpus=2, gpu_flag="env"))
    assert [v for v in node if "VISIBLE_DEVICES" in v] == ["NVIDIA_VISIBLE_DEVICES=${SLURM_STEP_GPUS:-$SLURM_JOB_GPUS}"]
