"""CI rebuilds: rebuild exactly the images whose inputs changed, in dependency order, push them, report.

An image is stale when its labels (or the registry's copy, with --push) disagree with the plan:
the recipe or a copied file changed, the base moved to another digest, or the build IDs changed.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Hashable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from imgbuild import imageref
from imgbuild.config.settings import Settings
from imgbuild.engine import ImageEngine
from imgbuild.errors import ImgbuildError, Problem, RecipeError, UsageError
from imgbuild.facts import Label
from imgbuild.hostio.tree import TooDeep, walk
from imgbuild.imageref import DIGEST_RE
from imgbuild.pipeline.context import context_path
from imgbuild.pipeline.plan import Plan
from imgbuild.pipeline.publish import remote_build
from imgbuild.recipe import ci_path, display_path, load_recipe

if TYPE_CHECKING:
    from imgbuild.pipeline.smoke import ClaimsOf
    from imgbuild.recipe import LoadedRecipe
    from imgbuild.supply.attest import PublicKey, Signer

#: What two recipes may not share: a context folder, or a target.
Shared = TypeVar("Shared", bound=Hashable)

FRESH, STALE, BUILT, FAILED, SKIPPED, INVALID = "fresh", "stale", "built", "failed", "skipped", "invalid"


@dataclass
class Item:
    path: Path
    target: str = ""
    base_ref: str = ""
    deps: list[str] = field(default_factory=list)  # targets of other recipes this one builds on
    status: str = ""
    reasons: list[str] = field(default_factory=list)
    error: str = ""
    image_id: str = ""
    pushed: str = ""
    seconds: float = 0.0
    context: Path | None = None
    problems: list[Problem] = field(default_factory=list)  # an invalid recipe's, each at its file, line and column

    @property
    def name(self) -> str:
        return display_path(self.path)

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.name,
            "image": self.target,
            "status": self.status,
            "reasons": self.reasons,
            "error": self.error,
            "image_id": self.image_id,
            "pushed_digest": self.pushed,
            "depends_on": self.deps,
            "seconds": round(self.seconds, 2),
        }


def discover(paths: list[str]) -> list[Path]:
    """The recipes `paths` name (files, and the *.yaml and *.yml files under folders), each once; every one a
    path CI may pass on (ci_path), since what is found here reaches plans, reports and child pipelines."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            try:
                tree = list(walk(path))
            except TooDeep as exc:
                raise UsageError(str(exc)) from None
            found += sorted(Path(f, n) for f, _, names in tree for n in names if n.endswith((".yaml", ".yml")))
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"{raw}: no such recipe or folder")
    for path in found:
        ci_path(display_path(path))
    return list(dict.fromkeys(p.resolve() for p in found))


def _normal(ref: str) -> str:
    return imageref.parse(ref).normal()


def load_graph(paths: list[Path], settings: Settings) -> list[Item]:
    """Load every recipe and link those whose base is another recipe's image. Order: dependencies first."""
    from imgbuild.pipeline.plan import base_reference, image_and_tag

    items: list[Item] = []
    for path in paths:
        item = Item(path)
        try:
            loaded = load_recipe(path, secrets=settings.secrets())
            image, tag = image_and_tag(loaded, settings)
            item.target = f"{image}:{tag}"
            item.context = context_path(loaded.recipe.name, loaded.root, settings).resolve()
            repo, _, base_tag = base_reference(loaded, settings)
            item.base_ref = f"{repo}:{base_tag}" if base_tag else repo
        except RecipeError as exc:
            item.status, item.error, item.problems = INVALID, "; ".join(exc.lines()), exc.problems
        items.append(item)
    _refuse_shared_contexts(items, settings)
    by_target = {_normal(i.target): i for i in items if i.target}
    for item in items:
        parent = by_target.get(_normal(item.base_ref)) if item.base_ref else None
        if parent is not None and parent is not item:
            item.deps.append(parent.target)
    return _topological(items)


def _refuse_shared_contexts(items: list[Item], settings: Settings) -> None:
    """Two recipes with one `name` would share images/<name>/ (context, lock, smoke report); two that build
    one image:tag would each replace the other's image (and its -previous) on every run: refuse them all."""
    _refuse_sharing(
        items,
        lambda i: i.context,
        lambda names, context: (
            f"{names} share the name {context.name!r} and so {context}; give each recipe its "
            "own name (two tags of one image: distinct names and image: REPO:TAG)"
        ),
    )
    _refuse_sharing(
        items,
        lambda i: _normal(i.target) if i.target else None,
        lambda names, target: f"{names} all build {target}: each would replace the other's image; give each a tag",
    )


