"""What a find-links page (`--find-links URL`: JAX's jax_releases.html, PyG's data.pyg.org pages) says of a project,
read as pip and uv read it: a page of links whose files are named by the last part of each link's path, fetched
bounded and under the index's trust rules (pip_index.fetch). The guard asks it why the install found nothing there,
so that the line names the page and what it said (a 404, not a page of links, no file of the project, none for
this Python), never a typo in a name only that page serves. Imported by guard.py, beside it.
"""

import html
import os
import re
import sys
import urllib.parse

import pip_index  # beside it
from pip_index import ARCHIVES, ATTRIBUTE, MACHINE, fetch, installable, requirement_name, version_of  # beside it
from pip_versions import canon  # beside it
from pip_words import NAME  # beside it

LINK_TAG = re.compile(r"<a\b([^>]{0,8192})>", re.IGNORECASE)  # bounded: a tag that never closes costs nothing


def links_of(body):
    """[(file name, requires-python)] of each link of a page of links (PEP 503's HTML, as pip and uv read a
    find-links page): the file is the last part of the link's path, as the installers name it."""
    out = []
    for attrs in LINK_TAG.findall(body.decode("utf-8", errors="replace")):
        values = {k.lower(): html.unescape(a or b) for k, a, b in ATTRIBUTE.findall(attrs)}
        path = urllib.parse.urlsplit(values.get("href", "")).path
        if path:
            out.append((urllib.parse.unquote(path.rsplit("/", 1)[-1]), values.get("data-requires-python", "")))
    return out


def project_of(filename):
    """The project a distribution file is of, canonical: `jaxlib-0.3.2+cuda11.cudnn82-cp39-...whl` -> jaxlib."""
    return canon(requirement_name(filename)) if filename.endswith((".whl", *ARCHIVES)) else ""


def page_trouble(url, trusted=(), environ=os.environ):
    """Why the find-links page at `url` is no page of links, read as the installers read it (bounded, under the
    index's trust rules), in words after "the page URL"; "" where it is one."""
    return _read_links(url, trusted, environ)[0]


def find_links_said(url, name, trusted=(), environ=os.environ, version=""):
    """What the find-links page at `url` says of `name` (of its release `version`, where the requirement pins one):
    why it gives no file of it this Python can install (page_trouble's words, or what it lists), in words after
    "the page URL"; "" where it has one."""
    trouble, links = _read_links(url, trusted, environ)
    if trouble:
        return trouble
    files = [(f, requires) for f, requires in links if project_of(f) == canon(name)]
    release = f"{name} {version}" if version else name
    files = [(f, requires) for f, requires in files if not version or version_of(f) == version]
    if not files:
        return f"lists no file of {release} (a typo? a page for another framework or CUDA release?)"
    if any(installable(f, requires) for f, requires in files):
        return ""
    python = ".".join(str(part) for part in sys.version_info[:2])
    return (
        f"lists {len(files)} file(s) of {release}, none for this Python {python} on {MACHINE} (made for another "
        "Python or platform)"
    )


#: what an HTTP status of a find-links page most likely means, for the line that names it
STATUS_WORDS = {
    404: "has it moved?",
    410: "has it moved?",
    401: "it wants credentials",
    403: "a proxy or the server refuses it",
    **dict.fromkeys((301, 302, 303, 307, 308), "a redirect to another host, not followed with credentials"),
}


def _read_links(url, trusted, environ):
    """(why the page is no page of links or "", its links)."""
    status, body, kind = fetch(url, trusted, environ, accept="text/html")
    if status == "unreached":
        return "could not be reached (offline? a proxy? a network that reaches only the package index?)", []
    if status == "long":
        limit, seconds = pip_index.PAGE_LIMIT >> 20, 2 * pip_index.TIMEOUT
        return f"did not end within {limit} MiB and {seconds:.0f} s, as a page of links does", []
    if status != 200:
        return f"answers HTTP {status} ({STATUS_WORDS.get(status, 'the server said no')})", []
    if kind not in ("text/html", "application/vnd.pypi.simple.v1+html"):  # pip's and uv's HTML kinds
        shown = re.sub(r"[^A-Za-z0-9.+/-]", "?", kind)[:60] or "none"
        return f"is not a page of links (Content-Type {shown}, not text/html)", []
    return "", links_of(body)


WHERE = "(a --find-links line of the requirements)"


def unread_line(page, trusted=()):
    """The failure line for the find-links page the installer said it could not read (uv names it), and why, as
    the guard reads it. Each line here stays short: a build's failure shows the first 300 characters."""
    why = page_trouble(page, trusted) or "could not be read by the installer"
    return f"the find-links page {page} {WHERE} {why}: what only it serves cannot be installed; see above"


def missing_line(missing, pages, trusted=()):
    """The failure line for the requirement the installer found nowhere (`missing`, its words for it), where the
    install reads find-links `pages`: what each says of it; "" without pages, or where a page has a file of it for
    this Python and platform (the trouble is elsewhere)."""
    name = re.match(rf"({NAME})(?:==([A-Za-z0-9.+!_-]+)$)?", missing)
    if not name:
        return ""
    said = [(page, find_links_said(page, name.group(1), trusted, version=name.group(2) or "")) for page in pages]
    if not said or not all(why for _, why in said):
        return ""
    each = "; ".join(f"the find-links page {page} {why}" for page, why in said)
    return f"{missing}: not on the index, and {each}; see above"


def stopped_note(pages, trusted=()):
    """ "; the find-links page URL did not end ..." for each of `pages` that is no page of links: what a step stopped at
    its bounds may have been reading; "" where none is."""
    said = [f"the find-links page {page} {why}" for page in pages if (why := page_trouble(page, trusted))]
    return "".join(f"; {line}" for line in said)
