"""YAML loading that remembers where every value came from (file, line, column).

Scalars keep YAML's types, except floats: `tag: 24.10` must stay the text "24.10", never 24.1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from imgbuild.errors import Problem

PathKey = tuple[str | int, ...]


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

    def problem(self, path: PathKey, message: str, hint: str = "", *, key: bool = False,
                fallback_file: str = "") -> Problem:
        pos = self.where(path, key=key)
        field = dotted(path)
        if pos is None:
            return Problem(fallback_file, 0, 0, field, message, hint)
        return Problem(pos.file, pos.line, pos.col, field, message, hint)


def dotted(path: PathKey) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_located(path: Path, display: str) -> Located:
    """Parse one YAML file. Syntax errors and duplicate keys raise a RecipeError with positions."""
    from imgbuild.errors import RecipeError

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError([Problem(display, 0, 0, "", f"cannot read file: {exc.strerror}")]) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        raise RecipeError([Problem(display, line, col, "", f"YAML syntax error: {exc.problem}")]) from None
    finally:
        loader.dispose()

    values: dict[PathKey, Pos] = {}
    keys: dict[PathKey, Pos] = {}
    raw: dict[PathKey, str] = {}
    problems: list[Problem] = []

    def pos(n: yaml.Node) -> Pos:
        return Pos(display, n.start_mark.line + 1, n.start_mark.column + 1)

    def build(n: yaml.Node, at: PathKey) -> Any:
        values[at] = pos(n)
        if isinstance(n, yaml.MappingNode):
            out: dict[str, Any] = {}
            for k_node, v_node in n.value:
                key = loader.construct_object(k_node)
                if not isinstance(key, str):
                    key = str(key)
                if key in out:
                    problems.append(Problem(display, *_lc(k_node), ".".join(map(str, (*at, key))),
                                            "duplicate key", "each key may appear once"))
                    continue
                keys[(*at, key)] = pos(k_node)
                out[key] = build(v_node, (*at, key))
            return out
        if isinstance(n, yaml.SequenceNode):
            return [build(item, (*at, i)) for i, item in enumerate(n.value)]
        raw[at] = n.value
        value = loader.construct_object(n)
        if isinstance(value, float):
            return n.value  # keep "24.10" as written
        return value

    data = build(node, ()) if node is not None else {}
    if problems:
        raise RecipeError(problems)
    return Located(data, values, keys, raw)


def _lc(n: yaml.Node) -> tuple[int, int]:
    return n.start_mark.line + 1, n.start_mark.column + 1
