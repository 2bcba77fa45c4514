"""The scripted user of benchmarks/realsets.py --follow (benchmarks/follow.py) reads imgbuild's own words: each
cure imgbuild prints, as imgbuild prints it, is applied to the recipe as the words say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

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
            "imgbuild: pip step failed: building srcpkg imports the base's framework, which pip's isolated build "
            "environment lacks: add srcpkg to pip.no_build_isolation, so that it builds against the base's own "
            "framework",
            "pip.no_build_isolation: [srcpkg]",
            ("pip", "no_build_isolation"),
            ["srcpkg"],
        ),
        (
            "r.yaml:4:22: pip.packages[1]: numpy<2.4 conflicts with the base's numpy==2.4.6 (pinned by the base): "
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


def test_the_cure_for_another_cuda_is_imgbuilds_own_words_applied(recipe, tmp_path):
    """The line the plan prints for jax[cuda12] on the real 25.10 config, followed: the requirement becomes the
    cure it names, and the plan accepts it."""
    from imgbuild.errors import RecipeError
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.recipe import load_recipe
    from tests.support import real_base, settings

    (tmp_path / ".git").mkdir()
    base = real_base("pytorch:25.10-py3")
    config = {"config": {"Env": [f"{k}={v}" for k, v in base.env.items()]}}
    recipe.write_text(RECIPE.replace(", srcpkg", ""))
    with pytest.raises(RecipeError) as err:
        make_plan(load_recipe(recipe), settings(), lambda ref: ("sha256:" + "a" * 64, config))
    assert follow(str(err.value), recipe, _never) == "asked for jax[cuda13]"
    assert yaml.safe_load(recipe.read_text())["pip"]["packages"] == ["einops", "jax[cuda13]"]
    make_plan(load_recipe(recipe), settings(), lambda ref: ("sha256:" + "a" * 64, config))  # accepted


def test_a_stale_lock_is_cured_by_running_imgbuild_lock(recipe):
    ran = []

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        ran.append(args)
        return subprocess.CompletedProcess(args, 0, "", "")

    said = "the recipe changed since its lock was written: run imgbuild lock r.yaml (it re-resolves einops)"
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


def test_words_that_name_no_cure_leave_the_scripted_user_stuck(recipe):
    assert follow("imgbuild: pip step failed: pip failed; see its output above", recipe, _never) is None
    assert recipe.read_text() == RECIPE


def test_a_line_whose_cure_is_to_drop_it_is_dropped_where_the_refusal_places_it(tmp_path):
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.write_text(
        'name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: {requirements: r.txt, packages: [a, torch]}\n'
    )
    (tmp_path / "recipes" / "r.txt").write_text("torch<2.6\nnumpy==1.26.2\neinops\n")
    said = (
        "imgbuild: recipes/r.txt:1:1: pip.requirements: torch<2.6 conflicts with the base's torch 2.13.0a0 (the base's "
        "framework is protected: drop it)\n"
        "imgbuild: recipes/r.yaml:3:48: pip.packages[1]: torch is the base's framework (the base's framework is "
        "protected: drop it)\n"
    )
    assert follow(said, recipe, _never) == "dropped torch, torch<2.6"
    assert (tmp_path / "recipes" / "r.txt").read_text() == "numpy==1.26.2\neinops\n"
    assert yaml.safe_load(recipe.read_text())["pip"]["packages"] == ["a"]
