"""A new user's first week on the test bed, in the order they meet it: `init --from` their requirements file with
the CI workflow, the workflow's pull-request check green as init left it, build, run, `run --jupyter` (the
stand-in has no JupyterLab: said in one line, nothing left), a dev container that is theirs (what it writes into
the project belongs to them), an edit of the requirements, the rebuild, and the workflow green again."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from imgbuild.recipe import load_recipe
from tests.conftest import run_cli
from tests.support import workflow_checks

#: The person whose week it is: a user of the docker group (the dev container is theirs, never root's).
PERSON = (4242, 4343)


def _dev_container_writes_as_the_person(project, recipe, devcontainer_cli: str, docker: str) -> None:
    """`export --devcontainer` as PERSON, started by the Dev Containers CLI: the container runs as them, and the
    file it makes in the project is theirs."""
    from imgbuild.clusters.devcontainer import export_devcontainer
    from imgbuild.config.settings import load_settings
    from imgbuild.engine import connect_engine
    from imgbuild.hostio.host import Caller
    from imgbuild.pipeline.resolve import plan_file

    person = load_settings(who=Caller("person", *PERSON))
    plan = plan_file(recipe, person)
    export_devcontainer(plan, recipe, person, project / ".devcontainer", None, lambda: connect_engine(person))
    project.chmod(0o777)  # the person's project: here a folder of the test's, open to their UID
    args = ["--workspace-folder", str(project), "--docker-path", docker]
    read = subprocess.run([devcontainer_cli, "read-configuration", *args], capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr[-2000:]  # the CLI's own parser takes the document
    assert json.loads(read.stdout)["configuration"]["containerUser"] == "{}:{}".format(*PERSON)
    up = subprocess.run([devcontainer_cli, "up", *args], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    made = subprocess.run([devcontainer_cli, "exec", *args, "sh", "-c", "id -u; id -g; touch made; echo $HOME"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0 and made.stdout.split()[-3:] == [*map(str, PERSON), "/tmp/home"], made.stderr
    assert ((project / "made").stat().st_uid, (project / "made").stat().st_gid) == PERSON


@pytest.mark.alone
@pytest.mark.engine
def test_the_first_week_of_a_new_user_from_init_to_a_green_second_pull_request(
    testbed, tmp_path, unique, docker_client, monkeypatch
):
    project = tmp_path / "thesis"
    (project / ".git").mkdir(parents=True)
    (project / "requirements.txt").write_text("einops==0.8.1\n")
    config = tmp_path / "config.yaml"
    config.write_text("run:\n  ulimits: {memlock: 8388608}\n")  # this engine cannot raise memlock further
    monkeypatch.setenv("IMGBUILD_CONFIG", str(config))
    name = f"thesis-{unique}"
    recipe = project / "recipes" / f"{name}.yaml"
    before = {c.id for c in docker_client.containers.list(all=True)}
    try:
        # day 1: a recipe from the requirements file, on the newest release the registry lists, rendered
        init = run_cli("init", name, "--from", "requirements.txt", "--ci", "github", cwd=project)
        assert init.code == 0, init.err
        assert load_recipe(recipe).recipe.base.tag == "26.01" and "base pytorch 26.01: the newest" in init.err
        assert f"  git add recipes/{name}.yaml images/{name} requirements.txt .github/workflows/images.yml" in init.err
        unbuilt = run_cli("export", f"recipes/{name}.yaml", "--devcontainer", cwd=project)
        assert unbuilt.code == 2 and "is not built here: build it first" in unbuilt.err, unbuilt.err
        assert not (project / ".devcontainer").exists()
        # the first pull request: the workflow's check, as init left the project
        assert all(ran.code == 0 for _, ran in workflow_checks(project)), workflow_checks(project)
        built = run_cli("build", f"recipes/{name}.yaml", cwd=project)
        assert built.code == 0, built.out[-2000:] + built.err[-2000:]
        target = built.out.strip().splitlines()[-1].split(" -> ")[0]
        assert target == f"imgbuildtest/{name}:1", built.out
        ran = run_cli("run", f"recipes/{name}.yaml", "--", "python", "-c",
                      "import einops; print('einops', einops.__version__)", cwd=project)  # fmt: skip
        assert ran.code == 0 and "einops 0.8.1" in ran.out, ran.err
        notebook = run_cli("run", "--jupyter", f"recipes/{name}.yaml", cwd=project)
        assert notebook.code == 2 and "has no `jupyter` on its PATH" in notebook.err, notebook.err
        assert notebook.err.count("\n") == 1 and "http://" not in notebook.out + notebook.err
        # day 2: the same image as a dev container, which is the person's
        _dev_container_writes_as_the_person(
            project, recipe, testbed["IMGBUILD_TESTBED_DEVCONTAINER"], testbed["IMGBUILD_DOCKER_CLI"]
        )
        # day 3: a package more; the rebuild re-renders images/, and the next pull request is green again (the
        # check of an edit pushed without rendering: test_init)
        with (project / "requirements.txt").open("a") as requirements:
            requirements.write("six==1.16.0\n")
        rebuilt = run_cli("build", f"recipes/{name}.yaml", cwd=project)
        assert rebuilt.code == 0, rebuilt.out[-2000:] + rebuilt.err[-2000:]
        again = run_cli("run", "--no-workspace", f"recipes/{name}.yaml", "--", "python", "-c",
                        "import six; print('six', six.__version__)", cwd=project)  # fmt: skip
        assert again.code == 0 and "six 1.16.0" in again.out, again.err
        checks = workflow_checks(project)
        assert all(ran.code == 0 for _, ran in checks) and "FRESH" in checks[-1][1].out, checks
        workflow = yaml.safe_load((project / ".github" / "workflows" / "images.yml").read_text())
        assert workflow["env"]["RECIPE"] == f"recipes/{name}.yaml"
    finally:
        for container in docker_client.containers.list(all=True):
            if container.id not in before and (
                name in container.name or container.labels.get("devcontainer.local_folder") == str(project)
            ):
                container.remove(force=True)
        for tag in (f"imgbuildtest/{name}:1", f"imgbuildtest/{name}:1-previous"):
            if docker_client.images.list(name=tag):
                docker_client.images.remove(tag, force=True)
