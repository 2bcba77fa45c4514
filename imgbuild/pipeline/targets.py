"""What a recipe may not build over: its own base, and the NGC bases of the site's mirror. A build promotes its
image at the target, so a target naming either would replace the image every other recipe of the site builds on
(probe-4 row class "targets that overwrite the site mirror's base or the recipe's own base"). The names imgbuild
keeps for itself (`-candidate`, `-previous`, `imgbuild-cache`, cosign's tags) are refused where the fields are
read (recipe.model)."""

from __future__ import annotations

import fnmatch

from imgbuild import imageref
from imgbuild.ngc import FRAMEWORKS

#: What a refused target's problem suggests.
TARGET_HINT = "name your image under your own namespace, e.g. image: REGISTRY/TEAM/NAME:TAG"


def target_refusal(target: str, base_ref: str, ngc_registry: str) -> str | None:
    """Why `target` may not be built: it is the recipe's base (`base_ref`; its tag may be a pattern such as `24.*`,
    which covers every tag it could resolve to) or an NGC repository of the site's mirror (`ngc_registry`); None
    when it may. Decided with no registry, so `validate` and `render` agree; the plan places the refusal at the
    field that sets it."""
    try:
        built = imageref.parse(target)
    except imageref.BadReference:
        return None  # checked where it was read; nothing to compare
    if _is_base(built, base_ref):
        return f"{target} is this recipe's own base: building it would replace what it builds on"
    try:
        mirror = imageref.parse(f"{ngc_registry}/x")
    except imageref.BadReference:
        return None
    for framework in FRAMEWORKS.values():
        repository = mirror.path[: -len("x")] + framework.repository  # the mirror's own path, if any, first
        if built.identity == mirror.identity and built.path == repository:
            return (
                f"{target} is the site's NGC base {ngc_registry}/{framework.repository}: every recipe builds on it, "
                "and a build would replace it"
            )
    return None


def _is_base(built: imageref.ImageRef, base_ref: str) -> bool:
    name, sep, tag = base_ref.rpartition(":")
    if "@" in base_ref or not sep or "/" in tag:  # a digest, or no tag: the reference as it is
        name, tag = base_ref, ""
    try:
        base = imageref.parse(name)
    except imageref.BadReference:
        return False
    same_repository = built.with_tag("").normal().rsplit(":", 1)[0] == base.with_tag("").normal().rsplit(":", 1)[0]
    wanted = tag or base.tag or "latest"
    return same_repository and not base.digest and fnmatch.fnmatchcase(built.tag or "latest", wanted)
