"""The base's stack a build may not change, and the recipe's `env:` judged against it (pure).

The rule is the byte check (`payload/stack_check.py`): the build records the protected set's files in a stage of
its own on the bare base and compares after each kind of recipe step, whatever the door. This module says what
the set is (a `ProtectedStack`, rendered into the context as `imgbuild/stack/protected.json`), which kinds of
step a recipe has (each is checked after it), and judges the recipe's loader and import variables before the
build with the same rule the image is judged by after it.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from imgbuild.facts import IMAGE_DIR
from imgbuild.ngc import CUDA_LIBRARY_RE, CUDA_PACKAGE_PREFIXES, FRAMEWORK_PACKAGES, FRAMEWORKS
from imgbuild.payload import SMOKE_MODULES
from imgbuild.payload.stack_check import FIXED_VARS, LIBRARY_RE, SEARCH_VARS, STARTUP_RE, judge_env

if TYPE_CHECKING:
    from imgbuild.recipe.model import Recipe

#: The base's folders that are its stack whatever the release: its CUDA toolkits, the driver's mount point, NGC's
#: entrypoint and its scripts, and imgbuild's own records.
STACK_TREES = ("/usr/local/cuda", "/usr/local/cuda-*", "/usr/local/nvidia", "/opt/nvidia", IMAGE_DIR)
#: Single files of the stack: a preload list would put a library before every one of the base's.
STACK_FILES = ("/etc/ld.so.preload",)
#: What imgbuild itself writes into its folder after the record (the base's records, the run steps' markers, the
#: smoke test's package): judged by their own steps, not as a recipe's change.
OWN_RECORDS = (
    "pip-check.base",
    "dists.base",
    "debs.base",
    "run.start",
    "run-files.sha256",
    *(f"smoke/{name}" for name in SMOKE_MODULES),
)
#: The kinds of recipe step, in the order the Dockerfile runs them; the check runs after each one a recipe has.
STEP_KINDS = ("apt", "pip", "user", "run", "files", "env")
#: Where a value stands for a base variable the plan has not read (an offline plan): an absolute folder no
#: image has, so that `$PATH:/x` keeps the base's entries first and `/x:$PATH` does not.
_UNREAD = "/imgbuild-unread-base-{}"
#: Debian packages of the CUDA stack, the driver's user space and the frameworks: what `apt:` would install beside
#: or over the base's own (its toolkit, cuDNN, NCCL, TensorRT, driver libraries, torch). The byte check is the rule;
#: this refuses them before the build.
STACK_DEB_RE = re.compile(
    r"(?:cuda|cuda-[a-z0-9.-]+|nvidia-[a-z0-9.+-]+|libnvidia-[a-z0-9.+-]+|libcuda[a-z0-9.+-]*|libcudnn[a-z0-9.+-]*"
    r"|libnccl[a-z0-9.+-]*|libcublas[a-z0-9.+-]*|libcufft[a-z0-9.+-]*|libcurand[a-z0-9.+-]*|libcusolver[a-z0-9.+-]*"
    r"|libcusparse[a-z0-9.+-]*|libcutensor[a-z0-9.+-]*|libnpp[a-z0-9.+-]*|libnvjpeg[a-z0-9.+-]*|libnvrtc[a-z0-9.+-]*"
    r"|libnvjitlink[a-z0-9.+-]*|libnvinfer[a-z0-9.+-]*|libnvonnxparsers?[a-z0-9.+-]*|libnvshmem[a-z0-9.+-]*"
    r"|tensorrt[a-z0-9.+-]*|python3-(?:torch|tensorflow)[a-z0-9.+-]*)"
)
_REFERENCE = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+])([^}]*))?\})")


@dataclass(frozen=True)
class ProtectedStack:
    """What no recipe step may change in the base: every framework's distributions, its CUDA library wheels and what
    it pins (read in the image, as the pip step holds them), the stack's folders and files, less what the recipe
    unpins."""

    distributions: tuple[str, ...]
    unpinned: tuple[str, ...]
    cuda_wheels: str = CUDA_LIBRARY_RE.pattern
    unpinned_prefixes: tuple[str, ...] = CUDA_PACKAGE_PREFIXES
    trees: tuple[str, ...] = STACK_TREES
    files: tuple[str, ...] = STACK_FILES
    own: tuple[str, ...] = tuple(f"{IMAGE_DIR}/{name}" for name in OWN_RECORDS)

    def spec_text(self) -> str:
        """The record's and the check's input (`imgbuild/stack/protected.json`)."""
        data = {
            "distributions": list(self.distributions),
            "cuda_wheels": self.cuda_wheels,
            "unpinned_prefixes": list(self.unpinned_prefixes),
            "unpinned": list(self.unpinned),
            "trees": list(self.trees),
            "files": list(self.files),
            "own": list(self.own),
        }
        return json.dumps(data, indent=1, sort_keys=True) + "\n"


def protected_stack(recipe: Recipe) -> ProtectedStack:
    from packaging.utils import canonicalize_name

    unpinned = sorted({str(canonicalize_name(name)) for name in recipe.pip.unpin})
    return ProtectedStack(tuple(sorted(FRAMEWORK_PACKAGES)), tuple(unpinned))


def step_kinds(recipe: Recipe, has_requirements: bool) -> tuple[str, ...]:
    """The kinds of step `recipe` has (`has_requirements`: a requirements file), in build order: the byte check
    runs after each."""
    present = {
        "apt": bool(recipe.apt),
        "pip": bool(recipe.pip.packages or has_requirements),
        "user": recipe.user is not None,
        "run": bool(recipe.run),
        "files": bool(recipe.files),
        "env": bool(recipe.env),
    }
    return tuple(kind for kind in STEP_KINDS if present[kind])


def env_problems(
    recipe_env: dict[str, str], args: dict[str, str], base_env: dict[str, str] | None
) -> list[tuple[str, str]]:
    """The recipe's loader and import variables judged as the image will be (`judge_env`), before the build.

    A Dockerfile's ENV expands `$NAME` and `${NAME}` from the base's environment and the build's arguments.
    `base_env` None: the base is not read (validate, an offline render); then every image's PATH and a variable
    the value names itself are taken to be set, so that where the base's entries stand is judged all the same."""
    judged = set(SEARCH_VARS) | set(FIXED_VARS)
    asked = {name: value for name, value in recipe_env.items() if name in judged}
    if not asked:
        return []
    if base_env is None:
        named = {m.group(1) or m.group(2) for value in asked.values() for m in _REFERENCE.finditer(value)}
        base = {name: _UNREAD.format(name) for name in named | {"PATH"} if name in judged}
        scope = {**dict.fromkeys(named, "/imgbuild-unread"), **base, **args}
    else:
        base = {name: value for name, value in base_env.items() if name in judged}
        scope = {**base_env, **args}
    final = {name: _expand(value, scope) for name, value in asked.items()}
    return judge_env(base, final)


