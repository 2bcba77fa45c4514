"""The CPU arithmetic check: matmul and convolutions correct on the CPU."""

from __future__ import annotations

from .report import Fail


def torch_cpu_compute(torch) -> dict:
    torch.manual_seed(0)
    a = torch.randn(256, 256, dtype=torch.float64)
    err = (a @ torch.linalg.inv(a) - torch.eye(256, dtype=torch.float64)).abs().max().item()
    conv = torch.nn.functional.conv2d(torch.ones(1, 1, 5, 5), torch.ones(1, 1, 3, 3))
    if err > 1e-6 or conv.flatten()[0].item() != 9.0:
        raise Fail(f"CPU arithmetic is wrong (inverse error {err:.1e})")
    return {"reason": f"matmul, inverse and conv2d correct on the CPU ({torch.get_num_threads()} threads)"}


def tf_cpu_compute(tf) -> dict:
    with tf.device("/CPU:0"):
        conv = tf.nn.conv2d(tf.ones([1, 5, 5, 1]), tf.ones([3, 3, 1, 1]), strides=1, padding="VALID")
        m = tf.linalg.matmul(tf.eye(64), tf.ones([64, 64]))
    if float(conv[0, 0, 0, 0]) != 9.0 or float(tf.reduce_sum(m)) != 64 * 64:
        raise Fail("CPU arithmetic is wrong")
    return {"reason": "matmul and conv2d correct on the CPU"}
