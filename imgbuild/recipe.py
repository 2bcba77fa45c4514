"""Stage 1: load a recipe (YAML + `extends` + `${VAR}`), validate it, and return a typed model.

Every problem is reported at once as `FILE:LINE:COL: field.path: what is wrong (hint)`.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from imgbuild.errors import Problem, RecipeError
from imgbuild.yamlpos import Located, PathKey, Pos, load_located

# --- field rules, as data -------------------------------------------------------------------------

NAME_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
IMAGE_RE = re.compile(r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9._/-]+(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                      r"(?:@sha256:[a-f0-9]{64})?$")
NGC_TAG_RE = re.compile(r"^(?:\d{2}\.\d{2}(?:-tf[12])?(?:-py3)?(?:-[a-z0-9]+)?|latest|[0-9.*]+\*[0-9a-z.*-]*)$")
APT_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]*(?::[a-z0-9-]+)?(?:=[A-Za-z0-9.+~:-]+)?$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
ABS_PATH_RE = re.compile(r"^/[A-Za-z0-9._/@+ -]*$")
MODE_RE = re.compile(r"^0?[0-7]{3,4}$")
SHELL_META = re.compile(r"[\n\r\0`;&|$<>\\\"']")

#: Env keys that describe the base; overriding them would make the image lie about itself.
PROTECTED_ENV = frozenset({
    "CUDA_VERSION", "CUDNN_VERSION", "NCCL_VERSION", "PYTORCH_VERSION", "NVIDIA_PYTORCH_VERSION",
    "TENSORFLOW_VERSION", "NVIDIA_TENSORFLOW_VERSION", "PIP_CONSTRAINT", "CUDA_DRIVER_VERSION",
})
RESERVED_LABEL_PREFIX = "org.imgbuild."


def _check(pattern: re.Pattern[str], what: str, hint: str = "") -> Any:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"{what}: {value!r}" + (f" ({hint})" if hint else ""))
        return value
    return AfterValidator(check)


def _no_newline(value: str) -> str:
    if any(c in value for c in "\n\r\0"):
        raise ValueError("must be one line (no newline or NUL)")
    return value


def _pip_requirement(value: str) -> str:
    from packaging.requirements import InvalidRequirement, Requirement

    if value.startswith("-"):
        raise ValueError(f"pip options are not allowed in pip.packages: {value!r} "
                         "(use pip.index_url / pip.extra_index_urls / pip.requirements)")
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"not a valid requirement: {value!r}: {str(exc).splitlines()[0]}") from None
    if req.url and (urlsplit(req.url).username or urlsplit(req.url).password):
        raise ValueError("credentials in a requirement URL would land in the image "
                         "(give them through IMGBUILD_PIP_INDEX_URL at build time)")
    return value


def _octal_mode(value: str) -> str:
    if not MODE_RE.match(value):
        raise ValueError(f"not an octal file mode: {value!r} (write it quoted, e.g. \"0644\")")
    return value.rjust(4, "0")


def _index_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https", "file"):
        raise ValueError(f"not an index URL: {value!r}")
    if parts.username or parts.password:
        raise ValueError("credentials in a recipe end up in git and in the image "
                         "(set IMGBUILD_PIP_INDEX_URL in the environment at build time instead)")
    return _no_newline(value)


AptName = Annotated[str, _check(APT_RE, "not a Debian/Ubuntu package name",
                                "letters, digits and + . - only; optional =version")]
PipSpec = Annotated[str, AfterValidator(_pip_requirement)]
OneLine = Annotated[str, AfterValidator(_no_newline)]


def _number_to_text(value: Any) -> Any:
    """`OMP_NUM_THREADS: 4` means the text "4"; booleans stay an error (yes/no are ambiguous)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


EnvValue = Annotated[str, BeforeValidator(_number_to_text), AfterValidator(_no_newline)]
AbsPath = Annotated[str, _check(ABS_PATH_RE, "must be an absolute path of plain characters")]
IndexUrl = Annotated[str, AfterValidator(_index_url)]
EnvKey = Annotated[str, _check(ENV_KEY_RE, "not a valid environment variable name")]


def _env_key(value: str) -> str:
    if value in PROTECTED_ENV:
        raise ValueError(f"{value} describes the base image and cannot be overridden")
    return value


