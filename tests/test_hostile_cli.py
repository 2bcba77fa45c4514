"""Clumsy and hostile uses of the commands themselves, and of what a registry says about a base."""

from __future__ import annotations

import json
import socket

import pytest

from imgbuild.errors import RecipeError
from imgbuild.pipeline.plan import make_plan
from imgbuild.recipe import load_recipe
from tests.conftest import run_cli
from tests.support import DIGEST, STANDIN_CONFIG, fake_inspect, settings

HEAD = 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\n'


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# (id, pip lines, line, words): every conflict at once, at its line
PLAN_CONFLICTS = [
    (
        "tensorflow-in-pytorch",
        "pip: [tensorflow==2.16.1]\n",
        3,
        "tensorflow is tensorflow, but the base is a pytorch image",
    ),
    (
        "torch-from-url",
        "pip: ['torch @ https://download.pytorch.org/whl/cpu/torch-2.1.0.whl']\n",
        3,
        "torch from a URL would replace the base's torch",
    ),
    (
        "cuda-lib-from-url",
        "pip: ['nvidia-cudnn-cu12 @ https://example.org/cudnn.whl']\n",
        3,
        "nvidia-cudnn-cu12 would replace a CUDA library of the base",
    ),
    ("torch-range", "pip: ['torch<2.3']\n", 3, "torch<2.3 conflicts with the base's torch 2.4.0a0+07cecf4"),
    ("torch-prerelease", "pip: ['torch>=2.4']\n", 3, "torch>=2.4 is not met by the base's torch 2.4.0a0+07cecf4"),
]


@pytest.mark.parametrize("case_id,pip,line,words", PLAN_CONFLICTS, ids=[c[0] for c in PLAN_CONFLICTS])
def test_framework_conflicts_name_the_right_framework_and_line(case_id, pip, line, words, write):
    path = write("r.yaml", HEAD + pip)
    with pytest.raises(RecipeError) as info:
        make_plan(load_recipe(path), settings(), fake_inspect)
    assert any(f"r.yaml:{line}:" in ln and words in ln for ln in info.value.lines()), info.value.lines()


def test_requirements_file_conflicts_are_all_reported_with_their_lines(write):
    write("requirements.txt", "einops\ntorch==2.9.1\nnvidia-cublas-cu12==12.1.0\ntensorflow\n")
    path = write("r.yaml", HEAD + "pip: {requirements: requirements.txt}\n")
    with pytest.raises(RecipeError) as info:
        make_plan(load_recipe(path), settings(), fake_inspect)
    lines = info.value.lines()
    assert [ln.split(": pip.requirements:")[0].rsplit(":", 2)[-2] for ln in lines] == ["2", "3", "4"], lines


@pytest.mark.parametrize("env_value", ["2.13.0\n--extra-index-url http://evil/simple", "2.13.0\rRUN id"])
def test_a_base_config_with_a_multiline_version_never_reaches_the_context(env_value, write, tmp_path):
    """The image config comes from a registry: a newline in PYTORCH_VERSION must not become a pip option
    in constraints.txt or an instruction in the Dockerfile."""
    from tests.support import render_context

    config = json.loads(json.dumps(STANDIN_CONFIG))
    config["config"]["Env"] = [e for e in config["config"]["Env"] if not e.startswith("PYTORCH_VERSION=")]
    config["config"]["Env"].append(f"PYTORCH_VERSION={env_value}")
    path = write("r.yaml", HEAD + "pip: [einops]\n")
    plan = make_plan(load_recipe(path), settings(), lambda ref: (DIGEST, config))
    ctx = render_context(plan, tmp_path / "ctx")
    for rendered in ("Dockerfile", "imgbuild/pip/constraints.txt", "imgbuild/pip/requirements.txt"):
        assert "evil" not in (ctx / rendered).read_text() and "RUN id" not in (ctx / rendered).read_text()


def test_a_malformed_digest_from_the_registry_is_not_pinned(write, tmp_path):
    from tests.support import render_context

    path = write("r.yaml", HEAD)
    plan = make_plan(load_recipe(path), settings(), lambda ref: ("sha256:abc\nRUN id", STANDIN_CONFIG))
    dockerfile = (render_context(plan, tmp_path / "ctx") / "Dockerfile").read_text()
    assert "RUN id" not in dockerfile and "FROM registry.test:5000/nvidia/pytorch:24.05-py3\n" in dockerfile


