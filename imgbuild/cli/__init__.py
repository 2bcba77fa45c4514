"""The command line: one module per help section (recipes, images, registry, servers, clusters, settings),
each command parsing its flags, making one call and printing. One error path: every ImgbuildError becomes
one line per problem and an exit code.

Exit codes: 0 success, 1 the job ran and failed, 2 bad input or usage, 3 environment.
Heavy modules are imported inside commands so `imgbuild --help` stays fast.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from imgbuild.cli.base import cli
from imgbuild.errors import EXIT_OK

if TYPE_CHECKING:
    from imgbuild.hostio.host import Caller

# --- entry point -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """The command line: every command inside the frame every imgbuild process has (`servers.guard`)."""
    from imgbuild.servers.guard import guarded

    args = list(sys.argv[1:] if argv is None else argv)

    def command(who: Caller) -> None:
        cli.main(args=argv, prog_name="imgbuild", standalone_mode=False, obj=who)

    sys.exit(guarded(args, command, _show))


def _show(exc: BaseException | None, lines: list[str], code: int) -> None:
    """The lines of an ending as printed: under GitHub Actions each line of a failure is also an annotation on the
    run's page, a recipe's problem pinned to its file, line and column."""
    if code == EXIT_OK:
        for line in lines:
            click.echo(line)
        return
    from imgbuild.annotation import Annotation, shown
    from imgbuild.errors import RecipeError

    problems = exc.problems if isinstance(exc, RecipeError) else []
    for n, line in enumerate(lines):
        click.echo(shown(Annotation.of(problems[n], line) if n < len(problems) else Annotation(line)), err=True)


# Each module declares its help section and registers its commands; imported in the pipeline's order.
from imgbuild.cli import recipes, images, ci, registry, servers, queue, admin, clusters, settings  # noqa: E402,F401,I001

if __name__ == "__main__":  # pragma: no cover
    main()
