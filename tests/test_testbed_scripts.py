"""The bed's scripts, checked without bringing the bed up: how they start its daemons."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

TESTBED = ROOT / "tests" / "testbed"
DETACHED = TESTBED / "detached"


def _lock_outlives_the_caller(launcher: list[str]) -> bool:
    """Whether a lock the caller held stays held by a daemon it started through `launcher`, once the caller has
    let go of its own descriptor."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"imgbuild-detached-{os.getpid()}.lock")
    held = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        daemon = subprocess.Popen([*launcher, "sleep", "30"], pass_fds=(held,))
        try:
            for _ in range(500):  # until the launcher has become the daemon
                if Path(f"/proc/{daemon.pid}/comm").read_text().strip() == "sleep":
                    break
                time.sleep(0.01)
            os.close(held)
            held = -1
            other = os.open(path, os.O_RDWR)
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            finally:
                os.close(other)
            return False
        finally:
            daemon.kill()
            daemon.wait()
    finally:
        if held >= 0:
            os.close(held)
        os.unlink(path)


def test_a_daemon_the_bed_starts_holds_no_lock_of_its_caller():
    assert _lock_outlives_the_caller([]), "the check itself: a plain child inherits the lock"
    assert not _lock_outlives_the_caller([str(DETACHED)])


@pytest.mark.parametrize("script", ["up", "slurm-up"])
def test_every_daemon_the_bed_starts_goes_through_detached(script):
    """A command sent to the background, and the daemons that fork away by themselves, start through
    tests/testbed/detached: none keeps a descriptor of whoever ran the bed's script."""
    lines = (TESTBED / script).read_text().splitlines()
    started = [
        line.strip()
        for line in lines
        if not line.lstrip().startswith("#")
        and (re.search(r"[^&]&\s*$", line) or re.match(r"\s*(runuser\b.*--\s*)?(munged|slurmctld|slurmd)\b", line))
    ]
    started += [line.strip() for line in lines if '"$HERE/detached"' in line]
    assert started, f"{script} starts no daemon"
    assert all(line.startswith('"$HERE/detached" ') for line in started), started
