"""`extends`: a recipe on top of another. Shorthands normalised, layers loaded from the root up (paths made
absolute relative to the file that wrote them), merged by key, and every merged value pointed back at the file
and line that wrote it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgbuild import limits
from imgbuild.errors import Problem, RecipeError
from imgbuild.fields import show as _show
from imgbuild.recipe.interpolate import interpolate
from imgbuild.recipe.repofiles import (
    OutsideRepository,
    resolve_inside,
)
from imgbuild.yamlpos import Located, PathKey, Pos, display_path, load_located

# --- shorthands and merging -----------------------------------------------------------------------


def _move(located: Located, old: PathKey, new: PathKey) -> None:
    """Re-key positions under `old` to live under `new` (after a shorthand is expanded)."""
    tables: tuple[dict[PathKey, Any], ...] = (located.values, located.keys, located.raw)
    for table in tables:
        for path in [p for p in table if p[: len(old)] == old]:
            table[new + path[len(old) :]] = table[path]


def normalize(located: Located) -> None:
    """Expand the shorthands (`base: IMAGE`, `pip: [..]`, `user: true|NAME`) and keep positions right."""
    data = located.data
    if not isinstance(data, dict):
        return
    if isinstance(data.get("base"), str):
        _move(located, ("base",), ("base", "image"))
        data["base"] = {"image": data["base"]}
    if isinstance(data.get("pip"), list):
        _move(located, ("pip",), ("pip", "packages"))
        data["pip"] = {"packages": data["pip"]}
    user = data.get("user")
    if user is True:
        data["user"] = {}
    elif user is False or ("user" in data and user is None):
        data.pop("user")
    elif isinstance(user, str):
        _move(located, ("user",), ("user", "name"))
        data["user"] = {"name": user}
    for i, spec in enumerate(list_at(data, "files")):
        mode = spec.get("mode") if isinstance(spec, dict) else None
        if isinstance(mode, int) and not isinstance(mode, bool):
            # YAML 1.1 reads 0644 as the integer 420: take the digits as written.
            spec["mode"] = located.raw.get(("files", i, "mode"), oct(mode)[2:])


def _pip_name(spec: str) -> str:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        return canonicalize_name(Requirement(spec).name)
    except InvalidRequirement:
        return spec


def _merge_keyed(parent: list[Any], child: list[Any], key: Any) -> list[Any]:
    """Parent's items in order, each replaced by the child's item of the same key; the child's new ones after."""
    child_by_key = {key(c): c for c in child}
    merged = [child_by_key.pop(key(p), p) for p in parent]
    return merged + [c for c in child if key(c) in child_by_key]


#: How lists merge in `extends` (documented in docs/recipes.md). Anything else: the child replaces.
LIST_MERGE: dict[PathKey, Callable[[list[Any], list[Any]], list[Any]]] = {
    ("apt",): lambda p, c: _merge_keyed(p, c, lambda x: str(x).split("=")[0]),
    ("pip", "packages"): lambda p, c: _merge_keyed(p, c, lambda x: _pip_name(str(x))),
    ("pip", "constraints"): lambda p, c: _merge_keyed(p, c, lambda x: _pip_name(str(x))),
    ("files",): lambda p, c: _merge_keyed(p, c, lambda x: x.get("dest") if isinstance(x, dict) else repr(x)),
    ("run",): lambda p, c: p + c,
}
#: Mappings that merge key by key (child wins); other mappings too, recursively.
REPLACE_WHOLE: set[PathKey] = {("entrypoint",), ("cmd",), ("base",)}


def merge(parent: Any, child: Any, at: PathKey = ()) -> Any:
    if at in REPLACE_WHOLE:
        return child
    if isinstance(parent, dict) and isinstance(child, dict):
        out = dict(parent)
        for k, v in child.items():
            out[k] = merge(parent[k], v, (*at, k)) if k in parent else v
        return out
    if isinstance(parent, list) and isinstance(child, list) and at in LIST_MERGE:
        return LIST_MERGE[at](parent, child)
    return child


# --- loading --------------------------------------------------------------------------------------


@dataclass
class _Layer:
    located: Located
    path: Path


#: Fields that name files: each is resolved relative to the recipe that wrote it, inside the repository.
PATH_FIELDS: tuple[PathKey, ...] = (("pip", "requirements"), ("pip", "ca_bundle"))


