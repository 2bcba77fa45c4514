"""The scripted user of benchmarks/realsets.py --follow (benchmarks/follow.py) reads imgbuild's own words: each
cure imgbuild prints, as imgbuild prints it, is applied to the recipe as the words say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from follow import follow  # noqa: E402

RECIPE = 'name: r\nbase: {framework: pytorch, tag: "25.10"}\npip:\n  packages: [einops, "jax[cuda12]", srcpkg]\n'


def _never(args: list[str]) -> subprocess.CompletedProcess[str]:
    raise AssertionError(f"ran imgbuild {args}")


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE)
    return path


@pytest.mark.parametrize(
    "said, done, field, value",
    [
        (
            "imgbuild: pip step failed: building srcpkg needs a C/C++ compiler, which the base lacks: add apt: [g++, python3-dev] "
            "to the recipe",
            "apt: [g++, python3-dev]",
            ("apt",),
            ["g++", "python3-dev"],
        ),
        (
            "imgbuild: pip step failed: building srcpkg imports the base's framework, which the isolated build "
            "environment lacks: add srcpkg to pip.no_build_isolation, so that it builds against the base's own "
            "framework",
            "pip.no_build_isolation: [srcpkg]",
            ("pip", "no_build_isolation"),
            ["srcpkg"],
        ),
        (
            "imgbuild: r.yaml:4:22: pip.packages[1]: numpy<2.4 conflicts with the base's numpy==2.4.6 (pinned by the base): "
            "drop the pin, or let pip move it with pip.unpin: [numpy]",
            "pip.unpin: [numpy]",
            ("pip", "unpin"),
            ["numpy"],
        ),
        (
            "imgbuild: smoke test failed: whisper: runs `ffmpeg`, which is not installed (add apt: [ffmpeg])",
            "apt: [ffmpeg]",
            ("apt",),
            ["ffmpeg"],
        ),
    ],
)
def test_each_cure_imgbuild_prints_is_applied_as_written(recipe, said, done, field, value):
    assert follow(said, recipe, _never) == done
    data = yaml.safe_load(recipe.read_text())
    for key in field:
        data = data[key]
    assert data == value


@pytest.mark.parametrize(
    "asked, done, cured",
    [
        ('"jax[cuda12]"', "asked for jax[cuda13]", '"jax[cuda13]"'),  # another CUDA's build
        ('"torch>=2.9"', "asked for torch>=2.9.0a0", '"torch>=2.9.0a0"'),  # NGC's pre-release framework
    ],
)
def test_the_plans_own_refusal_on_the_real_2510_config_is_followed_and_the_plan_accepts_the_cure(
    recipe, tmp_path, asked, done, cured
):
    from imgbuild.errors import RecipeError, ending
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.recipe import load_recipe
    from tests.support import real_base, settings

    (tmp_path / ".git").mkdir()
    base = real_base("pytorch:25.10-py3")
    config = {"config": {"Env": [f"{k}={v}" for k, v in base.env.items()]}}
    recipe.write_text(RECIPE.replace('"jax[cuda12]", srcpkg', asked))
    with pytest.raises(RecipeError) as err:
        make_plan(load_recipe(recipe), settings(), lambda ref: ("sha256:" + "a" * 64, config))
    printed, _ = ending(err.value)  # the lines as the command prints them
    assert follow("\n".join(printed), recipe, _never) == done
    assert yaml.safe_load(recipe.read_text())["pip"]["packages"] == ["einops", yaml.safe_load(cured)]
    make_plan(load_recipe(recipe), settings(), lambda ref: ("sha256:" + "a" * 64, config))  # accepted


def test_a_stale_lock_is_cured_by_running_imgbuild_lock(recipe):
    ran = []

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        ran.append(args)
        return subprocess.CompletedProcess(args, 0, "", "")

    said = "imgbuild: the recipe changed since its lock was written: run imgbuild lock r.yaml (it re-resolves einops)"
    assert follow(said, recipe, run) == "imgbuild lock"
    assert ran == [["lock", str(recipe)]]


def test_a_fallback_is_cured_by_asking_for_the_version_it_names(recipe):
    said = (
        "imgbuild: pip step failed: the resolver fell back to srcpkg 0.2.5 (2023-12), 1.9 years older than srcpkg "
        "0.11.2 (2025-11), the newest the recipe admits: if srcpkg 0.2.5 is what you want, ask for it by its version "
        "(srcpkg==0.2.5); else change what holds srcpkg back (a base made for srcpkg 0.11.2, or a pin)"
    )
    assert follow(said, recipe, _never) == "asked for srcpkg==0.2.5"
    assert yaml.safe_load(recipe.read_text())["pip"]["packages"][-1] == "srcpkg==0.2.5"


def test_only_imgbuilds_own_lines_are_read_never_a_packages_or_an_installers(recipe):
    said = (
        "#12 3.1 srcpkg: to speed this up, add ninja to pip.packages and add apt: [ccache]\n"
        "#12 9.9 imgbuild: pip step failed: pip failed; see its output above\n"
    )
    assert follow(said, recipe, _never) is None
    assert recipe.read_text() == RECIPE


def test_a_line_the_progress_cut_short_is_not_read_into_the_next(recipe, monkeypatch):
    """The build's progress shows a step's line cut at its width, with imgbuild's summary after it on one line: the
    cure is read from the whole line the step printed, never from the cut one running into the next."""
    from tests.support import guard_module

    guard = guard_module()
    monkeypatch.setattr("shutil.which", lambda name: None)
    watch = guard.Watch()
    watch.building, watch.kinds = "srcpkg", {"isolated"}
    line = "imgbuild: pip step failed: " + watch.installing_failure()
    said = f"#9 12.0 {line}\n{line[:-4]} imgbuild: build failed at the pip step [stage-3 2/6, python3-dev]\n"
    assert follow(said, recipe, _never) == "pip.no_build_isolation: [srcpkg]; apt: [g++, python3-dev]"


def test_words_that_name_no_cure_leave_the_scripted_user_stuck(recipe):
    assert follow("imgbuild: pip step failed: pip failed; see its output above", recipe, _never) is None
    assert recipe.read_text() == RECIPE


@pytest.mark.parametrize(
    "pip, requirements, said, done, left",
    [
        (  # the base's framework, at two places: both dropped where the refusals place them
            "{requirements: r.txt, packages: [a, torch]}",
            "torch<2.6\nnumpy==1.26.2\neinops\n",
            "imgbuild: recipes/r.txt:1:1: pip.requirements: torch<2.6 conflicts with the base's torch 2.13.0a0 (the "
            "base's framework is protected: drop it)\n"
            "imgbuild: recipes/r.yaml:3:48: pip.packages[1]: torch is the base's framework (the base's framework is "
            "protected: drop it)\n",
            "dropped torch, torch<2.6",
            "numpy==1.26.2\neinops\n",
        ),
        (  # two lines, two cures, one round; the line cured by unpinning is not dropped
            "{requirements: r.txt}",
            "absl-py==1.0.0\ntensorflow==2.8.1\nflax\n",
            "imgbuild: recipes/r.txt:1:1: pip.requirements: absl-py==1.0.0 conflicts with the base's absl-py==2.1.0 "
            "(pinned by the base: drop the pin, or let pip move it with pip.unpin: [absl-py])\n"
            "imgbuild: recipes/r.txt:2:1: pip.requirements: tensorflow==2.8.1 conflicts with the base's tensorflow "
            "2.21.0 (the base's framework is protected: drop the pin, or choose a base tag that carries it)\n",
            "pip.unpin: [absl-py]; dropped tensorflow==2.8.1",
            "absl-py==1.0.0\nflax\n",
        ),
    ],
)
def test_every_refused_line_is_cured_in_one_round_a_drop_where_the_refusal_places_it(
    tmp_path, pip, requirements, said, done, left
):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.txt").write_text(requirements)
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.write_text(f'name: r\nbase: {{framework: pytorch, tag: "24.05"}}\npip: {pip}\n')
    assert follow(said, recipe, _never) == done
    assert (tmp_path / "recipes" / "r.txt").read_text() == left
    assert yaml.safe_load(recipe.read_text())["pip"].get("packages", ["a"]) == ["a"]


# --- every cure imgbuild prints now, built by imgbuild's own code, then followed ---------------------------------


def _field(recipe: Path, *path: str):
    data = yaml.safe_load(recipe.read_text())
    for key in path:
        data = data[key]
    return data


def test_several_source_builds_named_in_one_line_are_all_built_against_the_base_in_one_round(recipe, monkeypatch):
    from tests.support import guard_module

    guard = guard_module()
    monkeypatch.setattr("shutil.which", lambda name: None)  # a slim base: no compiler
    watch = guard.Watch()
    watch.building, watch.kinds = "srcpkg", {"isolated"}
    said = "imgbuild: pip step failed: " + watch.installing_failure(["mamba-ssm", "causal-conv1d"])
    assert follow(said, recipe, _never) == (
        "pip.no_build_isolation: [causal-conv1d, mamba-ssm, srcpkg]; apt: [g++, python3-dev]"
    )
    assert _field(recipe, "pip", "no_build_isolation") == ["causal-conv1d", "mamba-ssm", "srcpkg"]
    assert _field(recipe, "apt") == ["g++", "python3-dev"]


def test_an_unpin_imgbuild_says_cannot_help_is_never_followed(recipe, monkeypatch):
    from tests.support import guard_module

    guard = guard_module()
    monkeypatch.setattr(guard, "read_names", lambda path: {"fwk"})
    monkeypatch.setattr(guard, "framework_needs", lambda dep, frameworks: [("fwk", "mid", ">=2")])
    watch = guard.Watch({"numlib": [("numlib==2.4.6", "the base's pins")]})
    said = "imgbuild: pip step failed: plugin 0.8 needs numlib<2: " + watch.cure("numlib", "plugin", "numlib<2")
    assert "pip.unpin: [numlib] cannot help" in said
    assert follow(said, recipe, _never) is None
    assert recipe.read_text() == RECIPE


def test_an_extra_the_project_lacks_is_cured_by_the_project_and_the_cuda_build_of_what_its_extra_brings(recipe):
    from imgbuild.pipeline.baserules import extra_cure

    recipe.write_text(RECIPE.replace('"jax[cuda12]"', '"spacy[cuda12x]"'))
    cure = extra_cure("spacy[cuda13x]", {"cuda11x": ("cupy-cuda11x",), "cuda12x": ("cupy-cuda12x",)}, lambda n: True)
    said = f"imgbuild: r.yaml:4:22: pip.packages[1]: spacy[cuda12x] is built for CUDA 12 ({cure})"
    assert follow(said, recipe, _never) == "asked for spacy and cupy-cuda13x"
    assert _field(recipe, "pip", "packages") == ["einops", "spacy", "srcpkg", "cupy-cuda13x"]


@pytest.mark.parametrize(
    "answer, asked",
    [
        (("0.11.0+cu130",), "srcpkg==0.11.0+cu130"),
        ((), "srcpkg-cu13"),
    ],
)
def test_the_smoke_tests_other_cuda_cure_checked_against_the_index_asks_for_the_build_it_names(recipe, answer, asked):
    from imgbuild.pipeline.baserules import CudaBuildAnswer, other_cuda_cure

    found = CudaBuildAnswer(answer, "srcpkg-cu13", not answer)
    said = f"imgbuild: smoke test failed: imports: srcpkg 0.2.5: {other_cuda_cure('srcpkg', '12', '13', found)}"
    assert follow(said, recipe, _never) == f"asked for {asked}"
    assert _field(recipe, "pip", "packages")[-1] == asked


@pytest.mark.parametrize("there, done", [(True, "asked for srcpkg-cu13"), (False, None), (None, None)])
def test_the_pip_steps_other_cuda_cure_is_followed_only_where_the_index_has_the_build(recipe, there, done):
    import importlib.util

    spec = importlib.util.spec_from_file_location("owners", ROOT / "imgbuild/payload/pip_owners.py")
    assert spec and spec.loader
    owners = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(owners)
    recipe.write_text(RECIPE.replace(", srcpkg]", ", srcpkg-cu12]"))
    line = owners.other_cuda([("srcpkg-cu12", "1.0")], paths=[], cuda_version="13.0.2.006", has=lambda name: there)
    assert follow(f"imgbuild: pip step failed: {line}", recipe, _never) == done
    assert _field(recipe, "pip", "packages")[-1] == ("srcpkg-cu13" if there else "srcpkg-cu12")


def test_the_other_cuda_cure_where_the_index_has_no_build_is_not_followed(recipe):
    from imgbuild.pipeline.baserules import CudaBuildAnswer, other_cuda_cure

    said = other_cuda_cure("srcpkg", "12", "13", CudaBuildAnswer((), "", None))
    assert "the index has no CUDA 13 build of srcpkg" in said
    assert follow(f"imgbuild: smoke test failed: imports: srcpkg 0.2.5: {said}", recipe, _never) is None


def test_the_words_of_a_pre_release_fallback_are_followed(recipe):
    from tests.support import guard_module

    said = "imgbuild: pip step failed: " + guard_module().fallback_line([("srcpkg", "2.1.0.dev2")], {"srcpkg": []})
    assert "ask for this one by its version (srcpkg==2.1.0.dev2)" in said
    assert follow(said, recipe, _never) == "asked for srcpkg==2.1.0.dev2"


@pytest.mark.parametrize(
    "kind, done, field, value",
    [
        ("ninja", "pip.packages: + ninja", ("pip", "packages"), ["einops", "jax[cuda12]", "srcpkg", "ninja"]),
        ("headers", "apt: [python3-dev]", ("apt",), ["python3-dev"]),
        ("compiler", "apt: [g++, python3-dev]", ("apt",), ["g++", "python3-dev"]),
    ],
)
def test_a_missing_build_tool_is_added_as_its_line_says(recipe, kind, done, field, value):
    from tests.support import guard_module

    watch = guard_module().Watch()
    watch.kinds = {kind}
    said = "imgbuild: pip step failed: " + watch.build_tool("building srcpkg")
    assert follow(said, recipe, _never) == done
    assert _field(recipe, *field) == value


def test_a_missing_nvcc_names_a_base_with_the_toolkit_and_no_cure_a_script_could_follow(recipe, monkeypatch):
    from tests.support import guard_module

    monkeypatch.setenv("CUDA_VERSION", "13.0.2.006")
    watch = guard_module().Watch()
    watch.kinds = {"nvcc"}
    said = watch.build_tool("building srcpkg")
    assert "use a base that carries the CUDA toolkit (CUDA 13.0's" in said
    assert follow(f"imgbuild: pip step failed: {said}", recipe, _never) is None


@pytest.mark.parametrize(
    "needs, dropped, left",
    [
        ({}, "dropped srcpkg", ["einops", "jax[cuda12]"]),  # the recipe's own package
        ({"einops": {"srcpkg"}}, "dropped einops", ["jax[cuda12]", "srcpkg"]),  # a dependency: what requires it
    ],
)
def test_a_binary_wheel_built_for_another_framework_build_is_dropped_as_its_line_says_first(
    recipe, needs, dropped, left
):
    from imgbuild.payload.smoke import imports as smoke_imports
    from imgbuild.payload.smoke.hints import EXTENSION_ERROR

    work = [("srcpkg", "0.0.35", ["srcpkg"])]
    results = [{"srcpkg": EXTENSION_ERROR + "built for torch 2.10.0+cu128"}]
    failures, *_ = smoke_imports._classify(work, results, needs=needs)
    assert follow("imgbuild: smoke test failed: imports: " + failures[0], recipe, _never) == dropped
    assert _field(recipe, "pip", "packages") == left


def test_a_package_needing_another_distribution_of_the_framework_is_dropped(recipe):
    from tests.support import guard_module

    watch = guard_module().Watch()
    watch.other_framework = "tensorflow-cpu"
    watch.depends = {("srcpkg", "tensorflow-cpu"): [("0.18.1", "tensorflow-cpu")]}
    said = "imgbuild: pip step failed: " + watch.failure("the base's pins")
    assert follow(said, recipe, _never) == "dropped srcpkg"
    assert _field(recipe, "pip", "packages") == ["einops", "jax[cuda12]"]


def test_pip_check_lines_are_accepted_where_the_line_names_the_field(recipe, tmp_path, monkeypatch):
    import subprocess as sp

    from imgbuild.payload.smoke import pipcheck as smoke_pipcheck
    from imgbuild.payload.smoke import report as smoke_report

    baseline = tmp_path / "pip-check.base"
    baseline.write_text("No broken requirements found.\n")
    monkeypatch.setattr(smoke_pipcheck, "PIP_CHECK_BASELINE", str(baseline))
    line = "srcpkg 2.20.0 has requirement fwk~=2.20.0, but you have fwk 2.21.0+nv24.5."
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: sp.CompletedProcess(a, 1, line + "\n", ""))
    monkeypatch.setenv("IMGBUILD_SMOKE_ACCEPT_PIP_CHECK", "")
    with pytest.raises(smoke_report.Fail) as refused:
        smoke_pipcheck.check_pip()
    monkeypatch.undo()
    assert follow(f"imgbuild: smoke test failed: pip check: {refused.value}", recipe, _never) == (
        "smoke.accept_pip_check: [srcpkg]"
    )
    assert _field(recipe, "smoke", "accept_pip_check") == ["srcpkg"]


def test_the_apt_line_for_all_failed_imports_is_added(recipe, monkeypatch):
    from imgbuild.payload.smoke import imports as smoke_imports
    from imgbuild.payload.smoke import report as smoke_report

    monkeypatch.setattr(smoke_imports, "read_baseline", lambda path: set())
    monkeypatch.setattr(smoke_imports, "_distributions", lambda: [])
    monkeypatch.setattr(smoke_imports, "_added", lambda baseline, every=None: [])
    monkeypatch.setenv("IMGBUILD_SMOKE_IMPORTS", "x")
    monkeypatch.setattr(smoke_imports, "import_all", lambda w, budget, workers: [{}])
    monkeypatch.setattr(smoke_imports, "import_served", lambda w, configured, workers: None)
    monkeypatch.setattr(smoke_imports, "framework_seconds", lambda limit, module="": 0.1)
    monkeypatch.setattr(smoke_imports, "missing_tools", lambda names: [("whisper", "ffmpeg", "ffmpeg")])
    monkeypatch.setattr(smoke_imports, "shared_modules", lambda dists, added: [])
    with pytest.raises(smoke_report.Fail) as failed:
        smoke_imports.check_imports()
    assert "for all of them, add to the recipe: apt: [ffmpeg]" in str(failed.value)
    assert follow(f"imgbuild: smoke test failed: imports: {failed.value}", recipe, _never) == "apt: [ffmpeg]"
