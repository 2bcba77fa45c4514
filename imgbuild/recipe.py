"""Stage 1: load a recipe (YAML + `extends` + `${VAR}`), validate it, and return a typed model.

Every problem is reported at once as `FILE:LINE:COL: field.path: what is wrong (hint)`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from imgbuild import limits, reqfile
from imgbuild.errors import Problem, RecipeError
from imgbuild.facts import IMAGE_DIR, LOADER_ENV, Label
from imgbuild.fields import (
    Flag,
    Integer,
    ListOf,
    ListOrText,
    MapOf,
    Maybe,
    Model,
    Number,
    OneOf,
    Text,
    matches,
    typed,
    validate,
)
from imgbuild.fields import json_schema as _json_schema
from imgbuild.fields import show as _show
from imgbuild.imageref import COMPONENT_RE, TAG_RE
from imgbuild.ngc import FRAMEWORKS
from imgbuild.ngc import TAG_OR_PATTERN_RE as NGC_TAG_OR_PATTERN_RE
from imgbuild.repofiles import (
    OutsideRepository,
    SourceFile,
    files_digest,
    regular_file,
    repository_root,
    resolve_inside,
    source_files,
)
from imgbuild.yamlpos import Located, PathKey, Pos, dotted, load_located, read_text_bounded

# --- field rules, as data -------------------------------------------------------------------------
# Every pattern is matched against the whole string (`fullmatch`): `$` would also match before a final
# newline, and a newline in a rendered Dockerfile starts a new instruction.

APT_RE = re.compile(r"[a-z0-9][a-z0-9+.-]*(?::[a-z0-9-]+)?(?:=[A-Za-z0-9.+~:-]+)?")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LABEL_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
ABS_PATH_RE = re.compile(r"/[A-Za-z0-9._/@+ -]{0,1023}")
MODE_RE = re.compile(r"0?[0-7]{3,4}")
HOST_RE = re.compile(r"[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?")

#: Env keys that describe the base; overriding them would make the image lie about itself.
PROTECTED_ENV = frozenset(
    {
        "CUDA_VERSION",
        "CUDNN_VERSION",
        "NCCL_VERSION",
        "PYTORCH_VERSION",
        "NVIDIA_PYTORCH_VERSION",
        "TENSORFLOW_VERSION",
        "NVIDIA_TENSORFLOW_VERSION",
        "PIP_CONSTRAINT",
        "CUDA_DRIVER_VERSION",
    }
)
RESERVED_LABEL_PREFIX = Label.PREFIX
#: Accounts every Debian/Ubuntu base already has: the recipe's user must be a new one (add-user.sh would
#: otherwise rewrite a system account's UID, home and shell).
SYSTEM_USERS = frozenset(
    {
        "root",
        "daemon",
        "bin",
        "sys",
        "sync",
        "games",
        "man",
        "lp",
        "mail",
        "news",
        "uucp",
        "proxy",
        "www-data",
        "backup",
        "list",
        "irc",
        "gnats",
        "nobody",
        "nogroup",
        "_apt",
        "systemd-network",
        "systemd-resolve",
        "systemd-timesync",
        "messagebus",
        "sshd",
        "syslog",
        "uuidd",
        "tcpdump",
        "postfix",
        "ntp",
        "polkitd",
    }
)
#: Folders the image user must never own (home and workdir are chown'ed to the user).
SYSTEM_DIRS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
)
SYSTEM_DIRS_EXACT = frozenset({"/", "/tmp", "/opt", "/home", "/mnt", "/srv", "/media", "/usr/local"})


def _no_newline(value: str) -> str:
    from imgbuild.text import describe, unsafe_character

    bad = unsafe_character(value, allow_tab=True)
    if bad is not None:
        raise ValueError(
            f"must be one line of plain text: {describe(bad)} is refused (no control character, line separator "
            "or bidirectional control)"
        )
    if len(value) > limits.VALUE_CHARS:
        raise ValueError(f"longer than {limits.VALUE_CHARS} characters")
    return value


def _abs_path(value: str) -> str:
    """A canonical absolute path: plain characters, no `.`/`..` parts, no `//`, no trailing slash."""
    if not ABS_PATH_RE.fullmatch(value):
        raise ValueError(f"must be an absolute path of plain characters: {_show(value)}")
    parts = value.split("/")[1:]
    if value != "/" and ("" in parts or any(p in (".", "..") for p in parts)):
        raise ValueError(f"must be a plain absolute path without '.', '..', '//' or a trailing '/': {_show(value)}")
    return value


def _owned_dir(value: str) -> str:
    """home and workdir become the image user's: never a system folder."""
    if value in SYSTEM_DIRS_EXACT or any(value == d or value.startswith(d + "/") for d in SYSTEM_DIRS):
        raise ValueError(f"{value} is a system folder; the image user would own it (use e.g. /workspace)")
    return value


