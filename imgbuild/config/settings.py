"""Settings in one place, with the usual precedence: flag > environment > user config > site config > default.

Every setting `foo_bar` is read from the flag the CLI maps to it, then `IMGBUILD_FOO_BAR`, then the
key `foo_bar` in `~/.config/imgbuild/config.yaml` (or `$IMGBUILD_CONFIG`), then `/etc/imgbuild/config.yaml`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from imgbuild import limits
from imgbuild.config.site import SECTIONS, K8sSite, ReapPolicy, RunRules, SlurmSite
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


def setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    shown: str | None = None,
    factory: Callable[[], Any] | None = None,
    secret: bool = False,
) -> Any:
    """Declare a flat setting: its default (or a factory), what it means, and the default as the docs show it
    where the value itself would not do (`your login name`); a secret is left out of repr (and masked in
    `imgbuild config`). The README's settings table and the schema's descriptions are made from these."""
    metadata = {"doc": doc, "shown": shown}
    if factory is not None:
        return field(default_factory=factory, repr=not secret, metadata=metadata)
    return field(default=default, repr=not secret, metadata=metadata)


@dataclass(frozen=True)
class Settings:
    """Effective settings. Secrets are excluded from repr and from `imgbuild config` output."""

    user: str = setting(
        factory=_login_name, shown="your login name", doc="image namespace: images are `<user>/<name>:<tag>`"
    )
    image_registry: str | None = setting(
        None,
        doc="where images live: a recipe without `image:` builds `<image_registry>/<user>/<name>:<tag>` (the registry "
        "CI pushes to and verifies at); none keeps them on this host",
    )
    ngc_registry: str = setting("nvcr.io", doc="NGC registry, or a mirror / pull-through cache")
    ngc_api_key: str | None = setting(
        None,
        secret=True,
        doc="NGC API key (also `NGC_API_KEY`), sent as `$oauthtoken`; never written to a layer, the history or a log",
    )
    insecure_registries: tuple[str, ...] = setting(
        (), doc="registries spoken to over plain HTTP (127.0.0.1 and localhost always are)"
    )
    pip_index_url: str | None = setting(
        None, secret=True, doc="site package index; may carry credentials, which reach the build as a BuildKit secret"
    )
    pip_extra_index_urls: tuple[str, ...] = setting((), secret=True, doc="more indexes, as `pip_index_url`")
    pip_ca_bundle: str | None = setting(
        None, doc="CA bundle for TLS-intercepting proxies; mounted into the apt and pip steps as a secret"
    )
    pip_trusted_hosts: tuple[str, ...] = setting((), doc="hosts pip trusts without TLS verification")
    uid: int | None = setting(
        None,
        shown="the invoking user (`SUDO_UID` under sudo; 1000 for plain root)",
        doc="the user ID of the recipe's non-root user",
    )
    gid: int | None = setting(None, shown="as `uid`", doc="the group ID of the recipe's non-root user")
    backend: str = setting(
        "auto", doc="`buildkit` (docker CLI) or `sdk` (Engine API); `auto` picks BuildKit when a capable CLI exists"
    )
    engine: str = setting(
        "auto", doc="`docker`, `podman`, or `auto`: Docker where its socket answers, else Podman where it is installed"
    )
    podman_socket: str | None = setting(
        None,
        shown="`CONTAINER_HOST`, root's `/run/podman/podman.sock`, the user's",
        doc="Podman's API socket (`podman system service`)",
    )
    docker_cli: str | None = setting(None, shown="found on PATH", doc="the docker CLI that drives BuildKit")
    builder: str | None = setting(None, doc="a buildx builder (remote BuildKit) to build with")
    images_dir: str = setting("images", doc="where build contexts are written")
    cache_dir: str = setting(
        factory=_default_cache_dir, shown="platform cache dir", doc="locks, build logs, base answers and base pins"
    )
    tag_cache_ttl: int = setting(6 * 3600, doc="seconds a registry's tag list is reused by `imgbuild tags`")
    base_cache_ttl: int = setting(
        300,
        doc="seconds a base's registry answer (digest, config) is reused by `render` and `build`; `rebuild` always "
        "asks again; 0 never reuses it",
    )
    registry_timeout: float = setting(
        limits.HTTP_REQUEST_SECONDS, doc="seconds for one registry request, however slowly it trickles"
    )
    registry_deadline: float = setting(
        limits.HTTP_COMMAND_SECONDS, doc="seconds for everything one command asks of one registry"
    )
    registry_backoff: float = setting(0.5, doc="seconds before the first retry (doubling after)")
    build_timeout: float = setting(limits.BUILD_SECONDS, doc="seconds one image build may take")
    smoke_import_timeout: float = setting(
        limits.IMPORT_SECONDS,
        doc="seconds for one added distribution's imports in the smoke test on a quiet machine; a busy one gets up "
        "to 6x what the base's framework takes to import there, and a timed-out import is tried once more alone "
        "(then reported as timed out, not as broken)",
    )
    pip_resolve_timeout: float = setting(
        limits.PIP_RESOLVE_SECONDS, doc="seconds of the pip step's resolution before pip starts installing"
    )
    pip_download_limit: Bytes = setting(
        limits.PIP_DOWNLOAD_BYTES, shown="`16G`", doc="bytes the pip step may download (`16G`, `500M`)"
    )
    gpu_snapshot: str | None = setting(
        None, doc="read GPUs from a saved `imgbuild gpus --json` instead of this machine's (planning, tests)"
    )
    registry_cache: str = setting(
        "inline",
        doc="`inline`: images carry BuildKit's inline cache and pushed builds are seeded from the registry's copy; "
        "`registry`: also a buildx builder's full cache export (needs `builder`); on Podman either is Buildah's "
        "cache at `<image>-imgbuild-cache`; `off`",
    )
    gpu_source: str = setting(
        "auto",
        doc="where the smoke test reads the engine's GPUs: `local` (this machine's NVML / nvidia-smi), `engine` (a "
        "short-lived container of the image, given every GPU, runs nvidia-smi and reads the host's PCI bus); `auto` "
        "is `local` for a local socket, `engine` for `DOCKER_HOST=tcp://`/`ssh://` or when imgbuild itself runs in a "
        "container",
    )
    fleet_gpus: tuple[str, ...] = setting((), doc="the GPUs images must run on (config `fleet: {gpus: [...]}`)")
    fleet_driver: str | None = setting(None, doc="the oldest driver among them (config `fleet: {driver: ...}`)")
    run: RunRules = field(default_factory=RunRules)  # config `run:`, the house rules (imgbuild.config.site)
    reap: ReapPolicy = field(default_factory=ReapPolicy)  # config `reap:`, the site's alone
    slurm: SlurmSite = field(default_factory=SlurmSite)  # config `slurm:`
    k8s: K8sSite = field(default_factory=K8sSite)  # config `k8s:`
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    BACKENDS = ("auto", "buildkit", "sdk")
    ENGINES = ("auto", "docker", "podman")
    # auto: local where the engine shares this machine, else through the engine
    GPU_SOURCES = ("auto", "local", "engine")
    # registry: a buildx builder's full cache export (needs `builder`)
    REGISTRY_CACHES = ("inline", "registry", "off")

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
        from imgbuild.config.site import as_text

        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "sources":
                continue
            if f.name in SECTIONS:
                for key, value in as_text(getattr(self, f.name)).items():
                    dotted = f"{f.name}.{key}"
                    out[dotted] = {"value": value, "source": self.sources.get(dotted, "default")}
                continue
            value = getattr(self, f.name)
            if not f.repr and value:  # a secret (declared secret=True): masked
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
    found = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?", str(raw).strip(), re.IGNORECASE)
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
        said = str(exc).replace(repr(str(raw)), "it").replace(str(raw), "it") if str(raw) else str(exc)
        raise UsageError(f"{origin}: {name}: {said} (got {_shown(name, raw)})") from None


def _shown(name: str, raw: Any) -> str:
    """A wrong value as an error may show it: its type only where it could hold a credential (a key, token or
    password field, a URL, a list or mapping of anything), else its first 40 characters."""
    from imgbuild.credentials import SECRET_NAME_RE, SECRET_VALUE_RE

    if not isinstance(raw, str | int | float | bool) or raw is None:
        return f"a {type(raw).__name__}"
    text = str(raw)
    if SECRET_NAME_RE.search(name.upper()) or "://" in text or "@" in text or SECRET_VALUE_RE.search(text):
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


def load_settings(flags: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Resolve every setting by precedence. `flags` holds only the flags the user actually gave."""
    from imgbuild.errors import RecipeError

    environ = dict(os.environ if environ is None else environ)
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    site_path, user_path = config_files(environ)
    files = [
        _read_config_file(site_path, f"site config {site_path}"),
        _read_config_file(user_path, f"user config {user_path}"),
    ]
    known = {f.name: f for f in dataclasses.fields(Settings) if f.name not in ("sources", *SECTIONS)}
    problems = [
        cfg.problem((k,), "unknown setting", _closest(str(k), [*known, *SECTIONS, "fleet"]), key=True)
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
    for name, f in known.items():
        found = _first_source(name, flags, environ, layers)
        if found:
            origin, raw = found
            values[name] = _coerce(name, raw, f.type, _where(origin, name, files))
            sources[name] = origin
    settings = Settings(**values, **sections, sources={**sources, **section_sources})
    _check(settings)
    return settings


def _where(origin: str, name: str, files: list[ConfigFile]) -> str:
    """`FILE:LINE:COL` of a flat setting in the config file it came from, else the origin as it is."""
    for cfg in files:
        if cfg.origin == origin and cfg.located is not None:
            key = ("fleet", name.removeprefix("fleet_")) if name.startswith("fleet_") else (name,)
            pos = cfg.located.where(key)
            if pos is not None:
                return f"{pos.file}:{pos.line}:{pos.col}"
    return origin


def _closest(word: str, known: list[str]) -> str:
    import difflib  # only when there is an unknown key to explain

    close = difflib.get_close_matches(word, known, n=1)
    return f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(known))}"


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
    for name, choices in (
        ("backend", Settings.BACKENDS),
        ("engine", Settings.ENGINES),
        ("registry_cache", Settings.REGISTRY_CACHES),
        ("gpu_source", Settings.GPU_SOURCES),
    ):
        if getattr(settings, name) not in choices:
            raise UsageError(
                f"{sources.get(name, 'default')}: {name}: must be one of "
                f"{', '.join(choices)} (got {str(getattr(settings, name))[:40]!r})"
            )
    if settings.registry_cache == "registry" and not settings.builder:
        raise UsageError(
            f"{sources.get('registry_cache', 'default')}: registry_cache: registry is a buildx builder's cache "
            "export: set builder (a docker-container builder), or say inline"
        )
    if settings.fleet_gpus or settings.fleet_driver:  # fleet rules are imported only for a configured fleet
        from imgbuild.gpu.fleet import check_driver, parse_targets

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


