"""YAML loading that remembers where every value came from (file, line, column).

Scalars keep YAML's types, except floats: `tag: 24.10` must stay the text "24.10", never 24.1.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from imgbuild import limits
from imgbuild.errors import Problem

PathKey = tuple[str | int, ...]
#: The YAML types a recipe may use; `!!python/...`, `!!binary`, `!!set`, `!!omap` and custom tags are refused.
PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq"))
#: Implicit YAML 1.1 types that a recipe means as text (`tag: 2024-01-01`, `=`): kept as written.
AS_WRITTEN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("timestamp", "value"))


@dataclass(frozen=True)
class Pos:
    file: str
    line: int
    col: int


@dataclass
class Located:
    """Parsed data plus the position of each value (by path) and of each mapping key."""

    data: Any
    values: dict[PathKey, Pos]
    keys: dict[PathKey, Pos]
    raw: dict[PathKey, str]

    def where(self, path: PathKey, *, key: bool = False) -> Pos | None:
        """Position of `path`, or of its nearest located ancestor."""
        table = self.keys if key else self.values
        if path in table:
            return table[path]
        for cut in range(len(path) - 1, -1, -1):
            prefix = path[:cut]
            if prefix in self.values:
                return self.values[prefix]
        return None

    def problem(
        self, path: PathKey, message: str, hint: str = "", *, key: bool = False, fallback_file: str = ""
    ) -> Problem:
        pos = self.where(path, key=key)
        field = dotted(path)
        if pos is None:
            return Problem(fallback_file, 0, 0, field, message, hint)
        return Problem(pos.file, pos.line, pos.col, field, message, hint)


#: A key shown as it is in a field's name; any other (white space, a control, a colon, another script) is shown
#: quoted and escaped, ASCII only, so a key can neither break the problem's line nor pose as another field.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./@+-]{0,79}")


def dotted(path: PathKey) -> str:
    """A field's name for a message; a key holding what looks like a credential is named as such, never shown."""
    from imgbuild.credentials import credential_kind

    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif credential_kind(str(part)):
            out += "[(a key holding a credential)]"
        elif _PLAIN_KEY.fullmatch(str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{json.dumps(str(part)[:80])}]"
    return out


_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster
_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def display_path(path: Path) -> str:
    """`path` as the person who wrote it sees it: relative to the working folder where it lies inside it; the name
    every Problem about the file carries."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_text_bounded(path: Path, display: str, limit: int, field: str = "") -> str:
    """A file's text as UTF-8, refusing what is too big, not UTF-8, or carries NUL bytes.

    Errors name the place (line and column) and never echo the file's content."""
    from imgbuild.errors import RecipeError

    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise RecipeError([Problem(display, 0, 0, field, f"cannot read file: {exc.strerror}")]) from None
    if len(data) > limit:
        raise RecipeError(
            [
                Problem(
                    display,
                    0,
                    0,
                    field,
                    f"file is larger than {limit // 1024} KiB",
                    "imgbuild reads recipes and requirement files of sane size only",
                )
            ]
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _line_col(data, exc.start)
        raise RecipeError([Problem(display, line, col, field, "not UTF-8 text", "save the file as UTF-8")]) from None
    if "\0" in text:
        line, col = _line_col(data, data.index(b"\0"))
        raise RecipeError([Problem(display, line, col, field, "NUL byte in the file")])
    return text.removeprefix("\ufeff")


def _line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    return line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1


def _yaml_problem(display: str, exc: yaml.YAMLError) -> Problem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
    problem = getattr(exc, "problem", None) or getattr(exc, "reason", None) or "unreadable YAML"
    if isinstance(exc, yaml.reader.ReaderError):
        problem = "a character YAML does not allow"
    return Problem(display, line, col, "", f"YAML syntax error: {problem}")


def _prescan(text: str, display: str) -> None:
    """Walk the event stream (no objects built) and stop at the first nesting past the limit."""
    from imgbuild.errors import RecipeError

    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, _OPEN):
            depth += 1
            if depth > limits.YAML_DEPTH:
                mark = event.start_mark
                line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
                raise RecipeError([Problem(display, line, col, "", f"nested deeper than {limits.YAML_DEPTH} levels")])
        elif isinstance(event, _CLOSE):
            depth -= 1