def _dest_path(value: str) -> str:
    if value == "/":
        raise ValueError("cannot copy onto / (name a file or folder under it)")
    if value == IMAGE_DIR or value.startswith(IMAGE_DIR + "/"):
        raise ValueError(f"{IMAGE_DIR} is imgbuild's own folder (the base's records the smoke test reads)")
    return value


def _user_name(value: str) -> str:
    if value in SYSTEM_USERS or value.startswith("systemd-"):
        raise ValueError(f"{value} is a system account of the base (choose a new name, e.g. user)")
    return value


def _reference(value: str, example: str) -> Any:
    from imgbuild.imageref import BadReference, parse

    try:
        return parse(value)
    except BadReference as exc:
        raise ValueError(f"{exc} (e.g. {example})") from None


def _image_name(value: str) -> str:
    if _reference(value, "alice/research or registry.example:5000/lab/research:v1").digest:
        raise ValueError("an image to build cannot carry a digest")
    return value


def _base_image(value: str) -> str:
    _reference(value, "ubuntu:22.04 or nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04")
    return value


def _pip_requirement(value: str) -> str:
    from packaging.requirements import InvalidRequirement, Requirement

    _no_newline(value)
    if value.startswith("-"):
        raise ValueError(
            f"pip options are not allowed in pip.packages: {_show(value)} "
            "(use pip.index_url / pip.extra_index_urls / pip.requirements)"
        )
    reqfile.requirement_text_fault(value)
    try:
        req = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"not a valid requirement: {_show(value)}: {str(exc).splitlines()[0][:120]}") from None
    if req.url and reqfile.requirement_url_fault(req.url):
        raise ValueError(reqfile.requirement_url_fault(req.url).replace("pip_index_url", "IMGBUILD_PIP_INDEX_URL"))
    return value


def _octal_mode(value: str) -> str:
    if not MODE_RE.fullmatch(value):
        raise ValueError(f'not an octal file mode: {_show(value)} (write it quoted, e.g. "0644")')
    return value.rjust(4, "0")


def _index_url(value: str) -> str:
    _no_newline(value)
    fault = reqfile.index_url_fault(value)
    if fault == "token":
        raise ValueError(f"not an index URL: {_show(value)} (one ASCII word: no white space or control character)")
    if fault == "scheme":
        raise ValueError(f"not an index URL: {_show(value)} (http:// or https://)")
    if fault == "credentials":
        raise ValueError(
            "credentials in a recipe end up in git and in the image "
            "(set IMGBUILD_PIP_INDEX_URL in the environment at build time instead)"
        )
    return _no_newline(value)


def _env_key(value: str) -> str:
    if value in PROTECTED_ENV:
        raise ValueError(f"{value} describes the base image and cannot be overridden")
    if value in LOADER_ENV:
        raise ValueError(
            f"{value} in an image runs code in every process, and on NVIDIA Container Toolkit 1.17.7 or older on the "
            "host (CVE-2025-23266); put the library in LD_LIBRARY_PATH or install it"
        )
    return value


def _label_key(value: str) -> str:
    if not LABEL_KEY_RE.fullmatch(value):
        raise ValueError(f"not a valid label key: {_show(value)}")
    if value.startswith(RESERVED_LABEL_PREFIX):
        raise ValueError(f"labels under {RESERVED_LABEL_PREFIX} are written by imgbuild")
    return value


