"""One exception hierarchy; the CLI turns each into one line per problem and an exit code.

Exit codes: 0 success, 1 the job ran and failed, 2 bad input or usage, 3 environment
(no Docker engine, registry unreachable).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

import click

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3


class ImgbuildError(Exception):
    """An expected failure: printed as one line (per problem), never as a traceback."""

    exit_code = EXIT_FAILED

    def lines(self) -> list[str]:
        return [str(self)]


class JobFailed(ImgbuildError):
    """The job ran and failed: a build, a smoke test, a stale check."""

    exit_code = EXIT_FAILED


class BuildFailed(JobFailed):
    pass


class EngineFault(BuildFailed):
    """The build failed in the engine itself (BuildKit lost a step's container), not in a step's command."""


class SmokeFailed(JobFailed):
    pass


class UsageError(ImgbuildError):
    """Bad input: an unknown flag, a bad argument, a bad config value."""

    exit_code = EXIT_USAGE


class EnvironmentProblem(ImgbuildError):
    """Something outside imgbuild is missing or unreachable."""

    exit_code = EXIT_ENVIRONMENT


class EngineUnavailable(EnvironmentProblem):
    pass


class RegistryUnavailable(EnvironmentProblem):
    pass


class RegistryCorrupt(EnvironmentProblem):
    """The registry served other bytes than the digest asked for: a broken or lying registry (exit 3), whose answer
    nothing may use."""


class RegistryError(ImgbuildError):
    """The registry answered, but not with what we asked for (401, unknown repository)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input file, located as precisely as we can."""

    file: str
    line: int
    col: int
    field: str
    message: str
    hint: str = ""
    #: a package the hint names that is not known to exist (faiss-gpu-cu13), and the hint to give instead where
    #: the index has no such project: the edge that reads the index asks it before the line is printed
    needs: str = ""
    otherwise: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}" if self.line else self.file
        field = f" {self.field}:" if self.field else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}:{field} {self.message}{hint}"


class RecipeError(UsageError):
    """A recipe is invalid; carries every problem found, one line each."""

    def __init__(self, problems: list[Problem]):
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.col, p.field))
        super().__init__("\n".join(str(p) for p in self.problems))

    def lines(self) -> list[str]:
        return [str(p) for p in self.problems]


# --- how a command ends ------------------------------------------------------------------------------------------


def ending(exc: BaseException) -> tuple[list[str], int]:
    """What the user sees for each way a command can end, and its exit code: never a traceback. One rule for every
    imgbuild process (the command line's, and a queued job's start)."""
    if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):  # click >= 8.2: `imgbuild` alone
        return [exc.format_message()], EXIT_OK  # type: ignore[attr-defined]
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
    host = urlsplit(url).hostname or "the server"
    return f"lost the connection to {host} ({why}): run the command again when it answers"
