"""The pipeline, top to bottom: recipe -> plan -> build context -> engine build -> smoke -> promote.

Promotion loses nothing: the image is built under a candidate tag, smoke-tested, and only then moved to
`<user>/<name>:<tag>`; the image it replaces stays reachable as `:<tag>-previous`. A failed build or smoke
test leaves the target tag exactly as it was. A lock keeps two builds of one target apart.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild import limits
from imgbuild.config.settings import Settings
from imgbuild.engine import BuildRequest, ImageEngine, Redactor
from imgbuild.engine.lease import lease
from imgbuild.errors import BuildFailed, EnvironmentProblem, ImgbuildError, SmokeFailed, UsageError
from imgbuild.facts import Label
from imgbuild.hostio.acting import Acting, as_user, private_copy, write_as
from imgbuild.hostio.host import Caller, engine_token, token_state
from imgbuild.pipeline import spared
from imgbuild.pipeline.context import context_dir, write_context
from imgbuild.pipeline.plan import Plan, base_reference, with_base_pins
from imgbuild.pipeline.publish import PublishRequest, publish, publish_platforms
from imgbuild.pipeline.render import render, template_cache
from imgbuild.pipeline.resolve import pin_reader, plan_recipe
from imgbuild.pipeline.scratch import cache_subdir, pip_bounds, source_date_epoch, writable_dir
from imgbuild.pipeline.secrets import backend_secrets, build_secrets, needs_buildkit
from imgbuild.pipeline.smoke import (
    ClaimsOf,
    QuotaCheck,
    SmokeReport,
    SmokeRequest,
    add_fleet_check,
    declared_fleet,
    host_gpus,
    run_smoke,
)
from imgbuild.platforms import arch_of
from imgbuild.recipe import LoadedRecipe
from imgbuild.registry.auth import engine_auth
from imgbuild.registry.pypi import PYPI
from imgbuild.reserved import CANDIDATE_PREFIX, platform_tag, previous_ref

if TYPE_CHECKING:
    from imgbuild.supply.attest import Signer


@dataclass
class BuildResult:
    plan: Plan
    image_id: str
    previous_id: str | None
    promoted: bool
    smoke: SmokeReport | None
    context: Path
    log_path: Path
    platform: str = ""  # a foreign platform's build (promoted_ref): "" the engine's own

    @property
    def target(self) -> str:
        """The tag this build is promoted to: the recipe's target, or a foreign platform's (promoted_ref)."""
        return promoted_ref(self.plan, self.platform)

    def to_json(self) -> dict[str, Any]:
        return {
            "image": self.target,
            "platform": self.platform or None,
            "image_id": self.image_id,
            "previous_id": self.previous_id,
            "promoted": self.promoted,
            "context": str(self.context),
            "log": str(self.log_path),
            "input_hash": self.plan.input_hash,
            "base": self.plan.base.pinned,
            "smoke": self.smoke.to_json() if self.smoke else None,
        }


@dataclass(frozen=True)
class PublishTo:
    """A build to be pushed to its target's registry (a manifest list where several platforms were built), with its
    smoke record; with a `signer`, signed there, its provenance and SBOM attached. A build to be pushed is seeded
    from the registry's copy of its target, so a fresh CI runner re-runs only what changed (`registry_cache`)."""

    signer: Signer | None = None


@dataclass(frozen=True)
class BuildJob:
    """One recipe's build, made once by the command line or CI: every platform built and smoke-tested, promoted,
    then published where `publish` says (build_job).

    `platforms`: platforms.parse_platforms' answer; () the recipe's `platforms:`, else the engine's own.
    `planned`: the recipe's plan where the caller has made it already (rebuild, to judge staleness), without the
    base's pins. `acting`: through sudo for a user (enforce.acting): their files read and written as they may, the
    image only in their namespace. `claims`: who else holds which GPU on the host (smoke.ClaimsOf); `quota`: a
    user's smoke test counted as a run of theirs. `reproducible`: every time in the image SOURCE_DATE_EPOCH (0 when
    unset), so the same inputs give the same digest (Podman). `promote=False`: built and smoke-tested, the target
    left as it was (rebuild --verify-reproducible)."""

    recipe: LoadedRecipe
    platforms: tuple[str, ...] = ()
    backend: str | None = None
    require_gpu: bool = False
    skip_gpu: bool = False
    no_cache: bool = False
    out: Path | None = None
    acting: Acting | None = None
    claims: ClaimsOf | None = None
    quota: QuotaCheck | None = None
    reproducible: bool = False
    promote: bool = True
    publish: PublishTo | None = None
    planned: Plan | None = None