def _unpinnable(value: str) -> str:
    from packaging.utils import canonicalize_name

    from imgbuild.ngc import CUDA_PACKAGE_PREFIXES

    name = canonicalize_name(value)
    if any(name in fw.packages for fw in FRAMEWORKS.values()) or name.startswith(CUDA_PACKAGE_PREFIXES):
        raise ValueError(f"{_show(value)} is the base's framework or CUDA stack, which is never unpinned")
    return value


def _not_imgbuild(value: str) -> str:
    if value.startswith("IMGBUILD_"):
        raise ValueError("IMGBUILD_ args are reserved")
    return value


def _gpu_target(value: str) -> str:
    from imgbuild.fleet import target_rule  # the fleet rules load only for a recipe that names targets

    return target_rule(value)


_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_DIST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")

# The field types, as data (checked by imgbuild.fields; the same declarations give the JSON schema).
ONE_LINE = Text(_no_newline)
OWNED_DIR = Text(_abs_path, _owned_dir)
PIP_SPEC = Text(_pip_requirement)
INDEX_URL = Text(_index_url)
ENV_VALUE = Text(_no_newline, numbers=True)  # `OMP_NUM_THREADS: 4` means the text "4"; yes/no stay an error
ENV_KEY = Text(matches(ENV_KEY_RE, "not a valid environment variable name"), _env_key)
APT_NAME = Text(
    matches(APT_RE, "not a Debian/Ubuntu package name", "letters, digits and + . - only; optional =version")
)
NGC_TAG = Text(matches(NGC_TAG_OR_PATTERN_RE, "not an NGC tag", "e.g. 24.05, 24.05-py3, 24.05-tf2-py3, latest or 24.*"))
DIST_NAME = Text(matches(_DIST_RE, "not a package name", "e.g. opencv-python"))
UID = Maybe(Integer(ge=1, le=2**31 - 1))


@dataclass(frozen=True, kw_only=True)
class Base:
    """An NGC framework image (`framework` + `tag`) or any other image (`image`)."""

    framework: str | None = typed(Maybe(OneOf(*FRAMEWORKS)), None)
    tag: str | None = typed(Maybe(NGC_TAG), None, doc="the NGC release, e.g. 24.05")
    image: str | None = typed(Maybe(Text(_base_image)), None, doc="any other base image (instead of framework/tag)")
    follow: str | None = typed(
        Maybe(Text(matches(NGC_TAG_OR_PATTERN_RE, "not a tag pattern", "e.g. latest or 24.*"))),
        None,
        doc="the tag pattern imgbuild bump moves tag along",
    )

    def checked(self) -> Base:
        if self.image and (self.framework or self.tag):
            raise ValueError("give either image, or framework and tag, not both")
        if not self.image and not (self.framework and self.tag):
            raise ValueError('needs framework and tag (e.g. framework: pytorch, tag: "24.05") or image')
        if self.follow and not self.framework:
            raise ValueError("follow needs framework and tag (imgbuild bump moves tag along the pattern)")
        return self


@dataclass(frozen=True, kw_only=True)
class Pip:
    packages: list[str] = typed(ListOf(PIP_SPEC), factory=list)
    unpin: list[str] = typed(
        ListOf(Text(matches(_DIST_RE, "not a package name"), _unpinnable), max_length=64),
        factory=list,
        doc="base packages whose pin is dropped on purpose (reviewed): the installer may then move them",
    )
    requirements: str | None = typed(Maybe(ONE_LINE), None, doc="a requirements file, relative to the recipe")
    constraints: list[str] = typed(ListOf(PIP_SPEC), factory=list)
    index_url: str | None = typed(Maybe(INDEX_URL), None)
    extra_index_urls: list[str] = typed(ListOf(INDEX_URL), factory=list)
    trusted_hosts: list[str] = typed(ListOf(Text(matches(HOST_RE, "not a host"))), factory=list)
    ca_bundle: str | None = typed(Maybe(ONE_LINE), None, doc="a CA bundle for the index, mounted at build time only")
    installer: str = typed(
        OneOf("pip", "uv"),
        "uv",
        doc="who installs: uv (about half the time of pip) or pip; same pins and protection either way",
    )


