"""The docker CLI's own config (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`): read as the CLI reads
it, by the registry client (logins, credential helpers) and the engine (the current context) alike."""

from __future__ import annotations

import os
from pathlib import Path

from imgbuild.boundedjson import loads as bounded_loads

CONFIG_BYTES = 1024 * 1024


def docker_config_path() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"


def read_docker_config(path: Path | None = None) -> dict:
    """The docker CLI's config.json ($DOCKER_CONFIG, else ~/.docker), read as a regular file of bounded size; {}
    when absent or unreadable."""
    from imgbuild.hostio.regular import read_regular

    try:
        found = read_regular(path or docker_config_path(), CONFIG_BYTES)
        config = bounded_loads(found[0]) if found else {}
    except (OSError, ValueError, RecursionError):
        return {}
    return config if isinstance(config, dict) else {}
