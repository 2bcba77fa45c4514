"""`imgbuild init`: a starting recipe (and, on request, a CI workflow), written only where nothing is.

The base is the newest NGC release imgbuild knows the facts of (its CUDA and the archs its framework was built
for) that this host's GPUs and driver can run, judged by the same rules as `smoke --for`; on a host without
GPUs, the newest. Packages come from an existing `requirements.txt` (referenced, so pip reads it as it is) or the
`[project].dependencies` of a `pyproject.toml`. What is written is loaded back as a recipe before it lands:
imgbuild never writes a recipe it would refuse.
"""

from __future__ import annotations

import json
import os
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.errors import UsageError
from imgbuild.hostio.regular import write_atomic

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings

PYPROJECT_BYTES = 1024 * 1024
#: The tag of a starting recipe (its image is <user>/<name>:1), which its CI workflow verifies
STARTER_TAG = "1"
CI_FILES = {"github": Path(".github/workflows/images.yml"), "gitlab": Path(".gitlab-ci.yml")}


@dataclass(frozen=True)
class Starter:
    """What `init` writes: the recipe's path and text, and a CI file's."""

    recipe: Path
    text: str
    release: str
    base_why: str
    ci: tuple[Path, str] | None = None
    base_detail: str = ""
    inputs: tuple[Path, ...] = ()  # the project's files the recipe reads (to commit with it)
    context: Path | None = None  # images/NAME, rendered once the recipe is written


@dataclass(frozen=True)
class Started:
    """What `init` did: the files written, the context rendered (or why not), and the commands that come next."""

    written: tuple[Path, ...]
    rendered: Path | None
    not_rendered: str
    next_commands: tuple[str, ...]


def packages_from(path: Path) -> tuple[str | None, list[str]]:
    """(a requirements file to reference, or packages to list) from `path`."""
    from imgbuild.hostio.acting import read_as

    if path.name.endswith(".txt"):
        if not path.is_file():
            raise UsageError(f"--from {path}: no such requirements file")
        return str(path), []
    if path.name != "pyproject.toml":
        raise UsageError(f"--from {path}: give a requirements file (*.txt) or a pyproject.toml")
    text = read_as(None, path, PYPROJECT_BYTES, "--from")  # a regular file, bounded, one line when it is not
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise UsageError(f"--from {path}: not TOML ({str(exc)[:120]})") from None
    deps = (data.get("project") or {}).get("dependencies") if isinstance(data.get("project"), dict) else None
    if deps is None:
        raise UsageError(f"--from {path}: no [project].dependencies to start from")
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise UsageError(f"--from {path}: [project].dependencies is not a list of requirements")
    from imgbuild.credentials import CREDENTIAL_REFUSAL, credential_kind

    for number, dep in enumerate(deps):
        if kind := credential_kind(dep):
            raise UsageError(
                f"--from {path}: [project].dependencies[{number}] holds what looks like a credential ({kind}): "
                f"in a recipe it {CREDENTIAL_REFUSAL}"
            )
    return None, list(deps)


def literal(text: str) -> str:
    """`text` copied from a file imgbuild did not write, as recipe text that means itself: `$` as `$$`, so the
    recipe's `${VAR}` interpolation never reads the user's environment into it."""
    return json.dumps(text.replace("$", "$$"))


def recipe_text(name: str, framework: str, tag: str, why: str, requirements: str | None, packages: list[str]) -> str:
    """The starting recipe, commented for a first read."""
    lines = [
        f"# {name}: a starting recipe from `imgbuild init`. Fields: docs/recipes.md; check it: imgbuild validate",
        f"name: {name}",
        f'tag: "{STARTER_TAG}"',
        "base:",
        f"  framework: {framework}",
        f'  tag: "{tag}"  # {why}',
        "# apt: [git]                     # Debian packages",
    ]
    if requirements:
        lines += ["pip:", f"  requirements: {literal(requirements)}"]
    elif packages:
        lines += ["pip:", *[f"  - {literal(p)}" for p in packages]]
    else:
        lines += ["# pip: [einops]                 # Python packages, installed under the base's pins"]
    lines += [
        "# files: [{src: ../train.py, dest: /workspace/train.py}]",
        "smoke:",
        "  require_gpu: false             # true: a build without a GPU fails instead of skipping the GPU checks",
    ]
    return "\n".join(lines) + "\n"


