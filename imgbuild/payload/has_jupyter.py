"""Run inside an image (stdlib only), never imported: whether `jupyter` is on the image's PATH, before `imgbuild
run --jupyter` starts a notebook in it. One line answers: its marker (in IMGBUILD_PROBE_MARKER) and the
JSON (imgbuild.servers.jupyter reads it through probes.HAS_JUPYTER)."""

import json
import os
import shutil

print(os.environ["IMGBUILD_PROBE_MARKER"] + json.dumps({"jupyter": shutil.which("jupyter") or ""}))
