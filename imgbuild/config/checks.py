"""The checks every config section's fields share: durations, sizes, one line of plain text, a number within
bounds, and what makes a field the site's alone (`site_only`)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from imgbuild.fields import _BAD, Check, Integer, Issue, Number, Text, matches

#: How a site-only setting may be changed by a user's config: never, or only downwards (a tighter limit).
NEVER, LOWER = "never", "lower"
DURATION_RE = re.compile(r"([0-9]{1,7})([smhd]?)")
DURATION_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
ABSOLUTE_RE = re.compile(r"/[^\x00-\x1f\x7f]{0,4095}")
ONE_LINE_RE = re.compile(r"[^\x00-\x1f\x7f\u0085\u2028\u2029]{0,1024}")
SIZE_RE = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,6})? ?[kKmMgGtT]?[iI]?[bB]?")


def duration_seconds(text: str) -> float:
    """`90`, `90s`, `30m`, `2h`, `7d` -> seconds; ASCII digits only. ValueError otherwise."""
    match = DURATION_RE.fullmatch(str(text).strip().lower())
    if not match:
        raise ValueError(f"{str(text)[:40]!r} is not a duration like 600, 30m, 2h or 7d")
    return float(int(match.group(1)) * DURATION_SECONDS[match.group(2)])


def _duration(value: str) -> str:
    duration_seconds(value)
    return value


def _positive_duration(value: str) -> str:
    if duration_seconds(value) <= 0:
        raise ValueError("must be longer than 0")
    return value


#: The engine's smallest memory limit (Docker refuses a --memory below 6 MiB) and the largest it can hold.
MIN_MEMORY = 6 * 1024 * 1024
MAX_MEMORY = 2**62
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def size_bytes(text: str) -> int:
    """`512m`, `64g`, `1.5GiB` -> bytes, binary units as Docker reads them; ValueError otherwise."""
    if not SIZE_RE.fullmatch(str(text).strip()):
        raise ValueError(f"{str(text)[:40]!r} is not a size such as 512m or 64g")
    number = re.match(r"[0-9.]+", text.strip())
    unit = text.strip()[number.end() :].strip().lower().rstrip("b").rstrip("i") if number else ""
    return int(float(number.group(0) if number else 0) * _SIZE_UNITS[unit])


def shm_size(value: str) -> str:
    """A private /dev/shm's size as the engine takes it (`--shm-size`): a size, more than nothing, in range."""
    if not 0 < size_bytes(value) <= MAX_MEMORY:
        raise ValueError(f"must be more than 0 and at most {MAX_MEMORY >> 40}t")
    return value


def memory_cap(value: str) -> str:
    if not MIN_MEMORY <= size_bytes(value) <= MAX_MEMORY:
        raise ValueError(f"must be from 6m (the engine's least) to {MAX_MEMORY >> 40}t")
    return value


DURATION = Text(_duration, numbers=True)
POSITIVE_DURATION = Text(_positive_duration, numbers=True)
PATH = Text(matches(ABSOLUTE_RE, "not an absolute path"))


def _plain_line(value: str) -> str:
    from imgbuild.text import describe, unsafe_character

    bad = unsafe_character(value)
    if bad is not None:
        raise ValueError(f"must be one line of plain text: {describe(bad)} is refused")
    return value


ONE_LINE = Text(matches(ONE_LINE_RE, "must be one line of at most 1024 characters"), _plain_line, numbers=True)
COUNT = Integer(ge=0, le=1_000_000)


class Between(Check):
    """A number within [low, high] (seconds, percent)."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high, self.number = low, high, Number()

    def check(self, value: Any, at: tuple[Any, ...], issues: list[Issue], key: bool = False) -> Any:
        made = self.number.check(value, at, issues, key)
        if isinstance(made, float) and not self.low <= made <= self.high:
            issues.append(Issue(at, f"must be from {self.low:g} to {self.high:g}", "", key))
            return _BAD
        return made

    def schema(self, defs: dict[str, Any]) -> dict[str, Any]:
        return {"type": "number", "minimum": self.low, "maximum": self.high}


def site_only(check: Check, default: Any = None, *, how: str = NEVER, doc: str = "", factory: Any = None) -> Any:
    """A field only the site config may set (`how`: NEVER from a user's config, or LOWER: only tighter)."""
    metadata = {"check": check, "doc": doc, "site_only": how}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)
