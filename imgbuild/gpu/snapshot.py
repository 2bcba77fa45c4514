"""GPU readings saved as JSON (`imgbuild gpus --json > snap.json`), read back to plan or test without the server:
every field checked by the rule its live reader's value follows, so a snapshot can never carry what no reader
would give (a malformed driver, compute capability or PCI id, a field `gpus --json` never writes) into a verdict.
One that does is a usage error naming the file, the line and column, and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgbuild import limits
from imgbuild.errors import Problem, RecipeError, UsageError
from imgbuild.gpu.fleet import capability_rule, driver_rule
from imgbuild.gpu.shapes import KERNEL_DRIVER, PCI_ADDRESS, PCI_DEVICE_ID, SNAPSHOT_SOURCE, Gpu, GpuProcess, PciGpu

#: Where in a snapshot a value is (`("gpus", 1, "driver")`), and a rule that checks one value found there.
At = tuple[str | int, ...]
FieldRule = Callable[[Any, At], Any]


class _NotSnapshot(Exception):
    """A field of a snapshot that is not what `imgbuild gpus --json` writes: where (a path) and why."""

    def __init__(self, at: At, why: str):
        super().__init__(why)
        self.at, self.why = at, why


def _whole(value: Any, at: At, top: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (top is not None and value > top):
        raise _NotSnapshot(at, f"{str(value)[:40]!r} is not a whole number" + (f" up to {top}" if top else ""))
    return value


def _flag(value: Any, at: At) -> bool:
    if not isinstance(value, bool):
        raise _NotSnapshot(at, "is not true or false")
    return value


def _words(value: Any, at: At, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
    if not isinstance(value, str) or len(value) > 256 or not value.isprintable():
        raise _NotSnapshot(at, "is not a line of text")
    if pattern is not None and value and not pattern.fullmatch(value):
        raise _NotSnapshot(at, f"{value[:40]!r} is not {what}")
    return value


def _ruled(value: Any, at: At, rule: Callable[[str], str]) -> str:
    text = _words(value, at)
    try:
        return rule(text) if text else ""
    except ValueError as exc:
        raise _NotSnapshot(at, str(exc)) from None


def _entry(value: Any, at: At, fields: dict[str, FieldRule], required: tuple[str, ...]) -> dict[str, Any]:
    """An object's fields, each checked by its rule: one the object lacks or one of no rule's is refused."""
    if not isinstance(value, dict):
        raise _NotSnapshot(at, "is not an object")
    for name in value:
        if name not in fields:
            raise _NotSnapshot((*at, str(name)), "is no field of a GPU snapshot's")
    for name in required:
        if name not in value:
            raise _NotSnapshot(at, f"has no {name}")
    return {name: fields[name](item, (*at, name)) for name, item in value.items()}


def _listed(value: Any, at: At, each: FieldRule) -> list[Any]:
    if not isinstance(value, list) or len(value) > 4096:
        raise _NotSnapshot(at, "is not a list")
    return [each(item, (*at, i)) for i, item in enumerate(value)]


def _snapshot_process(value: Any, at: At) -> GpuProcess:
    fields: dict[str, FieldRule] = {
        "pid": _whole,
        "name": _words,
        "used_mib": _whole,
        "user": _words,
        "container": _words,
    }
    return GpuProcess(**_entry(value, at, fields, ("pid", "name", "used_mib")))


def _snapshot_gpu(value: Any, at: At) -> Gpu:
    """One GPU of a snapshot, every field checked by the rule its reader's value follows: a driver version and a
    compute capability as the fleet check reads them (a malformed one is never judged, nor dropped unseen)."""
    fields: dict[str, FieldRule] = {
        "index": _whole,
        "uuid": _words,
        "name": _words,
        "memory_used_mib": _whole,
        "memory_total_mib": _whole,
        "utilization": lambda v, where: None if v is None else _whole(v, where, 100),
        "processes": lambda v, where: _listed(v, where, _snapshot_process),
        "compute_cap": lambda v, where: _ruled(v, where, capability_rule),
        "driver": lambda v, where: _ruled(v, where, driver_rule),
        "cpu_affinity": _words,
        "mig_parent": _words,
        "mig_profile": _words,
        "mig_unsliced": _flag,
    }
    required = ("index", "uuid", "name", "memory_used_mib", "memory_total_mib", "utilization")
    return Gpu(**_entry(value, at, fields, required))


def _snapshot_pci(value: Any, at: At) -> PciGpu:
    fields: dict[str, FieldRule] = {
        "address": lambda v, where: _words(v, where, PCI_ADDRESS, "a PCI address (0000:0f:00.0)"),
        "device": lambda v, where: _words(v, where, PCI_DEVICE_ID, "a PCI device id (0x1db4)"),
        "driver": lambda v, where: _words(v, where, KERNEL_DRIVER, "a kernel driver's name (nvidia, vfio-pci)"),
    }
    entry = _entry(value, at, fields, ("address", "device", "driver"))
    if not entry["address"]:
        raise _NotSnapshot((*at, "address"), "is empty")
    return PciGpu(**entry)


@dataclass(frozen=True)
class Snapshot:
    """A saved reading: the GPUs, and the NVIDIA GPUs on the PCI bus where it recorded them (None: not recorded)."""

    gpus: list[Gpu]
    pci: tuple[PciGpu, ...] | None = None


class SnapshotReader:
    """Readings saved as JSON (`imgbuild gpus --json > snap.json`): to plan or test without the server. Every field
    is checked; one that is not what `gpus --json` writes is an input error naming the file, its line and the
    field, never a reading."""

    source = SNAPSHOT_SOURCE

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def read(self) -> list[Gpu]:
        return self.snapshot().gpus

    def snapshot(self) -> Snapshot:
        try:
            with self.path.open("rb") as handle:
                data = json.loads(handle.read(limits.HTTP_BODY_BYTES + 1)[: limits.HTTP_BODY_BYTES])
        except OSError as exc:
            raise UsageError(f"{self.path}: cannot read the GPU snapshot: {exc.strerror}") from exc
        except ValueError as exc:
            raise UsageError(f"{self.path}: not a GPU snapshot (`imgbuild gpus --json` writes one)") from exc
        try:
            if isinstance(data, list):
                return Snapshot(_listed(data, (), _snapshot_gpu))
            if not isinstance(data, dict) or "gpus" not in data:
                raise _NotSnapshot((), "has no gpus")
            gpus = _listed(data["gpus"], ("gpus",), _snapshot_gpu)
            pci = tuple(_listed(data["pci"], ("pci",), _snapshot_pci)) if data.get("pci") is not None else None
            return Snapshot(gpus, pci)
        except _NotSnapshot as bad:
            raise UsageError(self._where(bad)) from None

    def _where(self, bad: _NotSnapshot) -> str:
        """The one line naming the file, the line and column where the field is, and the field."""
        from imgbuild.yamlpos import dotted, load_located  # only for a snapshot that is wrong: YAML's positions

        problem = Problem(str(self.path), 0, 0, dotted(bad.at), f"not a GPU snapshot: {bad.why}")
        try:
            located = load_located(self.path, str(self.path))  # JSON is YAML: the same positions
        except (RecipeError, OSError):
            return str(problem)
        return str(located.problem(bad.at, problem.message, fallback_file=str(self.path)))
