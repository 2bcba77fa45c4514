"""Facts imgbuild writes and reads in more than one place, each written once here.

The NGC tag grammar and framework table live in `ngc.py`, image references in `imageref.py`, every
bound on input in `limits.py`, the rule of which kernels run on which GPU in `payload/smoke/arch.py` (it runs
inside images too); this module holds the label keys imgbuild puts on images and containers. NVIDIA's support
table (GPU models, driver branches, what each CUDA release needs of the driver) is data of its own:
gpu/support.json, read by gpu/support.py.
"""

from __future__ import annotations


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
    LEASE_OF = PREFIX + "lease-of"  # an engine-wide lock's container (engine.lease): what it holds
    LEASE_HOST = PREFIX + "lease-host"  # and the host name of its holder (a CI runner's container id)
    LEASE_UNTIL = PREFIX + "lease-until"  # and when it ends (seconds since the epoch)

    #: Every key imgbuild reads on a container. `run` sets each of them, empty where unused: a label an image
    #: carries in its config is inherited by its containers, and must never steer the house rules (hide a
    #: container from `ps` and the reaper, hold GPUs, move a deadline).
    CONTAINER_KEYS = (USER, GPUS, GPU_UUIDS, SMOKE_OF, STARTED_BY, NOTIFY, DEADLINE, SLURM_JOB)


#: Env keys that preload code into every process: a recipe may not set them, and an image whose config does is
#: refused on a host whose NVIDIA Container Toolkit (1.17.7 or older) runs them in its createContainer hook on
#: the host (NVIDIAScape, CVE-2025-23266). A library an image needs belongs in LD_LIBRARY_PATH or a package.
LOADER_ENV = frozenset({"LD_PRELOAD", "LD_AUDIT"})

#: imgbuild's own folder in an image: the base's records (`pip check`, its package list) that the smoke test
#: compares against, and the smoke package. The templates and the smoke package (which runs inside images) spell
#: it too. Recipes may not copy files into it.
IMAGE_DIR = "/opt/imgbuild"


#: The uv release the pip step runs when a recipe says `pip.installer: uv` (installed in a build stage of
#: its own from the package index, never in the image). Bumping it re-runs every uv pip step.
UV_VERSION = "0.13.9"
