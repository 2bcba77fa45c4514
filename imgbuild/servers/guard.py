"""The frame of every imgbuild process that acts on a person's words: the command line, and a queued job's start in
the queue's child (`servers/queuechild.py`). As root, its start is hardened first (`rootside.harden`); a user acting
through sudo is held to the user commands (`enforce.gate`) and every ending of theirs is audited; every ending is
one line per problem and an exit code (`errors.ending`), never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

from imgbuild.errors import EXIT_OK, ImgbuildError, ending
from imgbuild.hostio.acting import acting_for_user
from imgbuild.hostio.host import Caller, caller

#: How an ending is shown: what ended it (None: success), its lines and its exit code.
Show = Callable[[BaseException | None, list[str], int], None]


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C: candidate tags, smoke containers, secret files


def guarded(args: list[str], body: Callable[[Caller], None], show: Show) -> int:
    """`body(who)` for the words `args` (the verb first), and the exit code it ends with. `who` is the one reading
    of who runs this: every command takes it from here. `show` prints the ending's lines."""
    import click

    from imgbuild.hostio import rootside

    rootside.harden()  # as root: no import from a user-writable place; under sudo, a fixed environment
    with contextlib.suppress(ValueError):  # not the main thread (tests calling main())
        for signum in (signal.SIGTERM, signal.SIGHUP):  # sudo relays a hang-up: clean up as for Ctrl-C
            signal.signal(signum, _terminate)
    who = caller()
    acting = False
    try:
        acting = acting_for_user(who)
        if acting:  # only then the rules are imported: root's own commands and everyone else's never pay for them
            from imgbuild.config.settings import load_settings
            from imgbuild.servers import enforce

            enforce.gate(args)  # through sudo: the user commands, and nothing else
            _place = enforce.command_place(who, load_settings(who=who).run)  # held until this process ends
        body(who)
    except BaseException as exc:  # noqa: BLE001 - every way out becomes lines and an exit code, below
        if os.environ.get("IMGBUILD_DEBUG") and not isinstance(exc, (ImgbuildError, click.ClickException)):
            raise
        lines, code = ending(exc)
        if acting:
            _audit(args, f"exit {code}" + (f": {lines[0][:300]}" if lines and code else ""), who)
        show(exc, lines, code)
        return code
    if acting:
        _audit(args, f"exit {EXIT_OK}", who)
    show(None, [], EXIT_OK)
    return EXIT_OK


def _audit(args: list[str], decision: str, who: Caller) -> None:
    """Enforced mode: how a user's command ended, in root's audit log (a log that cannot be written is said,
    never lets the command's own outcome be lost)."""
    from imgbuild.config.settings import load_settings
    from imgbuild.servers.enforce import audit

    try:
        audit(args[0] if args else "", args, decision, load_settings(who=who).run.ledger_dir, who.name, who.uid)
    except ImgbuildError as exc:
        print(f"imgbuild: the audit log: {exc}", file=sys.stderr)
