"""A registry in memory, for one repository: just the calls build.attest and build.spared make (upload, put,
read back), each checked as a registry would check it. For tests that need no HTTP at all; the misbehaving
registries that do are served from 127.0.0.1 (tests/fake_nvcr.py, the hostile registry tests)."""

from __future__ import annotations

from pathlib import Path

from imgbuild.errors import RegistryError
from imgbuild.supply import attest


class MemoryRegistry:
    """Just the registry calls attest makes, in memory, for one repository."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, bytes] = {}

    def has_blob(self, repo: str, digest: str) -> bool:
        return digest in self.blobs

    def upload_blob(self, repo: str, digest: str, source: Path) -> None:
        data = source.read_bytes()
        assert attest.sha256(data) == digest
        self.blobs[digest] = data

    def put_manifest(self, repo: str, reference: str, content: bytes, media_type: str) -> None:
        assert media_type == attest.OCI_MANIFEST
        self.manifests[reference] = content

    def manifest_raw(self, repo: str, reference: str) -> tuple[bytes, str, str]:
        if reference not in self.manifests:
            raise RegistryError("MANIFEST_UNKNOWN")
        return self.manifests[reference], attest.OCI_MANIFEST, attest.sha256(self.manifests[reference])

    def blob_bytes(self, repo: str, digest: str) -> bytes:
        return self.blobs[digest]
