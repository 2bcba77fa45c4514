"""One bounded tree walk (imgbuild.hostio.tree) for every folder imgbuild reads whole: iterative (a folder nested 1,100
deep was `unexpected RecursionError` in validate), depth-capped, links listed but never walked into."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from imgbuild import limits
from imgbuild.hostio.tree import TooDeep, walk
from tests.conftest import run_cli


@pytest.fixture(autouse=True)
def _unnest_afterwards(tmp_path):
    """pytest's own clean-up (shutil.rmtree) recurses: a tree 1,100 deep is removed here, without recursion."""
    yield
    subprocess.run(["rm", "-rf", str(tmp_path)], check=False, timeout=120)


def _nest(top: Path, depth: int) -> Path:
    """`top`/d/d/.../d, `depth` folders deep, made without recursion (os.makedirs recurses)."""
    here = top
    here.mkdir(parents=True, exist_ok=True)
    fd = os.open(here, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("x", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as handle:
            handle.write("x")
    finally:
        os.close(fd)
    return top


def test_the_walk_is_top_down_sorted_and_prunable(tmp_path):
    (tmp_path / "b" / "inner").mkdir(parents=True)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("")
    (tmp_path / "z").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "b")
    seen = []
    for folder, dirs, names in walk(tmp_path):
        seen.append((Path(folder).relative_to(tmp_path).as_posix(), list(dirs), names))
        if folder == str(tmp_path / "b"):
            dirs[:] = []  # pruned: inner is never listed
    assert seen == [(".", ["a", "b", "link"], ["z"]), ("a", [], ["f"]), ("b", ["inner"], [])]


def test_a_folder_past_the_bound_is_one_refusal_not_a_recursion_error(tmp_path):
    _nest(tmp_path / "t", 1_100)
    with pytest.raises(TooDeep, match=f"nested more than {limits.TREE_DEPTH} deep"):
        list(walk(tmp_path / "t"))
    assert len(list(walk(_nest(tmp_path / "ok", limits.TREE_DEPTH)))) == limits.TREE_DEPTH + 1


def _repo(tmp_path: Path, files_yaml: str) -> Path:
    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / "recipes").mkdir(exist_ok=True)
    recipe = tmp_path / "recipes" / "r.yaml"
    recipe.write_text(f'name: r\nbase: {{framework: pytorch, tag: "24.05"}}\nfiles: [{files_yaml}]\n')
    return recipe


def _git_config_link(tmp_path: Path) -> None:
    (tmp_path / ".git" / "config").write_text("[http]\n\textraheader = AUTHORIZATION: bearer glcbt-token\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "settings.ini").symlink_to(tmp_path / ".git" / "config")


def _git_folder_link(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "meta").symlink_to(tmp_path / ".git")


def _deep(tmp_path: Path) -> None:
    _nest(tmp_path / "app", 1_100)


def _nested_git_file(tmp_path: Path) -> None:
    (tmp_path / "app" / "sub").mkdir(parents=True)
    (tmp_path / "app" / "sub" / "token").symlink_to(tmp_path / ".git" / "HEAD")
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")


@pytest.mark.parametrize(
    "why, plant, said",
    [
        ("a folder nested 1,100 deep", _deep, "nested more than 128 deep"),
        ("a link to .git/config (the CI job token)", _git_config_link, "inside .git"),
        ("a link to .git/HEAD one folder down", _nested_git_file, "inside .git"),
        ("a link to the .git folder", _git_folder_link, "symlink to a folder"),
    ],
)
def test_validate_refuses_a_hostile_copied_folder_in_one_line(tmp_path, why, plant, said):
    (tmp_path / ".git").mkdir()
    plant(tmp_path)
    recipe = _repo(tmp_path, "{src: ../app, dest: /opt/app}")
    done = run_cli("validate", str(recipe), cwd=tmp_path, timeout=120)
    assert done.code == 2, (why, done.err)
    assert said in done.err and "Traceback" not in done.err and len(done.err.strip().splitlines()) == 1, done.err
    assert "glcbt-token" not in done.err + done.out


def test_rebuild_discovers_recipes_without_recursion_and_refuses_a_tree_too_deep(tmp_path):
    _nest(tmp_path / "recipes" / "deep", 1_100)
    done = run_cli("rebuild", "--check", str(tmp_path / "recipes"), cwd=tmp_path, timeout=120)
    assert done.code == 2 and "nested more than 128 deep" in done.err and "Traceback" not in done.err, done.err
