"""`imgbuild mirror`: copy NGC tags into a site registry, registry to registry, digests preserved.

Manifest lists and OCI indexes are copied with every platform's manifest, then every blob: skipped where
the target has it (so a second run copies nothing and an interrupted one resumes), mounted from another
repository of the target where it is there, else streamed through a temporary file and checked against its
digest. Each registry gets its own client and credentials. `--keep N` prunes older mirrored tags of the
same selection, only when asked.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild import limits
from imgbuild.boundedjson import loads as bounded_loads
from imgbuild.errors import EnvironmentProblem, RegistryError, UsageError
from imgbuild.hostio.cache import JsonCache
from imgbuild.imageref import DIGEST_RE
from imgbuild.registry.client import RegistryClient
from imgbuild.registry.manifest import INDEX_TYPES

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings

_HOST_RE_HINT = "a registry host such as registry.example.org or 127.0.0.1:5001"


@dataclass(frozen=True)
class MirrorRequest:
    repository: str = "pytorch"
    to: str = ""
    since: str | None = None
    variant: str = "none"
    keep: int | None = None
    dry_run: bool = False
    tags: tuple[str, ...] = ()  # only these (of the selection); empty: every selected tag


@dataclass
class TagCopy:
    tag: str
    digest: str = ""
    status: str = ""  # copied | present | would copy | pruned | would prune
    blobs_copied: int = 0
    blobs_present: int = 0
    blobs_mounted: int = 0
    bytes_copied: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Copier:
    source: RegistryClient
    target: RegistryClient
    repo: str
    scratch: Path
    progress: Callable[[str], None]
    seen: dict[str, str] = field(default_factory=dict)  # blob digest -> a target repository that has it

    def manifest(self, reference: str, tally: TagCopy, tag: str | None = None, depth: int = 0) -> str:
        """Copy the manifest `reference` (and all it names) and tag it `tag` (by digest when None). The source
        registry is untrusted: every part of its answer is shape-checked before it is used."""
        content, media_type, digest = self.source.manifest_raw(self.repo, reference)
        bad = f"registry {self.source.host}: {self.repo}:{reference}"
        try:
            body = bounded_loads(content)
        except (ValueError, RecursionError):
            raise RegistryError(f"{bad}: the manifest is not JSON") from None
        if not isinstance(body, dict):
            raise RegistryError(f"{bad}: the manifest is not a JSON object")
        if media_type in INDEX_TYPES or "manifests" in body:
            entries = body.get("manifests") or []
            if depth >= limits.MIRROR_INDEX_DEPTH or not isinstance(entries, list):
                raise RegistryError(
                    f"{bad}: a manifest list nested deeper than {limits.MIRROR_INDEX_DEPTH} or malformed"
                )
            for entry in entries:
                child = str(entry.get("digest", "")) if isinstance(entry, dict) else ""
                if not DIGEST_RE.fullmatch(child):
                    raise RegistryError(f"{bad} lists a malformed digest")
                if self.target.content_digest(self.repo, child) != child:
                    self.manifest(child, tally, depth=depth + 1)
        else:
            layers = body.get("layers") or []
            if not isinstance(layers, list):
                raise RegistryError(f"{bad}: its layers are not a list")
            for blob in [body.get("config") or {}, *layers]:
                self.blob(blob, tally, tag or reference)
        self.put_manifest(tag or digest, content, media_type)
        return digest

    def put_manifest(self, reference: str, content: bytes, media_type: str) -> None:
        """Tag the copied manifest; a target that does not have a blob yet (another mirror copying into the
        same repository, finishing it) is asked again, twice, then named as the likely cause."""
        for attempt in range(3):
            try:
                self.target.put_manifest(self.repo, reference, content, media_type)
                return
            except RegistryError as exc:
                if "BLOB_UNKNOWN" not in str(exc):
                    raise
                if attempt == 2:
                    raise RegistryError(
                        f"{exc}; a blob it names is not in the target yet: is another mirror copying into "
                        f"{self.target.host}/{self.repo}? run again when it is done"
                    ) from None
                time.sleep(2 * (attempt + 1))

    def blob(self, blob: Any, tally: TagCopy, label: str) -> None:
        bad = f"registry {self.source.host}: {self.repo}:{label} names a malformed blob"
        if not isinstance(blob, dict):
            raise RegistryError(bad)
        digest, size = str(blob.get("digest", "")), blob.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= limits.MIRROR_BLOB_BYTES:
            raise RegistryError(
                f"{bad} (size {str(size)[:20]!r}: at most {limits.MIRROR_BLOB_BYTES // limits.MIB} MiB)"
            )
        if not DIGEST_RE.fullmatch(digest) or not digest.startswith("sha256:"):
            raise RegistryError(bad)
        if self.target.has_blob(self.repo, digest):
            tally.blobs_present += 1
            self.seen.setdefault(digest, self.repo)
            return
        other = self.seen.get(digest)
        if other and other != self.repo and self.target.mount_blob(self.repo, digest, other):
            tally.blobs_mounted += 1
            return
        free = shutil.disk_usage(self.scratch).free
        if size + 256 * limits.MIB > free:
            raise EnvironmentProblem(
                f"{self.scratch}: {free // limits.MIB} MiB free, not enough for a {size // limits.MIB} MiB layer "
                "(set cache_dir to a larger disk)"
            )
        self.progress(f"{self.repo}:{label}: copying {digest[7:19]} ({size / limits.MIB:.0f} MiB)")
        from imgbuild.hostio.host import process_token

        with tempfile.NamedTemporaryFile(dir=self.scratch, prefix=f"blob-{process_token('.')}-") as handle:
            path = Path(handle.name)
            self.source.download_blob(self.repo, digest, size, path)
            self.target.upload_blob(self.repo, digest, path)
        self.seen[digest] = self.repo
        tally.blobs_copied += 1
        tally.bytes_copied += size


def check_target(host: str) -> str:
    from imgbuild.imageref import HOST_RE

    if not HOST_RE.fullmatch(host or ""):
        raise UsageError(f"--to: {host[:80]!r} is not {_HOST_RE_HINT}")
    return host


def mirror(settings: Settings, req: MirrorRequest, progress: Callable[[str], None] = lambda s: None) -> list[TagCopy]:
    """Copy the selected tags of `req.repository` from the NGC registry to `req.to`."""
    from imgbuild.registry.tags import TagCache, list_tags, release_floor, repository_for, select
    from imgbuild.registry_identity import same_registry

    release_floor(req.since)  # a bad --since is a usage error before any request
    target_host = check_target(req.to)
    host, repo = repository_for(req.repository, settings.ngc_registry)
    if same_registry(target_host, host):
        raise UsageError(f"--to: {target_host} is the registry the tags come from")
    deadline = max(settings.registry_deadline, limits.MIRROR_SECONDS)
    source = RegistryClient.for_host(host, settings, command_seconds=deadline)
    target = RegistryClient.for_host(target_host, settings, command_seconds=deadline)
    cache = TagCache(Path(settings.cache_dir) / "registry", settings.tag_cache_ttl)
    names, _, _ = list_tags(source, repo, cache, refresh=True)
    chosen = [info.tag for info in select(names, since=req.since, variant=req.variant, limit=None)]
    missing = [t for t in req.tags if t not in names]
    if missing:
        raise UsageError(f"--tag: {missing[0][:80]!r} is not a tag of {host}/{repo}")
    if req.tags:
        chosen = [t for t in chosen if t in req.tags] or [t for t in req.tags]
    scratch = Path(settings.cache_dir) / "mirror"
    scratch.mkdir(parents=True, exist_ok=True)
    sweep_partial_blobs(scratch)
    known = JsonCache(scratch / "known", None, 64 * limits.MIB)  # only an optimisation: unknown blobs are copied
    copier = _Copier(source, target, repo, scratch, progress, _read_known(known, target_host))
    results = []
    for tag in chosen:
        tally = TagCopy(tag)
        tally.digest = source.content_digest(repo, tag) or ""  # the hash of what it serves, never a header
        if tally.digest and target.content_digest(repo, tag) == tally.digest:
            tally.status = "present"
        elif req.dry_run:
            tally.status = "would copy"
        else:
            progress(f"{repo}:{tag}: copying to {target_host}")
            tally.digest = copier.manifest(tag, tally, tag)
            tally.status = "copied"
        results.append(tally)
        known.put(f"blobs:{target_host}", copier.seen)
    if req.keep is not None:
        results += _prune(target, repo, req, set(chosen[: req.keep]))
    return results


def sweep_partial_blobs(scratch: Path) -> int:
    """Remove the blob files of mirrors that were killed mid-copy (`blob-PID.START-...` whose process is gone):
    a SIGKILL leaves one behind, as large as what had arrived."""
    from imgbuild.hostio.host import token_alive

    removed = 0
    for path in scratch.glob("blob-*"):
        owner = path.name.split("-")[1] if path.name.count("-") >= 2 else ""
        if not token_alive(owner, sep="."):
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
    return removed


def _read_known(cache: JsonCache, host: str) -> dict[str, str]:
    """Blobs mirrored to this target before, by the repository that has them (for cross-repository mounts)."""
    data = cache.get(f"blobs:{host}")
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _prune(target: RegistryClient, repo: str, req: MirrorRequest, kept: set[str]) -> list[TagCopy]:
    """Older mirrored tags of the same selection beyond the newest `keep`; only those."""
    from imgbuild.registry.tags import select

    try:
        mirrored = target.tags(repo)
    except RegistryError:
        return []
    selection = [info.tag for info in select(mirrored, since=req.since, variant=req.variant, limit=None)]
    newest = set(selection[: req.keep]) | kept
    out = []
    for tag in selection:
        if tag in newest:
            continue
        digest = target.content_digest(repo, tag) or ""
        if not req.dry_run and digest:
            target.delete_manifest(repo, digest)
        out.append(TagCopy(tag, digest, "would prune" if req.dry_run else "pruned"))
    return out
