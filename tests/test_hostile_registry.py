"""A registry that misbehaves, as a table: each fault ends within its deadline, in bounded memory, as one
line with exit 3 (unreachable, too slow) or 2 (an answer imgbuild refuses), and credentials never travel
to a host other than the registry that asked for them.

The server is a real HTTP server on 127.0.0.1 that answers each path in one bad way.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from imgbuild.errors import RegistryError, RegistryUnavailable
from imgbuild.registry.auth import Credentials
from imgbuild.registry.client import RegistryClient
from tests.conftest import run_cli
from tests.fake_nvcr import QuietHandler

TAGS = {"name": "nvidia/pytorch", "tags": ["24.05-py3"]}
# 64 MiB of JSON in about 64 KiB on the wire: made once, served as fast as the socket takes it.
GZIP_BOMB = gzip.compress(b"[" + b" " * (64 * 1024 * 1024) + b"]", compresslevel=9)


class BadRegistry:
    """Each repository name selects a behaviour (`/v2/<behaviour>/tags/list`)."""

    def __init__(self) -> None:
        self.seen_auth: list[tuple[str, str]] = []  # (path, Authorization) of every request
        self.other_host = ""
        registry = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # one branch per fault, on purpose
                registry.seen_auth.append((self.path, self.headers.get("Authorization", "")))
                kind = self.path.split("/")[2] if self.path.startswith("/v2/") else self.path.strip("/")
                ok = json.dumps(TAGS).encode()
                try:
                    if kind == "trickle-body":
                        self.send_response(200)
                        self.send_header("Content-Length", "100000")
                        self.end_headers()
                        for _ in range(100000):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(0.5)
                    elif kind == "trickle-headers":
                        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                        for i in range(10000):
                            self.wfile.write(f"X-Slow-{i}: a\r\n".encode())
                            self.wfile.flush()
                            time.sleep(0.5)
                    elif kind == "stall-after-headers":
                        self.send_response(200)
                        self.send_header("Content-Length", "1000")
                        self.end_headers()
                        self.wfile.flush()
                        time.sleep(120)
                    elif kind == "retry-after-hour":
                        self._send(429, b"{}", {"Retry-After": "3600"})
                    elif kind == "always-503":
                        self._send(503, b"{}", {"Retry-After": "1"})
                    elif kind == "gzip-bomb":
                        self._send(200, GZIP_BOMB, {"Content-Encoding": "gzip", "Content-Type": "application/json"})
                    elif kind == "huge-pages":
                        page = json.dumps({"tags": ["x" * 100] * 90_000}).encode()  # 9 MB a page
                        self._send(
                            200, page, {"Link": f'</v2/huge-pages/tags/list?n=1&last={time.time()}>; rel="next"'}
                        )
                    elif kind == "link-elsewhere":
                        self._send(
                            200, ok, {"Link": f'<http://{registry.other_host}/v2/x/tags/list?last=a>; rel="next"'}
                        )
                    elif kind == "no-challenge":
                        self._send(401, b"{}")
                    elif kind == "not-json":
                        self._send(200, b"<html>proxy login</html>")
                    elif kind == "token-flow":
                        if not self.headers.get("Authorization"):
                            self._send(
                                401,
                                b"{}",
                                {"WWW-Authenticate": f'Bearer realm="http://{registry.host}/token",scope="x"'},
                            )
                        else:
                            self._send(200, ok, {"Link": f'<http://{registry.other_host}/v2/y/tags/list>; rel="next"'})
                    elif kind.startswith("token"):
                        self._send(200, b'{"token": "t0ken-for-this-host-only"}')
                    else:
                        self._send(200, ok)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False  # a trickling handler must not hold up the test's teardown
        self.server.handle_error = lambda request, address: None  # clients hang up on purpose here
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def bad() -> Iterator[BadRegistry]:
    registry = BadRegistry()
    other = BadRegistry()  # a second host: it must never see a credential of the first
    registry.other_host = other.host
    registry.other = other  # type: ignore[attr-defined]
    yield registry
    registry.close()
    other.close()


def _client(bad: BadRegistry, **kw: object) -> RegistryClient:
    defaults: dict[str, object] = dict(insecure=True, timeout=2.0, command_seconds=6.0, backoff=0.05, retries=2)
    defaults.update(kw)
    return RegistryClient(bad.host, **defaults)  # type: ignore[arg-type]


# (behaviour, error type, words, most seconds it may take)
FAULTS = [
    ("trickle-body", RegistryUnavailable, "did not answer within", 8),
    ("trickle-headers", RegistryUnavailable, "did not answer within", 8),
    ("stall-after-headers", RegistryUnavailable, "did not answer within", 8),
    ("retry-after-hour", RegistryUnavailable, "retry after 3600 s", 2),
    ("always-503", RegistryUnavailable, "", 8),
    ("gzip-bomb", RegistryError, "larger than", 8),
    ("huge-pages", RegistryError, "larger than", 8),
    ("link-elsewhere", RegistryError, "refusing to follow a link to another host or scheme", 2),
    ("no-challenge", RegistryError, "no WWW-Authenticate header", 2),
    ("not-json", RegistryError, "not JSON", 2),
]


@pytest.mark.parametrize("behaviour,error,words,seconds", FAULTS, ids=[f[0] for f in FAULTS])
def test_each_registry_fault_ends_in_time_with_one_line(behaviour, error, words, seconds, bad):
    import resource

    client = _client(bad, body_bytes=8 * 1024 * 1024)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with pytest.raises(error) as info:
        client.tags(behaviour)
    took = time.monotonic() - start
    assert took < seconds, f"{behaviour} took {took:.1f} s"
    assert words in str(info.value)
    assert "\n" not in str(info.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300 * 1024  # KiB


@pytest.mark.parametrize(  # urllib3's own error reaches us only from a body read (requests wraps the rest)
    "clock, where",
    [(c, "a whole answer") for c in ("requests", "urllib3", "socket")]
    + [(c, "a streamed blob") for c in ("requests", "socket")],
)
def test_a_read_timeout_firing_before_the_deadline_is_told_as_the_same_stall(clock, where, bad, monkeypatch):
    """Which clock fires first on a stalled read (the reader's own timeout or the client's deadline) depends on
    how busy the machine is; the user is told the same thing either way."""
    import requests
    import urllib3.exceptions

    raised = {
        "requests": requests.exceptions.ReadTimeout("read timed out"),
        "urllib3": urllib3.exceptions.ReadTimeoutError(None, "/v2/", "read timed out"),  # type: ignore[arg-type]
        "socket": TimeoutError("timed out"),
    }[clock]
    client = _client(bad)

    def stall(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(client.session, "request", stall)
    with pytest.raises(RegistryUnavailable, match="did not answer within") as info:
        if where == "a whole answer":
            client.tags("anything")
        else:
            client._stream("GET", client._url("/v2/library/x/blobs/sha256:" + "0" * 64), "repository:library/x:pull")
    assert "\n" not in str(info.value)


def test_credentials_never_reach_another_host(bad):
    """A token earned from this registry is not sent where its `Link` header points."""
    client = _client(bad, credentials=Credentials("$oauthtoken", "nvapi-secret"))
    with pytest.raises(RegistryError, match="another host"):
        client.tags("token-flow")
    assert any(auth == "Bearer t0ken-for-this-host-only" for _, auth in bad.seen_auth)
    assert bad.other.seen_auth == []  # type: ignore[attr-defined]


def test_a_link_that_downgrades_to_plain_http_is_refused():
    client = RegistryClient("registry.example", credentials=Credentials("u", "p"))
    with pytest.raises(RegistryError, match="another host or scheme"):
        client.request("GET", "http://registry.example/v2/x/tags/list?last=a", "repository:x:pull")


def test_credentials_are_not_sent_to_a_plain_http_realm_elsewhere():
    client = RegistryClient("registry.example", credentials=Credentials("u", "p"))
    with pytest.raises(RegistryError, match="plain HTTP"):
        client._token("repository:x:pull", "http://evil.example/token", {})


def test_cli_tags_against_a_stalled_registry_exits_3_within_its_deadline(bad):
    start = time.monotonic()
    result = run_cli(
        "tags",
        "stall-after-headers/x",
        "--refresh",
        env={
            "IMGBUILD_NGC_REGISTRY": bad.host,
            "IMGBUILD_REGISTRY_TIMEOUT": "2",
            "IMGBUILD_REGISTRY_DEADLINE": "5",
            "IMGBUILD_REGISTRY_BACKOFF": "0.05",
        },
    )
    assert time.monotonic() - start < 20
    assert result.code == 3, result.err
    assert result.err.count("\n") == 1 and "did not answer within" in result.err


def test_tags_work_with_a_read_only_cache(bad, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "registry").write_text("a file where a folder should be: every cache write fails")
    result = run_cli(
        "tags", "ok/x", "--json", env={"IMGBUILD_NGC_REGISTRY": bad.host, "IMGBUILD_CACHE_DIR": str(cache)}
    )
    assert result.code == 0, result.err
    assert json.loads(result.out)["total"] == 1


def test_tags_details_with_the_registry_down_is_an_environment_error(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_cli(
        "tags",
        "pytorch",
        "--details",
        "--refresh",
        env={"IMGBUILD_NGC_REGISTRY": f"127.0.0.1:{port}", "IMGBUILD_REGISTRY_BACKOFF": "0.01"},
    )
    assert result.code == 3, result.err
    assert "unreachable" in result.err


# Answers of the wrong shape, for every call: what the answer holds, or a registry error, never a crash.
ODD_SHAPES = [
    None,
    5,
    "x",
    [],
    {},
    {"tags": 5},
    {"tags": [1, None, {}, "24.05-py3", "x" * 129]},
    {"config": 5},
    {"config": {"digest": 5}},
    {"config": {"digest": "sha256:" + "a" * 64}},
    {"mediaType": "application/vnd.oci.image.index.v1+json", "manifests": 5},
    {
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [5, {"platform": 5}, {"platform": {"os": "linux", "architecture": "amd64"}, "digest": "../x"}],
    },
    {"config": {"Env": 5, "Labels": 5}},
    {"config": {"Env": [5, "A"], "Labels": {"a": 5}}},
    {"token": 5},
    {"token": None},
]


def _held(shape: object) -> dict[str, object]:
    """What each call must make of `shape` served for every request: the tags it holds that are tags (a list
    without any is no tags, never an error), the config digest a manifest names, a blob that is a JSON object
    as it is; the image config a valid manifest leads to is read by its digest, which the same answer never has
    (RegistryCorrupt: bytes bound to nothing are never used); anything else a RegistryError."""
    page = shape.get("tags") if isinstance(shape, dict) else None
    config = shape.get("config") if isinstance(shape, dict) else None
    digest = config.get("digest") if isinstance(config, dict) else None
    valid = isinstance(digest, str) and digest.startswith("sha256:")
    return {
        "tags": [t for t in page if isinstance(t, str) and len(t) <= 128] if isinstance(page, list) else [],
        "manifest": digest if valid else "RegistryError",
        "blob": shape if isinstance(shape, dict) else "RegistryError",
        "config": "RegistryCorrupt" if valid else "RegistryError",
    }


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=[json.dumps(s)[:40] for s in ODD_SHAPES])
def test_answers_of_the_wrong_shape_give_what_they_hold_or_a_registry_error(shape):
    from imgbuild.errors import ImgbuildError
    from imgbuild.ngc import describe_config

    body = json.dumps(shape).encode()

    class Answer(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802
            self._send(200, body, {"Content-Type": "application/json"})

    def described(blob: dict) -> dict:
        describe_config(blob)  # a config of any shape is described without a crash
        return blob

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    calls = {
        "tags": lambda c: c.tags("x/y"),
        "manifest": lambda c: c.manifest("x/y", "t").config_digest,
        "blob": lambda c: described(c.blob_json("x/y", "sha256:" + hashlib.sha256(body).hexdigest())),
        "config": lambda c: described(c.image_config("x/y", "t")[1]),
    }
    outcomes: dict[str, object] = {}
    try:
        for name, call in calls.items():
            client = RegistryClient(host, insecure=True, retries=0, timeout=3, command_seconds=5)
            try:
                outcomes[name] = call(client)
            except ImgbuildError as exc:  # anything else fails the test
                outcomes[name] = type(exc).__name__
    finally:
        server.shutdown()
        server.server_close()
    assert outcomes == _held(shape)


@pytest.mark.parametrize(
    "answer, tags",
    [
        ({"name": "x/y", "tags": ["24.05-py3", "25.10-py3"]}, ["24.05-py3", "25.10-py3"]),
        ({"name": "x/y", "tags": ["24.05-py3", 5, None, {}, "25.10-py3"]}, ["24.05-py3", "25.10-py3"]),
        ({"name": "x/y", "tags": None}, []),  # a repository without tags, as Distribution answers it
    ],
)
def test_a_tag_list_gives_its_tags_and_drops_what_is_no_tag(answer, tags):
    """The shapes above must not crash; this is what a client that read nothing (`return []`) would get wrong."""
    body = json.dumps(answer).encode()

    class Answer(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802
            self._send(200, body, {"Content-Type": "application/json"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = RegistryClient(f"127.0.0.1:{server.server_address[1]}", insecure=True, retries=0, timeout=3)
        assert sorted(client.tags("x/y")) == tags
    finally:
        server.shutdown()
        server.server_close()


def test_a_registry_that_announces_one_digest_and_serves_another_is_caught():
    """HEAD answered with the signed image's digest while GET served an unsigned one: `verify` printed four "ok"
    lines, trusting the header. The digest is now the hash of the bytes served, and a header that disagrees is a
    registry error naming both."""
    import hashlib

    from imgbuild.errors import RegistryError

    served = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                         "config": {"digest": "sha256:" + "c" * 64, "size": 2}, "layers": []}).encode()  # fmt: skip
    true_digest = "sha256:" + hashlib.sha256(served).hexdigest()
    signed = "sha256:" + "5" * 64
    announce = {"digest": signed}

    class Liar(QuietHandler):
        def _headers(self) -> dict[str, str]:
            return {
                "Content-Type": "application/vnd.oci.image.manifest.v1+json",
                "Docker-Content-Digest": announce["digest"],
            }

        def do_HEAD(self) -> None:  # noqa: N802
            self._send(200, b"", self._headers())

        def do_GET(self) -> None:  # noqa: N802
            self._send(200, served, self._headers())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = RegistryClient(
        f"127.0.0.1:{server.server_address[1]}", insecure=True, retries=0, timeout=3, command_seconds=5
    )
    try:
        with pytest.raises(RegistryError, match=rf"announced as {signed} but serves {true_digest}"):
            client.content_digest("lab/x", "1")
        announce["digest"] = true_digest  # an honest registry: the hash of what it serves
        assert client.content_digest("lab/x", "1") == true_digest
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("read", "kind"),
    [
        (lambda c, d: c.manifest("lab/x", d), "manifest"),
        (lambda c, d: c.manifest_raw("lab/x", d), "manifest"),
        (lambda c, d: c.image_config("lab/x", d), "manifest"),
        (lambda c, d: c.blob_json("lab/x", d), "blob"),
        (lambda c, d: c.blob_bytes("lab/x", d), "blob"),
        (lambda c, d: c.image_config("lab/x", "v1"), "config"),  # a tag's manifest naming a config served falsely
    ],
    ids=["manifest", "manifest_raw", "image_config", "blob_json", "blob_bytes", "config of a tag"],
)
def test_every_read_by_digest_is_checked_against_the_digest_asked_for(read, kind):
    """A registry that serves other bytes for a digest (another image's manifest, another config with the label a
    fresh runner wants to see) is refused in one line naming the registry and the digest, exit 3: no caller gets
    bytes bound to nothing."""
    from imgbuild.errors import EXIT_ENVIRONMENT, RegistryCorrupt
    from tests.fake_registry import ServedRegistry

    registry = ServedRegistry()
    config, other_config = b'{"config":{"Labels":{"a":"1"}}}', b'{"config":{"Labels":{"a":"2"}}}'
    registry.blobs = {"sha256:" + __import__("hashlib").sha256(b).hexdigest(): b for b in (config, other_config)}
    config_digest, other_digest = list(registry.blobs)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"digest": config_digest, "size": len(config)}, "layers": []}).encode()  # fmt: skip
    other = manifest.replace(config_digest.encode(), other_digest.encode())
    digest = registry.put("lab/x", "v1", manifest, "application/vnd.oci.image.manifest.v1+json")
    asked = {"manifest": digest, "blob": config_digest, "config": config_digest}[kind]
    registry.lies[asked] = other if kind == "manifest" else other_config
    client = RegistryClient(registry.host, insecure=True, retries=0, timeout=3, command_seconds=5)
    try:
        with pytest.raises(RegistryCorrupt) as info:
            read(client, digest if kind != "blob" else config_digest)
        del registry.lies[asked]
        read(client, digest if kind != "blob" else config_digest)  # the honest answer is read as before
    finally:
        registry.close()
    message = str(info.value)
    assert info.value.exit_code == EXIT_ENVIRONMENT and "\n" not in message
    assert registry.host in message and asked in message


# --- pushes: every transfer bounded, every registry fault exit 3 ---------------------------------------------


class _PushingApi:
    """docker-py's push and pull streams, as the engine writes them: `chunks`, then (with `stall`) nothing, ever."""

    def __init__(self, chunks: list[dict[str, object]], stall: bool = False):
        self.chunks, self.stall = chunks, stall
        self.release = threading.Event()

    def push(self, repo, tag, stream, decode, auth_config):
        yield from self.chunks
        if self.stall:
            self.release.wait(30)  # a registry that took the upload and never answers: the engine says nothing

    def pull(self, repo, tag, stream, decode):
        return self.push(repo, tag, stream, decode, None)


