"""The tensor-core speed check: half-precision dense GEMMs against real fp32 on every GPU, judged against a floor
per architecture (IMGBUILD_SMOKE_MIN_SPEEDUP overrides it), and the absolute TFLOP/s against the model's datasheet."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from .arch import bf16_usable
from .budget import Budget
from .report import Fail, Skip, Warn

#: The half/fp32 GEMM ratio an architecture reaches WITHOUT tensor cores (datasheet peaks): 4x only on A100
#: (78/19.5), 2x on Volta, Turing, Hopper and Blackwell data-center parts (H100 120/60), 1x on GA10x, AD10x and
#: GB20x (A10: fp16 31.2 = fp32 31.2). The check fails under 1.5 times it (no tensor core can be in use), warns
#: between that and the architecture's floor (a busy or throttled GPU), passes above the floor.
NO_TENSOR_CORE_RATIOS = {(8, 0): 4.0, (8, 6): 1.0, (8, 7): 1.0, (8, 9): 1.0, (12, 0): 1.0, (12, 1): 1.0}
NO_TENSOR_CORE_BY_MAJOR = {7: 2.0, 8: 1.0, 9: 2.0, 10: 2.0, 11: 2.0, 12: 1.0}
HARD_MARGIN = 1.5
GEMM_SECONDS = 0.5  # time each dtype at least this long, best of GEMM_REPEATS
GEMM_REPEATS = 3


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
    (10, 3): 8.0,
    (11, 0): 2.5,
    (12, 0): 2.5,
    (12, 1): 2.5,
}


#: GPUs whose own peak ratio sits below their architecture's floor, by the name the driver reports (datasheet
#: dense peaks; gpu-review-4 item 9): a healthy H20 reaches about 4.4x (its floor was Hopper's 8x, so it always
#: warned), an L20 about 2-2.5x. The GTX 16 series is Turing without tensor cores: no floor at all.
MODEL_FLOORS = ((re.compile(r"\bH20\b"), 4.0), (re.compile(r"\bL20\b"), 2.0), (re.compile(r"\bGTX 16[0-9]{2}"), 0.0))


def speed_floor(capability, override: str | None = None, name: str = "") -> float:
    """The half/fp32 GEMM ratio a GPU of `capability` (named `name` by the driver) must reach; 0 where it has no
    tensor cores."""
    if override:
        return float(override)
    for pattern, floor in MODEL_FLOORS:
        if pattern.search(name):
            return floor
    if capability in SPEEDUP_FLOORS:
        return SPEEDUP_FLOORS[capability]
    major = capability[0]
    known = [floor for (mj, _), floor in SPEEDUP_FLOORS.items() if mj == major]
    return min(known) if known else (0.0 if major < 7 else 2.5)


def speed_verdict(capability, fp32: float, half: float, override: str | None = None, name: str = "") -> tuple:
    """("pass" | "warn" | "fail", ratio, floor): fail only where no tensor core can be in use."""
    floor = speed_floor(capability, override, name)
    ratio = half / fp32 if fp32 > 0 else 0.0
    if not floor or ratio >= floor:
        return "pass", ratio, floor
    hard = floor if override else min(floor, HARD_MARGIN * no_tensor_core_ratio(capability))
    return ("fail" if ratio < hard else "warn"), ratio, floor


def failed_because(capability, ratio: float, override: str | None) -> str:
    """Why a failing ratio fails, in words: an explicit floor the GPU's tensor cores do reach is the floor's
    doing (measured on an H200: 13.4x against a floor of 100 is not "no tensor cores")."""
    if override and ratio >= HARD_MARGIN * no_tensor_core_ratio(capability):
        return "below the floor set by smoke.min_speedup (IMGBUILD_SMOKE_MIN_SPEEDUP), though tensor cores are in use"
    return "below what any tensor core gives, tensor cores are not in use"


def no_tensor_core_ratio(capability) -> float:
    """What half precision reaches over fp32 on this architecture without tensor cores."""
    capability = tuple(capability)
    if capability in NO_TENSOR_CORE_RATIOS:
        return NO_TENSOR_CORE_RATIOS[capability]
    return NO_TENSOR_CORE_BY_MAJOR.get(capability[0], 2.0)


def _gemm_tflops(torch, dtype, n: int, device: int) -> float:
    """Best of GEMM_REPEATS windows of at least GEMM_SECONDS each: one time slice lost to another
    process cannot halve the figure."""
    a = torch.randn(n, n, device=f"cuda:{device}", dtype=dtype)
    b = torch.randn(n, n, device=f"cuda:{device}", dtype=dtype)
    for _ in range(3):
        torch.mm(a, b)
    torch.cuda.synchronize(device)
    best, iters = 0.0, 4
    # The events record on the current device's stream: it must be the GEMMs' device (on device 0 they timed
    # nothing of GPU 1's work, and the loop grew to its cap: a false fail or a timeout on every GPU after the first).
    with torch.cuda.device(device):
        for _ in range(GEMM_REPEATS):
            while True:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(iters):
                    torch.mm(a, b)
                end.record()
                torch.cuda.synchronize(device)
                seconds = start.elapsed_time(end) / 1000
                if seconds >= GEMM_SECONDS or iters >= 1 << 14:
                    break
                iters = min(1 << 14, max(iters * 2, int(iters * GEMM_SECONDS / max(seconds, 1e-6) * 1.1)))
            best = max(best, 2 * n**3 * iters / max(seconds, 1e-9) / 1e12)
    return best


def torch_tensor_cores(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    measured = []
    for i in range(torch.cuda.device_count()):
        capability = tuple(torch.cuda.get_device_capability(i))
        free, _total = torch.cuda.mem_get_info(i)
        n = 8192 if free > 4 * 1024**3 else 4096  # every dimension a multiple of 8 for tensor cores
        fp32 = _gemm_tflops(torch, torch.float32, n, i)
        fp16 = _gemm_tflops(torch, torch.float16, n, i)
        bf16 = _gemm_tflops(torch, torch.bfloat16, n, i) if bf16_usable(capability) else None
        measured.append(Speeds(i, str(torch.cuda.get_device_name(i)), capability, n, fp32, fp16, bf16))
    return judge_speeds(measured, {"fp32_precision": torch.get_float32_matmul_precision()})


@dataclass(frozen=True)
class Speeds:
    """One GPU's dense GEMM speeds (TFLOP/s) at size `n`, real fp32 against half precision; bf16 None where not
    measured."""

    index: int
    name: str
    capability: tuple
    n: int
    fp32: float
    fp16: float
    bf16: float | None


def judge_speeds(measured: list, details: dict, note: str = "") -> dict:
    """The tensor-core check's verdict on each GPU's speeds, whichever framework measured them: the half/fp32
    ratio against the architecture's floor (IMGBUILD_SMOKE_MIN_SPEEDUP overrides it) and the best half-precision
    figure against the model's datasheet. Returns the details, or raises Warn or Fail with them. `details` opens
    them (how fp32 was computed, under "fp32_precision"); `note` is said after the rows (GPUs left unmeasured)."""
    rows, worst, details = [], "pass", {**details, "gpus": []}
    override, why = os.environ.get("IMGBUILD_SMOKE_MIN_SPEEDUP"), ""
    for gpu in measured:
        best = max(gpu.fp16, gpu.bf16 or 0.0)
        status, ratio, floor = speed_verdict(gpu.capability, gpu.fp32, best, override, gpu.name)
        text = (
            f"GPU {gpu.index} fp32 {gpu.fp32:.1f}, fp16 {gpu.fp16:.1f}"
            + (f", bf16 {gpu.bf16:.1f}" if gpu.bf16 else "")
            + f" TFLOP/s: {ratio:.1f}x"
        )
        text += f" (floor {floor}x)" if floor else " (no tensor cores: no floor)"
        peak = datasheet_tflops(gpu.name)
        if peak and floor and best < PEAK_WARN_FRACTION * peak and status == "pass":
            status = "warn"
            text += f"; {best:.0f} TFLOP/s is under half of {gpu.name}'s datasheet {peak:.0f} (clocks or power capped?)"
        details["gpus"].append(
            {
                "index": gpu.index,
                "n": gpu.n,
                "fp32_tflops": round(gpu.fp32, 1),
                "fp16_tflops": round(gpu.fp16, 1),
                "bf16_tflops": round(gpu.bf16, 1) if gpu.bf16 else None,
                "speedup": round(ratio, 1),
                "floor": floor,
                "datasheet_tflops": peak,
                "status": status,
            }
        )
        rows.append(text)
        if status == "fail" and not why:
            why = failed_because(gpu.capability, ratio, override)
        worst = "fail" if "fail" in (worst, status) else ("warn" if "warn" in (worst, status) else "pass")
    text = "; ".join(rows) + f"; fp32 matmul precision {details['fp32_precision']}" + (f"; {note}" if note else "")
    if worst == "fail":
        raise Fail(f"{text}: {why}", details)
    if worst == "warn":
        raise Warn(text + ": under the architecture's floor (a busy or throttled GPU?)", details)
    details["reason"] = text
    return details


#: TensorFlow's mixed-precision policies and the dtype each computes in (Keras: `Policy(name).compute_dtype`); the
#: bf16 one only where the architecture has bf16 tensor cores.
TF_POLICIES = (("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16"))
TF_N = 8192  # every dimension a multiple of 8 for tensor cores


def _tf_matmul_tflops(tf, dtype, n: int, device: int, window: float, clock=time.perf_counter) -> float:
    """TensorFlow's dense matmul on GPU `device` in `dtype`: best of GEMM_REPEATS windows of at least `window`
    seconds each. TensorFlow runs GPU ops asynchronously, in order on the device's stream: reading one element of
    the last product back ends a window when every product before it is done."""
    with tf.device(f"/GPU:{device}"):
        a = tf.cast(tf.random.normal([n, n], seed=0), dtype)
        b = tf.cast(tf.random.normal([n, n], seed=1), dtype)
        for _ in range(3):
            c = tf.linalg.matmul(a, b)
        c[0, 0].numpy()
        best, iters = 0.0, 4
        for _ in range(GEMM_REPEATS):
            while True:
                start = clock()
                for _ in range(iters):
                    c = tf.linalg.matmul(a, b)
                c[0, 0].numpy()
                seconds = clock() - start
                if seconds >= window or iters >= 1 << 14:
                    break
                iters = min(1 << 14, max(iters * 2, int(iters * window / max(seconds, 1e-6) * 1.1)))
            best = max(best, 2 * n**3 * iters / max(seconds, 1e-9) / 1e12)
    return best


def tf_tensor_cores(tf, budget: Budget, clock=time.perf_counter) -> dict:
    """TensorFlow's mixed precision is actually fast: a dense matmul in real fp32 (TF32 off) against the compute
    dtype of `mixed_float16` (and of `mixed_bfloat16` where the architecture has bf16 tensor cores) on every visible
    GPU, judged as the PyTorch check judges its GEMMs. Within the GPU checks' budget: a GPU it cannot reach in
    time is left out and said; none reached, the check is skipped."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise Skip("no GPU visible")
    tf.config.experimental.enable_tensor_float_32_execution(False)  # TF32 is on by default from Ampere on
    measured: list = []
    note = ""
    for i, gpu in enumerate(gpus):
        facts = tf.config.experimental.get_device_details(gpu) or {}
        capability = tuple(facts.get("compute_capability") or ())
        if len(capability) != 2:
            raise Skip(f"TensorFlow does not say GPU {i}'s compute capability")
        try:
            left = budget.left(f"TensorFlow's tensor-core speed on GPU {i}")
        except Skip as exc:
            if not measured:
                raise
            note = f"GPU {i} and after not measured: {exc}"
            break
        # each GPU times up to 3 dtypes, GEMM_REPEATS windows each, and warms up: a short budget shortens them
        window = min(GEMM_SECONDS, max(0.05, left / (4 * len(TF_POLICIES) * GEMM_REPEATS)))
        speeds = {"float32": _tf_matmul_tflops(tf, tf.float32, TF_N, i, window, clock)}
        for _policy, compute in TF_POLICIES:
            if compute == "float16" or bf16_usable(capability):
                speeds[compute] = _tf_matmul_tflops(tf, getattr(tf, compute), TF_N, i, window, clock)
        name = str(facts.get("device_name") or "")
        measured.append(Speeds(i, name, capability, TF_N, speeds["float32"], speeds["float16"], speeds.get("bfloat16")))
    policies = " and ".join(p for p, c in TF_POLICIES if any(c == "float16" or g.bf16 for g in measured))
    return judge_speeds(measured, {"fp32_precision": "highest (TF32 off)", "policies": policies}, note)


