"""A build's secrets: a pip.conf with an index's credentials, a user's CA bundle and the pip step's bounds, as files
that no other user can read and no kill can strand, mounted by BuildKit and never written into a layer."""

from __future__ import annotations

import os
import shutil
from contextlib import ExitStack
from pathlib import Path

from imgbuild.config.settings import Settings
from imgbuild.hostio.acting import Acting, read_as
from imgbuild.pipeline.scratch import pip_bounds, writable_dir


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


def build_secrets(
    settings: Settings, ca_bundle: Path | None, stack: ExitStack, acting: Acting | None = None
) -> dict[str, Path]:
    """Secret files for BuildKit: a pip.conf (index URLs, maybe with credentials) and the CA bundle (the recipe's
    `ca_bundle`, else the site's). Acting for a user through sudo, the recipe's CA bundle is read as they may read
    it, into a file of this process."""
    secrets: dict[str, Path] = {}
    ca = ca_bundle or (Path(settings.pip_ca_bundle) if settings.pip_ca_bundle else None)
    if ca and acting and ca_bundle:
        data = read_as(acting.who, ca_bundle, 16 * 1024 * 1024, "pip.ca_bundle")
        secrets["imgbuild-ca.crt"] = secret_file(stack, "ca.crt", data, settings)
    elif ca:
        secrets["imgbuild-ca.crt"] = ca
    lines = ["[global]"]
    if settings.pip_index_url:
        lines.append(f"index-url = {settings.pip_index_url}")
    if settings.pip_extra_index_urls:
        lines.append("extra-index-url = " + " ".join(settings.pip_extra_index_urls))
    if settings.pip_trusted_hosts:
        lines.append("trusted-host = " + " ".join(settings.pip_trusted_hosts))
    if len(lines) > 1:
        secrets["imgbuild-pip.conf"] = secret_file(stack, "pip.conf", "\n".join(lines) + "\n", settings)
    return secrets


def backend_secrets(
    secrets: dict[str, Path], settings: Settings, stack: ExitStack, source: Path, backend: str, pip_step: bool
) -> None:
    """What a backend adds to the build's secrets. BuildKit: the pip step's bounds, a secret so that no layer's
    cache key holds them (the sdk backend passes them as build arguments). The sdk backend has no secret mounts:
    the CA bundle, which is public, travels in the pip folder of the context."""
    if pip_step and backend == "buildkit":
        text = "".join(f"{key}={value}\n" for key, value in pip_bounds(settings).items())
        secrets["imgbuild-pip-bounds"] = secret_file(stack, "pip-bounds", text, settings)
    if backend == "sdk" and "imgbuild-ca.crt" in secrets:
        ca_copy = source / "imgbuild" / "pip" / "ca.crt"
        ca_copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(secrets.pop("imgbuild-ca.crt"), ca_copy)
        stack.callback(lambda: ca_copy.unlink(missing_ok=True))


def needs_buildkit(settings: Settings) -> bool:
    """Index settings may carry credentials: only BuildKit's secret mounts keep them out of every layer."""
    return bool(settings.pip_index_url or settings.pip_extra_index_urls or settings.pip_trusted_hosts)
