"""What a recipe may not build over: its own base, and the NGC bases of the site's mirror. A build promotes its
image at the target, so a target naming either would replace the image every other recipe of the site builds on
(probe-4 row class "targets that overwrite the site mirror's base or the recipe's own base"). The names imgbuild
keeps for itself (`-candidate`, `-previous`, `imgbuild-cache`, cosign's tags) are refused where the fields are
read (recipe.model)."""

from __future__ import annotations

from imgbuild import imageref
from imgbuild.config.settings import Settings
from imgbuild.errors import Problem, RecipeError
from imgbuild.ngc import FRAMEWORKS
from imgbuild.recipe import LoadedRecipe


def check_target(loaded: LoadedRecipe, settings: Settings, target: str, base_ref: str) -> None:
    """Refuse `target` when it is the recipe's base (`base_ref`, as resolved) or an NGC repository of the site's
    mirror (`ngc_registry`), naming the field that sets it."""
    try:
        built, base = imageref.parse(target), imageref.parse(base_ref)
    except imageref.BadReference:
        return  # both were checked where they were read; nothing to compare
    field = ("image",) if loaded.recipe.image else ("name",)
    if built.with_tag(built.tag or "latest").normal() == base.with_tag(base.tag or "latest").normal():
        _refuse(loaded, field, f"{target} is this recipe's own base: building it would replace what it builds on")
    try:
        mirror = imageref.parse(f"{settings.ngc_registry}/x")
    except imageref.BadReference:
        return
    for framework in FRAMEWORKS.values():
        repository = mirror.path[: -len("x")] + framework.repository  # the mirror's own path, if any, first
        if built.registry == mirror.registry and built.path == repository:
            _refuse(
                loaded,
                field,
                f"{target} is the site's NGC base {settings.ngc_registry}/{framework.repository}: every recipe "
                "builds on it, and a build would replace it",
            )


def _refuse(loaded: LoadedRecipe, field: tuple[str, ...], message: str) -> None:
    hint = "name your image under your own namespace, e.g. image: REGISTRY/TEAM/NAME:TAG"
    if loaded.located is not None:
        raise RecipeError([loaded.located.problem(field, message, hint)])
    raise RecipeError([Problem(loaded.display, 0, 0, ".".join(field), message, hint)])
