"""One exception hierarchy; the CLI turns each into one line per problem and an exit code.

Exit codes: 0 success, 1 the job ran and failed, 2 bad input or usage, 3 environment
(no Docker engine, registry unreachable).
"""

from __future__ import annotations

from dataclasses import dataclass

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
