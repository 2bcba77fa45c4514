#!/usr/bin/env python3
"""imgbuild smoke test, run inside an image. Depends on nothing but the stdlib and the image's framework.

Proves the framework is the base's own and works: CUDA visible and compiled for this GPU, cuDNN
convolutions match the CPU, tensor-core mixed precision is actually fast, AMP training converges.
Each check is pass / fail / skip / warn with its reason and numbers.

    python3 smoke.py [--framework pytorch|tensorflow] [--require-gpu] [--libraries-only] [--format json|table]

The last line of JSON output starts with IMGBUILD-SMOKE-REPORT so logs before it cannot break parsing.
`--libraries-only` runs what needs no GPU (framework, CUDA/cuDNN/NCCL libraries against the image's
declared versions) and reports the archs the framework was compiled for: `imgbuild smoke --for` judges
GPU models from that. Env: IMGBUILD_EXPECT_FRAMEWORK_VERSION (the base's version; default: the image's
PYTORCH_VERSION / TENSORFLOW_VERSION), IMGBUILD_SMOKE_MIN_SPEEDUP (override the per-architecture floor).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time

MARKER = "IMGBUILD-SMOKE-REPORT "
SHM_DEFAULT_BYTES = 64 * 1024 * 1024
PIP_CHECK_BASELINE = "/opt/imgbuild/pip-check.base"  # `pip check` of the base, written by the Dockerfile
DISTS_BASELINE = "/opt/imgbuild/dists.base"  # the base's distributions (name==version), likewise
DEBS_BASELINE = "/opt/imgbuild/debs.base"  # the base's Debian packages (name<TAB>version), likewise
RUN_FILES = "/opt/imgbuild/run-files.sha256"  # `sha256sum` of each file the recipe's run steps wrote (Dockerfile)
RUN_FILES_MAX = 10000  # the template's `head -n`: more are not listed
IMPORT_SECONDS = 120  # one distribution's imports on a quiet machine (IMGBUILD_SMOKE_IMPORT_SECONDS: the setting)
IMPORT_SCALE = 6  # on a busy machine, at least this many times what the base's framework takes to import now
TIMED_OUT = "timed out"  # an import that ran past its budget: said apart from one that fails
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
#: The half/fp32 GEMM ratio an architecture reaches WITHOUT tensor cores (datasheet peaks): 4x only on A100
#: (78/19.5), 2x on Volta, Turing, Hopper and Blackwell data-center parts (H100 120/60), 1x on GA10x, AD10x and
#: GB20x (A10: fp16 31.2 = fp32 31.2). The check fails under 1.5 times it (no tensor core can be in use), warns
#: between that and the architecture's floor (a busy or throttled GPU), passes above the floor.
NO_TENSOR_CORE_RATIOS = {(8, 0): 4.0, (8, 6): 1.0, (8, 7): 1.0, (8, 9): 1.0, (12, 0): 1.0, (12, 1): 1.0}
NO_TENSOR_CORE_BY_MAJOR = {7: 2.0, 8: 1.0, 9: 2.0, 10: 2.0, 11: 2.0, 12: 1.0}
HARD_MARGIN = 1.5
GEMM_SECONDS = 0.5  # time each dtype at least this long, best of GEMM_REPEATS
GEMM_REPEATS = 3

# Minimum half-precision GEMM speed-up over real fp32, by compute capability (major, minor).
# From datasheet dense peaks (fp16 tensor core / fp32): V100 125/15.7 = 8x, A100 312/19.5 = 16x,
# H100 SXM 989/67 = 15x, T4 65/8.1 = 8x, A10/L4/RTX (8.6/8.9) about 4x; measured cuBLAS reaches
# 60-85% of the half peak and about 90% of fp32, so the floors sit at roughly half the peak ratio,
# lower where clocks throttle (T4, consumer cards). Pascal and older have no tensor cores: no floor.
SPEEDUP_FLOORS = {
    (7, 0): 4.0,
    (7, 2): 3.0,
    (7, 5): 3.0,
    (8, 0): 8.0,
    (8, 6): 2.5,
    (8, 7): 2.5,
    (8, 9): 2.5,
    (9, 0): 8.0,
    (10, 0): 8.0,
    (10, 3): 8.0,
    (11, 0): 2.5,
    (12, 0): 2.5,
    (12, 1): 2.5,
}
#: GPUs whose own peak ratio sits below their architecture's floor, by the name the driver reports (datasheet
#: dense peaks; gpu-review-4 item 9): a healthy H20 reaches about 4.4x (its floor was Hopper's 8x, so it always
#: warned), an L20 about 2-2.5x. The GTX 16 series is Turing without tensor cores: no floor at all.
MODEL_FLOORS = ((re.compile(r"\bH20\b"), 4.0), (re.compile(r"\bL20\b"), 2.0), (re.compile(r"\bGTX 16[0-9]{2}"), 0.0))


# --- GPU architectures: which kernels run on which GPU --------------------------------------------
# The one implementation of the rule (imgbuild.fleet imports it for `smoke --for`, `tags --compatible` and
# `bump`; this script uses it on the GPUs it sees). It follows CUDA's binary compatibility, as PyTorch's
# own `_check_cubins` does: SASS `sm_XY` runs on a GPU of the same major with minor >= Y; `sm_XYa` only on
# exactly X.Y; `sm_XYf` on the family (same major, minor >= Y); PTX `compute_XY` is JIT-compiled by the
# driver for any GPU >= X.Y (slow first start), `compute_XYa` only for X.Y, `compute_XYf` for the family.

ARCH_RE = re.compile(r"(sm|compute)_([0-9]{2,3})([af]?)")
TORCH_ARCH_RE = re.compile(r"([0-9]{1,2})\.([0-9])([af]?)(\+PTX)?")


def parse_archs(text) -> list:
    """Arch entries from `torch.cuda.get_arch_list()` (a list, or `sm_80 compute_90`) or from
    TORCH_CUDA_ARCH_LIST (`7.5 8.0 9.0a 12.0+PTX`, spaces or semicolons): (kind, major, minor, suffix)
    tuples, kind "sm" or "compute". Names it does not know ("Ampere", "sm_xx") are left out."""
    words = text if isinstance(text, (list, tuple)) else str(text).replace(";", " ").split()
    out = []
    for word in words:
        word = str(word).strip()
        match = ARCH_RE.fullmatch(word)
        if match:
            major, minor = divmod(int(match.group(2)), 10)
            out.append((match.group(1), major, minor, match.group(3)))
            continue
        match = TORCH_ARCH_RE.fullmatch(word)
        if match:
            major, minor, suffix = int(match.group(1)), int(match.group(2)), match.group(3)
            out.append(("sm", major, minor, suffix))
            if match.group(4):
                out.append(("compute", major, minor, suffix))
    return out


def arch_name(entry) -> str:
    kind, major, minor, suffix = entry
    return f"{kind}_{major}{minor}{suffix}"


#: Integrated GPUs (Jetson TX1, TX2, Xavier, Orin; sm_101 Thor before CUDA 13 named it sm_110). As PyTorch's
#: own capability check has it: their SASS runs on themselves alone (sm_101 also on 11.0, the same chip), and no
#: discrete GPU's SASS runs on them, whatever the minor.
IGPU_CAPABILITIES = frozenset({(5, 3), (6, 2), (7, 2), (8, 7), (10, 1)})


def _entry_runs(entry, capability) -> bool:
    kind, major, minor, suffix = entry
    cap_major, cap_minor = capability = tuple(capability)
    if suffix == "a":
        return capability == (major, minor)
    if kind == "sm" and (major, minor) == (10, 1):
        return capability in ((10, 1), (11, 0))
    if kind == "sm" and (major, minor) in IGPU_CAPABILITIES:
        return capability == (major, minor)
    if kind == "sm" and capability in IGPU_CAPABILITIES:
        return False
    if kind == "sm" or suffix == "f":
        return cap_major == major and cap_minor >= minor
    return (cap_major, cap_minor) >= (major, minor)  # plain PTX: the driver compiles it for newer GPUs


def kernels_for(archs, capability) -> tuple:
    """How an image built for `archs` runs on a GPU of `capability` (major, minor):
    ("sass", entry) with native kernels, ("ptx", entry) only through the driver's JIT, or ("none", None)."""
    entries = parse_archs(archs)
    sass = [e for e in entries if e[0] == "sm" and _entry_runs(e, capability)]
    if sass:  # the closest: an exact match first, then the highest minor below
        return "sass", max(sass, key=lambda e: (e[1], e[2], e[3] == "a"))
    ptx = [e for e in entries if e[0] == "compute" and _entry_runs(e, capability)]
    if ptx:
        return "ptx", max(ptx, key=lambda e: (e[1], e[2]))
    return "none", None


def explain_kernels(archs, capability) -> tuple:
    """(runs, how, reason) in words, for one GPU of `capability`."""
    how, entry = kernels_for(archs, capability)
    gpu = f"sm_{capability[0]}{capability[1]}"
    known = " ".join(arch_name(e) for e in parse_archs(archs)) or "nothing"
    if how == "sass":
        if (entry[1], entry[2]) == tuple(capability):
            return True, how, f"{gpu}: native kernels ({arch_name(entry)})"
        return True, how, f"{gpu}: native kernels ({arch_name(entry)}, binary-compatible within major {entry[1]})"
    if how == "ptx":
        return (
            True,
            how,
            (
                f"{gpu}: no native kernels; the driver JIT-compiles {arch_name(entry)} PTX "
                "(the first start takes minutes, cache it with CUDA_CACHE_PATH)"
            ),
        )
    return False, how, f"{gpu}: no kernels for this GPU (the image has {known})"


# --- decisions on a GPU: pure functions of what the device reports (tested with recorded profiles) ---


def speed_floor(capability, override: str | None = None, name: str = "") -> float:
    """The half/fp32 GEMM ratio a GPU of `capability` (named `name` by the driver) must reach; 0 where it has no
    tensor cores."""
    if override:
        return float(override)
    for pattern, floor in MODEL_FLOORS:
        if pattern.search(name):
            return floor
    if capability in SPEEDUP_FLOORS:
        return SPEEDUP_FLOORS[capability]
    major = capability[0]
    known = [floor for (mj, _), floor in SPEEDUP_FLOORS.items() if mj == major]
    return min(known) if known else (0.0 if major < 7 else 2.5)


def speed_verdict(capability, fp32: float, half: float, override: str | None = None, name: str = "") -> tuple:
    """("pass" | "warn" | "fail", ratio, floor): fail only where no tensor core can be in use."""
    floor = speed_floor(capability, override, name)
    ratio = half / fp32 if fp32 > 0 else 0.0
    if not floor or ratio >= floor:
        return "pass", ratio, floor
    hard = floor if override else min(floor, HARD_MARGIN * no_tensor_core_ratio(capability))
    return ("fail" if ratio < hard else "warn"), ratio, floor