#: Dense (no sparsity) bf16 tensor-core TFLOP/s by model, from NVIDIA's datasheets (fp16 with fp32 accumulation
#: where a model has no bf16 or where GeForce halves it): the first pattern that matches the device's name.
DATASHEET_TFLOPS = (
    (re.compile(r"\bH100\b.*\bPCIe\b"), 756.0),
    (re.compile(r"\bH[12]00\b.*\bNVL\b"), 835.0),
    (re.compile(r"\b(?:GH200|H200|H100|H800)\b"), 989.0),
    (re.compile(r"\bH20\b"), 148.0),
    (re.compile(r"\bGB200\b"), 2500.0),
    (re.compile(r"\bB200\b"), 2250.0),
    (re.compile(r"\bA100\b|\bA800\b"), 312.0),
    (re.compile(r"\bA30\b"), 165.0),
    (re.compile(r"\bA10\b"), 125.0),
    (re.compile(r"\bA40\b"), 149.7),
    (re.compile(r"\bL40S\b"), 362.0),
    (re.compile(r"\bL40\b"), 181.0),
    (re.compile(r"\bL20\b"), 119.5),
    (re.compile(r"\bL4\b"), 121.0),
    (re.compile(r"\bRTX 4090\b"), 165.2),
    (re.compile(r"\bRTX 3090\b"), 71.0),
    (re.compile(r"\bV100\b"), 112.0),
    (re.compile(r"\bT4\b"), 65.0),
)
PEAK_WARN_FRACTION = 0.5  # under this share of its datasheet a GPU warns (clocks, power cap, a neighbour)


def datasheet_tflops(name: str) -> float | None:
    for pattern, peak in DATASHEET_TFLOPS:
        if pattern.search(name):
            return peak
    return None
