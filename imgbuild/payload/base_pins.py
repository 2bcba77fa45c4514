"""Run inside a recipe's base (stdlib only), never imported: the pins install.sh will hold the base's packages at,
from the same source: NGC's PIP_CONSTRAINT file where the base has one, else a freeze; and each installed
distribution's requirements (what the base's framework needs, so that a cure that would break it is not named).
Bounded: 1 MiB of the file, 20,000 lines, 120 s for the freeze, 5,000 distributions of 300 requirements. One line
answers: its marker (in IMGBUILD_PROBE_MARKER) and the JSON (imgbuild.pipeline.resolve reads it)."""

import importlib.metadata as md
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
requires: dict[str, list[str]] = {}  # by the name each distribution gives itself (imgbuild canonicalizes it)
for dist in list(md.distributions())[:5000]:
    requires.setdefault(str(dist.metadata["Name"] or ""), [str(line)[:500] for line in (dist.requires or [])[:300]])
answer = {"origin": origin, "lines": text.splitlines()[:20000], "requires": requires}
print(os.environ["IMGBUILD_PROBE_MARKER"] + json.dumps(answer))
