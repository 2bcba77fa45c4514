"""Facts imgbuild writes and reads in more than one place, each written once here.

The NGC tag grammar and framework table live in `ngc.py`, image references in `imageref.py`, every
bound on input in `limits.py`, the rule of which kernels run on which GPU in `smoke_image.py` (it runs
inside images too); this module holds the label keys imgbuild puts on images and containers, the GPU
models it knows by name, and what each CUDA release needs of the driver.
"""

from __future__ import annotations

from dataclasses import dataclass


class Label:
    """`org.imgbuild.*` label keys. Recipes may not set keys under PREFIX."""

    PREFIX = "org.imgbuild."
    # on images
    VERSION = PREFIX + "version"
    RECIPE = PREFIX + "recipe"
    RECIPE_HASH = PREFIX + "recipe-hash"
    INPUT_HASH = PREFIX + "input-hash"
    BASE = PREFIX + "base"
    BASE_DIGEST = PREFIX + "base-digest"
    BASE_FRAMEWORK = PREFIX + "base-framework"
    BASE_FRAMEWORK_VERSION = PREFIX + "base-framework-version"
    # on containers
    USER = PREFIX + "user"  # who started it (the caller, sudo-aware)
    GPUS = PREFIX + "gpus"  # the GPU indices it was given
    GPU_UUIDS = PREFIX + "gpu-uuids"  # and their UUIDs (indices can change across reboots, UUIDs do not)
    SMOKE_OF = PREFIX + "smoke-of"  # a smoke-test container, and the image it tests
    STARTED_BY = PREFIX + "started-by"  # a script's container: the imgbuild process (PID:start) that runs it
    NOTIFY = PREFIX + "notify"  # `run --notify`: the reaper leaves a notice when it ends
    DEADLINE = PREFIX + "deadline"  # when `imgbuild reap` stops it (seconds since the epoch; `extend` moves it)
    SLURM_JOB = PREFIX + "slurm-job"  # a Slurm job's container (docker runtime): the job id, for the epilog

    #: Every key imgbuild reads on a container. `run` sets each of them, empty where unused: a label an image
    #: carries in its config is inherited by its containers, and must never steer the house rules (hide a
    #: container from `ps` and the reaper, hold GPUs, move a deadline).
    CONTAINER_KEYS = (USER, GPUS, GPU_UUIDS, SMOKE_OF, STARTED_BY, NOTIFY, DEADLINE, SLURM_JOB)


#: Env keys that preload code into every process: a recipe may not set them, and an image whose config does is
#: refused on a host whose NVIDIA Container Toolkit (1.17.7 or older) runs them in its createContainer hook on
#: the host (NVIDIAScape, CVE-2025-23266). A library an image needs belongs in LD_LIBRARY_PATH or a package.
LOADER_ENV = frozenset({"LD_PRELOAD", "LD_AUDIT"})

#: imgbuild's own folder in an image: the base's records (`pip check`, its package list) that the smoke test
#: compares against, and the smoke script. The templates and smoke_image.py (which runs inside images) spell
#: it too. Recipes may not copy files into it.
IMAGE_DIR = "/opt/imgbuild"


# --- GPU models ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    name: str
    capability: tuple[int, int]
    datacenter: bool  # data-center GPUs can run newer CUDA on older drivers (forward compatibility)
    cpu: str = "any"  # the host's CPU architecture where it is fixed: Grace, DGX Spark and Jetson are arm64


