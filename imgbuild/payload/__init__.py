"""What runs inside images, stdlib and the framework only: the smoke test (smoke/, a package by check), the base's
stack by its bytes (stack_check), the engine's GPU read (engine_gpus), a base's pins (base_pins), whether an image
has jupyter (has_jupyter), `imgbuild lock`'s resolver (lock_resolve), and the pip step's guard (pip_guard) with what
it imports beside it (pip_owners, pip_versions, pip_index, pip_pages, pip_words, pip_bounds, pip_alike,
pip_cures). The scripts imgbuild runs in an image for an answer are declared in `probes`, each with its marker. The
templates folder holds the Dockerfiles and the build's shell scripts."""

from pathlib import Path

PAYLOAD_DIR = Path(__file__).parent
#: The pip step's scripts, by their names here -> in the context's imgbuild/pip/ (the guard imports them beside it).
PIP_SCRIPTS = {
    "pip_guard.py": "guard.py",
    "pip_owners.py": "owners.py",
    "pip_versions.py": "pip_versions.py",
    "pip_index.py": "pip_index.py",
    "pip_words.py": "pip_words.py",
    "pip_bounds.py": "pip_bounds.py",
    "pip_alike.py": "pip_alike.py",
    "pip_pages.py": "pip_pages.py",
    "pip_cures.py": "pip_cures.py",
}

#: The smoke test, a package by check: copied into every image's context as a folder and run inside the image.
SMOKE_PACKAGE = PAYLOAD_DIR / "smoke"
#: Its modules, as they are copied (into a context, beside a probe's launcher); a test holds the list to the folder.
SMOKE_MODULES = (
    "__init__.py",
    "__main__.py",
    "amp.py",
    "arch.py",
    "budget.py",
    "collectives.py",
    "commands.py",
    "compiling.py",
    "cpu.py",
    "cuda.py",
    "cudnn.py",
    "dists.py",
    "fp8.py",
    "framework.py",
    "hints.py",
    "importing.py",
    "imports.py",
    "libraries.py",
    "main.py",
    "pipcheck.py",
    "report.py",
    "runners.py",
    "sbom.py",
    "shm.py",
    "throughput.py",
    "versions.py",
)
#: The base's stack checked by its bytes: recorded on the bare base, compared after each kind of recipe step.
STACK_SCRIPT = PAYLOAD_DIR / "stack_check.py"
