"""The Docker image store: look up, tag, untag, save and push images (docker-py stays in here)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from imgbuild import imageref, limits
from imgbuild.engine.types import ImageInfo, LocalImage, ProgressFn
from imgbuild.errors import EngineUnavailable, ImgbuildError, RegistryUnavailable

#: How long a push or a pull may go without a word from the engine (no byte of any layer moved, no step) before the
#: registry is taken to have stalled: settings.registry_deadline where the caller has settings.
PUSH_QUIET_SECONDS = limits.HTTP_COMMAND_SECONDS

#: A registry's answer the engine reports inside a push's error text: a 5xx status, or a connection that failed.
_REGISTRY_FAULT = re.compile(
    r"(?:status|code)[^0-9\n]{0,24}\b5\d\d\b|connection (?:refused|reset)|i/o timeout|no such host|"
    r"handshake timeout|unexpected EOF|broken pipe",
    re.IGNORECASE,
)


def transfer_failure(verb: str, ref: str, message: str) -> ImgbuildError:
    """A failed push or pull (`verb`), as what it is: the registry's fault (5xx, unreachable: exit 3), else the
    transfer's own (exit 1: denied, unknown, refused). One line, whatever the engine said."""
    from imgbuild.text import printable

    line = printable(" ".join(message.split()))
    if _REGISTRY_FAULT.search(line):
        host = imageref.parse(ref).registry
        return RegistryUnavailable(f"{verb} of {ref}: the registry {host} failed ({line}); check it and {verb} again")
    return ImgbuildError(f"{verb} of {ref} failed: {line}")


def until_quiet(chunks: Iterator[Any], seconds: float, ref: str, verb: str) -> Iterator[Any]:
    """`chunks` (an engine's push or pull stream) as they come, ended with RegistryUnavailable when none comes for
    `seconds`. The stream is read in a daemon thread: a blocked read never holds the caller."""
    import queue
    import threading

    box: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=64)

    def read() -> None:
        try:
            for chunk in chunks:
                box.put(("chunk", chunk))
            box.put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread as it is
            box.put(("error", exc))

    threading.Thread(target=read, name="imgbuild-push", daemon=True).start()
    while True:
        try:
            kind, value = box.get(timeout=seconds)
        except queue.Empty:
            host = imageref.parse(ref).registry
            raise RegistryUnavailable(
                f"{verb} of {ref}: nothing moved for {seconds:.0f} s, the registry {host} stalled; check it and "
                f"{verb} again (registry_deadline bounds the wait)"
            ) from None
        if kind == "end":
            return
        if kind == "error":
            raise value
        yield value


