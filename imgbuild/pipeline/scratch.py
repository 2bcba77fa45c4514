"""What a build makes for itself, outside the recipe: its folders in the cache, secret files (a pip.conf with an
index's credentials, a user's CA bundle) that no other user can read and no kill can strand, the pip step's bounds
and the time a reproducible build stamps."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

from imgbuild.config.settings import Settings
from imgbuild.errors import EnvironmentProblem


def writable_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot create {path}: {exc.strerror}") from None


def secret_file(stack: ExitStack, name: str, text: str | bytes, settings: Settings) -> Path:
    """A file only this process (and the docker CLI it starts) can read, that no kill can strand: an
    anonymous memory file (memfd) seen through /proc; elsewhere a 0600 file in a private cache folder,
    removed at exit and swept by the next run if a kill came first."""
    data = text.encode() if isinstance(text, str) else text
    if hasattr(os, "memfd_create") and Path(f"/proc/{os.getpid()}/fd").is_dir():
        fd = os.memfd_create(f"imgbuild-{name}", os.MFD_CLOEXEC)
        stack.callback(os.close, fd)
        os.write(fd, data)
        return Path(f"/proc/{os.getpid()}/fd/{fd}")
    folder = Path(settings.cache_dir) / "secrets"
    writable_dir(folder)
    os.chmod(folder, 0o700)
    sweep_secret_files(folder)
    path = folder / f"{os.getpid()}-{name}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    stack.callback(lambda: path.unlink(missing_ok=True))
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def sweep_secret_files(folder: Path) -> None:
    """Remove secret files whose process is gone (a build killed with SIGKILL)."""
    for leftover in folder.glob("*-*"):
        pid = leftover.name.split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            leftover.unlink(missing_ok=True)


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