@dataclass(frozen=True, kw_only=True)
class User:
    name: str = typed(
        Text(matches(USER_RE, "not a valid user name", "lower case, starts with a letter"), _user_name), "user"
    )
    uid: int | None = typed(UID, None)
    gid: int | None = typed(UID, None)
    home: str | None = typed(Maybe(OWNED_DIR), None)
    sudo: bool = typed(
        Flag(),
        False,
        doc="passwordless sudo for this user inside their own container; the image gains the sudo package",
    )


@dataclass(frozen=True, kw_only=True)
class FileSpec:
    src: str = typed(ONE_LINE, doc="a file or folder of the repository, relative to the recipe")
    dest: str = typed(Text(_abs_path, _dest_path))
    mode: str | None = typed(Maybe(Text(_octal_mode)), None)
    owner: str | None = typed(Maybe(OneOf("user", "root")), None)


@dataclass(frozen=True, kw_only=True)
class Smoke:
    require_gpu: bool = typed(Flag(), False)
    min_speedup: float | None = typed(Maybe(Number(gt=0)), None, doc="a hard floor for the tensor-core speed-up (> 0)")
    targets: list[str] = typed(
        ListOf(Text(_no_newline, _gpu_target), max_length=64),
        factory=list,
        doc="GPUs the image must run on (models or capabilities): the build refuses to promote it otherwise",
    )
    imports: list[str] = typed(
        ListOf(Text(matches(_MODULE_RE, "not a module name", "e.g. cv2, torch.distributed")), max_length=256),
        factory=list,
        doc="modules to import besides the top-level modules of every package the recipe adds",
    )
    skip_imports: list[str] = typed(
        ListOf(DIST_NAME, max_length=256),
        factory=list,
        doc="distributions whose imports are not checked (they need hardware or a display to import)",
    )
    run: list[str] = typed(
        ListOf(ONE_LINE, max_length=32),
        factory=list,
        doc="commands that must succeed in the built image (run as its user, no GPU guaranteed)",
    )


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """The validated recipe; the single source of truth for the JSON schema in docs/recipe.schema.json."""

    name: str = typed(
        Text(
            matches(COMPONENT_RE, "not a valid image name", "lower case letters, digits, . _ -"),
            max_length=limits.NAME_CHARS,
        )
    )
    tag: str = typed(Text(matches(TAG_RE, "not a valid image tag", "letters, digits, _ . -; at most 128")), "latest")
    image: str | None = typed(Maybe(Text(_image_name)), None, doc="the image to build, instead of <user>/<name>")
    extends: str | None = typed(Maybe(ONE_LINE), None, doc="a recipe this one adds to, relative to it")
    description: str | None = typed(Maybe(ONE_LINE), None)
    base: Base = typed(Model(Base))
    apt: list[str] = typed(ListOf(APT_NAME), factory=list)
    pip: Pip = typed(Model(Pip), factory=Pip)
    user: User | None = typed(Maybe(Model(User)), None)
    run: list[str] = typed(ListOf(ONE_LINE), factory=list)
    files: list[FileSpec] = typed(ListOf(Model(FileSpec)), factory=list)
    workdir: str = typed(OWNED_DIR, "/workspace")
    env: dict[str, str] = typed(MapOf(ENV_KEY, ENV_VALUE), factory=dict)
    labels: dict[str, str] = typed(MapOf(Text(_label_key), ONE_LINE), factory=dict)
    args: dict[str, str] = typed(
        MapOf(Text(matches(ENV_KEY_RE, "not a valid environment variable name"), _not_imgbuild), ENV_VALUE),
        factory=dict,
    )
    entrypoint: list[str] | str | None = typed(Maybe(ListOrText(ONE_LINE)), None)
    cmd: list[str] | str | None = typed(Maybe(ListOrText(ONE_LINE)), None)
    smoke: Smoke = typed(Model(Smoke), factory=Smoke)

    def checked(self) -> Recipe:
        if self.user and self.user.sudo and "sudo" not in self.apt:
            return dataclasses.replace(self, apt=[*self.apt, "sudo"])
        return self


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