def _label_key(value: str) -> str:
    if not LABEL_KEY_RE.match(value):
        raise ValueError(f"not a valid label key: {value!r}")
    if value.startswith(RESERVED_LABEL_PREFIX):
        raise ValueError(f"labels under {RESERVED_LABEL_PREFIX} are written by imgbuild")
    return value


# --- the model ------------------------------------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Base(_Strict):
    """An NGC framework image (`framework` + `tag`) or any other image (`image`)."""

    framework: Literal["pytorch", "tensorflow"] | None = None
    tag: Annotated[str, _check(NGC_TAG_RE, "not an NGC tag",
                               "e.g. 24.05, 24.05-py3, 24.05-tf2-py3, latest or 24.*")] | None = None
    image: Annotated[str, _check(IMAGE_RE, "not an image reference")] | None = None
    follow: Annotated[str, _check(NGC_TAG_RE, "not a tag pattern", "e.g. latest or 24.*")] | None = None

    @model_validator(mode="after")
    def _one_form(self) -> Base:
        if self.image and (self.framework or self.tag):
            raise ValueError("give either image, or framework and tag, not both")
        if not self.image and not (self.framework and self.tag):
            raise ValueError("needs framework and tag (e.g. framework: pytorch, tag: \"24.05\") or image")
        if self.follow and not self.framework:
            raise ValueError("follow needs framework and tag (imgbuild bump moves tag along the pattern)")
        return self


class Pip(_Strict):
    packages: list[PipSpec] = Field(default_factory=list)
    requirements: str | None = None
    constraints: list[PipSpec] = Field(default_factory=list)
    index_url: IndexUrl | None = None
    extra_index_urls: list[IndexUrl] = Field(default_factory=list)
    trusted_hosts: list[Annotated[str, _check(re.compile(r"^[A-Za-z0-9.-]+(:\d+)?$"), "not a host")]] = \
        Field(default_factory=list)
    ca_bundle: str | None = None


class User(_Strict):
    name: Annotated[str, _check(USER_RE, "not a valid user name", "lower case, starts with a letter")] = "user"
    uid: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    gid: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    home: AbsPath | None = None


class FileSpec(_Strict):
    src: OneLine
    dest: AbsPath
    mode: Annotated[str, AfterValidator(_octal_mode)] | None = None
    owner: Literal["user", "root"] | None = None


class Smoke(_Strict):
    require_gpu: bool = False
    min_speedup: float | None = None


class Recipe(_Strict):
    """The validated recipe; the single source of truth for the JSON schema in docs/recipe.schema.json."""

    name: Annotated[str, _check(NAME_RE, "not a valid image name", "lower case letters, digits, . _ -")]
    tag: Annotated[str, _check(TAG_RE, "not a valid image tag")] = "latest"
    image: Annotated[str, _check(IMAGE_RE, "not an image name", "e.g. alice/research")] | None = None
    extends: str | None = None
    description: OneLine | None = None
    base: Base
    apt: list[AptName] = Field(default_factory=list)
    pip: Pip = Field(default_factory=Pip)
    user: User | None = None
    run: list[OneLine] = Field(default_factory=list)
    files: list[FileSpec] = Field(default_factory=list)
    workdir: AbsPath = "/workspace"
    env: dict[Annotated[EnvKey, AfterValidator(_env_key)], EnvValue] = Field(default_factory=dict)
    labels: dict[Annotated[str, AfterValidator(_label_key)], OneLine] = Field(default_factory=dict)
    args: dict[Annotated[EnvKey, _check(re.compile(r"^(?!IMGBUILD_)"), "IMGBUILD_ args are reserved")],
               EnvValue] = Field(default_factory=dict)
    entrypoint: list[OneLine] | OneLine | None = None
    cmd: list[OneLine] | OneLine | None = None
    smoke: Smoke = Field(default_factory=Smoke)


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

    @property
    def display(self) -> str:
        return display_path(self.path)


def stable_name(path: Path) -> str:
    """`recipes/x.yaml`: the recipe's folder and file name, the same on every machine and from any cwd."""
    path = Path(path)
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# --- ${VAR} interpolation -------------------------------------------------------------------------

_VAR_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{([^}]*)\}?")