_SCHEMA_TYPES = (
    ("tuple", {"type": "array", "items": {"type": "string"}}),
    ("float", {"type": "number"}),
    ("Bytes", {"type": ["integer", "string"]}),
    ("int", {"type": "integer"}),
)


def json_schema() -> dict[str, Any]:
    """The config file (`/etc/imgbuild/config.yaml`, `~/.config/imgbuild/config.yaml`) as a JSON Schema, from
    the same declarations `load_settings` checks against (`docs/config.schema.json`)."""
    from imgbuild import fields
    from imgbuild.config import site as siteconfig

    defs: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        if f.name == "sources" or f.name.startswith("fleet_"):
            continue
        if f.name in SECTIONS:
            properties[f.name] = fields.Model(SECTIONS[f.name]).schema(defs)
            continue
        kind = next((schema for word, schema in _SCHEMA_TYPES if word in str(f.type)), {"type": "string"})
        properties[f.name] = {**kind, "description": f"{f.metadata['doc']} (IMGBUILD_{f.name.upper()} overrides it)"}
    properties["fleet"] = fields.Model(siteconfig.Fleet).schema(defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "imgbuild config",
        "description": "Site (/etc/imgbuild/config.yaml) and user (~/.config/imgbuild/config.yaml) settings. "
        "Fields marked x-site-only are the site's: a user's config may only tighten them (lower).",
        "type": "object",
        "additionalProperties": False,
        "properties": dict(sorted(properties.items())),
        "$defs": defs,
    }


def _shown_default(f: dataclasses.Field[Any]) -> str:
    """A flat setting's default as the settings table shows it."""
    if f.metadata.get("shown"):
        return str(f.metadata["shown"])
    value = f.default
    if value is None or value == ():
        return "none"
    if isinstance(value, str):
        return f"`{value}`"
    return f"{value:g}" if isinstance(value, float) else str(value)


def settings_table() -> str:
    """The flat settings as a Markdown table (setting, default, meaning): README.md's, made from the declarations
    above and checked against README by the docs test."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(Settings):
        if "doc" in f.metadata:
            rows.append(f"| `{f.name}` | {_shown_default(f)} | {f.metadata['doc']} |")
    return "\n".join(rows) + "\n"
