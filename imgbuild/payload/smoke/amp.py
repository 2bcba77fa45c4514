"""The mixed-precision training check: autocast with a gradient scaler learns a toy model on every GPU; TensorFlow's
mixed_float16 policy computes in float16 and keeps float32 variables."""

from __future__ import annotations

from .arch import bf16_usable
from .report import Fail, Skip


def grad_scaler(torch):
    """The AMP gradient scaler of this torch: `torch.amp.GradScaler("cuda")` from 2.3, else the
    `torch.cuda.amp` one (NGC 24.01 and older ship torch 2.2)."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def _amp_on(torch, device: int) -> tuple:
    """(first loss, last loss, scaler, bf16) of a toy MLP trained with fp16 autocast and a GradScaler on `device`."""
    torch.manual_seed(0)
    where = f"cuda:{device}"
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).to(where)
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    scaler = grad_scaler(torch)
    x = torch.randn(1024, 256, device=where)
    y = x[:, :8].sum(dim=1, keepdim=True)
    losses = []
    for _ in range(30):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(x)
            if out.dtype != torch.float16:
                raise Fail(f"autocast on GPU {device} produced {out.dtype}, not float16")
            loss = torch.nn.functional.mse_loss(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    bf16 = bf16_usable(tuple(torch.cuda.get_device_capability(device)))
    if bf16:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if model(x).dtype != torch.bfloat16:
                raise Fail(f"autocast with bfloat16 on GPU {device} did not compute in bfloat16")
    if not all(map(lambda v: v == v and abs(v) != float("inf"), losses)):
        raise Fail(f"AMP training on GPU {device} produced a non-finite loss")
    if not losses[-1] < losses[0] * 0.9:
        raise Fail(f"AMP training on GPU {device} did not learn: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return losses[0], losses[-1], scaler, bf16


def torch_amp_training(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    runs = [_amp_on(torch, i) for i in range(torch.cuda.device_count())]
    first, last, scaler, bf16 = runs[0]
    return {
        "loss_first": round(first, 4),
        "loss_last": round(last, 4),
        "gpus": len(runs),
        "scaler": type(scaler).__module__ + "." + type(scaler).__name__,
        "bf16": bf16,
        "reason": f"autocast fp16 + GradScaler on {len(runs)} GPU(s): loss {first:.3f} -> {last:.3f}"
        + (", bf16 autocast too" if bf16 else ""),
    }


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