def ci_text(kind: str, recipe: Path, name: str) -> str:
    """The CI workflow that checks, builds, pushes, signs and verifies `recipe`; its path is one CI may pass on
    (ci_path), else UsageError."""
    from imgbuild.pipeline.render import template_environment
    from imgbuild.recipe import ci_path

    shown = ci_path(str(recipe))
    folder = ci_path(str(recipe.parent))
    return (
        template_environment()
        .get_template(f"ci-{kind}.yml.j2")
        .render(recipe=shown, folder=folder, name=name, tag=STARTER_TAG)
    )


@dataclass(frozen=True)
class InitRequest:
    """What `imgbuild init` was asked: the image's name and framework, where the recipe goes, what it starts from,
    the CI to write, the GPUs to choose the base for (`--for`, `--driver`) or the base itself (`--base`)."""

    name: str
    framework: str = "pytorch"
    folder: Path = Path("recipes")
    source: Path | None = None
    ci: str | None = None
    for_gpus: str | None = None
    driver: str | None = None
    base: str | None = None


def plan_starter(request: InitRequest, settings: Settings) -> Starter:
    """The recipe (and CI file) `init` writes: the name and the files checked before the registry is asked."""
    from imgbuild.pipeline.base_choice import choose_base, host_fleet
    from imgbuild.recipe.model import COMPONENT_RE

    name, folder = request.name, request.folder
    if not COMPONENT_RE.fullmatch(name) or len(name) > 128:
        raise UsageError(f"NAME: {name[:60]!r} is not an image name (lower case letters, digits, . _ -)")
    recipe = folder / f"{name}.yaml"
    ci = (CI_FILES[request.ci], ci_text(request.ci, recipe, request.name)) if request.ci else None
    from imgbuild.pipeline.context import context_path
    from imgbuild.recipe.repofiles import repository_root

    context = context_path(name, repository_root(folder), settings)
    for path in (recipe, *([ci[0]] if ci else []), context):
        if os.path.lexists(path):
            raise UsageError(f"{path} exists: imgbuild init never overwrites (move it away, or edit it)")
    requirements, packages = packages_from(request.source) if request.source else (None, [])
    if requirements:
        requirements = os.path.relpath(Path(requirements).resolve(), folder.resolve())
    fleet = host_fleet(settings, request.for_gpus, request.driver)
    choice = choose_base(settings, request.framework, fleet, request.base)
    text = recipe_text(name, request.framework, choice.release, choice.why, requirements, packages)
    tracked = (request.source,) if request.source and requirements else ()
    return Starter(recipe, text, choice.release, choice.why, ci, choice.detail, tracked, context)


def write_new(path: Path, text: str) -> None:
    """Write `path` whole, only where nothing is (never over a file, never through a link)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_atomic(path, text, mode=0o644, replace=False)
    except FileExistsError:
        raise UsageError(f"{path} exists: imgbuild init never overwrites (move it away, or edit it)") from None


def start(starter: Starter, settings: Settings) -> Started:
    """Write the recipe (loaded back first: imgbuild writes nothing it would refuse) and the CI file, render the
    context CI checks, and say what comes next: build, commit the recipe with its context, push."""
    from imgbuild.errors import ImgbuildError, RecipeError
    from imgbuild.pipeline.context import context_dir, render_into
    from imgbuild.pipeline.resolve import plan_file
    from imgbuild.recipe import display_path, load_recipe

    write_new(starter.recipe, starter.text)
    try:
        load_recipe(starter.recipe, secrets=settings.secrets())
    except RecipeError:
        starter.recipe.unlink()
        raise
    written = [starter.recipe]
    if starter.ci:
        write_new(*starter.ci)
        written.append(starter.ci[0])
    rendered, why_not = None, ""
    try:
        plan = plan_file(starter.recipe, settings)
        rendered = render_into(plan, context_dir(plan, settings), "buildkit", settings)
    except ImgbuildError as exc:  # the recipe stands (it loads); what stops its render is said, and `render` next
        why_not = str(exc).splitlines()[0]
    recipe = shlex.quote(str(starter.recipe))
    context = display_path(rendered or starter.context or Path("images"))
    commit = [str(starter.recipe), context, *map(str, starter.inputs), *([str(starter.ci[0])] if starter.ci else [])]
    commands = [
        *([] if rendered else [f"imgbuild render {recipe}"]),
        f"imgbuild build {recipe}",
        "git add " + " ".join(shlex.quote(p) for p in commit),
        f"git commit -m {shlex.quote(f'{starter.recipe.stem}: a first image')} && git push",
    ]
    return Started(tuple(written), rendered, why_not, tuple(commands))
