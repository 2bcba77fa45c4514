"""The queue's child: a queued job's start, in the process the queue starts for it (`servers/queue.py`: an isolated
interpreter, `python -I`, in `/`, as whoever it runs as, its words never in an argv).

Its folder and words come on standard input. It enters the folder itself, then runs `imgbuild run WORDS`
through `run`'s own grammar (`servers/runwords.py`) and call (`servers.run.launch`) inside the frame of every
imgbuild process (`servers/guard.py`: hardened as root, gated and audited for a user acting through sudo): a queued
job starts exactly as its user typing `imgbuild run -d` would. Two rules are the queue's own: a queued job waits in
the queue, never in its start (`--wait` is refused in any spelling), and GPUs busy now end the start with BUSY (the
job stays queued).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

from imgbuild.errors import EXIT_FAILED, ImgbuildError, UsageError

if TYPE_CHECKING:
    from imgbuild.hostio.host import Caller

#: The exit code of a start whose GPUs are busy (sysexits' EX_TEMPFAIL): the job stays queued.
BUSY = 75


class StillQueued(ImgbuildError):
    """The job's GPUs are busy now: it waits in the queue for its next turn."""

    exit_code = BUSY


def main() -> None:
    """The child's whole life: `{"cwd": FOLDER, "words": [...]}` on standard input; exits with the start's code."""
    job = json.load(sys.stdin)
    sys.exit(start(str(job["cwd"]), [str(word) for word in job["words"]]))


def start(cwd: str, words: list[str]) -> int:
    """`imgbuild run WORDS` in the folder `cwd`, for a queued job: its exit code, every line said on stderr (where
    the queue reads the container's name, or why it failed)."""
    from imgbuild.servers.guard import guarded

    try:
        os.chdir(cwd)  # as whoever this process already is: never root on its way to becoming the job's user
    except OSError as exc:
        _say(f"imgbuild: the job's folder {cwd[:200]}: {exc.strerror}")
        return EXIT_FAILED
    return guarded(["run", *words], lambda who: _run(words, who), _show)


def _run(words: list[str], who: Caller) -> None:
    from imgbuild.config.settings import load_settings
    from imgbuild.gpu.allocate import GpusBusy
    from imgbuild.servers import run, runwords

    call = runwords.parse(words)
    if call is None:  # the words asked only for the help
        return
    if call.wait is not None:
        raise UsageError("--wait: a queued job waits in the queue, never in its start (leave out --wait)")
    try:
        done = run.launch(call, load_settings(who=who), say=_say)
    except GpusBusy as busy:
        raise StillQueued(str(busy)) from None
    for line in [done.command_line, *done.notes]:
        if line:
            print(line)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _show(exc: BaseException | None, lines: list[str], code: int) -> None:
    for line in lines:
        _say(line)
