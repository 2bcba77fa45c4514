"""Run inside an image (stdlib only), never imported: whether `jupyter` is on the image's PATH, before `imgbuild
run --jupyter` starts a notebook in it. One line answers: IMGBUILD-JUPYTER and the JSON
(imgbuild.servers.jupyter reads it)."""

import json
import shutil

print("IMGBUILD-JUPYTER " + json.dumps({"jupyter": shutil.which("jupyter") or ""}))
