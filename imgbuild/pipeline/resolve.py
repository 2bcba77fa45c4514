"""Where the facts about a recipe's base come from: the registry (digest and image config, no pull), a
local image when offline or when the base is another recipe's image, or a context's lock (for
`rebuild --check`, which needs no registry). Each source is an `InspectBase` for `plan.make_plan`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild import limits
from imgbuild.config.settings import Settings
from imgbuild.errors import ImgbuildError, RecipeError, RegistryUnavailable
from imgbuild.hostio.cache import JsonCache
from imgbuild.payload.probes import BASE_PINS
from imgbuild.pipeline.plan import BasePins, Plan, make_plan
from imgbuild.recipe import LoadedRecipe

if TYPE_CHECKING:
    from imgbuild.pipeline.plan import BaseImage, ReadPins

if TYPE_CHECKING:  # the engine and the registry client are imported where they are used: render stays cheap
    from imgbuild.engine import ImageEngine


def base_answers(settings: Settings, ttl: float | None) -> JsonCache:
    """The registry's answers on bases (digest and config), by reference, fresh for `ttl` seconds."""
    return JsonCache(Path(settings.cache_dir) / "bases", ttl)


def base_pins(settings: Settings) -> JsonCache:
    """Each base's pins, by digest (the pins of one base never change)."""
    return JsonCache(Path(settings.cache_dir) / "base-pins", None, 16 * limits.MIB)


def _answer_in(kept: Any) -> tuple[str, dict[str, Any]] | None:
    """(digest, config) of a cached registry answer; None for an entry of any other shape."""
    if isinstance(kept, dict) and isinstance(kept.get("config"), dict):
        return str(kept.get("digest", "")), kept["config"]
    return None


def registry_inspector(
    settings: Settings,
    engine: ImageEngine | None = None,
    local_refs: frozenset[str] = frozenset(),
    fresh: bool = False,
) -> Callable[[str], tuple[str, dict]]:
    """Base inspection: the registry first (digest + config, no pull); a local image when offline.

    `local_refs` are images this run builds itself (another recipe's target): always the local image,
    pinned by id, so pushing it later does not make its dependents look stale. A registry answer is kept
    `base_cache_ttl` seconds (the edit-render-build loop asks the same question many times a minute);
    `fresh` (rebuild) always asks."""
    from imgbuild import imageref

    clients: dict[str, Any] = {}

    def inspect(ref: str) -> tuple[str, dict[str, Any]]:
        if engine and ref in local_refs:
            local = engine.images.inspect_local(ref)
            if local is not None:
                return "", local[1]
        parsed = imageref.parse(ref)
        if engine and "/" in ref and not parsed.host:
            # An unqualified `lab/house:v1` that the engine has is a local build (another recipe's
            # image): pin it by image id rather than asking Docker Hub about a name it never saw.
            local = engine.images.inspect_local(ref)
            if local is not None:
                return local[0], local[1]
        cache = base_answers(settings, 0 if fresh else settings.base_cache_ttl)
        if (kept := _answer_in(cache.get(ref))) is not None:
            return kept
        from imgbuild.registry.client import RegistryClient
        from imgbuild.registry.manifest import split_reference

        host, repo, reference = split_reference(ref)
        client = clients.setdefault(host, RegistryClient.for_host(host, settings))
        try:
            manifest, config = client.image_config(repo, reference)
        except RegistryUnavailable:
            local = engine.images.inspect_local(ref) if engine else None
            if local is None:
                raise
            return local[0] or "", local[1]
        cache.put(ref, {"digest": manifest.digest, "config": config})
        return manifest.digest, config

    return inspect


def tag_resolver(settings: Settings) -> Callable[[str, str | None, str], str]:
    def resolve(repo_ref: str, framework: str | None, pattern: str) -> str:
        from imgbuild.ngc import newest_matching
        from imgbuild.registry.client import RegistryClient
        from imgbuild.registry.manifest import split_reference

        host, repo, _ = split_reference(repo_ref + ":x")
        tags = RegistryClient.for_host(host, settings).tags(repo)
        found = newest_matching(framework, pattern, tags)
        if not found:
            raise ImgbuildError(f"no tag of {repo_ref} matches {pattern!r} ({len(tags)} tags listed)")
        return found

    return resolve


def plan_file(path: Path, settings: Settings, offline: bool = False) -> Plan:
    """Load and plan the recipe at `path` for `render` and `validate`-like commands: the registry pins the base by
    digest unless `offline`; an unreachable registry says how to go on without it."""
    from imgbuild.recipe import load_recipe

    loaded = load_recipe(path, secrets=settings.secrets())
    try:
        return plan_recipe(loaded, settings, offline=offline)
    except RegistryUnavailable as exc:
        raise RegistryUnavailable(f"{exc} (--offline renders without pinning the base by digest)") from None


def plan_recipe(
    loaded: LoadedRecipe,
    settings: Settings,
    engine: ImageEngine | None = None,
    offline: bool = False,
    local_refs: frozenset[str] = frozenset(),
    with_pins: bool = False,
    fresh: bool = False,
) -> Plan:
    """The plan, from the registry (or local images). `with_pins` (a build, a lock) also reads the base's
    pins in the base image, so every requirement that one of them excludes is reported before the build."""
    inspect = None if offline else registry_inspector(settings, engine, local_refs, fresh)
    read_pins = pin_reader(settings, engine) if with_pins and engine is not None and not offline else None
    who = settings.caller
    resolve = None if offline else tag_resolver(settings)
    with cures_checked(loaded, settings, offline):
        return make_plan(loaded, settings, inspect, resolve, (who.uid, who.gid), read_pins)