def _refuse_sharing(
    items: list[Item], key: Callable[[Item], Shared | None], message: Callable[[str, Shared], str]
) -> None:
    groups: dict[Shared, list[Item]] = {}
    for item in items:
        shared = key(item) if item.status != INVALID else None
        if shared is not None:
            groups.setdefault(shared, []).append(item)
    for shared, sharing in groups.items():
        if len(sharing) > 1:
            names = ", ".join(i.name for i in sharing)
            for item in sharing:
                item.status, item.error = INVALID, message(names, shared)


def _topological(items: list[Item]) -> list[Item]:
    """Each item after the items it builds on; a cycle is named. Iterative: a chain of any length is no recursion."""
    by_target = {i.target: i for i in items}
    ordered: list[Item] = []
    state: dict[str, str] = {}
    for root in items:
        stack: list[tuple[Item, int]] = [(root, 0)]
        while stack:
            item, at = stack.pop()
            if at == 0 and state.get(item.name) == "done":
                continue
            if at == 0 and state.get(item.name) == "visiting":
                chain = [i.name for i, _ in stack if state.get(i.name) == "visiting"]
                raise UsageError("recipes build on each other in a cycle: " + " -> ".join([*chain, item.name]))
            state[item.name] = "visiting"
            if at < len(item.deps):
                stack += [(item, at + 1), (by_target[item.deps[at]], 0)]
                continue
            state[item.name] = "done"
            ordered.append(item)
    return ordered


def staleness(
    plan: Plan,
    engine: ImageEngine,
    settings: Settings,
    push: bool,
    verifier: PublicKey | None = None,
    needed_here: bool = False,
) -> list[str]:
    """Why the image for `plan` must be built; empty when it is current (and, with `verifier`, the signer's public
    key, signed there by it). With `push`, an image this engine never built is current when the registry's copy is
    this plan's build (a fresh CI runner has nothing to do), unless another recipe of the run builds on it here."""
    reasons: list[str] = []
    image = engine.images.image(plan.target)
    labels = image.labels if image else {}
    wanted = wanted_arches(plan, engine)
    if image is None and push and not needed_here and not _registry_gaps(plan, settings, verifier, wanted, engine):
        return []
    if image is None:
        reasons.append("never built here")
    else:
        if labels.get(Label.RECIPE_HASH) != plan.content_hash:
            reasons.append("recipe or its files changed")
        old_base = labels.get(Label.BASE_DIGEST, "")
        if old_base != plan.base.identity:
            reasons.append(f"base {plan.base.ref} moved: {old_base[7:19] or '?'} -> {plan.base.identity[7:19]}")
        if not reasons and labels.get(Label.INPUT_HASH) != plan.input_hash:
            reasons.append("build inputs changed (user IDs)")
        reasons += [f"no linux/{arch} image of these inputs here" for arch in sorted(_local_gaps(plan, engine, wanted))]
    if push and not reasons:
        reasons += _registry_gaps(plan, settings, verifier, wanted, engine)
    return reasons


def _registry_gaps(
    plan: Plan, settings: Settings, verifier: PublicKey | None, wanted: set[str], engine: ImageEngine
) -> list[str]:
    """Why the registry's copy of `plan`'s target is not this plan's build (signed there by `verifier`'s key where
    one is given, for every wanted architecture); [] where it is."""
    there = remote_build(plan.target, settings, verifier)
    if there is None or there.input_hash != plan.input_hash:
        return ["not in the registry" if there is None else "the registry has another build"]
    if verifier is not None and not there.signed:
        return ["pushed, but not signed there by this key"]
    if gaps := missing_arches(there.platforms, wanted, engine):
        return [f"the registry's copy has no linux/{', linux/'.join(gaps)} image"]
    return []


def wanted_arches(plan: Plan, engine: ImageEngine) -> set[str]:
    """The CPU architectures `plan`'s recipe is built for: its `platforms`, else the engine's own."""
    from imgbuild.platforms import arch_of

    return {arch_of(p) for p in plan.loaded.recipe.platforms} or {arch_of(engine.host_platform())}


def missing_arches(there: tuple[str, ...], wanted: set[str], engine: ImageEngine) -> list[str]:
    """What a registry copy lacks of `wanted` (`there`: a manifest list's architectures; () one image, taken to be
    the engine's own platform's)."""
    from imgbuild.platforms import arch_of

    return sorted(wanted - (set(there) or {arch_of(engine.host_platform())}))


def _local_gaps(plan: Plan, engine: ImageEngine, wanted: set[str]) -> set[str]:
    """The foreign architectures whose `<tag>-<arch>` image here is missing or of other inputs."""
    from imgbuild.platforms import arch_of
    from imgbuild.reserved import platform_tag

    own = arch_of(engine.host_platform())
    gaps = set()
    for arch in wanted - {own}:
        image = engine.images.image(f"{plan.image}:{platform_tag(plan.tag, arch)}")
        if image is None or image.labels.get(Label.INPUT_HASH) != plan.input_hash:
            gaps.add(arch)
    return gaps


