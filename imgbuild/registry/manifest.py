"""What a registry's manifests are: the media types imgbuild asks for, a manifest as imgbuild reads it, a reference
split into registry, repository and tag, and this host's platform (which manifest of a list is ours)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

from imgbuild import imageref
from imgbuild.errors import RegistryError, UsageError
from imgbuild.imageref import DIGEST_RE

MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
INDEX_TYPES = {"application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"}


def split_reference(ref: str) -> tuple[str, str, str]:
    """`host/org/repo:tag` or `...@sha256:..` -> (host, repository, tag-or-digest). Docker Hub defaults apply."""
    try:
        parsed = imageref.parse(ref)
    except imageref.BadReference as exc:
        raise UsageError(f"{exc}") from None
    return parsed.registry, parsed.repository, parsed.reference


def host_platform() -> tuple[str, str]:
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return "linux", arch


@dataclass
class Manifest:
    digest: str
    media_type: str
    body: dict[str, Any]
    platforms: tuple[str, ...] = ()  # the CPU architectures an index lists (linux); () for a single image

    @property
    def config_digest(self) -> str:
        config = self.body.get("config")
        digest = str(config.get("digest", "")) if isinstance(config, dict) else ""
        if not DIGEST_RE.fullmatch(digest):
            raise RegistryError("the registry's manifest names no valid config digest")
        return digest

    @property
    def size(self) -> int:
        """Compressed size of the image: config plus layers."""
        return int(self.body.get("config", {}).get("size", 0)) + sum(
            int(layer.get("size", 0)) for layer in self.body.get("layers", [])
        )
