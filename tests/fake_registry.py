"""A registry in memory, for one repository: just the calls build.attest and build.spared make (upload, put,
read back), each checked as a registry would check it. For tests that need no HTTP at all; the misbehaving
registries that do are served from 127.0.0.1 (tests/fake_nvcr.py, the hostile registry tests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.errors import RegistryError
from imgbuild.supply import attest

if TYPE_CHECKING:
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.engine.types import ProgressFn

    PushFn = Callable[[str, dict[str, str] | None, ProgressFn, float], str]


class MemoryRegistry:
    """Just the registry calls attest makes, in memory, for one repository."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, bytes] = {}

    def has_blob(self, repo: str, digest: str) -> bool:
        return digest in self.blobs

    def upload_blob(self, repo: str, digest: str, source: Path) -> None:
        data = source.read_bytes()
        assert attest.sha256(data) == digest
        self.blobs[digest] = data

    def put_manifest(self, repo: str, reference: str, content: bytes, media_type: str) -> None:
        assert media_type == attest.OCI_MANIFEST
        self.manifests[reference] = content

    def manifest_raw(self, repo: str, reference: str) -> tuple[bytes, str, str]:
        if reference not in self.manifests:
            raise RegistryError("MANIFEST_UNKNOWN")
        return self.manifests[reference], attest.OCI_MANIFEST, attest.sha256(self.manifests[reference])

    def blob_bytes(self, repo: str, digest: str) -> bytes:
        return self.blobs[digest]


class ServedRegistry:
    """A registry on 127.0.0.1 that keeps manifests, tags and blobs in memory, served over HTTP so that
    RegistryClient's own checks run. It misbehaves on request:
    - `after_put(repo, reference)`: runs after a manifest PUT is stored (another pusher moving the tag);
    - `lies[digest] = bytes`: other bytes served for a read by that digest (manifest or blob), never by a tag;
    - `announce[(repo, tag)] = digest`: the Docker-Content-Digest header of that tag's answers (a HEAD's claim);
    - `stall_uploads`: a blob upload (PUT, or an engine's PATCH) is accepted and never answered;
    - `status`: every request answered with this HTTP status (a registry in trouble)."""

    def __init__(self) -> None:
        import threading
        from http.server import ThreadingHTTPServer

        from tests.fake_nvcr import QuietHandler

        self.manifests: dict[str, tuple[bytes, str]] = {}  # digest -> (bytes, media type), any repository
        self.tags: dict[tuple[str, str], str] = {}  # (repo, tag) -> digest
        self.blobs: dict[str, bytes] = {}
        self.lies: dict[str, bytes] = {}
        self.announce: dict[tuple[str, str], str] = {}
        self.after_put: Callable[[str, str], None] | None = None
        self.stall_uploads = False
        self.status = 0
        self.stop = threading.Event()
        registry = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def _route(self) -> tuple[str, str, str]:
                import re

                path = self.path.split("?")[0]
                m = re.fullmatch(r"/v2/(.+)/(manifests|blobs/uploads|blobs|tags)/([^/]*)", path)
                return (m.group(1), m.group(2), m.group(3)) if m else ("", "", "")

            def _get(self, head: bool) -> None:
                status, body, headers = self._answer()
                if head:  # the headers alone: a body would be read as the next answer on this connection
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    return None
                return self._send(status, body, headers)

            def _answer(self) -> tuple[int, bytes, dict[str, str]]:
                repo, kind, ref = self._route()
                if registry.status:
                    return registry.status, b"{}", {}
                if kind == "tags":
                    tags = sorted(tag for (name, tag) in registry.tags if name == repo)
                    return 200, json.dumps({"name": repo, "tags": tags}).encode(), {}
                if kind == "manifests":
                    digest = registry.tags.get((repo, ref), ref)
                    if digest not in registry.manifests:
                        return 404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}', {}
                    body, media_type = registry.manifests[digest]
                    body = registry.lies.get(ref, body)  # a lie told to a read by digest only
                    said = registry.announce.get((repo, ref), digest)
                    return 200, body, {"Content-Type": media_type, "Docker-Content-Digest": said}
                if kind == "blobs" and ref in registry.blobs:
                    return 200, registry.lies.get(ref, registry.blobs[ref]), {"Docker-Content-Digest": ref}
                return (404 if kind else 200), b"{}", {}

            def do_GET(self) -> None:
                self._get(head=False)

            def do_HEAD(self) -> None:
                self._get(head=True)

            def do_POST(self) -> None:
                repo, _, _ = self._route()
                if registry.status:
                    return self._send(registry.status, b"{}")
                return self._send(202, b"", {"Location": f"/v2/{repo}/blobs/uploads/u1"})

            def do_PATCH(self) -> None:  # the engines' chunked upload: only ever stalled here
                self.close_connection = True
                if registry.stall_uploads:
                    registry.stop.wait(60)
                    return None
                return self._send(501, b"{}")

            def do_PUT(self) -> None:
                from urllib.parse import parse_qs, urlsplit

                repo, kind, ref = self._route()
                if registry.status:
                    return self._send(registry.status, b"{}")
                if kind == "blobs/uploads" and registry.stall_uploads:
                    registry.stop.wait(60)  # takes the connection, reads nothing, answers nothing
                    self.close_connection = True  # the unread body is no next request
                    return None
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                digest = attest.sha256(body)
                if kind == "blobs/uploads":
                    if parse_qs(urlsplit(self.path).query).get("digest") != [digest]:
                        return self._send(400, b'{"errors":[{"code":"DIGEST_INVALID"}]}')
                    registry.blobs[digest] = body
                    return self._send(201, b"", {"Docker-Content-Digest": digest})
                registry.manifests[digest] = (body, self.headers.get("Content-Type", ""))
                if not ref.startswith("sha256:"):
                    registry.tags[(repo, ref)] = digest
                self._send(201, b"", {"Docker-Content-Digest": digest})
                if registry.after_put is not None:
                    registry.after_put(repo, ref)
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def put(self, repo: str, tag: str, body: bytes, media_type: str) -> str:
        """Store a manifest at `tag` as a push would; its digest."""
        digest = attest.sha256(body)
        self.manifests[digest] = (body, media_type)
        self.tags[(repo, tag)] = digest
        return digest

    def engine_push(self, engine: FakeEngine, then: Callable[[str, str], None] | None = None) -> PushFn:
        """The fake engine's push, as this registry sees it: each image's manifest stored at its tag; `then(repo,
        tag)` runs after (another pusher)."""
        from imgbuild import imageref
        from imgbuild.registry.manifest import DOCKER_MANIFEST_TYPE

        def push(ref: str, auth: dict[str, str] | None, progress: ProgressFn, quiet_seconds: float = 0.0) -> str:
            parsed = imageref.parse(ref)
            body = json.dumps({"schemaVersion": 2, "config": {"digest": engine.images.image_id(ref)}}).encode()
            digest = self.put(parsed.repository, parsed.tag, body, DOCKER_MANIFEST_TYPE)
            if then is not None:
                then(parsed.repository, parsed.tag)
            return digest

        return push

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
