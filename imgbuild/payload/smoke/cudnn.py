"""The cuDNN check: convolutions on the GPU agree with the CPU, in fp32 and under fp16/bf16 autocast, on every GPU."""

from __future__ import annotations

from .arch import bf16_usable
from .report import Fail, Skip


def conv_within_tolerance(err: float, ref_max: float) -> bool:
    """A GPU convolution in real fp32 matches the CPU to 1e-4 of its outputs' size: an implicit-GEMM conv
    lands near 1e-6, and the Winograd or FFT algorithms TensorFlow's autotuner may pick stay within 1e-4."""
    return err <= 1e-4 * max(1.0, ref_max)


def torch_cudnn(torch) -> dict:
    """On every visible GPU: an fp32 convolution forward and backward against the CPU (TF32 off), and an fp16
    (bf16 where the GPU has it) channels-last convolution under autocast, which runs cuDNN's tensor-core kernels,
    against the fp32 result."""
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    if not torch.backends.cudnn.is_available():
        raise Fail("cuDNN is not available to PyTorch")
    ver = torch.backends.cudnn.version()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1)
    x = torch.randn(8, 64, 32, 32, requires_grad=True)
    ref = conv(x)
    ref.sum().backward()
    ref_grad = x.grad.clone()
    worst, half = 0.0, []
    for i in range(torch.cuda.device_count()):
        device = f"cuda:{i}"
        conv_gpu = torch.nn.Conv2d(64, 64, 3, padding=1).to(device)
        conv_gpu.load_state_dict(conv.state_dict())
        xg = x.detach().to(device).requires_grad_(True)
        out = conv_gpu(xg)
        out.sum().backward()
        torch.cuda.synchronize(i)
        fwd_err = (out.cpu() - ref).abs().max().item()
        bwd_err = (xg.grad.cpu() - ref_grad).abs().max().item()
        if fwd_err > 1e-3 or bwd_err > 1e-3:
            raise Fail(
                f"cuDNN convolution on GPU {i} differs from the CPU: forward {fwd_err:.2e}, backward {bwd_err:.2e}"
            )
        worst = max(worst, fwd_err, bwd_err)
        dtype = torch.bfloat16 if bf16_usable(tuple(torch.cuda.get_device_capability(i))) else torch.float16
        with torch.autocast("cuda", dtype=dtype):
            low = conv_gpu.to(memory_format=torch.channels_last)(
                xg.detach().contiguous(memory_format=torch.channels_last)
            )
        torch.cuda.synchronize(i)
        if low.dtype != dtype:
            raise Fail(f"autocast on GPU {i} ran the convolution in {low.dtype}, not {dtype}")
        rel = ((low.float() - out.detach()).abs().max() / out.detach().abs().max().clamp_min(1e-6)).item()
        if not rel < 0.05:
            raise Fail(f"a {dtype} channels-last convolution on GPU {i} is off by {rel:.1%} from fp32")
        half.append(str(dtype).replace("torch.", ""))
    return {
        "cudnn": cudnn_text(ver),
        "max_err": worst,
        "gpus": torch.cuda.device_count(),
        "reason": f"cuDNN {cudnn_text(ver)} on {torch.cuda.device_count()} GPU(s): conv fwd/bwd match the CPU (max err "
        f"{worst:.1e}); {'/'.join(sorted(set(half)))} channels-last conv agrees",
    }


def cudnn_text(version: int) -> str:
    """`90100` -> 9.1.0 (cuDNN 9), `8905` -> 8.9.5 (cuDNN 8)."""
    major, rest = divmod(version, 10000) if version >= 90000 else divmod(version, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def tf_conv(tf) -> dict:
    if not tf.config.list_physical_devices("GPU"):
        raise Skip("no GPU visible")
    # TF turns TF32 on by default from Ampere on: compare in real fp32.
    tf.config.experimental.enable_tensor_float_32_execution(False)
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
    scale = max(1.0, float(tf.reduce_max(tf.abs(ref))))
    if grad is None or not conv_within_tolerance(err, scale):
        raise Fail(f"GPU conv2d differs from the CPU by {err:.1e} (outputs up to {scale:.0f})")
    return {
        "max_err": err,
        "relative_err": err / scale,
        "reason": f"conv2d with gradient on {y.device.split('device:')[-1]}, err {err / scale:.1e} relative",
    }
