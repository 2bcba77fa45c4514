"""imgbuild.regular: files opened, written and named in their errors as a user can act on them."""

from __future__ import annotations

import pytest


def test_a_full_disk_under_the_build_log_names_the_log(tmp_path):
    """A build log on a full disk: write() and close() errors carry no file name, so the log's own errors add it
    (one line, exit 3), never `cannot use: No space left on device` alone."""
    import errno
    from pathlib import Path

    from imgbuild.cli import _outcome
    from imgbuild.regular import open_log

    with pytest.raises(OSError) as caught, open_log(Path("/dev/full")) as log:
        log.write("#5 [2/5] RUN pip install ...\n" * 1000)
        log.flush()
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == "/dev/full"
    lines, code = _outcome(caught.value)
    assert lines == ["imgbuild: cannot use /dev/full: No space left on device"] and code == 3


def _full_disk(*args, **kwargs):
    import errno
    import os

    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("writer", ["write_atomic", "write_new"])
def test_a_full_disk_under_any_written_file_names_the_file(writer, tmp_path, monkeypatch):
    """fsync's and write's ENOSPC name no file: merge-reports' JUnit file, bump's recipe, init's recipe did not."""
    import os

    from imgbuild.cli import _outcome
    from imgbuild.pipeline.starter import write_new
    from imgbuild.regular import write_atomic

    target = tmp_path / "report.xml"
    monkeypatch.setattr(os, "fsync", _full_disk)
    with pytest.raises(OSError) as caught:
        (write_atomic if writer == "write_atomic" else write_new)(target, "<testsuites/>")
    lines, code = _outcome(caught.value)
    assert lines == [f"imgbuild: cannot use {target}: No space left on device"] and code == 3
    assert os.listdir(tmp_path) == []  # nothing half-written, no temporary file


def test_a_killed_write_leaves_no_file_beside_the_one_it_replaces(tmp_path):
    """A kill -9 mid-fsync left `.NAME.PID.HEX.partial` beside a recipe (git add picks it up)."""
    import signal
    import subprocess
    import sys
    import time

    recipe = tmp_path / "demo.yaml"
    recipe.write_text("name: demo\n")
    code = (
        "import os, sys, time; from pathlib import Path; from imgbuild.regular import write_atomic\n"
        "real = os.fsync\n"
        "def slow(fd): print('syncing', flush=True); time.sleep(30)\n"
        "os.fsync = slow\n"
        f"write_atomic(Path({str(recipe)!r}), 'name: demo\\ntag: v2\\n')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout and proc.stdout.readline().strip() == "syncing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    time.sleep(0.05)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.yaml"]
    assert recipe.read_text() == "name: demo\n"


def test_the_next_write_sweeps_what_a_killed_one_left(tmp_path):
    """Where the file system has no O_TMPFILE the temporary file is named; a dead writer's is swept."""
    from imgbuild.regular import write_atomic

    dead = tmp_path / ".demo.yaml.999999999.0badf00d.partial"  # no such PID
    dead.write_text("half")
    other = tmp_path / ".other.yaml.999999999.0badf00d.partial"  # another file's: not this write's to judge
    other.write_text("half")
    write_atomic(tmp_path / "demo.yaml", "name: demo\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "demo.yaml"]
