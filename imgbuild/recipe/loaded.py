"""A recipe as read from its file: the typed Recipe with where it came from (the file, its `extends` chain, the
repository its paths stay inside), what it names outside itself (files, requirements, the lock) as read once, and
how a path is shown to the person who wrote it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from imgbuild.errors import UsageError
from imgbuild.recipe import reqfile
from imgbuild.recipe.model import Recipe
from imgbuild.recipe.repofiles import SourceFile
from imgbuild.yamlpos import Located


@dataclass
class LoadedRecipe:
    """A validated recipe with where it came from: the file, its `extends` chain, resolved paths."""

    recipe: Recipe
    path: Path
    chain: list[Path]
    file_sources: dict[str, Path] = field(default_factory=dict)  # files[i].dest -> absolute src
    requirements_path: Path | None = None
    ca_bundle_path: Path | None = None
    located: Located | None = field(default=None, repr=False)
    root: Path | None = None  # the repository every named path stays inside
    #: files[i].dest -> the files to copy (checked: inside the repository, regular, bounded)
    file_manifest: dict[str, list[SourceFile]] = field(default_factory=dict)
    #: the requirements file's requirements (its nested -r files' too), each with its file and line, read once
    requirements: tuple[reqfile.ReqLine, ...] = ()
    #: its constraints (-c files), and the pip options it sets (index URLs, trusted hosts, --pre, ...)
    requirement_constraints: tuple[reqfile.ReqLine, ...] = ()
    requirement_options: tuple[str, ...] = ()
    #: the recipe's lock (`<recipe>.lock.txt` beside it, written by `imgbuild lock`): name==version lines
    lock_path: Path | None = None
    lock_pins: tuple[str, ...] = ()
    lock_lines: tuple[reqfile.ReqLine, ...] = ()  # the same pins, each with its line (for located conflicts)
    #: files[i].dest -> sha256 of what will be copied (names, exec bits, content), hashed once at load
    file_digests: dict[str, str] = field(default_factory=dict)
    #: `recipes/x.yaml` (stable_name): the recipe as every label, record and provenance names it, fixed at load
    name: str = field(init=False, default="")
    #: the path as its writer sees it (display_path: relative to the working folder), for every message; fixed at load
    display: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.name = stable_name(self.path)
        self.display = display_path(self.path)


def stable_name(path: Path) -> str:
    """`recipes/x.yaml`: the recipe's folder and file name, the same on every machine and from any cwd."""
    path = Path(path)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


#: A recipe's path as CI passes it on (a plan's matrix, a child pipeline's script, a workflow `init` writes): letters,
#: digits and `. _ / -`, no part that starts with `-`. Such a name is the same word to every shell, YAML file and
#: template expression it passes through, and never an option.
CI_PATH_RE = re.compile(r"/?(?!-)[A-Za-z0-9._-]+(?:/(?!-)[A-Za-z0-9._-]+)*")


def ci_path(shown: str) -> str:
    """`shown` (a recipe's path as display_path gives it), checked as a name CI may pass on; else UsageError, one
    line naming it."""
    if not CI_PATH_RE.fullmatch(shown):
        raise UsageError(
            f"{shown!r}: a recipe's path CI passes on may hold only letters, digits and . _ / - (no part starting "
            "with -): rename the file or its folder"
        )
    return shown
