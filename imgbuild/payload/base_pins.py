"""Run inside a recipe's base (stdlib only), never imported: the pins install.sh will hold the base's packages at,
from the same source: NGC's PIP_CONSTRAINT file where the base has one, else a freeze. Bounded: 1 MiB of the file,
20,000 lines, 120 s for the freeze. One line answers: its marker (in IMGBUILD_PROBE_MARKER) and the
JSON (imgbuild.pipeline.resolve reads it)."""

import json
import os
import subprocess
import sys

path = os.environ.get("PIP_CONSTRAINT", "")
if path and os.path.isfile(path):
    with open(path, errors="replace") as handle:
        text, origin = handle.read(1 << 20), "the base's " + path
else:
    args = [sys.executable, "-m", "pip", "list", "--format=freeze", "--exclude", "pip"]
    text = subprocess.run(args, capture_output=True, text=True, timeout=120).stdout
    origin = "a freeze of the base's packages"
print(os.environ["IMGBUILD_PROBE_MARKER"] + json.dumps({"origin": origin, "lines": text.splitlines()[:20000]}))
