"""The command line: one module per help section (recipes, images, registry, servers, clusters, settings),
each command parsing its flags, making one call and printing. One error path: every ImgbuildError becomes
one line per problem and an exit code.

Exit codes: 0 success, 1 the job ran and failed, 2 bad input or usage, 3 environment.
Heavy modules are imported inside commands so `imgbuild --help` stays fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import FrameType
from typing import Any

import click

from imgbuild.cli.base import cli
from imgbuild.errors import (
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    ImgbuildError,
)
from imgbuild.hostio.acting import acting_for_user
from imgbuild.hostio.host import Caller, caller

# --- entry point -----------------------------------------------------------------------------------

# click >= 8.2 raises this for a bare `imgbuild`; older versions print the help themselves.
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C: candidate tags, smoke containers, secret files


def main(argv: list[str] | None = None) -> None:
    import signal

    from imgbuild.hostio import rootside

    rootside.harden()  # as root: no import from a user-writable place; under sudo, a fixed environment
    with contextlib.suppress(ValueError):  # not the main thread (tests calling main())
        for signum in (signal.SIGTERM, signal.SIGHUP):  # sudo relays a hang-up: clean up as for Ctrl-C
            signal.signal(signum, _terminate)
    args = list(sys.argv[1:] if argv is None else argv)
    who = caller()  # the one reading of who runs this: every command takes it from here
    acting = False
    try:
        acting = acting_for_user(who)
        if acting:  # only then the rules are imported: root's own commands and everyone else's never pay for them
            from imgbuild.config.settings import load_settings
            from imgbuild.servers import enforce

            enforce.gate(args)  # through sudo: the user commands, and nothing else
            _place = enforce.command_place(who, load_settings(who=who).run)  # held until this process ends
        cli.main(args=argv, prog_name="imgbuild", standalone_mode=False, obj=who)
    except BaseException as exc:  # noqa: BLE001 - every way out becomes lines and an exit code, below
        if os.environ.get("IMGBUILD_DEBUG") and not isinstance(exc, (ImgbuildError, click.ClickException)):
            raise
        lines, code = _outcome(exc)
        if acting:
            _audit(args, f"exit {code}" + (f": {lines[0][:300]}" if lines and code else ""), who)
        for line in _shown(exc, lines, code):
            click.echo(line, err=code != EXIT_OK)
        sys.exit(code)
    if acting:
        _audit(args, f"exit {EXIT_OK}", who)
    sys.exit(EXIT_OK)


def _shown(exc: BaseException, lines: list[str], code: int) -> list[str]:
    """The lines of an ending as printed: under GitHub Actions each line of a failure is also an annotation on the
    run's page, a recipe's problem pinned to its file, line and column."""
    if code == EXIT_OK:
        return lines
    from imgbuild.annotation import Annotation, shown
    from imgbuild.errors import RecipeError

    problems = exc.problems if isinstance(exc, RecipeError) else []
    return [
        shown(Annotation.of(problems[n], line) if n < len(problems) else Annotation(line))
        for n, line in enumerate(lines)
    ]


def _audit(args: list[str], decision: str, who: Caller) -> None:
    """Enforced mode: how a user's command ended, in root's audit log (a log that cannot be written is said,
    never lets the command's own outcome be lost)."""
    from imgbuild.config.settings import load_settings
    from imgbuild.servers.enforce import audit

    try:
        audit(args[0] if args else "", args, decision, load_settings(who=who).run.ledger_dir, who.name, who.uid)
    except ImgbuildError as exc:
        click.echo(f"imgbuild: the audit log: {exc}", err=True)


def _outcome(exc: BaseException) -> tuple[list[str], int]:
    """What the user sees for each way a command can end, and its exit code: never a traceback."""
    if isinstance(exc, _NO_ARGS_IS_HELP):  # `imgbuild` alone prints help (click >= 8.2 raises this)
        return [exc.format_message()], EXIT_OK
    if isinstance(exc, click.exceptions.Exit):
        return [], exc.exit_code
    if isinstance(exc, SystemExit):
        return [], exc.code if isinstance(exc.code, int) else EXIT_FAILED
    if isinstance(exc, click.exceptions.Abort):
        return ["imgbuild: aborted"], 130
    if isinstance(exc, click.ClickException):
        return [f"imgbuild: {' '.join(exc.format_message().split())} (see imgbuild --help)"], EXIT_USAGE
    if isinstance(exc, ImgbuildError):
        first, *rest = exc.lines()
        return [f"imgbuild: {first}"] + [ln if ln.startswith("  ") else f"imgbuild: {ln}" for ln in rest], exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return ["imgbuild: interrupted"], 130
    lost = _lost_connection(exc)
    if lost:
        return [f"imgbuild: {lost}"], EXIT_ENVIRONMENT
    if isinstance(exc, OSError):  # a disk, folder or device the environment refused: read-only, full, no access
        where = f" {exc.filename}" if exc.filename else ""
        return [f"imgbuild: cannot use{where}: {exc.strerror or exc}"], EXIT_ENVIRONMENT
    first = (str(exc).strip().splitlines() or [""])[0][:300]  # a bug or an unexpected engine answer
    return [f"imgbuild: unexpected {type(exc).__name__}: {first} (set IMGBUILD_DEBUG=1 for the traceback)"], EXIT_FAILED


def _lost_connection(exc: BaseException) -> str:
    """An HTTP connection that broke under a command (an OSError to Python, with no file to name): which service it
    was, and what to do. The Docker SDK's requests go to `http+docker://` (Docker's socket or Podman's); "" when
    `exc` is no such error."""
    requests = sys.modules.get("requests")
    if requests is None or not isinstance(exc, requests.RequestException):
        return ""
    url = str(getattr(getattr(exc, "request", None), "url", "") or "")
    why = type(exc).__name__
    if not url or url.startswith("http+docker://"):
        return (
            f"the container engine stopped answering mid-command ({why}: it restarted, or stopped): check that it is "
            "up (docker info, or podman info), then run the command again"
        )
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or "the server"
    return f"lost the connection to {host} ({why}): run the command again when it answers"


# Each module declares its help section and registers its commands; imported in the pipeline's order.
from imgbuild.cli import recipes, images, ci, registry, servers, queue, admin, clusters, settings  # noqa: E402,F401,I001

if __name__ == "__main__":  # pragma: no cover
    main()