#: Variables that hold imgbuild's own secrets or a CI system's credentials: never interpolated.
SECRET_VARIABLES = frozenset(
    {
        "NGC_API_KEY",
        "NGC_CLI_API_KEY",
        "IMGBUILD_NGC_API_KEY",
        "IMGBUILD_PIP_INDEX_URL",
        "IMGBUILD_PIP_EXTRA_INDEX_URLS",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "UV_INDEX_URL",
        "UV_EXTRA_INDEX_URL",
        "DOCKER_AUTH_CONFIG",
        "CI_JOB_TOKEN",
        "CI_REGISTRY_PASSWORD",
        "CI_DEPLOY_PASSWORD",
        "GITHUB_TOKEN",
        "ACTIONS_RUNTIME_TOKEN",
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN",
        "ACTIONS_ID_TOKEN_REQUEST_URL",
        "CI_JOB_JWT",
        "CI_JOB_JWT_V1",
        "CI_JOB_JWT_V2",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    }
)
#: Names that say "credential" in any CI system's dialect.
SECRET_NAME_RE = re.compile(
    r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|API_?KEY|APIKEY|CREDENTIALS?|"
    r"PRIVATE_KEY|AUTH|AUTH_CONFIG|JWT|ID_TOKEN)(?:_|$)",
    re.IGNORECASE,
)


#: A JSON Web Token: base64url header (`{"` encodes as `eyJ`), payload and signature.
JWT_RE = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{2,}")


def secret_variable(name: str, value: str, secrets: tuple[str, ...] = ()) -> bool:
    """Would interpolating `name` copy a secret into the image or the committed context?"""
    if name in SECRET_VARIABLES or SECRET_NAME_RE.search(name):
        return True
    if any(secret and secret in value for secret in secrets):
        return True
    if JWT_RE.search(value):  # an identity token (GitLab's id_tokens, GitHub's OIDC) whatever its name
        return True
    parts = urlsplit(value) if "://" in value else None
    return bool(parts and parts.password)