@contextlib.contextmanager
def cures_checked(loaded: LoadedRecipe, settings: Settings, offline: bool = False) -> Iterator[None]:
    """A refusal whose cure names a package or extra not known to exist (the CUDA 13 build of faiss-gpu-cu12,
    spacy[cuda13x]) is printed
    with that cure only where the recipe's index has it; with the other cure where it does not; marked unchecked
    where the index cannot be asked."""
    try:
        yield
    except RecipeError as err:
        if not any(p.needs for p in err.problems):
            raise
        from imgbuild.pipeline.baserules import extra_cure
        from imgbuild.registry.pypi import PYPI, extras_of, has_need

        index = loaded.recipe.pip.index_url or settings.pip_index_url or PYPI
        verify = settings.pip_ca_bundle or True
        asked: dict[str, bool | None] = {}  # each name once; an index that did not answer is not asked again
        unreachable = offline

        def has(name: str) -> bool | None:
            nonlocal unreachable
            if name not in asked:
                asked[name] = None if unreachable else has_need(index, name, verify=verify)
                unreachable = unreachable or asked[name] is None
            return asked[name]

        problems = []
        for problem in err.problems:
            found = has(problem.needs) if problem.needs else None
            hint = problem.otherwise if found is False else problem.hint
            if found is False and "[" in problem.needs:  # an extra it lacks: name what its other extra brings
                extras = extras_of(index, problem.needs.split("[")[0], verify=verify) or {}
                hint = extra_cure(problem.needs, extras, has) or hint
            if found is None and problem.needs:
                hint += f"; the index could not be asked whether it has {problem.needs}"
            problems.append(dataclasses.replace(problem, hint=hint, needs="", otherwise=""))
        raise RecipeError(problems) from None


# --- the base's pins: what install.sh will hold the base's packages at -----------------------------------


class NotKnownHere(ImgbuildError):
    """The base has not been read on this host yet (validate asks nothing of the registry or the engine)."""


def check_known(loaded: LoadedRecipe, settings: Settings) -> str:
    """`validate`'s second half: the recipe against what this host already knows of its base (the config and
    pins an earlier render, lock or build read, whatever their age), with no registry and no engine. Raises
    RecipeError as the build would; returns what it checked against, or why it could not."""

    def inspect(ref: str) -> tuple[str, dict[str, Any]]:
        if (kept := _answer_in(base_answers(settings, None).get(ref))) is not None:
            return kept
        raise NotKnownHere(ref)

    def read_pins(base: BaseImage) -> BasePins:
        return (_pins_in(base_pins(settings).get(base.identity)) if base.identity else None) or BasePins()

    def pattern(repo: str, framework: str | None, tag: str) -> str:
        raise NotKnownHere(f"{repo}:{tag}")

    try:
        with cures_checked(loaded, settings):
            plan = make_plan(loaded, settings, inspect, pattern, (0, 0), read_pins)
    except NotKnownHere as exc:
        return f"its base ({exc}) not read on this host yet: render, lock or build check it"
    pins = f", its pins ({plan.base.pins_origin})" if plan.base.pins_origin else ""
    return f"checked against the base as last read here: {plan.base.pinned}{pins}"


def pin_reader(settings: Settings, engine: ImageEngine) -> ReadPins:
    """Reads a base's pins in a throwaway container of the base (pulled if need be; the build needs it
    anyway), cached per base digest. A base whose pins cannot be read gives none: pip still checks them."""

    def read(base: BaseImage) -> BasePins:
        key = base.identity or ""  # a digest: the pins of one base never change
        cache = base_pins(settings)
        found = _pins_in(cache.get(key)) if key else None
        if found is not None:
            return found
        # the same source install.sh uses (imgbuild/payload/base_pins.py), read only where a base is read
        from imgbuild.hostio.acting import container_user

        probe = BASE_PINS.probe()
        try:
            if engine.images.image(base.pinned) is None:
                engine.images.pull(base.pinned)
            _, output, _ = engine.containers.run_script(
                base.pinned, probe, [], {}, gpus=None, timeout=300, as_user=container_user(settings)
            )
        except (ImgbuildError, OSError):
            return BasePins()
        found = _pins_in(probe.answer(output))
        if found is None:
            return BasePins()
        if key:
            requires = {name: list(lines) for name, lines in found.requires.items()}
            cache.put(key, {"origin": found.origin, "lines": list(found.pins), "requires": requires})
        return found

    return read


def _pins_in(data: Any) -> BasePins | None:
    """The pins probe's answer (or the cache's copy of it), bounded; None when it is not one. Requirements are
    keyed by canonical name here (the probe sends each distribution's name as the base spells it; the first of a
    name counts). An answer without them (a cache an older imgbuild wrote) is still the base's pins."""
    from packaging.utils import canonicalize_name

    if not isinstance(data, dict) or not isinstance(data.get("origin"), str) or not isinstance(data.get("lines"), list):
        return None
    table = data.get("requires")
    requires: dict[str, tuple[str, ...]] = {}
    for name, lines in list(table.items())[:5000] if isinstance(table, dict) else []:
        if isinstance(name, str) and isinstance(lines, list):
            requires.setdefault(str(canonicalize_name(name[:200])), tuple(str(line)[:500] for line in lines[:300]))
    return BasePins(data["origin"][:200], tuple(str(line)[:500] for line in data["lines"][:20000]), requires)
