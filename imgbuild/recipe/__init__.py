"""Stage 1: load a recipe (YAML + `extends` + `${VAR}`), validate it, and return a typed model.

Every problem is reported at once as `FILE:LINE:COL: field.path: what is wrong (hint)`.

- `model`: the fields and their rules (Recipe, Base, Pip, ...);
- `loaded`: a recipe as read (LoadedRecipe: its file, chain, repository, files, requirements and lock);
- `interpolate`: `${VAR}` and the variables that hold secrets;
- `extends`: layers, shorthands, merging by key, positions pointed back at the file that wrote them;
- `load`: `load_recipe`, the requirements, the lock and the files a recipe names.
"""

from imgbuild.recipe.interpolate import SECRET_VARIABLES, interpolate, secret_variable
from imgbuild.recipe.load import json_schema, load_recipe, lock_path_for
from imgbuild.recipe.loaded import LoadedRecipe, ci_path, display_path, stable_name
from imgbuild.recipe.model import Base, FileSpec, Pip, Recipe, Smoke, User

__all__ = [
    "SECRET_VARIABLES",
    "Base",
    "FileSpec",
    "LoadedRecipe",
    "Pip",
    "Recipe",
    "Smoke",
    "User",
    "ci_path",
    "display_path",
    "interpolate",
    "json_schema",
    "load_recipe",
    "lock_path_for",
    "secret_variable",
    "stable_name",
]