def _transfer(images, verb: str, quiet: float) -> None:
    ref = "127.0.0.1:5901/p5/x:v1"
    if verb == "push":
        images.push(ref, None, lambda s: None, quiet_seconds=quiet)
    else:
        images.pull(ref, quiet_seconds=quiet)


def _docker_images(api: _PushingApi):
    from imgbuild.engine.images import DockerImages

    class Client:
        pass

    client = Client()
    client.api = api  # type: ignore[attr-defined]
    return DockerImages(client)


@pytest.mark.parametrize("verb", ["push", "pull"])
def test_a_push_or_pull_the_registry_stalls_ends_within_its_deadline_in_one_line_exit_3(verb):
    from imgbuild.errors import EXIT_ENVIRONMENT

    api = _PushingApi([{"status": "Preparing", "id": "aaa"}, {"status": "Pushing", "id": "aaa"}], stall=True)
    start = time.monotonic()
    try:
        with pytest.raises(RegistryUnavailable) as info:
            _transfer(_docker_images(api), verb, 0.5)
    finally:
        api.release.set()
    assert time.monotonic() - start < 3
    message = str(info.value)
    assert info.value.exit_code == EXIT_ENVIRONMENT and "\n" not in message
    assert "127.0.0.1:5901" in message and "stalled" in message