def test_render_with_no_registry_says_offline_exists(write):
    path = write("r.yaml", HEAD)
    result = run_cli("render", str(path), "--stdout", env={"IMGBUILD_NGC_REGISTRY": f"127.0.0.1:{_dead_port()}"})
    assert result.code == 3, result.err
    assert "--offline" in result.err and result.err.count("\n") == 1


def test_export_to_standard_output(write, tmp_path):
    path = write("r.yaml", HEAD)
    result = run_cli("export", str(path), "--apptainer", "-o", "-", "--no-build", cwd=tmp_path)
    assert result.code == 0, result.err
    assert "\nBootstrap: docker-daemon\n" in result.out
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("name", ["bad name", "../x", "x;id", "-rf", "a" * 65])
def test_run_refuses_a_bad_container_name_without_an_unrelated_hint(name):
    result = run_cli("run", "ubuntu", "--name", name, "--dry-run", "--", "true")
    assert result.code == 2, result.err
    assert "--name" in result.err and "rlimit" not in result.err


def test_an_invalid_recipe_is_exit_2_even_with_no_engine(write):
    path = write("r.yaml", HEAD + "apt: ['git\\n']\n")
    result = run_cli("build", str(path), env={"DOCKER_HOST": f"tcp://127.0.0.1:{_dead_port()}"})
    assert result.code == 2, result.err
    assert "apt[0]" in result.err


@pytest.mark.engine
def test_sdk_backend_with_index_credentials_refuses_before_writing_anything(write, tmp_path, testbed):
    path = write("r.yaml", HEAD + "pip: [einops]\n")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "keep.txt").write_text("the previous context")
    result = run_cli(
        "build",
        str(path),
        "--backend",
        "sdk",
        "-o",
        str(ctx),
        env={"IMGBUILD_PIP_INDEX_URL": "https://bob:CANARY@pypi.example/simple"},
    )
    assert result.code == 2, result.err
    assert "need the buildkit backend" in result.err and "CANARY" not in result.err
    assert sorted(p.name for p in ctx.iterdir()) == ["keep.txt"]


# --- engine-free: these need no test bed ---------------------------------------------------------------


def test_no_engine_exits_3_with_one_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: demo\nbase: {framework: pytorch, tag: "24.05"}\n')
    res = run_cli("build", str(recipe), env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    assert res.code == 3, res.err
    lines = [ln for ln in res.err.splitlines() if ln.startswith("imgbuild:")]
    assert len(lines) == 1 and "no Docker engine" in lines[0] and "start dockerd" in lines[0], res.err
    assert "Traceback" not in res.err


def test_cli_basics():
    assert run_cli("--version").out.strip().startswith("imgbuild, version")
    helptext = run_cli("--help").out
    for section in ("Recipes:", "Images:", "Settings:"):
        assert section in helptext
    res = run_cli("nonsense")
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1 and "No such command" in res.err


@pytest.mark.parametrize(
    "url, words",
    [
        (
            "http+docker://localhost/v1.41/build?t=x",
            "the container engine stopped answering mid-command (ConnectionError",
        ),
        (None, "the container engine stopped answering mid-command"),
        ("https://idx.example/simple/x/", "lost the connection to idx.example (ConnectionError)"),
    ],
)
def test_a_connection_that_breaks_mid_command_names_what_broke_and_is_exit_3(url, words):
    """An engine restarted mid-build: the SDK raises a requests error (an OSError, with no file): the line says which
    service broke and what to do, never "cannot use: ('Connection aborted.', ...)"."""
    import requests

    from imgbuild.errors import EXIT_ENVIRONMENT, ending

    request = requests.PreparedRequest()
    request.url = url
    exc = requests.ConnectionError(("Connection aborted.", ConnectionResetError(104, "reset")), request=request)
    (line,), code = ending(exc)
    assert code == EXIT_ENVIRONMENT and words in line and "Connection aborted" not in line
