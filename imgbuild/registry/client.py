"""Docker Registry HTTP API v2 client: the only module that talks HTTP.

Handles the Bearer challenge flow (anonymous, NGC API key as `$oauthtoken`, docker config credentials),
nvcr.io's quirks (no `service=` in the challenge; after expiry the challenge names another realm, so we
go back to the first one), Link pagination with a page cap, retries with backoff, manifest lists and
OCI indexes, and config blobs.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

import requests

from imgbuild import limits
from imgbuild.errors import RegistryCorrupt, RegistryError, RegistryUnavailable
from imgbuild.imageref import DIGEST_RE, TAG_RE
from imgbuild.registry.auth import Credentials, credentials_for, parse_challenge, plain_http
from imgbuild.registry.manifest import INDEX_TYPES, MANIFEST_TYPES, Manifest, host_platform
from imgbuild.registry.transport import (
    RETRY_STATUS,
    TRANSPORT_ERRORS,
    Deadlined,
    PastDeadline,
    Reply,
    Stalled,
    TooBig,
    Unreachable,
    Watchdog,
    digest_of,
    error_code,
    is_loopback,
    is_stall,
    next_link,
    read_whole,
    retry_after,
    within,
)

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings

#: What a streamed body's read raises when the connection breaks (or the watchdog shuts it)
BROKEN_OFF: tuple[type[BaseException], ...] = (requests.RequestException, *TRANSPORT_ERRORS)


class RegistryClient:
    """One client per registry host; reuses tokens per scope.

    Every exchange is bounded: `request_seconds` for one request (headers and body, however slowly they
    trickle), `command_seconds` for everything this client does, `body_bytes` per body after decompression.
    Credentials go to this client's host and to the token realm it names, never to another host (a `Link`
    header pointing elsewhere is refused)."""

    def __init__(
        self,
        host: str,
        *,
        credentials: Credentials | None = None,
        insecure: bool = False,
        timeout: float = limits.HTTP_REQUEST_SECONDS,
        retries: int = 4,
        backoff: float = 0.5,
        session: requests.Session | None = None,
        command_seconds: float = limits.HTTP_COMMAND_SECONDS,
        body_bytes: int = limits.HTTP_BODY_BYTES,
    ):
        self.host = host
        self.scheme = "http" if insecure else "https"
        self.credentials = credentials
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.session = session or requests.Session()
        self.deadline = time.monotonic() + command_seconds
        self.command_seconds = command_seconds
        self.body_bytes = body_bytes
        self.requests_made = 0
        self._tokens: dict[str, str] = {}
        self._first_realm: dict[str, tuple[str, dict[str, str]]] = {}
        self._basic = False

    @classmethod
    def for_host(cls, host: str, settings: Settings, command_seconds: float | None = None) -> RegistryClient:
        """A client with credentials from settings (NGC API key on the NGC host) or the docker config."""
        return cls(
            host,
            credentials=credentials_for(host, settings),
            insecure=plain_http(host, settings),
            backoff=settings.registry_backoff,
            timeout=settings.registry_timeout,
            command_seconds=command_seconds or settings.registry_deadline,
        )

    # -- HTTP with auth and retries --------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{self.scheme}://{self.host}{path}"

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    def _unavailable(self, why: str) -> RegistryUnavailable:
        return RegistryUnavailable(
            f"registry {self.host} {why}; check the host name, the network or IMGBUILD_NGC_REGISTRY"
        )

    def _exchange(self, method: str, url: str, headers: dict[str, str], kw: dict[str, Any]) -> Reply:
        """One request, read whole within what is left of the deadline (transport.read_whole)."""
        budget = min(self.timeout, self._left())
        if budget <= 0:
            raise self._unavailable(f"did not answer within {self.command_seconds:.0f} s in all")
        headers = {"Accept-Encoding": "gzip, identity", **headers}
        try:
            return read_whole(self.session, method, url, headers, kw, budget, self.body_bytes)
        except Stalled:
            raise self._unavailable(f"did not answer within {budget:.0f} s ({urlsplit(url).path[:60]})") from None
        except Unreachable as failed:
            raise self._unavailable(f"is unreachable ({failed})") from None
        except TooBig:
            raise RegistryError(
                f"registry {self.host}: an answer is larger than "
                f"{self.body_bytes // limits.MIB} MiB ({urlsplit(url).path[:60]})"
            ) from None

    def _send(self, method: str, url: str, headers: dict[str, str], **kw: Any) -> Reply:
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                self.requests_made += 1
                resp = self._exchange(method, url, headers, kw)
            except RegistryUnavailable:  # unreachable or too slow: worth another try while time is left
                if attempt == self.retries or self._left() <= delay:
                    raise
                time.sleep(delay)
                delay *= 2
                continue
            if resp.status_code in RETRY_STATUS and attempt < self.retries:
                wait = retry_after(resp.headers.get("Retry-After", ""), delay)
                if wait > limits.RETRY_AFTER_SECONDS or wait >= self._left():
                    raise self._unavailable(f"answered HTTP {resp.status_code} and asks to retry after {wait:.0f} s")
                time.sleep(wait)
                delay *= 2
                continue
            return resp
        raise AssertionError("unreachable")

    def _token(self, scope: str, realm: str, params: dict[str, str]) -> str:
        query = {"scope": params.get("scope") or scope, "service": params.get("service") or self.host}
        auth = (self.credentials.username, self.credentials.password) if self.credentials else None
        parts = urlsplit(realm)
        if parts.scheme not in ("https", "http") or not parts.netloc:
            raise RegistryError(f"registry {self.host}: the token realm {realm[:80]!r} is not a URL")
        if auth and parts.scheme != "https" and not is_loopback(parts.netloc):
            raise RegistryError(
                f"registry {self.host}: refusing to send credentials to a token realm over plain HTTP ({parts.netloc})"
            )
        resp = self._send("GET", realm, {}, params=query, auth=auth)
        if resp.status_code in (401, 403):
            who = (
                "the NGC API key"
                if self.credentials and self.credentials.username == "$oauthtoken"
                else ("the credentials" if self.credentials else "anonymous access")
            )
            raise RegistryError(
                f"registry {self.host}: {who} was refused ({resp.status_code}) for {scope}; "
                "check the key (NGC_API_KEY / IMGBUILD_NGC_API_KEY) or `docker login`"
            )
        if resp.status_code >= 500:  # the token service is down or broken: the environment, not the request
            raise self._unavailable(f"token service answered HTTP {resp.status_code}")
        if not resp.ok:
            raise RegistryError(f"registry {self.host}: token request failed with HTTP {resp.status_code}")
        data = resp.json()
        token = (data.get("token") or data.get("access_token")) if isinstance(data, dict) else None
        if not token:
            raise RegistryError(f"registry {self.host}: token endpoint answered without a token")
        return str(token)

    def request(self, method: str, path: str, scope: str, headers: dict[str, str] | None = None, **kw: Any) -> Reply:
        """A request that answers auth challenges; `scope` is e.g. `repository:nvidia/pytorch:pull`."""
        url = path if path.startswith("http") else self._url(path)
        parts = urlsplit(url)
        if parts.netloc != self.host or parts.scheme != self.scheme:
            raise RegistryError(
                f"registry {self.host}: refusing to follow a link to another host or scheme "
                f"({parts.scheme}://{parts.netloc[:80]}); credentials stay with {self.host}"
            )
        for _ in range(3):
            resp = self._send(method, url, {**(headers or {}), **self._authorization(scope)}, **kw)
            if resp.status_code != 401:
                return resp
            self._answer_challenge(scope, resp.headers.get("WWW-Authenticate", ""))
        raise RegistryError(f"registry {self.host}: still unauthorized after a fresh token for {scope}")

    def _authorization(self, scope: str) -> dict[str, str]:
        if scope in self._tokens:
            return {"Authorization": f"Bearer {self._tokens[scope]}"}
        if self._basic and self.credentials:
            raw = f"{self.credentials.username}:{self.credentials.password}".encode()
            return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
        return {}

    def _answer_challenge(self, scope: str, challenge: str) -> None:
        """After a 401: switch to basic auth, or fetch a (fresh) bearer token for `scope`."""
        if not challenge.strip():
            raise RegistryError(
                f"registry {self.host}: authentication required, and the registry named no "
                "way to authenticate (no WWW-Authenticate header)"
            )
        scheme, params = parse_challenge(challenge)
        if scheme == "basic":
            if self._basic or not self.credentials:
                raise RegistryError(
                    f"registry {self.host}: authentication required (run `docker login` or set credentials)"
                )
            self._basic = True
            return
        if scheme != "bearer" or "realm" not in params:
            raise RegistryError(f"registry {self.host}: unsupported auth challenge {scheme[:20]!r}")
        if scope in self._tokens and scope in self._first_realm:
            # Expired token: nvcr.io now names another realm (authn.nvidia.com) that dead-ends
            # for anonymous clients; the first realm (proxy_auth) still issues fresh tokens.
            realm, params = self._first_realm[scope]
            del self._tokens[scope]
        else:
            realm = params["realm"]
            self._first_realm.setdefault(scope, (realm, params))
        self._tokens[scope] = self._token(scope, realm, params)

    # -- API ---------------------------------------------------------------------------------------

    def _check(self, resp: Reply, what: str, repo: str) -> None:
        if resp.status_code == 404:
            raise RegistryError(f"registry {self.host}: {what} not found in {repo}")
        if resp.status_code in (401, 403):
            raise RegistryError(f"registry {self.host}: access to {repo} denied ({resp.status_code})")
        if 400 <= resp.status_code < 500 and resp.status_code != 429:
            # the registry refused this request (not busy, not down): say what it said, briefly
            raise RegistryError(
                f"registry {self.host}: refused {what} in {repo} (HTTP {resp.status_code}{error_code(resp)})"
            )
        if not resp.ok:
            raise RegistryUnavailable(f"registry {self.host}: HTTP {resp.status_code} for {what} in {repo}")

    def tags(self, repo: str, page_size: int = 1000, max_pages: int = 50) -> list[str]:
        """Every tag of `repo`, following `Link: <...>; rel="next"` up to `max_pages` pages."""
        scope = f"repository:{repo}:pull"
        url: str | None = f"/v2/{repo}/tags/list?n={page_size}"
        tags: list[str] = []
        received = 0
        for _ in range(max_pages):
            if url is None:
                break
            resp = self.request("GET", url, scope)
            if resp.status_code == 404:
                raise RegistryError(f"registry {self.host}: unknown repository {repo}")
            self._check(resp, "tag list", repo)
            received += len(resp.content)
            if received > limits.HTTP_TAGS_BYTES:
                raise RegistryError(
                    f"registry {self.host}: the tag list of {repo} is larger than "
                    f"{limits.HTTP_TAGS_BYTES // limits.MIB} MiB"
                )
            body = resp.json()
            page = body.get("tags") if isinstance(body, dict) else None
            tags.extend(t for t in (page if isinstance(page, list) else []) if isinstance(t, str) and len(t) <= 128)
            url = next_link(resp.headers.get("Link", ""), self._url(""))
        else:
            if url is not None:
                raise RegistryError(f"registry {self.host}: {repo} has more than {max_pages} pages of tags")
        return tags

    def manifest(
        self, repo: str, reference: str, *, resolve_platform: bool = True, arch: str | None = None
    ) -> Manifest:
        """The manifest for a tag or digest; an index/list is resolved to this host's platform (or `arch`)."""
        resp = self._read(repo, "manifests", reference)
        body = resp.json()
        if not isinstance(body, dict):
            raise RegistryError(f"registry {self.host}: the manifest of {repo}:{reference} is not a JSON object")
        media_type = str(body.get("mediaType") or resp.headers.get("Content-Type", "").split(";")[0])
        digest = digest_of(resp.content)  # what we received is what we pin, never a header
        if resolve_platform and media_type in INDEX_TYPES:
            os_name, host_arch = host_platform()
            arch = arch or host_arch
            listed = body.get("manifests")
            entries = [e for e in (listed if isinstance(listed, list) else [])[:64] if isinstance(e, dict)]
            plats: list[dict[str, Any]] = [p if isinstance(p := e.get("platform"), dict) else {} for e in entries]
            platforms = tuple(sorted({str(p.get("architecture")) for p in plats if p.get("os") == os_name}))
            for entry, plat in zip(entries, plats, strict=True):
                if plat.get("os") == os_name and plat.get("architecture") == arch:
                    inner_digest = str(entry.get("digest", ""))
                    if not DIGEST_RE.fullmatch(inner_digest):
                        raise RegistryError(f"registry {self.host}: {repo}:{reference} lists a malformed digest")
                    inner = self.manifest(repo, inner_digest, resolve_platform=False)
                    return Manifest(digest, media_type, inner.body, platforms)
            raise RegistryError(f"registry {self.host}: {repo}:{reference} has no {os_name}/{arch} image")
        return Manifest(digest, media_type, body)

    def _read(self, repo: str, kind: str, reference: str) -> Reply:
        """GET a manifest or a blob (`kind`: "manifests", "blobs"). Whatever is asked for by digest is checked
        against it here, the one door every read passes: no caller ever sees bytes that are not the ones named."""
        by_digest = DIGEST_RE.fullmatch(reference) is not None
        if not by_digest and (kind == "blobs" or not TAG_RE.fullmatch(reference)):
            # what is neither a tag nor a sha256 digest names nothing its answer could be checked against
            raise RegistryError(
                f"registry {self.host}: {reference[:80]!r} is neither a tag nor a sha256 digest of {repo}: not read"
            )
        headers = {"Accept": MANIFEST_TYPES} if kind == "manifests" else {}
        resp = self.request("GET", f"/v2/{repo}/{kind}/{reference}", f"repository:{repo}:pull", headers)
        self._check(resp, f"{kind[:-1]} {reference}", repo)
        if by_digest and (served := digest_of(resp.content)) != reference:
            raise self._corrupt(repo, reference, served)
        return resp

    def _corrupt(self, repo: str, asked: str, served: str) -> RegistryCorrupt:
        return RegistryCorrupt(f"registry {self.host}: {repo}@{asked} was asked for and {served} served")

    def blob_json(self, repo: str, digest: str) -> dict[str, Any]:
        body = self._read(repo, "blobs", digest).json()
        if not isinstance(body, dict):
            raise RegistryError(f"registry {self.host}: the config blob of {repo} is not a JSON object")
        return body

    def blob_bytes(self, repo: str, digest: str) -> bytes:
        """A small blob (an attachment), read whole within the body cap and checked against its digest."""
        return self._read(repo, "blobs", digest).content

    def image_config(self, repo: str, reference: str) -> tuple[Manifest, dict[str, Any]]:
        """Manifest and image config (Env, Labels, ...) without pulling any layer."""
        manifest = self.manifest(repo, reference)
        return manifest, self.blob_json(repo, manifest.config_digest)

    # -- copying between registries (imgbuild mirror) --------------------------------------------------

    def manifest_raw(self, repo: str, reference: str) -> tuple[bytes, str, str]:
        """(the manifest's bytes as served, its media type, its digest): copied as they are, digests hold."""
        resp = self._read(repo, "manifests", reference)
        body = resp.json()
        media_type = str((body.get("mediaType") if isinstance(body, dict) else "") or "")
        media_type = media_type or resp.headers.get("Content-Type", "").split(";")[0].strip()
        return resp.content, media_type, digest_of(resp.content)

    def content_digest(self, repo: str, reference: str) -> str | None:
        """The digest of what `reference` serves here, computed from the manifest's own bytes (GET and hash), never
        from a header; None when there is none. A registry whose HEAD names another digest than the bytes it
        serves is lying about what the tag holds, and is refused."""
        try:
            _, _, digest = self.manifest_raw(repo, reference)
        except RegistryError as exc:
            if "no such" in str(exc) or "not found" in str(exc).lower() or "MANIFEST_UNKNOWN" in str(exc):
                return None
            raise
        headed = self._announced_digest(repo, reference)
        if headed is not None and headed != digest:
            raise RegistryError(
                f"registry {self.host}: {repo}:{reference[:80]} is announced as {headed} but serves {digest}: "
                "the registry does not say truly what the tag holds"
            )
        return digest

    def _announced_digest(self, repo: str, reference: str) -> str | None:
        """The digest a HEAD's Docker-Content-Digest header announces for `reference` (None: none). A header is a
        claim, never an answer: only content_digest reads it, to refuse a registry whose claim and bytes differ."""
        resp = self.request(
            "HEAD", f"/v2/{repo}/manifests/{reference}", f"repository:{repo}:pull", {"Accept": MANIFEST_TYPES}
        )
        if resp.status_code == 404:
            return None
        self._check(resp, f"manifest {reference}", repo)
        digest = resp.headers.get("Docker-Content-Digest", "")
        return digest if DIGEST_RE.fullmatch(digest) else None

    def put_manifest(self, repo: str, reference: str, content: bytes, media_type: str) -> None:
        resp = self.request(
            "PUT",
            f"/v2/{repo}/manifests/{reference}",
            f"repository:{repo}:pull,push",
            {"Content-Type": media_type},
            data=content,
        )
        self._check(resp, f"manifest {reference}", repo)

    def delete_manifest(self, repo: str, digest: str) -> None:
        resp = self.request("DELETE", f"/v2/{repo}/manifests/{digest}", f"repository:{repo}:pull,push,delete")
        if resp.status_code in (405, 400):
            raise RegistryError(
                f"registry {self.host}: deleting manifests is not enabled there (HTTP {resp.status_code})"
            )
        self._check(resp, f"manifest {digest[:19]}", repo)

    def has_blob(self, repo: str, digest: str) -> bool:
        resp = self.request("HEAD", f"/v2/{repo}/blobs/{digest}", f"repository:{repo}:pull")
        return resp.status_code == 200

    def mount_blob(self, repo: str, digest: str, from_repo: str) -> bool:
        """Cross-repository mount: the blob is already here under `from_repo`; True when the registry did it."""
        resp = self.request(
            "POST",
            f"/v2/{repo}/blobs/uploads/?mount={digest}&from={from_repo}",
            f"repository:{repo}:pull,push",
            data=b"",
        )
        return resp.status_code == 201

    def download_blob(self, repo: str, digest: str, size: int, dest: Path) -> None:
        """Stream a blob to `dest`, checking its size and digest on the way (a blob is never held in memory)."""
        if not DIGEST_RE.fullmatch(digest):
            raise RegistryError(f"registry {self.host}: {digest[:80]!r} is no sha256 digest of {repo}: not read")
        url = self._url(f"/v2/{repo}/blobs/{digest}")
        resp = self._stream("GET", url, f"repository:{repo}:pull")
        sha, received = hashlib.sha256(), 0
        late = f"did not finish within {self.command_seconds:.0f} s"
        watch = Watchdog(resp, self._left())
        try:
            self._check(Reply(resp.status_code, resp.headers, b"", url), f"blob {digest[:19]}", repo)
            with watch, open(dest, "wb") as out:
                for chunk in resp.iter_content(1 << 20):
                    received += len(chunk)
                    if received > size:
                        raise RegistryError(
                            f"registry {self.host}: blob {digest[:19]} is larger than its manifest says"
                        )
                    sha.update(chunk)
                    out.write(chunk)
        except BROKEN_OFF as exc:
            why = late if watch.fired.is_set() else f"broke off a download ({type(exc).__name__})"
            raise self._unavailable(why) from None
        finally:
            resp.close()
        if watch.fired.is_set():  # the body ended where the watchdog shut it
            raise self._unavailable(late)
        if (served := "sha256:" + sha.hexdigest()) != digest:
            raise self._corrupt(repo, digest, served)

    def upload_blob(self, repo: str, digest: str, source: Path) -> None:
        """Upload a blob in one PUT (the registry checks the digest)."""
        scope = f"repository:{repo}:pull,push"
        resp = self.request("POST", f"/v2/{repo}/blobs/uploads/", scope, data=b"")
        self._check(resp, "upload", repo)
        location = urljoin(self._url("/"), resp.headers.get("Location", ""))
        if urlsplit(location).netloc != self.host:
            raise RegistryError(f"registry {self.host}: the upload location points at another host")
        url = location + ("&" if "?" in location else "?") + f"digest={digest}"
        try:
            with open(source, "rb") as raw:
                headers = {"Content-Type": "application/octet-stream", "Content-Length": str(source.stat().st_size)}
                put = self._stream("PUT", url, scope, headers=headers, data=Deadlined(raw, self.deadline))
                put.close()
        except (requests.RequestException, OSError) as exc:  # a stalled send times out as the socket's read does
            raise self._unavailable(f"stopped taking an upload ({type(exc).__name__})") from None
        except PastDeadline:
            raise self._unavailable(f"did not take an upload within {self.command_seconds:.0f} s") from None
        self._check(Reply(put.status_code, put.headers, b"", url), f"blob {digest[:19]}", repo)

    def _stream(
        self, method: str, url: str, scope: str, headers: dict[str, str] | None = None, **kw: Any
    ) -> requests.Response:
        """A request whose body is streamed (blobs): authorised like `request`, bounded by an idle timeout
        per read and by this client's deadline, its answer's headers within one request's time (an upload's: what
        is left of the deadline, the body is sent first); the caller reads and closes it."""
        for _ in range(3):
            if self._left() <= 0:
                raise self._unavailable(f"did not finish within {self.command_seconds:.0f} s")
            self.requests_made += 1
            sent = {**(headers or {}), **self._authorization(scope)}
            budget = self._left() if "data" in kw else min(self.timeout, self._left())
            try:
                resp = within(
                    budget,
                    functools.partial(
                        self.session.request,
                        method,
                        url,
                        headers=sent,
                        timeout=(min(10.0, self.timeout), self.timeout),  # the first: a send's bound too
                        stream=True,
                        **kw,
                    ),
                )
            except Stalled:
                raise self._unavailable(f"did not answer within {budget:.0f} s") from None
            except (requests.RequestException, OSError) as exc:
                if is_stall(exc):
                    raise self._unavailable(f"did not answer within {self.timeout:.0f} s") from None
                raise self._unavailable(f"is unreachable ({type(exc).__name__})") from None
            if resp.status_code != 401:
                return resp
            resp.close()
            self._answer_challenge(scope, resp.headers.get("WWW-Authenticate", ""))
            if hasattr(kw.get("data"), "seek"):
                kw["data"].seek(0)
        raise RegistryError(f"registry {self.host}: still unauthorized after a fresh token for {scope}")
