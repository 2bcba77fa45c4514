"""The settings as one typed value: every flat setting with its default, its meaning and the default as the docs
show it, and the config file's sections (`imgbuild.config.site`). Pure: reading files, the environment and flags,
and their precedence, live in `imgbuild.config.settings`. README's settings table and the config schema are made
from these declarations.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NewType
from urllib.parse import urlsplit

from imgbuild import limits
from imgbuild.config.site import SECTIONS, K8sSite, ReapPolicy, RunRules, SlurmSite
from imgbuild.hostio.host import Caller


def _default_cache_dir() -> str:
    from platformdirs import user_cache_dir

    return user_cache_dir("imgbuild")


#: Fields of Settings that no file, variable or flag sets: where each value came from, and who runs the command.
NOT_SETTINGS = ("sources", "caller")

#: A size in bytes; config and environment values may say `16G` (config.settings reads it).
Bytes = NewType("Bytes", int)
#: A duration in seconds, above 0 and at most a day.
Seconds = NewType("Seconds", float)


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

    user: str = setting("", shown="your login name", doc="image namespace: images are `<user>/<name>:<tag>`")
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
    min_image_id: int = setting(
        1000,
        doc="the lowest UID and GID a recipe's user (or `uid`, `gid`) may take: those below are the base's system "
        "accounts and groups (a site with another convention lowers it)",
    )
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
    registry_timeout: Seconds = setting(
        limits.HTTP_REQUEST_SECONDS, doc="seconds for one registry request, however slowly it trickles"
    )
    registry_deadline: Seconds = setting(
        limits.HTTP_COMMAND_SECONDS, doc="seconds for everything one command asks of one registry"
    )
    registry_backoff: Seconds = setting(0.5, doc="seconds before the first retry (doubling after)")
    build_timeout: Seconds = setting(limits.BUILD_SECONDS, doc="seconds one image build may take")
    smoke_import_timeout: Seconds = setting(
        limits.IMPORT_SECONDS,
        doc="seconds for one added distribution's imports in the smoke test on a quiet machine; a busy one gets up "
        "to 6x what the base's framework takes to import there, and a timed-out import is tried once more alone "
        "(then reported as timed out, not as broken)",
    )
    smoke_gpu_seconds: Seconds = setting(
        limits.SMOKE_GPU_SECONDS,
        doc="seconds the smoke test's collective, P2P, torch.compile and FP8 checks may take together on a GPU host; "
        "a check that finds none left is skipped, saying so",
    )
    pip_resolve_timeout: Seconds = setting(
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
    #: who runs this command (the sudo caller under sudo), read once where the settings are loaded: the default
    #: image namespace and non-root user, whose GPUs, whose files; not a setting, so no file or flag sets it
    caller: Caller = field(kw_only=True, compare=False, repr=False)

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
            if f.name in NOT_SETTINGS:
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


#: The JSON Schema of each kind of flat setting (setting_kinds).
_SCHEMA_TYPES: dict[str, dict[str, Any]] = {
    "list": {"type": "array", "items": {"type": "string"}},
    "seconds": {"type": "number"},
    "bytes": {"type": ["integer", "string"]},
    "int": {"type": "integer"},
    "text": {"type": "string"},
}


@functools.cache
def setting_kinds() -> dict[str, str]:
    """Each flat setting's kind, from its declared type (not its spelling): "list" (a tuple of strings),
    "seconds", "bytes", "int" or "text". The loader converts, and the schema describes, by these."""
    hints = typing.get_type_hints(Settings)
    kinds: dict[str, str] = {}
    for f in dataclasses.fields(Settings):
        if f.name in NOT_SETTINGS or f.name in SECTIONS:
            continue
        kind = hints[f.name]
        if isinstance(kind, types.UnionType):  # `X | None`: the X
            kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        if typing.get_origin(kind) is tuple:
            kinds[f.name] = "list"
        else:
            kinds[f.name] = {Bytes: "bytes", Seconds: "seconds", int: "int"}.get(kind, "text")
    return kinds


def json_schema() -> dict[str, Any]:
    """The config file (`/etc/imgbuild/config.yaml`, `~/.config/imgbuild/config.yaml`) as a JSON Schema, from
    the same declarations `load_settings` checks against (`docs/config.schema.json`)."""
    from imgbuild import fields
    from imgbuild.config import site as siteconfig

    defs: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        if f.name in NOT_SETTINGS or f.name.startswith("fleet_"):
            continue
        if f.name in SECTIONS:
            properties[f.name] = fields.Model(SECTIONS[f.name]).schema(defs)
            continue
        properties[f.name] = {
            **_SCHEMA_TYPES[setting_kinds()[f.name]],
            "description": f"{f.metadata['doc']} (IMGBUILD_{f.name.upper()} overrides it)",
        }
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
