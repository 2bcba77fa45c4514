"""Why an import failed, in words a recipe author can act on: a missing native library and the apt package that has
it, a program a distribution runs, an optional dependency, an extension built for another framework, drift."""

from __future__ import annotations

import os
import re

#: Shared libraries a wheel expects the system to have, and the Debian/Ubuntu package that has them: the
#: hint for the recipe's `apt:` line when an import fails on one.
NATIVE_LIBRARIES = {
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libxcb.so.1": "libxcb1",
    "libSM.so.6": "libsm6",
    "libICE.so.6": "libice6",
    "libXext.so.6": "libxext6",
    "libXrender.so.1": "libxrender1",
    "libX11.so.6": "libx11-6",
    "libgomp.so.1": "libgomp1",
    "libsndfile.so.1": "libsndfile1",
    "libportaudio.so.2": "libportaudio2",
    "libaio.so.1": "libaio1",
    "libjpeg.so.62": "libjpeg62-turbo",
    "libpng16.so.16": "libpng16-16",
    "libavcodec.so": "ffmpeg",
    "libavformat.so": "ffmpeg",
    "libopenblas.so.0": "libopenblas0",
    "libgfortran.so.5": "libgfortran5",
    "libsqlite3.so.0": "libsqlite3-0",
    "libzstd.so.1": "libzstd1",
}


#: What well-known wheels need from the system, all of it: one failed import names one library, the fix
#: needs the whole line.
NATIVE_NEEDS = {
    "opencv-python": ("libgl1", "libglib2.0-0", "libxcb1"),
    "opencv-contrib-python": ("libgl1", "libglib2.0-0", "libxcb1"),
    "ultralytics": ("libgl1", "libglib2.0-0", "libxcb1"),
    "mmcv": ("libgl1", "libglib2.0-0"),
    "pyaudio": ("libportaudio2",),
    "sounddevice": ("libportaudio2",),
    "librosa": ("libsndfile1", "ffmpeg"),
    "torchcodec": ("ffmpeg",),
    "decord": ("ffmpeg",),
    "deepspeed": ("libaio1",),
}


#: Driver libraries the NVIDIA container toolkit mounts at run time: missing in a build, never an error.
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so", "libnvidia-", "libnvcuvid.so", "libnvrtc-builtins")


#: Programs a distribution runs at run time (not libraries it links), and the apt package that provides each.
RUNTIME_TOOLS = {
    "openai-whisper": {"ffmpeg": "ffmpeg"},
    "pydub": {"ffmpeg": "ffmpeg"},
    "ffmpeg-python": {"ffmpeg": "ffmpeg"},
    "audioread": {"ffmpeg": "ffmpeg"},
    "pytesseract": {"tesseract": "tesseract-ocr"},
    "pdf2image": {"pdftoppm": "poppler-utils"},
    "graphviz": {"dot": "graphviz"},
    "pygraphviz": {"dot": "graphviz"},
    "sox": {"sox": "sox"},
}


def missing_tools(names, which=None) -> list:
    """(distribution, program, apt package) for each program an added distribution runs that is not on PATH."""
    import shutil

    which = which or shutil.which
    return [
        (name, tool, package)
        for name in sorted(names)
        for tool, package in sorted(RUNTIME_TOOLS.get(name, {}).items())
        if not which(tool)
    ]


def missing_library(error: str) -> str:
    """The shared library an ImportError says is missing, or ""."""
    match = re.search(r"([\w.+-]+\.so(?:\.[\w.]+)?): cannot open shared object file", error)
    return match.group(1) if match else ""


def optional_dependency(module: str, error: str) -> str:
    """The other top-level module whose absence stopped `module`'s import, or "". pip installs every
    requirement, so a module that is not installed at all is an optional one the package does not
    require (matplotlib-inline without matplotlib): not a broken image."""
    match = re.match(r"ModuleNotFoundError: No module named '([\w.]+)'", error)
    if not match:
        return ""
    missing = match.group(1).split(".")[0]
    return missing if missing != module.split(".")[0] else ""


