"""A small HTTP server that answers like nvcr.io (shapes from ../shared/docs/ngc-docker-gpu-facts.md, A1).

- `GET /v2/...` without a token: 401 `Bearer realm="http://HOST/proxy_auth",scope="repository:R:pull"` (no service=)
- `GET /proxy_auth?scope=...`: `{"token": ...}`; anonymous for public repos, Basic `$oauthtoken:<key>`
  for private ones, 401 for a wrong key
- a token expires after `token_uses` requests; then the challenge names another realm
  (`/authn/token`, service="registry", error="invalid_token") that refuses everyone, as nvcr.io's does
- tag lists paginate with `n`/`last` and a `Link: <...>; rel="next"` header
- manifests: a manifest list (amd64 + arm64) per tag, per-arch manifests, config blobs with NGC env
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import requests

GOOD_KEY = "nvapi-good-key-for-tests"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that logs nothing and answers whole bodies with their length."""

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class FakeNvcr:
    def __init__(
        self,
        tags: dict[str, list[str]],
        private: set[str] | None = None,
        token_uses: int = 1000,
        throttle_first: int = 0,
        facts: dict[str, tuple[str, str]] | None = None,
    ):
        self.tags = tags
        self.facts = facts or {}  # a release's (CUDA_VERSION, TORCH_CUDA_ARCH_LIST), where not the defaults
        self.private = private or set()
        self.token_uses = token_uses
        self.throttle_first = throttle_first
        self.log: list[str] = []
        self.tokens: dict[str, int] = {}
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], tuple[str, bytes]] = {}
        self._lock = threading.Lock()
        for repo, names in tags.items():
            for tag in names:
                self._add_image(repo, tag)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _add_image(self, repo: str, tag: str) -> None:
        release = tag.split("-")[0]
        yy, mm = (int(x) for x in release.split("."))
        cuda = "12.4.1.003" if (yy, mm) >= (24, 1) else "12.2.2.009"
        archs = "5.2 6.0 6.1 7.0 7.2 7.5 8.0 8.6 8.7 9.0+PTX"
        cuda, archs = self.facts.get(release, (cuda, archs))
        per_arch = {}
        for arch in ("amd64", "arm64"):
            config = json.dumps(
                {
                    "architecture": arch,
                    "os": "linux",
                    "config": {
                        "Env": [
                            f"CUDA_VERSION={cuda}",
                            "CUDNN_VERSION=9.1.0.70",
                            "CUDA_DRIVER_VERSION=550.54.15",
                            f"NVIDIA_PYTORCH_VERSION={release}",
                            "PYTORCH_VERSION=2.4.0a0+07cecf4168",
                            f"TORCH_CUDA_ARCH_LIST={archs}",
                            "PATH=/usr/local/lib/python3.10/dist-packages/torch_tensorrt/bin:/usr/bin",
                        ],
                        "Labels": {"com.nvidia.pytorch.version": "2.4.0a0+07cecf4168"},
                    },
                }
            ).encode()
            self.blobs[_digest(config)] = config
            manifest = json.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    "config": {
                        "digest": _digest(config),
                        "size": len(config),
                        "mediaType": "application/vnd.docker.container.image.v1+json",
                    },
                    "layers": [{"digest": "sha256:" + "0" * 64, "size": 9_000_000_000}],
                }
            ).encode()
            self.manifests[(repo, _digest(manifest))] = (
                "application/vnd.docker.distribution.manifest.v2+json",
                manifest,
            )
            per_arch[arch] = (_digest(manifest), len(manifest))
        index = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
                "manifests": [
                    {
                        "digest": d,
                        "size": s,
                        "platform": {"os": "linux", "architecture": a},
                        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                    }
                    for a, (d, s) in per_arch.items()
                ],
            }
        ).encode()
        entry = ("application/vnd.docker.distribution.manifest.list.v2+json", index)
        self.manifests[(repo, tag)] = entry
        self.manifests[(repo, _digest(index))] = entry

    def __enter__(self) -> FakeNvcr:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                with fake._lock:
                    fake.log.append(url.path + ("?" + url.query if url.query else ""))
                    if fake.throttle_first > 0 and url.path.startswith("/v2/"):
                        fake.throttle_first -= 1
                        return self._send(429, b'{"errors":[{"code":"TOOMANYREQUESTS"}]}', {"Retry-After": "0"})
                if url.path == "/proxy_auth":
                    return self._token(query)
                if url.path == "/authn/token":
                    return self._send(401, b'{"error":"dead end for anonymous clients"}')
                if url.path.startswith("/v2/"):
                    return self._api(url.path[4:], query)
                return self._send(404)

            def _token(self, query: dict[str, list[str]]) -> None:
                scope = query.get("scope", [""])[0]
                repo = scope.split(":")[1] if scope.count(":") >= 2 else ""
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    user, _, key = base64.b64decode(auth[6:]).decode().partition(":")
                    if user != "$oauthtoken" or key != GOOD_KEY:
                        return self._send(401, b'{"error":"invalid credentials"}')
                elif repo in fake.private:
                    return self._send(401, b'{"error":"authentication required"}')
                token = f"tok-{len(fake.tokens)}-{repo}"
                fake.tokens[token] = fake.token_uses
                self._send(
                    200, json.dumps({"token": token, "expires_in": 600}).encode(), {"Content-Type": "application/json"}
                )

            def _api(self, rest: str, query: dict[str, list[str]]) -> None:
                if rest == "":
                    return self._send(200, b"{}")
                repo, _, tail = rest.partition("/tags/list") if "/tags/list" in rest else ("", "", "")
                kind = "tags"
                if not repo:
                    for marker, name in (("/manifests/", "manifest"), ("/blobs/", "blob")):
                        if marker in rest:
                            repo, _, ref = rest.partition(marker)
                            kind = name
                            break
                scope = f"repository:{repo}:pull"
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                with fake._lock:
                    uses = fake.tokens.get(token)
                    if uses is not None:
                        fake.tokens[token] = uses - 1
                if uses is None:
                    return self._send(
                        401,
                        b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                        {"WWW-Authenticate": f'Bearer realm="http://{fake.host}/proxy_auth",scope="{scope}"'},
                    )
                if uses <= 0 or repo not in token:
                    return self._send(
                        401,
                        b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                        {
                            "WWW-Authenticate": f'Bearer realm="http://{fake.host}/authn/token",service="registry",'
                            f'scope="{scope}",error="invalid_token"'
                        },
                    )
                if repo not in fake.tags:
                    return self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}')
                if kind == "tags":
                    names = sorted(fake.tags[repo])
                    n = int(query.get("n", ["100000"])[0])
                    last = query.get("last", [""])[0]
                    rest_names = [t for t in names if t > last]
                    page = rest_names[:n]
                    headers = {"Content-Type": "application/json"}
                    if len(rest_names) > n:
                        headers["Link"] = f'</v2/{repo}/tags/list?n={n}&last={page[-1]}>; rel="next"'
                    return self._send(200, json.dumps({"name": repo, "tags": page}).encode(), headers)
                if kind == "manifest":
                    found = fake.manifests.get((repo, ref))
                    if not found:
                        return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                    media, body = found
                    return self._send(200, body, {"Content-Type": media, "Docker-Content-Digest": _digest(body)})
                blob = fake.blobs.get(ref)
                if blob is None:
                    return self._send(404)
                return self._send(200, blob, {"Content-Type": "application/octet-stream"})

        return Handler


