"""One bounded walk of a folder tree, for every folder imgbuild reads whole (a recipe's copied folder, a build
context, a staged dataset, a recipes folder).

Iterative, never recursive: a folder nested 1,100 deep is a one-line refusal (TooDeep), not a RecursionError.
Top-down like os.walk(followlinks=False): the caller may prune `dirs` in place; a link to a folder is listed
among `dirs` but never walked into; a folder that cannot be read is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from imgbuild import limits


class TooDeep(ValueError):
    """A tree deeper than its bound; the message names the folder where it went past it."""


def walk(top: str | os.PathLike[str], max_depth: int = limits.TREE_DEPTH) -> Iterator[tuple[str, list[str], list[str]]]:
    """(folder, its sub-folders, its other entries) for `top` and every folder below it, top-down, sorted."""
    stack: list[tuple[str, int]] = [(os.fspath(top), 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as entries:
                listed = list(entries)
        except OSError:
            continue
        dirs = sorted(e.name for e in listed if _is_dir(e))
        names = sorted(e.name for e in listed if not _is_dir(e))
        yield folder, dirs, names
        below = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
        if below and depth + 1 > max_depth:
            raise TooDeep(f"{folder}: folders nested more than {max_depth} deep")
        stack.extend((os.path.join(folder, d), depth + 1) for d in reversed(below))


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False
