"""A problem as the CI system shows it on its run's page, pinned to the file, line and column it is about.

Under GitHub Actions that is a workflow command, `::error file=F,line=L,col=C::message`, each part first made safe
for a terminal (escape.terminal: no control, escape sequence, lone surrogate or noncharacter, which the log shows or
cannot even encode) and then escaped as GitHub's toolkit escapes it (the message: `%`, CR, LF; a property: those
and `:` and `,`), so no text of a recipe or of a build can end the command early or start a command of its own.
Elsewhere (GitLab, which has no annotations; a terminal) the message is the terminal-safe line.
"""

from __future__ import annotations

from dataclasses import dataclass

from imgbuild import escape
from imgbuild.errors import Problem
from imgbuild.ui import ci_kind

LEVELS = ("error", "warning", "notice")


@dataclass(frozen=True)
class Annotation:
    message: str
    file: str = ""
    line: int = 0
    col: int = 0
    level: str = "error"

    @classmethod
    def of(cls, problem: Problem, message: str = "") -> Annotation:
        """`problem` at its place; its message is the problem's line (`message` where the caller prefixed it)."""
        return cls(message or str(problem), problem.file, problem.line, problem.col)


def workflow_command(note: Annotation) -> str:
    """`note` as GitHub's workflow command, every value escaped for its place in it."""
    level = note.level if note.level in LEVELS else "error"
    where = [
        ("file", note.file),
        ("line", str(note.line) if note.line else ""),
        ("col", str(note.col) if note.col else ""),
    ]
    properties = ",".join(f"{key}={_property(value)}" for key, value in where if value)
    return f"::{level}{' ' + properties if properties else ''}::{_data(note.message)}"


def shown(note: Annotation, environ: dict[str, str] | None = None) -> str:
    """The line to print for `note`: the workflow command under GitHub Actions, else its message, terminal-safe."""
    return workflow_command(note) if ci_kind(environ) == "github" else escape.terminal(note.message)


def annotating(environ: dict[str, str] | None = None) -> bool:
    """Whether the CI system this runs under takes annotations (GitHub Actions)."""
    return ci_kind(environ) == "github"


def _data(text: str) -> str:
    """`text` terminal-safe, then escaped as the toolkit does (a CR is kept as `%0D`, not replaced as a control)."""
    return "%0D".join(escape.terminal(part).replace("%", "%25").replace("\n", "%0A") for part in text.split("\r"))


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")
