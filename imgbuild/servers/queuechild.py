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

from imgbuild.errors import EXIT_USAGE, ImgbuildError, UsageError

if TYPE_CHECKING:
    from imgbuild.hostio.host import Caller

#: The exit code of a start whose GPUs are busy (sysexits' EX_TEMPFAIL): the job stays queued.
BUSY = 75


class StillQueued(ImgbuildError):
    """The job's GPUs are busy now: it waits in the queue for its next turn."""

    exit_code = BUSY


def main() -> None:
    """The child's whole life: `{"cwd": FOLDER, "words": [...], "user": NAME, "enter_as": [UID, GID, GROUPS]}` on
    standard input (`enter_as` only where root stays root to act for the user); exits with the start's code."""
    job = json.load(sys.stdin)
    enter = job.get("enter_as")
    ids = (int(enter[0]), int(enter[1]), [int(g) for g in enter[2]]) if enter else None
    sys.exit(start(str(job["cwd"]), [str(word) for word in job["words"]], ids, str(job.get("user") or "")))


def start(cwd: str, words: list[str], enter_as: tuple[int, int, list[int]] | None = None, user: str = "") -> int:
    """`imgbuild run WORDS` in the folder `cwd`, for a queued job: its exit code, every line said on stderr (where
    the queue reads the container's name, or why it failed)."""
    from imgbuild.servers.guard import guarded

    if not _enter(cwd, enter_as, user):
        return EXIT_USAGE
    return guarded(["run", *words], lambda who: _run(words, who), _show)


def _enter(cwd: str, enter_as: tuple[int, int, list[int]] | None, user: str) -> bool:
    """Into the job's folder with its user's permissions: as whoever this process already is (the user, never root
    on its way to becoming them), or, where root stays root to act for them (`enter_as`: their uid, gid and
    groups), with their IDs for the one `chdir` and root's back after it. A folder they cannot enter is said."""
    groups = os.getgroups()
    try:
        if enter_as is not None:
            os.setgroups(enter_as[2])
            os.setegid(enter_as[1])
            os.seteuid(enter_as[0])
        os.chdir(cwd)
    except OSError as exc:
        _say(f"imgbuild: the job's folder {cwd[:200]}: {exc.strerror}" + (f" (as {user})" if user else ""))
        return False
    finally:
        if enter_as is not None:
            os.seteuid(0)
            os.setegid(0)
            os.setgroups(groups)
    return True


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
