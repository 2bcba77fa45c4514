"""`imgbuild init`: a starting recipe (and, on request, a CI workflow), written only where nothing is.

The base is the newest NGC release imgbuild knows the facts of (its CUDA and the archs its framework was built
for) that this host's GPUs and driver can run, judged by the same rules as `smoke --for`; on a host without
GPUs, the newest. Packages come from an existing `requirements.txt` (referenced, so pip reads it as it is) or the
`[project].dependencies` of a `pyproject.toml`. What is written is loaded back as a recipe before it lands:
imgbuild never writes a recipe it would refuse.
"""

from __future__ import annotations

import contextlib
import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgbuild.errors import UsageError

#: NGC releases whose facts imgbuild carries, newest first: (tag, CUDA, the PyTorch build's TORCH_CUDA_ARCH_LIST on
#: amd64, the TensorFlow build's archs), from the images themselves (../shared/docs/ngc-real-facts.md).
KNOWN_RELEASES = (
    ("25.10", "13.0", "7.5 8.0 8.6 9.0 10.0 12.0+PTX"),
    ("24.05", "12.4", "5.2 6.0 6.1 7.0 7.2 7.5 8.0 8.6 8.7 9.0+PTX"),
)
PYPROJECT_BYTES = 1024 * 1024
CI_FILES = {"github": Path(".github/workflows/images.yml"), "gitlab": Path(".gitlab-ci.yml")}


@dataclass(frozen=True)
class Starter:
    """What `init` writes: the recipe's path and text, and a CI file's."""

    recipe: Path
    text: str
    base_why: str
    ci: tuple[Path, str] | None = None


def choose_tag(gpus: list[Any], driver: str | None) -> tuple[str, str]:
    """(NGC tag, why) for this host: the newest known release every one of its GPUs can run with its driver."""
    from imgbuild.gpu.fleet import GpuFacts, Target, judge

    targets = []
    for gpu in gpus:
        if gpu.compute_cap:
            major, minor = (int(x) for x in gpu.compute_cap.split("."))
            consumer = any(word in gpu.name for word in ("GeForce", "TITAN"))  # no forward compatibility there
            targets.append(Target(f"this host's {gpu.name}", (major, minor), False if consumer else None))
    if not targets:
        return KNOWN_RELEASES[0][0], "the newest release imgbuild knows (no GPU read on this host)"
    for tag, cuda, archs in KNOWN_RELEASES:
        verdicts = judge(GpuFacts(tag, cuda, archs, "init"), targets, driver)
        if all(v.runs for v in verdicts):
            return tag, f"the newest release this host's GPUs and driver {driver or '?'} can run"
    oldest = KNOWN_RELEASES[-1][0]
    return oldest, f"no known release runs on this host's GPUs with driver {driver or '?'}: the oldest, to start"


def packages_from(path: Path) -> tuple[str | None, list[str]]:
    """(a requirements file to reference, or packages to list) from `path`."""
    from imgbuild.acting import read_as

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
        'tag: "1"',
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


def ci_text(kind: str, recipe: Path) -> str:
    from imgbuild.pipeline.render import template_environment

    return (
        template_environment().get_template(f"ci-{kind}.yml.j2").render(recipe=str(recipe), folder=str(recipe.parent))
    )


def plan_starter(
    name: str, framework: str, folder: Path, source: Path | None, ci: str | None, gpus: list[Any], driver: str | None
) -> Starter:
    from imgbuild.recipe.model import COMPONENT_RE

    if not COMPONENT_RE.fullmatch(name) or len(name) > 128:
        raise UsageError(f"NAME: {name[:60]!r} is not an image name (lower case letters, digits, . _ -)")
    tag, why = choose_tag(gpus, driver)
    recipe = folder / f"{name}.yaml"
    requirements, packages = packages_from(source) if source else (None, [])
    if requirements:
        requirements = os.path.relpath(Path(requirements).resolve(), folder.resolve())
    text = recipe_text(name, framework, tag, why, requirements, packages)
    return Starter(recipe, text, why, (CI_FILES[ci], ci_text(ci, recipe)) if ci else None)


def write_new(path: Path, text: str) -> None:
    """Write `path` whole, only where nothing is (never over a file, never through a link): a file with no name
    (O_TMPFILE; elsewhere a temporary one beside it), then a hard link to the name, which fails if anything is
    there. A kill leaves nothing behind; every error names the file."""
    from imgbuild.regular import link_unnamed, named_error, unnamed_file

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise named_error(exc, path.parent) from None
    if os.path.lexists(path):
        raise UsageError(f"{path} exists: imgbuild init never overwrites (move it away, or edit it)")
    partial = path.with_name(f".{path.name}.{os.getpid()}.init")
    try:
        fd = unnamed_file(path.parent)
        named = fd is None
        if fd is None:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
            if not named:
                os.fchmod(handle.fileno(), 0o644)
                link_unnamed(handle.fileno(), path)
        if named:
            os.link(partial, path)
    except FileExistsError:
        raise UsageError(f"{path} exists: imgbuild init never overwrites (move it away, or edit it)") from None
    except OSError as exc:
        raise named_error(exc, path) from None
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
