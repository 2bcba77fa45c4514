"""Real projects' requirement sets on the stand-in bases: each builds an image in which every
package it added imports, or ends with one line naming the package and the cause, as tests/realsets/sets.yaml
says. Small sets run in CI; heavy ones (GBs of wheels) with `pytest -m heavy` and benchmarks/realsets.py.
"""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from tests.realsets import load

SETS = load()


def _build(name: str, tmp_path, cleanup_images) -> None:
    realset = SETS[name]
    recipe = realset.prepare(tmp_path, lambda args: run_cli(*args, cwd=tmp_path).code)
    res = run_cli("build", str(recipe), cwd=tmp_path)
    if res.code == 0:
        cleanup_images.append(res.out.strip().splitlines()[-1].split(" -> ")[0])
    problems = realset.problems(res.code, res.err, tmp_path)
    assert not problems, f"{name}: {problems}\n{res.err[-3000:]}"


@pytest.mark.engine
@pytest.mark.fidelity
@pytest.mark.parametrize("name", [n for n, s in SETS.items() if s.size == "small"])
def test_a_real_requirement_set(name, testbed, tmp_path, cleanup_images):
    _build(name, tmp_path, cleanup_images)


@pytest.mark.engine
@pytest.mark.heavy
@pytest.mark.parametrize("name", [n for n, s in SETS.items() if s.size == "heavy"])
def test_a_heavy_real_requirement_set(name, testbed, tmp_path, cleanup_images):
    _build(name, tmp_path, cleanup_images)


def test_every_set_is_a_valid_recipe_and_each_that_resolves_is_locked(tmp_path):
    """A set that resolves carries its lock (the versions it builds with); one that cannot has none."""
    from imgbuild.recipe import load_recipe

    for name, realset in SETS.items():
        if realset.init:  # its recipe is what `imgbuild init` writes from the project's file, on the bed
            assert (realset.stage(tmp_path / name).parent.parent / "pyproject.toml").is_file(), name
            continue
        loaded = load_recipe(realset.stage(tmp_path / name))
        resolves = realset.exit == 0 or "import" in realset.expect
        assert bool(loaded.lock_pins) == resolves, name
