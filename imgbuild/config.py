"""Settings in one place, with the usual precedence: flag > environment > user config > site config > default.

Every setting `foo_bar` is read from the flag the CLI maps to it, then `IMGBUILD_FOO_BAR`, then the
key `foo_bar` in `~/.config/imgbuild/config.yaml` (or `$IMGBUILD_CONFIG`), then `/etc/imgbuild/config.yaml`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from imgbuild import limits
from imgbuild.errors import UsageError

SITE_CONFIG = Path("/etc/imgbuild/config.yaml")


def _user_config_path() -> Path:
    from platformdirs import user_config_dir

    return Path(user_config_dir("imgbuild")) / "config.yaml"


def _default_cache_dir() -> str:
    from platformdirs import user_cache_dir

    return user_cache_dir("imgbuild")


def _login_name() -> str:
    from imgbuild.host import caller

    return caller().name


#: A size in bytes; config and environment values may say `16G` (see _as_bytes).
Bytes = int


@dataclass(frozen=True)
class Settings:
    """Effective settings. Secrets are excluded from repr and from `imgbuild config` output."""

    user: str = field(default_factory=_login_name)
    ngc_registry: str = "nvcr.io"
    ngc_api_key: str | None = field(default=None, repr=False)
    insecure_registries: tuple[str, ...] = ()
    pip_index_url: str | None = field(default=None, repr=False)
    pip_extra_index_urls: tuple[str, ...] = field(default=(), repr=False)
    pip_ca_bundle: str | None = None
    pip_trusted_hosts: tuple[str, ...] = ()
    uid: int | None = None
    gid: int | None = None
    backend: str = "auto"
    docker_cli: str | None = None
    builder: str | None = None
    images_dir: str = "images"
    cache_dir: str = field(default_factory=_default_cache_dir)
    tag_cache_ttl: int = 6 * 3600
    base_cache_ttl: int = 300  # seconds a base's digest and config are reused (0: always ask; rebuild always does)
    registry_timeout: float = limits.HTTP_REQUEST_SECONDS  # one registry request, however slowly it trickles
    registry_deadline: float = limits.HTTP_COMMAND_SECONDS  # everything one command asks of one registry
    registry_backoff: float = 0.5  # first retry delay (doubles), seconds
    build_timeout: float = limits.BUILD_SECONDS  # one image build, seconds
    pip_resolve_timeout: float = limits.PIP_RESOLVE_SECONDS  # pip's resolution in the pip step, seconds
    pip_download_limit: Bytes = limits.PIP_DOWNLOAD_BYTES  # what the pip step may download ("16G")
    gpu_snapshot: str | None = None  # read GPUs from a saved `imgbuild gpus --json` (planning, tests)
    fleet_gpus: tuple[str, ...] = ()  # the GPUs images must run on (config `fleet: {gpus: [...]}`)
    fleet_driver: str | None = None  # the oldest driver among them (config `fleet: {driver: ...}`)
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    SECRET_FIELDS = ("ngc_api_key", "pip_index_url", "pip_extra_index_urls")
    BACKENDS = ("auto", "buildkit", "sdk")

    def secrets(self) -> list[str]:
        """Values that must never appear in a log, a layer or the image history."""
        found: list[str] = []
        if self.ngc_api_key:
            found.append(self.ngc_api_key)
        for url in (self.pip_index_url, *self.pip_extra_index_urls):
            if url:
                parts = urlsplit(url)
                # The password is the secret; a URL with only a user part carries a token there.
                secret = parts.password or parts.username
                if secret and len(secret) >= 4:
                    found.append(secret)
        return found

    def public_view(self) -> dict[str, Any]:
        """Settings as shown to a user: secrets masked, with where each value came from."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "sources":
                continue
            value = getattr(self, f.name)
            if f.name in self.SECRET_FIELDS and value:
                value = mask_url_credentials(value) if f.name != "ngc_api_key" else "****"
            if isinstance(value, tuple):
                value = list(value)
            out[f.name] = {"value": value, "source": self.sources.get(f.name, "default")}
        return out


def mask_url_credentials(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [mask_url_credentials(v) for v in value]
    parts = urlsplit(value)
    if parts.password or parts.username:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return parts._replace(netloc=f"****@{host}").geturl()
    return value


_ENV_ALIASES = {"ngc_api_key": ("NGC_API_KEY",)}


def _as_tuple(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        return tuple(s for s in raw.replace(",", " ").split() if s)
    if isinstance(raw, list):
        return tuple(str(s) for s in raw)
    raise ValueError("expected a list")


def _as_seconds(raw: Any) -> float:
    if isinstance(raw, bool):
        raise ValueError("expected a number")
    value = float(raw)
    if not 0 < value <= 86400:
        raise ValueError("expected a number of seconds above 0")
    return value


def _as_int(raw: Any) -> int | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):
        raise ValueError("expected an integer")
    return int(raw)


def _as_text(raw: Any) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, (dict, list)):
        raise ValueError("expected a string")
    return str(raw)


