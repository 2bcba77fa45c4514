"""What several test modules share: the stand-in base's registry answer and plans made from it, a Slurm job's
step and its end, the recorded nvidia-smi servers, the pip guard loaded as a module, the real NGC bases' configs.
Test modules import these from here, never from each other; fixtures live in conftest.py."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import pwd
import re
import subprocess
import time
from pathlib import Path

from imgbuild.config.settings import load_settings
from imgbuild.gpu.read import SmiReader
from imgbuild.pipeline.context import write_context
from imgbuild.pipeline.plan import make_plan
from imgbuild.pipeline.render import render
from imgbuild.recipe import load_recipe
from tests import ngc_facts

#: What the registry says of nvcr.io/nvidia/pytorch:24.05-py3, in the real image's strings (tests/ngc_facts.py).
_REAL_24_05 = ngc_facts.REAL["pytorch:24.05-py3"]


STANDIN_CONFIG = {
    "config": {
        "Env": [f"{k}={v}" for k, v in _REAL_24_05.config_env().items()],
        "Labels": _REAL_24_05.labels(),
    }
}


DIGEST = "sha256:" + "ab" * 32


def fake_inspect(ref: str):
    return DIGEST, STANDIN_CONFIG


def settings(**extra):
    return load_settings({"ngc_registry": "registry.test:5000", "user": "alice", **extra}, environ={})


def render_context(plan, out_dir, backend="buildkit"):
    """Render and write a context, as `imgbuild render -o` does."""
    return write_context(render(plan, backend), out_dir)


def plan_for(path, **extra):
    return make_plan(load_recipe(path), settings(**extra), fake_inspect)


def plan_of(recipe: Path):
    config = {"config": {"Env": ["PYTORCH_VERSION=2.13.0+cpu", "CUDA_VERSION=12.4.1.003"]}}
    settings = load_settings({"user": "lab", "ngc_registry": "nvcr.io"}, environ={})
    return make_plan(load_recipe(recipe), settings, lambda ref: ("sha256:" + "cd" * 32, config))


def step_line(script: str) -> str:
    """The job's step: the srun that runs the command (not the staging or sampling ones)."""
    for line in script.splitlines():
        if line.startswith("srun ") and not line.startswith(('srun --ntasks="$SLURM_NNODES"', "srun --overlap")):
            return line.removesuffix(" || status=$?").removesuffix(" &")
    raise AssertionError("no step in the script")


def wait_for(job_id: str, conf: str, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, env={**os.environ, "SLURM_CONF": conf}
        ).stdout
        state = re.search(r"JobState=(\w+)", out).group(1) if "JobState=" in out else "GONE"
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "GONE"):
            return state
        time.sleep(1)
    return state


DATA = Path(__file__).parent / "data"


OWNERS = {
    122956: ("alice", "alice_bert_1"),
    2391: ("bob", ""),
    40211: ("me", "me_dev_1"),
    51877: ("me", "me_train_2"),
    2312: ("carol", "carol_lm_1"),
    2381: ("carol", "carol_lm_1"),
    2383: ("carol", "carol_lm_1"),
}


def server(name: str) -> list:
    text = {q: (DATA / f"smi-{name}-{q}.csv").read_text() for q in ("gpus", "apps")}
    gpus = SmiReader(run=lambda args: text["gpus" if args[0].startswith("--query-gpu") else "apps"]).read()
    for gpu in gpus:
        for proc in gpu.processes:
            proc.user, proc.container = OWNERS[proc.pid]
    return gpus


def users_home(tmp_path, monkeypatch):
    """A home folder the reaper takes for any user's (theirs to own: this test's own user)."""
    home = tmp_path / "home"
    home.mkdir()
    me = pwd.getpwuid(os.getuid())
    fake = pwd.struct_passwd((me.pw_name, "x", os.getuid(), os.getgid(), "", str(home), "/bin/sh"))
    monkeypatch.setattr("imgbuild.servers.reap.pwd.getpwnam", lambda name: fake)
    return home


GUARD = Path(__file__).parent.parent / "imgbuild" / "payload" / "pip_guard.py"


def guard_module():

    spec = importlib.util.spec_from_file_location("pip_guard", GUARD)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def real_base(key: str):
    from imgbuild import ngc
    from imgbuild.pipeline import plan
    from tests.ngc_facts import REAL

    release = REAL[key]
    env = release.config_env("amd64")
    config = {"config": {"Env": [f"{k}={v}" for k, v in env.items()], "Labels": release.labels("amd64")}}
    return plan.BaseImage(ref=f"nvcr.io/{release.repo}:{release.tag}", env=env, facts=ngc.describe_config(config))


#: The two lines every recipe needs: a name and an NGC base.
RECIPE_HEAD = 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\n'


def refusal_lines(tmp_path, text: str) -> list[str]:
    """The lines a recipe of `text` is refused with (exit 2), as the user sees them."""
    import pytest

    from imgbuild.errors import RecipeError
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir(exist_ok=True)
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.exit_code == 2
    return info.value.lines()


def demo_recipe(folder: Path, body: str = 'env: {A: "1"}\n') -> Path:
    """`demo.yaml` (alice/demo:v1 on NGC PyTorch 24.05) in a folder that is a repository's root."""
    (folder / ".git").mkdir(exist_ok=True)
    path = folder / "demo.yaml"
    path.write_text('name: demo\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\n' + body)
    return path


def imgbuild_here(capsys, *argv: str) -> tuple[int, str, str]:
    """imgbuild's entry point in this process (exit code, stdout, stderr): the CLI as a user runs it, without a new
    interpreter's start (a fast test of a command's output and exit code)."""
    import pytest

    from imgbuild.cli import main

    with pytest.raises(SystemExit) as ended:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(ended.value.code or 0), out, err


#: The image the launchers' own code runs in: the 24.05 stand-in (torch) with PyPI's accelerate and deepspeed.
LAUNCHERS_RECIPE = (
    'name: launchers\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\npip:\n  packages: [accelerate, deepspeed]\n'
)


def workflow_checks(project: Path, env: dict[str, str] | None = None) -> list:
    """The `imgbuild` steps of the pull-request job of the workflow `init --ci github` wrote, each run as a runner
    runs it (the workflow's env: values, from the repository's root): (step, Result) in order."""
    import shlex

    import yaml

    from tests.conftest import run_cli

    workflow = yaml.safe_load((project / ".github" / "workflows" / "images.yml").read_text())
    named = workflow["env"]
    ran = []
    for step in [s["run"] for s in workflow["jobs"]["check"]["steps"] if "imgbuild " in s.get("run", "")]:
        words = [re.sub(r"\$(RECIPES|RECIPE)\b", lambda m: named[m.group(1)], w) for w in shlex.split(step)[1:]]
        ran.append((step, run_cli(*words, cwd=project, env=env)))
    return ran


@contextlib.contextmanager
def buildkit_gate():
    """The bed's BuildKit gate held exclusively (tests/testbed/docker-gated): no build of another line runs while a
    test empties the whole build cache, and none starts until it is done."""
    with open(os.environ.get("IMGBUILD_BUILD_GATE_FILE", "/tmp/imgbuild-buildkit-gate"), "a") as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
