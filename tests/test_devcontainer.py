"""`imgbuild export --devcontainer`: the document (pure), and the real Dev Containers CLI (`@devcontainers/cli`
from the npm registry, installed by the test bed) starting it on the test bed's dockerd."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from imgbuild.devcontainer import devcontainer
from imgbuild.errors import UsageError
from imgbuild.run import house_rules
from tests import ngc_facts
from tests.conftest import run_cli
from tests.test_cluster import plan_of


def test_the_document_carries_the_house_rules_and_the_recipes_user(tmp_path):
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: dev\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\nuser: {name: researcher}\n')
    plan = plan_of(recipe)
    house = house_rules(
        {
            "mounts": ["/work/{user}:/work/{user}", "/datasets:/datasets:ro"],
            "env": {"NCCL_DEBUG": "WARN"},
            "ulimits": {"memlock": "-1"},
        }
    )
    doc = devcontainer(plan, house)
    assert doc["image"] == "lab/dev:v1" and doc["hostRequirements"] == {"gpu": "optional"}
    assert doc["remoteUser"] == doc["containerUser"] == "researcher" and doc["updateRemoteUserUID"] is True
    assert "--ipc=host" in doc["runArgs"] and "--ulimit=memlock=-1" in doc["runArgs"]
    assert "--log-opt=max-size=50m" in doc["runArgs"] and not any("--gpus" in a for a in doc["runArgs"])
    assert doc["mounts"] == [
        "source=/work/${localEnv:USER},target=/work/${localEnv:USER},type=bind",
        "source=/datasets,target=/datasets,type=bind,readonly",
    ]
    assert doc["containerEnv"] == {"NCCL_DEBUG": "WARN"}
    assert doc["workspaceFolder"] == "/workspace"
    shm = devcontainer(plan, house_rules({"shm_size": "16g"}))
    assert "--shm-size=16g" in shm["runArgs"] and not any(a.startswith("--ipc") for a in shm["runArgs"])
    with pytest.raises(UsageError, match="is not SOURCE:/TARGET"):
        devcontainer(plan, house_rules({"mounts": ["/data"]}))


def test_export_needs_exactly_one_target(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: dev\nbase: {framework: pytorch, tag: "24.05"}\n')
    for flags in ([], ["--apptainer", "--devcontainer"]):
        res = run_cli("export", str(recipe), *flags)
        assert res.code == 2 and "one of --apptainer or --devcontainer" in res.err and "Traceback" not in res.err


@pytest.mark.engine
def test_the_dev_containers_cli_starts_the_exported_container(testbed, tmp_path, unique, cleanup_images):
    cli = testbed.get("IMGBUILD_TESTBED_DEVCONTAINER", "")
    assert cli and os.access(cli, os.X_OK), "tests/testbed/up installs @devcontainers/cli"
    (tmp_path / ".git").mkdir()
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "dev.yaml"
    recipe.write_text(
        f'name: dev-{unique}\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\nuser: {{name: researcher}}\n'
    )
    built = run_cli("build", str(recipe), cwd=tmp_path)
    assert built.code == 0, built.err
    cleanup_images.append(built.out.strip().splitlines()[-1].split(" -> ")[0])
    # this engine cannot raise memlock: the site lowers it, as README says
    config = tmp_path / "config.yaml"
    config.write_text("run:\n  ulimits: {memlock: 8388608, stack: 67108864}\n")
    exported = run_cli("export", str(recipe), "--devcontainer", cwd=tmp_path, env={"IMGBUILD_CONFIG": str(config)})
    assert exported.code == 0 and exported.out.strip() == ".devcontainer/devcontainer.json", exported.err
    (tmp_path / "train.py").write_text("print('hello')\n")
    # CI runs as root, and the CLI moves the container user's UID to the local one only for non-root
    # users: the workspace must be readable by the image's UID 1000 here, as it is by its owner elsewhere.
    tmp_path.chmod(0o755)
    args = ["--workspace-folder", str(tmp_path), "--docker-path", testbed["IMGBUILD_DOCKER_CLI"]]
    try:
        up = subprocess.run([cli, "up", *args], capture_output=True, text=True, timeout=600)
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        outcome = json.loads(up.stdout.strip().splitlines()[-1])
        assert outcome["outcome"] == "success" and outcome["remoteUser"] == "researcher"
        probe = "id -un; pwd; cat train.py; python3 -c 'import torch; print(torch.__version__)'"
        run = subprocess.run([cli, "exec", *args, "sh", "-c", probe], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == ["researcher", "/workspace", "print('hello')", ngc_facts.BED_TORCH], run.stderr[
            -1500:
        ]
    finally:
        subprocess.run(
            f"docker ps -aq --filter label=devcontainer.local_folder={tmp_path} | xargs -r docker rm -f",
            shell=True,
            capture_output=True,
        )
        # the CLI's own UID-update image, named after the workspace folder
        subprocess.run(
            f"docker images --format '{{{{.Repository}}}}' | grep '^vsc-{tmp_path.name.lower()}-' | xargs -r docker rmi",
            shell=True,
            capture_output=True,
        )