@dataclass
class RebuildOptions:
    check: bool = False
    push: bool = False
    jobs: int = 1
    backend: str | None = None
    dry_run: bool = False
    plan: bool = False  # judged for runners that each pull what they build on (fanout), not for this machine
    signer: Signer | None = None  # sign each pushed image and attach its provenance and SBOM
    claims: ClaimsOf | None = None  # who else holds which GPU on the host (the smoke tests' choice)


def run(
    paths: list[str], settings: Settings, options: RebuildOptions, log: Callable[[str], None], engine: ImageEngine
) -> list[Item]:
    """Plan every recipe in dependency order, build the stale ones (in parallel where independent)."""
    items = load_graph(discover(paths), settings)
    local_refs = frozenset(i.base_ref for i in items if i.deps)
    _schedule(items, lambda item: _work(item, settings, options, engine, local_refs, log), options.jobs)
    return items


def _work(
    item: Item,
    settings: Settings,
    options: RebuildOptions,
    engine: ImageEngine,
    local_refs: frozenset[str],
    log: Callable[[str], None],
) -> Item:
    """Plan one recipe; build (and push) it when stale. Any failure fails this image, not the run."""
    from imgbuild.pipeline.build import BuildJob, PublishTo, build_job
    from imgbuild.pipeline.resolve import plan_recipe

    start = time.monotonic()
    verifier = options.signer.public_key() if options.signer is not None else None  # what a copy is signed by
    try:
        plan = plan_recipe(
            load_recipe(item.path, secrets=settings.secrets()), settings, engine, local_refs=local_refs, fresh=True
        )
        item.reasons = staleness(
            plan,
            engine,
            settings,
            options.push,
            verifier,
            not options.plan and _normal(plan.target) in {_normal(r) for r in local_refs},
        )
        if not item.reasons:
            item.status, item.image_id = FRESH, engine.images.image_id(plan.target) or ""
        elif options.dry_run:
            item.status = STALE
        else:
            log(f"{item.target}: building ({'; '.join(item.reasons)})")
            job = BuildJob(
                plan.loaded,  # for the recipe's platforms, else the engine's own
                backend=options.backend,
                claims=options.claims,
                publish=PublishTo(options.signer) if options.push else None,
                planned=plan,
            )
            made = build_job(job, settings, engine, lambda step: log(f"{item.target}: {step}"))
            item.status, item.image_id, item.pushed = BUILT, made.own().image_id, made.pushed
    except ImgbuildError as exc:
        item.status, item.error = FAILED, "\n".join(exc.lines())
        item.problems = exc.problems if isinstance(exc, RecipeError) else []
    except Exception as exc:  # noqa: BLE001 - an engine or network error fails this image, not the run
        item.status, item.error = FAILED, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    finally:
        item.seconds = time.monotonic() - start
    return item


def _schedule(items: list[Item], work: Callable[[Item], Item], jobs: int) -> None:
    """Run `work` on each item once its bases are done, `jobs` at a time; an item whose base failed (or
    was invalid, or skipped) is skipped, and nothing waits on a base that will never build."""
    jobs = max(1, jobs)
    done: dict[str, Item] = {i.target: i for i in items if i.status == INVALID and i.target}
    pending = [i for i in items if i.status != INVALID]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        running: dict[Future[Item], Item] = {}
        while pending or running:
            for item in list(pending):
                state = _readiness(item, done)
                if state == "skip":
                    item.status, item.error = SKIPPED, f"its base {item.deps[0]} did not build"
                    done[item.target] = item
                    pending.remove(item)
                elif state == "ready" and len(running) < jobs:
                    running[pool.submit(work, item)] = item
                    pending.remove(item)
            if not running:
                for item in pending:  # nothing can start and nothing runs: their bases never will
                    item.status, item.error = SKIPPED, f"its base {item.deps[0] if item.deps else '?'} did not build"
                return
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                item = running.pop(future)
                done[item.target] = future.result()


def _readiness(item: Item, done: dict[str, Item]) -> str:
    bases = [done.get(d) for d in item.deps]
    if any(b is not None and b.status in (FAILED, SKIPPED, INVALID) for b in bases):
        return "skip"
    return "ready" if all(b is not None and b.status in (FRESH, BUILT, STALE) for b in bases) else "wait"


@dataclass
class Report:
    mode: str
    items: list[Item]
    seconds: float

    @property
    def ok(self) -> bool:
        """A failed, invalid or skipped image fails the run; with --check a stale one does too."""
        bad = {FAILED, INVALID, SKIPPED} | ({STALE} if self.mode == "check" else set())
        return not any(i.status in bad for i in self.items)

    def rows(self) -> list[list[str]]:
        return [
            [
                i.name,
                i.target,
                i.status.upper(),
                "; ".join(i.reasons) if i.status not in (FAILED, INVALID) else (i.error.splitlines() or [i.status])[0],
                f"{i.seconds:.1f}s",
            ]
            for i in self.items
        ]

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 2), "mode": self.mode, "images": [i.to_json() for i in self.items]}


