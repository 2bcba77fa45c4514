"""load_recipe: one recipe file (and what it extends, its requirements, its lock, its files) to a LoadedRecipe (the
typed Recipe with where it came from and what it names outside itself, read once), every problem at once as
FILE:LINE:COL; and the names a recipe's path goes by (stable_name in labels and records, ci_path where CI passes it
on)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgbuild import limits
from imgbuild.errors import Problem, RecipeError, UsageError
from imgbuild.fields import json_schema as _json_schema
from imgbuild.fields import show as _show
from imgbuild.fields import (
    validate,
)
from imgbuild.recipe import reqfile
from imgbuild.recipe.extends import PATH_FIELDS, list_at, load_chain, merged_positions
from imgbuild.recipe.model import Recipe
from imgbuild.recipe.repofiles import (
    OutsideRepository,
    SourceFile,
    files_digest,
    regular_file,
    repository_root,
    resolve_inside,
    source_files,
)
from imgbuild.yamlpos import Located, PathKey, Pos, display_path, dotted, read_text_bounded

_RELATIVE_HINT = "paths are relative to the recipe that names them"


@dataclass
class LoadedRecipe:
    """A validated recipe with where it came from: the file, its `extends` chain, resolved paths."""

    recipe: Recipe
    path: Path
    chain: list[Path]
    file_sources: dict[str, Path] = field(default_factory=dict)  # files[i].dest -> absolute src
    requirements_path: Path | None = None
    ca_bundle_path: Path | None = None
    located: Located | None = field(default=None, repr=False)
    root: Path | None = None  # the repository every named path stays inside
    #: files[i].dest -> the files to copy (checked: inside the repository, regular, bounded)
    file_manifest: dict[str, list[SourceFile]] = field(default_factory=dict)
    #: the requirements file's requirements (its nested -r files' too), each with its file and line, read once
    requirements: tuple[reqfile.ReqLine, ...] = ()
    #: its constraints (-c files), and the pip options it sets (index URLs, trusted hosts, --pre, ...)
    requirement_constraints: tuple[reqfile.ReqLine, ...] = ()
    requirement_options: tuple[str, ...] = ()
    #: the recipe's lock (`<recipe>.lock.txt` beside it, written by `imgbuild lock`): name==version lines
    lock_path: Path | None = None
    lock_pins: tuple[str, ...] = ()
    lock_lines: tuple[reqfile.ReqLine, ...] = ()  # the same pins, each with its line (for located conflicts)
    #: files[i].dest -> sha256 of what will be copied (names, exec bits, content), hashed once at load
    file_digests: dict[str, str] = field(default_factory=dict)
    #: `recipes/x.yaml` (stable_name): the recipe as every label, record and provenance names it, fixed at load
    name: str = field(init=False, default="")
    #: the path as its writer sees it (display_path: relative to the working folder), for every message; fixed at load
    display: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.name = stable_name(self.path)
        self.display = display_path(self.path)


def stable_name(path: Path) -> str:
    """`recipes/x.yaml`: the recipe's folder and file name, the same on every machine and from any cwd."""
    path = Path(path)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


#: A recipe's path as CI passes it on (a plan's matrix, a child pipeline's script, a workflow `init` writes): letters,
#: digits and `. _ / -`, no part that starts with `-`. Such a name is the same word to every shell, YAML file and
#: template expression it passes through, and never an option.
CI_PATH_RE = re.compile(r"/?(?!-)[A-Za-z0-9._-]+(?:/(?!-)[A-Za-z0-9._-]+)*")


def ci_path(shown: str) -> str:
    """`shown` (a recipe's path as display_path gives it), checked as a name CI may pass on; else UsageError, one
    line naming it."""
    if not CI_PATH_RE.fullmatch(shown):
        raise UsageError(
            f"{shown!r}: a recipe's path CI passes on may hold only letters, digits and . _ / - (no part starting "
            "with -): rename the file or its folder"
        )
    return shown


