#!/usr/bin/env python3
"""Trains a tiny model for a few steps: proves the image's framework and extras work together."""
import einops
import torch

torch.manual_seed(0)
x = torch.randn(256, 4, 8)
y = einops.rearrange(x, "b h w -> b (h w)").sum(dim=1, keepdim=True)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
first = None
for step in range(50):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    first = first if first is not None else loss.item()
print(f"loss {first:.3f} -> {loss.item():.3f}")
assert loss.item() < first
