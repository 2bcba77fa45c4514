#!/bin/bash
# docs/smoke-on-gpu.md's plan as one script, for a lent GPU machine (run from the repository root).
# Writes every output file into $1 (default ./gpu-run) and a summary.txt; each step is bounded in time.
# The installed-wheel step needs imgbuild's wheel and its missing dependencies in .whl/ (see the doc).
set -u
out=${1:-gpu-run}
mkdir -p "$out"
smoke=imgbuild/payload/smoke_image.py
step() { echo "== $*" | tee -a "$out/summary.txt"; }
code() { echo "exit $1 ($2)" | tee -a "$out/summary.txt"; }

step "1. setup"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=index,uuid,name,compute_cap,driver_version,memory.total --format=csv > "$out/gpus.csv" 2>&1
python3 -c "import torch as t; print(t.__version__, t.version.cuda, t.cuda.get_arch_list(), \
  t.cuda.get_device_capability(), t.backends.cudnn.version(), t.cuda.is_bf16_supported(), \
  hasattr(t.amp, 'GradScaler'), t.get_float32_matmul_precision())" > "$out/torch.txt" 2>&1
cat "$out/gpus.csv" "$out/torch.txt" | tee -a "$out/summary.txt"
bash "$(dirname "$0")/smi-raw.sh" "$out/smi-raw.txt"

step "2. three runs (--require-gpu)"
for i in 1 2 3; do
  timeout 120 python3 $smoke --framework pytorch --require-gpu > "$out/run$i.json" 2> "$out/run$i.err"
  code $? "run $i"
done

step "3. NGC's TF32 environment set outside"
TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 NVIDIA_TF32_OVERRIDE=1 timeout 120 \
  python3 $smoke --framework pytorch --format table > "$out/tf32-env.txt" 2>&1
code $? "tf32 env"

step "4. negative controls (each must exit 1)"
IMGBUILD_SMOKE_MIN_SPEEDUP=100 timeout 120 python3 $smoke --format table > "$out/neg-floor.txt" 2>&1
code $? "min speedup 100"
IMGBUILD_EXPECT_FRAMEWORK_VERSION=0.0 timeout 120 python3 $smoke --format table > "$out/neg-version.txt" 2>&1
code $? "expected version 0.0"
CUDA_VISIBLE_DEVICES= timeout 120 python3 $smoke --require-gpu --format table > "$out/neg-nogpu.txt" 2>&1
code $? "no GPU visible"

step "5. contended GPU (may warn, must not fail)"
# the load keeps one result alive (a list of every product ran the GPU out of memory on 2026-11-27)
timeout 200 python3 -c "
import torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.half)
while True:
    b = a @ a" &
load=$!
sleep 8
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader > "$out/contended.txt" 2>&1
timeout 120 python3 $smoke --format table >> "$out/contended.txt" 2>&1
code $? "contended"
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> "$out/contended.txt" 2>&1
kill $load 2>/dev/null; wait $load 2>/dev/null

step "6. kernels for this GPU, as the host sees them"
python3 -c "from imgbuild.payload.smoke_image import explain_kernels; import torch; \
  print(explain_kernels(torch.cuda.get_arch_list(), torch.cuda.get_device_capability()))" > "$out/kernels.txt" 2>&1
cat "$out/kernels.txt" | tee -a "$out/summary.txt"

step "7. the installed wheel reads this machine's GPUs (NVML, then nvidia-smi) and judges its torch"
if ls .whl/imgbuild-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  (
    cd /tmp && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
    python3 -m imgbuild gpus --json
    python3 -m imgbuild gpus
    python3 - <<'PY'
import torch
from imgbuild.gpu import fleet, read

smi = read.SmiReader().read() if hasattr(read.SmiReader, "read") else None
print("nvidia-smi reader:", [(g.name, g.compute_cap, g.driver) for g in smi] if smi else "n/a")
gpus, source = read.read_devices()
gpu = gpus[0]
facts = fleet.GpuFacts("this machine's torch", torch.version.cuda, " ".join(torch.cuda.get_arch_list()), "torch")
for target in ("h200", "h100", gpu.compute_cap):
    for v in fleet.judge(facts, fleet.parse_targets(target), gpu.driver):
        print(f"judge {target} driver {gpu.driver} ({source}): runs={v.runs} kernels={v.kernels}: {v.reason}")
x = torch.randn(64, 64, device="cuda")
print("and torch runs on it:", bool((x @ x).isfinite().all()))
PY
  ) > "$out/wheel.txt" 2>&1
  code $? "installed wheel"
else
  echo "no .whl/imgbuild-*.whl: skipped" | tee -a "$out/summary.txt"
fi

step "summary of the runs"
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for i in (1, 2, 3):
    text = (out / f"run{i}.json").read_text()
    payload = json.loads(text[text.index("{"):]) if "{" in text else {"ok": None, "checks": []}
    print(f"run {i}: ok={payload['ok']} seconds={payload.get('meta', {}).get('seconds')}")
    for c in payload["checks"]:
        print(f"  {c['name']:<22} {c['status']:<5} {c['reason'][:150]}")
PY
