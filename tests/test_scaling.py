"""Bounded cost where the input's size is the user's: each input at n and 10n, the work timed
(best of three), and the growth asserted to be about 10x, never the 100x a quadratic scan gives. Inputs: a
lock's lines, a requirements file's lines, a recipe's apt list, a copied folder's files, a registry's tag list,
and a smoke record's entries."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from imgbuild.pipeline.plan import make_plan
from imgbuild.recipe import load_recipe
from tests.support import fake_inspect, settings

HEAD = 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\n'


def _best(work, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()  # CPU time: a busy machine stretches wall time, not this
        work()
        times.append(time.process_time() - start)
    return min(times)


def _lock(tmp: Path, n: int) -> None:
    (tmp / "demo.yaml").write_text(HEAD + "pip: [einops==0.8.0]\n")
    (tmp / "demo.lock.txt").write_text("# imgbuild lock\n" + "".join(f"pkg{i}==1.{i}\n" for i in range(n)))


def _requirements(tmp: Path, n: int) -> None:
    (tmp / "demo.yaml").write_text(HEAD + "pip: {requirements: reqs.txt}\n")
    (tmp / "reqs.txt").write_text("".join(f"pkg{i}==1.{i}\n" for i in range(n)))


def _apt(tmp: Path, n: int) -> None:
    (tmp / "demo.yaml").write_text(HEAD + "apt:\n" + "".join(f"  - pkg{i}\n" for i in range(n)))


def _files(tmp: Path, n: int) -> None:
    folder = tmp / "data"
    folder.mkdir()
    for i in range(n):
        (folder / f"f{i}.txt").write_text(str(i))
    (tmp / "demo.yaml").write_text(HEAD + "files: [{src: data, dest: /opt/data}]\n")


@pytest.mark.parametrize(
    "what, make, n",
    [
        ("a lock's lines", _lock, 3_000),
        ("a requirements file's lines", _requirements, 1_500),
        ("a recipe's apt list", _apt, 800),
        ("a copied folder's files", _files, 400),
    ],
)
def test_validate_grows_linearly_with_the_users_input(tmp_path, what, make, n):
    def plan_of(size: int) -> float:
        folder = tmp_path / str(size)
        folder.mkdir()
        (folder / ".git").mkdir()
        make(folder, size)
        return _best(lambda: make_plan(load_recipe(folder / "demo.yaml", environ={}), settings(), fake_inspect))

    small, large = plan_of(n), plan_of(10 * n)
    assert large < 30 * max(small, 0.01), f"{what}: {small:.3f} s at {n}, {large:.3f} s at {10 * n}"


def test_a_smoke_record_is_read_in_linear_time():
    from imgbuild.pipeline import spared

    def record(n: int) -> dict:
        rows = [[f"p{i}", "1.0", "a" * 64] for i in range(n)]
        return {"ok": True, "base": "b", "scope": "s", "meta": {"added": rows}}

    small, large = record(400), record(4_000)
    t_small = _best(lambda: spared.vouched(small, "b", "s"))
    t_large = _best(lambda: spared.vouched(large, "b", "s"))
    assert t_large < 30 * max(t_small, 0.001), (t_small, t_large)


def test_the_payloads_unchanged_set_is_linear():
    from imgbuild.payload.smoke import dists as smoke_dists

    def case(n: int) -> tuple:
        work = [(f"p{i}", "1.0", [f"m{i}"]) for i in range(n)]
        known = "".join(f"p{i}==1.0 {'a' * 64}\n" for i in range(1, n))  # p0 changed: the whole chain is
        present = {f"p{i}": ("1.0", "a" * 64) for i in range(n)}
        needs = {f"p{i}": {f"p{i - 1}"} if i else set() for i in range(n)}
        return work, known, needs, present

    small, large = case(300), case(3_000)
    t_small = _best(lambda: smoke_dists.unchanged_since_last(*small))
    t_large = _best(lambda: smoke_dists.unchanged_since_last(*large))
    assert smoke_dists.unchanged_since_last(*small) == set()  # p0 is new, and each needs the one before
    assert t_large < 30 * max(t_small, 0.001), (t_small, t_large)
