"""NGC tag listing: list, filter, describe (from config blobs, no layer pulled) and check against this host.

Answers "which NGC PyTorch tags exist, what CUDA/cuDNN/torch is in each, which ones run here?" from the
registry itself, with an on-disk cache (TTL for tag lists; config blobs are immutable by digest).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild import limits
from imgbuild.errors import RegistryUnavailable, UsageError
from imgbuild.gpu.fleet import Target, check_driver, host_target, judge_tag, parse_targets
from imgbuild.gpu.read import NoGpus, read_devices
from imgbuild.hostio.cache import JsonCache
from imgbuild.ngc import FRAMEWORKS, describe_config, parse_tag
from imgbuild.registry.client import RegistryClient
from imgbuild.registry.manifest import host_platform

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.registry.manifest import Manifest

#: The platforms whose own arch lists a tag is judged on (GPU machines: amd64, and arm64 for Grace and Jetson).
VARIANT_ARCHS = ("amd64", "arm64")


@dataclass
class TagInfo:
    tag: str
    release: str
    variant: str | None
    digest: str = ""
    size: int = 0
    cuda: str = ""
    cudnn: str = ""
    framework: str = ""
    framework_version: str = ""
    python: str = ""
    driver: str = ""
    arch_list: str = ""
    compatible: bool | None = None
    why: str = ""
    platforms: tuple[str, ...] = ()  # the CPU architectures the tag exists for (a manifest list's)
    variants: dict[str, dict[str, str]] = field(default_factory=dict)  # other platforms' cuda and arch_list


@dataclass
class Listing:
    repository: str
    tags: list[TagInfo]
    cached_age: float | None = None  # seconds, when served from cache
    offline: bool = False
    total: int = 0
    requests: int = 0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "repository": self.repository,
            "total": self.total,
            "offline": self.offline,
            "cached_age_seconds": self.cached_age,
            "notes": self.notes,
            "tags": [asdict(t) for t in self.tags],
        }


def repository_for(name: str, registry: str) -> tuple[str, str]:
    """`pytorch` -> (registry, nvidia/pytorch); `org/repo` -> (registry, org/repo); `host/org/repo` too."""
    from imgbuild.imageref import BadReference, parse

    if name in FRAMEWORKS:
        return registry, FRAMEWORKS[name].repository
    try:
        ref = parse(name)
    except BadReference:
        ref = None
    if ref is None or ref.tag or ref.digest or (not ref.host and "/" not in ref.path):
        raise UsageError(f"tags: {name[:80]!r} is not pytorch, tensorflow or ORG/REPO")
    return ref.host or registry, ref.path


class TagCache:
    """Tag lists (with their age: `tag_cache_ttl` decides when to ask again) and tag details (config blobs are
    immutable by digest: kept for good), in the one JSON cache discipline (imgbuild.hostio.cache)."""

    def __init__(self, root: Path, ttl: int):
        self.ttl = ttl
        self._tags = JsonCache(root / "tags", None, limits.HTTP_TAGS_BYTES)
        self._details = JsonCache(root / "details", None)
        self._described = JsonCache(root / "described", None)

    def get_tags(self, host: str, repo: str) -> tuple[list[str], float] | None:
        found = self._tags.get_with_age(f"{host}/{repo}")
        if found is None or not isinstance(found[0], list):
            return None
        return [str(t) for t in found[0]], found[1]

    def put_tags(self, host: str, repo: str, tags: list[str]) -> None:
        self._tags.put(f"{host}/{repo}", tags)

    def get_details(self, key: str) -> dict[str, Any] | None:
        found = self._details.get(key)
        return dict(found) if isinstance(found, dict) else None

    def put_details(self, key: str, value: dict[str, Any]) -> None:
        self._details.put(key, value)

    def get_described(self, host: str, repo: str, tag: str) -> TagInfo | None:
        """A tag as `--details` last described it (what it pointed at then): read when the registry is away."""
        found = self._described.get(f"{host}/{repo}:{tag}")
        if not isinstance(found, dict):
            return None
        try:
            return TagInfo(**{**found, "platforms": tuple(found.get("platforms") or ())})
        except TypeError:
            return None

    def put_described(self, host: str, repo: str, info: TagInfo) -> None:
        self._described.put(f"{host}/{repo}:{info.tag}", {**asdict(info), "compatible": None, "why": ""})


def list_tags(
    client: RegistryClient, repo: str, cache: TagCache, *, refresh: bool = False, page_size: int = 1000
) -> tuple[list[str], float | None, bool]:
    """(tags, age of the cached answer or None, offline?)."""
    cached = cache.get_tags(client.host, repo)
    if cached and not refresh and cached[1] < cache.ttl:
        return cached[0], cached[1], False
    try:
        tags = client.tags(repo, page_size=page_size)
    except RegistryUnavailable:
        if cached:
            return cached[0], cached[1], True
        raise
    cache.put_tags(client.host, repo, tags)
    return tags, None, False


def release_floor(since: str | None) -> tuple[int, int] | None:
    """`--since 24.01` as (24, 1); a bad value is a usage error, found before any request."""
    if not since:
        return None
    parsed = parse_tag(since if "-" in since else since + "-py3")
    if parsed is None:
        raise UsageError(f"--since: {since!r} is not a release like 24.01")
    return parsed.yy, parsed.mm


def select(tags: list[str], *, since: str | None, variant: str, limit: int | None) -> list[TagInfo]:
    """Parse, filter and sort newest first. `variant`: none (plain tags), all, or a name like igpu."""
    floor = release_floor(since)
    chosen = []
    for text in tags:
        parsed = parse_tag(text)
        if parsed is None or parsed.py == "2":
            continue
        if variant == "none" and parsed.variant is not None:
            continue
        if variant not in ("none", "all") and parsed.variant != variant:
            continue
        if floor and (parsed.yy, parsed.mm) < floor:
            continue
        chosen.append(parsed)
    chosen.sort(reverse=True)
    if limit:
        chosen = chosen[:limit]
    return [TagInfo(p.text, p.release, p.variant) for p in chosen]


def add_details(client: RegistryClient, repo: str, infos: list[TagInfo], cache: TagCache, workers: int = 8) -> None:
    """Fill CUDA/cuDNN/framework/... from each tag's config blob, fetched in parallel."""

    def facts_of(manifest: Manifest) -> dict[str, Any]:
        facts = cache.get_details(manifest.config_digest)
        if facts is None:
            facts = describe_config(client.blob_json(repo, manifest.config_digest))
            cache.put_details(manifest.config_digest, facts)
        return facts

    def one(info: TagInfo) -> None:
        manifest = client.manifest(repo, info.tag)
        facts = facts_of(manifest)
        info.digest, info.size, info.platforms = manifest.digest, manifest.size, manifest.platforms
        for key in ("cuda", "cudnn", "framework", "framework_version", "python", "driver", "arch_list"):
            setattr(info, key, facts.get(key, ""))
        # NGC's arch lists differ by platform (arm64 25.10 has 11.0 and no 7.5): each platform judged by its own
        for arch in (a for a in manifest.platforms if a in VARIANT_ARCHS and a != host_platform()[1]):
            other = facts_of(client.manifest(repo, info.tag, arch=arch))
            info.variants[arch] = {"cuda": other.get("cuda", ""), "arch_list": other.get("arch_list", "")}
        cache.put_described(client.host, repo, info)

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(infos)))) as pool:
        list(pool.map(one, infos))


