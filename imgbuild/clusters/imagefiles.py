"""Image files a cluster runtime runs from the cluster's disk, by their endings (in any case: a runtime reads the
file, not its name), and the runtimes that run each kind: the one table every door that takes an image reads."""

from __future__ import annotations

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


def is_file_path(image: str) -> bool:
    """`image` names a file or folder on the cluster (a path, or one under the site's variable), not a registry's
    image."""
    return image.startswith(("/", "./", "../", "~/", "$"))


def file_kind(image: str) -> tuple[str, ...] | None:
    """The endings of the kind of image file `image` names (IMAGE_FILES), None where it names none."""
    name = image.rstrip("/").lower()
    return next((endings for endings in IMAGE_FILES if name.endswith(endings)), None)
