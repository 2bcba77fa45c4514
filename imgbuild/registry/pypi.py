"""Whether a package index has a project, or a project's newest release an extra, asked before a cure that names
one is printed: the CUDA 13 build of faiss-gpu-cu12 would be faiss-gpu-cu13, which is not on PyPI; spaCy has a
cuda12x extra and no cuda13x. The project's PEP 503/691 page (its status, or its PEP 691 JSON) and the newest
release's PEP 658 metadata file, bounded in bytes and time; None when the index cannot say (offline, a server
error, an index that wants credentials, no JSON or no metadata file)."""

from __future__ import annotations

import functools
import json
import re
import time
from email.parser import HeaderParser
from typing import Any

import requests

from imgbuild.registry.transport import Stalled, TooBig, Unreachable, read_whole, within

PYPI = "https://pypi.org/simple"
PYPI_JSON = "https://pypi.org/pypi"
PAGE_BYTES = 32 << 20  # PyPI's torch page is about 3 MB of JSON
METADATA_BYTES = 1 << 20


def has_project(index_url: str, name: str, timeout: float = 5.0, verify: bool | str = True) -> bool | None:
    url = f"{index_url.rstrip('/')}/{re.sub(r'[-_.]+', '-', name).lower()}/"

    def status() -> int:
        resp = requests.get(
            url,
            headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"},
            timeout=timeout,
            stream=True,  # the status is the answer: the page is never read
            verify=verify,
        )
        resp.close()
        return resp.status_code

    try:  # a server that trickles its headers a byte at a time is bounded by the clock outside the call
        found = within(timeout, status)
    except (Stalled, requests.RequestException, OSError, ValueError):
        return None
    return True if found == 200 else False if found == 404 else None


def _bounded(url: str, accept: str, limit: int, deadline: float, verify: bool | str) -> bytes | None:
    """The body at `url`, or None: not 200, over `limit` bytes, or past `deadline` (time.monotonic()), however the
    server trickles it (transport.read_whole, the registry's bounded reader)."""
    budget = deadline - time.monotonic()
    if budget <= 0:
        return None
    try:
        with requests.Session() as session:
            reply = read_whole(session, "GET", url, {"Accept": accept}, {"verify": verify}, budget, limit)
    except (Stalled, Unreachable, TooBig, requests.RequestException, OSError, ValueError):
        return None
    return reply.content if reply.status_code == 200 else None


