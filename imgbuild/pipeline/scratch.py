"""What a build makes for itself, outside the recipe: its folders in the cache, the pip step's bounds and the time a
reproducible build stamps (its secret files: pipeline.secrets)."""

from __future__ import annotations

import os
from pathlib import Path

from imgbuild.config.settings import Settings
from imgbuild.errors import EnvironmentProblem


def writable_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create {path}: {exc.strerror}") from None


def cache_subdir(settings: Settings, name: str) -> str:
    path = Path(settings.cache_dir) / name
    writable_dir(path)
    return str(path)


def source_date_epoch() -> int:
    """The time a reproducible build stamps everywhere: SOURCE_DATE_EPOCH (ASCII digits), else 0."""
    text = os.environ.get("SOURCE_DATE_EPOCH", "")
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 12 else 0


def pip_bounds(settings: Settings) -> dict[str, str]:
    """The pip step's bounds (install.sh's guard reads them): resolution seconds, download bytes."""
    return {
        "IMGBUILD_PIP_RESOLVE_SECONDS": str(int(settings.pip_resolve_timeout)),
        "IMGBUILD_PIP_DOWNLOAD_LIMIT": str(settings.pip_download_limit),
    }
