"""`imgbuild export --devcontainer`: the document (pure), and the real Dev Containers CLI (`@devcontainers/cli`
from the npm registry, installed by the test bed) starting it on the test bed's dockerd."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from imgbuild.clusters.devcontainer import devcontainer
from imgbuild.config.site import run_rules
from imgbuild.errors import UsageError
from tests import ngc_facts
from tests.conftest import run_cli, use_site_config
from tests.support import plan_of


def test_the_document_carries_the_run_rules_and_the_recipes_user(tmp_path):
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: dev\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\nuser: {name: researcher}\n')
    plan = plan_of(recipe)
    house = run_rules(
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
    shm = devcontainer(plan, run_rules({"shm_size": "16g"}))
    assert "--shm-size=16g" in shm["runArgs"] and not any(a.startswith("--ipc") for a in shm["runArgs"])
    with pytest.raises(UsageError, match="is not SOURCE:/TARGET"):
        devcontainer(plan, run_rules({"mounts": ["/data"]}))


def test_a_recipe_without_a_user_runs_as_the_host_user_never_root(tmp_path):
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: dev\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\n')
    doc = devcontainer(plan_of(recipe), run_rules({}), host_user=(1001, 1002))
    assert doc["containerUser"] == doc["remoteUser"] == "1001:1002" and doc["updateRemoteUserUID"] is False
    assert doc["containerEnv"]["HOME"] == "/tmp/home"  # the image has no account, so no home, for that UID
    as_root = devcontainer(plan_of(recipe), run_rules({}), host_user=(0, 0))
    assert not {"containerUser", "remoteUser", "containerEnv"} & set(as_root)


def test_a_recipe_never_built_is_refused_before_anything_is_written(tmp_path):
    from imgbuild.clusters.devcontainer import export_devcontainer
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.fake import FakeEngine

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "dev.yaml"
    recipe.write_text('name: dev\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\n')
    with pytest.raises(UsageError, match=r"^lab/dev:v1 is not built here: build it first \(imgbuild build "):
        export_devcontainer(plan_of(recipe), recipe, load_settings({}), tmp_path / "devc", None, FakeEngine)
    assert not (tmp_path / "devc").exists()


def _built(plan):
    """An engine holding `plan`'s image, as after `imgbuild build`."""
    from imgbuild.engine.fake import FakeEngine

    engine = FakeEngine()
    engine.add_image(plan.target)
    return lambda: engine


def test_export_needs_exactly_one_target(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: dev\nbase: {framework: pytorch, tag: "24.05"}\n')
    for flags in ([], ["--apptainer", "--devcontainer"]):
        res = run_cli("export", str(recipe), *flags)
        assert (
            res.code == 2
            and "one of --apptainer, --devcontainer, --oci DIR or --sqsh FILE" in res.err
            and "Traceback" not in res.err
        )


def _shared_server(tmp_path, monkeypatch, gpus: list) -> None:
    """A shared server: the site's run rules (GPUs by variable, state here) and a snapshot of its GPUs."""
    from imgbuild.gpu.read import Gpu

    snapshot = tmp_path / "gpus.json"
    snapshot.write_text(
        json.dumps(
            {"gpus": [Gpu(i, f"GPU-{i:08d}-devc", "Tesla V100-SXM2-32GB", 1000, 32768, u).to_json() for i, u in gpus]}
        )
    )
    site = tmp_path / "site.yaml"
    site.write_text(f"run: {{gpu_flag: env, cpus_per_gpu: 1, state_dir: {tmp_path / 'state'}}}\n")
    use_site_config(monkeypatch, str(site))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))