def rebuild(
    paths: list[str],
    settings: Settings,
    options: RebuildOptions,
    log: Callable[[str], None],
    engine: ImageEngine | None,
) -> Report:
    """`imgbuild rebuild`: check the contexts (--check: no engine is asked, `engine` None), or plan and build what is
    stale on `engine`."""
    start = time.monotonic()
    if options.check or engine is None:
        items = check_contexts(paths, settings)
    else:
        items = run(paths, settings, options, log, engine)
    mode = "check" if options.check else ("dry-run" if options.dry_run else "build")
    return Report(mode, items, time.monotonic() - start)


def check_contexts(paths: list[str], settings: Settings, rewrite: bool = False) -> list[Item]:
    """`rebuild --check`: compare images/<name>/ with what the recipes render to now. Builds nothing.

    The base is taken as recorded in each context's lock, so the check needs no registry and flags only
    recipes (or copied files, or templates) that changed without their rendered context. `rewrite`: a stale
    context is written anew against its recorded base (after a change to imgbuild's templates)."""
    from imgbuild.pipeline.plan import image_and_tag

    items = []
    loaded_by_item: dict[int, LoadedRecipe] = {}
    for path in discover(paths):
        item = Item(path)
        items.append(item)
        try:
            loaded = load_recipe(path, secrets=settings.secrets())
        except RecipeError as exc:
            item.status, item.error, item.problems = INVALID, "; ".join(exc.lines()), exc.problems
            continue
        loaded_by_item[id(item)] = loaded
        item.context = context_path(loaded.recipe.name, loaded.root, settings).resolve()
        image, tag = image_and_tag(loaded, settings)
        item.target = f"{image}:{tag}"
    _refuse_shared_contexts(items, settings)
    for item in items:
        if item.status != INVALID:
            _check_one(item, loaded_by_item[id(item)], settings, rewrite)
    return items


def _check_one(item: Item, loaded: LoadedRecipe, settings: Settings, rewrite: bool = False) -> None:
    """Judge the committed context; a stale one says the cure: render the recipe, commit what it wrote."""
    _judge_context(item, loaded, settings, rewrite)
    if item.status == STALE:
        context = display_path(context_path(loaded.recipe.name, loaded.root, settings))
        item.reasons.append(f"cure: imgbuild render {shlex.quote(item.name)}, then commit {context}")


def _judge_context(item: Item, loaded: LoadedRecipe, settings: Settings, rewrite: bool = False) -> None:
    """Render the recipe against the base its lock records, and compare with the committed context."""
    from imgbuild.pipeline.context import diff_context
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.pipeline.record import RECORD_FILE, Record

    who = settings.caller
    from imgbuild.pipeline.render import render, template_cache

    ctx = context_path(loaded.recipe.name, loaded.root, settings)
    item.target = str(ctx)
    lock_path = ctx / RECORD_FILE
    if ctx.is_symlink() or ctx.parent.is_symlink():
        item.status, item.reasons = STALE, [f"{ctx} is a symbolic link, not a rendered context"]
        return
    if not lock_path.is_file():
        item.status, item.reasons = STALE, [f"{ctx} was never rendered (imgbuild render {item.name}; commit it)"]
        return
    try:
        record = Record.read(lock_path)
    except ValueError:
        item.status, item.reasons = STALE, [f"{lock_path} is not a record imgbuild wrote (render it again)"]
        return
    base, config = record.base, {"config": {"Env": record.base.env()}}
    digest = base.digest if DIGEST_RE.fullmatch(base.digest) else ""
    registry_host = base.reference().host or settings.ngc_registry
    pinned = dataclasses.replace(settings, ngc_registry=registry_host, user=record.namespace)
    try:
        plan = make_plan(
            loaded,
            pinned,
            lambda ref: (digest, config),  # the base as recorded, not as the registry says today
            lambda repo, framework, pattern: base.reference().tag,
            (who.uid, who.gid),  # as `imgbuild render` by this user would
        )
    except RecipeError as exc:
        item.status, item.error, item.problems = INVALID, "; ".join(exc.lines()), exc.problems
        return
    context = render(plan, record.backend, template_cache(settings.cache_dir))
    diff = diff_context(context, ctx)
    if diff and rewrite:
        from imgbuild.pipeline.context import write_context

        write_context(context, ctx)
        diff = diff_context(context, ctx)
    item.status = STALE if diff else FRESH
    if diff:
        item.reasons = [f"{ctx} differs from the recipe: {', '.join(diff[:4])}" + (" ..." if len(diff) > 4 else "")]
