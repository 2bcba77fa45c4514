#!/usr/bin/env python3
"""imgbuild smoke test, run inside an image. Depends on nothing but the stdlib and the image's framework.

Proves the framework is the base's own and works: CUDA visible and compiled for this GPU, cuDNN
convolutions match the CPU, tensor-core mixed precision is actually fast, AMP training converges.
Each check is pass / fail / skip / warn with its reason and numbers.

    python3 smoke.py [--framework pytorch|tensorflow] [--require-gpu] [--format json|table]

The last line of JSON output starts with IMGBUILD-SMOKE-REPORT so logs before it cannot break parsing.
Env: IMGBUILD_EXPECT_FRAMEWORK_VERSION (the base's version; default: the image's PYTORCH_VERSION /
TENSORFLOW_VERSION), IMGBUILD_SMOKE_MIN_SPEEDUP (override the per-architecture floor).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

# Real fp32 baselines: NGC images force TF32 in cuBLAS unless this is 0. Set before the framework loads.
os.environ.setdefault("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "0")
os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MARKER = "IMGBUILD-SMOKE-REPORT "
SHM_DEFAULT_BYTES = 64 * 1024 * 1024

# Minimum half-precision GEMM speed-up over real fp32, by compute capability (major, minor).
# From datasheet dense peaks (fp16 tensor core / fp32): V100 125/15.7 = 8x, A100 312/19.5 = 16x,
# H100 SXM 989/67 = 15x, T4 65/8.1 = 8x, A10/L4/RTX (8.6/8.9) about 4x; measured cuBLAS reaches
# 60-85% of the half peak and about 90% of fp32, so the floors sit at roughly half the peak ratio,
# lower where clocks throttle (T4, consumer cards). Pascal and older have no tensor cores: no floor.
SPEEDUP_FLOORS = {
    (7, 0): 4.0,
    (7, 2): 3.0,
    (7, 5): 3.0,
    (8, 0): 8.0,
    (8, 6): 2.5,
    (8, 7): 2.5,
    (8, 9): 2.5,
    (9, 0): 8.0,
    (10, 0): 8.0,
    (12, 0): 2.5,
}


class Skip(Exception):
    pass


class Fail(Exception):
    pass


class Warn(Exception):
    pass


class Report:
    def __init__(self) -> None:
        self.checks: list[dict] = []
        self.meta: dict = {"python": platform.python_version(), "machine": platform.machine()}

    def run(self, name: str, fn, *args) -> dict | None:
        start = time.perf_counter()
        entry: dict = {"name": name}
        try:
            details = fn(*args) or {}
            entry.update(status="pass", reason=details.pop("reason", ""), details=details)
        except Skip as exc:
            entry.update(status="skip", reason=str(exc), details={})
        except Warn as exc:
            entry.update(status="warn", reason=str(exc), details={})
        except Fail as exc:
            entry.update(status="fail", reason=str(exc), details={})
        except Exception as exc:  # noqa: BLE001 - a crash in a check is that check failing, not the script
            entry.update(status="fail", reason=f"{type(exc).__name__}: {exc}".splitlines()[0][:300], details={})
        entry["seconds"] = round(time.perf_counter() - start, 3)
        self.checks.append(entry)
        return entry.get("details")

    def fail(self, name: str, reason: str) -> None:
        self.checks.append({"name": name, "status": "fail", "reason": reason, "details": {}, "seconds": 0.0})

    @property
    def ok(self) -> bool:
        return all(c["status"] != "fail" for c in self.checks)


# --- checks for every image -----------------------------------------------------------------------


def expected_version(env_name: str) -> str:
    return os.environ.get("IMGBUILD_EXPECT_FRAMEWORK_VERSION") or os.environ.get(env_name, "")


def check_framework_version(module, version: str, env_name: str) -> dict:
    want = expected_version(env_name)
    where = os.path.dirname(getattr(module, "__file__", "") or "")
    if not want:
        return {"version": version, "location": where, "reason": f"{version} (the base declares no version)"}
    if version != want:
        raise Fail(
            f"{module.__name__} is {version} but the base carries {want}: "
            f"something replaced the base's framework ({where})"
        )
    return {"version": version, "location": where, "reason": f"{version}, the base's own"}


def check_pip() -> dict:
    proc = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    if "No module named pip" in proc.stderr:
        raise Skip("pip is not installed in the image")
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    if proc.returncode != 0:
        raise Fail(f"pip check found {len(lines)} problem(s): " + "; ".join(lines[:3]))
    return {"reason": "no broken requirements"}


def check_shm() -> dict:
    st = os.statvfs("/dev/shm")
    size = st.f_frsize * st.f_blocks
    mib = size // (1024 * 1024)
    if size <= SHM_DEFAULT_BYTES:
        raise Warn(
            f"/dev/shm is {mib} MiB (Docker's default): DataLoader workers and NCCL need more; "
            "run with --ipc host or --shm-size (imgbuild run does)"
        )
    return {"shm_mib": mib, "reason": f"/dev/shm is {mib} MiB"}


# --- PyTorch --------------------------------------------------------------------------------------


def torch_cuda(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    i = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(i)
    x = torch.ones(1, device="cuda") + 1
    torch.cuda.synchronize()
    if float(x.item()) != 2.0:
        raise Fail("a one-element kernel gave the wrong answer")
    return {
        "devices": torch.cuda.device_count(),
        "name": torch.cuda.get_device_name(i),
        "capability": f"{major}.{minor}",
        "cuda": torch.version.cuda,
        "reason": f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(i)} (sm_{major}{minor}), "
        f"CUDA {torch.version.cuda}",
    }


def torch_arch(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    archs = torch.cuda.get_arch_list()
    problems = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        cap = major * 10 + minor
        sass = f"sm_{cap}" in archs
        ptx = any(a.startswith("compute_") and int(a.split("_")[1]) <= cap for a in archs)
        if not (sass or ptx):
            problems.append(f"GPU {i} is sm_{cap}, the image is built for {' '.join(archs)}")
    if problems:
        raise Fail("; ".join(problems) + " (choose an NGC release that supports this GPU)")
    return {"arch_list": archs, "reason": "kernels for every visible GPU"}


def torch_cudnn(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    if not torch.backends.cudnn.is_available():
        raise Fail("cuDNN is not available to PyTorch")
    ver = torch.backends.cudnn.version()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1)
    x = torch.randn(8, 64, 32, 32, requires_grad=True)
    ref = conv(x)
    ref.sum().backward()
    ref_grad = x.grad.clone()
    conv_gpu = conv.cuda()
    xg = x.detach().cuda().requires_grad_(True)
    out = conv_gpu(xg)
    out.sum().backward()
    torch.cuda.synchronize()
    fwd_err = (out.cpu() - ref).abs().max().item()
    bwd_err = (xg.grad.cpu() - ref_grad).abs().max().item()
    if fwd_err > 1e-3 or bwd_err > 1e-3:
        raise Fail(f"cuDNN convolution differs from the CPU: forward {fwd_err:.2e}, backward {bwd_err:.2e}")
    major, rest = divmod(ver, 10000) if ver >= 90000 else divmod(ver, 1000)
    minor, patch = divmod(rest, 100)
    return {
        "cudnn": f"{major}.{minor}.{patch}",
        "forward_err": fwd_err,
        "backward_err": bwd_err,
        "reason": f"cuDNN {major}.{minor}.{patch}, conv fwd/bwd match the CPU (max err {max(fwd_err, bwd_err):.1e})",
    }


def _gemm_tflops(torch, dtype, n: int, warmup: int = 10, iters: int = 30) -> float:
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(warmup):
        torch.mm(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        torch.mm(a, b)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    return 2 * n**3 * iters / seconds / 1e12


def torch_tensor_cores(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    major, minor = torch.cuda.get_device_capability()
    free, _total = torch.cuda.mem_get_info()
    n = 8192 if free > 4 * 1024**3 else 4096  # every dimension a multiple of 8 for tensor cores
    fp32 = _gemm_tflops(torch, torch.float32, n)
    fp16 = _gemm_tflops(torch, torch.float16, n)
    bf16 = _gemm_tflops(torch, torch.bfloat16, n) if torch.cuda.is_bf16_supported() else None
    speedup = max(fp16, bf16 or 0.0) / fp32
    floor = float(os.environ.get("IMGBUILD_SMOKE_MIN_SPEEDUP") or SPEEDUP_FLOORS.get((major, minor), 0.0))
    details: dict = {
        "n": n,
        "fp32_tflops": round(fp32, 1),
        "fp16_tflops": round(fp16, 1),
        "bf16_tflops": round(bf16, 1) if bf16 else None,
        "speedup": round(speedup, 1),
        "floor": floor,
    }
    text = f"fp32 {fp32:.1f}, fp16 {fp16:.1f}" + (f", bf16 {bf16:.1f}" if bf16 else "") + f" TFLOP/s: {speedup:.1f}x"
    if floor and speedup < floor:
        raise Fail(f"{text}, below the sm_{major}{minor} floor of {floor}x: tensor cores are not in use")
    details["reason"] = text + (f" (floor {floor}x)" if floor else " (no tensor cores: no floor)")
    return details


def torch_amp_training(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(1024, 256, device="cuda")
    y = x[:, :8].sum(dim=1, keepdim=True)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    losses = []
    for _ in range(30):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)
            if out.dtype != torch.float16:
                raise Fail(f"autocast produced {out.dtype}, not float16")
            loss = torch.nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    with torch.autocast("cuda", dtype=dtype):
        out_dtype = model(x).dtype
    if not all(map(lambda v: v == v and abs(v) != float("inf"), losses)):
        raise Fail("AMP training produced a non-finite loss")
    if not losses[-1] < losses[0] * 0.9:
        raise Fail(f"AMP training did not learn: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return {
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "bf16_dtype": str(out_dtype),
        "reason": f"autocast fp16 + GradScaler: loss {losses[0]:.3f} -> {losses[-1]:.3f}",
    }


def torch_cpu_compute(torch) -> dict:
    torch.manual_seed(0)
    a = torch.randn(256, 256, dtype=torch.float64)
    err = (a @ torch.linalg.inv(a) - torch.eye(256, dtype=torch.float64)).abs().max().item()
    conv = torch.nn.functional.conv2d(torch.ones(1, 1, 5, 5), torch.ones(1, 1, 3, 3))
    if err > 1e-6 or conv.flatten()[0].item() != 9.0:
        raise Fail(f"CPU arithmetic is wrong (inverse error {err:.1e})")
    return {"reason": f"matmul, inverse and conv2d correct on the CPU ({torch.get_num_threads()} threads)"}


def import_framework(report: Report, module: str, framework: str):
    """The framework module, or None with a failed `framework` check saying why it did not import."""
    import importlib

    try:
        loaded = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything, not only ImportError
        report.fail("framework", f"import {module} failed: {type(exc).__name__}: {exc}")
        return None
    report.meta["framework"] = framework
    return loaded


def run_pytorch(report: Report) -> None:
    torch = import_framework(report, "torch", "pytorch")
    if torch is None:
        return
    report.run("framework", check_framework_version, torch, torch.__version__, "PYTORCH_VERSION")
    report.run("pip check", check_pip)
    report.run("cpu compute", torch_cpu_compute, torch)
    report.run("cuda", torch_cuda, torch)
    report.run("cuda arch", torch_arch, torch)
    report.run("cudnn conv", torch_cudnn, torch)
    report.run("tensor cores", torch_tensor_cores, torch)
    report.run("amp training", torch_amp_training, torch)
    report.run("shared memory", check_shm)


# --- TensorFlow -----------------------------------------------------------------------------------


def tf_gpus(tf) -> dict:
    gpus = tf.config.list_physical_devices("GPU")
    info = tf.sysconfig.get_build_info()
    if not gpus:
        raise Skip("no GPU visible" + ("" if info.get("is_cuda_build") else " (and this is not a CUDA build)"))
    return {
        "gpus": len(gpus),
        "cuda": info.get("cuda_version"),
        "cudnn": info.get("cudnn_version"),
        "reason": f"{len(gpus)} GPU(s); built with CUDA {info.get('cuda_version')}, cuDNN {info.get('cudnn_version')}",
    }


def tf_conv(tf) -> dict:
    if not tf.config.list_physical_devices("GPU"):
        raise Skip("no GPU visible")
    with tf.device("/GPU:0"):
        x = tf.random.normal([8, 32, 32, 16], seed=0)
        k = tf.Variable(tf.random.normal([3, 3, 16, 16], seed=1))
        with tf.GradientTape() as tape:
            y = tf.nn.conv2d(x, k, strides=1, padding="SAME")
            loss = tf.reduce_sum(y)
        grad = tape.gradient(loss, k)
    if not y.device.endswith("GPU:0"):
        raise Fail(f"conv2d ran on {y.device}, not the GPU")
    with tf.device("/CPU:0"):
        ref = tf.nn.conv2d(x, k, strides=1, padding="SAME")
    err = float(tf.reduce_max(tf.abs(ref - y)))
    if grad is None or err > 1e-3:
        raise Fail(f"GPU conv2d differs from the CPU by {err:.1e}")
    return {"max_err": err, "reason": f"conv2d with gradient on {y.device.split('device:')[-1]}, err {err:.1e}"}


def tf_mixed_precision(tf) -> dict:
    keras = tf.keras
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        layer = keras.layers.Dense(16)
        out = layer(tf.ones([8, 16]))
        if layer.compute_dtype != "float16" or layer.variable_dtype != "float32":
            raise Fail(f"mixed_float16 computes in {layer.compute_dtype}, stores {layer.variable_dtype}")
        if out.dtype != tf.float16:
            raise Fail(f"a Dense layer under mixed_float16 returned {out.dtype.name}")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    where = "GPU" if tf.config.list_physical_devices("GPU") else "CPU (no GPU visible)"
    return {"reason": f"mixed_float16 computes in float16, keeps float32 variables, on the {where}"}


def tf_cpu_compute(tf) -> dict:
    with tf.device("/CPU:0"):
        conv = tf.nn.conv2d(tf.ones([1, 5, 5, 1]), tf.ones([3, 3, 1, 1]), strides=1, padding="VALID")
        m = tf.linalg.matmul(tf.eye(64), tf.ones([64, 64]))
    if float(conv[0, 0, 0, 0]) != 9.0 or float(tf.reduce_sum(m)) != 64 * 64:
        raise Fail("CPU arithmetic is wrong")
    return {"reason": "matmul and conv2d correct on the CPU"}


def run_tensorflow(report: Report) -> None:
    tf = import_framework(report, "tensorflow", "tensorflow")
    if tf is None:
        return
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    report.run("framework", check_framework_version, tf, tf.__version__, "TENSORFLOW_VERSION")
    report.run("pip check", check_pip)
    report.run("cpu compute", tf_cpu_compute, tf)
    report.run("cuda", tf_gpus, tf)
    report.run("cudnn conv", tf_conv, tf)
    report.run("mixed precision", tf_mixed_precision, tf)
    report.run("shared memory", check_shm)


RUNNERS = {"pytorch": run_pytorch, "tensorflow": run_tensorflow}


def detect_framework() -> str | None:
    if os.environ.get("PYTORCH_VERSION") or os.environ.get("NVIDIA_PYTORCH_VERSION"):
        return "pytorch"
    if os.environ.get("TENSORFLOW_VERSION") or os.environ.get("NVIDIA_TENSORFLOW_VERSION"):
        return "tensorflow"
    import importlib.util

    for name, module in (("pytorch", "torch"), ("tensorflow", "tensorflow")):
        if importlib.util.find_spec(module):
            return name
    return None


def table(report: Report) -> str:
    rows = [(c["name"], c["status"].upper(), c["reason"]) for c in report.checks]
    width = max(len(r[0]) for r in rows) if rows else 10
    return "\n".join(f"{n:<{width}}  {s:<4}  {r}" for n, s, r in rows)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="imgbuild in-image smoke test")
    parser.add_argument("--framework", choices=sorted(RUNNERS))
    parser.add_argument("--require-gpu", action="store_true")
    parser.add_argument("--format", choices=("json", "table"), default="json")
    args = parser.parse_args(argv)
    report = Report()
    framework = args.framework or detect_framework()
    start = time.perf_counter()
    if framework is None:
        report.fail("framework", "neither PyTorch nor TensorFlow is installed")
    else:
        RUNNERS[framework](report)
    if args.require_gpu:
        gpu = next((c for c in report.checks if c["name"] == "cuda"), None)
        if gpu is None or gpu["status"] != "pass":
            report.fail("require gpu", "a GPU is required (--require-gpu) but none is usable")
    report.meta["seconds"] = round(time.perf_counter() - start, 2)
    payload = {"ok": report.ok, "meta": report.meta, "checks": report.checks}
    if args.format == "table":
        print(table(report))
        print(f"{'PASSED' if report.ok else 'FAILED'} in {report.meta['seconds']} s")
    else:
        sys.stdout.flush()
        print(MARKER + json.dumps(payload, sort_keys=True))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
