"""Settings in one place, with the usual precedence: flag > environment > user config > site config > default.

Every setting `foo_bar` is read from the flag the CLI maps to it, then `IMGBUILD_FOO_BAR`, then the
key `foo_bar` in `~/.config/imgbuild/config.yaml` (or `$IMGBUILD_CONFIG`), then `/etc/imgbuild/config.yaml`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgbuild.config.model import NOT_SETTINGS, Settings, setting_kinds
from imgbuild.config.site import SECTIONS
from imgbuild.errors import UsageError
from imgbuild.fields import did_you_mean
from imgbuild.hostio.host import Caller, caller

SITE_CONFIG = Path("/etc/imgbuild/config.yaml")


def _user_config_path() -> Path:
    from platformdirs import user_config_dir

    return Path(user_config_dir("imgbuild")) / "config.yaml"


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
    found = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?", str(raw).strip(), re.IGNORECASE)
    if isinstance(raw, bool) or not found:
        raise ValueError("expected a size such as 16G or 500M")
    value = int(float(found.group(1)) * _UNITS[found.group(2).upper()])
    if value <= 0:
        raise ValueError("expected a size above 0")
    return value


#: How a config or environment value becomes each kind of setting (config.model.setting_kinds).
_CONVERT = {"list": _as_tuple, "seconds": _as_seconds, "bytes": _as_bytes, "int": _as_int, "text": _as_text}


def _coerce(name: str, raw: Any, origin: str) -> Any:
    """Turn a config/env value into the field's type; a bad value is a usage error naming its origin."""
    convert = _CONVERT[setting_kinds()[name]]
    try:
        return convert(raw)
    except ValueError as exc:
        said = str(exc).replace(repr(str(raw)), "it").replace(str(raw), "it") if str(raw) else str(exc)
        raise UsageError(f"{origin}: {name}: {said} (got {_shown(name, raw)})") from None


def _shown(name: str, raw: Any) -> str:
    """A wrong value as an error may show it: its type only where it could hold a credential (a key, token or
    password field, a URL, a list or mapping of anything), else its first 40 characters."""
    from imgbuild.credentials import credential_kind, secret_name

    if not isinstance(raw, str | int | float | bool) or raw is None:
        return f"a {type(raw).__name__}"
    text = str(raw)
    if secret_name(name) or "://" in text or "@" in text or credential_kind(text):
        return f"a {type(raw).__name__}, not shown"
    return repr(raw)[:40]


@dataclass(frozen=True)
class ConfigFile:
    """One config file as read: its data and where each value stands (for located errors)."""

    origin: str  # "site config /etc/imgbuild/config.yaml"
    path: Path
    located: Any = None  # yamlpos.Located; None when the file is absent

    @property
    def data(self) -> dict[str, Any]:
        return self.located.data if self.located is not None else {}

    def problem(self, at: tuple[Any, ...], message: str, hint: str = "", key: bool = False) -> Any:
        from imgbuild.errors import Problem

        if self.located is None:
            return Problem(str(self.path), 0, 0, ".".join(map(str, at)), message, hint)
        return self.located.problem(at, message, hint, key=key, fallback_file=str(self.path))


def _read_config_file(path: Path, origin: str) -> ConfigFile:
    """A config file, bounded and located (`yamlpos`); an absent one, or one that is not a regular file (a
    FIFO at a user's config path must not block), reads as empty."""
    from imgbuild import yamlpos
    from imgbuild.errors import RecipeError

    try:
        if not path.is_file():
            return ConfigFile(origin, path)
    except OSError:
        return ConfigFile(origin, path)
    located = yamlpos.load_located(path, str(path))
    if located.data is None:
        return ConfigFile(origin, path)
    if not isinstance(located.data, dict):
        raise RecipeError([located.problem((), "a config file is a mapping of settings", fallback_file=str(path))])
    return ConfigFile(origin, path, located)