@pytest.mark.parametrize(
    ("said", "code"),
    [
        ("received unexpected HTTP status: 500 Internal Server Error", 3),
        ("received unexpected HTTP status: 503 Service Unavailable", 3),
        ("Put http://127.0.0.1:5901/v2/p5/x/manifests/v1: dial tcp 127.0.0.1:5901: connect: connection refused", 3),
        ("denied: requested access to the resource is denied", 1),
        ("manifest invalid: manifest invalid", 1),
    ],
)
@pytest.mark.parametrize("verb", ["push", "pull"])
def test_a_transfer_the_registry_fails_is_exit_3_and_one_that_fails_itself_is_exit_1(said, code, verb):
    from imgbuild.errors import ImgbuildError

    api = _PushingApi([{"status": "Pushing", "id": "aaa"}, {"errorDetail": {"message": said + "\n\x1b[31m"}}])
    with pytest.raises(ImgbuildError) as info:
        _transfer(_docker_images(api), verb, 5)
    assert info.value.exit_code == code and "\n" not in str(info.value) and "\x1b" not in str(info.value)


def test_an_upload_the_registry_stalls_ends_within_its_deadline_in_one_line_exit_3(tmp_path):
    """The attachments' and the mirror's uploads (the client's own PUT of a blob): a registry that takes the
    connection and never reads or answers is ended by the client's bounds, exit 3."""
    from tests.fake_registry import ServedRegistry

    registry = ServedRegistry()
    registry.stall_uploads = True
    blob = tmp_path / "blob"
    blob.write_bytes(b"x" * (8 << 20))  # more than the socket buffers take
    digest = "sha256:" + __import__("hashlib").sha256(blob.read_bytes()).hexdigest()
    client = RegistryClient(registry.host, insecure=True, retries=0, timeout=1, command_seconds=3)
    start = time.monotonic()
    try:
        with pytest.raises(RegistryUnavailable) as info:
            client.upload_blob("lab/x", digest, blob)
    finally:
        registry.close()
    assert time.monotonic() - start < 6
    assert "\n" not in str(info.value) and registry.host in str(info.value)