def _check_paths(
    loaded_files: dict[str, list[SourceFile]],
    digests: dict[str, str],
    located: Located,
    root: Path,
    secrets: tuple[str, ...],
    problems: list[Problem],
) -> reqfile.Requirements:
    """Check what the recipe's paths name, list and hash the files to copy; return what the requirements
    file (and the files it nests) holds. No content is echoed."""
    data = located.data
    files = list_at(data, "files")
    _check_sources(files, loaded_files, digests, located, root, secrets, problems)
    pip = data.get("pip") if isinstance(data.get("pip"), dict) else {}
    for at in PATH_FIELDS:
        value = pip.get(at[1])
        if isinstance(value, str):
            try:
                regular_file(Path(value), Path(value).name)
            except OutsideRepository:
                problems.append(located.problem(at, f"no such file: {_show(Path(value).name)}", _RELATIVE_HINT))
    req = pip.get("requirements")
    requirements = (
        reqfile.read(Path(req), root, display_path, problems)
        if isinstance(req, str) and Path(req).is_file()
        else reqfile.Requirements()
    )
    dests: dict[str, int] = {}
    for i, spec in enumerate(files):
        dest = spec.get("dest") if isinstance(spec, dict) else None
        if isinstance(dest, str) and dest in dests:
            problems.append(
                located.problem(("files", i, "dest"), f"{dest} is already a destination of files[{dests[dest]}]")
            )
        elif isinstance(dest, str):
            # one destination inside another: the context would need a file and a folder at one path
            outer = next((d for d in dests if dest.startswith(d.rstrip("/") + "/") or d.startswith(dest + "/")), None)
            if outer is not None:
                problems.append(
                    located.problem(
                        ("files", i, "dest"),
                        f"{dest} and files[{dests[outer]}].dest {outer} lie one inside the other",
                        "copy one folder that holds both",
                    )
                )
        if isinstance(dest, str):
            dests.setdefault(dest, i)
    run = list_at(data, "run")
    problems.extend(
        located.problem(("run", i), "empty command")
        for i, cmd in enumerate(run)
        if isinstance(cmd, str) and cmd.strip() == ""
    )
    return requirements


def _check_sources(
    files: list[Any],
    loaded_files: dict[str, list[SourceFile]],
    digests: dict[str, str],
    located: Located,
    root: Path,
    secrets: tuple[str, ...],
    problems: list[Problem],
) -> None:
    """Each `files[].src`: it exists, everything it holds may be copied (see repofiles.source_files), and
    none of it holds a configured secret; its digest is taken in the same pass (each file read once)."""
    for i, spec in enumerate(files):
        if not (isinstance(spec, dict) and isinstance(spec.get("src"), str)):
            continue
        src = Path(spec["src"])
        if not src.exists():
            problems.append(located.problem(("files", i, "src"), f"no such file: {_show(src.name)}", _RELATIVE_HINT))
            continue
        dest = str(spec.get("dest"))
        try:
            loaded_files[dest] = source_files(src, src.name, root)
            digests[dest] = files_digest(loaded_files[dest], secrets)
        except OutsideRepository as exc:
            problems.append(located.problem(("files", i, "src"), str(exc)))