def config_files(environ: dict[str, str] | None = None) -> tuple[Path, Path]:
    """(the site's config, the user's): `/etc/imgbuild/config.yaml`, `$IMGBUILD_CONFIG` or the user's own.

    `$IMGBUILD_SITE_CONFIG` names another site config for root alone (an admin trying a config before
    installing it, the test suite): root may write /etc/imgbuild anyway, so it grants nothing; for any other
    user, and for root through sudo (a user acting), it is ignored: the site's rules are the site's."""
    environ = dict(os.environ if environ is None else environ)
    user_cfg = Path(environ["IMGBUILD_CONFIG"]) if environ.get("IMGBUILD_CONFIG") else _user_config_path()
    site_cfg = SITE_CONFIG
    if environ.get("IMGBUILD_SITE_CONFIG") and os.getuid() == 0 and not environ.get("SUDO_UID"):
        site_cfg = Path(environ["IMGBUILD_SITE_CONFIG"])
    return site_cfg, user_cfg


def load_settings(
    flags: dict[str, Any] | None = None, environ: dict[str, str] | None = None, who: Caller | None = None
) -> Settings:
    """Resolve every setting by precedence. `flags` holds only the flags the user actually gave; `who`: the caller
    as the command line read it once (read here, from `environ`, when not given)."""
    from imgbuild.errors import RecipeError

    environ = dict(os.environ if environ is None else environ)
    who = caller(environ) if who is None else who
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    site_path, user_path = config_files(environ)
    files = [
        _read_config_file(site_path, f"site config {site_path}"),
        _read_config_file(user_path, f"user config {user_path}"),
    ]
    known = {f.name: f for f in dataclasses.fields(Settings) if f.name not in (*NOT_SETTINGS, *SECTIONS)}
    problems = [
        cfg.problem((k,), "unknown setting", did_you_mean(str(k), sorted([*known, *SECTIONS, "fleet"])), key=True)
        for cfg in files
        for k in cfg.data
        if k not in known and k not in SECTIONS and k != "fleet"
    ]
    sections, section_sources = _read_sections(files, problems)
    layers = [(cfg.origin, _flatten_fleet(cfg, problems)) for cfg in files]
    if problems:
        raise RecipeError(problems)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in known:
        found = _first_source(name, flags, environ, layers)
        if found:
            origin, raw = found
            values[name] = _coerce(name, raw, _where(origin, name, files))
            sources[name] = origin
    values.setdefault("user", who.name)
    settings = Settings(**values, **sections, sources={**sources, **section_sources}, caller=who)
    _check(settings)
    return _scoped(settings)


def _scoped(settings: Settings) -> Settings:
    """Through sudo, a user's caches are theirs alone (`<cache_dir>/users/<uid>`): what their script containers
    answered (a base's pins, read in a container running as them, which they can reach into) is never what
    another user's build believes, nor another's lock or log theirs to hold or read."""
    from imgbuild.hostio.acting import acting_for_user

    who = settings.caller
    if who is None or not acting_for_user(who):
        return settings
    return dataclasses.replace(settings, cache_dir=str(Path(settings.cache_dir) / "users" / str(who.uid)))


def _where(origin: str, name: str, files: list[ConfigFile]) -> str:
    """`FILE:LINE:COL` of a flat setting in the config file it came from, else the origin as it is."""
    for cfg in files:
        if cfg.origin == origin and cfg.located is not None:
            key = ("fleet", name.removeprefix("fleet_")) if name.startswith("fleet_") else (name,)
            pos = cfg.located.where(key)
            if pos is not None:
                return f"{pos.file}:{pos.line}:{pos.col}"
    return origin


