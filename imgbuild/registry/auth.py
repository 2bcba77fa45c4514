"""Registry credentials and challenges: the `WWW-Authenticate` header read loosely, and credentials from the
docker config (plain `auths` or a credential helper, run without a shell and bounded)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.hostio.dockerconfig import read_docker_config
from imgbuild.registry_identity import is_docker_hub, is_loopback, same_registry

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings

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


#: The docker CLI keeps its Docker Hub login under this key and asks a credential helper for it, whatever the
#: reference says (docker.io/..., a short name, registry-1.docker.io).
DOCKER_HUB_KEY = "https://index.docker.io/v1/"


def docker_config_credentials(host: str, config_path: Path | None = None) -> Credentials | None:
    """Credentials for `host` from the docker config ($DOCKER_CONFIG/config.json, else ~/.docker/config.json, as
    the docker CLI reads it): plain `auths`, or a credential helper; Docker Hub under the CLI's own key."""
    config = read_docker_config(config_path)
    hub = is_docker_hub(host)
    helpers: dict = config["credHelpers"] if isinstance(config.get("credHelpers"), dict) else {}
    # the CLI's keys are hosts or URLs, compared by identity; the helper is asked under the key it was given
    key, helper = next(((k, h) for k, h in helpers.items() if same_registry(_config_host(k), host)), (host, None))
    helper = helper or config.get("credsStore")
    auths: dict = config["auths"] if isinstance(config.get("auths"), dict) else {}
    for named, entry in auths.items():
        if not isinstance(entry, dict) or not same_registry(_config_host(named), host):
            continue
        try:
            if entry.get("auth"):
                user, _, password = base64.b64decode(str(entry["auth"]), validate=True).decode().partition(":")
                return Credentials(user, password)
        except (ValueError, UnicodeDecodeError):
            return None
        if entry.get("username"):
            return Credentials(str(entry["username"]), str(entry.get("password", "")))
    if isinstance(helper, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", helper):
        try:
            out = subprocess.run(
                [f"docker-credential-{helper}", "get"],
                input=DOCKER_HUB_KEY if hub else str(key),
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            data = json.loads(out)
            return Credentials(data["Username"], data["Secret"])
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
            return None
    return None


def _config_host(key: object) -> str:
    """The registry a docker config key names (`https://index.docker.io/v1/`, `registry.lab:5000`)."""
    return str(key).removeprefix("https://").removeprefix("http://").rstrip("/").split("/")[0]


def engine_auth(ref: str) -> dict[str, str] | None:
    """The credentials an engine uses for `ref`'s registry (a push, a registry cache): the docker config's,
    as docker-py takes them; None where it has none."""
    from imgbuild.registry.manifest import split_reference

    host, _, _ = split_reference(ref)
    creds = docker_config_credentials(host)
    return {"username": creds.username, "password": creds.password} if creds else None


def credentials_for(host: str, settings: Settings) -> Credentials | None:
    """What a registry is told who we are: the NGC API key on the NGC registry (by identity, any spelling of it),
    else the docker config's login for it."""
    key = settings.ngc_api_key if same_registry(host, settings.ngc_registry) else None
    return Credentials("$oauthtoken", key) if key else docker_config_credentials(host)


def plain_http(host: str, settings: Settings) -> bool:
    """A registry spoken to without TLS: one the settings name (by identity), or this machine's loopback."""
    return any(same_registry(host, plain) for plain in settings.insecure_registries) or is_loopback(host)
