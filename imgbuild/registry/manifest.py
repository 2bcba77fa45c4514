"""What a registry's manifests are: the media types imgbuild asks for, a manifest as imgbuild reads it, a reference
split into registry, repository and tag, and this host's platform (which manifest of a list is ours)."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from typing import Any

from imgbuild import imageref
from imgbuild.errors import RegistryError, UsageError
from imgbuild.imageref import DIGEST_RE
from imgbuild.platforms import arch_of_machine

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
    return "linux", arch_of_machine(machine) or machine


LIST_TYPE = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"


@dataclass(frozen=True)
class PlatformImage:
    """One platform's image as its registry serves it: what a manifest list names of it."""

    platform: str  # one of platforms.PLATFORMS
    digest: str
    media_type: str
    size: int


def manifest_list(images: list[PlatformImage]) -> tuple[bytes, str]:
    """The manifest list of `images` (Docker's where every image is a Docker manifest, else an OCI index, as
    `docker manifest` and `podman manifest` write them), and its media type. arm64 is OCI's `v8` variant."""
    kind = LIST_TYPE if all(i.media_type == DOCKER_MANIFEST_TYPE for i in images) else OCI_INDEX_TYPE
    entries = []
    for image in images:
        os_name, arch = image.platform.split("/")[:2]
        plat = {"architecture": arch, "os": os_name, **({"variant": "v8"} if arch == "arm64" else {})}
        entries.append({"mediaType": image.media_type, "size": image.size, "digest": image.digest, "platform": plat})
    body = {"schemaVersion": 2, "mediaType": kind, "manifests": entries}
    return json.dumps(body, indent=3).encode(), kind


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