def interpolate(located: Located, environ: dict[str, str], problems: list[Problem]) -> None:
    """Replace ${VAR} and ${VAR:-default} in every string value; `$$` is a literal `$`."""

    def sub(text: str, at: PathKey) -> str:
        def one(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            if m.group(3) is not None or m.group(1) is None:
                problems.append(located.problem(at, f"bad variable reference {m.group(0)!r}",
                                                "write ${NAME} or ${NAME:-default}; $$ for a literal $"))
                return m.group(0)
            name, default = m.group(1), m.group(2)
            if name in environ and (environ[name] != "" or default is None):
                return environ[name]
            if default is not None:
                return default
            problems.append(located.problem(at, f"environment variable {name} is not set",
                                            f"set it, or write ${{{name}:-default}}"))
            return ""
        return _VAR_RE.sub(one, text)

    def walk(value: Any, at: PathKey) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, (*at, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, (*at, i)) for i, v in enumerate(value)]
        if isinstance(value, str) and "$" in value:
            return sub(value, at)
        return value

    located.data = walk(located.data, ())


# --- shorthands and merging -----------------------------------------------------------------------

def _move(located: Located, old: PathKey, new: PathKey) -> None:
    """Re-key positions under `old` to live under `new` (after a shorthand is expanded)."""
    tables: tuple[dict[PathKey, Any], ...] = (located.values, located.keys, located.raw)
    for table in tables:
        for path in [p for p in table if p[: len(old)] == old]:
            table[new + path[len(old):]] = table[path]


def normalize(located: Located) -> None:
    """Expand the shorthands (`base: IMAGE`, `pip: [..]`, `user: true|NAME`) and keep positions right."""
    data = located.data
    if not isinstance(data, dict):
        return
    if isinstance(data.get("base"), str):
        _move(located, ("base",), ("base", "image"))
        data["base"] = {"image": data["base"]}
    if isinstance(data.get("pip"), list):
        _move(located, ("pip",), ("pip", "packages"))
        data["pip"] = {"packages": data["pip"]}
    user = data.get("user")
    if user is True:
        data["user"] = {}
    elif user is False or ("user" in data and user is None):
        data.pop("user")
    elif isinstance(user, str):
        _move(located, ("user",), ("user", "name"))
        data["user"] = {"name": user}
    for i, spec in enumerate(data.get("files") or []):
        mode = spec.get("mode") if isinstance(spec, dict) else None
        if isinstance(mode, int) and not isinstance(mode, bool):
            # YAML 1.1 reads 0644 as the integer 420: take the digits as written.
            spec["mode"] = located.raw.get(("files", i, "mode"), oct(mode)[2:])


def _pip_name(spec: str) -> str:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        return canonicalize_name(Requirement(spec).name)
    except InvalidRequirement:
        return spec


def _merge_keyed(parent: list[Any], child: list[Any], key: Any) -> list[Any]:
    """Parent's items in order, each replaced by the child's item of the same key; the child's new ones after."""
    child_by_key = {key(c): c for c in child}
    merged = [child_by_key.pop(key(p), p) for p in parent]
    return merged + [c for c in child if key(c) in child_by_key]


#: How lists merge in `extends` (documented in docs/recipes.md). Anything else: the child replaces.
LIST_MERGE: dict[PathKey, Callable[[list[Any], list[Any]], list[Any]]] = {
    ("apt",): lambda p, c: _merge_keyed(p, c, lambda x: str(x).split("=")[0]),
    ("pip", "packages"): lambda p, c: _merge_keyed(p, c, lambda x: _pip_name(str(x))),
    ("pip", "constraints"): lambda p, c: _merge_keyed(p, c, lambda x: _pip_name(str(x))),
    ("files",): lambda p, c: _merge_keyed(p, c, lambda x: x.get("dest") if isinstance(x, dict) else repr(x)),
    ("run",): lambda p, c: p + c,
}
#: Mappings that merge key by key (child wins); other mappings too, recursively.
REPLACE_WHOLE: set[PathKey] = {("entrypoint",), ("cmd",), ("base",)}


def merge(parent: Any, child: Any, at: PathKey = ()) -> Any:
    if at in REPLACE_WHOLE:
        return child
    if isinstance(parent, dict) and isinstance(child, dict):
        out = dict(parent)
        for k, v in child.items():
            out[k] = merge(parent[k], v, (*at, k)) if k in parent else v
        return out
    if isinstance(parent, list) and isinstance(child, list) and at in LIST_MERGE:
        return LIST_MERGE[at](parent, child)
    return child


