"""GPU usage a lab can account for: what each reaper run saw, summed per user, group or GPU.

Every `imgbuild reap` run appends one record to the usage log in its own folder (`<state_dir>/.reap/usage.jsonl`,
root's alone): the time, the seconds since the previous run (capped: a reaper that did not run for a day does not
give one sample a day), and per running container with GPUs its owner, the owner's group, and each GPU's UUID and
utilisation. `imgbuild usage` sums the log: GPU-hours held (a GPU given to a container, for the interval),
GPU-hours used (held, weighted by the GPU's utilisation) and their ratio, the mean utilisation. A GPU whose
utilisation cannot be read (MIG) counts as held, not used, and its hours are listed apart.

The summing is pure (records in, rows out); reading and writing the log are at the edge, bounded and safe
against a planted file like the reaper's other files.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.engine.types import ContainerInfo, LocalImage
from imgbuild.errors import EnvironmentProblem, UsageError

if TYPE_CHECKING:
    from imgbuild.gpu.read import Gpu

USAGE_FILE = "usage.jsonl"
#: The longest interval one record covers (three runs of a 5-minute timer).
MAX_INTERVAL = 900.0
#: The log is read from its end, this much at most; past it, the older half is moved to usage.jsonl.1.
LOG_BYTES = 64 * 1024 * 1024
BY = ("user", "group", "gpu")


# --- records (what the reaper writes) -------------------------------------------------------------------


def record(now: float, previous: float | None, holds: list[dict[str, Any]]) -> dict[str, Any]:
    """One reaper run's record: `holds` is one entry per running container with GPUs,
    {"user", "group", "container", "gpus": [{"uuid", "util"}]} (util None where it cannot be read)."""
    seconds = 0.0 if previous is None or now <= previous else min(now - previous, MAX_INTERVAL)
    return {"time": round(now, 3), "seconds": round(seconds, 3), "holds": holds}


def holds_of(rows: list[ContainerInfo], gpus: list[Gpu], group_of: Callable[[str], str]) -> list[dict[str, Any]]:
    """The running containers' GPUs as a record holds them (`group_of(user)`: the user's primary group)."""
    from imgbuild.servers.holds import running_with_gpus

    holds = []
    for row, held in running_with_gpus(rows, gpus):
        user = row.user
        holds.append(
            {
                "user": user,
                "group": group_of(user) if user else "",
                "container": row.name,
                "gpus": [{"uuid": g.uuid, "util": g.utilization} for g in held],
            }
        )
    return holds


# --- summing (pure) ---------------------------------------------------------------------------------------


@dataclass
class Row:
    key: str
    held_hours: float = 0.0
    used_hours: float = 0.0
    unmeasured_hours: float = 0.0  # held on GPUs whose utilisation cannot be read (MIG)
    containers: set[str] = field(default_factory=set)

    @property
    def mean_util(self) -> float | None:
        measured = self.held_hours - self.unmeasured_hours
        return 100 * self.used_hours / measured if measured > 0 else None

    def to_json(self) -> dict[str, Any]:
        util = self.mean_util
        return {
            "key": self.key,
            "gpu_hours_held": round(self.held_hours, 4),
            "gpu_hours_used": round(self.used_hours, 4),
            "gpu_hours_unmeasured": round(self.unmeasured_hours, 4),
            "mean_utilization": None if util is None else round(util, 2),
            "containers": len(self.containers),
        }


_KEY = re.compile(r"[^\x00-\x1f\x7f]{1,256}")


def summarize(records: list[Any], by: str, since: float | None = None) -> list[Row]:
    """GPU-hours per `by` (user, group or gpu) over `records` at or after `since`. A record or entry that is not
    what the reaper writes (a hostile or torn line) is skipped, never trusted for more than it can say."""
    if by not in BY:
        raise UsageError(f"--by {by}: one of {', '.join(BY)}")
    rows: dict[str, Row] = {}
    for rec in records:
        if not isinstance(rec, dict):
            continue
        when, seconds, holds = rec.get("time"), rec.get("seconds"), rec.get("holds")
        if not (_number(when) and _number(seconds) is not None and isinstance(holds, list)):
            continue
        if since is not None and float(when) < since:  # type: ignore[arg-type]
            continue
        hours = min(float(seconds), MAX_INTERVAL) / 3600  # type: ignore[arg-type]
        for hold in holds:
            if isinstance(hold, dict) and isinstance(hold.get("gpus"), list):
                _add_hold(rows, hold, by, hours)
    return sorted(rows.values(), key=lambda r: (-r.held_hours, r.key))


def _add_hold(rows: dict[str, Row], hold: dict[str, Any], by: str, hours: float) -> None:
    for gpu in hold["gpus"][:64]:
        if not isinstance(gpu, dict):
            continue
        key = str(hold.get(by) if by != "gpu" else gpu.get("uuid"))
        if not _KEY.fullmatch(key) or key == "None":
            key = "?"
        row = rows.setdefault(key, Row(key))
        row.held_hours += hours
        util = _number(gpu.get("util"))
        if util is not None and util <= 100:
            row.used_hours += hours * util / 100
        else:
            row.unmeasured_hours += hours
        row.containers.add(str(hold.get("container") or ""))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


# --- Prometheus textfile (node_exporter's textfile collector) ---------------------------------------------


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(by_user: list[Row], by_gpu: list[Row], since: float | None, now: float) -> str:
    """The exposition text: per-user and per-GPU gauges of GPU-hours held and used over the window."""
    window = "all recorded time" if since is None else f"the last {round((now - since) / 86400, 2)} days"
    lines: list[str] = []
    for name, what, attr in (
        ("imgbuild_gpu_hours_held", "GPU-hours held by containers", "held_hours"),
        ("imgbuild_gpu_hours_used", "GPU-hours used (held, weighted by utilisation)", "used_hours"),
    ):
        for label, rows in (("user", by_user), ("gpu", by_gpu)):
            metric = f"{name}_by_{label}"
            lines += [f"# HELP {metric} {what}, per {label}, over {window}.", f"# TYPE {metric} gauge"]
            lines += [f'{metric}{{{label}="{_label(r.key)}"}} {float(getattr(r, attr))!r}' for r in rows]
    lines += [
        "# HELP imgbuild_usage_generated_seconds When imgbuild usage wrote this file (Unix time).",
        "# TYPE imgbuild_usage_generated_seconds gauge",
        f"imgbuild_usage_generated_seconds {now:.3f}",
    ]
    return "\n".join(lines) + "\n"


def write_textfile(path: Path, text: str) -> None:
    """Write `path` whole (the one writer: beside it, then renamed over it), as node_exporter's textfile collector
    requires."""
    from imgbuild.hostio.regular import write_atomic

    try:
        write_atomic(path, text, 0o644)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write {path}: {exc.strerror}") from None


# --- the log (I/O) ------------------------------------------------------------------------------------------


def append(folder: Path, rec: dict[str, Any]) -> None:
    """Append `rec` to the usage log in the reaper's own folder: a regular file the reaper owns, never a link;
    past LOG_BYTES the log is rotated once (usage.jsonl.1 keeps the previous span)."""
    from imgbuild.servers.ledger import append_record

    path = folder / USAGE_FILE
    try:
        if os.path.getsize(path) > LOG_BYTES:
            os.replace(path, path.with_name(USAGE_FILE + ".1"))
    except OSError:
        pass
    append_record(path, rec, "the usage log", mode=0o600)


def read(folder: Path) -> list[Any]:
    """The records of the usage log (and its rotated half), oldest first; bounded, torn lines skipped. A log that
    is not the reaper's own (another owner, a link, writable by others) is refused: its figures are forged."""
    from imgbuild.hostio.regular import open_regular

    records: list[Any] = []
    for path in (folder / (USAGE_FILE + ".1"), folder / USAGE_FILE):
        try:
            fd = open_regular(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise EnvironmentProblem(f"cannot read the usage log {path}: {exc.strerror}") from None
        if fd is None:
            raise EnvironmentProblem(f"the usage log {path} is not a regular file; an admin removes it")
        try:
            info = os.fstat(fd)
            if info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022 or info.st_nlink != 1:
                raise EnvironmentProblem(f"the usage log {path} is not the reaper's own file; its figures are not used")
            size = info.st_size
            os.lseek(fd, max(0, size - LOG_BYTES), os.SEEK_SET)
            data = b""
            while len(data) < LOG_BYTES and (chunk := os.read(fd, 1 << 20)):
                data += chunk
        finally:
            os.close(fd)
        for line in data.decode("utf-8", errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except (ValueError, RecursionError):
                continue
    return records


def since_of(text: str | None, now: float | None = None) -> float | None:
    """`--since 30d` (a duration back from now) as a Unix time; None for all of the log."""
    if not text:
        return None
    from imgbuild.config.checks import duration_seconds

    try:
        seconds = duration_seconds(text)
    except ValueError as exc:
        raise UsageError(f"--since: {exc}") from None
    if seconds <= 0:
        raise UsageError(f"--since {text}: a duration back from now, e.g. 30d or 12h")
    return (time.time() if now is None else now) - seconds


def fair_share(ledger_dir: Path, window: str | None, now: float | None = None) -> dict[str, float]:
    """Each user's GPU-hours held over the last `window` (the site's `run.fair_share_window`), from the reaper's
    usage log: the order of waiting runs and queued jobs, least first. {} (first come, first served) where there
    is no window or the log cannot be read (a user without sudo: it is root's)."""
    from imgbuild.config.checks import duration_seconds
    from imgbuild.servers.ledger import REAPER_DIR

    if window is None:
        return {}
    now = time.time() if now is None else now
    try:
        records = read(ledger_dir / REAPER_DIR)
    except EnvironmentProblem:
        return {}
    return {row.key: row.held_hours for row in summarize(records, "user", now - duration_seconds(window))}


@dataclass(frozen=True)
class DiskRow:
    user: str
    images: int  # distinct images
    tags: int
    size: int  # bytes, each distinct image once (layers two images share counted in each)

    def to_json(self) -> dict[str, Any]:
        return {"user": self.user, "images": self.images, "tags": self.tags, "bytes": self.size}


def image_owner(ref: str, known_user: Callable[[str], bool]) -> str:
    """The user whose image `ref` is (`<user>/NAME:TAG`, built on this host, no registry in it); "" otherwise."""
    first, slash, _ = ref.partition("/")
    if not slash or "." in first or ":" in first or first == "localhost":
        return ""
    return first if known_user(first) else ""


def disk_use(images: list[LocalImage], known_user: Callable[[str], bool]) -> list[DiskRow]:
    """Each user's images (`<user>/...`) on the engine's disk, largest first (pure)."""
    per_user: dict[str, dict[str, int]] = {}
    tags: dict[str, int] = {}
    for image in images:
        user = image_owner(image.ref, known_user)
        if user:
            per_user.setdefault(user, {})[image.id] = image.size
            tags[user] = tags.get(user, 0) + 1
    rows = [DiskRow(u, len(ids), tags[u], sum(ids.values())) for u, ids in per_user.items()]
    return sorted(rows, key=lambda r: (-r.size, r.user))


@dataclass
class Account:
    rows: list[Row]  # per `by`
    by_user: list[Row]
    by_gpu: list[Row]
    since: float | None
    records: int


def account(ledger_dir: Path, by: str, since_text: str | None, now: float | None = None) -> Account:
    """`imgbuild usage`: the reaper's usage log under `ledger_dir`, summed per `by` since `since_text` (30d)."""
    from imgbuild.servers.ledger import REAPER_DIR

    now = time.time() if now is None else now
    since = since_of(since_text, now)
    if by not in BY:
        raise UsageError(f"--by {by}: one of {', '.join(BY)}")
    folder = ledger_dir / REAPER_DIR
    if not os.access(folder, os.X_OK) and folder.exists():
        raise EnvironmentProblem(
            f"the usage log in {folder} is the reaper's (root's): run `sudo imgbuild usage`, or read the "
            "Prometheus textfile the site writes (`imgbuild usage --prometheus FILE` from the reaper's timer)"
        )
    records = read(folder)
    return Account(
        summarize(records, by, since),
        summarize(records, "user", since),
        summarize(records, "gpu", since),
        since,
        len(records),
    )
