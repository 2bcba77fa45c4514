"""Registry credentials and challenges: the `WWW-Authenticate` header read loosely, and credentials from the
docker config (plain `auths` or a credential helper, run without a shell and bounded)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

_CHALLENGE_RE = re.compile(r'(\w+)\s*=\s*(?:"([^"]*)"|([^\s,]+))')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="...",scope="..."` -> ("bearer", {...}); loose about spacing, quotes and order."""
    scheme, _, rest = header.strip().partition(" ")
    params = {
        m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in _CHALLENGE_RE.finditer(rest)
    }
    return scheme.lower(), params


@dataclass
class Credentials:
    username: str
    password: str = field(repr=False)


def docker_config_credentials(host: str, config_path: Path | None = None) -> Credentials | None:
    """Credentials for `host` from the docker config ($DOCKER_CONFIG/config.json, else ~/.docker/config.json, as
    the docker CLI reads it): plain `auths`, or a credential helper."""
    path = config_path or Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    helper = (config.get("credHelpers") or {}).get(host) or config.get("credsStore")
    for key, entry in (config.get("auths") or {}).items():
        if key.removeprefix("https://").removeprefix("http://").rstrip("/").split("/")[0] == host:
            if entry.get("auth"):
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
                return Credentials(user, password)
            if entry.get("username"):
                return Credentials(entry["username"], entry.get("password", ""))
    if helper:
        try:
            out = subprocess.run(
                [f"docker-credential-{helper}", "get"],
                input=host,
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            data = json.loads(out)
            return Credentials(data["Username"], data["Secret"])
        except (OSError, subprocess.SubprocessError, ValueError, KeyError):
            return None
    return None


def engine_auth(ref: str) -> dict[str, str] | None:
    """The credentials an engine uses for `ref`'s registry (a push, a registry cache): the docker config's,
    as docker-py takes them; None where it has none."""
    from imgbuild.registry.manifest import split_reference

    host, _, _ = split_reference(ref)
    creds = docker_config_credentials(host)
    return {"username": creds.username, "password": creds.password} if creds else None
