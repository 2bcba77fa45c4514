"""Mamba's task: both compiled kernels load, and the selective scan runs (the reference path on a machine with no GPU)."""

import causal_conv1d_cuda  # noqa: F401
import selective_scan_cuda  # noqa: F401
import torch
from mamba_ssm.ops.selective_scan_interface import selective_scan_ref

u, delta = torch.randn(1, 4, 16), torch.rand(1, 4, 16)
A, B, C = -torch.rand(4, 8), torch.randn(1, 8, 16), torch.randn(1, 8, 16)
out = selective_scan_ref(u, delta, A, B, C)
assert out.shape == (1, 4, 16), out.shape
print("mamba: kernels load, selective scan", tuple(out.shape))