def failed_because(capability, ratio: float, override: str | None) -> str:
    """Why a failing ratio fails, in words: an explicit floor the GPU's tensor cores do reach is the floor's
    doing (measured on an H200: 13.4x against a floor of 100 is not "no tensor cores")."""
    if override and ratio >= HARD_MARGIN * no_tensor_core_ratio(capability):
        return "below the floor set by smoke.min_speedup (IMGBUILD_SMOKE_MIN_SPEEDUP), though tensor cores are in use"
    return "below what any tensor core gives, tensor cores are not in use"


def no_tensor_core_ratio(capability) -> float:
    """What half precision reaches over fp32 on this architecture without tensor cores."""
    capability = tuple(capability)
    if capability in NO_TENSOR_CORE_RATIOS:
        return NO_TENSOR_CORE_RATIOS[capability]
    return NO_TENSOR_CORE_BY_MAJOR.get(capability[0], 2.0)


def bf16_usable(capability) -> bool:
    """bf16 has tensor-core support from Ampere (8.0) on; `torch.cuda.is_bf16_supported()` also says
    True on Volta and Turing, where bf16 is emulated and slow."""
    return tuple(capability) >= (8, 0)


def grad_scaler(torch):
    """The AMP gradient scaler of this torch: `torch.amp.GradScaler("cuda")` from 2.3, else the
    `torch.cuda.amp` one (NGC 24.01 and older ship torch 2.2)."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def _public(version: str) -> list:
    text = str(version).strip().lstrip("vV")
    return text.split("+", 1)


def same_version(have: str, want: str) -> bool:
    """A framework's version against the one its base declares, public versions only: NGC's env says
    `2.9.0a0+145a3a7` where torch says `2.9.0a0+145a3a7bda.nv25.10`, PyPI's `2.13.0+cu130` where the metadata
    says `2.13.0`, so the local part proves nothing. `v1.10.2` (a leading v is not part of it) and `2.12.*`
    (a prefix) are read as written."""
    have_public, want_public = _public(have)[0], _public(want)[0]
    if want_public.endswith("*"):
        return have_public.startswith(want_public[:-1])
    return have_public == want_public


def normal_version(version: str) -> str:
    """A version as pip writes it (PEP 440's normal form, as far as these strings need): lower case, no
    leading v, the local part's separators as dots and its numbers without leading zeros, so the metadata's
    `2.6.0a0+ecf3bae40a.nv25.01` and pip's `2.6.0a0+ecf3bae40a.nv25.1` are one version."""
    public, _, local = str(version).strip().lower().lstrip("v").partition("+")
    if not local:
        return public
    parts = [str(int(p)) if p.isdigit() and p.isascii() else p for p in re.split(r"[._-]", local)]
    return public + "+" + ".".join(parts)


def version_prefix_agrees(have: str, want: str, parts: int) -> bool:
    """`13.0` against CUDA_VERSION `13.0.96`: the first `parts` numbers agree."""
    return str(have).split(".")[:parts] == str(want).split(".")[:parts]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_baseline(path: str) -> set | None:
    """`name==version` lines of the base's distributions, canonical names and normal versions (pip wrote
    them; the metadata may spell them otherwise); None when not recorded."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [ln.strip() for ln in handle if "==" in ln]
    except OSError:
        return None
    return {(_canonical(ln.split("==", 1)[0]), normal_version(ln.split("==", 1)[1])) for ln in lines}


def top_level_modules(files, top_level_text: str | None) -> list:
    """The importable top-level modules a distribution installs: its top_level.txt when it has one, else
    the first part of each installed path (packages, modules, extension modules)."""
    names = set()
    if top_level_text:
        names = {ln.strip().replace("/", ".").split(".")[0] for ln in top_level_text.splitlines() if ln.strip()}
        if files:  # a name the distribution installs nothing for is no module of it (lmdb 1.4.1 lists `cpython`)
            heads = {str(p).replace("\\", "/").split("/")[0] for p in files}
            stems = {h.split(".")[0] for h in heads}
            names = {n for n in names if n in heads or n in stems}
    else:
        for path in files or []:
            parts = str(path).replace("\\", "/").split("/")
            head = parts[0]
            if head.endswith((".dist-info", ".egg-info", ".data", ".pth")) or head in ("..", "__pycache__", "bin"):
                continue
            if len(parts) > 1:
                names.add(head)
            elif head.endswith(".py"):
                names.add(head[:-3])
            elif ".cpython-" in head or head.endswith(".so"):
                names.add(head.split(".")[0])
    skip = {"test", "tests", "testing", "docs", "doc", "examples", "example", "benchmarks", "scripts", "tools"}
    return sorted(n for n in names if n.isidentifier() and not n.startswith("_") and n not in skip)


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


def _module_file(path: str) -> bool:
    """A top-level module's own file: `pkg/__init__.py`, `mod.py`, an extension module at the top, or one directly
    in a top-level package (`cv2/cv2.abi3.so`: opencv-python and -headless ship the same `__init__.py`)."""
    parts = path.split("/")
    extension = ".cpython-" in parts[-1] or parts[-1].endswith(".so")
    if len(parts) == 2:
        own = parts[1] == "__init__.py" or extension
        return own and not parts[0].endswith((".dist-info", ".egg-info", ".data", ".libs"))
    return len(parts) == 1 and (path.endswith(".py") or extension)


def shared_modules(dists, added) -> list:
    """Module files two distributions both install with different contents (opencv-python and -headless both own
    cv2/__init__.py: the one installed last wins, whatever pip says), where one of them is an added distribution.
    `dists`: (name, version, files) of every distribution; identical files (namespace boilerplate) are fine."""
    owners: dict = {}
    for name, version, files in dists:
        for f in files or []:
            path = str(f).replace("\\", "/")
            if _module_file(path):
                digest = getattr(getattr(f, "hash", None), "value", "") or ""
                owners.setdefault(path, []).append((name, version, digest))
    found = []
    for path, who in sorted(owners.items()):
        names = {n for n, _, _ in who}
        if len(names) < 2 or not names & set(added):
            continue
        if len({d for _, _, d in who}) == 1 and who[0][2]:
            continue  # the same bytes from each: nothing was overwritten
        listed = " and ".join(f"{n} {v}" for n, v, _ in sorted(who))
        found.append(f"{path.split('/')[0].split('.')[0]} is installed by {listed}: the last one installed "
                     f"overwrote the other's files; keep one of them")  # fmt: skip
    return found


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


def conv_within_tolerance(err: float, ref_max: float) -> bool:
    """A GPU convolution in real fp32 matches the CPU to 1e-4 of its outputs' size: an implicit-GEMM conv
    lands near 1e-6, and the Winograd or FFT algorithms TensorFlow's autotuner may pick stay within 1e-4."""
    return err <= 1e-4 * max(1.0, ref_max)


def new_problems(current: list, baseline: list | None) -> list:
    """`pip check` lines the image has and its base did not."""
    if baseline is None:
        return list(current)
    seen = set(baseline)
    return [line for line in current if line not in seen]


class Skip(Exception):
    pass


class Fail(Exception):
    """A check failed; `details` keeps its numbers (a failing tensor-core check's TFLOP/s and floors)."""

    def __init__(self, reason, details=None):
        super().__init__(reason)
        self.details = dict(details or {})


class Warn(Fail):
    """A check passed with a warning; its numbers kept too."""


#: Each check's start and end as it goes, on stderr (the host shows them live: a smoke test is never silent for
#: long), apart from the report on stdout.
PROGRESS = "imgbuild-smoke: "


def say(text: str) -> None:
    sys.stderr.write(PROGRESS + text + "\n")
    sys.stderr.flush()


class Report:
    def __init__(self) -> None:
        self.checks: list[dict] = []
        self.meta: dict = {"python": platform.python_version(), "machine": platform.machine()}

    def run(self, name: str, fn, *args) -> dict | None:
        start = time.perf_counter()
        entry: dict = {"name": name}
        say(f"check {len(self.checks) + 1}: {name} ...")
        try:
            details = fn(*args) or {}
            entry.update(status="pass", reason=details.pop("reason", ""), details=details)
        except Skip as exc:
            entry.update(status="skip", reason=str(exc), details={})
        except Warn as exc:
            entry.update(status="warn", reason=str(exc), details=exc.details)
        except Fail as exc:
            entry.update(status="fail", reason=str(exc), details=exc.details)
        except Exception as exc:  # noqa: BLE001 - a crash in a check is that check failing, not the script
            entry.update(status="fail", reason=f"{type(exc).__name__}: {exc}".splitlines()[0][:300], details={})
        entry["seconds"] = round(time.perf_counter() - start, 3)
        self.checks.append(entry)
        say(f"check {len(self.checks)}: {name} {entry['status'].upper()} ({entry['seconds']:.1f} s)")
        return entry.get("details")

    def fail(self, name: str, reason: str) -> None:
        self.checks.append({"name": name, "status": "fail", "reason": reason, "details": {}, "seconds": 0.0})

    @property
    def ok(self) -> bool:
        return all(c["status"] != "fail" for c in self.checks)


# --- checks for every image -----------------------------------------------------------------------


def expected_version(env_name: str) -> str:
    return os.environ.get("IMGBUILD_EXPECT_FRAMEWORK_VERSION") or os.environ.get(env_name, "")


def check_framework_version(module, version: str, env_name: str, baseline_path: str = "") -> dict:
    """The framework is the base's own. In an image imgbuild built, the distribution that provides the
    framework's module is exactly the one the base recorded before the recipe's layers (`dists.base`); in
    any other image, the module's version has the base's declared public version (NGC's env and torch's
    own string differ in their local part). Either way one distribution only may provide the module."""
    where = os.path.dirname(getattr(module, "__file__", "") or "")
    owners = module_owners(module.__name__)
    if len(owners) > 1:
        raise Fail(
            f"{module.__name__} is installed by {len(owners)} distributions ({', '.join(owners)}): one "
            "overwrote the other's files; the base's framework is no longer what it shipped"
        )
    baseline = read_baseline(baseline_path or DISTS_BASELINE)
    if baseline is not None and owners:
        name, have = owners[0].rsplit(" ", 1)
        recorded = dict(baseline)
        if _canonical(name) not in recorded:
            raise Fail(
                f"{module.__name__} {version} is now provided by {name} {have}, which the base did not have: "
                f"something replaced the base's framework ({where})"
            )
        if recorded[_canonical(name)] != normal_version(have):
            raise Fail(
                f"{name} is {have} but the base carries {name} {recorded[_canonical(name)]}: something "
                f"replaced the base's framework ({where})"
            )
        return {
            "version": version,
            "distribution": f"{name} {have}",
            "location": where,
            "owners": owners,
            "reason": f"{version} ({name} {have}), the base's own",
        }
    want = expected_version(env_name)
    if not want:
        return {"version": version, "location": where, "reason": f"{version} (the base declares no version)"}
    if not same_version(version, want):
        raise Fail(
            f"{module.__name__} is {version} but the base carries {want}: "
            f"something replaced the base's framework ({where})"
        )
    return {"version": version, "location": where, "owners": owners, "reason": f"{version}, the base's own"}


def module_owners(module_name: str) -> list:
    """`name version` of every installed distribution that provides the top-level module."""
    import importlib.metadata as md

    owners = set()
    for dist in md.distributions():
        top = dist.read_text("top_level.txt")
        if module_name in top_level_modules(None if top else dist.files, top):
            owners.add(f"{dist.metadata['Name']} {dist.version}")
    return sorted(owners)


def _pip_check_lines(text: str) -> list:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("No broken requirements")]


