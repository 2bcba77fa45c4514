"""The FP8 check: a scaled matmul in e4m3 against a bf16 reference where the architecture has FP8."""

from __future__ import annotations

from .budget import Budget
from .report import Fail, Skip


def torch_fp8(torch, budget: Budget) -> dict:
    """An FP8 (e4m3) matrix product through torch._scaled_mm on each GPU that has FP8 tensor cores (sm_89 and
    later), against the same product in bf16."""
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    fp8 = [i for i in range(torch.cuda.device_count()) if tuple(torch.cuda.get_device_capability(i)) >= (8, 9)]
    if not fp8:
        raise Skip("no GPU here has FP8 tensor cores (sm_89 and later)")
    if not (hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")):
        raise Skip(f"torch {torch.__version__} has no FP8 matrix product")
    worst = 0.0
    for i in fp8:
        budget.left(f"FP8 on GPU {i}")
        device = f"cuda:{i}"
        torch.manual_seed(0)
        a8 = torch.randn(64, 64, device=device).to(torch.float8_e4m3fn)
        b8 = torch.randn(64, 64, device=device).to(torch.float8_e4m3fn).t().contiguous().t()  # column-major
        one = torch.tensor(1.0, device=device)
        out = torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        out = out[0] if isinstance(out, tuple) else out  # torch before 2.5 returned (out, amax)
        ref = a8.to(torch.float32) @ b8.to(torch.float32)
        rel = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        if not rel < 0.02:
            raise Fail(f"an FP8 matrix product on GPU {i} is off by {rel:.1%}")
        worst = max(worst, rel)
    return {"gpus": fp8, "reason": f"FP8 e4m3 matrix products on GPU(s) {', '.join(map(str, fp8))} agree ({worst:.1e})"}
