"""Requirements files as projects write them, read once at load: `-r`/`-c` nesting (inside the recipe's
repository), `\\` continuations, comments, index options, `--hash`, PEP 508 URL requirements.

What pip would do with something that cannot work in an image is refused with the reason: an editable
install or a local path (the source is not in the build context), a bare URL (no name to check against the
base's framework), credentials in a URL (they would land in a layer), `--find-links` to a local folder (a
find-links web page is passed on, under an index's rules), `${NAME}` (pip and uv fill it in from the build's
environment). Options are read in pip's grammar (`-fURL`, `-f URL`, `--find-links=URL`, a tab for a space) and
written again in one form.
Messages name FILE:LINE and never echo the line: a requirements file is not ours to print.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union
from urllib.parse import urlsplit

from imgbuild import limits
from imgbuild.errors import Problem, RecipeError
from imgbuild.recipe.repofiles import OutsideRepository, resolve_inside
from imgbuild.text import describe, token_fault, unsafe_character
from imgbuild.yamlpos import read_text_bounded

if TYPE_CHECKING:
    from packaging.requirements import Requirement

FIELD = "pip.requirements"
MAX_DEPTH = 8  # -r / -c nesting
#: Global options passed through to pip as they are.
PASS_THROUGH = ("--pre", "--prefer-binary", "--only-binary", "--no-binary")
#: an option line as pip's parser splits it: `--name`, `--name=VALUE`, `--name VALUE`; `-n`, `-nVALUE`, `-n VALUE`
_LONG_OPTION = re.compile(r"(--[A-Za-z][A-Za-z-]{0,40})(?:(?:=|[ \t]+)(.*))?")
_SHORT_OPTION = re.compile(r"(-[A-Za-z])(?:=|[ \t]*)(.*)")
#: what pip and uv replace with a variable of the environment they run in, in every line of a requirements file
_EXPANDED = re.compile(r"\$\{")
#: a URL's scheme and its colon (RFC 3986): `https:`, `git+file:`
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_HASH_RE = re.compile(r"\s+--hash[= ](sha256|sha384|sha512):[0-9a-f]{32,128}")


@dataclass(frozen=True)
class ReqLine:
    file: str  # the file as shown to the user
    line: int
    spec: str  # the requirement, without per-line options
    hashes: tuple[str, ...] = ()


@dataclass
class Requirements:
    requirements: list[ReqLine] = field(default_factory=list)
    constraints: list[ReqLine] = field(default_factory=list)
    #: pip options for requirements.txt: index URLs, trusted hosts, pass-through global options
    options: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # every file read, in order


def read(path: Path, root: Path, display: Callable[[Path], str], problems: list[Problem]) -> Requirements:
    """Every requirement, constraint and option of `path` and the files it nests. `display(path)` names a
    file for messages."""
    reader = _Reader(root, display, problems)
    reader.read(path, constraint=False, depth=0)
    return reader.out


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with `\\` continuations joined and comments dropped. Lines are what an editor
    shows (`\\n`, `\\r\\n`); a form feed, NEL or Unicode line separator inside one is refused by `_Reader`,
    since pip would split there (its `splitlines`) and read what follows as a line of its own."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), 1):
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        line = re.split(r"(?:^|\s)#", pending + raw, maxsplit=1)[0].strip()
        pending = ""
        if line:
            out.append((start, line))
    if pending.strip():
        out.append((start, re.split(r"(?:^|\s)#", pending, maxsplit=1)[0].strip()))
    return out


#: Options pip accepts that cannot work in an image, and why.
_EDITABLE = "an editable install needs its source in the image: copy it with files: and install it with run:"
_FOLDER = "--find-links: a folder of wheels is not in the image; publish them to an index (pip.index_url)"
REFUSED = {"-e": _EDITABLE, "--editable": _EDITABLE}
FIND_LINKS = ("-f", "--find-links")
NESTING = {"-r": False, "--requirement": False, "-c": True, "--constraint": True}  # option -> constraints?
INDEX = {"-i": "--index-url", "--index-url": "--index-url", "--extra-index-url": "--extra-index-url"}


class _Reader:
    def __init__(self, root: Path, display: Callable[[Path], str], problems: list[Problem]):
        self.root, self.display, self.problems = root, display, problems
        self.out = Requirements()
        self.budget = limits.REQUIREMENTS_BYTES  # over every file read
        self.chain: list[Path] = []  # the files being read, outermost first

    def read(self, path: Path, *, constraint: bool, depth: int) -> None:
        shown = self.display(path)
        try:
            text = read_text_bounded(path, shown, self.budget, FIELD)
        except RecipeError as exc:
            self.problems.extend(exc.problems)
            return
        self.budget -= len(text.encode())
        self.out.files.append(path)
        self.chain.append(path)
        for number, line in _logical_lines(text):
            where = (path, shown, number)
            bad = line_fault(line)
            if bad:
                self.bad(where, bad)
                continue
            if line.startswith("-"):
                self.option(line, where, constraint=constraint, depth=depth)
            else:
                self.requirement(line, where, constraint=constraint)
        self.chain.pop()

    def bad(self, where: tuple[Path, str, int], message: str) -> None:
        self.problems.append(Problem(where[1], where[2], 1, FIELD, message))

    def option(self, line: str, where: tuple[Path, str, int], *, constraint: bool, depth: int) -> None:
        match = _LONG_OPTION.fullmatch(line) or _SHORT_OPTION.fullmatch(line)
        if match is None:  # never echoed: what follows the dash may be anything, a URL with a token too
            self.bad(where, "not a pip option (a dash, then a letter)")
            return
        name, value = match.group(1), (match.group(2) or "").strip()
        if name in NESTING:
            self.nested(name, value, where, constraint=constraint or NESTING[name], depth=depth)
        elif name in INDEX:
            why = url_problem(value, "an index URL")
            self.bad(where, f"{name}: {why}") if why else _add(self.out.options, f"{INDEX[name]} {one_form(value)}")
        elif name == "--trusted-host":
            if re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?", value):
                _add(self.out.options, f"--trusted-host {value}")
            else:
                self.bad(where, "--trusted-host: not a host name")
        elif name in FIND_LINKS:
            self.find_links(value, where)
        elif name in REFUSED:
            self.bad(where, REFUSED[name])
        elif name in PASS_THROUGH:
            self.pass_through(name, value, where)
        else:
            self.bad(where, f"pip option {name[:40]} is not supported in a requirements file imgbuild installs")

    def find_links(self, value: str, where: tuple[Path, str, int]) -> None:
        """A web page of links to wheels (PEP 503's form: JAX's jax_releases.html, PyG's data.pyg.org pages) is passed
        to the installer, under an index URL's rules (index_url_fault); the pip step's bounds (resolve time, bytes
        downloaded) hold for it as for an index, and where the installer finds nothing there the pip step reads it
        as the installers do (payload/pip_pages.py) to say what it served. A local folder or file: is not in the
        image."""
        if not _SCHEME.match(value) or value[:5].lower() == "file:":
            self.bad(where, _FOLDER)
            return
        why = url_problem(value, "a find-links page's URL")
        self.bad(where, f"--find-links: {why}") if why else _add(self.out.options, f"--find-links {one_form(value)}")

    def nested(self, name: str, value: str, where: tuple[Path, str, int], *, constraint: bool, depth: int) -> None:
        if depth >= MAX_DEPTH:
            self.bad(where, f"-r/-c nest deeper than {MAX_DEPTH} files")
            return
        try:
            target = resolve_inside(where[0].parent, value, self.root)
        except OutsideRepository as exc:
            self.bad(where, f"{name}: {exc}")
            return
        if not target.is_file():
            self.bad(where, f"{name}: no such file: {Path(value).name[:80]!r}")
            return
        if target in self.chain:
            self.bad(where, f"{name}: the file includes itself (through -r or -c)")
            return
        if target in self.out.files:
            return  # read already (two files nest one): its lines count once
        self.read(target, constraint=constraint, depth=depth + 1)

    def pass_through(self, name: str, value: str, where: tuple[Path, str, int]) -> None:
        if name in ("--pre", "--prefer-binary") and not value:
            _add(self.out.options, name)
        elif name in ("--only-binary", "--no-binary") and re.fullmatch(r"(:all:|:none:|[A-Za-z0-9._,-]+)", value):
            _add(self.out.options, f"{name} {value}")
        else:
            self.bad(where, f"{name}: not a valid value")

    def requirement(self, line: str, where: tuple[Path, str, int], *, constraint: bool) -> None:
        from packaging.requirements import InvalidRequirement, Requirement

        hashes = tuple(m.group(0).strip() for m in _HASH_RE.finditer(line))
        spec = _HASH_RE.sub("", line).strip()
        if spec.startswith((".", "/", "~")) or spec.startswith("file:"):
            self.bad(where, "a local path is not in the build context: copy it with files: and install it with run:")
            return
        if re.match(r"(git|hg|svn|bzr)\+|https?://", spec):
            self.bad(where, "a bare URL names no package: write it as NAME @ URL, so imgbuild can check it")
            return
        try:
            requirement_text_fault(spec)
        except ValueError as exc:
            self.bad(where, str(exc))
            return
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            self.bad(where, "not a valid requirement")
            return
        if req.url and requirement_url_fault(req.url):
            self.bad(where, requirement_url_fault(req.url))
            return
        line_ = ReqLine(where[1], where[2], spec, hashes)
        (self.out.constraints if constraint else self.out.requirements).append(line_)


def _add(options: list[str], option: str) -> None:
    if option not in options:
        options.append(option)


def index_url_fault(url: str) -> str:
    """What is wrong with the URL of a package index or a find-links page, the one rule for recipes and
    requirements files: "token" (white space, a control or non-ASCII character: pip would split it into options),
    "credentials" (a user part, even an empty one, or a password in it), "query" (`?...`: where a signed or token
    URL carries its secret), "scheme" (not http(s) with a host and a port that is one), or ""."""
    if token_fault(url):
        return "token"
    if _user_part(url):  # before the rest: no message echoes the URL, and this one is said first
        return "credentials"
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0  # urllib raises on a port that is none (99999, "x")
    except ValueError:  # an IPv6 host without its bracket, a port that is not a number
        return "scheme"
    if parts.query:
        return "query"
    return "" if parts.scheme in ("http", "https") and parts.hostname and port_ok else "scheme"


def one_form(url: str) -> str:
    """An index or find-links URL as imgbuild writes it: its scheme in lower case (`HTTPS://` is `https://` to pip and
    uv, and to the pip step's own readers, which look for the lower-case form)."""
    scheme = _SCHEME.match(url)
    return scheme.group(0).lower() + url[scheme.end() :] if scheme else url


def line_fault(line: str, holder: str = "the line") -> str:
    """Why a requirements file line (or a pip field's value: `holder` names it, "the requirement") is refused
    before it is read: a character pip would split on or an editor hides (a line break other than the newline, a
    control, a bidi control), `${`, a credential; or ""."""
    from imgbuild.credentials import CREDENTIAL_REFUSAL, credential_kind

    bad = unsafe_character(line, allow_tab=True) or next((c for c in line if c.isspace() and c not in " \t"), None)
    if bad:
        return f"{holder} holds {describe(bad)}: pip would split it, a reviewer would not see it"
    if _EXPANDED.search(line):
        return (
            f"{holder} holds '${{': pip and uv replace ${{NAME}} with a variable of the build's environment (the "
            "site's index settings are there), so what they would read is not what was reviewed; write the value itself"
        )
    if re.search(r"://[^/\s@]+@", line):
        return ""  # a user or password in a URL: the URL rules refuse it, saying where credentials go instead
    kind = credential_kind(line)
    return f"{holder} holds what looks like a credential ({kind}): it {CREDENTIAL_REFUSAL}" if kind else ""


def requirement_url_fault(url: str) -> str:
    """Why a `NAME @ URL` requirement cannot be installed as written, or "": a `file:` source (any VCS over
    `file:` too) names a path of the build container, never the project's; credentials would land in a layer."""
    scheme = url.split(":", 1)[0].lower() if _SCHEME.match(url) else ""
    if scheme == "file" or scheme.endswith("+file"):
        return "a local path (file:) is not in the build context: copy it with files: and install it with run:"
    if _user_part(url):
        return "credentials in a requirement URL would land in the image (give them through pip_index_url)"
    return ""


def _user_part(url: str) -> bool:
    """Whether `url`'s authority holds a user part (`user:secret@`, `token@`, even an empty `@`): read without
    urllib, which raises on a malformed host or port."""
    authority = re.match(rf"{_SCHEME.pattern}//([^/?#]*)", url)
    return bool(authority and "@" in authority.group(1))


def requirement_text_fault(spec: str) -> None:
    """A requirement as pip reads a requirements line: plain spaces only (pip splits a line on white space
    and reads any word starting with `-` as an option), ASCII URLs. ValueError says why."""
    bad = unsafe_character(spec) or next((c for c in spec if c.isspace() and c != " "), None)
    if bad is not None:
        raise ValueError(f"a requirement holds {describe(bad)}: pip would read what follows as options")
    if re.search(r"(?:^|\s)-", spec):
        raise ValueError("a word starting with '-' in a requirement is a pip option (use pip.index_url and friends)")
    if "://" in spec and any(not c.isascii() for c in spec):
        raise ValueError("a requirement URL must be ASCII (write the host in its punycode form)")


def url_problem(url: str, what: str) -> str:
    """Why `url`, `what` ("an index URL"), cannot go to the installer, in words that never echo it; or ""."""
    # a page of links has no build-time secret of its own: what needs credentials belongs on an index
    cure = "set pip_index_url at build time" if "index" in what else "publish its wheels to an index, set pip_index_url"
    return {
        "scheme": f"{what} must be http:// or https:// with a host (and a port that is a number up to 65535)",
        "token": f"{what} must be one ASCII word (no white space or control character: pip would split it)",
        "credentials": f"credentials in {what} would land in the image ({cure})",
        "query": f"a query (?...) in {what} is how a signed or token URL carries its secret: it would land in the "
        f"image ({cure})",
    }.get(index_url_fault(url), "")


class LockedPin:
    """A lock line, `name==version` (what imgbuild lock writes), read only as far as the checks ask: a 60,000-line
    lock is checked in a fraction of a second, not parsed by packaging line by line. Anything else in a lock is
    a full Requirement."""

    _LINE = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]{0,200}[A-Za-z0-9])?)==([A-Za-z0-9.+!_-]{1,100})")
    url = None
    marker = None
    extras: frozenset[str] = frozenset()

    def __init__(self, name: str, version: str) -> None:
        self.name, self.version = name, version

    @classmethod
    def of(cls, spec: str) -> Pin:
        from packaging.requirements import Requirement

        found = cls._LINE.fullmatch(spec)
        return cls(found.group(1), found.group(2)) if found else Requirement(spec)

    @functools.cached_property
    def specifier(self) -> Any:
        from packaging.specifiers import SpecifierSet

        return SpecifierSet(f"=={self.version}")


#: A requirement as the base's rules judge it: a lock's `name==version` line, or anything else, parsed by packaging.
Pin = Union["Requirement", LockedPin]