def load_located(path: Path, display: str) -> Located:
    """Parse one YAML file, bounded in size, nesting and alias expansion.

    Syntax errors, duplicate keys, merge keys, tags other than YAML's plain types and recursive or
    exploding aliases raise a RecipeError with positions; nothing of the file's content is echoed."""
    from imgbuild.errors import RecipeError

    text = read_text_bounded(path, display, limits.RECIPE_BYTES)
    loader = _Loader(text)
    try:
        _prescan(text, display)
        node = loader.get_single_node()
        return _Builder(loader, display).located(node)
    except yaml.YAMLError as exc:
        raise RecipeError([_yaml_problem(display, exc)]) from None
    finally:
        loader.dispose()


_TAG_HINT = "recipes hold plain text, numbers, lists, mappings"


class _Builder:
    """Builds plain data from a node graph, recording each value's position; counts every value built
    (aliases expand here, so an alias bomb stops at the limit) and refuses an alias back into itself."""

    def __init__(self, loader: Any, display: str):
        self.loader = loader
        self.display = display
        self.values: dict[PathKey, Pos] = {}
        self.keys: dict[PathKey, Pos] = {}
        self.raw: dict[PathKey, str] = {}
        self.problems: list[Problem] = []
        self.built = 0
        self.active: set[int] = set()  # nodes on the path from the root

    def located(self, node: yaml.Node | None) -> Located:
        from imgbuild.errors import RecipeError

        data = self.build(node, ()) if node is not None else {}
        if self.problems:
            raise RecipeError(self.problems)
        return Located(data, self.values, self.keys, self.raw)

    def fail(self, n: yaml.Node, message: str, at: PathKey = (), hint: str = "") -> Exception:
        from imgbuild.errors import RecipeError

        return RecipeError([Problem(self.display, *_lc(n), dotted(at), message, hint)])

    def pos(self, n: yaml.Node) -> Pos:
        return Pos(self.display, n.start_mark.line + 1, n.start_mark.column + 1)

    def scalar(self, n: yaml.Node, at: PathKey) -> Any:
        if n.tag in AS_WRITTEN_TAGS:
            return n.value  # an unquoted date or `=`: the text as written, validated like any string
        if n.tag not in PLAIN_TAGS:
            raise self.fail(n, f"YAML tag {n.tag!r} is not allowed", at, _TAG_HINT)
        try:
            return self.loader.construct_object(n)
        except ValueError:  # an integer past Python's digit limit (sys.get_int_max_str_digits)
            raise self.fail(n, "a number too long to read", at, "quote it if it is text") from None

    def build(self, n: yaml.Node, at: PathKey) -> Any:
        self.built += 1
        if self.built > limits.YAML_VALUES:
            raise self.fail(n, f"the recipe expands to more than {limits.YAML_VALUES} values (YAML aliases?)", at)
        if id(n) in self.active:
            raise self.fail(n, "recursive YAML alias", at)
        self.values[at] = self.pos(n)
        if isinstance(n, yaml.ScalarNode):
            self.raw[at] = n.value
            value = self.scalar(n, at)
            return n.value if isinstance(value, float) else value  # keep "24.10" as written
        if n.tag not in PLAIN_TAGS and n.tag not in AS_WRITTEN_TAGS:
            raise self.fail(n, f"YAML tag {n.tag!r} is not allowed", at, _TAG_HINT)
        self.active.add(id(n))
        try:
            if isinstance(n, yaml.SequenceNode):
                return [self.build(item, (*at, i)) for i, item in enumerate(n.value)]
            return self.mapping(n, at)
        finally:
            self.active.discard(id(n))

    def mapping(self, n: yaml.Node, at: PathKey) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k_node, v_node in n.value:
            if k_node.tag == "tag:yaml.org,2002:merge":
                raise self.fail(k_node, "YAML merge keys (<<) are not supported", at, "use extends: to share fields")
            if not isinstance(k_node, yaml.ScalarNode):
                raise self.fail(k_node, "a key must be plain text", at)
            key = self.scalar(k_node, at)
            key = key if isinstance(key, str) else str(key)
            if key in out:
                where = _lc(k_node)
                self.problems.append(
                    Problem(self.display, *where, dotted((*at, key)), "duplicate key", "each key may appear once")
                )
                continue
            self.keys[(*at, key)] = self.pos(k_node)
            out[key] = self.build(v_node, (*at, key))
        return out


def _lc(n: yaml.Node) -> tuple[int, int]:
    return n.start_mark.line + 1, n.start_mark.column + 1