@pytest.mark.parametrize("status", [500, 502, 503])
def test_a_registry_answering_5xx_is_exit_3_for_reads_writes_and_uploads(status, tmp_path):
    from imgbuild.errors import EXIT_ENVIRONMENT, ImgbuildError
    from tests.fake_registry import ServedRegistry

    registry = ServedRegistry()
    registry.status = status
    blob = tmp_path / "blob"
    blob.write_bytes(b"x")
    client = RegistryClient(registry.host, insecure=True, retries=0, timeout=2, command_seconds=5, backoff=0)
    calls = [
        lambda: client.manifest_raw("lab/x", "v1"),
        lambda: client.put_manifest("lab/x", "v1", b"{}", "application/vnd.oci.image.manifest.v1+json"),
        lambda: client.upload_blob("lab/x", "sha256:" + "0" * 64, blob),
    ]
    try:
        for call in calls:
            with pytest.raises(ImgbuildError) as info:
                call()
            assert info.value.exit_code == EXIT_ENVIRONMENT, str(info.value)
    finally:
        registry.close()


@pytest.mark.engine
def test_docker_pushing_to_a_registry_that_stalls_the_upload_ends_in_one_line_exit_3(
    docker_client, tmp_path, unique, cleanup_images
):
    """The real engine's push (Docker's chunked upload) into a registry that takes the upload and never answers:
    ended once the engine has said nothing for the quiet bound, never left `Pushing` until CI's own limit."""
    import os

    from imgbuild.engine.images import DockerImages
    from imgbuild.errors import EXIT_ENVIRONMENT
    from tests.fake_registry import ServedRegistry

    registry = ServedRegistry()
    registry.stall_uploads = True
    (tmp_path / "x").write_bytes(os.urandom(1 << 20))
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY x /x\n")
    ref = f"{registry.host}/p5/stall-{unique}:v1"
    docker_client.images.build(path=str(tmp_path), tag=ref)
    cleanup_images.append(ref)
    said: list[str] = []
    start = time.monotonic()
    try:
        with pytest.raises(RegistryUnavailable) as info:
            DockerImages(docker_client).push(ref, None, said.append, quiet_seconds=3)
    finally:
        registry.close()
    assert time.monotonic() - start < 15, said
    assert info.value.exit_code == EXIT_ENVIRONMENT and "\n" not in str(info.value) and "stalled" in str(info.value)


