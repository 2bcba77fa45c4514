"""Where the facts about a recipe's base come from: the registry (digest and image config, no pull), a
local image when offline or when the base is another recipe's image, or a context's lock (for
`rebuild --check`, which needs no registry). Each source is an `InspectBase` for `plan.make_plan`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imgbuild.config import Settings
from imgbuild.engine import ImageEngine
from imgbuild.errors import ImgbuildError, RegistryUnavailable
from imgbuild.plan import Plan, make_plan
from imgbuild.recipe import LoadedRecipe
from imgbuild.registry import RegistryClient, split_reference


def registry_inspector(
    settings: Settings, engine: ImageEngine | None = None, local_refs: frozenset[str] = frozenset()
) -> Callable[[str], tuple[str, dict]]:
    """Base inspection: the registry first (digest + config, no pull); a local image when offline.

    `local_refs` are images this run builds itself (another recipe's target): always the local image,
    pinned by id, so pushing it later does not make its dependents look stale."""
    clients: dict[str, RegistryClient] = {}

    def inspect(ref: str) -> tuple[str, dict[str, Any]]:
        host, repo, reference = split_reference(ref)
        if engine and ref in local_refs:
            local = engine.images.inspect_local(ref)
            if local is not None:
                return "", local[1]
        if engine and "/" in ref and host == "docker.io" and not ref.startswith("docker.io/"):
            # An unqualified `lab/house:v1` that the engine has is a local build (another recipe's
            # image): pin it by image id rather than asking Docker Hub about a name it never saw.
            local = engine.images.inspect_local(ref)
            if local is not None:
                return local[0], local[1]
        client = clients.setdefault(host, RegistryClient.for_host(host, settings))
        try:
            manifest, config = client.image_config(repo, reference)
            return manifest.digest, config
        except RegistryUnavailable:
            local = engine.images.inspect_local(ref) if engine else None
            if local is None:
                raise
            return local[0] or "", local[1]

    return inspect


def tag_resolver(settings: Settings) -> Callable[[str, str | None, str], str]:
    from imgbuild.ngc import newest_matching

    def resolve(repo_ref: str, framework: str | None, pattern: str) -> str:
        host, repo, _ = split_reference(repo_ref + ":x")
        tags = RegistryClient.for_host(host, settings).tags(repo)
        found = newest_matching(framework, pattern, tags)
        if not found:
            raise ImgbuildError(f"no tag of {repo_ref} matches {pattern!r} ({len(tags)} tags listed)")
        return found

    return resolve


def plan_recipe(
    loaded: LoadedRecipe,
    settings: Settings,
    engine: ImageEngine | None = None,
    offline: bool = False,
    local_refs: frozenset[str] = frozenset(),
) -> Plan:
    from imgbuild.host import caller

    inspect = None if offline else registry_inspector(settings, engine, local_refs)
    who = caller()
    return make_plan(loaded, settings, inspect, None if offline else tag_resolver(settings), (who.uid, who.gid))


# --- the lock, for rebuild --check ---------------------------------------------------------------


def read_lock(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A context's lock (from the repository: untrusted): bounded, and shaped as imgbuild writes it."""
    if not path.is_file() or path.is_symlink() or path.stat().st_size > 64 * 1024:
        raise ValueError("not a lock")
    lock = json.loads(path.read_text(encoding="utf-8"))
    base = lock["base"]
    if not isinstance(base, dict) or not all(isinstance(base.get(k, ""), str) for k in ("ref", "digest")):
        raise ValueError("not a lock")
    if not isinstance(lock.get("image"), str) or not isinstance(base["ref"], str):
        raise ValueError("not a lock")
    return lock, base


def recorded_base(digest: str, config: dict[str, Any]) -> Any:
    return lambda ref: (digest, config)


def recorded_tag(tag: str) -> Any:
    return lambda repo, framework, pattern: tag


def recorded_env(base: dict[str, Any]) -> list[str]:
    """The base's env as far as the lock records it: enough to plan exactly as at render time."""
    from imgbuild.ngc import FRAMEWORKS

    env = [f"CUDA_VERSION={base['cuda']}"] if base.get("cuda") else []
    env += [f"CUDNN_VERSION={base['cudnn']}"] if base.get("cudnn") else []
    fw = FRAMEWORKS.get(base.get("framework") or "")
    if fw and base.get("framework_version"):
        env.append(f"{fw.version_env}={base['framework_version']}")
    return env
