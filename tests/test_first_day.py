"""README's first day, as written: the recipe it shows validates, builds and runs on the test bed, and every line
of output it shows is a line the real commands print (times, digests and the bed's registry aside)."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from tests.conftest import ROOT, run_cli

README = (ROOT / "README.md").read_text()
SECTION = README[README.index("## Your first day") : README.index("## Where to read next")]


def _block(lang: str) -> str:
    return re.search(rf"(?ms)^```{lang}\n(.*?)^```", SECTION).group(1)


def _shown() -> list[tuple[str, list[str]]]:
    """(command, the output lines shown under it) of the text block."""
    runs: list[tuple[str, list[str]]] = []
    for line in _block("text").splitlines():
        if line.startswith("$ "):
            runs.append((line[2:].split("  #")[0].strip(), []))
        else:
            runs[-1][1].append(line)
    return runs


def _pattern(line: str) -> re.Pattern[str]:
    text = re.escape(re.sub(r"^\[\s*[0-9.]+s\] ", "", line.rstrip()))
    text = text.replace("…", ".*").replace(r"nvcr\.io", r"[^ /]+")  # the bed's registry stands in for nvcr.io
    return re.compile(rf"^(\[\s*[0-9.]+s\] )?{text}\s*$")


def test_the_first_day_is_short():
    assert SECTION.count("\n") <= 60


def test_the_recipe_the_first_day_builds_is_the_one_in_recipes():
    assert (ROOT / "recipes" / "first-day.yaml").read_text() == _block("yaml")


@pytest.mark.frontdoor
@pytest.mark.engine
def test_the_first_day_runs_as_written_and_prints_what_it_shows(testbed, tmp_path, docker_client):
    project = tmp_path / "project"
    (project / "recipes").mkdir(parents=True)
    (project / ".git").mkdir()
    (project / "recipes" / "first-day.yaml").write_text(_block("yaml"))
    assert yaml.safe_load(_block("yaml"))["name"] == "first-day"
    config = tmp_path / "config.yaml"
    config.write_text("run:\n  ulimits: {memlock: 8388608}\n")  # this engine cannot raise memlock further
    env = {"IMGBUILD_USER": "you", "IMGBUILD_CONFIG": str(config)}
    try:
        for command, shown in _shown():
            args = shlex.split(command)
            assert args[0] == "imgbuild"
            if "--jupyter" in args:  # the stand-in has no JupyterLab: the lines are the ones run --jupyter prints
                from types import SimpleNamespace

                from imgbuild.servers.spec import jupyter_notes

                spec = SimpleNamespace(env=["JUPYTER_TOKEN=abc"], jupyter_port=8888, user="you", name="you_first-day_1")
                printed = jupyter_notes(spec, "gpu-server")  # type: ignore[arg-type]
            else:
                done = run_cli(*args[1:], cwd=project, env=env)
                assert done.code == 0, (command, done.err)
                printed = (done.out + done.err).replace(str(project) + "/", "").splitlines()
                printed = [re.sub(r"\broot_first-day", "you_first-day", line) for line in printed]
            for line in shown:
                assert any(_pattern(line).match(p) for p in printed), (
                    f"{command}: {line!r} not in {[p for p in printed if 'rendered' in p or 'built' in p]!r}"
                )
    finally:
        for container in docker_client.containers.list(all=True, filters={"name": "first-day"}):
            container.remove(force=True)
        for tag in ("you/first-day:1", "you/first-day:1-previous"):
            if docker_client.images.list(name=tag):
                docker_client.images.remove(tag, force=True)
