"""Image references: the one parser (Docker's distribution grammar, matched whole-string).

    reference := name [ ":" tag ] [ "@" digest ]
    name      := [ domain "/" ] path-component ( "/" path-component )*
    domain    := host [ ":" port ], host made of [A-Za-z0-9-] labels joined by "."
    path      := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
    tag       := [A-Za-z0-9_] [A-Za-z0-9_.-]{0,127}
    digest    := "sha256:" 64 hex

A first component is a registry host when it has a "." or a ":" or is `localhost` (Docker's rule);
otherwise the reference is on Docker Hub, where one-component names live under `library/`.

Beside references, the image files a cluster runtime runs from disk instead (.sif, .sqsh, OCI bundles), known by
their endings: the one table every door that takes an image reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from imgbuild import limits
from imgbuild.registry_identity import DOCKER_HUB, Registry, registry_identity

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?"  # the port: any digits Docker reads, 1-65535 (registry_identity)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[a-f0-9]{64}"

HOST_RE = re.compile(_HOST)
COMPONENT_RE = re.compile(_COMPONENT)
TAG_RE = re.compile(_TAG)
DIGEST_RE = re.compile(_DIGEST)
REFERENCE_RE = re.compile(
    rf"(?:(?P<host>{_HOST})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)


@dataclass(frozen=True)
class ImageRef:
    host: str  # "" when none was written (Docker Hub)
    path: str  # e.g. nvidia/pytorch, alice/research, ubuntu
    tag: str = ""
    digest: str = ""

    @property
    def registry(self) -> str:
        """The host to talk to: the written one, or Docker Hub."""
        return self.host or DOCKER_HUB

    @property
    def identity(self) -> Registry:
        """The registry by what it is, not how it is written (`REGISTRY.LAB:05000` is `registry.lab:5000`)."""
        return registry_identity(self.registry)

    @property
    def repository(self) -> str:
        """The repository path as the registry API names it (`library/ubuntu` on Docker Hub)."""
        if not self.host and "/" not in self.path:
            return f"library/{self.path}"
        return self.path

    @property
    def name(self) -> str:
        """host/path as written, without tag or digest."""
        return f"{self.host}/{self.path}" if self.host else self.path

    @property
    def reference(self) -> str:
        """What to ask the registry's manifest endpoint for: the digest, else the tag, else `latest`."""
        return self.digest or self.tag or "latest"

    def with_tag(self, tag: str) -> ImageRef:
        return ImageRef(self.host, self.path, tag, "")

    def normal(self) -> str:
        """A spelling that compares equal for equal images: `ubuntu` == `docker.io/library/ubuntu:latest`."""
        hub = self.identity.is_docker_hub
        host = "" if hub else f"{self.identity}/"
        path = self.repository.removeprefix("library/") if hub else self.path
        return f"{host}{path}:{self.tag or 'latest'}" + (f"@{self.digest}" if self.digest else "")

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


class BadReference(ValueError):
    pass


def parse(text: str) -> ImageRef:
    """Parse a whole reference; raises BadReference saying what is wrong (never a partial match)."""
    if not isinstance(text, str) or not text:
        raise BadReference("empty image reference")
    if len(text) > limits.REFERENCE_CHARS:
        raise BadReference(f"longer than {limits.REFERENCE_CHARS} characters")
    m = REFERENCE_RE.fullmatch(text)
    if not m:
        raise BadReference(f"not an image reference: {text[:80]!r}")
    host, path = m["host"] or "", m["path"]
    if host and not _is_host(host):
        # `alice/research`: the first part is a path component, not a registry.
        path, host = f"{host}/{path}", ""
        if not COMPONENT_RE.fullmatch(path.split("/", 1)[0]):
            raise BadReference(f"not an image reference: {text[:80]!r}")
    if host:
        try:
            registry_identity(host)  # a port the engine reads: 1-65535
        except ValueError as exc:
            raise BadReference(f"{exc}: {text[:80]!r}") from None
    return ImageRef(host, path, m["tag"] or "", m["digest"] or "")


def _is_host(first: str) -> bool:
    return "." in first or ":" in first or first == "localhost"


# --- image files: what a cluster runtime runs from the cluster's disk instead of a reference ----------------

#: Apptainer's image files: SIF, and Singularity 2's .simg.
APPTAINER_ENDINGS = (".sif", ".simg")

#: Image files by their endings: (the runtimes that run them, what they are, how `export` writes one).
IMAGE_FILES = {
    APPTAINER_ENDINGS: (("apptainer", "singularity"), "an Apptainer image", "--apptainer"),
    (".sqsh", ".sqfs", ".squashfs"): (("pyxis", "edf"), "an enroot squashfs", "--sqsh FILE"),
    (".oci",): (("oci",), "an OCI bundle", "--oci DIR"),
}
#: The runtimes that run an image file on the cluster's disk; the others only an image from a registry.
FILE_RUNTIMES = frozenset(name for runtimes, _, _ in IMAGE_FILES.values() for name in runtimes)


#: A path under a site's variable: `$SCRATCH/x.sif`, `${WORK}/x.sqsh` (never a command substitution, `$(...)`).
_SITE_VARIABLE = re.compile(r"\$\{?[A-Za-z_]")


def is_file_path(image: str) -> bool:
    """`image` names a file or folder on the cluster (a path, or one under the site's variable), not a registry's
    image."""
    return image.startswith(("/", "./", "../", "~/")) or bool(_SITE_VARIABLE.match(image))


def file_kind(image: str) -> tuple[str, ...] | None:
    """The endings of the kind of image file `image` names (IMAGE_FILES), None where it names none."""
    name = image.rstrip("/").lower()
    return next((endings for endings in IMAGE_FILES if name.endswith(endings)), None)