def _newest_metadata_url(body: bytes | None, page_url: str) -> str | None:
    """The PEP 658 metadata file of a wheel of the newest final, unyanked release in a PEP 691 JSON page."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import Version

    try:
        files = json.loads(body)["files"] if body else None
    except (ValueError, KeyError, TypeError):
        return None
    wheels: list[tuple[Version, str]] = []
    for row in files if isinstance(files, list) else ():
        has_meta = isinstance(row, dict) and (row.get("core-metadata") or row.get("data-dist-info-metadata"))
        if not has_meta or row.get("yanked") or not str(row.get("filename", "")).endswith(".whl"):
            continue
        try:
            version = parse_wheel_filename(row["filename"])[1]
        except (InvalidWheelFilename, KeyError, TypeError):
            continue
        if not version.is_prerelease and isinstance(row.get("url"), str):
            wheels.append((version, requests.compat.urljoin(page_url, row["url"])))
    return max(wheels, key=lambda w: w[0])[1].split("#", 1)[0] + ".metadata" if wheels else None


def _extras_in(metadata: bytes) -> dict[str, tuple[str, ...]]:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    headers = HeaderParser().parsestr(metadata.decode("utf-8", "replace"), headersonly=True)
    extras: dict[str, list[str]] = {str(canonicalize_name(x)): [] for x in headers.get_all("Provides-Extra") or ()}
    for line in headers.get_all("Requires-Dist") or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        for extra, brings in extras.items():
            marker = req.marker
            if marker is not None and marker.evaluate({"extra": extra}) and not marker.evaluate({"extra": ""}):
                brings.append(str(canonicalize_name(req.name)))
    return {extra: tuple(names) for extra, names in extras.items()}


@functools.lru_cache(maxsize=64)
def extras_of(
    index_url: str, name: str, timeout: float = 10.0, verify: bool | str = True
) -> dict[str, tuple[str, ...]] | None:
    """{extra (canonical): the names of the distributions it brings} of the newest release of `name`
    (`Provides-Extra`, and `Requires-Dist` under `extra == "..."`), from the metadata file of one of its wheels; None
    when the index cannot say."""
    deadline = time.monotonic() + timeout
    project = re.sub(r"[-_.]+", "-", name).lower()
    page_url = f"{index_url.rstrip('/')}/{project}/"
    body = _bounded(page_url, "application/vnd.pypi.simple.v1+json", PAGE_BYTES, deadline, verify)
    meta_url = _newest_metadata_url(body, page_url)
    meta = _bounded(meta_url, "*/*", METADATA_BYTES, deadline, verify) if meta_url else None
    if meta is None and index_url.rstrip("/") == PYPI:  # a mirror of PyPI's pages without PEP 658's files
        meta = _pypi_json_metadata(
            _bounded(f"{PYPI_JSON}/{project}/json", "application/json", PAGE_BYTES, deadline, verify)
        )
    return _extras_in(meta) if meta is not None else None


def _pypi_json_metadata(body: bytes | None) -> bytes | None:
    """The newest release's extras and requirements from PyPI's JSON API, written as metadata headers."""
    try:
        info: Any = json.loads(body)["info"] if body else {}
        lines = [f"Provides-Extra: {x}" for x in info["provides_extra"] or ()]
        lines += [f"Requires-Dist: {r}" for r in info["requires_dist"] or ()]
    except (ValueError, KeyError, TypeError):
        return None
    return "\n".join(lines).encode() + b"\n"


def has_need(index_url: str, need: str, verify: bool | str = True) -> bool | None:
    """Whether the index has what a cure names: a project (`faiss-gpu-cu13`), or an extra of a project's newest
    release (`spacy[cuda13x]`)."""
    found = re.fullmatch(r"([^\[\]]+)\[([^\[\]]+)\]", need)
    if not found:
        return has_project(index_url, need, verify=verify)
    extras = extras_of(index_url, found.group(1), verify=verify)
    return None if extras is None else re.sub(r"[-_.]+", "-", found.group(2)).lower() in extras


#: A file name on a project page: a wheel's or an sdist's, as PEP 503's anchors and PEP 691's JSON give them.
_FILENAME = re.compile(r"""(?:href="[^"#]*/|>)([A-Za-z0-9_.+!-]{1,300}\.(?:whl|tar\.gz|zip))[#"<]""")


def _filenames(body: bytes) -> list[str] | None:
    try:
        rows = json.loads(body).get("files")
    except (ValueError, AttributeError, RecursionError):
        return _FILENAME.findall(body.decode("utf-8", "replace"))  # PEP 503's HTML
    if not isinstance(rows, list):
        return None
    return [str(r["filename"]) for r in rows if isinstance(r, dict) and isinstance(r.get("filename"), str)]


def cuda_builds_in(body: bytes | None, major: str) -> tuple[str, ...] | None:
    """The versions on a project's index page (PEP 691 JSON or PEP 503 HTML) whose local label says they are built
    for CUDA `major` (`0.11.0+cu130`, `2.9.0+cu13`, `1.0+cuda13x`), oldest first; None when there is no page."""
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
    from packaging.version import Version

    from imgbuild.ngc import cuda_build

    names = _filenames(body) if body else None
    if names is None:
        return None
    found: set[Version] = set()
    for name in names:
        try:
            version = parse_wheel_filename(name)[1] if name.endswith(".whl") else parse_sdist_filename(name)[1]
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        if version.local and cuda_build("-" + version.local.replace(".", "-")) == major:
            found.add(version)
    return tuple(str(v) for v in sorted(found))


@functools.lru_cache(maxsize=64)
def cuda_builds(
    index_url: str, name: str, major: str, timeout: float = 10.0, verify: bool | str = True
) -> tuple[str, ...] | None:
    """The releases of `name` the index marks as built for CUDA `major` (`cuda_builds_in`); None when it cannot
    say (no page in time, a server error, credentials wanted)."""
    page_url = f"{index_url.rstrip('/')}/{re.sub(r'[-_.]+', '-', name).lower()}/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    return cuda_builds_in(_bounded(page_url, accept, PAGE_BYTES, time.monotonic() + timeout, verify), major)
