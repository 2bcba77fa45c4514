"""What runs inside images, stdlib and the framework only: the smoke test (smoke_image), the base's stack by its
bytes (stack_check), the engine's GPU read
(engine_gpus), a base's pins (base_pins), whether an image has jupyter (has_jupyter), `imgbuild lock`'s resolver
(lock_resolve), and the pip step's guard (pip_guard) with what it imports
beside it (pip_owners, pip_versions, pip_index, pip_words). The templates folder holds the Dockerfiles and the
build's shell scripts."""

from pathlib import Path

PAYLOAD_DIR = Path(__file__).parent
#: The pip step's scripts, by their names here -> in the context's imgbuild/pip/ (the guard imports them beside it).
PIP_SCRIPTS = {
    "pip_guard.py": "guard.py",
    "pip_owners.py": "owners.py",
    "pip_versions.py": "pip_versions.py",
    "pip_index.py": "pip_index.py",
    "pip_words.py": "pip_words.py",
}

#: The smoke test's script, copied into every image's context and run inside the image.
SMOKE_SCRIPT = Path(__file__).parent / "smoke_image.py"
#: `imgbuild lock`'s resolver, run in the recipe's base (pipeline.pins appends its call).
LOCK_SCRIPT = Path(__file__).parent / "lock_resolve.py"
#: The engine's GPUs as a short-lived container of the image sees them (imgbuild.gpu.engine_read judges the answer).
ENGINE_GPUS_SCRIPT = Path(__file__).parent / "engine_gpus.py"
#: The pins install.sh will hold a base's packages at (imgbuild.pipeline.resolve reads the answer).
BASE_PINS_SCRIPT = Path(__file__).parent / "base_pins.py"
#: The base's stack checked by its bytes: recorded on the bare base, compared after each kind of recipe step.
STACK_SCRIPT = Path(__file__).parent / "stack_check.py"
#: Whether an image has `jupyter` on its PATH (imgbuild.servers.jupyter).
HAS_JUPYTER_SCRIPT = Path(__file__).parent / "has_jupyter.py"
