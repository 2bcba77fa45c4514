"""A recipe's fields: the typed model (Base, Pip, User, FileSpec, Smoke, Recipe) and each field's rules, as data
(fields.Model checks them, gives defaults and writes the JSON schema). The recipe as read from its file, with
where it came from, is `imgbuild.recipe.load`'s LoadedRecipe."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from imgbuild import limits
from imgbuild.credentials import CREDENTIAL_REFUSAL, named_secret
from imgbuild.facts import IMAGE_DIR, LOADER_ENV
from imgbuild.fields import Flag, Integer, ListOf, ListOrText, MapOf, Maybe, Model, Number, OneOf, Text, matches, typed
from imgbuild.fields import show as _show
from imgbuild.imageref import COMPONENT_RE, TAG_RE
from imgbuild.ngc import FRAMEWORKS
from imgbuild.ngc import TAG_OR_PATTERN_RE as NGC_TAG_OR_PATTERN_RE
from imgbuild.platforms import PLATFORMS
from imgbuild.recipe import reqfile
from imgbuild.registry_identity import port_number
from imgbuild.reserved import RESERVED_TAGS_SAID, reserved_folder, reserved_label, reserved_tag
from imgbuild.text import describe, unsafe_character

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
#: Accounts every Debian/Ubuntu base already has: the recipe's user must be a new one (add-user.sh would
#: otherwise rewrite a system account's UID, home and shell).
SYSTEM_USERS = frozenset(
    {
        "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy", "www-data",
        "backup", "list", "irc", "gnats", "nobody", "nogroup", "_apt", "systemd-network", "systemd-resolve",
        "systemd-timesync", "messagebus", "sshd", "syslog", "uuidd", "tcpdump", "postfix", "ntp", "polkitd",
    }
)  # fmt: skip
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
    bad = unsafe_character(value, allow_tab=True)
    if bad is not None:
        raise ValueError(
            f"must be one line of plain text: {describe(bad)} is refused (no control, format, invisible or "
            "unassigned character, no line separator)"
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
    """home and workdir become the image user's: never a system folder, nor imgbuild's own."""
    if value in SYSTEM_DIRS_EXACT or any(value == d or value.startswith(d + "/") for d in SYSTEM_DIRS):
        raise ValueError(f"{value} is a system folder; the image user would own it (use e.g. /workspace)")
    if reserved_folder(value):
        raise ValueError(f"{IMAGE_DIR} is imgbuild's own folder (the base's records the smoke test reads)")
    return value


def _dest_path(value: str) -> str:
    if value == "/":
        raise ValueError("cannot copy onto / (name a file or folder under it)")
    if reserved_folder(value):
        raise ValueError(f"{IMAGE_DIR} is imgbuild's own folder (the base's records the smoke test reads)")
    return value


def _host_port(value: str) -> str:
    """`host[:port]`: a port is one the engine and pip read (1-65535)."""
    _, sep, port = value.rpartition(":")
    if sep:
        port_number(port)
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


def _not_reserved(value: str) -> str:
    if reserved_tag(value):
        raise ValueError(f"{value[:80]} is a name imgbuild keeps for itself ({RESERVED_TAGS_SAID})")
    return value


def _image_name(value: str) -> str:
    ref = _reference(value, "alice/research or registry.example:5000/lab/research:v1")
    if ref.digest:
        raise ValueError("an image to build cannot carry a digest")
    for part in (ref.path, ref.tag):  # the repository and the tag, each (x-imgbuild-cache:v1 is Buildah's)
        if part:
            _not_reserved(part)
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
    if why := reqfile.line_fault(value, "the requirement"):
        raise ValueError(why)
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
    """An index URL, under the rules of a requirements file's index and find-links lines; never echoed (a URL
    refused for what it holds may hold a secret)."""
    _no_newline(value)
    if why := reqfile.line_fault(value, "the URL"):
        raise ValueError(why)
    fault = reqfile.index_url_fault(value)
    if fault in ("credentials", "query"):
        raise ValueError(
            f"{'credentials' if fault == 'credentials' else 'a query (?...), where a signed URL keeps its secret,'} "
            "in a recipe end up in git and in the image (set IMGBUILD_PIP_INDEX_URL in the environment at build "
            "time instead)"
        )
    if fault:
        raise ValueError(f"not an index URL ({reqfile.url_problem(value, 'an index URL')})")
    return reqfile.one_form(value)


def _env_key(value: str) -> str:
    if value.startswith("IMGBUILD_"):  # an image's own ENV never steers imgbuild (its smoke test, its tools)
        raise ValueError("IMGBUILD_ variables are imgbuild's own: an image may not set them")
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
    if reserved_label(value):
        raise ValueError(f"{value} is written by imgbuild (its own labels, and the base the image is built on)")
    return value


def _unpinnable(value: str) -> str:
    from packaging.utils import canonicalize_name

    from imgbuild.ngc import CUDA_PACKAGE_PREFIXES

    name = canonicalize_name(value)
    if any(name in fw.packages for fw in FRAMEWORKS.values()) or name.startswith(CUDA_PACKAGE_PREFIXES):
        raise ValueError(f"{_show(value)} is the base's framework or CUDA stack: never unpinned or rebuilt")
    return value


def _not_cuda(value: str) -> str:
    from imgbuild.ngc import is_cuda_library

    if is_cuda_library(_canonical(value)):
        raise ValueError(f"{_show(value)} is a CUDA library: the base's own are never stood in for")
    return value


def _canonical(value: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(value))


#: What package installers, their TLS and proxies read: never a recipe's `args:` (an ARG's value is in history)
INSTALLER_ARG_RE = re.compile(r"(?i:(PIP|UV|CONDA|LD)_\w*|PYTHON\w*|(HTTPS?|FTP|ALL|NO)_PROXY|(REQUESTS|CURL)_CA_BUNDLE"
                              r"|SSL_CERT_(FILE|DIR)|NETRC)")  # fmt: skip


def _not_imgbuild(value: str) -> str:
    if value.startswith("IMGBUILD_") or INSTALLER_ARG_RE.fullmatch(value):
        raise ValueError(
            "IMGBUILD_ args are reserved" if value.startswith("IMGBUILD_") else f"{value} is read by the package "
            "installers, their TLS or proxies: those are imgbuild's settings (pip_index_url, pip_ca_bundle, pip.*), "
            "and an ARG's value is written into the image's history"
        )  # fmt: skip
    return value


def _no_named_secret(key: str, value: Any) -> None:
    """`PGPASSWORD: hunter2` under env, args or labels: the name says what the value is, whatever its shape."""
    if isinstance(value, str) and named_secret(key, value):
        raise ValueError(f"{key} names a credential, and its value {CREDENTIAL_REFUSAL}")


def _gpu_target(value: str) -> str:
    from imgbuild.gpu.fleet import target_rule  # the fleet rules load only for a recipe that names targets

    return target_rule(value)


_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_DIST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")

# The field types, as data (checked by imgbuild.fields; the same declarations give the JSON schema).
ONE_LINE = Text(_no_newline)
OWNED_DIR = Text(_abs_path, _owned_dir)
PIP_SPEC = Text(_pip_requirement)
INDEX_URL = Text(_index_url)
#: `OMP_NUM_THREADS: 4` means the text "4"; yes/no stay an error
ENV_VALUE = Text(_no_newline, numbers=True)
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
    trusted_hosts: list[str] = typed(ListOf(Text(matches(HOST_RE, "not a host"), _host_port)), factory=list)
    ca_bundle: str | None = typed(Maybe(ONE_LINE), None, doc="a CA bundle for the index, mounted at build time only")
    installer: str = typed(
        OneOf("pip", "uv"),
        "uv",
        doc="who installs: uv (about half the time of pip) or pip; same pins and protection either way",
    )
    no_build_isolation: list[str] = typed(
        ListOf(Text(matches(_DIST_RE, "not a package name"), _unpinnable), max_length=64),
        factory=list,
        doc="packages built from source against the base's own framework (their build imports torch or"
        " TensorFlow: flash-attn, apex, torch-scatter): built without build isolation, the compiled wheel kept in"
        " the build cache",
    )
    provides: dict[str, str] = typed(
        MapOf(Text(matches(_DIST_RE, "not a package name"), _not_cuda), Text(matches(_DIST_RE, "not a package name"))),
        factory=dict,
        doc="a name a dependency asks for, provided by a base package of another name (tensorflow: tensorflow-cpu):"
        " pinned at the base package's version",
    )

    def checked(self) -> Pip:
        for name, provider in self.provides.items():
            if _canonical(name) == _canonical(provider):
                raise ValueError(f"provides.{name}: a package cannot provide itself")
            family = next((fw for fw in FRAMEWORKS.values() if _canonical(name) in fw.packages), None)
            if family is not None and _canonical(provider) not in family.packages:
                raise ValueError(
                    f"provides.{name}: {name} is {family.name}; only another distribution of {family.name} "
                    f"({', '.join(p for p in family.packages if p != _canonical(name))}) can provide it"
                )
        return self


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
    min_speedup: float | None = typed(
        Maybe(Number(ge=1)), None, doc="a hard floor for the tensor-core speed-up (1 or more: a floor below 1 is none)"
    )
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
    accept_pip_check: list[str] = typed(
        ListOf(DIST_NAME, max_length=64),
        factory=list,
        doc="distributions whose new `pip check` complaints are accepted (reviewed: smoke.run shows the image works)",
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
    tag: str = typed(
        Text(matches(TAG_RE, "not a valid image tag", "letters, digits, _ . -; at most 128"), _not_reserved), "latest"
    )
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
    env: dict[str, str] = typed(MapOf(ENV_KEY, ENV_VALUE, _no_named_secret), factory=dict)
    labels: dict[str, str] = typed(MapOf(Text(_label_key), ONE_LINE, _no_named_secret), factory=dict)
    args: dict[str, str] = typed(
        MapOf(
            Text(matches(ENV_KEY_RE, "not a valid environment variable name"), _not_imgbuild),
            ENV_VALUE,
            _no_named_secret,
        ),
        factory=dict,
    )
    entrypoint: list[str] | str | None = typed(Maybe(ListOrText(ONE_LINE)), None)
    cmd: list[str] | str | None = typed(Maybe(ListOrText(ONE_LINE)), None)
    smoke: Smoke = typed(Model(Smoke), factory=Smoke)
    platforms: list[str] = typed(
        ListOf(OneOf(*PLATFORMS), max_length=len(PLATFORMS), unique=True),
        factory=list,
        doc="the platforms to build for (`build --platform` overrides); none: the engine's own. Another than the "
        "engine's own is built and smoke-tested under qemu (Podman), and a push is one manifest list",
    )

    def checked(self) -> Recipe:
        if self.user and self.user.sudo and "sudo" not in self.apt:
            return dataclasses.replace(self, apt=[*self.apt, "sudo"])
        return self
