"""One JSON reader for everything someone else wrote (a registry's answers, records and signatures, caches): a
size bound, a nesting bound checked by a linear scan before parsing (no recursion to exhaust), and one error type
that callers turn into one line."""

from __future__ import annotations

import json
import re
from typing import Any

#: Deeper than any manifest, index, config, signature or record imgbuild reads (they nest under 10).
MAX_DEPTH = 64
MAX_BYTES = 64 * 1024 * 1024


class NotJson(ValueError):
    """Not JSON imgbuild will read: malformed, too large, or nested too deep."""


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def nesting_depth(data: bytes | str, stop: int = MAX_DEPTH) -> int:
    """How deep `data`'s arrays and objects nest (brackets inside strings do not count), in one linear pass; stops
    counting past `stop`."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    depth = deepest = 0
    for bracket in _BRACKET.finditer(_STRING.sub("", text)):
        depth += 1 if bracket.group() in "[{" else -1
        deepest = max(deepest, depth)
        if deepest > stop:
            break
    return deepest


def loads(data: bytes | str, what: str = "JSON", limit: int = MAX_BYTES) -> Any:
    """`data` parsed, or NotJson naming `what` and why."""
    if len(data) > limit:
        raise NotJson(f"{what}: larger than {limit} bytes")
    opens = data.count(b"[") + data.count(b"{") if isinstance(data, bytes) else data.count("[") + data.count("{")
    if opens > MAX_DEPTH and nesting_depth(data) > MAX_DEPTH:  # few brackets cannot nest deep: no scan
        raise NotJson(f"{what}: nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise NotJson(f"{what}: not JSON ({str(exc)[:80]})") from None


def marked_answer(output: str, marker: str, limit: int) -> dict[str, Any] | None:
    """The JSON object on the last line of `output` that starts with `marker`: how every script imgbuild runs in an
    image answers. None when there is no such line, or it is not an object, not JSON, longer than `limit` or nested
    too deep (an image's output is not trusted: hostile output reads as no answer)."""
    for line in reversed(output.splitlines()):
        if line.startswith(marker):
            try:
                data = loads(line[len(marker) :], "answer", limit)
            except NotJson:
                return None
            return data if isinstance(data, dict) else None
    return None
