"""`${VAR}`, `${VAR:-default}` and `$$` in recipe text, refusing variables that hold a secret."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from imgbuild.credentials import credential_kind, secret_name
from imgbuild.errors import Problem
from imgbuild.fields import show as _show
from imgbuild.yamlpos import Located, PathKey

# --- ${VAR} interpolation -------------------------------------------------------------------------

_VAR_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{([^}]*)\}?")


#: Variables that hold imgbuild's own secrets or a CI system's credentials: never interpolated.
SECRET_VARIABLES = frozenset(
    {
        "NGC_API_KEY",
        "NGC_CLI_API_KEY",
        "IMGBUILD_NGC_API_KEY",
        "IMGBUILD_PIP_INDEX_URL",
        "IMGBUILD_PIP_EXTRA_INDEX_URLS",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "UV_INDEX_URL",
        "UV_EXTRA_INDEX_URL",
        "DOCKER_AUTH_CONFIG",
        "CI_JOB_TOKEN",
        "CI_REGISTRY_PASSWORD",
        "CI_DEPLOY_PASSWORD",
        "GITHUB_TOKEN",
        "ACTIONS_RUNTIME_TOKEN",
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
        "ACTIONS_ID_TOKEN_REQUEST_URL",
        "CI_JOB_JWT",
        "CI_JOB_JWT_V1",
        "CI_JOB_JWT_V2",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    }
)


def secret_variable(name: str, value: str, secrets: tuple[str, ...] = ()) -> bool:
    """Would interpolating `name` copy a secret into the image or the committed context?"""
    if name in SECRET_VARIABLES or secret_name(name):
        return True
    if any(secret and secret in value for secret in secrets):
        return True
    if credential_kind(value):  # a token by its shape, whatever its name
        return True
    parts = urlsplit(value) if "://" in value else None
    return bool(parts and parts.password)


def interpolate(
    located: Located, environ: dict[str, str], problems: list[Problem], secrets: tuple[str, ...] = ()
) -> None:
    """Replace ${VAR} and ${VAR:-default} in every string value; `$$` is a literal `$`.

    A variable that holds a secret (a configured one, a known credential variable, a URL with a
    password) is refused: whatever it is interpolated into ends in the image or the rendered context."""

    def walk(value: Any, at: PathKey) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, (*at, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, (*at, i)) for i, v in enumerate(value)]
        if isinstance(value, str) and "$" in value:
            return _VAR_RE.sub(
                lambda m: _substitute(m, environ, secrets, lambda *p: problems.append(located.problem(at, *p))), value
            )
        return value

    located.data = walk(located.data, ())


def _substitute(
    m: re.Match[str], environ: dict[str, str], secrets: tuple[str, ...], report: Callable[[str, str], None]
) -> str:
    """One `$$`, `${NAME}` or `${NAME:-default}`; `report(message, hint)` records a problem."""
    if m.group(0) == "$$":
        return "$"
    if m.group(3) is not None or m.group(1) is None:
        report(f"bad variable reference {_show(m.group(0))}", "write ${NAME} or ${NAME:-default}; $$ for a literal $")
        return m.group(0)
    name, default = m.group(1), m.group(2)
    if name in environ and secret_variable(name, environ[name], secrets):
        report(
            f"${{{name}}} holds a secret; it would be written into the image and its context",
            "pass secrets at run time, never in a recipe",
        )
        return ""
    if name in environ and (environ[name] != "" or default is None):
        return environ[name]
    if default is not None:
        return str(default)
    report(f"environment variable {name} is not set", f"set it, or write ${{{name}:-default}}")
    return ""
