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