def apt_packages(library: str, distribution: str = "") -> list:
    """The Debian/Ubuntu packages that provide `library` (a well-known wheel's whole set); [] when unknown."""
    if distribution in NATIVE_NEEDS:
        return list(NATIVE_NEEDS[distribution])
    for name, package in NATIVE_LIBRARIES.items():
        if library.startswith(name.split(".so")[0] + ".so"):
            return [package]
    return []


#: CUDA libraries whose soname's major is the CUDA major they belong to (libcudart.so.12: CUDA 12).
CUDA_MAJOR_LIBRARY = re.compile(r"lib(?:cudart|cublas|cublasLt|nvrtc|nvJitLink)\.so\.([0-9]{1,3})")


def other_cuda(library: str, cuda_version: str | None = None) -> tuple[str, str] | None:
    """(the CUDA major `library` belongs to, the base's) when they differ (libcudart.so.12 on a CUDA 13 base)."""
    found = CUDA_MAJOR_LIBRARY.fullmatch(library)
    have = (os.environ.get("CUDA_VERSION", "") if cuda_version is None else cuda_version).split(".")[0]
    return (found.group(1), have) if found and have.isdigit() and found.group(1) != have else None


def import_hint(library: str, distribution: str = "", cuda_version: str | None = None) -> str:
    """The cure for a shared library an import could not load: the apt line that provides it, or, for another
    CUDA major's library (vLLM 0.2.5's libcudart.so.12 on a CUDA 13 base), that the wheel is the wrong build. Which
    build would cure that is the index's to say: imgbuild asks it outside the image (`other_cuda` in the details)."""
    majors = other_cuda(library, cuda_version)
    if majors:
        theirs, have = majors
        return (
            f"it is CUDA {theirs}'s, and the base has CUDA {have}: {distribution or 'the package'} was built for "
            f"CUDA {theirs}; no apt package cures it"
        )
    packages = apt_packages(library, distribution)
    return f"add apt: [{', '.join(packages)}]" if packages else "install the system package that provides it (apt:)"


#: What a package prints when it imports but its compiled extension did not load (built for another framework
#: build): xformers' "xFormers can't load C++/CUDA extensions", torchvision's "Failed to load image Python
#: extension", a loader's "undefined symbol". The import "works" and the features are gone: a failure here.
EXTENSION_NOT_LOADED = (
    r"can't load C\+\+/CUDA extensions|Failed to load (?:image Python |the |custom )?(?:C\+\+ )?extension"
    r"|extensions? (?:could not|cannot|can't|failed to) (?:be )?load|undefined symbol: "
)
EXTENSION_ERROR = "ExtensionNotLoaded: "


def extension_not_loaded(output: str) -> str:
    """The line of an import's output that says its compiled extension did not load, as an error, with the lines it
    introduces where it ends in a colon (xformers' "xFormers was built for:" and the builds it names); or ""."""
    lines = output.splitlines()
    for n, line in enumerate(lines):
        if re.search(EXTENSION_NOT_LOADED, line):
            said = [line.strip()]
            while said[-1].endswith(":") and n + len(said) < len(lines) and len(said) < 4:
                said.append(lines[n + len(said)].strip())
            return EXTENSION_ERROR + " ".join(w for w in said if w)[:300]
    return ""


#: "ImportError: cannot import name 'cached_download' from 'huggingface_hub' (...)": a name one package imports
#: from another that the installed version of the other no longer has (or does not have yet).
MISSING_NAME = re.compile(r"ImportError: cannot import name '([\w.]+)' from '([\w.]+)'")


def drift(name: str, error: str, owners: dict, added: set) -> str:
    """What to say of a name `name` imports from another distribution that lacks it: both packages and the pin
    that restores the pair; "" when the error is no such thing or the module's owner is unknown."""
    found = MISSING_NAME.search(error)
    owner = owners.get(found.group(2).split(".")[0]) if found else None
    if not found or owner is None or owner[0] == name:
        return ""
    other, version = owner
    if other in added:
        return (
            f"it needs {found.group(1)} from {other} {version}, which {other} {version} does not have (the two "
            f"drifted apart): pin {other} to the release {name} was made for ({other}<{version}), or {name} to "
            f"one made for {other} {version}"
        )
    return (
        f"it needs {found.group(1)} from the base's {other} {version}, which does not have it: pin {name} to a "
        f"release made for the base's {other}"
    )
