"""Stage 1: load a recipe (YAML + `extends` + `${VAR}`), validate it, and return a typed model.

Every problem is reported at once as `FILE:LINE:COL: field.path: what is wrong (hint)`.

- `model`: the fields and their rules (Recipe, Base, Pip, ...);
- `interpolate`: `${VAR}` and the variables that hold secrets;
- `extends`: layers, shorthands, merging by key, positions pointed back at the file that wrote them;
- `load`: `load_recipe`, the requirements, the lock and the files a recipe names, to a LoadedRecipe (its file,
  chain, repository, files, requirements and lock), and the names a recipe's path goes by.
"""

from imgbuild.recipe.interpolate import SECRET_VARIABLES, interpolate, secret_variable
from imgbuild.recipe.load import LoadedRecipe, ci_path, json_schema, load_recipe, lock_path_for, stable_name
from imgbuild.recipe.model import Base, FileSpec, Pip, Recipe, Smoke, User
from imgbuild.yamlpos import display_path

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
