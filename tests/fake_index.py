"""A package index on the Docker bridge, for builds to fetch from (PEP 503 simple pages, wheels made on
the fly): the shapes of real trouble without PyPI, e.g. every release of a package pinning another torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
import time
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Release:
    version: str
    requires: list[str] = field(default_factory=list)
    padding: int = 0  # incompressible bytes in the wheel: what a big wheel costs to download
    files: dict[str, bytes] | None = None  # what the wheel installs, when not its own module
    uploaded: str | None = None  # PEP 700's upload-time ("2023-12-13T10:00:00Z"): served as PEP 691 JSON
    yanked: bool = False
    #: extras it declares ({extra: what it brings}); a release with extras has its metadata served apart (PEP 658)
    extras: dict[str, list[str]] = field(default_factory=dict)


def metadata(name: str, release: Release) -> str:
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {release.version}\n"
    meta += "".join(f"Requires-Dist: {req}\n" for req in release.requires)
    meta += "".join(f"Provides-Extra: {extra}\n" for extra in release.extras)
    return meta + "".join(
        f'Requires-Dist: {req}; extra == "{extra}"\n' for extra, reqs in release.extras.items() for req in reqs
    )


def wheel(name: str, release: Release) -> bytes:
    module, dist = name.replace("-", "_"), f"{name.replace('-', '_')}-{release.version}.dist-info"
    meta = metadata(name, release)
    own = {f"{module}/__init__.py": b"", f"{module}/blob.bin": os.urandom(release.padding)}
    files = {
        **(release.files if release.files is not None else own),
        f"{dist}/METADATA": meta.encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: imgbuild-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"]).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return buf.getvalue()


class FakeIndex:
    """Serves `packages` ({name: [Release, ...]}) on `host`; `delay` seconds before each wheel. `sources`: source
    distributions ({file name: bytes}, e.g. `srcpkg-1.0.tar.gz`), listed under their package's page."""

    def __init__(
        self,
        host: str,
        packages: dict[str, list[Release]],
        delay: float = 0.0,
        sources: dict[str, bytes] | None = None,
    ):
        self.packages, self.delay, self.served = dict(packages), delay, []
        self.meta = {
            f"{name.replace('-', '_')}-{r.version}-py3-none-any.whl": r
            for name, releases in packages.items()
            for r in releases
        }
        self.wheels = {
            f"{name.replace('-', '_')}-{r.version}-py3-none-any.whl": wheel(name, r)
            for name, releases in packages.items()
            for r in releases
        }
        self.served_apart = {  # PEP 658's metadata files
            f"{name.replace('-', '_')}-{r.version}-py3-none-any.whl": metadata(name, r).encode()
            for name, releases in packages.items()
            for r in releases
            if r.extras
        }
        for filename, data in (sources or {}).items():
            self.wheels[filename] = data
            self.packages.setdefault(filename.rsplit("-", 1)[0], [])
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # uv asks whether a wheel can be read in ranges first
                parts = [p for p in self.path.split("/") if p]
                if len(parts) == 2 and parts[0] == "files" and parts[1] in index.wheels:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(index.wheels[parts[1]])))
                    self.end_headers()
                else:
                    self.send_error(404)

            def do_GET(self) -> None:
                parts = [p for p in self.path.split("/") if p]
                if len(parts) == 2 and parts[0] == "simple" and parts[1] in index.packages:
                    if "application/vnd.pypi.simple.v1+json" in (self.headers.get("Accept") or ""):
                        return self._send(index.json_page(parts[1]), "application/vnd.pypi.simple.v1+json")
                    links = "".join(
                        f'<a href="/files/{w}#sha256={hashlib.sha256(index.wheels[w]).hexdigest()}">{w}</a>\n'
                        for w in index.wheels
                        if w.startswith(parts[1].replace("-", "_") + "-")
                    )
                    return self._send(f"<!DOCTYPE html><html><body>\n{links}</body></html>".encode(), "text/html")
                if len(parts) == 2 and parts[0] == "files" and parts[1].removesuffix(".metadata") in index.served_apart:
                    return self._send(index.served_apart[parts[1].removesuffix(".metadata")], "text/plain")
                if len(parts) == 2 and parts[0] == "files" and parts[1] in index.wheels:
                    time.sleep(index.delay)
                    index.served.append(parts[1])
                    # as PyPI serves its files: immutable, so an installer's cache keeps them
                    return self._send(index.wheels[parts[1]], "application/octet-stream", immutable=True)
                self.send_error(404)

            def _send(self, body: bytes, kind: str, immutable: bool = False) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                if immutable:
                    self.send_header("Cache-Control", "max-age=365000000, immutable, public")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):  # pip was stopped mid-download
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def json_page(self, name: str) -> bytes:
        """PEP 691's JSON page, with PEP 700's upload times where the release has one."""
        import json

        files = []
        for filename, data in self.wheels.items():
            if not filename.startswith(name.replace("-", "_") + "-"):
                continue
            release = self.meta.get(filename)
            row: dict[str, object] = {
                "filename": filename,
                "url": f"/files/{filename}",
                "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
                "yanked": bool(release and release.yanked),
            }
            if release and release.uploaded:
                row["upload-time"] = release.uploaded
            if filename in self.served_apart:
                row["core-metadata"] = {"sha256": hashlib.sha256(self.served_apart[filename]).hexdigest()}
            files.append(row)
        return json.dumps({"meta": {"api-version": "1.1"}, "name": name, "files": files}).encode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
