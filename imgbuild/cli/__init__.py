"""The command line: one module per help section (recipes, images, registry, servers, clusters, settings),
each command parsing its flags, making one call and printing. One error path: every ImgbuildError becomes
one line per problem and an exit code.

Exit codes: 0 success, 1 the job ran and failed, 2 bad input or usage, 3 environment.
Heavy modules are imported inside commands so `imgbuild --help` stays fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from imgbuild import __version__
from imgbuild.errors import (
    EXIT_ENVIRONMENT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    ImgbuildError,
)

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings

SECTIONS = [
    ("Recipes", ["validate", "render", "schema", "bump", "lock"]),
    ("Images", ["build", "smoke", "rebuild"]),
    ("Registry", ["tags", "mirror", "verify"]),
    ("Servers", ["run", "ps", "attach", "logs", "exec", "stop", "gpus", "doctor"]),
    ("Clusters", ["export", "slurm", "k8s"]),
    ("Settings", ["config"]),
]


class SectionedGroup(click.Group):
    """Lists commands under headings, in the order of the pipeline."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        ordered = [name for _, names in SECTIONS for name in names if name in self.commands]
        return ordered + sorted(set(self.commands) - set(ordered))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        placed: set[str] = set()
        for title, names in SECTIONS:
            rows = [(n, self.commands[n].get_short_help_str(70)) for n in names if n in self.commands]
            placed.update(names)
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        rest = [(n, self.commands[n].get_short_help_str(70)) for n in sorted(set(self.commands) - placed)]
        if rest:
            with formatter.section("Other"):
                formatter.write_dl(rest)


def _settings(ctx: click.Context, **flags: Any) -> Settings:
    """Settings by precedence, with the root's --user/--ngc-registry and this command's flags on top."""
    from imgbuild.config.settings import load_settings

    root = ctx.find_root().params
    merged = {"user": root.get("user"), "ngc_registry": root.get("ngc_registry"), **flags}
    return load_settings(merged)


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100, "terminal_width": 100}


@click.group(cls=SectionedGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", "-V", prog_name="imgbuild")
@click.option("--user", metavar="NAME", help="Image namespace (IMGBUILD_USER; default: your login name).")
@click.option("--ngc-registry", metavar="HOST", help="NGC registry or mirror (IMGBUILD_NGC_REGISTRY; default nvcr.io).")
def cli(user: str | None, ngc_registry: str | None) -> None:
    """Build NGC-based images from YAML recipes, prove they work on the GPU, run them on shared servers.

    \b
    Exit codes: 0 success, 1 the job ran and failed (build, smoke test, stale check),
                2 bad input or usage, 3 environment (no Docker engine, registry unreachable).
    Read commands take --json.
    """


# --- entry point -----------------------------------------------------------------------------------

# click >= 8.2 raises this for a bare `imgbuild`; older versions print the help themselves.
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C: candidate tags, smoke containers, secret files


def main(argv: list[str] | None = None) -> None:
    import signal

    with contextlib.suppress(ValueError):  # not the main thread (tests calling main())
        signal.signal(signal.SIGTERM, _terminate)
    args = list(sys.argv[1:] if argv is None else argv)
    acting = False
    try:
        from imgbuild.servers import enforce

        acting = enforce.acting_for_user()
        if acting:
            enforce.gate(args)  # through sudo: the user commands, and nothing else
        cli.main(args=argv, prog_name="imgbuild", standalone_mode=False)
    except BaseException as exc:  # noqa: BLE001 - every way out becomes lines and an exit code, below
        if os.environ.get("IMGBUILD_DEBUG") and not isinstance(exc, (ImgbuildError, click.ClickException)):
            raise
        lines, code = _outcome(exc)
        if acting:
            _audit(args, f"exit {code}" + (f": {lines[0][:300]}" if lines and code else ""))
        for line in lines:
            click.echo(line, err=code != EXIT_OK)
        sys.exit(code)
    if acting:
        _audit(args, f"exit {EXIT_OK}")
    sys.exit(EXIT_OK)


def _audit(args: list[str], decision: str) -> None:
    """Enforced mode: how a user's command ended, in root's audit log (a log that cannot be written is said,
    never lets the command's own outcome be lost)."""
    from imgbuild.servers.enforce import audit

    try:
        audit(args[0] if args else "", args, decision)
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
    if isinstance(exc, OSError):  # a disk, folder or device the environment refused: read-only, full, no access
        where = f" {exc.filename}" if exc.filename else ""
        return [f"imgbuild: cannot use{where}: {exc.strerror or exc}"], EXIT_ENVIRONMENT
    first = (str(exc).strip().splitlines() or [""])[0][:300]  # a bug or an unexpected engine answer
    return [f"imgbuild: unexpected {type(exc).__name__}: {first} (set IMGBUILD_DEBUG=1 for the traceback)"], EXIT_FAILED


from imgbuild.cli import clusters, images, recipes, registry, servers, settings  # noqa: E402,F401 - registers

if __name__ == "__main__":  # pragma: no cover
    main()