def _expand(value: str, scope: dict[str, str]) -> str:
    """`value` as a Dockerfile ENV expands it: `$A`, `${A}`, `${A:-word}`, `${A:+word}`."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        have = scope.get(name, "")
        if match.group(3) is None:
            return have
        if match.group(3).endswith("-"):
            return have or match.group(4)
        return match.group(4) if have else ""

    return _REFERENCE.sub(one, value)


def door_problems(
    recipe: Recipe, copied: dict[str, tuple[str, ...]] | None = None
) -> list[tuple[tuple[str | int, ...], str]]:
    """(field, what is wrong) for each step that names the base's stack outright: an apt package of the CUDA stack
    or a framework, a file copied over or into the stack's folders, a CUDA library's or a framework's files or a
    file Python runs at its start (each file a copied folder holds, `copied`: a destination's paths below it), or
    the user's home or workdir there. Earlier and friendlier than the byte check, which catches every other way."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    for i, package in enumerate(recipe.apt):
        name = package.split("=", 1)[0].lower()
        if STACK_DEB_RE.fullmatch(name):
            found.append((("apt", i), f"{name} is the CUDA stack or a framework, which the base already carries"))
    for i, spec in enumerate(recipe.files):
        below = (copied or {}).get(spec.dest) or ("",)
        paths = (posixpath.join(spec.dest, rel) if rel else spec.dest for rel in below)
        if why := next((why for path in paths if (why := stack_path(path))), ""):
            found.append((("files", i, "dest"), why))
    places: list[tuple[tuple[str | int, ...], str]] = [(("workdir",), recipe.workdir)]
    if recipe.user and recipe.user.home:
        places.append((("user", "home"), recipe.user.home))
    found += [(at, why) for at, path in places if (why := stack_path(path))]
    return found


def stack_path(path: str) -> str:
    """Why `path` is the base's stack ("" when it is not): in a protected folder, a protected file, a CUDA
    library's name, or inside a framework's package in a site folder."""
    path = posixpath.normpath(path)
    parts = path.split("/")
    for at in range(2, len(parts) + 1):
        head = "/".join(parts[:at])
        if any(fnmatch.fnmatchcase(head, pattern) for pattern in (*STACK_TREES, *STACK_FILES)):
            return f"{path} is in the base's stack ({head}): a recipe may add beside it, never over or into it"
    if LIBRARY_RE.fullmatch(parts[-1]):
        return f"{path}: {parts[-1]} is a CUDA library's name; the base's own are the stack"
    if STARTUP_RE.fullmatch(parts[-1]):
        return f"{path}: Python runs {parts[-1]} at every start, before the base's framework"
    modules = {fw.module for fw in FRAMEWORKS.values()}
    for at, part in enumerate(parts[:-1]):
        if part in ("dist-packages", "site-packages") and parts[at + 1].split(".")[0] in modules:
            return f"{path} is inside the base's framework ({parts[at + 1]})"
        if part in ("dist-packages", "site-packages") and at + 2 == len(parts) and parts[-1].endswith(".pth"):
            return f"{path}: a .pth file in a site folder runs its import lines at every Python start"
    return ""