class DockerImages:
    """The engine's images, by reference."""

    def __init__(self, client: Any):
        self.client = client

    def image(self, ref: str) -> ImageInfo | None:
        from docker.errors import ImageNotFound

        try:
            img = self.client.images.get(ref)
        except ImageNotFound:
            return None
        config = img.attrs.get("Config") or {}
        return ImageInfo(
            id=img.id,
            labels=dict(config.get("Labels") or {}),
            config=config,
            repo_digests=tuple(img.attrs.get("RepoDigests") or ()),
            architecture=str(img.attrs.get("Architecture") or ""),
        )

    def image_id(self, ref: str) -> str | None:
        img = self.image(ref)
        return img.id if img else None

    def tag(self, image_id: str, ref: str) -> None:
        parsed = imageref.parse(ref)
        self.client.api.tag(image_id, parsed.name, parsed.tag or "latest", force=True)

    def untag(self, ref: str) -> None:
        from docker.errors import APIError, ImageNotFound

        with contextlib.suppress(ImageNotFound, APIError):
            self.client.api.remove_image(ref, noprune=True)

    def local_images(self) -> list[LocalImage]:
        """Every tag in the engine's store, with its image's size and times."""
        from docker.errors import DockerException
        from requests.exceptions import RequestException

        try:
            found = self.client.images.list()
        except (DockerException, RequestException) as exc:
            raise EngineUnavailable(f"cannot list the engine's images: {str(exc)[:200]}") from None
        rows = []
        for img in found:
            size = img.attrs.get("Size")
            tagged = engine_time((img.attrs.get("Metadata") or {}).get("LastTagTime"))
            for ref in img.tags or ():
                rows.append(LocalImage(ref, img.id, size if isinstance(size, int) else 0,
                                       engine_time(img.attrs.get("Created")), tagged))  # fmt: skip
        return rows

    def discard(self, ref: str) -> str:
        """Remove tag `ref` (and its image, where it was the last tag), never by force: the engine keeps an image a
        container uses. What happened, in a few words."""
        from docker.errors import APIError, ImageNotFound

        try:
            self.client.api.remove_image(ref)
        except ImageNotFound:
            return "gone already"
        except APIError as exc:
            return f"kept: {str(exc.explanation)[:200]}"
        return "removed"

    def tags_of(self, repository: str) -> list[str]:
        """The tags this engine has for `repository` (what a killed run left is found by its name)."""
        from docker.errors import DockerException
        from requests.exceptions import RequestException

        try:
            found = self.client.images.list(name=repository)
        except (DockerException, RequestException):
            return []
        return sorted({n.rsplit(":", 1)[1] for img in found for n in img.tags if n.rsplit(":", 1)[0] == repository})

    def inspect_local(self, ref: str) -> tuple[str, dict[str, Any]] | None:
        """(registry digest or "", config with the image "Id") of a local image."""
        img = self.image(ref)
        return None if img is None else img.inspected(ref)

    def pull(self, ref: str, quiet_seconds: float = PUSH_QUIET_SECONDS) -> None:
        """Pull `ref` (a base pinned by digest) into the engine; a pull the engine says nothing of for
        `quiet_seconds` is ended, as a push is."""
        from docker.errors import APIError

        parsed = imageref.parse(ref)
        try:
            stream = self.client.api.pull(
                parsed.name, tag=parsed.digest or parsed.tag or "latest", stream=True, decode=True
            )
            for chunk in until_quiet(stream, quiet_seconds, ref, "pull"):
                if "error" in chunk or "errorDetail" in chunk:
                    raise transfer_failure(
                        "pull", ref, str(chunk.get("errorDetail", {}).get("message") or chunk.get("error"))
                    )
        except APIError as exc:
            raise transfer_failure("pull", ref, str(exc.explanation)[:200]) from None

    def save(self, ref: str, path: Path) -> None:
        """`docker save` to a file (for Apptainer's docker-archive bootstrap), written whole: a save the engine
        ends midway leaves no half archive under the name."""
        from imgbuild.hostio.regular import whole_file

        with whole_file(path) as fh:
            for chunk in self.client.images.get(ref).save(named=True):
                fh.write(chunk)

    def push(
        self, ref: str, auth: dict[str, str] | None, progress: ProgressFn, quiet_seconds: float = PUSH_QUIET_SECONDS
    ) -> str:
        """Push and return the pushed digest. The engine reports push errors inside the stream; a push the engine
        says nothing of for `quiet_seconds` (a registry that took the upload and stopped answering) is ended."""
        parsed = imageref.parse(ref)
        repo, tag = parsed.name, parsed.tag or "latest"
        digest = ""
        said: set[tuple[str, str]] = set()  # (layer, status): one line each, never one per byte progress update
        stream = self.client.api.push(repo, tag=tag, stream=True, decode=True, auth_config=auth)
        for chunk in until_quiet(stream, quiet_seconds, ref, "push"):
            if "error" in chunk or "errorDetail" in chunk:
                msg = chunk.get("errorDetail", {}).get("message") or chunk.get("error")
                raise transfer_failure("push", ref, str(msg))
            if chunk.get("aux", {}).get("Digest"):
                digest = chunk["aux"]["Digest"]
            elif chunk.get("status") and chunk.get("id") and (chunk["id"], chunk["status"]) not in said:
                said.add((chunk["id"], chunk["status"]))
                progress(f"pushing {ref}: {chunk['id']} {chunk['status']}")
        if not digest:
            raise ImgbuildError(f"push of {ref} ended without a digest")
        return digest


def engine_time(text: Any) -> float | None:
    """Docker's RFC 3339 times (nanoseconds, `Z`) as seconds since the epoch; None for its year-1 "never"."""
    from datetime import datetime

    if not isinstance(text, str) or text.startswith("0001-"):
        return None
    head, _, rest = text.partition(".")
    zone = rest.lstrip("0123456789") if rest else text[19:]
    try:
        when = datetime.fromisoformat(head[:19] + (zone.replace("Z", "+00:00") or "+00:00"))
    except ValueError:
        return None
    fraction = rest[: len(rest) - len(zone)] if rest else ""
    return when.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)