# --- loading --------------------------------------------------------------------------------------

@dataclass
class _Layer:
    located: Located
    path: Path


def _resolve_relative(located: Located, base_dir: Path) -> None:
    """Make file paths absolute relative to the file that declared them, before any merge."""
    data = located.data
    if not isinstance(data, dict):
        return
    for spec in data.get("files") or []:
        if isinstance(spec, dict) and isinstance(spec.get("src"), str):
            spec["src"] = str((base_dir / spec["src"]).resolve())
    pip = data.get("pip")
    if isinstance(pip, dict):
        for key in ("requirements", "ca_bundle"):
            if isinstance(pip.get(key), str):
                pip[key] = str((base_dir / pip[key]).resolve())


def _load_chain(path: Path, environ: dict[str, str], problems: list[Problem],
                stack: list[Path]) -> list[_Layer]:
    path = path.resolve()
    display = display_path(path)
    if path in stack:
        cycle = " -> ".join(display_path(p) for p in [*stack, path])
        raise RecipeError([Problem(display_path(stack[-1]), 0, 0, "extends", f"extends cycle: {cycle}")])
    located = load_located(path, display)
    if located.data is None or not isinstance(located.data, dict):
        raise RecipeError([Problem(display, 1, 1, "", "a recipe must be a YAML mapping of fields")])
    interpolate(located, environ, problems)
    normalize(located)
    _resolve_relative(located, path.parent)
    layers: list[_Layer] = []
    parent = located.data.get("extends")
    if parent is not None:
        if not isinstance(parent, str):
            problems.append(located.problem(("extends",), "must be a path to another recipe"))
        else:
            parent_path = (path.parent / parent)
            if not parent_path.is_file():
                problems.append(located.problem(("extends",), f"no such recipe: {parent}",
                                                "paths are relative to this recipe's folder"))
            else:
                layers = _load_chain(parent_path, environ, problems, [*stack, path])
    return [*layers, _Layer(located, path)]


def _merged_positions(layers: list[_Layer]) -> Located:
    """Positions of the merged recipe: for each path, the last (most specialised) file that set it."""
    values: dict[PathKey, Pos] = {}
    keys: dict[PathKey, Pos] = {}
    raw: dict[PathKey, str] = {}
    data: Any = {}
    for layer in layers:
        values.update(layer.located.values)
        keys.update(layer.located.keys)
        raw.update(layer.located.raw)
        data = merge(data, layer.located.data)
    merged = Located(data, values, keys, raw)
    # Lists merged by key change indices: re-point each item to the file/line that declared it.
    for list_path in LIST_MERGE:
        items = _get(data, list_path)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            for layer in reversed(layers):
                src = _get(layer.located.data, list_path)
                if isinstance(src, list) and any(item is s for s in src):
                    j = next(k for k, s in enumerate(src) if item is s)
                    old = (*list_path, j)
                    for table, src_table in ((merged.values, layer.located.values),
                                             (merged.keys, layer.located.keys)):
                        for p, v in src_table.items():
                            if p[: len(old)] == old:
                                table[(*list_path, i, *p[len(old):])] = v
                    break
    return merged


def _get(data: Any, path: PathKey) -> Any:
    for part in path:
        if isinstance(data, dict) and isinstance(part, str):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


_PYDANTIC_MESSAGES = {
    "missing": "missing required field",
    "string_type": "must be a string (quote it)",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "bool_type": "must be true or false",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "literal_error": None,  # pydantic's text names the allowed values
}


