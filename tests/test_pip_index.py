"""The pip step's reading of the package index (payload/pip_index.py, run in the base with the stdlib): what a
page says of a project's releases, read as untrusted input and bounded, and which indexes the installer reads."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).parent.parent / "imgbuild" / "payload"  # the in-image scripts


@pytest.fixture(scope="module")
def index():
    sys.path.insert(0, str(TEMPLATES))
    try:
        spec = importlib.util.spec_from_file_location("pip_index", TEMPLATES / "pip_index.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(TEMPLATES))


JSON = "application/vnd.pypi.simple.v1+json"


@pytest.mark.parametrize(
    "body, kind",
    [
        (b"[]", JSON),  # not an object
        (b'{"files": {"a": 1}}', JSON),  # files not a list
        (b'{"files": [1, "x", null, {"filename": 7}]}', JSON),  # rows of every wrong type
        (b'{"files": [{"filename": "x-1.0.tar.gz", "requires-python": ["3"]}]}', JSON),
        (b"[" * 100_000 + b"]" * 100_000, JSON),  # nested past the parser's depth
        (b"\xff\xfe not json", JSON),
        (b"<a href='x'>" + b"y" * 10_000 + b"</a>", "text/html"),  # an anchor past the bound
        (b"<html>" + b"<a " * 50_000, "text/html"),  # unclosed tags: linear, nothing found
    ],
)
def test_a_hostile_page_reads_as_no_releases(index, body, kind):
    assert index.releases(index.files_of(body, kind)) == {}


def test_a_page_gives_each_final_release_its_first_upload_and_whether_it_is_yanked(index):
    page = {
        "files": [
            {"filename": "serve-0.2.5.tar.gz", "upload-time": "2023-12-14T00:00:00Z"},
            {"filename": "serve-0.2.5-py3-none-any.whl", "upload-time": "2023-12-13T10:00:00.5Z"},
            {"filename": "serve-0.3.0-py3-none-any.whl", "yanked": "broken", "upload-time": "2024-01-01T00:00:00Z"},
            {"filename": "serve-0.4.0rc1-py3-none-any.whl", "upload-time": "2024-02-01T00:00:00Z"},
            {"filename": "serve-0.5.0-py3-none-any.whl", "upload-time": "'; DROP TABLE"},
            {"filename": "serve-0.6.0-cp39-cp39-win_amd64.whl"},
            {"filename": "serve-0.7.0-py3-none-any.whl", "requires-python": ">=99"},
        ]
    }
    found = index.releases(index.files_of(json.dumps(page).encode(), JSON))
    assert set(found) == {"0.2.5", "0.3.0", "0.5.0", "0.6.0", "0.7.0"}  # no pre-release
    assert found["0.2.5"][0].isoformat() == "2023-12-13T10:00:00" and found["0.2.5"][1:] == (False, True)
    assert found["0.3.0"][1] is True  # yanked
    assert found["0.5.0"][0] is None  # a date that is not one
    assert found["0.6.0"][2] is False and found["0.7.0"][2] is False  # no file this Python can install


def test_an_html_page_gives_versions_and_yanks_without_dates(index):
    body = b'<a href="/f/x-1.0.tar.gz" data-yanked="">x-1.0.tar.gz</a>\n<a href="/f/x-2.0.zip">x-2.0.zip</a>'
    found = index.releases(index.files_of(body, "text/html"))
    assert found == {"1.0": (None, True, False), "2.0": (None, False, True)}


def test_the_indexes_are_the_requirement_files_then_the_environment_then_pip_conf(index, tmp_path):
    reqs, conf = tmp_path / "requirements.txt", tmp_path / "pip.conf"
    reqs.write_text("--index-url https://a.example/simple\n--extra-index-url=https://b.example/simple\nx\n")
    conf.write_text("[global]\nindex-url = https://c.example/simple\nextra-index-url = https://d.example/s\n")
    environ = {"PIP_CONFIG_FILE": str(conf), "UV_EXTRA_INDEX_URL": "https://e.example/s file:///etc"}
    urls = index.index_urls(["pip", "install", "-r", str(reqs)], environ)
    assert urls == [
        "https://a.example/simple",
        "https://b.example/simple",
        "https://e.example/s",
        "https://d.example/s",
    ]
    assert index.index_urls(["pip", "install"], {}) == ["https://pypi.org/simple"]
    reqs.write_text("--no-index\n--find-links /wheels\nx\n")
    assert index.index_urls(["pip", "install", "-r", str(reqs)], environ) == []


def test_a_page_is_read_bounded_and_credentials_never_follow_a_redirect_to_another_host(index, monkeypatch):
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append((self.server.server_address[1], self.path, self.headers.get("Authorization")))
            if self.path.startswith("/simple/big/"):
                self.send_response(200)
                self.send_header("Content-Type", JSON)
                self.end_headers()
                self.wfile.write(b" " * (index.PAGE_LIMIT + 10))
            elif self.path.startswith("/simple/drip/"):
                self.send_response(200)
                self.send_header("Content-Type", JSON)
                self.end_headers()
                for _ in range(40):  # a byte every 0.2 s: each read is within the timeout, the whole is not
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            elif self.path.startswith("/simple/away/"):
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{other.server_address[1]}/steal/")
                self.end_headers()
            else:
                self.send_error(404)

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(2)]
    main, other = servers
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://user:s3cret@127.0.0.1:{main.server_address[1]}/simple"
        assert index.page(url, "big") is None
        monkeypatch.setattr(index, "TIMEOUT", 1.0)
        start = time.monotonic()
        assert index.page(url, "drip") is None and time.monotonic() - start < 4
        assert index.page(url, "away") is None
        assert [s for s in seen if s[0] == other.server_address[1]] == []
        assert seen[0][2] and seen[0][2].startswith("Basic ")  # the index's own host gets them
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_an_unreachable_index_answers_nothing_in_bounded_time(index, monkeypatch):
    import time

    monkeypatch.setattr(index, "TIMEOUT", 1.0)
    start = time.monotonic()
    assert index.look_up(["x"], ["pip"], {"PIP_INDEX_URL": "http://10.255.255.1/simple"}, deadline=2.0) == {}
    assert time.monotonic() - start < 4


@pytest.mark.parametrize(
    "line, checked",
    [
        ("serve", True),
        ("serve>=0.1", True),
        ("serve[extra] ; python_version >= '3'", True),
        ("serve==0.2.5", False),
        ("serve===0.2.5", False),
        ("serve @ https://files.example/serve-0.2.5.tar.gz", False),
        ("serve@file:///wheels/serve-0.2.5-py3-none-any.whl", False),
    ],
)
def test_only_a_version_the_resolver_chose_is_judged_against_the_index(index, tmp_path, monkeypatch, line, checked):
    reqs = tmp_path / "requirements.txt"
    reqs.write_text(line + "\n")
    asked = []
    monkeypatch.setattr(index, "look_up", lambda names, command: asked.extend(names) or {})
    from pip_versions import asked_lines, named_specs  # beside pip_index, as in the image

    command = ["pip", "install", "-r", str(reqs)]
    named = named_specs(asked_lines(command))
    assert index.old_release_line([("serve", "0.2.5")], named, command, lambda *a: "") == ""
    assert asked == (["serve"] if checked else [])


def test_a_ca_file_that_is_not_there_or_a_broken_answer_is_no_answer(index, monkeypatch):
    """The pip step never fails for the index's trouble: the check is best effort."""
    assert index.page("https://pypi.org/simple", "x", environ={"PIP_CERT": "/nonexistent/ca.crt"}) is None

    def broken(*args, **kwargs):
        raise RuntimeError("a thread's surprise")

    monkeypatch.setattr(index, "page", broken)
    assert index.look_up(["x"], ["pip"], {"PIP_INDEX_URL": "https://idx.example/simple"}) == {}