def _lock_name(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()[:24] + ".lock"


@contextmanager
def build_lock(settings: Settings, plan: Plan, ctx: Path, progress: Callable[[str], None]) -> Any:
    """Serialise builds that share a context folder or a target (two recipes with one `name` and two tags
    share `images/<name>/`); locks are taken in one order, so two builds never wait on each other."""
    from filelock import FileLock, Timeout

    lock_dir = Path(settings.cache_dir) / "locks"
    writable_dir(lock_dir)
    keys = sorted({f"context:{ctx.resolve()}", f"target:{plan.target}"})
    with ExitStack() as stack:
        for key in keys:
            lock = FileLock(str(lock_dir / _lock_name(key)))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                progress(f"waiting for another build of {plan.target} (or of {ctx}) to finish")
                lock.acquire(timeout=6 * 3600)
            stack.callback(lock.release)
        yield


def registry_cache(plan: Plan, settings: Settings, backend: str, seed: bool, engine: str = "docker") -> dict[str, Any]:
    """BuildRequest's cache fields: BuildKit images always carry their inline cache (unless `registry_cache: off`);
    a build to be pushed is seeded from the registry's copy of its target, and with `registry_cache: registry`
    (a buildx builder) from and to `<image>:imgbuild-cache`, every stage's cache (mode=max).
    Podman, a build to be pushed (`inline` or `registry`): Buildah's registry cache, every step's layer pushed
    to and pulled from the repository `<image>-imgbuild-cache`, with the push's credentials."""
    if settings.registry_cache == "off" or backend != "buildkit":
        return {}
    if engine == "podman":
        from imgbuild.engine.podman import cache_repository

        cache = cache_repository(plan.image)
        return {"cache_from": (cache,), "cache_to": cache, "cache_auth": engine_auth(cache)} if seed else {}
    fields: dict[str, Any] = {"inline_cache": True}
    if seed:
        fields["cache_from"] = (plan.target,)
        if settings.registry_cache == "registry":
            fields["cache_to"] = f"{plan.image}:imgbuild-cache"
    return fields


def _seed(engine: ImageEngine, target: str, progress: Callable[[str], None]) -> None:
    """A fresh runner pulls the registry's copy of `target` before a seeded build. Docker's built-in BuildKit,
    given an inline cache it has not pulled, re-exports no cache for the layers it took from it, so the next
    runner misses every other time (moby/buildkit#1981, #2274); pulled first, every build hits. The local tag was
    absent, so the pull replaces nothing; a registry without the image yet is no error."""
    if engine.images.image_id(target) is not None:
        return
    progress(f"pulling {target} to seed the build cache")
    try:
        engine.images.pull(target)
    except ImgbuildError as exc:
        progress(f"nothing to seed from ({str(exc)[:120]})")


def _build_platform(
    job: BuildJob,
    settings: Settings,
    engine: ImageEngine,
    progress: Callable[[str], None],
    plan: Plan | None,
    platform: str,
) -> BuildResult:
    """One platform's pass of `job`: plan (unless `plan`, made by the caller or by an earlier platform's pass),
    render, build under a candidate tag, smoke-test, promote. A build to be pushed (`job.publish`) is seeded from
    the registry's copy of its target. `platform`: one of platforms.PLATFORMS ("" the engine's own);
    another than the engine's own (linux/arm64 on an amd64 runner) is built and smoke-tested under emulation, with no
    registry seed and nothing spared, and promoted as `<tag>-<arch>` (promoted_ref): the target keeps the engine's
    own platform's image."""
    loaded, acting = job.recipe, job.acting
    who = acting.who if acting else None
    if acting:
        repo, _, base_tag = base_reference(loaded, settings)
        acting.check_image(f"{repo}:{base_tag}" if base_tag else repo, "base")
    foreign = foreign_platform(engine, platform)
    seed_from_registry = job.publish is not None and not foreign  # a registry's copy is the engine's own platform's
    chosen = engine.pick_backend(job.backend or settings.backend)
    if chosen == "sdk" and needs_buildkit(settings):
        raise UsageError(
            "pip index settings may carry credentials and need the buildkit backend "
            "(the Engine API builder would bake them into a layer)"
        )
    # Every requirement a base pin excludes is reported now, all at once, not one pip failure per build.
    if plan is None:
        plan = plan_recipe(loaded, settings, engine, with_pins=True)
    else:  # planned by the caller (rebuild, to judge staleness), without the base's pins
        plan = with_base_pins(plan, pin_reader(settings, engine))
    if acting:
        from imgbuild.hostio.acting import check_target

        check_target(acting.who, plan.target)
    redact = Redactor(settings.secrets())
    ctx = context_dir(plan, settings, job.out)
    target = promoted_ref(plan, foreign)
    log_path = Path(settings.cache_dir) / "logs" / (target.replace("/", "_").replace(":", "_") + ".log")
    writable_dir(log_path.parent)
    candidate = candidate_ref(plan.image)
    with build_lock(settings, plan, ctx, progress), ExitStack() as stack:
        sweep_candidates(engine, plan.image)
        current = engine.images.image_id(target)
        cache_scope = f"u{acting.who.uid}" if acting else ""  # a user's build caches are theirs alone
        rendered = render(plan, chosen, template_cache(settings.cache_dir), cache_scope=cache_scope)
        scope = spared.smoke_scope(plan)
        report_name = f"smoke.{arch_of(foreign)}.json" if foreign else "smoke.json"
        with as_user(who):
            known_good = (
                () if foreign else spared.local_known_good(ctx / report_name, current, plan.base.identity, scope)
            )
            write_context(rendered, ctx, settings.secrets())
        if not known_good and current is None and seed_from_registry and settings.registry_cache != "off":
            signer = job.publish.signer if job.publish else None  # a signed push trusts its own key, else the site's
            key = signer.public_key() if signer is not None else spared.trusted_key(settings)
            known_good = spared.registry_known_good(plan, settings, key, scope, progress)
        progress(f"rendered {ctx} ({chosen} backend); base {plan.base.pinned}; log {log_path}")
        source = _private_context(ctx, acting, settings, stack) if acting else ctx
        secrets = build_secrets(settings, loaded.ca_bundle_path, stack, acting)
        pip_step = (source / "imgbuild" / "pip" / "install.sh").is_file()
        backend_secrets(secrets, settings, stack, source, chosen, pip_step)
        iid_fd, iid_name = tempfile.mkstemp(prefix="iid-", dir=cache_subdir(settings, "runs"))
        os.close(iid_fd)
        stack.callback(lambda: Path(iid_name).unlink(missing_ok=True))
        request = BuildRequest(
            context=source,
            tag=candidate,
            secrets=secrets,
            no_cache=job.no_cache,
            log_path=log_path,
            builder=settings.builder,
            iidfile=Path(iid_name),
            timeout=settings.build_timeout,
            **registry_cache(plan, settings, chosen, seed_from_registry, engine.name),
            build_args=_build_args(plan, settings, pip_step and chosen == "sdk"),
            timestamp=source_date_epoch() if job.reproducible else None,
            platform=foreign,
        )
        promoted = False
        try:
            if request.inline_cache and request.cache_from:  # BuildKit's; Buildah pulls each step's own layer
                _seed(engine, plan.target, progress)
            image_id = engine.build(chosen, request, progress, redact)
            check_platform(engine, image_id, foreign or engine.host_platform(), plan.base.pinned)
            progress(f"built {image_id[:19]}; smoke-testing it before it becomes {target}")
            wanted = smoke_request(candidate, job, settings, known_good, foreign)
            host = host_gpus(engine, candidate, settings)  # the engine's host's GPUs, read once for both
            report = run_smoke(engine, wanted, settings, host, job.claims, job.quota, on_step=progress)
            add_fleet_check(report, *declared_fleet(settings, loaded.recipe.smoke.targets, host))
            # a check that promotes nothing (rebuild --verify-reproducible) leaves the promoted image's report be
            report_path = ctx / (report_name if job.promote else "smoke.verify.json")
            _write_report(report_path, report, who=who)
            if not report.ok:
                kept = engine.images.image_id(target)
                raise SmokeFailed(
                    f"{report.summary()}; {target} was left as it was"
                    + (f" ({kept[:19]})" if kept else " (not built before)")
                    + f"; every failure in full: {report_path}; build log: {log_path}"
                )
            if not job.promote:  # rebuild --verify-reproducible: built and smoke-tested, never tagged
                kept = engine.images.image_id(target)
                return BuildResult(plan, image_id, kept, False, report, ctx, log_path, foreign)
            # another run on this engine (a CI runner sharing its socket) may promote or push the target now
            with lease(engine.leases, plan.target, image_id, PROMOTE_SECONDS, progress):
                previous = engine.images.image_id(target)
                if previous and previous != image_id:
                    engine.images.tag(previous, previous_ref(target))
                engine.images.tag(image_id, target)
            promoted = True
            _write_report(
                ctx / report_name, report, {"promoted": image_id, "base": plan.base.identity, "scope": scope}, who
            )
        finally:
            engine.images.untag(candidate)  # on success, failure, Ctrl-C or SIGTERM alike
        changed = promoted and previous != image_id
        return BuildResult(plan, image_id, previous, changed, report, ctx, log_path, foreign)


@dataclass(frozen=True)
class PlatformBuilds:
    """Every platform's build of one recipe, the engine's own platform first where it was asked for; `pushed`: the
    digest the target holds once published ("" where the job publishes nothing)."""

    results: tuple[BuildResult, ...]
    host: str  # the engine's own platform ("" where one platform was built: each result names its own)
    pushed: str = ""

    @property
    def emulated(self) -> bool:
        """Whether any platform is foreign (then a push is a manifest list)."""
        return any(r.platform for r in self.results)

    def platform_of(self, result: BuildResult) -> str:
        return result.platform or self.host

    def own(self) -> BuildResult:
        """The engine's own platform's build, else the first (its smoke report goes into the provenance)."""
        return next((r for r in self.results if not r.platform), self.results[0])


def build_job(
    job: BuildJob, settings: Settings, engine: ImageEngine, progress: Callable[[str], None] = lambda s: None
) -> PlatformBuilds:
    """Run `job` to its end: each platform built, smoke-tested and promoted (build_platforms), then, where
    `job.publish` asks, pushed (and signed): one image, or a manifest list of every platform's."""
    made = build_platforms(job, settings, engine, progress)
    if job.publish is None:
        return made
    own = made.own()
    smoke = own.smoke.to_json() if own.smoke else {}
    backend = job.backend or settings.backend
    request = PublishRequest(own.plan, smoke, settings, engine, backend, job.publish.signer, progress)
    if made.emulated:
        pushed = publish_platforms(request, [(made.platform_of(r), r.image_id) for r in made.results])
    else:
        pushed = publish(request, own.image_id)
    return dataclasses.replace(made, pushed=pushed)


def build_platforms(
    job: BuildJob, settings: Settings, engine: ImageEngine, progress: Callable[[str], None] = lambda s: None
) -> PlatformBuilds:
    """The build half of `job`: each of its platforms (() the recipe's `platforms`, else the engine's own), the
    engine's own first, then the others in the order given, each a whole pass from the one plan. A platform that
    fails stops the run, so a push (build_job) comes only after every one passed."""
    platforms = job.platforms or tuple(job.recipe.recipe.platforms)
    if len(platforms) <= 1:  # one pass, as a build without --platform
        made = _build_platform(job, settings, engine, progress, job.planned, "".join(platforms))
        return PlatformBuilds((made,), "")
    own = engine.host_platform()
    ordered = [p for p in platforms if p == own] + [p for p in platforms if p != own]
    results: list[BuildResult] = []
    for platform in ordered:
        progress(f"{platform}: building" + ("" if platform == own else " under emulation"))
        plan = results[0].plan if results else job.planned
        results.append(_build_platform(job, settings, engine, progress, plan, platform))
    return PlatformBuilds(tuple(results), own)


def smoke_request(
    candidate: str, job: BuildJob, settings: Settings, known_good: tuple[str, ...], emulated: str = ""
) -> SmokeRequest:
    """Stage 5's request for `candidate`: the recipe's `smoke:` section, what may be spared (`known_good`), and
    for a user imgbuild acts for, their GPUs and their identity in the container; `emulated`: a foreign
    platform's image, run under qemu (no GPU)."""
    smoke = job.recipe.recipe.smoke
    return SmokeRequest(
        candidate,
        require_gpu=job.require_gpu or smoke.require_gpu,
        skip_gpu=job.skip_gpu,
        min_speedup=smoke.min_speedup,
        imports=tuple(smoke.imports),
        skip_imports=tuple(smoke.skip_imports),
        commands=tuple(smoke.run),
        accept_pip_check=tuple(smoke.accept_pip_check),
        known_good=known_good,
        import_seconds=math.ceil(settings.smoke_import_timeout),
        gpu_seconds=math.ceil(settings.smoke_gpu_seconds),
        user=job.acting.who.name if job.acting else settings.caller.name,
        emulated=emulated,
        index_url=job.recipe.recipe.pip.index_url or settings.pip_index_url or PYPI,
    )


def foreign_platform(engine: ImageEngine, platform: str) -> str:
    """`platform` where it is not the engine's own ("" where it is, or none was asked for); raises where the engine
    cannot build and run it (Docker without buildx; Podman without qemu registered: exit 3)."""
    if not platform or platform == engine.host_platform():
        return ""
    if refusal := engine.platform_refusal(platform):
        raise EnvironmentProblem(refusal)
    return platform


def check_platform(engine: ImageEngine, image_id: str, platform: str, base: str) -> None:
    """The built image is of the platform asked for: an engine that took a local base of another platform (Podman
    does, where the one asked for is not pulled yet) fails the build here, before any smoke test or promotion."""
    built = (img.architecture if (img := engine.images.image(image_id)) else "") or ""
    if built and platform and built != arch_of(platform):
        raise BuildFailed(
            f"the engine built a linux/{built} image for {platform}: it took a local base of another platform "
            f"(pull {base} for {platform} and build again); nothing was promoted"
        )


def promoted_ref(plan: Plan, foreign: str) -> str:
    """Where a build is promoted: the recipe's target, or for a foreign platform's image `<image>:<tag>-<arch>`
    (`lab/research:24.05-arm64`), so the target stays what runs on this machine."""
    return f"{plan.image}:{platform_tag(plan.tag, foreign)}" if foreign else plan.target


def _build_args(plan: Plan, settings: Settings, sdk_pip_step: bool) -> dict[str, str]:
    """The build's arguments: the image user's IDs (a recipe with `user:`), and the Engine API builder's pip
    bounds (BuildKit's are secrets)."""
    ids = {"IMGBUILD_UID": str(plan.uid), "IMGBUILD_GID": str(plan.gid)} if plan.loaded.recipe.user else {}
    return {**ids, **(pip_bounds(settings) if sdk_pip_step else {})}


#: How long a promotion may hold its target's engine-wide lease (a few tag operations).
PROMOTE_SECONDS = 300


def candidate_ref(image: str) -> str:
    """This run's own candidate of `image`: runs sharing an engine never smoke-test, untag or push each other's."""
    return f"{image}:{CANDIDATE_PREFIX}{engine_token('.')}"


def sweep_candidates(engine: ImageEngine, image: str) -> None:
    """What killed runs of this PID namespace left of `image`: their candidate tags and smoke containers. A run
    elsewhere (another CI runner's container) is never judged gone from here."""
    for tag in engine.images.tags_of(image):
        if tag.startswith(CANDIDATE_PREFIX) and token_state(tag.removeprefix(CANDIDATE_PREFIX), ".") == "gone":
            engine.containers.remove_labelled(Label.SMOKE_OF, f"{image}:{tag}")
            engine.images.untag(f"{image}:{tag}")


def _write_report(
    path: Path, report: SmokeReport, promoted: dict[str, str] | None = None, who: Caller | None = None
) -> None:
    """The smoke report beside the context, written as `who` when acting for them; once promoted, with the image
    and base it vouches for (the next build's import check leaves alone what imported here and did not change:
    `_known_good`)."""
    write_as(who, path, json.dumps({**report.to_json(), **(promoted or {})}, indent=2, sort_keys=True) + "\n")


def _private_context(ctx: Path, acting: Acting, settings: Settings, stack: ExitStack) -> Path:
    """Root's private copy of the context the user's build rendered (acting.private_copy), removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="context-", dir=cache_subdir(settings, "runs")))
    stack.callback(shutil.rmtree, folder, True)
    return private_copy(ctx, folder, acting.who, limits.COPY_BYTES + 64 * limits.MIB, limits.COPY_FILES + 100)