#: GPUs by the names people use in fleet lists (`--for v100,l40s`). Compute capabilities from NVIDIA's
#: CUDA GPUs table (developer.nvidia.com/cuda-gpus).
GPU_MODELS: dict[str, GpuModel] = {
    "p100": GpuModel("Tesla P100", (6, 0), True),
    "v100": GpuModel("Tesla V100", (7, 0), True),
    "t4": GpuModel("Tesla T4", (7, 5), True),
    "rtx2080ti": GpuModel("GeForce RTX 2080 Ti", (7, 5), False),
    "a100": GpuModel("A100", (8, 0), True),
    "a30": GpuModel("A30", (8, 0), True),
    "a10": GpuModel("A10", (8, 6), True),
    "a10g": GpuModel("A10G", (8, 6), True),
    "a40": GpuModel("A40", (8, 6), True),
    "a6000": GpuModel("RTX A6000", (8, 6), False),
    "rtx3090": GpuModel("GeForce RTX 3090", (8, 6), False),
    "l4": GpuModel("L4", (8, 9), True),
    "l40": GpuModel("L40", (8, 9), True),
    "l40s": GpuModel("L40S", (8, 9), True),
    "rtx4090": GpuModel("GeForce RTX 4090", (8, 9), False),
    "rtx6000ada": GpuModel("RTX 6000 Ada", (8, 9), False),
    "h100": GpuModel("H100", (9, 0), True),
    "h200": GpuModel("H200", (9, 0), True),
    "h20": GpuModel("H20", (9, 0), True),
    "gh200": GpuModel("GH200", (9, 0), True, cpu="arm64"),
    "b200": GpuModel("B200", (10, 0), True),
    "gb200": GpuModel("GB200", (10, 0), True, cpu="arm64"),
    "b300": GpuModel("B300", (10, 3), True),
    "gb300": GpuModel("GB300", (10, 3), True, cpu="arm64"),
    "rtx5090": GpuModel("GeForce RTX 5090", (12, 0), False),
    # the Workstation Edition: not a data-center part, so no forward compatibility (CUDA compatibility guide)
    "rtxpro6000": GpuModel("RTX PRO 6000 Blackwell", (12, 0), False),
    "gb10": GpuModel("GB10 (DGX Spark)", (12, 1), False, cpu="arm64"),
    # names people type for the variants (--for h100-pcie: dashes and spaces are dropped before the lookup)
    "h100pcie": GpuModel("H100 PCIe", (9, 0), True),
    "h100nvl": GpuModel("H100 NVL", (9, 0), True),
    "h800": GpuModel("H800", (9, 0), True),
    "a800": GpuModel("A800", (8, 0), True),
    "l20": GpuModel("L20", (8, 9), True),
    "a2": GpuModel("A2", (8, 6), True),
    "a16": GpuModel("A16", (8, 6), True),
    "orin": GpuModel("Jetson AGX Orin", (8, 7), True, cpu="arm64"),  # Jetson: forward compatibility covers it
    "thor": GpuModel("Jetson Thor", (11, 0), True, cpu="arm64"),  # sm_110 from CUDA 13 (sm_101 before)
}

#: The driver branches an architecture runs on, by compute capability: (the first branch that supports it,
#: the last one, or None while it is still supported). Sources: the CUDA release notes (sm_89/sm_90 arrived with
#: CUDA 11.8 and R520; Blackwell needs R570, B300 R575; GB10 ships with R580) and NVIDIA's notice that R580 is the
#: last branch for Maxwell, Pascal and Volta. A driver outside the range cannot drive the GPU, whatever the
#: image's CUDA says (forward compatibility included: R470 predates Ada and Hopper).
ARCH_DRIVER_BRANCHES: dict[tuple[int, int], tuple[int, int | None]] = {
    (5, 0): (346, 580),
    (5, 2): (346, 580),
    (6, 0): (367, 580),
    (6, 1): (367, 580),
    (7, 0): (384, 580),
    (7, 5): (410, None),
    (8, 0): (450, None),
    (8, 6): (455, None),
    (8, 7): (510, None),
    (8, 9): (520, None),
    (9, 0): (520, None),
    (10, 0): (570, None),
    (10, 3): (575, None),
    (11, 0): (580, None),
    (12, 0): (570, None),
    (12, 1): (580, None),
}

#: The oldest GPU each CUDA major still builds for: an image with no arch list cannot run below it
#: (CUDA 13 dropped Maxwell, Pascal and Volta; CUDA 12 dropped Kepler).
CUDA_MIN_CAPABILITY: dict[int, tuple[int, int]] = {11: (3, 5), 12: (5, 0), 13: (7, 5)}


# --- CUDA and the driver ---------------------------------------------------------------------------

#: The Linux driver each CUDA toolkit release needs (CUDA release notes, "CUDA Toolkit and Corresponding
#: Driver Versions"). From CUDA 11 on, an application built with X.Y also runs on the X.0 driver
#: ("minor version compatibility"), except for PTX the driver must JIT-compile and APIs new in X.Y.
CUDA_MIN_DRIVER: dict[tuple[int, int], str] = {
    (11, 0): "450.80.02",
    (11, 1): "455.23",
    (11, 2): "460.27.03",
    (11, 4): "470.42.01",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
    (13, 1): "590.44.01",
}

#: Older data-center driver branches that images of a CUDA major run on through the forward compatibility
#: libraries NGC images ship (/usr/local/cuda/compat), data-center GPUs only. CUDA 12: the NGC release notes
#: (24.05: "R470.57 (or later R470), R525.85, R535.86 or R545.23"). CUDA 13: the branches NVIDIA's own
#: nvidia/cuda:13.0.2 images declare in NVIDIA_REQUIRE_CUDA ("cuda>=13.0 brand=tesla,driver>=535,driver<536 ...
#: driver>=550 ... 565 ... 570 ... 575"; tests/data/nvidia_require_cuda.txt keeps the string, and a test reads the
#: branches back out of it); a CUDA 13 container logs "CUDA Forward Compatibility mode ENABLED" on a 570 kernel.
FORWARD_COMPAT: dict[int, tuple[str, ...]] = {
    12: ("470.57", "525.85", "535.86", "545.23"),
    13: ("535", "550", "565", "570", "575"),
}


#: The uv release the pip step runs when a recipe says `pip.installer: uv` (installed in a build stage of
#: its own from the package index, never in the image). Bumping it re-runs every uv pip step.
UV_VERSION = "0.13.9"
