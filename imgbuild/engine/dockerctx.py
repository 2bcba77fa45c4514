"""Which Docker engine to talk to, as the docker CLI decides it: `DOCKER_HOST`; else the context `DOCKER_CONTEXT`
names; else the config's `currentContext`; else the local socket. A context that cannot be read is refused in one
line, never replaced by the local engine (a build would land, and be promoted, on another engine than the user's
CLI shows)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from imgbuild.boundedjson import loads as bounded_loads
from imgbuild.errors import EngineUnavailable

META_BYTES = 64 * 1024
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")


@dataclass(frozen=True)
class Endpoint:
    host: str  # "" for the local default socket
    source: str  # what chose it, for messages: "DOCKER_HOST", "docker context gpu-box (DOCKER_CONTEXT)", ...
    tls_dir: str = ""  # the context's TLS material (ca.pem, cert.pem, key.pem), if it has any
    verify: bool = True


def endpoint(environ: dict[str, str], config_dir: Path) -> Endpoint:
    """The engine the docker CLI would use, given its environment and its config folder ($DOCKER_CONFIG)."""
    if environ.get("DOCKER_HOST"):
        return Endpoint(environ["DOCKER_HOST"], "DOCKER_HOST")
    name, origin = environ.get("DOCKER_CONTEXT", ""), "DOCKER_CONTEXT"
    if not name:
        from imgbuild.hostio.dockerconfig import read_docker_config

        current = read_docker_config(config_dir / "config.json").get("currentContext")
        name, origin = (current if isinstance(current, str) else ""), f"currentContext in {config_dir}/config.json"
    if name in ("", "default"):
        return Endpoint("", "the local engine")
    if not _NAME.fullmatch(name):
        raise EngineUnavailable(f"docker context {name[:60]!r} ({origin}) is not a context name")
    source = f"docker context {name} ({origin})"
    digest = hashlib.sha256(name.encode()).hexdigest()
    meta_path = config_dir / "contexts" / "meta" / digest / "meta.json"
    from imgbuild.hostio.regular import read_regular

    try:
        found = read_regular(meta_path, META_BYTES)
        meta = bounded_loads(found[0]) if found else None
    except (OSError, ValueError, RecursionError):
        meta = None
    docker = ((meta or {}).get("Endpoints") or {}).get("docker") if isinstance(meta, dict) else None
    host = docker.get("Host") if isinstance(docker, dict) else None
    if not isinstance(host, str) or not host:
        raise EngineUnavailable(
            f"{source} does not exist or names no Docker endpoint ({meta_path}): `docker context ls`, or unset it"
        )
    tls = config_dir / "contexts" / "tls" / digest / "docker"
    skip = isinstance(docker, dict) and bool(docker.get("SkipTLSVerify"))
    return Endpoint(host, source, str(tls) if tls.is_dir() else "", not skip)


def apply(point: Endpoint, environ: MutableMapping[str, str]) -> None:
    """Point docker-py and every docker CLI imgbuild starts at `point` (a context becomes DOCKER_HOST and, where it
    has TLS material, DOCKER_CERT_PATH), so the SDK and the CLI never talk to two engines."""
    if point.source == "DOCKER_HOST" or not point.host:
        return
    environ["DOCKER_HOST"] = point.host
    environ.pop("DOCKER_CONTEXT", None)
    if point.tls_dir:
        environ["DOCKER_CERT_PATH"] = point.tls_dir
        if point.verify:
            environ["DOCKER_TLS_VERIFY"] = "1"
