"""What runs inside images, stdlib and the framework only: the smoke test (smoke_image). The templates folder holds
the build's own scripts (install.sh, pip-guard.py, add-user.sh)."""

from pathlib import Path

#: The smoke test's script, copied into every image's context and run inside the image.
SMOKE_SCRIPT = Path(__file__).parent / "smoke_image.py"
