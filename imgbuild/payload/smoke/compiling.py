"""The compile check: torch.compile of a small function through Inductor and Triton, once per kind of GPU."""

from __future__ import annotations

import os
import subprocess
import sys

from .budget import Budget
from .report import Child, Fail, Skip

#: A small function compiled and run on one GPU (its index the argument): it answers the largest difference from
#: eager mode after its marker.
COMPILED = Child(
    r"""
import os, sys
import torch
i = int(sys.argv[1])
f = torch.compile(lambda x: (x.sin() + 1).relu())
x = torch.randn(4096, device=f"cuda:{i}")
y = f(x)
torch.cuda.synchronize(i)
print(os.environ["IMGBUILD_PROBE_MARKER"] + str(float((y - (x.sin() + 1).relu()).abs().max())), flush=True)
""",
    "IMGBUILD-COMPILE ",
)
COMPILE_CURES = (
    (
        "ptxas",
        "Triton's ptxas does not know this GPU: set TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas (the "
        "toolkit's, newer) in the recipe's env",
    ),
    ("gcc", "Triton needs a C compiler: add gcc to the recipe's apt"),
    ("Python.h", "Triton needs Python's headers: add python3-dev to the recipe's apt"),
)


def compile_cure(output: str) -> str:
    return next((cure for word, cure in COMPILE_CURES if word in output), "")


def torch_compile(torch, budget: Budget) -> dict:
    """torch.compile of a small function through Inductor and Triton, once per kind of GPU, in a process of its
    own so a hung compiler ends with its share of the budget: a ptxas or Triton that does not know the GPU."""
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    if not hasattr(torch, "compile"):
        raise Skip(f"torch {torch.__version__} has no torch.compile")
    done = {}
    for i in range(torch.cuda.device_count()):
        capability = tuple(torch.cuda.get_device_capability(i))
        if capability in done:
            continue
        timeout = budget.left(f"torch.compile on GPU {i}")
        try:
            proc = subprocess.run(
                [sys.executable, "-c", COMPILED.script, str(i)],
                env=COMPILED.env(os.environ),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise Fail(f"torch.compile on GPU {i} did not finish in {timeout:.0f} s") from None
        output = proc.stdout + proc.stderr
        line = COMPILED.answer(proc.stdout)
        if proc.returncode != 0 or line is None:
            said = [x for x in output.splitlines() if "error" in x.lower() or "fatal" in x.lower()][-1:]
            cure = compile_cure(output)
            raise Fail(
                f"torch.compile on GPU {i} (sm_{capability[0]}{capability[1]}) failed: "
                + (said[0].strip()[:300] if said else "no output")
                + (f" ({cure})" if cure else "")
            )
        if not float(line) < 1e-3:
            raise Fail(f"torch.compile on GPU {i} computed a different answer than eager mode")
        done[capability] = i
    archs = ", ".join(f"sm_{c[0]}{c[1]}" for c in done)
    return {"archs": list(done), "reason": f"torch.compile (Inductor, Triton) runs on {archs}"}
