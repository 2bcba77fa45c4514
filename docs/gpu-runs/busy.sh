#!/bin/bash
# The GPU readers against a GPU a process holds (docs/gpu-runs/2026-11-27-h200-busy): nvidia-smi's answers to
# imgbuild's queries with a process listed, the engine-read payload as a container would run it, and the installed
# wheel's `imgbuild gpus` with that process. Writes into $1.
set -u
out=${1:-gpu-busy}
mkdir -p "$out"
python3 -c "
import torch, time
x = torch.empty(8 * 1024**3, dtype=torch.uint8, device='cuda')  # 8 GiB held
time.sleep(120)" &
holder=$!
for _ in $(seq 60); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break; sleep 1; done
bash "$(dirname "$0")/smi-raw.sh" "$out/smi-raw.txt"
echo "holder pid $holder" > "$out/holder.txt"
if ls .whl/imgbuild-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
  calls=$(python3 -c "from imgbuild.gpu.engine_read import engine_read_env; print(engine_read_env()['IMGBUILD_SMI_CALLS'])" 2>/dev/null)
  IMGBUILD_SMI_CALLS="$calls" timeout 60 python3 -I -S imgbuild/payload/engine_gpus.py > "$out/engine-read.txt" 2>&1
  echo "exit $?" >> "$out/engine-read.txt"
  (cd /tmp && timeout 60 python3 -m imgbuild gpus --json) > "$out/gpus.json" 2> "$out/gpus.err"
  (cd /tmp && timeout 60 python3 -m imgbuild gpus) > "$out/gpus.txt" 2>&1
fi
kill $holder 2>/dev/null; wait $holder 2>/dev/null
ls -la "$out"
