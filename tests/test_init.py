"""`imgbuild init`: a starting recipe imgbuild itself accepts, on a base this host can run, written only where
nothing is; and the CI workflow that builds it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from imgbuild.errors import EnvironmentProblem
from imgbuild.gpu.fleet import host_target, parse_targets
from imgbuild.pipeline.base_choice import Fleet, choose
from imgbuild.recipe import load_recipe
from imgbuild.registry.tags import TagInfo
from tests.conftest import run_cli
from tests.fake_nvcr import FakeNvcr
from tests.support import imgbuild_here, workflow_checks

#: Three NGC-shaped releases with their real CUDA and amd64 arch lists (../shared/docs/ngc-real-facts.md).
RELEASES = {
    "26.01": ("13.1.0.036", "7.5 8.0 8.6 9.0 10.0 12.0+PTX"),
    "25.10": ("13.0.2.006", "7.5 8.0 8.6 9.0 10.0 12.0+PTX"),
    "24.05": ("12.4.1.003", "5.2 6.0 6.1 7.0 7.2 7.5 8.0 8.6 8.7 9.0+PTX"),
}


@pytest.fixture
def project(tmp_path):
    (tmp_path / ".git").mkdir()
    return tmp_path


@pytest.fixture
def registry(monkeypatch):
    """An nvcr.io-shaped registry listing RELEASES (and a -devel variant, never a base), as the NGC registry."""
    tags = [f"{r}-py3" for r in RELEASES] + ["26.01-py3-devel"]
    with FakeNvcr({"nvidia/pytorch": tags}, facts=RELEASES) as fake:
        monkeypatch.setenv("IMGBUILD_NGC_REGISTRY", fake.host)
        yield fake


def _described() -> list[TagInfo]:
    return [TagInfo(f"{r}-py3", r, None, cuda=c, arch_list=a, platforms=("amd64",)) for r, (c, a) in RELEASES.items()]


def _host(*gpus: tuple[str, str], driver: str) -> Fleet:
    targets = tuple(t for name, cap in gpus if (t := host_target(name, cap)) is not None)
    return Fleet(targets, driver, "every GPU of this host")


@pytest.mark.parametrize(
    ("fleet", "release"),
    [
        (_host(("NVIDIA H100 80GB HBM3", "9.0"), driver="590.44.01"), "26.01"),
        (_host(("NVIDIA H100 80GB HBM3", "9.0"), driver="580.95.05"), "26.01"),  # forward compatibility (R580)
        (_host(("NVIDIA GeForce RTX 4090", "8.9"), driver="570.124.06"), "24.05"),  # a GeForce on R570: CUDA 12
        (_host(("Tesla V100-SXM2-32GB", "7.0"), driver="580.95.05"), "24.05"),  # CUDA 13 has no Volta kernels
        (_host(("NVIDIA A100-SXM4-80GB", "8.0"), ("Tesla V100-SXM2-32GB", "7.0"), driver="580.95.05"),
         "24.05"),  # every GPU of the host must run it
        (Fleet(tuple(parse_targets("l40s,b200")), None, "--for l40s,b200"), "26.01"),  # kernels judged alone
    ],
)  # fmt: skip
def test_the_base_is_the_newest_release_every_gpu_of_the_fleet_can_run(fleet, release):
    assert choose(iter(_described()), fleet, lambda: "nvcr.io/nvidia/pytorch").release == release


def test_a_fleet_no_release_serves_is_refused_naming_what_stops_the_newest():
    kepler = Fleet(tuple(parse_targets("k80")), "470.57.02", "--for k80")
    with pytest.raises(EnvironmentProblem, match=r"runs on --for k80: the newest, 26.01-py3: k80: sm_37"):
        choose(iter(_described()), kepler, lambda: "nvcr.io/nvidia/pytorch")


def test_the_base_comes_from_the_registry_newest_first_with_the_reason(project, registry):
    done = run_cli("init", "demo", cwd=project)
    assert done.code == 0, done.err
    assert load_recipe(project / "recipes" / "demo.yaml").recipe.base.tag == "26.01"
    assert "base pytorch 26.01: the newest release (no GPU on this host" in done.err
    volta = run_cli("init", "volta", "--for", "v100", "--driver", "580.95.05", cwd=project)
    assert volta.code == 0, volta.err
    assert load_recipe(project / "recipes" / "volta.yaml").recipe.base.tag == "24.05"
    assert "the newest release --for v100 with driver 580.95.05 can run (CUDA 12.4.1.003)" in volta.err


def test_base_chooses_a_release_the_registry_lists_and_says_whether_the_fleet_runs_it(project, registry):
    done = run_cli("init", "old", "--base", "24.05", cwd=project)
    assert done.code == 0, done.err
    assert load_recipe(project / "recipes" / "old.yaml").recipe.base.tag == "24.05"
    warned = run_cli("init", "new", "--base", "26.01-py3", "--for", "v100", cwd=project)
    assert warned.code == 0 and "WARNING: --for v100 cannot run it" in warned.err, warned.err
    unknown = run_cli("init", "typo", "--base", "24.5", "--ci", "github", cwd=project)
    assert unknown.code == 2 and "Traceback" not in unknown.err
    assert len(unknown.err.strip().splitlines()) == 1, unknown.err
    assert unknown.err.strip().endswith("has no such release (newest: 26.01, 25.10, 24.05)")
    assert not (project / "recipes" / "typo.yaml").exists() and not (project / "images" / "typo").exists()
    assert not (project / ".github").exists()


def test_an_unreachable_registry_falls_back_to_the_cached_facts_and_says_from_when(project, monkeypatch):
    with FakeNvcr({"nvidia/pytorch": [f"{r}-py3" for r in RELEASES]}, facts=RELEASES) as fake:
        monkeypatch.setenv("IMGBUILD_NGC_REGISTRY", fake.host)
        assert run_cli("tags", "--details", cwd=project).code == 0  # caches the list and each tag's facts
    done = run_cli("init", "away", "--for", "v100", cwd=project)
    assert done.code == 0, done.err
    text = (project / "recipes" / "away.yaml").read_text()
    assert 'tag: "24.05"' in text and " UTC (the registry did not answer)" in text
    assert "as cached 20" in done.err and "imgbuild render recipes/away.yaml" in done.err


def test_an_unreachable_registry_with_nothing_cached_is_exit_3_and_nothing_written(project, monkeypatch):
    monkeypatch.setenv("IMGBUILD_NGC_REGISTRY", "127.0.0.1:9")  # nothing listens on the discard port
    done = run_cli("init", "demo", "--ci", "github", cwd=project)
    assert done.code == 3 and "no tag list of 127.0.0.1:9/nvidia/pytorch is cached" in done.err, done.err
    assert len(done.err.strip().splitlines()) == 1
    assert not (project / "recipes").exists() and not (project / ".github").exists()


def test_a_host_whose_gpus_cannot_be_read_is_exit_3_naming_for(project, monkeypatch):
    from imgbuild.config.settings import load_settings
    from imgbuild.gpu import read
    from imgbuild.pipeline.base_choice import host_fleet

    def unreadable(snapshot=None):
        raise read.NoGpus("NVML: driver not loaded; nvidia-smi: not found")

    monkeypatch.setattr(read, "read_devices", unreadable)
    monkeypatch.setattr(read, "gpu_devices_present", lambda: True)
    with pytest.raises(EnvironmentProblem, match=r"cannot read them .*give --for GPU\[,GPU\] --driver VERSION"):
        host_fleet(load_settings(), None, None)
    assert host_fleet(load_settings(), "a100", None).said == "--for a100"


def test_a_host_whose_gpus_cannot_be_read_stops_init_with_one_line_exit_3_and_nothing_written(
    project, registry, monkeypatch, capsys
):
    from imgbuild.gpu import read

    def unreadable(snapshot=None):
        raise read.NoGpus("NVML: driver not loaded; nvidia-smi: not found")

    monkeypatch.setattr(read, "read_devices", unreadable)
    monkeypatch.setattr(read, "gpu_devices_present", lambda: True)
    (project / "requirements.txt").write_text("einops==0.8.1\n")
    monkeypatch.chdir(project)
    code, out, err = imgbuild_here(capsys, "init", "demo", "--from", "requirements.txt", "--ci", "github")
    assert code == 3 and "give --for GPU[,GPU] --driver VERSION" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and not out
    assert sorted(p.name for p in project.iterdir()) == [".git", "requirements.txt"]


def test_a_requirements_file_is_referenced_and_the_recipe_validates(project, registry):
    (project / "requirements.txt").write_text("einops==0.8.1\nrich\n")
    done = run_cli("init", "demo", "--from", "requirements.txt", cwd=project)
    assert done.code == 0, done.err
    loaded = load_recipe(project / "recipes" / "demo.yaml")
    assert 'requirements: "../requirements.txt"' in (project / "recipes" / "demo.yaml").read_text()
    assert [r.spec for r in loaded.requirements] == ["einops==0.8.1", "rich"]
    assert run_cli("validate", "recipes/demo.yaml", cwd=project).code == 0
    assert "git add recipes/demo.yaml images/demo requirements.txt\n" in done.err


def test_a_pyprojects_dependencies_are_listed(project, monkeypatch):
    (project / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["einops>=0.8", "rich"]\n')
    with FakeNvcr({"nvidia/tensorflow": ["25.01-tf2-py3"]}) as fake:
        monkeypatch.setenv("IMGBUILD_NGC_REGISTRY", fake.host)
        done = run_cli("init", "demo", "--from", "pyproject.toml", "--framework", "tensorflow", cwd=project)
    assert done.code == 0, done.err
    loaded = load_recipe(project / "recipes" / "demo.yaml")
    assert loaded.recipe.pip.packages == ["einops>=0.8", "rich"] and loaded.recipe.base.framework == "tensorflow"


def test_a_dependency_dollar_stays_a_dollar_and_never_reads_the_environment(project, registry):
    """pyproject text is never interpolated, the recipe is: init writes a copied `$` as `$$`."""
    url = "https://files.lab.example/$WHEEL_DIR/p5pkg-1.0-py3-none-any.whl"
    (project / "pyproject.toml").write_text(f'[project]\nname = "x"\ndependencies = ["p5pkg @ {url}"]\n')
    assert run_cli("init", "demo", "--from", "pyproject.toml", cwd=project).code == 0
    loaded = load_recipe(project / "recipes" / "demo.yaml", environ={"WHEEL_DIR": "from-the-environment"})
    assert loaded.recipe.pip.packages == [f"p5pkg @ {url}"]


def test_a_dependency_the_installer_would_fill_in_from_the_builds_environment_is_refused(project, registry):
    """`${NAME}` survives imgbuild's own reading as written, but pip and uv replace it in the build: init refuses it,
    naming the dependency, and writes nothing."""
    url = "https://files.lab.example/${WHEEL_DIR}/p5pkg-1.0-py3-none-any.whl"
    (project / "pyproject.toml").write_text(f'[project]\nname = "x"\ndependencies = ["p5pkg @ {url}"]\n')
    done = run_cli("init", "demo", "--from", "pyproject.toml", cwd=project)
    assert done.code == 2 and "${NAME}" in done.err and "Traceback" not in done.err, done.err
    assert not list(project.glob("recipes/*")), done.err


def test_a_dependency_holding_a_credential_is_refused_before_anything_is_written(project, registry):
    dep = "p5pkg @ https://files.lab.example/nvapi-" + "k" * 40 + "/p5pkg-1.0-py3-none-any.whl"
    (project / "pyproject.toml").write_text(f'[project]\nname = "x"\ndependencies = ["{dep}"]\n')
    done = run_cli("init", "demo", "--from", "pyproject.toml", cwd=project)
    assert done.code == 2 and "dependencies[0]" in done.err and "k" * 40 not in done.err, done.err
    assert not (project / "recipes" / "demo.yaml").exists()


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_the_ci_workflow_installs_imgbuild_from_a_named_source_and_checks_the_recipe(project, registry, ci):
    done = run_cli("init", "demo", "--ci", ci, cwd=project)
    assert done.code == 0, done.err
    assert "git add recipes/demo.yaml images/demo " in done.err and (project / "images" / "demo").is_dir()
    path = project / (".github/workflows/images.yml" if ci == "github" else ".gitlab-ci.yml")
    text = path.read_text()
    data = yaml.safe_load(text)
    named = data["env"] if ci == "github" else data["variables"]
    assert named["RECIPE"] == "recipes/demo.yaml" and named["RECIPES"] == "recipes"  # each reaches a script quoted
    assert 'imgbuild validate "$RECIPE"' in text and 'imgbuild rebuild --check "$RECIPES"' in text
    assert '"$IMGBUILD_PACKAGE"' in text and "pip install imgbuild" not in text


def test_the_first_pull_request_passes_the_workflows_check_as_init_left_it(project, registry):
    done = run_cli("init", "demo", "--ci", "github", cwd=project)
    assert done.code == 0, done.err
    assert "rendered " in done.err and (project / "images" / "demo" / "Dockerfile").is_file()
    lines = done.err[done.err.index("next:") :].splitlines()[1:]
    assert [line.split()[:2] for line in lines] == [["imgbuild", "build"], ["git", "add"], ["git", "commit"]]
    assert lines[1].split()[2:] == ["recipes/demo.yaml", "images/demo", ".github/workflows/images.yml"]
    checks = workflow_checks(project, env={"IMGBUILD_USER": "ci-namespace"})  # another user, another namespace
    assert [step for step, _ in checks] == ['imgbuild validate "$RECIPE"', 'imgbuild rebuild --check "$RECIPES"']
    assert all(ran.code == 0 for _, ran in checks), checks
    assert "FRESH" in checks[-1][1].out
    with (project / "recipes" / "demo.yaml").open("a") as recipe:  # an edit pushed without rendering
        recipe.write("env: {A: '1'}\n")
    stale = run_cli("rebuild", "--check", "recipes", "--json", cwd=project)
    reasons = json.loads(stale.out)["images"][0]["reasons"]
    assert stale.code == 1 and reasons[-1] == "cure: imgbuild render recipes/demo.yaml, then commit images/demo"


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
        ("a folder a CI script could not name as one word", ["d", "--dir", "my $(recipes)", "--ci", "github"], {},
         "'my $(recipes)/d.yaml': a recipe's path CI passes on may hold only"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_nothing_written(project, registry, why, args, files, said):
    for name, text in files.items():
        (project / name).write_text(text)
    done = run_cli("init", *args, cwd=project)
    assert done.code == 2 and said in done.err, (why, done.err)
    assert "Traceback" not in done.err
    assert not list((project / "recipes").glob("*")) if (project / "recipes").exists() else True
    assert not (project / ".github").exists() and not list(project.glob("my*"))


def test_it_never_writes_over_a_file_or_through_a_link(project, registry):
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