@pytest.mark.parametrize(("where", "said"), [("body", "did not finish within 2 s"), ("headers", "did not answer")])
def test_a_blob_the_registry_trickles_a_byte_at_a_time_ends_within_the_deadline(tmp_path, where, said):
    """A byte every half second restarts the socket's timeout each time, and one read waits for its whole chunk (or
    line): a mirror's download ran 100 s under a 4 s deadline, and as long again where the headers trickled. It ends
    within the deadline, in one line, exit 3."""
    from imgbuild.errors import EXIT_ENVIRONMENT

    class Trickle(QuietHandler):
        def do_GET(self) -> None:  # noqa: N802
            with contextlib.suppress(OSError):
                self.wfile.write(b"HTTP/1.0 200 OK\r\n")
                if where == "body":
                    self.wfile.write(f"Content-Length: {10**6}\r\n\r\n".encode())
                for _ in range(120):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.5)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    server.block_on_close = False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = RegistryClient(f"127.0.0.1:{server.server_address[1]}", insecure=True, timeout=1, command_seconds=2)
    start = time.monotonic()
    try:
        with pytest.raises(RegistryUnavailable) as info:
            client.download_blob("lab/x", "sha256:" + "a" * 64, 10**6, tmp_path / "blob")
    finally:
        server.shutdown()
        server.server_close()
    assert time.monotonic() - start < 6
    assert said in str(info.value) and "\n" not in str(info.value)
    assert info.value.exit_code == EXIT_ENVIRONMENT
