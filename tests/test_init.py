"""`imgbuild init`: a starting recipe imgbuild itself accepts, on a base this host can run, written only where
nothing is; and the CI workflow that builds it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from imgbuild.gpu.read import Gpu
from imgbuild.pipeline.starter import choose_tag
from imgbuild.recipe import load_recipe
from tests.conftest import run_cli


@pytest.fixture
def project(tmp_path):
    (tmp_path / ".git").mkdir()
    return tmp_path


def _gpu(name: str, cap: str, driver: str) -> Gpu:
    return Gpu(0, "GPU-0", name, 0, 81_920, 0, [], cap, driver)


@pytest.mark.parametrize(
    ("gpus", "tag"),
    [
        ([], "25.10"),  # no GPU read: the newest known
        ([_gpu("NVIDIA H100 80GB HBM3", "9.0", "580.95.05")], "25.10"),
        ([_gpu("NVIDIA H100 80GB HBM3", "9.0", "570.124.06")], "25.10"),  # forward compatibility on R570
        ([_gpu("NVIDIA GeForce RTX 4090", "8.9", "570.124.06")], "24.05"),  # a GeForce on R570: CUDA 12
        ([_gpu("Tesla V100-SXM2-32GB", "7.0", "580.95.05")], "24.05"),  # CUDA 13 has no Volta kernels
        ([_gpu("NVIDIA A100-SXM4-80GB", "8.0", "580.95.05"), _gpu("Tesla V100-SXM2-32GB", "7.0", "580.95.05")],
         "24.05"),  # every GPU of the host must run it
    ],
)  # fmt: skip
def test_the_base_is_the_newest_release_every_gpu_of_the_host_can_run(gpus, tag):
    assert choose_tag(gpus, next((g.driver for g in gpus), None))[0] == tag


def test_a_requirements_file_is_referenced_and_the_recipe_validates(project):
    (project / "requirements.txt").write_text("einops==0.8.1\nrich\n")
    done = run_cli("init", "demo", "--from", "requirements.txt", cwd=project)
    assert done.code == 0, done.err
    loaded = load_recipe(project / "recipes" / "demo.yaml")
    assert 'requirements: "../requirements.txt"' in (project / "recipes" / "demo.yaml").read_text()
    assert loaded.recipe.base.tag == "25.10"
    assert [r.spec for r in loaded.requirements] == ["einops==0.8.1", "rich"]
    assert run_cli("validate", "recipes/demo.yaml", cwd=project).code == 0


def test_a_pyprojects_dependencies_are_listed(project):
    (project / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["einops>=0.8", "rich"]\n')
    done = run_cli("init", "demo", "--from", "pyproject.toml", "--framework", "tensorflow", cwd=project)
    assert done.code == 0, done.err
    loaded = load_recipe(project / "recipes" / "demo.yaml")
    assert loaded.recipe.pip.packages == ["einops>=0.8", "rich"] and loaded.recipe.base.framework == "tensorflow"


def test_a_dependency_dollar_stays_a_dollar_and_never_reads_the_environment(project):
    """pyproject text is never interpolated, the recipe is: init writes a copied `$` as `$$`."""
    url = "https://files.lab.example/${WHEEL_DIR}/p5pkg-1.0-py3-none-any.whl"
    (project / "pyproject.toml").write_text(f'[project]\nname = "x"\ndependencies = ["p5pkg @ {url}"]\n')
    assert run_cli("init", "demo", "--from", "pyproject.toml", cwd=project).code == 0
    loaded = load_recipe(project / "recipes" / "demo.yaml", environ={"WHEEL_DIR": "from-the-environment"})
    assert loaded.recipe.pip.packages == [f"p5pkg @ {url}"]


def test_a_dependency_holding_a_credential_is_refused_before_anything_is_written(project):
    dep = "p5pkg @ https://files.lab.example/nvapi-" + "k" * 40 + "/p5pkg-1.0-py3-none-any.whl"
    (project / "pyproject.toml").write_text(f'[project]\nname = "x"\ndependencies = ["{dep}"]\n')
    done = run_cli("init", "demo", "--from", "pyproject.toml", cwd=project)
    assert done.code == 2 and "dependencies[0]" in done.err and "k" * 40 not in done.err, done.err
    assert not (project / "recipes" / "demo.yaml").exists()


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_the_ci_workflow_installs_imgbuild_from_a_named_source_and_checks_the_recipe(project, ci):
    done = run_cli("init", "demo", "--ci", ci, cwd=project)
    assert done.code == 0, done.err
    path = project / (".github/workflows/images.yml" if ci == "github" else ".gitlab-ci.yml")
    text = path.read_text()
    assert yaml.safe_load(text)
    assert "imgbuild validate recipes/demo.yaml" in text and "imgbuild rebuild --check recipes" in text
    assert '"$IMGBUILD_PACKAGE"' in text and "pip install imgbuild" not in text


@pytest.mark.parametrize(
    ("why", "args", "files", "said"),
    [
        ("a name with capitals", ["Demo"], {}, "NAME: 'Demo' is not an image name"),
        ("a name with a slash", ["../demo"], {}, "is not an image name"),
        ("an empty name", [""], {}, "is not an image name"),
        ("a missing requirements file", ["d", "--from", "nope.txt"], {}, "--from nope.txt: no such requirements file"),
        ("another kind of file", ["d", "--from", "setup.cfg"], {"setup.cfg": ""}, "a requirements file (*.txt) or a pyproject.toml"),
        ("TOML that is not", ["d", "--from", "pyproject.toml"], {"pyproject.toml": "[project"}, "not TOML"),
        ("no dependencies", ["d", "--from", "pyproject.toml"], {"pyproject.toml": "[project]\nname='x'\n"}, "no [project].dependencies"),
        ("dependencies not a list", ["d", "--from", "pyproject.toml"], {"pyproject.toml": "[project]\ndependencies='x'\n"}, "not a list of requirements"),
        ("a dependency that is no requirement", ["d", "--from", "pyproject.toml"],
         {"pyproject.toml": "[project]\ndependencies=['not a requirement!!']\n"}, "recipes/d.yaml:"),
        ("an unknown framework", ["d", "--framework", "jax"], {}, "Invalid value for '--framework'"),
        ("an unknown CI", ["d", "--ci", "jenkins"], {}, "Invalid value for '--ci'"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_nothing_written(project, why, args, files, said):
    for name, text in files.items():
        (project / name).write_text(text)
    done = run_cli("init", *args, cwd=project)
    assert done.code == 2 and said in done.err, (why, done.err)
    assert "Traceback" not in done.err
    assert not list((project / "recipes").glob("*")) if (project / "recipes").exists() else True


def test_it_never_writes_over_a_file_or_through_a_link(project):
    (project / "recipes").mkdir()
    (project / "recipes" / "demo.yaml").write_text("mine\n")
    done = run_cli("init", "demo", cwd=project)
    assert done.code == 2 and "exists" in done.err and (project / "recipes" / "demo.yaml").read_text() == "mine\n"
    victim = project / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, project / "recipes" / "other.yaml")
    done = run_cli("init", "other", cwd=project)
    assert done.code == 2 and victim.read_text() == "precious\n"
    ci = project / ".gitlab-ci.yml"
    ci.write_text("ours\n")
    done = run_cli("init", "third", "--ci", "gitlab", cwd=project)
    assert done.code == 2 and ci.read_text() == "ours\n"
    assert not (project / "recipes" / "third.yaml").exists(), "nothing half-written"
    assert sorted(p.name for p in Path(project / "recipes").iterdir()) == ["demo.yaml", "other.yaml"]