def check_pip() -> dict:
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    if "No module named pip" in proc.stderr:
        raise Skip("pip is not installed in the image")
    lines = _pip_check_lines(proc.stdout + proc.stderr) if proc.returncode != 0 else []
    try:
        with open(PIP_CHECK_BASELINE, encoding="utf-8") as handle:
            baseline = _pip_check_lines(handle.read())
    except OSError:
        baseline = None
    added = new_problems(lines, baseline)
    added, accepted = accepted_pip_check(added, os.environ.get("IMGBUILD_SMOKE_ACCEPT_PIP_CHECK", ""))
    if added and baseline is not None:
        first = sorted({_canonical(line.split()[0]) for line in added})
        raise Fail(
            f"pip check found {len(added)} new problem(s): " + "; ".join(added[:3]) + " (if the image works as it "
            f"is, as its smoke.run shows, accept them: smoke.accept_pip_check: [{', '.join(first)}])",
            {"problems": added},
        )
    if added:  # no baseline: an image imgbuild did not build; nothing says which layer broke it
        raise Warn(f"pip check found {len(added)} problem(s) (no baseline of the base): " + "; ".join(added[:3]))
    if accepted:  # said, never dropped: the report keeps what the recipe accepted
        return {"accepted": accepted, "reason": f"{len(accepted)} problem(s) accepted by smoke.accept_pip_check"}
    if lines:
        return {"base_problems": lines, "reason": f"nothing new ({len(lines)} problem(s) the base already had)"}
    return {"reason": "no broken requirements"}


def accepted_pip_check(lines: list, accepted: str) -> tuple:
    """(lines not accepted, lines accepted): a line is accepted when the distribution it is about (its first
    word, as `pip check` writes it) is one the recipe names in smoke.accept_pip_check."""
    names = {_canonical(name) for name in accepted.split()}
    kept: list = []
    taken: list = []
    for line in lines:
        (taken if line.split() and _canonical(line.split()[0]) in names else kept).append(line)
    return kept, taken


#: What a package prints when it imports but its compiled extension did not load (built for another framework
#: build): xformers' "xFormers can't load C++/CUDA extensions", torchvision's "Failed to load image Python
#: extension", a loader's "undefined symbol". The import "works" and the features are gone: a failure here.
EXTENSION_NOT_LOADED = (
    r"can't load C\+\+/CUDA extensions|Failed to load (?:image Python |the |custom )?(?:C\+\+ )?extension"
    r"|extensions? (?:could not|cannot|can't|failed to) (?:be )?load|undefined symbol: "
)
EXTENSION_ERROR = "ExtensionNotLoaded: "


def extension_not_loaded(output: str) -> str:
    """The line of an import's output that says its compiled extension did not load, as an error; or ""."""
    for line in output.splitlines():
        if re.search(EXTENSION_NOT_LOADED, line):
            return EXTENSION_ERROR + line.strip()[:300]
    return ""


_IMPORT_SNIPPET = """
import importlib, json, sys
errors = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:  # a module may raise anything at import, SystemExit included
        errors[name] = (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]
print(json.dumps(errors))
"""


def _import_one(modules: list, budget: float = IMPORT_SECONDS) -> dict:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _IMPORT_SNIPPET, *modules], capture_output=True, text=True, timeout=budget
        )
    except subprocess.TimeoutExpired:
        return {modules[0]: f"{TIMED_OUT} after {budget:.0f} s"}
    try:
        errors = json.loads(proc.stdout.strip().splitlines()[-1])
        said = extension_not_loaded(proc.stderr + "\n" + "\n".join(proc.stdout.splitlines()[:-1]))
        return errors if errors or not said else {modules[0]: said}
    except (ValueError, IndexError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return {modules[0]: f"the interpreter died importing it: {tail[0][:200]}"}


def _distributions() -> list:
    """(canonical name, distribution) of every distribution on the path, each once: a second copy further down
    sys.path is shadowed, it is never imported. One pass over the metadata, for every question asked of it."""
    import importlib.metadata as md

    seen, out = set(), []
    for dist in md.distributions():
        name = _canonical(dist.metadata["Name"] or "")
        if name and name not in seen:
            seen.add(name)
            out.append((name, dist))
    return out


def _added(baseline: set, every=None) -> list:
    """(canonical name, distribution) of every distribution the recipe's layers installed or changed."""
    found = every if every is not None else _distributions()
    return sorted(((n, d) for n, d in found if (n, normal_version(d.version)) not in baseline), key=lambda i: i[0])


def _modules(dist) -> list:
    return top_level_modules(dist.files, dist.read_text("top_level.txt"))


EXTRA_MARKER = re.compile(r"""\bextra\s*==""")


def requirement_names(requires) -> set:
    """The canonical names a distribution's Requires-Dist lines name, other markers' included (erring towards
    re-checking), but not its extras': pandas lists tabulate for its `output-formatting` extra, and adding
    tabulate does not change how pandas imports (it would re-check pandas and all that needs it)."""
    return {
        _canonical(re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0])
        for r in requires or []
        if r.strip() and not EXTRA_MARKER.search(r.partition(";")[2])
    }


#: Where imgbuild puts, beside this script, what imported in the last promoted image: one line per distribution,
#: `name==version sha256-of-its-RECORD`. Always written (empty when nothing is spared), so an image's own file at
#: this path is overwritten; the image's environment is never read for it.
KNOWN_GOOD_FILE = "/tmp/imgbuild-smoke-known.txt"
KNOWN_GOOD_LINES = 5000  # a longer record is not believed at all


def read_known_good(path: str = "") -> str:
    """The known-good file's text; empty when absent, unreadable, or over its bound."""
    try:
        with open(path or KNOWN_GOOD_FILE, "rb") as handle:
            data = handle.read(KNOWN_GOOD_LINES * 400 + 1)
    except OSError:
        return ""
    if len(data) > KNOWN_GOOD_LINES * 400:
        return ""
    return data.decode("utf-8", "replace")


def record_fingerprint(dist) -> str:
    """sha256 of a distribution's RECORD (every installed file with its own hash), its lines sorted: a wheel
    swapped at the same name and version installs other files, and so has another fingerprint. Empty without a
    RECORD: such a distribution is never spared."""
    import hashlib

    try:
        text = dist.read_text("RECORD")
    except (OSError, ValueError):
        return ""
    if not text:
        return ""
    return hashlib.sha256("\n".join(sorted(text.splitlines())).encode()).hexdigest()


def unchanged_since_last(work: list, known_text: str, needs: dict, present: dict | None = None) -> set:
    """The added distributions that need no import check again: the same version with the same installed files
    (its RECORD's fingerprint) imported in the last promoted image of this recipe (`known_text`: its lines
    `name==version fingerprint`, on the same base and system layers), and nothing they require (`needs`: name ->
    the names it requires), directly or not, changed since. `present` ({name: (version, fingerprint)}) is every
    added distribution, modules or not (tzdata's data, a skipped one): what is gone is judged against it, not
    against `work`. Empty without a record."""
    known = set()
    for line in known_text.splitlines()[:KNOWN_GOOD_LINES]:
        word, _, fingerprint = line.strip().partition(" ")
        name, sep, version = word.partition("==")
        if sep and re.fullmatch(r"[0-9a-f]{64}", fingerprint):
            known.add((_canonical(name), normal_version(version), fingerprint))
    if not known:
        return set()
    versions = {n: normal_version(v) for n, v, _ in work}
    every = {n: (normal_version(v), f) for n, (v, f) in (present or {}).items()}
    changed = {n for n, (v, f) in every.items() if not f or (n, v, f) not in known}
    changed |= set(versions) - set(every)  # a fingerprint unknown: never spared
    changed |= {n for n, _, _ in known} - set(every)  # gone: what needed it is re-checked
    needed_by: dict = {}  # whatever needs something affected is affected (a changed numpy re-checks what imports it)
    for name, wanted in needs.items():
        for want in wanted:
            needed_by.setdefault(want, []).append(name)
    affected, todo = set(changed), list(changed)
    while todo:  # each name once: linear in the dependency graph, however long its chains
        for name in needed_by.get(todo.pop(), ()):
            if name not in affected:
                affected.add(name)
                todo.append(name)
    return set(versions) - affected