def test_on_a_shared_server_the_container_gets_what_run_would_give(tmp_path, monkeypatch):
    """`hostRequirements.gpu` made the Dev Containers CLI add `--gpus all` (every GPU of a shared
    server), with no name or labels, so quotas, `ps`, `gpus` and the reaper did not see it. Now the GPUs
    `run --gpus N` would pick (least used first), by UUID, the caller's name and labels, a CPU share."""
    from imgbuild.clusters.devcontainer import export_devcontainer
    from imgbuild.config.settings import load_settings
    from imgbuild.hostio.host import caller

    _shared_server(tmp_path, monkeypatch, [(0, 90), (1, 0), (2, 0)])
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "dev.yaml"
    recipe.write_text('name: dev\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\n')
    settings = load_settings({})
    plan = plan_of(recipe)
    path, notes = export_devcontainer(plan, recipe, settings, tmp_path / "devc", "2", _built(plan))
    doc = json.loads(path.read_text())
    me = caller().name
    assert "hostRequirements" not in doc
    assert f"--name={me}_dev_1" in doc["runArgs"] and f"--label=org.imgbuild.user={me}" in doc["runArgs"]
    assert "--label=org.imgbuild.gpus=1,2" in doc["runArgs"]
    assert doc["containerEnv"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-00000001-devc,GPU-00000002-devc"
    assert "--cpus=2" in doc["runArgs"] and doc["containerEnv"]["OMP_NUM_THREADS"] == "1"
    assert notes[0] == f"GPUs 1,2, container {me}_dev_1" and any("no deadline" in n for n in notes)
    # no --gpus on a shared server: no GPU at all, never every GPU
    path, notes = export_devcontainer(plan, recipe, settings, tmp_path / "none", None, _built(plan))
    doc = json.loads(path.read_text())
    assert "hostRequirements" not in doc and doc["containerEnv"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert notes[0].startswith("GPUs none (--gpus N to ask)")


def test_export_gpus_is_for_dev_containers_only(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: dev\nbase: {framework: pytorch, tag: "24.05"}\n')
    res = run_cli("export", str(recipe), "--apptainer", "--gpus", "1")
    assert res.code == 2 and "--gpus is for --devcontainer" in res.err


@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
@pytest.mark.alone
@pytest.mark.engine
def test_the_dev_containers_cli_starts_the_exported_container(testbed, tmp_path, unique, cleanup_images, monkeypatch):
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
        # on a shared server: the container the CLI starts is the one `imgbuild run` would
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o755)
        (shared / ".git").mkdir()
        _shared_server(tmp_path, monkeypatch, [(0, 80), (1, 0)])
        site = tmp_path / "site.yaml"
        site.write_text(site.read_text().replace("run: {", "run: {ulimits: {memlock: 8388608, stack: 67108864}, "))
        env = {"IMGBUILD_CONFIG": str(config)}
        exported = run_cli(
            "export", str(recipe), "--devcontainer", "--gpus", "1", "-o", str(shared / ".devcontainer"), env=env
        )
        assert exported.code == 0 and "note: GPUs 1, container" in exported.err, exported.err
        up = subprocess.run([cli, "up", *args[:1], str(shared), *args[2:]], capture_output=True, text=True, timeout=600)
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        container = json.loads(up.stdout.strip().splitlines()[-1])["containerId"]
        seen = json.loads(subprocess.run(["docker", "inspect", container], capture_output=True, text=True).stdout)[0]
        labels, env_list = seen["Config"]["Labels"], seen["Config"]["Env"]
        assert seen["Name"].lstrip("/").startswith(labels["org.imgbuild.user"] + f"_dev-{unique}_")
        assert labels["org.imgbuild.gpus"] == "1" and labels["org.imgbuild.gpu-uuids"] == "GPU-00000001-devc"
        assert "NVIDIA_VISIBLE_DEVICES=GPU-00000001-devc" in env_list and seen["HostConfig"]["NanoCpus"] == 10**9
        listed = run_cli("ps", "--json", env=env)
        assert listed.code == 0 and seen["Name"].lstrip("/") in listed.out, listed.err
    finally:
        subprocess.run(
            f"docker ps -aq --filter label=devcontainer.local_folder={tmp_path} | xargs -r docker rm -f; "
            f"docker ps -aq --filter label=devcontainer.local_folder={tmp_path}/shared | xargs -r docker rm -f",
            shell=True,
            capture_output=True,
        )
        # the CLI's own UID-update image, named after the workspace folder
        subprocess.run(
            f"docker images --format '{{{{.Repository}}}}' | grep -E '^vsc-({tmp_path.name.lower()}|shared)-' | xargs -r docker rmi",
            shell=True,
            capture_output=True,
        )


def test_export_never_writes_through_a_link_committed_in_the_repository(tmp_path, monkeypatch):
    """The repository commits the file export writes as a link to a file of the user's: the link is replaced by
    the file, the user's file is untouched."""
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: dev\nimage: lab/dev:v1\nbase: {framework: pytorch, tag: "24.05"}\n')
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own\n")
    for planted in (".devcontainer/devcontainer.json", "dev_v1.def"):  # .def: apptainer's default name
        link = tmp_path / planted
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(victim)
    offline = {"IMGBUILD_NGC_REGISTRY": "127.0.0.1:9"}
    apptainer = run_cli("export", str(recipe), "--apptainer", "--no-build", cwd=tmp_path, env=offline)
    assert apptainer.code == 0, apptainer.err
    from imgbuild.clusters.devcontainer import export_devcontainer
    from imgbuild.config.settings import load_settings

    monkeypatch.chdir(tmp_path)
    plan = plan_of(recipe)
    export_devcontainer(plan, recipe, load_settings({}), None, None, _built(plan))
    assert victim.read_text() == "the user's own\n"
    for planted in (".devcontainer/devcontainer.json", "dev_v1.def"):
        assert not (tmp_path / planted).is_symlink() and (tmp_path / planted).read_text().strip()


def test_export_refuses_a_devcontainer_folder_committed_as_a_link(tmp_path):
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: dev\nimage: lab/dev:v1\nbase: {framework: pytorch, tag: "24.05"}\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / ".devcontainer").symlink_to(elsewhere)
    res = run_cli("export", str(recipe), "--devcontainer", cwd=tmp_path, env={"IMGBUILD_NGC_REGISTRY": "127.0.0.1:9"})
    assert res.code == 2 and "symbolic link" in res.err and not list(elsewhere.iterdir()), res.err