LOCK_LINE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}==[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
LOCK_HASH_RE = re.compile(r"--hash=sha256:[0-9a-f]{64}")
#: A version's files on an index: numpy's releases have about 60 wheels; more than this on one line is not a lock.
MAX_HASHES = 256


def lock_path_for(recipe: Path) -> Path:
    """Where a recipe's lock lives: `recipes/x.yaml` -> `recipes/x.lock.txt`."""
    return recipe.with_name(recipe.name.rsplit(".", 1)[0] + ".lock.txt")


def _empty_lock(text: str, shown: str, problems: list[Problem]) -> bool:
    """imgbuild lock always writes its header line: nothing at all is a write cut short, not a lock of no pins."""
    if text.strip():
        return False
    problems.append(
        Problem(shown, 1, 1, "lock", "is empty (a write cut short?): run imgbuild lock again, or remove it")
    )
    return True


def read_lock(recipe: Path, root: Path, problems: list[Problem]) -> tuple[Path | None, tuple[reqfile.ReqLine, ...]]:
    """The recipe's lock when it has one: `name==version` lines (comments allowed), inside the repository.
    The file is input too (a merge request can edit it): each version must be one, each name once, and no
    pin may name the base's CUDA libraries (those the plan refuses in pip.packages)."""
    path = lock_path_for(recipe)
    if not path.exists() and not path.is_symlink():
        return None, ()
    shown = display_path(path)
    try:
        resolved = resolve_inside(path.parent, path.name, root)
        regular_file(resolved, path.name)
        text = read_text_bounded(resolved, shown, limits.REQUIREMENTS_BYTES, "lock")
    except OutsideRepository as exc:
        problems.append(Problem(shown, 0, 0, "lock", str(exc)))
        return None, ()
    except RecipeError as exc:
        problems.extend(exc.problems)
        return None, ()
    if _empty_lock(text, shown, problems):
        return None, ()
    return path, _lock_pins(text, shown, problems)


def _lock_pins(text: str, shown: str, problems: list[Problem]) -> tuple[reqfile.ReqLine, ...]:
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    from imgbuild.ngc import FRAMEWORK_PACKAGES, is_cuda_library

    pins: list[reqfile.ReqLine] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.replace("\r\n", "\n").split("\n"), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        line, hashes = words[0], words[1:]  # written again from these words, never passed on as read
        if not LOCK_LINE_RE.fullmatch(line) or len(hashes) > MAX_HASHES:
            problems.append(
                Problem(shown, number, 1, "lock", "not a name==version line (imgbuild lock writes this file)")
            )
            continue
        if not all(LOCK_HASH_RE.fullmatch(word) for word in hashes):
            problems.append(
                Problem(shown, number, 1, "lock", "after name==version only --hash=sha256:<64 hex> may come")
            )
            continue
        name, version = line.split("==", 1)
        try:
            Version(version)
        except InvalidVersion:
            problems.append(Problem(shown, number, 1, "lock", f"{version[:40]!r} is not a version (PEP 440)"))
            continue
        key = canonicalize_name(name)
        if key in seen:
            problems.append(Problem(shown, number, 1, "lock", f"{name} is locked twice (first at line {seen[key]})"))
            continue
        seen[key] = number
        if is_cuda_library(key):
            # an older imgbuild lock pinned the CUDA libraries a requirement pulls in (jax[cuda13] ->
            # nvidia-cuda-nvcc); `imgbuild lock` now writes them as comments, installed as the requirement asks:
            # the line is read as that comment, not refused with words that may not hold
            continue
        if key in FRAMEWORK_PACKAGES:  # whichever base: the lock installs over the base's own framework
            problems.append(
                Problem(shown, number, 1, "lock", f"{name} is a framework the base carries (drop the line)")
            )
            continue
        pins.append(reqfile.ReqLine(shown, number, line, tuple(hashes)))
    bare = next((pin for pin in pins if not pin.hashes), None)
    if bare is not None and any(pin.hashes for pin in pins):  # pip checks hashes for every line or for none
        problems.append(
            Problem(shown, bare.line, 1, "lock", "has no --hash while other lines do: run imgbuild lock again")
        )
    return tuple(pins)


def load_recipe(
    path: str | Path,
    environ: dict[str, str] | None = None,
    secrets: tuple[str, ...] | list[str] = (),
    lock: bool = True,
) -> LoadedRecipe:
    """Load, merge, interpolate and validate a recipe. Raises RecipeError with every problem found.

    `secrets` are the configured secret values (Settings.secrets()): a variable holding one is refused.
    `lock=False`: the lock is not read at all (`imgbuild lock` writes it: a stale or broken lock is what
    it cures, never a reason to refuse; it reads the old lock itself, as preferences only)."""
    environ = dict(os.environ if environ is None else environ)
    path = Path(path)
    if any(ord(c) < 32 for c in str(path)):
        raise RecipeError([Problem(repr(str(path))[1:-1], 0, 0, "", "a recipe's path may not hold control characters")])
    if not path.is_file():
        raise RecipeError([Problem(display_path(path), 0, 0, "", "no such recipe file")])
    problems: list[Problem] = []
    root = repository_root(path.parent)
    if not path.resolve().is_relative_to(root):
        raise RecipeError(
            [
                Problem(
                    display_path(path),
                    0,
                    0,
                    "",
                    f"the recipe is a link to a file outside its repository ({root.name}/)",
                )
            ]
        )
    layers = load_chain(path, environ, problems, [], root, tuple(secrets))
    located = merged_positions(layers)
    refused, held = _refuse_credentials(located)
    manifest: dict[str, list[SourceFile]] = {}
    digests: dict[str, str] = {}
    requirements = _check_paths(manifest, digests, located, root, tuple(secrets), problems)
    lock_path, lock_lines = read_lock(path, root, problems) if lock else (None, ())
    recipe, issues = validate(Recipe, located.data)
    reported = {p.field for p in problems}  # a path refused above is not also "missing"
    problems.extend(
        located.problem(i.at, i.message, i.hint, key=i.key, fallback_file=display_path(path))
        for i in issues
        if dotted(i.at) not in reported
    )
    if held:  # what another rule says of a field holding a credential may show it: the refusal says enough
        problems = refused + [p for p in problems if not _shows(p.field, held)]
    if problems:
        raise RecipeError(_dedupe(problems))
    assert recipe is not None
    sources = {f.dest: Path(f.src) for f in recipe.files}
    return LoadedRecipe(
        recipe=recipe,
        path=path.resolve(),
        chain=[layer.path for layer in layers],
        file_sources=sources,
        requirements_path=Path(recipe.pip.requirements) if recipe.pip.requirements else None,
        ca_bundle_path=Path(recipe.pip.ca_bundle) if recipe.pip.ca_bundle else None,
        located=located,
        root=root,
        file_manifest=manifest,
        lock_path=lock_path,
        lock_pins=tuple(line.spec for line in lock_lines),
        lock_lines=lock_lines,
        requirements=tuple(requirements.requirements),
        requirement_constraints=tuple(requirements.constraints),
        requirement_options=tuple(requirements.options),
        file_digests=digests,
    )


def _refuse_credentials(located: Located) -> tuple[list[Problem], tuple[str, ...]]:
    """Every text the recipe holds, keys and values of every field (as merged and interpolated), judged by the one
    credential rule: whatever field a token is in, it reaches the context, the image or its history. Returns the
    refusals (a key is named by its map, never shown) and the fields they hold, which no other message may show."""
    from imgbuild.credentials import CREDENTIAL_REFUSAL, credential_kind

    problems: list[Problem] = []
    held: list[str] = []

    def walk(value: Any, at: PathKey) -> None:
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            if isinstance(key, str) and (kind := credential_kind(key)):
                pos = located.where((*at, key), key=True) or Pos("", 0, 0)
                said = f"a key holds what looks like a credential ({kind}): it {CREDENTIAL_REFUSAL}"
                problems.append(Problem(pos.file, pos.line, pos.col, dotted(at), said))
                held.append(dotted((*at, key)))
            walk(item, (*at, key))
        if isinstance(value, str) and (kind := credential_kind(value)):
            problems.append(
                located.problem(at, f"holds what looks like a credential ({kind}): it {CREDENTIAL_REFUSAL}")
            )
            held.append(dotted(at))

    walk(located.data, ())
    return problems, tuple(held)


def _shows(field: str, held: tuple[str, ...]) -> bool:
    """Whether a problem at `field` is about one of the `held` fields (or inside one)."""
    return any(field == f or field.startswith((f"{f}.", f"{f}[")) for f in held)


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[Any, ...]] = set()
    out = []
    for p in problems:
        key = (p.file, p.line, p.col, p.field, p.message)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def json_schema() -> dict[str, Any]:
    schema = _json_schema(Recipe)
    schema["title"] = "imgbuild recipe"
    return schema