def license_of(metadata) -> str:
    """A distribution's license as its metadata states it: the SPDX expression, else a one-line License field,
    else the last part of its license classifiers; "" when it says nothing."""
    expression = (metadata.get("License-Expression") or "").strip()
    if expression:
        return expression[:200]
    text = (metadata.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= 100 and text.upper() != "UNKNOWN":
        return text
    classified = [c.split("::")[-1].strip() for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
    return ", ".join(sorted(set(classified)))[:200]


DEB_LINE = re.compile(r"([a-z0-9][a-z0-9+.-]{0,127})(?::[a-z0-9]+)?\t([A-Za-z0-9.+:~-]{1,128})")


def debs(text: str) -> dict:
    """`dpkg-query -W -f '${Package}\t${Version}\n'` as {package: version}; a line of any other shape is skipped."""
    found = {}
    for line in text.splitlines()[:100000]:
        match = DEB_LINE.fullmatch(line)
        if match and match.group(2):
            found[match.group(1)] = match.group(2)
    return found


def added_debs(base_text: str, now_text: str) -> list:
    """[package, version] of every Debian package the recipe's layers installed or changed (its apt packages and
    what apt pulled in with them): the SBOM's apt part."""
    base = debs(base_text)
    return [[name, version] for name, version in sorted(debs(now_text).items()) if base.get(name) != version]


RUN_FILE_HASH = re.compile(r"[0-9a-f]{64}")  # sha256sum's hex
RUN_FILE_PATH = re.compile(r"/[^\x00-\x1f\x7f\\]{1,4095}")  # absolute; no control character, no backslash
RUN_FILE_LINE = re.compile(r"(" + RUN_FILE_HASH.pattern + r")  (" + RUN_FILE_PATH.pattern + ")")


def run_file_row(path: str, sha256: str) -> bool:
    """One rule for a file the run steps wrote, in the image and in the SBOM that reads its report: sha256sum's
    hex, an absolute path of printable characters without a backslash, no `..` step."""
    return bool(RUN_FILE_HASH.fullmatch(sha256) and RUN_FILE_PATH.fullmatch(path)) and "/../" not in path + "/"


def run_files(text: str) -> list:
    """[path, sha256] of each file the run steps wrote, from `sha256sum`'s lines; a line of any other shape (a name
    sha256sum escaped, with a backslash or a newline in it) is dropped."""
    found = []
    for line in text.splitlines()[:RUN_FILES_MAX]:
        match = RUN_FILE_LINE.fullmatch(line)
        if match and run_file_row(match.group(2), match.group(1)):
            found.append([match.group(2), match.group(1)])
    return found


def written_by_run() -> list | None:
    """`run_files` of this image's record; None where the recipe has no run step (no record)."""
    try:
        with open(RUN_FILES, encoding="utf-8", errors="replace") as handle:
            return run_files(handle.read(1 << 24))
    except OSError:
        return None


def installed_debs() -> list | None:
    """`added_debs` of this image against the base's record; None where there is no record or no dpkg."""
    try:
        with open(DEBS_BASELINE) as handle:
            base = handle.read(1 << 24)
        now = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\n"], capture_output=True,
                             text=True, timeout=60).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return added_debs(base, now) if base.strip() else None


def added_with_licenses(baseline: set) -> list:
    """[name, version, license, RECORD fingerprint] of every distribution the recipe added or changed (the SBOM's
    Python part; the fingerprint is what a later smoke test may spare it by)."""
    return [
        [name, dist.version, license_of(dist.metadata), record_fingerprint(dist)] for name, dist in _added(baseline)
    ]


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


def _classify(work: list, results: list, owners: dict | None = None) -> tuple:
    """Import errors as (failures, needing the driver, needing an optional package, the apt packages that cure
    the failures: one list for all of them). `owners`: top-level module -> (distribution, version), for naming
    the other package of a name one imports from another."""
    failures, driver_only, optional, apt = [], [], [], []
    added = {n for n, _, _ in work}
    framework = {"pytorch": "PyTorch", "tensorflow": "TensorFlow"}.get(detect_framework() or "", "framework build")
    for (name, version, _), errors in zip(work, results):  # noqa: B905 - runs on Python 3.8 images too
        for module, error in sorted(errors.items()):
            library = missing_library(error)
            absent = optional_dependency(module, error)
            if absent and name != "smoke.imports":
                optional.append(f"{name}: import {module} needs {absent}, which it does not require")
            elif library.startswith(DRIVER_LIBRARIES):
                driver_only.append(f"{name}: import {module} needs the NVIDIA driver ({library})")
            elif library:
                hint = import_hint(library, name)
                apt += [p for p in apt_packages(library, name) if p not in apt]
                failures.append(f"{name} {version}: import {module}: {library} is missing ({hint})")
            elif error.startswith(EXTENSION_ERROR):
                # a binary wheel: pip.no_build_isolation changes source builds only, and the installer would take
                # the same wheel again; what works is doing without it, or a source build against the base's own
                failures.append(
                    f"{name} {version}: import {module}: it imports, but its compiled extension did not load "
                    f"({error[len(EXTENSION_ERROR) :]}): its wheel was built for another {framework} than the "
                    f"base's, and no recipe field changes a binary wheel: drop {name} (what uses it optionally runs "
                    f"without it), or build it from source against the base's: a requirements file "
                    f"(pip.requirements) with the lines `--no-binary {name}` and `{name}`, and pip.no_build_isolation: "
                    f"[{name}] (it compiles: a base with a C++ compiler and, for CUDA code, nvcc)"
                )
            elif error.startswith(TIMED_OUT):
                failures.append(
                    f"{name} {version}: import {module}: {error}, twice (not an import error: the machine may be "
                    "busy; run the smoke test again, or raise smoke_import_timeout)"
                )
            else:
                said = drift(name, error, owners or {}, added)
                failures.append(f"{name} {version}: import {module}: {error}" + (f": {said}" if said else ""))
    return failures, driver_only, optional, apt


def import_workers() -> int:
    """How many imports run at once: never more than the CPUs this container may use (a 2-core runner ran 4 at
    once, and good packages timed out), at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def configured_import_seconds(text: str) -> float:
    """The setting's budget (IMGBUILD_SMOKE_IMPORT_SECONDS, set by imgbuild): ASCII digits, 1 to 86400; else the
    default."""
    text = text.strip()
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 86400:
        return float(text)
    return float(IMPORT_SECONDS)


def import_budget(configured: float, framework_seconds: float) -> float:
    """One distribution's budget: the setting, or more where the machine is busy now. A package's import runs on
    top of the base's framework, so a machine on which that alone takes long gets a budget that many times over."""
    return max(configured, IMPORT_SCALE * framework_seconds)


def framework_seconds(limit: float, module: str = "") -> float:
    """How long a fresh interpreter takes to import the base's framework now (the machine's load included)."""
    if not module:
        found = [m for m in ("torch", "tensorflow", "jax") if importlib.util.find_spec(m) is not None]
        module = found[0] if found else "json"
    started = time.monotonic()
    try:
        subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return limit
    return time.monotonic() - started


#: The import server: one interpreter imports the base's heavy modules once (torch, numpy, ...), then forks a
#: child per distribution, which imports that distribution's modules on top of them and reports. Each child is a
#: fresh copy of the server: a module that monkeypatches another, breaks the interpreter or forks touches only its
#: own child (and the child's process group is killed when it ends). A server with Python threads after its
#: preload refuses (fork is not safe there) and the check falls back to one interpreter per distribution; native
#: BLAS pools are asked for one thread (they fork safely, as PyTorch's DataLoader workers do).
_IMPORT_SERVER = r"""
import importlib, json, os, re, select, signal, sys, tempfile, time
_import, _dumps, _write, _exit = importlib.import_module, json.dumps, os.write, os._exit
_read, _seek, _search = os.read, os.lseek, re.compile(json.loads(sys.argv[1])).search
req = json.loads(sys.stdin.read())
began = time.monotonic()
for name in req["preload"]:
    try:
        importlib.import_module(name)
    except BaseException:
        pass
framework = time.monotonic() - began
budget = max(req["budget"], req["scale"] * framework)
import threading
threads = threading.active_count()  # Python threads: a fork copies none of them, and a lock one held stays held
if threads != 1 or not hasattr(os, "fork"):
    print(json.dumps({"refused": "%d Python threads after the preload: fork is not safe here" % threads}))
    sys.exit(0)
work = req["work"]
results = [None] * len(work)
pending = list(range(len(work)))
running = {}

def start(i):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            os.close(r)
            null = os.open(os.devnull, os.O_RDWR)
            said = tempfile.TemporaryFile()  # what the imports print: searched for an extension that did not load
            os.dup2(null, 0)
            for fd in (1, 2):
                os.dup2(said.fileno(), fd)
            errors = {}
            for name in work[i]:
                try:
                    _import(name)
                except BaseException as exc:
                    errors[name] = (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]
            if not errors:
                sys.stdout.flush()
                sys.stderr.flush()
                _seek(said.fileno(), 0, 0)
                for line in _read(said.fileno(), 1 << 20).decode("utf-8", "replace").splitlines():
                    if _search(line):
                        errors[work[i][0]] = "ExtensionNotLoaded: " + line.strip()[:300]
                        break
            data = _dumps(errors).encode()  # the child's own references: an import may have replaced json.dumps
            while data:
                data = data[_write(w, data):]
        finally:
            _exit(0)
    os.close(w)
    os.set_blocking(r, False)
    running[pid] = [i, r, time.monotonic(), []]

def drain(entry):
    while True:
        try:
            chunk = os.read(entry[1], 65536)
        except BlockingIOError:
            return
        if not chunk:
            return
        entry[3].append(chunk)

def end(pid, why):
    i, r, _, chunks = running.pop(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if why is None:
        drain([i, r, 0, chunks])
    os.close(r)
    try:
        results[i] = json.loads(b"".join(chunks)) if why is None else None
    except ValueError:
        results[i] = None
    if results[i] is None:
        results[i] = {work[i][0]: why or "the interpreter died importing it"}

while pending or running:
    while pending and len(running) < req["workers"]:
        start(pending.pop(0))
    select.select([e[1] for e in running.values()], [], [], 0.1)
    for entry in list(running.values()):
        drain(entry)
    for pid in list(running):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            end(pid, None if code == 0 else "the interpreter died importing it (%s)" % (
                "signal %d" % -code if code < 0 else "exit %d" % code))
        elif time.monotonic() - running[pid][2] > budget:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            end(pid, "timed out after %.0f s" % budget)
print(json.dumps({"results": results, "framework_seconds": framework, "budget": budget}))
"""

#: What the import server imports once: the base's framework and what nearly every added package imports.
PRELOAD = {"pytorch": ["numpy", "torch"], "tensorflow": ["numpy", "tensorflow"]}


def import_served(work: list, configured: float, workers: int, framework: str = "") -> list | None:
    """Each item's import errors from the import server (`_IMPORT_SERVER`), or None where it cannot serve (no
    fork, threads after the preload, the server itself failing): the caller then imports one interpreter per
    distribution. Items that timed out are tried once more, alone, in a fresh interpreter with twice the budget."""
    request = {
        "preload": PRELOAD.get(framework or detect_framework() or "", ["numpy"]),
        "work": [list(modules) for _, _, modules in work],
        "budget": configured,
        "scale": IMPORT_SCALE,
        "workers": workers,
    }
    limit = IMPORT_SCALE * configured + 2 * configured * (len(work) + 1)  # the server's own bound, generous
    try:
        one = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.run(
            [sys.executable, "-c", _IMPORT_SERVER, json.dumps(EXTENSION_NOT_LOADED)], input=json.dumps(request),
            capture_output=True, text=True,
            timeout=limit, env={**os.environ, **one},
        )  # fmt: skip
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
        return None
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or len(results) != len(work) or not all(isinstance(r, dict) for r in results):
        return None
    budget = float(answer.get("budget") or configured)
    for i, errors in enumerate(results):
        if any(str(e).startswith(TIMED_OUT) for e in errors.values()):
            results[i] = _import_one(work[i][2], 2 * budget)
    return results


def import_all(work: list, budget: float, workers: int, run=_import_one) -> list:
    """Each item's import errors, at most `workers` at once; an item that ran past `budget` is tried once more,
    alone and with twice the budget (a busy machine, not a broken package), before it counts as timed out."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda item: run(item[2], budget), work))
    for i, errors in enumerate(results):
        if any(str(e).startswith(TIMED_OUT) for e in errors.values()):
            results[i] = run(work[i][2], 2 * budget)
    return results


def other_cuda_builds(work: list, results: list) -> list:
    """[name, version, the CUDA major it was built for, the base's] of each added distribution whose import failed
    on another CUDA major's library."""
    builds = []
    for (name, version, _), errors in zip(work, results):  # noqa: B905 - runs on Python 3.8 images too
        for majors in {other_cuda(missing_library(e)) for e in errors.values()}:
            builds += [[name, version, *majors]] if majors else []
    return builds


def check_imports() -> dict:
    """Every package the recipe added imports: each distribution's top-level modules, in a fresh
    interpreter, plus the recipe's own `smoke.imports`; `smoke.skip_imports` names distributions to leave."""
    baseline = read_baseline(DISTS_BASELINE)
    extra = [m for m in os.environ.get("IMGBUILD_SMOKE_IMPORTS", "").split() if m]
    skipped = {_canonical(n) for n in os.environ.get("IMGBUILD_SMOKE_SKIP_IMPORTS", "").split() if n}
    if baseline is None and not extra:
        raise Skip("no record of the base's packages (an image imgbuild did not build): nothing to compare")
    every = _distributions()
    added = _added(baseline or set(), every)
    work = [(n, d.version, m) for n, d in added if n not in skipped and (m := _modules(d))]
    needs = {n: requirement_names(d.requires) for n, d in added}
    present = {n: (d.version, record_fingerprint(d)) for n, d in added}
    unchanged = unchanged_since_last(work, read_known_good(), needs, present)
    work = [item for item in work if item[0] not in unchanged]
    if extra:
        work.append(("smoke.imports", "", extra))
    configured = configured_import_seconds(os.environ.get("IMGBUILD_SMOKE_IMPORT_SECONDS", ""))
    say(
        f"imports: {len(work) - bool(extra)} of {len(added)} added distribution(s) to import"
        + (" with smoke.imports" if extra else "")
        + f", {len(unchanged)} unchanged since the last promoted image"
    )
    results = import_served(work, configured, import_workers()) if work else []
    if results is None:  # no import server here: one interpreter per distribution, as before
        budget = import_budget(configured, framework_seconds(configured))
        results = import_all(work, budget, import_workers())
    drifted = any(MISSING_NAME.search(str(e)) for errors in results for e in errors.values())
    # who owns each top-level module (the first on the path wins), read only when an import needs it named
    owners = {m: (n, d.version) for n, d in reversed(every) for m in _modules(d)} if drifted else {}
    failures, driver_only, optional, apt = _classify(work, results, owners)
    added_names = [n for n, _, _ in work]
    for name, tool, package in missing_tools(added_names):
        failures.append(f"{name}: runs `{tool}`, which is not installed (add apt: [{package}])")
        apt += [package] if package not in apt else []
    failures += shared_modules([(n, d.version, d.files) for n, d in every], added_names)
    checked = sum(len(m) for _, _, m in work)
    if failures:
        shown = "; ".join(failures[:4]) + (
            f"; and {len(failures) - 4} more (all in smoke.json)" if failures[4:] else ""
        )
        cure = f"; for all of them, add to the recipe: apt: [{', '.join(sorted(apt))}]" if apt else ""
        details = {"failures": failures[:2000], "apt": sorted(apt)}
        builds = other_cuda_builds(work, results)
        if builds:  # the build each needs: asked of the index by imgbuild (pipeline/smoke.py), not here
            details["other_cuda"] = builds[:50]
        slow = sum(f"{TIMED_OUT} after" in f for f in failures)
        said = [f"{len(failures) - slow} of {checked} module(s) do not import"] if len(failures) > slow else []
        said += [f"{slow} timed out (the machine busy?)"] if slow else []
        raise Fail(f"{'; '.join(said)}: {shown}{cure}", details)
    reason = f"{checked} module(s) of {len(work)} added distribution(s) import"
    if unchanged:
        reason += f"; {len(unchanged)} unchanged since the last promoted image, nor what they need: not re-imported"
    if optional:
        reason += f"; {len(optional)} need an optional package that is not installed: " + "; ".join(optional[:2])
    if driver_only:
        reason += f"; {len(driver_only)} need the driver, checked on a GPU host: " + "; ".join(driver_only[:2])
    return {"distributions": [f"{n}=={v}" for n, v, _ in work if v], "modules": checked, "reason": reason}


RUN_SECONDS = 600  # one `smoke.run` command


def check_commands() -> dict:
    """The recipe's own checks (`smoke.run`): each command must exit 0 in the image."""
    commands = json.loads(os.environ.get("IMGBUILD_SMOKE_RUN") or "[]")
    if not commands:
        raise Skip("the recipe declares none (smoke.run)")
    import tempfile

    for command in commands:
        with tempfile.TemporaryFile() as out:  # the output in order, on disk: a chatty build stays bounded here
            try:
                code = subprocess.run(["/bin/sh", "-c", command], stdout=out, stderr=subprocess.STDOUT,
                                      timeout=RUN_SECONDS).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                code = None
            out.seek(max(0, out.seek(0, 2) - RUN_TAIL_BYTES))
            output = [line[:300] for line in out.read().decode("utf-8", "replace").splitlines()[-RUN_TAIL_LINES:]]
        if code != 0:
            details = {"command": command, "exit": code, "output": output}
            how = f"ran past {RUN_SECONDS} s" if code is None else f"exited {code}"
            cure = run_cure(output)
            raise Fail(f"{command[:80]!r} {how}: {' | '.join(run_causes(output))}{cure}", details)
    return {"commands": len(commands), "reason": f"{len(commands)} command(s) of smoke.run succeeded"}


RUN_TAIL_BYTES = 64 * 1024  # what is kept of a failing command's output
RUN_TAIL_LINES = 60
_CAUSE = re.compile(
    r"error|not found|no such file|cannot|can't|unable to|won't be available|fatal|undefined reference|"
    r"permission denied",
    re.IGNORECASE,
)


#: What a just-in-time build (DeepSpeed's ops, torch.utils.cpp_extension.load) says when the image lacks its
#: tools, and the cure: (words, cure), the first found wins.
RUN_CURES = (
    (("Python.h: No such file",), "add apt: [python3-dev]"),
    (
        ("nvcc: not found", "CUDA_HOME environment variable is not set"),
        "nvcc is not in the image: use an NGC framework base",
    ),
    (
        ("c++: not found", "g++: not found", "gcc: not found", "cc: not found", "No such file or directory: 'c++'"),
        "a just-in-time build needs a C/C++ compiler, which the image lacks: add apt: [g++, python3-dev]",
    ),
    (("Ninja is required to load C++ extensions", "ninja: not found"), "add ninja to pip.packages"),
)


def run_cure(output: list) -> str:
    """The cure for a failed command whose output says a build tool is missing, as " (cure)"; else ""."""
    text = "\n".join(output)
    found = next((cure for words, cure in RUN_CURES if any(w in text for w in words)), "")
    return f" ({found})" if found else ""


def run_causes(output: list) -> list:
    """The lines of a failed command's output that say why (the compiler's, not ninja's "build stopped"): the
    last three that name an error, else its last line."""
    causes = [line.strip()[:200] for line in output if _CAUSE.search(line)]
    return causes[-3:] or [line.strip()[:200] for line in output[-1:]] or ["(no output)"]


def check_shm() -> dict:
    st = os.statvfs("/dev/shm")
    size = st.f_frsize * st.f_blocks
    mib = size // (1024 * 1024)
    if size <= SHM_DEFAULT_BYTES:
        raise Warn(
            f"/dev/shm is {mib} MiB (Docker's default): DataLoader workers and NCCL need more; "
            "run with --ipc host or --shm-size (imgbuild run does)"
        )
    return {"shm_mib": mib, "reason": f"/dev/shm is {mib} MiB"}


# --- PyTorch --------------------------------------------------------------------------------------


def cuda_available(torch) -> tuple:
    """(is CUDA usable, why not in CUDA's own words): torch says why only in a warning ("the NVIDIA driver on
    your system is too old", error 804 "forward compatibility was attempted on non supported HW", 802 "system
    not yet initialized" when the fabric manager is down), which a bare is_available() throws away."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = bool(torch.cuda.is_available())
    why = ""
    for warning in caught:
        text = " ".join(str(warning.message).split())
        if "cuda" in text.lower() or "driver" in text.lower():
            why = text[:300]
            break
    return usable, why


def torch_cuda(torch) -> dict:
    usable, why = cuda_available(torch)
    if not usable:
        raise Skip("no GPU visible" + (f": {why}" if why else ""))
    names = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        x = torch.ones(1, device=f"cuda:{i}") + 1
        torch.cuda.synchronize(i)
        if float(x.item()) != 2.0:
            raise Fail(f"a one-element kernel on GPU {i} gave the wrong answer")
        names.append(f"{torch.cuda.get_device_name(i)} (sm_{major}{minor})")
    return {
        "devices": torch.cuda.device_count(),
        "names": names,
        "cuda": torch.version.cuda,
        "reason": f"{', '.join(names)}, CUDA {torch.version.cuda}",
    }


def torch_arch_list(torch) -> list:
    """The archs this torch was compiled for, with or without a GPU (`get_arch_list()` is empty without one)."""
    flags = getattr(torch._C, "_cuda_getArchFlags", None)
    text = flags() if callable(flags) else ""
    return str(text or "").split() or list(torch.cuda.get_arch_list())


def torch_arch(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    archs = torch_arch_list(torch)
    return arch_verdict(archs, [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())])


def arch_verdict(archs, capabilities: list) -> dict:
    """The framework's arch list against each visible GPU: fail where one has no kernels, warn where one JITs."""
    verdicts = [explain_kernels(archs, capability) for capability in capabilities]
    problems = [reason for runs, _, reason in verdicts if not runs]
    if problems:
        raise Fail("; ".join(problems) + " (choose an NGC release that supports this GPU)")
    jit = [reason for _, how, reason in verdicts if how == "ptx"]
    if jit:
        raise Warn("; ".join(jit))
    return {"arch_list": archs, "reason": "; ".join(sorted({reason for _, _, reason in verdicts}))}


def torch_cudnn(torch) -> dict:
    """On every visible GPU: an fp32 convolution forward and backward against the CPU (TF32 off), and an fp16
    (bf16 where the GPU has it) channels-last convolution under autocast, which runs cuDNN's tensor-core kernels,
    against the fp32 result."""
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    if not torch.backends.cudnn.is_available():
        raise Fail("cuDNN is not available to PyTorch")
    ver = torch.backends.cudnn.version()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1)
    x = torch.randn(8, 64, 32, 32, requires_grad=True)
    ref = conv(x)
    ref.sum().backward()
    ref_grad = x.grad.clone()
    worst, half = 0.0, []
    for i in range(torch.cuda.device_count()):
        device = f"cuda:{i}"
        conv_gpu = torch.nn.Conv2d(64, 64, 3, padding=1).to(device)
        conv_gpu.load_state_dict(conv.state_dict())
        xg = x.detach().to(device).requires_grad_(True)
        out = conv_gpu(xg)
        out.sum().backward()
        torch.cuda.synchronize(i)
        fwd_err = (out.cpu() - ref).abs().max().item()
        bwd_err = (xg.grad.cpu() - ref_grad).abs().max().item()
        if fwd_err > 1e-3 or bwd_err > 1e-3:
            raise Fail(
                f"cuDNN convolution on GPU {i} differs from the CPU: forward {fwd_err:.2e}, backward {bwd_err:.2e}"
            )
        worst = max(worst, fwd_err, bwd_err)
        dtype = torch.bfloat16 if bf16_usable(tuple(torch.cuda.get_device_capability(i))) else torch.float16
        with torch.autocast("cuda", dtype=dtype):
            low = conv_gpu.to(memory_format=torch.channels_last)(
                xg.detach().contiguous(memory_format=torch.channels_last)
            )
        torch.cuda.synchronize(i)
        if low.dtype != dtype:
            raise Fail(f"autocast on GPU {i} ran the convolution in {low.dtype}, not {dtype}")
        rel = ((low.float() - out.detach()).abs().max() / out.detach().abs().max().clamp_min(1e-6)).item()
        if not rel < 0.05:
            raise Fail(f"a {dtype} channels-last convolution on GPU {i} is off by {rel:.1%} from fp32")
        half.append(str(dtype).replace("torch.", ""))
    return {
        "cudnn": cudnn_text(ver),
        "max_err": worst,
        "gpus": torch.cuda.device_count(),
        "reason": f"cuDNN {cudnn_text(ver)} on {torch.cuda.device_count()} GPU(s): conv fwd/bwd match the CPU (max err "
        f"{worst:.1e}); {'/'.join(sorted(set(half)))} channels-last conv agrees",
    }


def cudnn_text(version: int) -> str:
    """`90100` -> 9.1.0 (cuDNN 9), `8905` -> 8.9.5 (cuDNN 8)."""
    major, rest = divmod(version, 10000) if version >= 90000 else divmod(version, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def _gemm_tflops(torch, dtype, n: int, device: int) -> float:
    """Best of GEMM_REPEATS windows of at least GEMM_SECONDS each: one time slice lost to another
    process cannot halve the figure."""
    a = torch.randn(n, n, device=f"cuda:{device}", dtype=dtype)
    b = torch.randn(n, n, device=f"cuda:{device}", dtype=dtype)
    for _ in range(3):
        torch.mm(a, b)
    torch.cuda.synchronize(device)
    best, iters = 0.0, 4
    # The events record on the current device's stream: it must be the GEMMs' device (on device 0 they timed
    # nothing of GPU 1's work, and the loop grew to its cap: a false fail or a timeout on every GPU after the first).
    with torch.cuda.device(device):
        for _ in range(GEMM_REPEATS):
            while True:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(iters):
                    torch.mm(a, b)
                end.record()
                torch.cuda.synchronize(device)
                seconds = start.elapsed_time(end) / 1000
                if seconds >= GEMM_SECONDS or iters >= 1 << 14:
                    break
                iters = min(1 << 14, max(iters * 2, int(iters * GEMM_SECONDS / max(seconds, 1e-6) * 1.1)))
            best = max(best, 2 * n**3 * iters / max(seconds, 1e-9) / 1e12)
    return best


def torch_tensor_cores(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    rows, worst, details = [], "pass", {"fp32_precision": torch.get_float32_matmul_precision(), "gpus": []}
    override, why = os.environ.get("IMGBUILD_SMOKE_MIN_SPEEDUP"), ""
    for i in range(torch.cuda.device_count()):
        capability = tuple(torch.cuda.get_device_capability(i))
        free, _total = torch.cuda.mem_get_info(i)
        n = 8192 if free > 4 * 1024**3 else 4096  # every dimension a multiple of 8 for tensor cores
        fp32 = _gemm_tflops(torch, torch.float32, n, i)
        fp16 = _gemm_tflops(torch, torch.float16, n, i)
        bf16 = _gemm_tflops(torch, torch.bfloat16, n, i) if bf16_usable(capability) else None
        status, ratio, floor = speed_verdict(
            capability,
            fp32,
            max(fp16, bf16 or 0.0),
            override,
            str(torch.cuda.get_device_name(i)),
        )
        text = (
            f"GPU {i} fp32 {fp32:.1f}, fp16 {fp16:.1f}"
            + (f", bf16 {bf16:.1f}" if bf16 else "")
            + f" TFLOP/s: {ratio:.1f}x"
        )
        text += f" (floor {floor}x)" if floor else " (no tensor cores: no floor)"
        name = str(torch.cuda.get_device_name(i))
        peak, best = datasheet_tflops(name), max(fp16, bf16 or 0.0)
        if peak and floor and best < PEAK_WARN_FRACTION * peak and status == "pass":
            status = "warn"
            text += f"; {best:.0f} TFLOP/s is under half of {name}'s datasheet {peak:.0f} (clocks or power capped?)"
        details["gpus"].append(
            {
                "index": i,
                "n": n,
                "fp32_tflops": round(fp32, 1),
                "fp16_tflops": round(fp16, 1),
                "bf16_tflops": round(bf16, 1) if bf16 else None,
                "speedup": round(ratio, 1),
                "floor": floor,
                "datasheet_tflops": peak,
                "status": status,
            }
        )
        rows.append(text)
        if status == "fail" and not why:
            why = failed_because(capability, ratio, override)
        worst = "fail" if "fail" in (worst, status) else ("warn" if "warn" in (worst, status) else "pass")
    text = "; ".join(rows) + f"; fp32 matmul precision {details['fp32_precision']}"
    if worst == "fail":
        raise Fail(f"{text}: {why}", details)
    if worst == "warn":
        raise Warn(text + ": under the architecture's floor (a busy or throttled GPU?)", details)
    details["reason"] = text
    return details


def _amp_on(torch, device: int) -> tuple:
    """(first loss, last loss, scaler, bf16) of a toy MLP trained with fp16 autocast and a GradScaler on `device`."""
    torch.manual_seed(0)
    where = f"cuda:{device}"
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).to(where)
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    scaler = grad_scaler(torch)
    x = torch.randn(1024, 256, device=where)
    y = x[:, :8].sum(dim=1, keepdim=True)
    losses = []
    for _ in range(30):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)
            if out.dtype != torch.float16:
                raise Fail(f"autocast on GPU {device} produced {out.dtype}, not float16")
            loss = torch.nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    bf16 = bf16_usable(tuple(torch.cuda.get_device_capability(device)))
    if bf16:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if model(x).dtype != torch.bfloat16:
                raise Fail(f"autocast with bfloat16 on GPU {device} did not compute in bfloat16")
    if not all(map(lambda v: v == v and abs(v) != float("inf"), losses)):
        raise Fail(f"AMP training on GPU {device} produced a non-finite loss")
    if not losses[-1] < losses[0] * 0.9:
        raise Fail(f"AMP training on GPU {device} did not learn: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return losses[0], losses[-1], scaler, bf16


def torch_amp_training(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    runs = [_amp_on(torch, i) for i in range(torch.cuda.device_count())]
    first, last, scaler, bf16 = runs[0]
    return {
        "loss_first": round(first, 4),
        "loss_last": round(last, 4),
        "gpus": len(runs),
        "scaler": type(scaler).__module__ + "." + type(scaler).__name__,
        "bf16": bf16,
        "reason": f"autocast fp16 + GradScaler on {len(runs)} GPU(s): loss {first:.3f} -> {last:.3f}"
        + (", bf16 autocast too" if bf16 else ""),
    }


# --- the GPU checks beyond one device's arithmetic: collectives, compilation, FP8, absolute speed ---------------

GPU_SECONDS = 300  # the budget of the checks below together (IMGBUILD_SMOKE_GPU_SECONDS: the setting)
NCCL_BYTES = 64 * 1024 * 1024  # the all-reduced tensor
NCCL_MARKER = "IMGBUILD-NCCL "
COMPILE_MARKER = "IMGBUILD-COMPILE "
#: Dense (no sparsity) bf16 tensor-core TFLOP/s by model, from NVIDIA's datasheets (fp16 with fp32 accumulation
#: where a model has no bf16 or where GeForce halves it): the first pattern that matches the device's name.
DATASHEET_TFLOPS = (
    (re.compile(r"\bH100\b.*\bPCIe\b"), 756.0),
    (re.compile(r"\bH[12]00\b.*\bNVL\b"), 835.0),
    (re.compile(r"\b(?:GH200|H200|H100|H800)\b"), 989.0),
    (re.compile(r"\bH20\b"), 148.0),
    (re.compile(r"\bGB200\b"), 2500.0),
    (re.compile(r"\bB200\b"), 2250.0),
    (re.compile(r"\bA100\b|\bA800\b"), 312.0),
    (re.compile(r"\bA30\b"), 165.0),
    (re.compile(r"\bA10\b"), 125.0),
    (re.compile(r"\bA40\b"), 149.7),
    (re.compile(r"\bL40S\b"), 362.0),
    (re.compile(r"\bL40\b"), 181.0),
    (re.compile(r"\bL20\b"), 119.5),
    (re.compile(r"\bL4\b"), 121.0),
    (re.compile(r"\bRTX 4090\b"), 165.2),
    (re.compile(r"\bRTX 3090\b"), 71.0),
    (re.compile(r"\bV100\b"), 112.0),
    (re.compile(r"\bT4\b"), 65.0),
)
PEAK_WARN_FRACTION = 0.5  # under this share of its datasheet a GPU warns (clocks, power cap, a neighbour)


def datasheet_tflops(name: str) -> float | None:
    for pattern, peak in DATASHEET_TFLOPS:
        if pattern.search(name):
            return peak
    return None


def configured_gpu_seconds(text: str) -> float:
    """The GPU checks' budget (IMGBUILD_SMOKE_GPU_SECONDS, set by imgbuild): ASCII digits, 1 to 86400; else the
    default."""
    return float(text) if text.isascii() and text.isdigit() and 1 <= int(text) <= 86400 else float(GPU_SECONDS)


class Budget:
    """What is left of the GPU checks' budget: each check takes its share, and one that finds none left is skipped,
    saying so, never left to run past it."""

    def __init__(self, seconds: float, clock=time.monotonic) -> None:
        self.clock = clock
        self.deadline = clock() + seconds
        self.seconds = seconds

    def left(self, check: str) -> float:
        left = self.deadline - self.clock()
        if left < 1:
            raise Skip(
                f"the GPU checks' budget ({self.seconds:.0f} s, setting smoke_gpu_seconds) is spent before {check}"
            )
        return left


def _mig(torch) -> bool:
    return any("MIG" in str(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count()))


_NCCL_RANK = r"""
import json, os, sys, time
import torch
import torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", rank=rank, world_size=world)
x = torch.full((int(os.environ["IMGBUILD_NCCL_ELEMENTS"]),), float(rank + 1), device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
ok = bool((x == world * (world + 1) / 2).all().item())
start = time.perf_counter()
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
seconds = (time.perf_counter() - start) / 5
dist.destroy_process_group()
print("IMGBUILD-NCCL " + json.dumps({"rank": rank, "ok": ok, "seconds": seconds}), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(world: int, timeout: float, elements: int, python: str = "") -> list:
    """One process per GPU, each an NCCL rank of one all-reduce; their reports (or Fail with the first error)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(world)}
    env["IMGBUILD_NCCL_ELEMENTS"] = str(elements)
    procs = [
        subprocess.Popen(
            [python or sys.executable, "-c", _NCCL_RANK],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    deadline, outputs = time.monotonic() + timeout, []
    try:
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise Fail(
                    f"the all-reduce across {world} GPU(s) did not finish in {timeout:.0f} s (a P2P hang? "
                    "try NCCL_P2P_DISABLE=1 to tell)"
                ) from None
            outputs.append((proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    reports = []
    for rank, (code, out) in enumerate(outputs):
        line = next((x for x in out.splitlines() if x.startswith(NCCL_MARKER)), None)
        if code != 0 or line is None:
            said = [x for x in out.splitlines() if x.strip()][-1:] or ["no output"]
            raise Fail(f"NCCL rank {rank} of {world} failed: {said[0][:300]}")
        reports.append(json.loads(line[len(NCCL_MARKER) :]))
    return reports


def torch_nccl(torch, budget: Budget) -> dict:
    """An all-reduce across every visible GPU, one process per GPU (one rank on a single GPU), checked and timed:
    NCCL and the driver agree, P2P does not hang, /dev/shm holds the ranks."""
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        raise Skip(f"torch {torch.__version__} is built without NCCL")
    if _mig(torch):
        raise Skip("a MIG instance: NCCL does not run across MIG instances, and a process sees one")
    world = torch.cuda.device_count()
    reports = run_ranks(world, budget.left("the NCCL all-reduce"), NCCL_BYTES // 4)
    if not all(r.get("ok") for r in reports):
        raise Fail(f"the all-reduce across {world} GPU(s) gave a wrong sum")
    seconds = max(float(r.get("seconds") or 0) for r in reports)
    bus = 2 * (world - 1) / world * NCCL_BYTES / max(seconds, 1e-9) / 1e9
    details = {"ranks": world, "seconds": round(seconds, 6), "bus_gbps": round(bus, 1)}
    details["reason"] = f"all-reduce of {NCCL_BYTES >> 20} MiB across {world} GPU(s) correct" + (
        f", {bus:.1f} GB/s bus bandwidth" if world > 1 else " (one rank)"
    )
    return details


def torch_p2p(torch, budget: Budget) -> dict:
    """Each pair of GPUs that reports peer access copies 256 MiB both ways, checked, with its bandwidth."""
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    count = torch.cuda.device_count()
    if count < 2:
        raise Skip("one GPU: no peer to copy to")
    rows, size = [], 256 * 1024 * 1024
    for i in range(count):
        for j in range(count):
            if i == j or not torch.cuda.can_device_access_peer(i, j):
                continue
            budget.left(f"the P2P copy {i}->{j}")
            src = torch.arange(size // 4, device=f"cuda:{i}", dtype=torch.int32)
            torch.cuda.synchronize(i)
            start = time.perf_counter()
            dst = src.to(f"cuda:{j}")
            torch.cuda.synchronize(j)
            seconds = time.perf_counter() - start
            if not bool((dst.cpu() == src.cpu()).all().item()):
                raise Fail(f"a P2P copy from GPU {i} to GPU {j} arrived wrong")
            rows.append(f"{i}->{j} {size / max(seconds, 1e-9) / 1e9:.0f} GB/s")
    if not rows:
        raise Skip(f"no pair of the {count} GPUs offers peer access (PCIe with ACS or an IOMMU?)")
    return {"pairs": len(rows), "reason": "P2P copies correct: " + ", ".join(rows[:8])}


_COMPILE = r"""
import sys
import torch
i = int(sys.argv[1])
f = torch.compile(lambda x: (x.sin() + 1).relu())
x = torch.randn(4096, device=f"cuda:{i}")
y = f(x)
torch.cuda.synchronize(i)
print("IMGBUILD-COMPILE " + str(float((y - (x.sin() + 1).relu()).abs().max())), flush=True)
"""

COMPILE_CURES = (
    (
        "ptxas",
        "Triton's ptxas does not know this GPU: set TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas (the "
        "toolkit's, newer) in the recipe's env",
    ),
    ("gcc", "Triton needs a C compiler: add gcc to the recipe's apt"),
    ("Python.h", "Triton needs Python's headers: add python3-dev to the recipe's apt"),
)


def compile_cure(output: str) -> str:
    return next((cure for word, cure in COMPILE_CURES if word in output), "")


def torch_compile(torch, budget: Budget) -> dict:
    """torch.compile of a small function through Inductor and Triton, once per kind of GPU, in a process of its
    own so a hung compiler ends with its share of the budget: a ptxas or Triton that does not know the GPU."""
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    if not hasattr(torch, "compile"):
        raise Skip(f"torch {torch.__version__} has no torch.compile")
    done = {}
    for i in range(torch.cuda.device_count()):
        capability = tuple(torch.cuda.get_device_capability(i))
        if capability in done:
            continue
        timeout = budget.left(f"torch.compile on GPU {i}")
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _COMPILE, str(i)], capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise Fail(f"torch.compile on GPU {i} did not finish in {timeout:.0f} s") from None
        output = proc.stdout + proc.stderr
        line = next((x for x in proc.stdout.splitlines() if x.startswith(COMPILE_MARKER)), None)
        if proc.returncode != 0 or line is None:
            said = [x for x in output.splitlines() if "error" in x.lower() or "fatal" in x.lower()][-1:]
            cure = compile_cure(output)
            raise Fail(
                f"torch.compile on GPU {i} (sm_{capability[0]}{capability[1]}) failed: "
                + (said[0].strip()[:300] if said else "no output")
                + (f" ({cure})" if cure else "")
            )
        if not float(line[len(COMPILE_MARKER) :]) < 1e-3:
            raise Fail(f"torch.compile on GPU {i} computed a different answer than eager mode")
        done[capability] = i
    archs = ", ".join(f"sm_{c[0]}{c[1]}" for c in done)
    return {"archs": list(done), "reason": f"torch.compile (Inductor, Triton) runs on {archs}"}


def torch_fp8(torch, budget: Budget) -> dict:
    """An FP8 (e4m3) matrix product through torch._scaled_mm on each GPU that has FP8 tensor cores (sm_89 and
    later), against the same product in bf16."""
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    fp8 = [i for i in range(torch.cuda.device_count()) if tuple(torch.cuda.get_device_capability(i)) >= (8, 9)]
    if not fp8:
        raise Skip("no GPU here has FP8 tensor cores (sm_89 and later)")
    if not (hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")):
        raise Skip(f"torch {torch.__version__} has no FP8 matrix product")
    worst = 0.0
    for i in fp8:
        budget.left(f"FP8 on GPU {i}")
        device = f"cuda:{i}"
        torch.manual_seed(0)
        a8 = torch.randn(64, 64, device=device).to(torch.float8_e4m3fn)
        b8 = torch.randn(64, 64, device=device).to(torch.float8_e4m3fn).t().contiguous().t()  # column-major
        one = torch.tensor(1.0, device=device)
        out = torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        out = out[0] if isinstance(out, tuple) else out  # torch before 2.5 returned (out, amax)
        ref = a8.to(torch.float32) @ b8.to(torch.float32)
        rel = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        if not rel < 0.02:
            raise Fail(f"an FP8 matrix product on GPU {i} is off by {rel:.1%}")
        worst = max(worst, rel)
    return {"gpus": fp8, "reason": f"FP8 e4m3 matrix products on GPU(s) {', '.join(map(str, fp8))} agree ({worst:.1e})"}


def loaded_library(name: str) -> str:
    """The file this process loaded for a shared library (`libcudart.so`), from /proc/self/maps; "" if none."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                if "/" + name in path:
                    return path
    except OSError:
        pass
    return ""


def is_wheel_path(path: str) -> bool:
    """A library from a Python wheel (nvidia-cuda-runtime-cu12 and the like), not the system's CUDA."""
    return "/site-packages/" in path or "/dist-packages/" in path


def torch_libraries(torch) -> dict:
    """CUDA runtime, cuDNN and NCCL as the framework loads them, against what the image declares. No GPU needed."""
    cuda = torch.version.cuda
    declared = os.environ.get("CUDA_VERSION", "")
    if not cuda:
        raise Skip(
            f"torch {torch.__version__} is a CPU-only build"
            + (f" (the image declares CUDA {declared})" if declared else "")
        )
    details = {"cuda": cuda, "arch_list": torch_arch_list(torch)}
    problems = []
    if declared and not version_prefix_agrees(cuda, declared, 2):
        runtime = loaded_library("libcudart.so")
        if is_wheel_path(runtime):  # pip's torch on a CUDA base: its own runtime, not the system copy declared
            details["cuda_note"] = f"torch loads its own CUDA {cuda} runtime ({runtime}), not the image's {declared}"
        else:
            problems.append(f"torch was built with CUDA {cuda} but the image declares CUDA_VERSION={declared}")
    if not torch.backends.cudnn.is_available():
        problems.append("cuDNN does not load")
    else:
        details["cudnn"] = cudnn_text(torch.backends.cudnn.version())
        want = os.environ.get("CUDNN_VERSION", "")
        if want and not version_prefix_agrees(details["cudnn"], want, 3):
            loaded = loaded_library("libcudnn")
            if is_wheel_path(loaded):  # pip's torch with its own nvidia-cudnn wheel: not the system copy declared
                details["cudnn_note"] = (
                    f"torch loads its own cuDNN {details['cudnn']} ({loaded}), not the image's {want}"
                )
            else:
                problems.append(f"cuDNN {details['cudnn']} loads but the image declares CUDNN_VERSION={want}")
    try:
        nccl = torch.cuda.nccl.version()
        details["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as exc:  # noqa: BLE001 - a missing or broken libnccl raises anything
        if torch.distributed.is_available() and torch.distributed.is_nccl_available():
            problems.append(f"NCCL is built in but does not load: {type(exc).__name__}: {str(exc)[:120]}")
    if problems:
        raise Fail("; ".join(problems))
    parts = [f"CUDA {cuda}"] + [f"{k} {details[k]}" for k in ("cudnn", "nccl") if k in details]
    details["reason"] = ", ".join(parts) + " load and match the image's declared versions"
    return details


def torch_cpu_compute(torch) -> dict:
    torch.manual_seed(0)
    a = torch.randn(256, 256, dtype=torch.float64)
    err = (a @ torch.linalg.inv(a) - torch.eye(256, dtype=torch.float64)).abs().max().item()
    conv = torch.nn.functional.conv2d(torch.ones(1, 1, 5, 5), torch.ones(1, 1, 3, 3))
    if err > 1e-6 or conv.flatten()[0].item() != 9.0:
        raise Fail(f"CPU arithmetic is wrong (inverse error {err:.1e})")
    return {"reason": f"matmul, inverse and conv2d correct on the CPU ({torch.get_num_threads()} threads)"}


def import_framework(report: Report, module: str, framework: str):
    """The framework module, or None with a failed `framework` check saying why it did not import."""
    import importlib

    try:
        loaded = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything, not only ImportError
        report.fail("framework", f"import {module} failed: {type(exc).__name__}: {exc}")
        return None
    report.meta["framework"] = framework
    return loaded


def run_pytorch(report: Report, libraries_only: bool = False) -> None:
    torch = import_framework(report, "torch", "pytorch")
    if torch is None:
        return
    report.run("framework", check_framework_version, torch, torch.__version__, "PYTORCH_VERSION")
    libraries = report.run("cuda libraries", torch_libraries, torch) or {}
    report.meta["cuda"] = libraries.get("cuda") or (torch.version.cuda or "")
    report.meta["arch_list"] = libraries.get("arch_list") or (torch_arch_list(torch) if torch.version.cuda else [])
    if libraries_only:
        return
    report.run("pip check", check_pip)
    report.run("imports", check_imports)
    report.run("recipe checks", check_commands)
    report.run("cpu compute", torch_cpu_compute, torch)
    report.run("cuda", torch_cuda, torch)
    report.run("cuda arch", torch_arch, torch)
    report.run("cudnn conv", torch_cudnn, torch)
    report.run("tensor cores", torch_tensor_cores, torch)
    report.run("amp training", torch_amp_training, torch)
    budget = Budget(configured_gpu_seconds(os.environ.get("IMGBUILD_SMOKE_GPU_SECONDS", "")))
    report.run("nccl all-reduce", torch_nccl, torch, budget)
    report.run("p2p", torch_p2p, torch, budget)
    report.run("torch.compile", torch_compile, torch, budget)
    report.run("fp8", torch_fp8, torch, budget)
    report.run("shared memory", check_shm)


# --- TensorFlow -----------------------------------------------------------------------------------


def tf_gpus(tf) -> dict:
    gpus = tf.config.list_physical_devices("GPU")
    info = tf.sysconfig.get_build_info()
    if not gpus:
        raise Skip("no GPU visible" + ("" if info.get("is_cuda_build") else " (and this is not a CUDA build)"))
    return {
        "gpus": len(gpus),
        "cuda": info.get("cuda_version"),
        "cudnn": info.get("cudnn_version"),
        "reason": f"{len(gpus)} GPU(s); built with CUDA {info.get('cuda_version')}, cuDNN {info.get('cudnn_version')}",
    }


def tf_arch_list(info) -> list:
    """TensorFlow's build-info arch list, as words: it is a list (`['sm_70', 'compute_90']`) or a string
    (`sm_70,sm_80`) depending on the release; either way the words, without quotes or brackets."""
    words = str(info.get("cuda_compute_capabilities") or "").replace(",", " ").split()
    return [w.strip("[]'\"") for w in words if w.strip("[]'\"")]


def tf_libraries(tf) -> dict:
    """The CUDA and cuDNN TensorFlow was built with, against what the image declares. No GPU needed."""
    info = tf.sysconfig.get_build_info()
    if not info.get("is_cuda_build"):
        raise Skip(f"TensorFlow {tf.__version__} is not a CUDA build")
    cuda, cudnn = str(info.get("cuda_version") or ""), str(info.get("cudnn_version") or "")
    archs = tf_arch_list(info)
    details = {"cuda": cuda, "cudnn": cudnn, "arch_list": archs}
    problems = []
    declared = os.environ.get("CUDA_VERSION", "")
    if declared and cuda and not version_prefix_agrees(cuda, declared, 2):
        problems.append(f"TensorFlow was built with CUDA {cuda} but the image declares CUDA_VERSION={declared}")
    want = os.environ.get("CUDNN_VERSION", "")
    if want and cudnn and not version_prefix_agrees(cudnn, want, len(cudnn.split("."))):
        problems.append(f"TensorFlow was built with cuDNN {cudnn} but the image declares CUDNN_VERSION={want}")
    if problems:
        raise Fail("; ".join(problems))
    details["reason"] = f"built with CUDA {cuda}, cuDNN {cudnn}, as the image declares"
    return details


def tf_arch(tf) -> dict:
    """The GPUs' kernels in TensorFlow's own arch list (its build info), by the rule torch's check uses."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise Skip("no GPU visible")
    info = tf.sysconfig.get_build_info()
    archs = tf_arch_list(info)
    if not archs:
        raise Skip("TensorFlow's build info names no CUDA arch list")
    details = [tuple(tf.config.experimental.get_device_details(gpu).get("compute_capability") or ()) for gpu in gpus]
    capabilities = [c for c in details if len(c) == 2]
    if not capabilities:
        raise Skip("TensorFlow does not say its GPUs' compute capability")
    return {**arch_verdict(" ".join(archs), capabilities), "arch_list": archs}


def tf_conv(tf) -> dict:
    if not tf.config.list_physical_devices("GPU"):
        raise Skip("no GPU visible")
    # TF turns TF32 on by default from Ampere on: compare in real fp32.
    tf.config.experimental.enable_tensor_float_32_execution(False)
    with tf.device("/GPU:0"):
        x = tf.random.normal([8, 32, 32, 16], seed=0)
        k = tf.Variable(tf.random.normal([3, 3, 16, 16], seed=1))
        with tf.GradientTape() as tape:
            y = tf.nn.conv2d(x, k, strides=1, padding="SAME")
            loss = tf.reduce_sum(y)
        grad = tape.gradient(loss, k)
    if not y.device.endswith("GPU:0"):
        raise Fail(f"conv2d ran on {y.device}, not the GPU")
    with tf.device("/CPU:0"):
        ref = tf.nn.conv2d(x, k, strides=1, padding="SAME")
    err = float(tf.reduce_max(tf.abs(ref - y)))
    scale = max(1.0, float(tf.reduce_max(tf.abs(ref))))
    if grad is None or not conv_within_tolerance(err, scale):
        raise Fail(f"GPU conv2d differs from the CPU by {err:.1e} (outputs up to {scale:.0f})")
    return {
        "max_err": err,
        "relative_err": err / scale,
        "reason": f"conv2d with gradient on {y.device.split('device:')[-1]}, err {err / scale:.1e} relative",
    }


def tf_mixed_precision(tf) -> dict:
    keras = tf.keras
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layer = keras.layers.Dense(16)
        out = layer(tf.ones([8, 16]))
        if layer.compute_dtype != "float16" or layer.variable_dtype != "float32":
            raise Fail(f"mixed_float16 computes in {layer.compute_dtype}, stores {layer.variable_dtype}")
        if out.dtype != tf.float16:
            raise Fail(f"a Dense layer under mixed_float16 returned {out.dtype.name}")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    where = "GPU" if tf.config.list_physical_devices("GPU") else "CPU (no GPU visible)"
    return {"reason": f"mixed_float16 computes in float16, keeps float32 variables, on the {where}"}


def tf_cpu_compute(tf) -> dict:
    with tf.device("/CPU:0"):
        conv = tf.nn.conv2d(tf.ones([1, 5, 5, 1]), tf.ones([3, 3, 1, 1]), strides=1, padding="VALID")
        m = tf.linalg.matmul(tf.eye(64), tf.ones([64, 64]))
    if float(conv[0, 0, 0, 0]) != 9.0 or float(tf.reduce_sum(m)) != 64 * 64:
        raise Fail("CPU arithmetic is wrong")
    return {"reason": "matmul and conv2d correct on the CPU"}


def run_tensorflow(report: Report, libraries_only: bool = False) -> None:
    tf = import_framework(report, "tensorflow", "tensorflow")
    if tf is None:
        return
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    report.run("framework", check_framework_version, tf, tf.__version__, "TENSORFLOW_VERSION")
    libraries = report.run("cuda libraries", tf_libraries, tf) or {}
    report.meta["cuda"] = libraries.get("cuda", "")
    report.meta["arch_list"] = libraries.get("arch_list", [])
    if libraries_only:
        return
    report.run("pip check", check_pip)
    report.run("imports", check_imports)
    report.run("recipe checks", check_commands)
    report.run("cpu compute", tf_cpu_compute, tf)
    report.run("cuda", tf_gpus, tf)
    report.run("cuda arch", tf_arch, tf)
    report.run("cudnn conv", tf_conv, tf)
    report.run("mixed precision", tf_mixed_precision, tf)
    report.run("shared memory", check_shm)


RUNNERS = {"pytorch": run_pytorch, "tensorflow": run_tensorflow}


def detect_framework() -> str | None:
    if os.environ.get("PYTORCH_VERSION") or os.environ.get("NVIDIA_PYTORCH_VERSION"):
        return "pytorch"
    if os.environ.get("TENSORFLOW_VERSION") or os.environ.get("NVIDIA_TENSORFLOW_VERSION"):
        return "tensorflow"
    import importlib.util

    for name, module in (("pytorch", "torch"), ("tensorflow", "tensorflow")):
        if importlib.util.find_spec(module):
            return name
    return None


def table(report: Report) -> str:
    rows = [(c["name"], c["status"].upper(), c["reason"]) for c in report.checks]
    width = max(len(r[0]) for r in rows) if rows else 10
    return "\n".join(f"{n:<{width}}  {s:<4}  {r}" for n, s, r in rows)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="imgbuild in-image smoke test")
    parser.add_argument("--framework", choices=sorted(RUNNERS))
    parser.add_argument("--require-gpu", action="store_true")
    parser.add_argument("--libraries-only", action="store_true", help="only what needs no GPU, and the arch list")
    parser.add_argument("--format", choices=("json", "table"), default="json")
    args = parser.parse_args(argv)
    # Real fp32 baselines: NGC images set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (TF32 in cuBLAS), so this is
    # assigned, not defaulted; set before the framework loads. The matmul precision used is reported.
    os.environ["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] = "0"
    os.environ["NVIDIA_TF32_OVERRIDE"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    report = Report()
    framework = args.framework or detect_framework()
    start = time.perf_counter()
    if framework is None:
        report.fail("framework", "neither PyTorch nor TensorFlow is installed")
    else:
        RUNNERS[framework](report, args.libraries_only)
    if args.require_gpu:
        gpu = next((c for c in report.checks if c["name"] == "cuda"), None)
        if gpu is None or gpu["status"] != "pass":
            why = f" ({gpu['reason']})" if gpu and gpu.get("reason") else ""
            report.fail("require gpu", f"a GPU is required (--require-gpu) but none is usable{why}")
    baseline = read_baseline(DISTS_BASELINE)
    if baseline is not None:  # what the recipe added, for the image's SBOM
        report.meta["added"] = added_with_licenses(baseline)
    apt = installed_debs()
    if apt is not None:  # the Debian packages the recipe added, with versions, for the SBOM
        report.meta["debs"] = apt
    written = written_by_run()
    if written is not None:  # the files the recipe's run steps wrote, with their sha256, for the SBOM
        report.meta["run_files"] = written
    report.meta["seconds"] = round(time.perf_counter() - start, 2)
    payload = {"ok": report.ok, "meta": report.meta, "checks": report.checks}
    if args.format == "table":
        print(table(report))
        print(f"{'PASSED' if report.ok else 'FAILED'} in {report.meta['seconds']} s")
    else:
        sys.stdout.flush()
        print(MARKER + json.dumps(payload, sort_keys=True))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
