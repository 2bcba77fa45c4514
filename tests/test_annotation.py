"""Problems as annotations on a CI run's page: GitHub's workflow commands at the file, line and column, every value
escaped for its place; `validate`, `build` and `rebuild` all go through the one helper."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgbuild.annotation import Annotation, shown, workflow_command
from imgbuild.errors import Problem
from tests.conftest import run_cli

GITHUB = {"GITHUB_ACTIONS": "true"}


def test_a_problem_is_pinned_to_its_file_line_and_column():
    problem = Problem("recipes/a.yaml", 3, 14, "base.framework", "must be 'pytorch' or 'tensorflow'")
    assert workflow_command(Annotation.of(problem)) == (
        "::error file=recipes/a.yaml,line=3,col=14::recipes/a.yaml:3:14: base.framework: must be 'pytorch' or "
        "'tensorflow'"
    )
    assert workflow_command(Annotation("no place")) == "::error::no place"
    assert workflow_command(Annotation("at a file", file="r.yaml")) == "::error file=r.yaml::at a file"


@pytest.mark.parametrize(
    ("message", "written"),
    [
        ("100% sure", "100%25 sure"),
        ("one\nsecond\r\nthird", "one%0Asecond%0D%0Athird"),
        ("x\n::stop-commands::token", "x%0A::stop-commands::token"),  # never a command at a line's start
        ("%0A stays text", "%250A stays text"),
    ],
)
def test_a_message_can_never_end_the_command_or_start_another(message, written):
    assert workflow_command(Annotation(message)) == f"::error::{written}"


def test_a_file_name_can_never_add_a_property_or_end_the_properties():
    note = Annotation("m", file="recipes/a,line=1:b%\n.yaml", line=2)
    assert workflow_command(note) == "::error file=recipes/a%2Cline=1%3Ab%25%0A.yaml,line=2::m"


def test_only_github_actions_gets_workflow_commands():
    note = Annotation("recipes/a.yaml:1:1: name: bad", file="recipes/a.yaml", line=1, col=1)
    assert shown(note, GITHUB).startswith("::error file=recipes/a.yaml,line=1,col=1::")
    assert shown(note, {"GITLAB_CI": "true"}) == shown(note, {}) == "recipes/a.yaml:1:1: name: bad"


def test_validate_build_and_rebuild_annotate_a_recipes_problem_at_its_place(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "bad.yaml").write_text('name: bad\nbase:\n  framework: jax\n  tag: "24.05"\n')
    want = "::error file=recipes/bad.yaml,line=3,col=14::"
    for args in (["validate", "recipes/bad.yaml"], ["build", "recipes/bad.yaml"], ["rebuild", "--check", "recipes"]):
        done = run_cli(*args, cwd=tmp_path, env=GITHUB)
        notes = [line for line in done.err.splitlines() if line.startswith("::error")]
        assert len(notes) == 1 and notes[0].startswith(want), (args, done.err)
        assert "base.framework: must be 'pytorch' or 'tensorflow'" in notes[0]
        plain = run_cli(*args, cwd=tmp_path, env={"GITHUB_ACTIONS": ""})
        said = plain.out + plain.err
        assert "::" not in said and "recipes/bad.yaml:3:14: base.framework" in said, (args, said)


def test_rebuild_annotates_a_failure_without_a_place_at_its_recipe():
    from imgbuild.ci.outcome import failure_annotations
    from imgbuild.ci.rebuild import FAILED, FRESH, Item

    failed = Item(Path("recipes/a.yaml"), status=FAILED, error="pip: no such package x\nmore")
    fresh = Item(Path("recipes/b.yaml"), status=FRESH)
    assert failure_annotations([failed, fresh]) == [
        Annotation("recipes/a.yaml: pip: no such package x", file="recipes/a.yaml")
    ]


def _unescaped(data: str) -> str:
    """A workflow command's message as GitHub's runner reads it back."""
    return data.replace("%0D", "\r").replace("%0A", "\n").replace("%25", "%")


@settings(max_examples=150, derandomize=True, deadline=None, database=None)
@given(message=st.text(max_size=40), file=st.text(max_size=20), line=st.integers(0, 10**6))
def test_any_message_or_file_is_one_printable_line_of_one_command_that_reads_back_as_shown(message, file, line):
    """Whatever a recipe, a build or a registry wrote (lone surrogates, noncharacters, escape sequences, CR and LF,
    `%`, `::`), the annotation is one line the runner reads as exactly one command, encodable as UTF-8, and its
    message reads back as the terminal-safe text; elsewhere the line is that text."""
    from imgbuild import escape

    command = workflow_command(Annotation(message, file=file, line=line))
    command.encode("utf-8")  # a lone surrogate raised UnicodeEncodeError when printed
    assert "\r" not in command and "\n" not in command and command.isprintable()
    assert command.startswith("::error") and command.count("::") >= 2
    head, _, data = command[2:].partition("::")
    assert "::" not in head  # no property ends the properties early
    assert _unescaped(data) == "\r".join(escape.terminal(part) for part in message.split("\r"))
    plain = shown(Annotation(message, file=file), {})
    plain.encode("utf-8")
    assert all(ch == "\n" or ch.isprintable() for ch in plain)