def _translate(err: dict[str, Any], located: Located, recipe_fields: dict[PathKey, list[str]]) -> Problem:
    loc: PathKey = tuple(err["loc"])
    # Drop union branch names (e.g. 'list[str]') that are not part of the data path.
    path: list[str | int] = []
    node = located.data
    for part in loc:
        in_mapping = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if in_mapping or in_list:
            path.append(part)
            node = node[part]
        elif part == loc[-1] and err["type"] in ("extra_forbidden", "missing"):
            path.append(part)  # the key that is extra or absent
    at = tuple(path)
    kind = err["type"]
    on_key = "[key]" in loc
    if kind == "extra_forbidden":
        known = recipe_fields.get(at[:-1], [])
        close = difflib.get_close_matches(str(at[-1]), known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else (f"known: {', '.join(known)}" if known else "")
        return located.problem(at, "unknown key", hint, key=True)
    if kind == "missing":
        return located.problem(at, "missing required field")
    message = _PYDANTIC_MESSAGES.get(kind) or err["msg"]
    if kind in ("string_type",) and isinstance(err.get("input"), bool):
        message = "must be a string (quote it: YAML reads yes/no/on/off as booleans)"
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    hint = ""
    if message.endswith(")") and " (" in message:
        message, hint = message[:-1].split(" (", 1)
    return located.problem(at, message, hint, key=on_key)


def _model_fields(model: type[BaseModel], at: PathKey = ()) -> dict[PathKey, list[str]]:
    out = {at: list(model.model_fields)}
    for name, info in model.model_fields.items():
        ann = info.annotation
        for candidate in getattr(ann, "__args__", (ann,)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                out.update(_model_fields(candidate, (*at, name)))
    return out


def _check_paths(located: Located, problems: list[Problem]) -> None:
    data = located.data
    for i, spec in enumerate(data.get("files") or []):
        if isinstance(spec, dict) and isinstance(spec.get("src"), str):
            src = Path(spec["src"])
            if not src.exists():
                problems.append(located.problem(("files", i, "src"), f"no such file: {src.name}",
                                                "paths are relative to the recipe that names them"))
    pip = data.get("pip") if isinstance(data.get("pip"), dict) else {}
    for key in ("requirements", "ca_bundle"):
        value = pip.get(key)
        if isinstance(value, str) and not Path(value).is_file():
            problems.append(located.problem(("pip", key), f"no such file: {Path(value).name}",
                                            "paths are relative to the recipe that names them"))
    req = pip.get("requirements")
    if isinstance(req, str) and Path(req).is_file():
        for lineno, line in enumerate(Path(req).read_text().splitlines(), 1):
            spec = line.split(" #", 1)[0].strip()
            if not spec or spec.startswith("#"):
                continue
            try:
                _pip_requirement(spec)
            except ValueError as exc:
                problems.append(Problem(display_path(Path(req)), lineno, 1, "pip.requirements", str(exc)))
    dests: dict[str, int] = {}
    for i, spec in enumerate(data.get("files") or []):
        if isinstance(spec, dict) and isinstance(spec.get("dest"), str):
            if spec["dest"] in dests:
                problems.append(located.problem(("files", i, "dest"), f"{spec['dest']} is already a destination "
                                                f"of files[{dests[spec['dest']]}]"))
            dests[spec["dest"]] = i
    for i, cmd in enumerate(data.get("run") or []):
        if isinstance(cmd, str) and cmd.strip() == "":
            problems.append(located.problem(("run", i), "empty command"))


def load_recipe(path: str | Path, environ: dict[str, str] | None = None) -> LoadedRecipe:
    """Load, merge, interpolate and validate a recipe. Raises RecipeError with every problem found."""
    environ = dict(os.environ if environ is None else environ)
    path = Path(path)
    if not path.is_file():
        raise RecipeError([Problem(display_path(path), 0, 0, "", "no such recipe file")])
    problems: list[Problem] = []
    layers = _load_chain(path, environ, problems, [])
    located = _merged_positions(layers)
    _check_paths(located, problems)
    recipe: Recipe | None = None
    try:
        recipe = Recipe.model_validate(located.data)
    except ValidationError as exc:
        fields = _model_fields(Recipe)
        problems.extend(_translate(dict(e), located, fields) for e in exc.errors(include_url=False))
    if problems:
        raise RecipeError(_dedupe(problems))
    assert recipe is not None
    sources = {f.dest: Path(f.src) for f in recipe.files}
    return LoadedRecipe(
        recipe=recipe, path=path.resolve(), chain=[layer.path for layer in layers], file_sources=sources,
        requirements_path=Path(recipe.pip.requirements) if recipe.pip.requirements else None,
        ca_bundle_path=Path(recipe.pip.ca_bundle) if recipe.pip.ca_bundle else None,
        located=located,
    )


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
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "imgbuild recipe"
    return schema