def ngc_tag_names(count: int) -> list[str]:
    """NGC-shaped tag names, newest release first: YY.MM-py3 and variants of it."""
    names: list[str] = []
    yy, mm = 26, 3
    while len(names) < count:
        names += [f"{yy:02d}.{mm:02d}-py3{suffix}" for suffix in ("", "-igpu", "-devel", "-runtime")]
        yy, mm = (yy - 1, 12) if mm == 1 else (yy, mm - 1)
    return names[:count]


def push_many_tags(registry: str, repo: str, source_repo: str, source_tag: str, names: list[str]) -> None:
    """Tag one image under many names by the registry API (cross-repo blob mounts, then manifest PUTs)."""
    base = f"http://{registry}/v2"
    accept = {"Accept": "application/vnd.docker.distribution.manifest.v2+json"}
    manifest = requests.get(f"{base}/{source_repo}/manifests/{source_tag}", headers=accept, timeout=30)
    manifest.raise_for_status()
    body = manifest.json()
    for blob in [body["config"], *body["layers"]]:
        r = requests.post(f"{base}/{repo}/blobs/uploads/?mount={blob['digest']}&from={source_repo}", timeout=60)
        assert r.status_code == 201, r.text
    media = {"Content-Type": body["mediaType"]}
    with requests.Session() as session:
        for name in names:
            session.put(
                f"{base}/{repo}/manifests/{name}", data=manifest.content, headers=media, timeout=30
            ).raise_for_status()
