"""Which NGC release `imgbuild init` starts a recipe on.

The newest release the registry lists (nvcr.io, or the site's mirror: `ngc_registry`) that every GPU of the fleet
can run with its driver, judged from what each tag's image config declares (CUDA version, the framework's
architectures: the facts `tags --details` reads and caches) by the rules `smoke --for` judges with
(imgbuild.gpu.fleet). The fleet is `--for` (with `--driver`), else the site's `fleet:` and this host's GPUs. When
the registry does not answer, the tag list and tag facts it gave last are used, and the choice says from when;
with nothing cached, nothing is chosen (exit 3).

`choose` and `judge_base` are pure; `Catalogue` is the registry (and its cache) read lazily, newest first.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.errors import EnvironmentProblem, RegistryUnavailable, UsageError
from imgbuild.gpu.fleet import Target, judge_tag, ok_and_why

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.registry.tags import TagInfo

#: Tags described per request round (in parallel), and how many releases are judged before giving up (three
#: years of monthly releases).
BATCH = 6
SCAN_LIMIT = 36


@dataclass(frozen=True)
class Fleet:
    """The GPUs a base must serve, the driver they run (None: not known, only kernels judged), and how to say so."""

    targets: tuple[Target, ...]
    driver: str | None
    said: str


@dataclass(frozen=True)
class Choice:
    """The release chosen (`24.05`), the one-line reason written beside it in the recipe, and the longer reason
    printed (the verdict per GPU, where the facts came from)."""

    release: str
    why: str
    detail: str


def judge_base(info: TagInfo, fleet: Fleet) -> tuple[bool, str]:
    """Can every GPU of the fleet run this tag? (runs, why not / what was judged)."""
    verdicts = judge_tag(info.tag, info.cuda, info.arch_list, list(fleet.targets), fleet.driver, info.platforms,
                         info.variants)  # fmt: skip
    runs, blocked = ok_and_why(verdicts)
    return runs, blocked if not runs else "; ".join(dict.fromkeys(v.reason for v in verdicts))


def choose(described: Iterator[TagInfo], fleet: Fleet, where: Callable[[], str], limit: int = SCAN_LIMIT) -> Choice:
    """The newest tag of `described` (newest first) every GPU of `fleet` runs; EnvironmentProblem when none of
    the newest `limit` does (naming what stops the newest). `where`: the source's name once read (it may have gone
    offline on the way)."""
    newest: tuple[str, str] | None = None
    for count, info in enumerate(described, 1):
        runs, why = judge_base(info, fleet)
        if runs:
            cuda = f"CUDA {info.cuda}" if info.cuda else "no CUDA declared"
            return Choice(
                info.release,
                f"the newest release {fleet.said} can run ({cuda})",
                f"{info.tag}: {why} ({where()})",
            )
        newest = newest or (info.tag, why)
        if count >= limit:
            break
    if newest is None:
        raise EnvironmentProblem(f"{where()}: no release described to choose from; give --base TAG")
    raise EnvironmentProblem(
        f"no release among the newest {limit} on {where()} runs on {fleet.said}: the newest, {newest[0]}: {newest[1]} "
        "(--base TAG chooses one anyway)"
    )


class Catalogue:
    """A framework's plain release tags on the NGC registry, newest first, described on demand (config blobs,
    cached for good by digest); from the cache, dated, when the registry does not answer."""

    def __init__(self, settings: Settings, framework: str):
        from imgbuild.registry import tags as tagmod
        from imgbuild.registry.client import RegistryClient

        self.host, self.repo = tagmod.repository_for(framework, settings.ngc_registry)
        self.client = RegistryClient.for_host(self.host, settings)
        self.cache = tagmod.TagCache(Path(settings.cache_dir) / "registry", settings.tag_cache_ttl)
        try:
            names, age, offline = tagmod.list_tags(self.client, self.repo, self.cache)
        except RegistryUnavailable as exc:
            raise RegistryUnavailable(
                f"{exc}; no tag list of {self.host}/{self.repo} is cached to choose from offline "
                f"(`imgbuild tags {framework} --details` caches one while it answers)"
            ) from None
        self.tags = tagmod.select(names, since=None, variant="none", limit=None)
        self.offline_age = age if offline else None
        self._list_age = age or 0.0

    @property
    def where(self) -> str:
        if self.offline_age is None:
            return f"{self.host}/{self.repo}"
        when = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=self.offline_age)
        return f"{self.host}/{self.repo} as cached {when:%Y-%m-%d %H:%M} UTC (the registry did not answer)"

    def find(self, wanted: str) -> TagInfo:
        """`--base`: `24.05` or `24.05-py3`, a plain tag this registry lists; else one line, exit 2."""
        for info in self.tags:
            if wanted in (info.tag, info.release):
                return info
        newest = ", ".join(i.release for i in self.tags[:5]) or "none"
        raise UsageError(f"--base {wanted[:40]!r}: {self.where} has no such release (newest: {newest})")

    def described(self, infos: list[TagInfo] | None = None) -> Iterator[TagInfo]:
        """Each tag with its facts, newest first; from the cache (skipping tags never described) once the registry
        stops answering."""
        from imgbuild.registry import tags as tagmod

        todo = list(self.tags if infos is None else infos)
        for start in range(0, len(todo), BATCH):
            batch = todo[start : start + BATCH]
            if self.offline_age is None:
                try:
                    tagmod.add_details(self.client, self.repo, batch, self.cache, workers=BATCH)
                    yield from batch
                    continue
                except RegistryUnavailable:
                    self.offline_age = self._list_age
            for info in batch:
                cached = self.cache.get_described(self.host, self.repo, info.tag)
                if cached is not None:
                    yield cached


def host_fleet(settings: Settings, for_gpus: str | None, driver: str | None) -> Fleet:
    """`--for` (and `--driver`); else the site's fleet and this host's GPUs, as `build` judges promotion. A host
    with NVIDIA devices whose GPUs cannot be read is an environment problem, not a GPU-less host."""
    from imgbuild.gpu.engine_read import EngineGpus
    from imgbuild.gpu.fleet import check_driver, parse_targets
    from imgbuild.gpu.read import NoGpus, gpu_devices_present, read_devices
    from imgbuild.pipeline.smoke import declared_fleet

    driver = check_driver(driver)
    if for_gpus is not None:
        targets = parse_targets(for_gpus)
        with_driver = f" with driver {driver}" if driver else ""
        return Fleet(tuple(targets), driver, f"--for {','.join(t.label for t in targets)}{with_driver}")
    if driver:
        raise UsageError("--driver goes with --for")
    try:
        readings, _ = read_devices(settings.gpu_snapshot)
    except NoGpus as exc:
        if not settings.gpu_snapshot and gpu_devices_present():
            raise EnvironmentProblem(
                f"this host has NVIDIA GPUs but imgbuild cannot read them ({str(exc)[:160]}): give --for GPU[,GPU] "
                "--driver VERSION, or --base TAG"
            ) from None
        readings = []
    targets, fleet_driver = declared_fleet(settings, [], EngineGpus(bool(readings), "local", readings))
    said = " and ".join(
        part
        for part in (
            "the site's fleet" if settings.fleet_gpus else "",
            "every GPU of this host" if readings else "",
        )
        if part
    )
    with_driver = f" with driver {fleet_driver}" if fleet_driver else ""
    return Fleet(tuple(targets), fleet_driver, (said or "any GPU") + with_driver)


def choose_base(settings: Settings, framework: str, fleet: Fleet, base: str | None) -> Choice:
    """The release `init` writes: `base` when given (it must be on the registry; judged, never refused, when the
    fleet is known), else the newest the fleet runs; with no fleet known, the newest."""
    catalogue = Catalogue(settings, framework)
    where = catalogue.where
    if base is not None:
        info = catalogue.find(base)
        if not fleet.targets and not fleet.driver:
            return Choice(info.release, "chosen with --base", f"{info.tag} ({where})")
        described = list(catalogue.described([info]))
        if not described:
            return Choice(info.release, "chosen with --base (not judged: no facts cached)", f"{info.tag} ({where})")
        runs, why = judge_base(described[0], fleet)
        verdict = f"{fleet.said} can run it" if runs else f"WARNING: {fleet.said} cannot run it"
        return Choice(info.release, f"chosen with --base; {verdict}", f"{info.tag}: {why} ({catalogue.where})")
    if not catalogue.tags:
        raise EnvironmentProblem(f"{where} lists no {framework} release to start from; give --base TAG")
    if not fleet.targets and not fleet.driver:
        newest = catalogue.tags[0]
        return Choice(
            newest.release,
            "the newest release (no GPU on this host: --for GPU[,GPU] chooses for the GPUs it will run on)",
            f"{newest.tag} ({where})",
        )
    choice = choose(catalogue.described(), fleet, lambda: catalogue.where)
    if catalogue.offline_age is not None:  # the recipe says the choice was made from an old list
        return dataclasses.replace(choice, why=f"{choice.why}; from {catalogue.where}")
    return choice
