"""`imgbuild validate` checks what this host already knows of the base: the config and
pins an earlier render, lock or build read, kept in the cache. A recipe that `build` would refuse at plan
time from those facts fails validate the same way, in milliseconds, asking nothing of the registry or engine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from imgbuild.hostio.cache import JsonCache
from tests.conftest import run_cli
from tests.ngc_facts import REAL

DIGEST = "sha256:" + "c1" * 32
NO_REGISTRY = {"IMGBUILD_NGC_REGISTRY": "127.0.0.1:9", "DOCKER_HOST": "unix:///nonexistent.sock"}


def _cache() -> Path:
    return Path(os.environ["IMGBUILD_CACHE_DIR"])


def _known(release: str, pins: tuple[str, ...] | None = None) -> str:
    """What a build would have cached of the registry's `release` (the real image's config), and its pins."""
    real = REAL[release]
    env = real.config_env("amd64")
    config = {"config": {"Env": [f"{k}={v}" for k, v in env.items()], "Labels": real.labels("amd64")}}
    ref = f"127.0.0.1:9/{real.repo}:{real.tag}"
    JsonCache(_cache() / "bases", None).put(ref, {"digest": DIGEST, "config": config})
    if pins is not None:
        JsonCache(_cache() / "base-pins", None).put(
            DIGEST, {"origin": "the base's /etc/pip/constraint.txt", "lines": list(pins)}
        )
    return ref


def _recipe(tmp_path: Path, tag: str, pip: str) -> Path:
    (tmp_path / ".git").mkdir(exist_ok=True)
    path = tmp_path / "r.yaml"
    path.write_text(f'name: r\nbase: {{framework: pytorch, tag: "{tag}"}}\npip:\n{pip}')
    return path


def test_a_requirement_for_another_cuda_fails_validate_from_the_cached_config(tmp_path):
    _known("pytorch:25.10-py3")
    recipe = _recipe(tmp_path, "25.10", '  packages: [einops, "jax[cuda12]"]\n')
    res = run_cli("validate", str(recipe), cwd=tmp_path, env=NO_REGISTRY)
    assert res.code == 2, res.err
    (line,) = res.err.strip().splitlines()
    assert line.startswith("r.yaml:4:22: pip.packages[1]: jax[cuda12] is built for CUDA 12, but the base has CUDA 13")


def test_a_requirement_the_base_pins_exclude_fails_validate_from_the_cached_pins(tmp_path):
    _known("pytorch:25.10-py3", ("numpy==2.1.0", "einops==0.8.1"))
    recipe = _recipe(tmp_path, "25.10", '  packages: ["numpy<2", einops]\n')
    res = run_cli("validate", str(recipe), cwd=tmp_path, env=NO_REGISTRY)
    assert res.code == 2, res.err
    assert "pip.packages[0]: numpy<2 conflicts with the base's numpy==2.1.0" in res.err
    assert "the base's /etc/pip/constraint.txt" in res.err


def test_the_pre_release_trap_fails_validate_from_the_cached_config(tmp_path):
    _known("pytorch:25.10-py3")
    recipe = _recipe(tmp_path, "25.10", '  packages: ["torch>=2.9"]\n')
    res = run_cli("validate", str(recipe), cwd=tmp_path, env=NO_REGISTRY)
    assert res.code == 2 and "NGC's torch is a pre-release of 2.9.0" in res.err, res.err


def test_what_the_host_does_not_know_yet_is_said_not_guessed(tmp_path):
    recipe = _recipe(tmp_path, "25.10", '  packages: ["jax[cuda12]"]\n')
    res = run_cli("validate", str(recipe), "--json", cwd=tmp_path, env=NO_REGISTRY)
    assert res.code == 0, res.err
    assert "not read on this host yet: render, lock or build check it" in res.out
    ok = _recipe(tmp_path, "latest", "  packages: [einops]\n")  # a pattern needs the registry's tag list
    assert "not read on this host yet" in run_cli("validate", str(ok), cwd=tmp_path, env=NO_REGISTRY).out


def test_a_recipe_that_passes_says_what_it_was_checked_against(tmp_path):
    ref = _known("pytorch:25.10-py3", ("numpy==2.1.0",))
    recipe = _recipe(tmp_path, "25.10", '  packages: ["numpy>=2", "jax[cuda13]"]\n')
    res = run_cli("validate", str(recipe), cwd=tmp_path, env=NO_REGISTRY)
    assert res.code == 0, res.err
    assert f"ok (checked against the base as last read here: {ref.split(':')[0]}:{ref.split(':')[1]}" in res.out
    assert f"@{DIGEST}, its pins (the base's /etc/pip/constraint.txt))" in res.out


@pytest.mark.parametrize(
    "entry",
    [
        "not a mapping",
        {"digest": DIGEST, "config": "not a mapping"},
        {"digest": DIGEST},
        [1, 2, 3],
    ],
)
def test_a_cache_entry_of_the_wrong_shape_is_not_believed(tmp_path, entry):
    real = REAL["pytorch:25.10-py3"]
    JsonCache(_cache() / "bases", None).put(f"127.0.0.1:9/{real.repo}:{real.tag}", entry)
    recipe = _recipe(tmp_path, "25.10", "  packages: [einops]\n")
    res = run_cli("validate", str(recipe), cwd=tmp_path, env=NO_REGISTRY)
    assert res.code == 0 and "not read on this host yet" in res.out, res.err


@pytest.mark.parametrize("pins", [{"origin": 3, "lines": []}, {"origin": "x", "lines": "numpy==1"}, "junk"])
def test_cached_pins_of_the_wrong_shape_are_no_pins(tmp_path, pins):
    _known("pytorch:25.10-py3")
    JsonCache(_cache() / "base-pins", None).put(DIGEST, pins)
    recipe = _recipe(tmp_path, "25.10", '  packages: ["numpy<2"]\n')
    res = run_cli("validate", str(recipe), cwd=tmp_path, env=NO_REGISTRY)
    assert res.code == 0, res.err
    assert "its pins" not in res.out