_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def _as_bytes(raw: Any) -> int:
    """`17179869184`, `16G`, `500MB`, `2GiB`: a positive size in bytes."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", str(raw).strip(), re.IGNORECASE)
    if isinstance(raw, bool) or not found:
        raise ValueError("expected a size such as 16G or 500M")
    value = int(float(found.group(1)) * _UNITS[found.group(2).upper()])
    if value <= 0:
        raise ValueError("expected a size above 0")
    return value


#: How a config or environment value becomes each field type (by the type's spelling in Settings).
_COERCE = (("tuple", _as_tuple), ("float", _as_seconds), ("Bytes", _as_bytes), ("int", _as_int))


def _coerce(name: str, raw: Any, kind: Any, origin: str) -> Any:
    """Turn a config/env value into the field's type; a bad value is a usage error naming its origin."""
    convert = next((fn for word, fn in _COERCE if word in str(kind)), _as_text)
    try:
        return convert(raw)
    except ValueError as exc:
        raise UsageError(f"{origin}: {name}: {exc} (got {raw!r})") from None


def _read_config_file(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise UsageError(f"{where}: cannot read config: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: config must be a mapping of settings")
    return data


def load_settings(flags: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Resolve every setting by precedence. `flags` holds only the flags the user actually gave."""
    environ = dict(os.environ if environ is None else environ)
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    user_cfg = Path(environ["IMGBUILD_CONFIG"]) if environ.get("IMGBUILD_CONFIG") else _user_config_path()
    layers = [
        ("site config " + str(SITE_CONFIG), _read_config_file(SITE_CONFIG)),
        ("user config " + str(user_cfg), _read_config_file(user_cfg)),
    ]
    known = {f.name: f for f in dataclasses.fields(Settings) if f.name != "sources"}
    layers = [(origin, _flatten_fleet(origin, data)) for origin, data in layers]
    for origin, data in layers:
        unknown = sorted(set(data) - set(known) - {"run", "slurm"})
        if unknown:
            raise UsageError(
                f"{origin.split(' ', 2)[-1]}: unknown setting {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, f in known.items():
        found = _first_source(name, flags, environ, layers)
        if found:
            origin, raw = found
            values[name] = _coerce(name, raw, f.type, origin)
            sources[name] = origin
    settings = Settings(**values, sources=sources)
    _check(settings)
    return settings


def _flatten_fleet(origin: str, data: dict[str, Any]) -> dict[str, Any]:
    """`fleet: {gpus: [...], driver: ...}` in a config file is the settings fleet_gpus and fleet_driver."""
    if "fleet" not in data:
        return data
    fleet = data["fleet"]
    if not isinstance(fleet, dict) or set(fleet) - {"gpus", "driver"}:
        raise UsageError(f"{origin.split(' ', 2)[-1]}: fleet: must be a mapping with gpus and driver")
    flat = {k: v for k, v in data.items() if k != "fleet"}
    flat.update({f"fleet_{k}": v for k, v in fleet.items()})
    return flat


def _first_source(
    name: str, flags: dict[str, Any], environ: dict[str, str], layers: list[tuple[str, dict[str, Any]]]
) -> tuple[str, Any] | None:
    """(where from, raw value) of the setting's highest-precedence source: flag, env, user, site."""
    if name in flags:
        return "flag", flags[name]
    for env_name in (f"IMGBUILD_{name.upper()}", *_ENV_ALIASES.get(name, ())):
        if environ.get(env_name, "") != "":
            return f"env {env_name}", environ[env_name]
    return next(((origin, data[name]) for origin, data in reversed(layers) if name in data), None)


def _check(settings: Settings) -> None:
    from imgbuild.imageref import COMPONENT_RE

    sources = settings.sources
    if not COMPONENT_RE.fullmatch(settings.user.lower()) or len(settings.user) > 64:
        raise UsageError(
            f"{sources.get('user', 'default')}: user: {settings.user[:64]!r} cannot name an image "
            "namespace (lower-case letters, digits, . _ -)"
        )
    if settings.backend not in Settings.BACKENDS:
        raise UsageError(
            f"{sources.get('backend', 'default')}: backend: must be one of "
            f"{', '.join(Settings.BACKENDS)} (got {settings.backend!r})"
        )
    if settings.fleet_gpus or settings.fleet_driver:  # fleet rules are imported only for a configured fleet
        from imgbuild.fleet import check_driver, parse_targets

        for name, check in (("fleet_gpus", parse_targets), ("fleet_driver", check_driver)):
            value = getattr(settings, name)
            if value:
                try:
                    check(value)
                except UsageError as exc:
                    where = sources.get(name, "default")
                    raise UsageError(f"{where}: {name}: {str(exc).split(': ', 1)[-1]}") from None
    if settings.pip_ca_bundle and not Path(settings.pip_ca_bundle).is_file():
        raise UsageError(f"{sources.get('pip_ca_bundle')}: pip_ca_bundle: no such file {settings.pip_ca_bundle}")


def site_section(name: str, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """A free-form section (`run:`, `slurm:`) merged site < user."""
    environ = dict(os.environ if environ is None else environ)
    user_cfg = Path(environ["IMGBUILD_CONFIG"]) if environ.get("IMGBUILD_CONFIG") else _user_config_path()
    merged: dict[str, Any] = {}
    for path in (SITE_CONFIG, user_cfg):
        section = _read_config_file(path).get(name) or {}
        if not isinstance(section, dict):
            raise UsageError(f"{path}: {name}: must be a mapping")
        merged.update(section)
    return merged