def interpolate(
    located: Located, environ: dict[str, str], problems: list[Problem], secrets: tuple[str, ...] = ()
) -> None:
    """Replace ${VAR} and ${VAR:-default} in every string value; `$$` is a literal `$`.

    A variable that holds a secret (a configured one, a known credential variable, a URL with a
    password) is refused: whatever it is interpolated into ends in the image or the rendered context."""

    def walk(value: Any, at: PathKey) -> Any:
        if isinstance(value, dict):
            return {k: walk(v, (*at, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, (*at, i)) for i, v in enumerate(value)]
        if isinstance(value, str) and "$" in value:
            return _VAR_RE.sub(
                lambda m: _substitute(m, environ, secrets, lambda *p: problems.append(located.problem(at, *p))), value
            )
        return value

    located.data = walk(located.data, ())


def _substitute(m: re.Match[str], environ: dict[str, str], secrets: tuple[str, ...], report: Any) -> str:
    """One `$$`, `${NAME}` or `${NAME:-default}`; `report(message, hint)` records a problem."""
    if m.group(0) == "$$":
        return "$"
    if m.group(3) is not None or m.group(1) is None:
        report(f"bad variable reference {_show(m.group(0))}", "write ${NAME} or ${NAME:-default}; $$ for a literal $")
        return m.group(0)
    name, default = m.group(1), m.group(2)
    if name in environ and secret_variable(name, environ[name], secrets):
        report(
            f"${{{name}}} holds a secret; it would be written into the image and its context",
            "pass secrets at run time, never in a recipe",
        )
        return ""
    if name in environ and (environ[name] != "" or default is None):
        return environ[name]
    if default is not None:
        return str(default)
    report(f"environment variable {name} is not set", f"set it, or write ${{{name}:-default}}")
    return ""


# --- shorthands and merging -----------------------------------------------------------------------


def _move(located: Located, old: PathKey, new: PathKey) -> None:
    """Re-key positions under `old` to live under `new` (after a shorthand is expanded)."""
    tables: tuple[dict[PathKey, Any], ...] = (located.values, located.keys, located.raw)
    for table in tables:
        for path in [p for p in table if p[: len(old)] == old]:
            table[new + path[len(old) :]] = table[path]


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
    for i, spec in enumerate(_list(data, "files")):
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


#: Fields that name files: each is resolved relative to the recipe that wrote it, inside the repository.
PATH_FIELDS: tuple[PathKey, ...] = (("pip", "requirements"), ("pip", "ca_bundle"))


def _resolve_relative(located: Located, base_dir: Path, root: Path, problems: list[Problem]) -> None:
    """Make file paths absolute relative to the file that declared them, before any merge; each must stay
    inside the repository (symlinks followed). A path that may not be used is dropped, with its problem."""
    data = located.data
    if not isinstance(data, dict):
        return
    places: list[tuple[dict[str, Any], str, PathKey]] = []
    for i, spec in enumerate(_list(data, "files")):
        if isinstance(spec, dict):
            places.append((spec, "src", ("files", i, "src")))
    pip = data.get("pip")
    if isinstance(pip, dict):
        places += [(pip, str(at[1]), at) for at in PATH_FIELDS]
    for container, key, at in places:
        written = container.get(key)
        if not isinstance(written, str):
            continue
        try:
            container[key] = str(resolve_inside(base_dir, written, root))
        except OutsideRepository as exc:
            problems.append(located.problem(at, str(exc), "a recipe may name files of its own repository only"))
            del container[key]
            located.values.pop(at, None)


def _load_chain(
    path: Path,
    environ: dict[str, str],
    problems: list[Problem],
    stack: list[Path],
    root: Path,
    secrets: tuple[str, ...],
) -> list[_Layer]:
    path = path.resolve()
    display = display_path(path)
    if path in stack:
        cycle = " -> ".join(display_path(p) for p in [*stack, path])
        raise RecipeError([Problem(display_path(stack[-1]), 0, 0, "extends", f"extends cycle: {cycle}")])
    located = load_located(path, display)
    if located.data is None or not isinstance(located.data, dict):
        raise RecipeError([Problem(display, 1, 1, "", "a recipe must be a YAML mapping of fields")])
    interpolate(located, environ, problems, secrets)
    normalize(located)
    _resolve_relative(located, path.parent, root, problems)
    layers: list[_Layer] = []
    parent = located.data.get("extends")
    if parent is not None:
        if not isinstance(parent, str) or not parent or any(ord(c) < 32 for c in parent):
            problems.append(located.problem(("extends",), "must be a path to another recipe"))
        elif len(stack) + 1 >= limits.EXTENDS_DEPTH:
            raise RecipeError(
                [
                    located.problem(
                        ("extends",),
                        f"extends is nested deeper than {limits.EXTENDS_DEPTH} recipes",
                        "flatten the chain",
                    )
                ]
            )
        else:
            try:
                parent_path = resolve_inside(path.parent, parent, root)
            except OutsideRepository as exc:
                problems.append(located.problem(("extends",), str(exc), "extends names a recipe of this repository"))
                return [_Layer(located, path)]
            if not parent_path.is_file():
                problems.append(
                    located.problem(
                        ("extends",), f"no such recipe: {_show(parent)}", "paths are relative to this recipe's folder"
                    )
                )
            else:
                layers = _load_chain(parent_path, environ, problems, [*stack, path], root, secrets)
    return [*layers, _Layer(located, path)]


def _merged_positions(layers: list[_Layer]) -> Located:
    """Positions of the merged recipe: for each path, the last (most specialised) file that set it.

    Linear in the size of the recipes: positions are grouped by list item once, items found by identity."""
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
    for list_path in LIST_MERGE:  # lists merged by key change indices
        if isinstance(_get(data, list_path), list):
            _repoint_list(merged, layers, list_path)
    return merged


def _repoint_list(merged: Located, layers: list[_Layer], list_path: PathKey) -> None:
    """Re-point each merged item of the list at `list_path` to the file and line that declared it."""
    n = len(list_path)
    origin: dict[int, tuple[int, int]] = {}  # id(item) -> (layer number, index in that layer's list)
    grouped: dict[tuple[int, str | int], list[tuple[str, PathKey, Pos]]] = {}
    for layer_no, layer in enumerate(layers):  # later layers win, as in the merge
        src = _get(layer.located.data, list_path)
        if isinstance(src, list):
            origin.update({id(item): (layer_no, j) for j, item in enumerate(src)})
        for name, table in (("values", layer.located.values), ("keys", layer.located.keys)):
            for p, pos in table.items():
                if len(p) > n and p[:n] == list_path and isinstance(p[n], int):
                    grouped.setdefault((layer_no, p[n]), []).append((name, p[n + 1 :], pos))
    for p in [p for p in (*merged.values, *merged.keys) if len(p) > n and p[:n] == list_path]:
        merged.values.pop(p, None)
        merged.keys.pop(p, None)
    for i, item in enumerate(_get(merged.data, list_path)):
        for name, rest, pos in grouped.get(origin.get(id(item), (-1, -1)), []):
            getattr(merged, name)[(*list_path, i, *rest)] = pos


def _list(data: Any, key: str) -> list[Any]:
    """`data[key]` when it is a list, else no items (the model reports the wrong type, with its line)."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, list) else []


def _get(data: Any, path: PathKey) -> Any:
    for part in path:
        if isinstance(data, dict) and isinstance(part, str):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


_RELATIVE_HINT = "paths are relative to the recipe that names them"


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
    files = _list(data, "files")
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
    run = _list(data, "run")
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


def lock_path_for(recipe: Path) -> Path:
    """Where a recipe's lock lives: `recipes/x.yaml` -> `recipes/x.lock.txt`."""
    return recipe.with_name(recipe.name.rsplit(".", 1)[0] + ".lock.txt")


def _read_lock(recipe: Path, root: Path, problems: list[Problem]) -> tuple[Path | None, tuple[reqfile.ReqLine, ...]]:
    """The recipe's lock when it has one: `name==version` lines (comments allowed), inside the repository.
    The file is input too (a merge request can edit it): each version must be one, each name once, and no
    pin may name the base's CUDA libraries (those the plan refuses in pip.packages)."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    from imgbuild.ngc import is_cuda_library

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
    pins: list[reqfile.ReqLine] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.replace("\r\n", "\n").split("\n"), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not LOCK_LINE_RE.fullmatch(line):
            problems.append(
                Problem(shown, number, 1, "lock", "not a name==version line (imgbuild lock writes this file)")
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
            problems.append(
                Problem(shown, number, 1, "lock", f"{name} would replace a CUDA library of the base (drop the line)")
            )
            continue
        pins.append(reqfile.ReqLine(shown, number, line))
    return path, tuple(pins)


def load_recipe(
    path: str | Path, environ: dict[str, str] | None = None, secrets: tuple[str, ...] | list[str] = ()
) -> LoadedRecipe:
    """Load, merge, interpolate and validate a recipe. Raises RecipeError with every problem found.

    `secrets` are the configured secret values (Settings.secrets()): a variable holding one is refused."""
    environ = dict(os.environ if environ is None else environ)
    path = Path(path)
    if any(ord(c) < 32 for c in str(path)):
        raise RecipeError([Problem(repr(str(path))[1:-1], 0, 0, "", "a recipe's path may not hold control characters")])
    if not path.is_file():
        raise RecipeError([Problem(display_path(path), 0, 0, "", "no such recipe file")])
    problems: list[Problem] = []
    root = repository_root(path)
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
    layers = _load_chain(path, environ, problems, [], root, tuple(secrets))
    located = _merged_positions(layers)
    manifest: dict[str, list[SourceFile]] = {}
    digests: dict[str, str] = {}
    requirements = _check_paths(manifest, digests, located, root, tuple(secrets), problems)
    lock_path, lock_lines = _read_lock(path, root, problems)
    recipe, issues = validate(Recipe, located.data)
    reported = {p.field for p in problems}  # a path refused above is not also "missing"
    problems.extend(
        located.problem(i.at, i.message, i.hint, key=i.key, fallback_file=display_path(path))
        for i in issues
        if dotted(i.at) not in reported
    )
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
