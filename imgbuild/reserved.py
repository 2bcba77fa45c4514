"""The names imgbuild gives its own things, in one list: the tags it makes beside a recipe's (a build's candidate,
the kept previous image, a foreign platform's image, Podman's cache, cosign's and the smoke record's attachments),
its own folder in every image, and the labels it writes. The recipe model refuses each where a recipe could set
it; the promoter and the CI code make the tags through the functions here, so the two never drift apart."""

from __future__ import annotations

import re

from imgbuild.facts import IMAGE_DIR, Label
from imgbuild.platforms import PLATFORMS, arch_of

#: A build's candidate tags: `imgbuild-candidate-<engine token>`, each run its own.
CANDIDATE_PREFIX = "imgbuild-candidate-"
#: The image a promotion replaced, kept at `<tag>-previous`.
PREVIOUS_SUFFIX = "-previous"
#: Every foreign platform's image is promoted at `<tag>-<arch>` (and keeps its own `-previous`).
ARCH_SUFFIXES = tuple(f"-{arch_of(p)}" for p in PLATFORMS)
#: Tags and repository names a recipe's may not end in or begin with.
RESERVED_TAG_RE = re.compile(
    re.escape(CANDIDATE_PREFIX.rstrip("-"))
    + r".*|.*(?:-candidate|"
    + re.escape(PREVIOUS_SUFFIX)
    + "|"
    + "|".join(re.escape(s) for s in ARCH_SUFFIXES)
    + r"|imgbuild-cache|\.sig|\.att|\.sbom|\.smoke)"
)
RESERVED_TAGS_SAID = "imgbuild-candidate-..., -candidate, -previous, " + ", ".join(ARCH_SUFFIXES) + ", ..."
#: The labels imgbuild writes on every image: its own keys and the OCI base annotations (a recipe's copy would
#: stand where tools read the base and its staleness); the OCI description is the recipe's `description`.
RESERVED_LABEL_PREFIXES = (Label.PREFIX, "org.opencontainers.image.base.")
RESERVED_LABELS = frozenset({"org.opencontainers.image.description"})


def reserved_tag(name: str) -> bool:
    """Whether a tag or a repository's last part is one imgbuild makes for itself."""
    return bool(RESERVED_TAG_RE.fullmatch(name.rsplit("/", 1)[-1]))


def reserved_label(key: str) -> bool:
    return key in RESERVED_LABELS or key.startswith(RESERVED_LABEL_PREFIXES)


def reserved_folder(path: str) -> bool:
    """imgbuild's own folder in the image (the base's records the smoke test reads), or a folder in it."""
    return path == IMAGE_DIR or path.startswith(IMAGE_DIR + "/")


def previous_ref(target: str) -> str:
    return f"{target}{PREVIOUS_SUFFIX}"


def platform_tag(tag: str, platform: str) -> str:
    """Where a foreign platform's image of `tag` is kept: `24.05` on linux/arm64 -> `24.05-arm64`."""
    return f"{tag}-{arch_of(platform)}"