def _read_sections(files: list[ConfigFile], problems: list[Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The typed sections (`run:`, `reap:`, `slurm:`): site, then user, each value checked where it stands.
    A site-only value in the user's config counts only where it tightens the site's (imgbuild.config.site)."""
    from imgbuild import fields
    from imgbuild.config import site as siteconfig

    models: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, model in SECTIONS.items():
        merged: dict[str, Any] = {}
        site_values: dict[str, Any] = {}
        defaults = model()
        for cfg in files:
            raw = cfg.data.get(name)
            if raw is None:
                continue
            checked, issues = fields.validate(model, raw)
            problems.extend(cfg.problem((name, *i.at), i.message, i.hint, key=i.key) for i in issues)
            if checked is None:
                continue
            is_site = cfg is files[0]
            for f in siteconfig.fields_of(model):
                if f.name not in raw:
                    continue
                value, how, key = getattr(checked, f.name), f.metadata.get("site_only"), f"{name}.{f.name}"
                if is_site:
                    site_values[f.name] = value
                elif how and siteconfig.looser(how, value, site_values.get(f.name, getattr(defaults, f.name)), f.name):
                    sources[key] = (
                        f"{sources.get(key, 'default')} ({cfg.origin} set aside: only the site may loosen it)"
                    )
                    continue
                merged[f.name] = raw[f.name]
                sources[key] = cfg.origin
        made, _ = fields.validate(model, merged)
        models[name] = made if made is not None else model()
    return models, sources


def _flatten_fleet(cfg: ConfigFile, problems: list[Any]) -> dict[str, Any]:
    """`fleet: {gpus: [...], driver: ...}` in a config file is the settings fleet_gpus and fleet_driver."""
    from imgbuild import fields
    from imgbuild.config import site as siteconfig

    data = cfg.data
    if "fleet" not in data:
        return data
    _, issues = fields.validate(siteconfig.Fleet, data["fleet"])
    problems.extend(cfg.problem(("fleet", *i.at), i.message, i.hint, key=i.key) for i in issues)
    flat = {k: v for k, v in data.items() if k != "fleet" and k not in SECTIONS}
    if not issues:
        flat.update({f"fleet_{k}": v for k, v in data["fleet"].items() if v is not None})
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


#: A registry host (a "." or ":" in it, or localhost, as Docker tells a host from a namespace) and optional path.
_REGISTRY_PREFIX = re.compile(
    r"(?:localhost|[a-z0-9](?:[a-z0-9-]{0,62})(?:\.[a-z0-9](?:[a-z0-9-]{0,62}))+|[a-z0-9][a-z0-9.-]{0,252}:[0-9]{1,5})"
    r"(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*){0,8}"
)


def _check_image_registry(settings: Settings) -> None:
    if settings.image_registry is not None and not _REGISTRY_PREFIX.fullmatch(settings.image_registry):
        raise UsageError(
            f"{settings.sources.get('image_registry', 'default')}: image_registry: {settings.image_registry[:80]!r} "
            "is not a registry host with an optional path (registry.example.org, localhost:5000/lab)"
        )


def _check(settings: Settings) -> None:
    from imgbuild.imageref import COMPONENT_RE

    sources = settings.sources
    if not COMPONENT_RE.fullmatch(settings.user.lower()) or len(settings.user) > 64:
        raise UsageError(
            f"{sources.get('user', 'default')}: user: {settings.user[:64]!r} cannot name an image "
            "namespace (lower-case letters, digits, . _ -)"
        )
    _check_image_registry(settings)
    for name, value, choices in (
        ("backend", settings.backend, Settings.BACKENDS),
        ("engine", settings.engine, Settings.ENGINES),
        ("registry_cache", settings.registry_cache, Settings.REGISTRY_CACHES),
        ("gpu_source", settings.gpu_source, Settings.GPU_SOURCES),
    ):
        if value not in choices:
            raise UsageError(
                f"{sources.get(name, 'default')}: {name}: must be one of {', '.join(choices)} (got {value[:40]!r})"
            )
    if settings.registry_cache == "registry" and not settings.builder:
        raise UsageError(
            f"{sources.get('registry_cache', 'default')}: registry_cache: registry is a buildx builder's cache "
            "export: set builder (a docker-container builder), or say inline"
        )
    if settings.fleet_gpus or settings.fleet_driver:  # fleet rules are imported only for a configured fleet
        from imgbuild.gpu.fleet import check_driver, parse_targets

        fleet: tuple[tuple[str, Any, Callable[[Any], object]], ...] = (
            ("fleet_gpus", settings.fleet_gpus, parse_targets),
            ("fleet_driver", settings.fleet_driver, check_driver),
        )
        for name, value, check in fleet:
            if value:
                try:
                    check(value)
                except UsageError as exc:
                    where = sources.get(name, "default")
                    raise UsageError(f"{where}: {name}: {str(exc).split(': ', 1)[-1]}") from None
    if settings.pip_ca_bundle and not Path(settings.pip_ca_bundle).is_file():
        raise UsageError(f"{sources.get('pip_ca_bundle')}: pip_ca_bundle: no such file {settings.pip_ca_bundle}")
