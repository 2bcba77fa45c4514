"""What runs inside images, stdlib and the framework only: the smoke test (smoke_image) and the engine's GPU read
(engine_gpus). The templates folder holds the build's own scripts (install.sh, pip-guard.py, add-user.sh)."""

from pathlib import Path

#: The smoke test's script, copied into every image's context and run inside the image.
SMOKE_SCRIPT = Path(__file__).parent / "smoke_image.py"
#: The engine's GPUs as a short-lived container of the image sees them (imgbuild.gpu.engine_read judges the answer).
ENGINE_GPUS_SCRIPT = Path(__file__).parent / "engine_gpus.py"
