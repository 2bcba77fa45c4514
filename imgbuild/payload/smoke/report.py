"""The smoke test's core: a check's outcomes (Skip, Fail, Warn), its progress lines, the report the checks fill and
its table, and the children it starts (a script and the marker its answer line starts with, in one object)."""

from __future__ import annotations

import os
import platform
import sys
import time


class Skip(Exception):
    pass


class Fail(Exception):
    """A check failed; `details` keeps its numbers (a failing tensor-core check's TFLOP/s and floors)."""

    def __init__(self, reason, details=None):
        super().__init__(reason)
        self.details = dict(details or {})


class Warn(Fail):
    """A check passed with a warning; its numbers kept too."""


#: Each check's start and end as it goes, on stderr (the host shows them live: a smoke test is never silent for
#: long), apart from the report on stdout.
PROGRESS = "imgbuild-smoke: "


def say(text: str) -> None:
    sys.stderr.write(PROGRESS + text + "\n")
    sys.stderr.flush()


class Report:
    def __init__(self) -> None:
        self.checks: list[dict] = []
        self.meta: dict = {"python": platform.python_version(), "machine": platform.machine()}

    def run(self, name: str, fn, *args) -> dict | None:
        start = time.perf_counter()
        entry: dict = {"name": name}
        say(f"check {len(self.checks) + 1}: {name} ...")
        try:
            details = fn(*args) or {}
            entry.update(status="pass", reason=details.pop("reason", ""), details=details)
        except Skip as exc:
            entry.update(status="skip", reason=str(exc), details={})
        except Warn as exc:
            entry.update(status="warn", reason=str(exc), details=exc.details)
        except Fail as exc:
            entry.update(status="fail", reason=str(exc), details=exc.details)
        except Exception as exc:  # noqa: BLE001 - a crash in a check is that check failing, not the script
            entry.update(status="fail", reason=f"{type(exc).__name__}: {exc}".splitlines()[0][:300], details={})
        entry["seconds"] = round(time.perf_counter() - start, 3)
        self.checks.append(entry)
        say(f"check {len(self.checks)}: {name} {entry['status'].upper()} ({entry['seconds']:.1f} s)")
        return entry.get("details")

    def fail(self, name: str, reason: str) -> None:
        self.checks.append({"name": name, "status": "fail", "reason": reason, "details": {}, "seconds": 0.0})

    @property
    def ok(self) -> bool:
        return all(c["status"] != "fail" for c in self.checks)


def table(report: Report) -> str:
    rows = [(c["name"], c["status"].upper(), c["reason"]) for c in report.checks]
    width = max(len(r[0]) for r in rows) if rows else 10
    return "\n".join(f"{n:<{width}}  {s:<4}  {r}" for n, s, r in rows)


#: The environment variable a probe's script reads its marker from: the host's probe object (imgbuild.payload.probes)
#: sets it for the scripts it runs in an image, and a Child here for the scripts the smoke test starts.
MARKER_VARIABLE = "IMGBUILD_PROBE_MARKER"


def marker() -> str:
    """This script's own marker, as whoever started it gave it; empty when run by hand (a bare JSON line)."""
    return os.environ.get(MARKER_VARIABLE, "")


class Child:
    """A script the smoke test runs in a process of its own (`python3 -c SCRIPT`) and the marker its answer line
    starts with: one object for both sides, the child printing `marker()` and this reading what follows it."""

    def __init__(self, script: str, marker: str) -> None:
        self.script = script
        self.marker = marker

    def env(self, base) -> dict:
        """`base` with the child's marker in it."""
        return {**base, MARKER_VARIABLE: self.marker}

    def answer(self, output: str) -> str | None:
        """What follows the marker on the first line of `output` that starts with it; None when none does."""
        line = next((x for x in output.splitlines() if x.startswith(self.marker)), None)
        return None if line is None else line[len(self.marker) :]