# --- what this host can run -------------------------------------------------------------------------


@dataclass(frozen=True)
class HostGpus:
    """The GPUs and driver a tag is judged for: the flags' (`--arch`, `--driver`), else this host's read ones,
    each carrying its model's facts; checked before any registry is asked."""

    driver: str | None
    targets: tuple[Target, ...]
    source: str

    @property
    def capabilities(self) -> tuple[str, ...]:
        return tuple(f"{t.capability[0]}.{t.capability[1]}" for t in self.targets)


def host_gpus(driver: str | None = None, arch: str | None = None, snapshot: str | None = None) -> HostGpus:
    """The driver and GPUs to judge tags for: from the flags (a malformed one is a usage error), else from the GPU
    reader (a snapshot where the settings name one), each GPU with its model's facts."""
    if driver or arch:
        return HostGpus(check_driver(driver), tuple(parse_targets(arch, "--arch")) if arch else (), "flags")
    try:
        gpus, source = read_devices(snapshot)
    except NoGpus:
        return HostGpus(None, (), "none")
    targets: list[Target] = []
    for gpu in gpus:
        target = host_target(gpu.name, gpu.compute_cap)
        if target is not None and target not in targets:
            targets.append(target)
    return HostGpus(next((g.driver for g in gpus if g.driver), None), tuple(targets), source)


def compatibility(info: TagInfo, host: HostGpus) -> tuple[bool, str]:
    """Can this host run the tag? Judged by `fleet` from the tag's CUDA_VERSION and TORCH_CUDA_ARCH_LIST."""
    if not host.driver and not host.targets:
        return True, "no GPU information (give --driver/--arch)"
    targets = list(host.targets)
    verdicts = judge_tag(info.tag, info.cuda, info.arch_list, targets, host.driver, info.platforms, info.variants)
    return all(v.runs for v in verdicts), "; ".join(dict.fromkeys(v.reason for v in verdicts))


@dataclass
class Query:
    """What `imgbuild tags` asks: a repository, filters, and whether to describe and check each tag."""

    repository: str = "pytorch"
    since: str | None = None
    variant: str = "none"
    limit: int | None = 20
    details: bool = False
    compatible: bool = False
    driver: str | None = None
    arch: str | None = None
    refresh: bool = False


def listing(settings: Settings, query: Query) -> Listing:
    """Tags newest first, from the cache or the registry; with details and this host's verdict on each."""
    release_floor(query.since)  # a bad --since, --driver or --arch is a usage error before any request
    if (query.driver or query.arch) and not query.compatible:
        raise UsageError("--driver and --arch go with --compatible")
    gpus = host_gpus(query.driver, query.arch, settings.gpu_snapshot) if query.compatible else None
    host, repo = repository_for(query.repository, settings.ngc_registry)
    client = RegistryClient.for_host(host, settings)
    cache = TagCache(Path(settings.cache_dir) / "registry", settings.tag_cache_ttl)
    names, age, offline = list_tags(client, repo, cache, refresh=query.refresh)
    infos = select(names, since=query.since, variant=query.variant, limit=None if query.compatible else query.limit)
    if (query.details or query.compatible) and infos:
        if offline:
            raise RegistryUnavailable(f"registry {host} is unreachable: --details/--compatible need it")
        add_details(client, repo, infos, cache)
    if gpus is not None:
        for info in infos:
            info.compatible, info.why = compatibility(info, gpus)
        infos = [i for i in infos if i.compatible][: query.limit]
    result = Listing(f"{host}/{repo}", infos, age, offline, len(names), client.requests_made)
    if offline and age is not None:
        result.notes.append(f"registry unreachable: cached answer from {age / 3600:.1f} h ago")
    elif age is not None:
        result.notes.append(f"cached {age / 60:.0f} min ago (--refresh to ask the registry)")
    if gpus is not None:
        result.notes.append(
            f"host: driver {gpus.driver or '?'}, GPUs {','.join(gpus.capabilities) or '?'} (from {gpus.source})"
        )
    return result
