"""Run inside an image (stdlib only), never imported: the engine's host's GPUs as that container sees them. The
host's PCI bus says whether NVIDIA GPUs are there at all (/sys is not namespaced); nvidia-smi, where the toolkit
mounts it, answers the calls named in IMGBUILD_SMI_CALLS. Bounded: 8 calls, 30 s each, 256 KiB kept per answer.
One line answers: its marker (in IMGBUILD_PROBE_MARKER) and the JSON (imgbuild.gpu.engine_read reads it)."""

import glob
import json
import os
import shutil
import subprocess

nvidia = 0
for dev in glob.glob("/sys/bus/pci/devices/*")[:4096]:
    try:
        with open(dev + "/vendor") as v, open(dev + "/class") as c:
            if v.read(16).strip() == "0x10de" and c.read(16).strip().startswith("0x03"):
                nvidia += 1
    except OSError:
        pass
smi = shutil.which("nvidia-smi")
answers = {}
for args in json.loads(os.environ.get("IMGBUILD_SMI_CALLS", "[]"))[:8]:
    key = " ".join(args)
    if not smi:
        answers[key] = {"code": 127, "out": "", "err": "nvidia-smi not found in the container"}
        continue
    try:
        p = subprocess.run([smi, *args], capture_output=True, text=True, timeout=30)
        answers[key] = {"code": p.returncode, "out": p.stdout[:262144], "err": p.stderr[-2000:]}
    except (OSError, subprocess.TimeoutExpired) as exc:
        answers[key] = {"code": 126, "out": "", "err": str(exc)[:200]}
print(os.environ["IMGBUILD_PROBE_MARKER"] + json.dumps({"pci_nvidia": nvidia, "smi": answers}), flush=True)