def _resolve_relative(located: Located, base_dir: Path, root: Path, problems: list[Problem]) -> None:
    """Make file paths absolute relative to the file that declared them, before any merge; each must stay
    inside the repository (symlinks followed). A path that may not be used is dropped, with its problem."""
    data = located.data
    if not isinstance(data, dict):
        return
    places: list[tuple[dict[str, Any], str, PathKey]] = []
    for i, spec in enumerate(list_at(data, "files")):
        if isinstance(spec, dict):
            places.append((spec, "src", ("files", i, "src")))
    pip = data.get("pip")
    if isinstance(pip, dict):
        places += [(pip, str(at[1]), at) for at in PATH_FIELDS]
    for container, key, at in places:
        written = container.get(key)
        if not isinstance(written, str):
            continue
        try:
            container[key] = str(resolve_inside(base_dir, written, root))
        except OutsideRepository as exc:
            problems.append(located.problem(at, str(exc), "a recipe may name files of its own repository only"))
            del container[key]
            located.values.pop(at, None)


def load_chain(
    path: Path,
    environ: dict[str, str],
    problems: list[Problem],
    stack: list[Path],
    root: Path,
    secrets: tuple[str, ...],
) -> list[_Layer]:
    path = path.resolve()
    display = display_path(path)
    if path in stack:
        cycle = " -> ".join(display_path(p) for p in [*stack, path])
        raise RecipeError([Problem(display_path(stack[-1]), 0, 0, "extends", f"extends cycle: {cycle}")])
    located = load_located(path, display)
    if located.data is None or not isinstance(located.data, dict):
        raise RecipeError([Problem(display, 1, 1, "", "a recipe must be a YAML mapping of fields")])
    interpolate(located, environ, problems, secrets)
    normalize(located)
    _resolve_relative(located, path.parent, root, problems)
    layers: list[_Layer] = []
    parent = located.data.get("extends")
    if parent is not None:
        if not isinstance(parent, str) or not parent or any(ord(c) < 32 for c in parent):
            problems.append(located.problem(("extends",), "must be a path to another recipe"))
        elif len(stack) + 1 >= limits.EXTENDS_DEPTH:
            raise RecipeError(
                [
                    located.problem(
                        ("extends",),
                        f"extends is nested deeper than {limits.EXTENDS_DEPTH} recipes",
                        "flatten the chain",
                    )
                ]
            )
        else:
            try:
                parent_path = resolve_inside(path.parent, parent, root)
            except OutsideRepository as exc:
                problems.append(located.problem(("extends",), str(exc), "extends names a recipe of this repository"))
                return [_Layer(located, path)]
            if not parent_path.is_file():
                problems.append(
                    located.problem(
                        ("extends",), f"no such recipe: {_show(parent)}", "paths are relative to this recipe's folder"
                    )
                )
            else:
                layers = load_chain(parent_path, environ, problems, [*stack, path], root, secrets)
    return [*layers, _Layer(located, path)]


def merged_positions(layers: list[_Layer]) -> Located:
    """Positions of the merged recipe: for each path, the last (most specialised) file that set it.

    Linear in the size of the recipes: positions are grouped by list item once, items found by identity."""
    values: dict[PathKey, Pos] = {}
    keys: dict[PathKey, Pos] = {}
    raw: dict[PathKey, str] = {}
    data: Any = {}
    for layer in layers:
        values.update(layer.located.values)
        keys.update(layer.located.keys)
        raw.update(layer.located.raw)
        data = merge(data, layer.located.data)
    merged = Located(data, values, keys, raw)
    for list_path in LIST_MERGE:  # lists merged by key change indices
        if isinstance(_get(data, list_path), list):
            _repoint_list(merged, layers, list_path)
    return merged


def _repoint_list(merged: Located, layers: list[_Layer], list_path: PathKey) -> None:
    """Re-point each merged item of the list at `list_path` to the file and line that declared it."""
    n = len(list_path)
    origin: dict[int, tuple[int, int]] = {}  # id(item) -> (layer number, index in that layer's list)
    grouped: dict[tuple[int, str | int], list[tuple[str, PathKey, Pos]]] = {}
    for layer_no, layer in enumerate(layers):  # later layers win, as in the merge
        src = _get(layer.located.data, list_path)
        if isinstance(src, list):
            origin.update({id(item): (layer_no, j) for j, item in enumerate(src)})
        for name, table in (("values", layer.located.values), ("keys", layer.located.keys)):
            for p, pos in table.items():
                if len(p) > n and p[:n] == list_path and isinstance(p[n], int):
                    grouped.setdefault((layer_no, p[n]), []).append((name, p[n + 1 :], pos))
    for p in [p for p in (*merged.values, *merged.keys) if len(p) > n and p[:n] == list_path]:
        merged.values.pop(p, None)
        merged.keys.pop(p, None)
    for i, item in enumerate(_get(merged.data, list_path)):
        for name, rest, pos in grouped.get(origin.get(id(item), (-1, -1)), []):
            getattr(merged, name)[(*list_path, i, *rest)] = pos


def list_at(data: Any, key: str) -> list[Any]:
    """`data[key]` when it is a list, else no items (the model reports the wrong type, with its line)."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, list) else []


def _get(data: Any, path: PathKey) -> Any:
    for part in path:
        if isinstance(data, dict) and isinstance(part, str):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data