def test_whether_the_index_has_a_project_is_yes_no_or_unknown_never_a_guess(index):
    """The CUDA build a cure names is asked of the index first: a 404 is "not there", a page with an installable
    release is "there", and an index that fails to answer says nothing either way."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.startswith("/simple/there-cu13/"):
                body = json.dumps({"files": [{"filename": "there_cu13-1.0-py3-none-any.whl"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", JSON)
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_error(500 if self.path.startswith("/simple/broken") else 404)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        environ = {"PIP_INDEX_URL": f"http://127.0.0.1:{server.server_address[1]}/simple"}
        assert index.project_on_index("there-cu13", ["pip"], environ) is True
        assert index.project_on_index("gone-cu13", ["pip"], environ) is False
        assert index.project_on_index("broken-cu13", ["pip"], environ) is None
    finally:
        server.shutdown()


@pytest.fixture
def hostile_pages():
    """A server of find-links pages as hostile hosts serve them, and a second host a page redirects to; each
    request seen as (server's port, path, Authorization)."""
    import contextlib
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []
    link = '<a href="/w/pagelib-0.4.0-py3-none-any.whl#sha256=00" data-requires-python="&gt;=3">x</a>\n'

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def send(self, kind: str, body: bytes, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            seen.append((self.server.server_address[1], self.path, self.headers.get("Authorization")))
            pages = {
                "/huge.html": lambda: self.send("text/html", link.encode() * (PAGE_LIMIT // len(link) + 10)),
                "/deep.html": lambda: self.send("text/html", b"<div>" * 150_000 + link.encode()),
                "/many.html": lambda: self.send("text/html", link.encode() * 10_000),
                "/binary.html": lambda: self.send("application/octet-stream", b"\x00\xff" * 1000),
                "/away.html": self.redirect,
                "/jax_releases.html": lambda: self.send("text/html", jax),
            }
            if self.path == "/drip.html":
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                with contextlib.suppress(OSError):  # the reader hangs up at its bound
                    for _ in range(40):  # a byte every 0.1 s: each read is within the timeout, the whole is not
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.1)
            elif self.path in pages:
                pages[self.path]()
            else:
                self.send_error(404)

        def redirect(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{other.server_address[1]}/many.html")
            self.end_headers()

    jax = b"".join(  # JAX's page: absolute links into folders, the file's name the last part of the path
        b'<a href="https://storage.googleapis.com/jax-releases/%s">%s</a>\n' % (f, f)
        for f in (
            b"cuda11/jaxlib-0.3.2+cuda11.cudnn82-cp39-none-manylinux2010_x86_64.whl",
            b"jaxlib-0.4.1-py3-none-any.whl",
        )
    )
    PAGE_LIMIT = 1 << 20
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(2)]
    main, other = servers
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{main.server_address[1]}", other.server_address[1], seen, PAGE_LIMIT
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_a_hostile_find_links_page_is_read_bounded_and_named_by_what_it_did(hostile_pages, monkeypatch):
    """A page of links is read as pip and uv read it, but bounded in bytes and time: a page past the bound, one
    that never ends, one that is not HTML or not there, each said in words (and the one that never ends named where
    the step stopped at its bounds); a deep or long page costs linear time."""
    import time

    from tests.support import guard_module

    pages = sys.modules["pip_pages"] if guard_module() else None
    url, _, _, limit = hostile_pages
    monkeypatch.setattr(pages.pip_index, "PAGE_LIMIT", limit)
    monkeypatch.setattr(pages.pip_index, "TIMEOUT", 0.2)
    said = {}
    start = time.monotonic()
    for name in ("huge", "drip", "binary", "gone", "deep", "many"):
        said[name] = pages.find_links_said(f"{url}/{name}.html", "pagelib")
    assert said["huge"].startswith("did not end within 1 MiB") and said["drip"].startswith("did not end within")
    assert said["binary"].startswith("is not a page of links (Content-Type application/octet-stream, not text/html)")
    assert said["gone"].startswith("answers HTTP 404")
    assert said["deep"] == said["many"] == ""  # a file of pagelib this Python installs: the page is not the trouble
    assert pages.find_links_said(f"{url}/many.html", "pyg-lib").startswith("lists no file of pyg-lib")
    note = pages.stopped_note([f"{url}/many.html", f"{url}/drip.html"])  # what a step stopped at its bounds read
    assert time.monotonic() - start < 6
    assert note.startswith(f"; the find-links page {url}/drip.html did not end within") and "many" not in note


def test_a_find_links_page_may_redirect_to_another_host_but_credentials_never_follow(hostile_pages, index):
    """A page without credentials is followed where pip and uv follow it; a request carrying credentials (a user
    part, as pip.conf's index URL has) never goes to another host."""
    from tests.support import guard_module

    pages = sys.modules["pip_pages"] if guard_module() else None
    url, other, seen, _ = hostile_pages
    assert pages.find_links_said(f"{url}/away.html", "pagelib") == ""
    assert [s for s in seen if s[0] == other] == [(other, "/many.html", None)]
    seen.clear()
    with_user = url.replace("http://", "http://user:s3cret@")
    assert pages.find_links_said(f"{with_user}/away.html", "pagelib").startswith("answers HTTP 302")
    assert [s for s in seen if s[0] == other] == [] and seen[0][2].startswith("Basic ")


def test_a_release_a_find_links_page_has_for_another_python_is_named_so_by_its_version(hostile_pages):
    """Flax's `jaxlib==0.3.2+cuda11.cudnn82` with JAX's page: the page has jaxlib, but that release only for
    Python 3.9; the line says so of that release, where the name alone has a file for this Python."""
    from tests.support import guard_module

    pages = sys.modules["pip_pages"] if guard_module() else None
    url = f"{hostile_pages[0]}/jax_releases.html"
    said = pages.missing_line("jaxlib==0.3.2+cuda11.cudnn82", [url])
    assert said.startswith(f"jaxlib==0.3.2+cuda11.cudnn82: not on the index, and the find-links page {url} "), said
    assert f"the find-links page {url} lists 1 file(s) of jaxlib 0.3.2+cuda11.cudnn82, none for this Python" in said
    assert pages.missing_line("jaxlib==0.9", [url]).count("lists no file of jaxlib 0.9") == 1
    assert pages.missing_line("jaxlib", [url]) == ""  # a file this Python installs: the trouble is elsewhere
