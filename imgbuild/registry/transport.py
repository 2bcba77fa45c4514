"""HTTP answers read whole within a deadline and a size cap, and the small rules around them: which statuses are
retried and after how long, where the next page is, whether a host is this machine, a body's digest."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import requests

from imgbuild.errors import RegistryError
from imgbuild.registry_identity import is_loopback as is_loopback  # the client reads it here

RETRY_STATUS = {429, 500, 502, 503, 504}
T = TypeVar("T")


@dataclass
class Reply:
    """An HTTP answer read whole, within the deadline and the size cap."""

    status_code: int
    headers: Any
    content: bytes
    url: str

    @property
    def ok(self) -> bool:
        return self.status_code < 400

    def json(self) -> Any:
        from imgbuild.boundedjson import NotJson, loads

        try:
            return loads(self.content, "its answer")
        except NotJson as exc:
            raise RegistryError(
                f"registry {urlsplit(self.url).netloc}: answered with something imgbuild does not read ({exc}; "
                f"HTTP {self.status_code}, {len(self.content)} bytes)"
            ) from None


def error_code(resp: Reply) -> str:
    """`: MANIFEST_BLOB_UNKNOWN`, the first error code of a registry's JSON error body, or ""."""
    try:
        errors = json.loads(resp.content[:65536]).get("errors")
        code = str(errors[0].get("code", ""))
    except (ValueError, AttributeError, TypeError, IndexError, KeyError, RecursionError):
        return ""
    return f": {code[:40]}" if code.replace("_", "").isalnum() and code.isascii() else ""


class TooBig(Exception):
    pass


def transport_errors() -> tuple[type[BaseException], ...]:
    import http.client

    import urllib3.exceptions

    return (urllib3.exceptions.HTTPError, http.client.HTTPException)


TRANSPORT_ERRORS = transport_errors()


class Stalled(Exception):
    """No whole answer within the budget, whichever clock fired first."""


class Unreachable(Exception):
    """The transport failed; its message is the failing error's type name."""


def read_whole(
    session: requests.Session,
    method: str,
    url: str,
    headers: dict[str, str],
    kw: dict[str, Any],
    budget: float,
    cap: int,
) -> Reply:
    """One request, read whole in a daemon thread so that no server can hold it past `budget` seconds. Raises
    Stalled, Unreachable or TooBig."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            resp = session.request(method, url, headers=headers, timeout=(min(10.0, budget), budget), stream=True, **kw)
            box["resp"] = resp
            try:
                box["reply"] = Reply(resp.status_code, resp.headers, read_body(resp, cap), url)
            finally:
                resp.close()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread as it is
            box["error"] = exc

    worker = threading.Thread(target=work, name="imgbuild-http", daemon=True)
    worker.start()
    worker.join(budget)
    if worker.is_alive():
        if "resp" in box:
            shutdown(box["resp"])  # the reader's recv returns; the daemon thread ends with it
        raise Stalled
    error = box.get("error")
    if error is None:
        return box["reply"]  # type: ignore[no-any-return]
    if isinstance(error, TooBig):
        raise error
    if is_stall(error):  # the reader's own timeout fired before the join's: the same stall
        raise Stalled
    # urllib3's own errors (a read timing out mid-body) and http.client's reach us unwrapped when the body is
    # read from resp.raw
    if isinstance(error, (requests.RequestException, OSError, zlib.error, *TRANSPORT_ERRORS)):
        raise Unreachable(type(error).__name__)
    raise error


def is_stall(error: BaseException) -> bool:
    """A read that waited past its timeout: the server stalled, it did not refuse. Whichever clock fires first
    (the reader's socket timeout or the caller's deadline), the user is told the same thing."""
    import urllib3.exceptions

    return isinstance(error, (requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError, TimeoutError))


def read_body(resp: requests.Response, cap: int) -> bytes:
    """The body, decompressed here with a bound (a gzip bomb stops at `cap`, whatever it claims)."""
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    inflate = (
        zlib.decompressobj(16 + zlib.MAX_WBITS if encoding in ("gzip", "x-gzip") else zlib.MAX_WBITS)
        if encoding in ("gzip", "x-gzip", "deflate")
        else None
    )
    out = bytearray()
    for chunk in resp.raw.stream(64 * 1024, decode_content=False):
        if inflate is not None:
            chunk = inflate.decompress(chunk, cap + 1 - len(out))
        out += chunk
        if len(out) > cap:
            raise TooBig()
    return bytes(out)


def within(budget: float, call: Callable[[], T]) -> T:
    """`call()`'s result, waited for at most `budget` seconds (Stalled past it). A server that trickles its answer's
    headers a byte at a time restarts each read's timeout, so only a clock outside the call bounds it; the call goes
    on in a daemon thread until that server lets go."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread as it is
            box["error"] = exc

    worker = threading.Thread(target=work, name="imgbuild-http", daemon=True)
    worker.start()
    worker.join(max(0.0, budget))
    if worker.is_alive():
        raise Stalled
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class Watchdog:
    """Shuts `resp`'s socket down once `seconds` have passed: a streamed body that trickles a byte now and then holds
    one read for as long as it likes (each byte restarts the socket's timeout, and a read waits for its whole
    chunk), so only a clock outside the read bounds it. `fired`: whether it did."""

    def __init__(self, resp: requests.Response, seconds: float):
        self.resp = resp
        self.fired = threading.Event()
        self.timer = threading.Timer(max(0.0, seconds), self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        self.fired.set()
        shutdown(self.resp)

    def __enter__(self) -> Watchdog:
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()


def shutdown(resp: requests.Response) -> None:
    """Shut the response's socket down without taking the reader's locks (close() would wait for them)."""
    import socket

    conn = getattr(resp.raw, "_connection", None) or getattr(resp.raw, "connection", None)
    sock = getattr(conn, "sock", None)
    if sock is None:  # a connection that closes after this answer (HTTP/1.0) handed its socket to the answer's file
        body = getattr(getattr(resp.raw, "_fp", None), "fp", None)
        sock = getattr(getattr(body, "raw", None), "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def retry_after(header: str, default: float) -> float:
    header = header.strip()
    if header.isdigit():
        return float(header)
    if header:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(header).timestamp() - time.time())
        except (TypeError, ValueError):
            pass
    return default


def next_link(header: str, base: str) -> str | None:
    for part in header.split(","):
        m = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', part)
        if m:
            target = m.group(1)
            return target if target.startswith("http") else urljoin(base, target)
    return None


def digest_of(content: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(content).hexdigest()


class PastDeadline(Exception):
    """An upload's body was asked for past its client's deadline."""


class Deadlined:
    """A file sent as a request body that ends the send once the client's deadline has passed (a registry that
    takes one byte now and then never finishes otherwise)."""

    def __init__(self, raw: Any, deadline: float):
        self.raw, self.deadline = raw, deadline

    def read(self, size: int = -1) -> bytes:
        if time.monotonic() > self.deadline:
            raise PastDeadline
        return self.raw.read(size)  # type: ignore[no-any-return]

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)  # type: ignore[no-any-return]

    def tell(self) -> int:
        return self.raw.tell()  # type: ignore[no-any-return]
