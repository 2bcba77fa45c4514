"""The CUDA libraries check: the CUDA, cuDNN and NCCL the framework loads against what the image declares. No GPU
needed."""

from __future__ import annotations

import os

from .arch import tf_arch_list
from .cuda import torch_arch_list
from .cudnn import cudnn_text
from .report import Fail, Skip
from .versions import version_prefix_agrees


def loaded_library(name: str) -> str:
    """The file this process loaded for a shared library (`libcudart.so`), from /proc/self/maps; "" if none."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                if "/" + name in path:
                    return path
    except OSError:
        pass
    return ""


def is_wheel_path(path: str) -> bool:
    """A library from a Python wheel (nvidia-cuda-runtime-cu12 and the like), not the system's CUDA."""
    return "/site-packages/" in path or "/dist-packages/" in path


def torch_libraries(torch) -> dict:
    """CUDA runtime, cuDNN and NCCL as the framework loads them, against what the image declares. No GPU needed."""
    cuda = torch.version.cuda
    declared = os.environ.get("CUDA_VERSION", "")
    if not cuda:
        raise Skip(
            f"torch {torch.__version__} is a CPU-only build"
            + (f" (the image declares CUDA {declared})" if declared else "")
        )
    details = {"cuda": cuda, "arch_list": torch_arch_list(torch)}
    problems = []
    if declared and not version_prefix_agrees(cuda, declared, 2):
        runtime = loaded_library("libcudart.so")
        if is_wheel_path(runtime):  # pip's torch on a CUDA base: its own runtime, not the system copy declared
            details["cuda_note"] = f"torch loads its own CUDA {cuda} runtime ({runtime}), not the image's {declared}"
        else:
            problems.append(f"torch was built with CUDA {cuda} but the image declares CUDA_VERSION={declared}")
    if not torch.backends.cudnn.is_available():
        problems.append("cuDNN does not load")
    else:
        details["cudnn"] = cudnn_text(torch.backends.cudnn.version())
        want = os.environ.get("CUDNN_VERSION", "")
        if want and not version_prefix_agrees(details["cudnn"], want, 3):
            loaded = loaded_library("libcudnn")
            if is_wheel_path(loaded):  # pip's torch with its own nvidia-cudnn wheel: not the system copy declared
                details["cudnn_note"] = (
                    f"torch loads its own cuDNN {details['cudnn']} ({loaded}), not the image's {want}"
                )
            else:
                problems.append(f"cuDNN {details['cudnn']} loads but the image declares CUDNN_VERSION={want}")
    try:
        nccl = torch.cuda.nccl.version()
        details["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as exc:  # noqa: BLE001 - a missing or broken libnccl raises anything
        if torch.distributed.is_available() and torch.distributed.is_nccl_available():
            problems.append(f"NCCL is built in but does not load: {type(exc).__name__}: {str(exc)[:120]}")
    if problems:
        raise Fail("; ".join(problems))
    parts = [f"CUDA {cuda}"] + [f"{k} {details[k]}" for k in ("cudnn", "nccl") if k in details]
    details["reason"] = ", ".join(parts) + " load and match the image's declared versions"
    return details


def tf_libraries(tf) -> dict:
    """The CUDA and cuDNN TensorFlow was built with, against what the image declares. No GPU needed."""
    info = tf.sysconfig.get_build_info()
    if not info.get("is_cuda_build"):
        raise Skip(f"TensorFlow {tf.__version__} is not a CUDA build")
    cuda, cudnn = str(info.get("cuda_version") or ""), str(info.get("cudnn_version") or "")
    archs = tf_arch_list(info)
    details = {"cuda": cuda, "cudnn": cudnn, "arch_list": archs}
    problems = []
    declared = os.environ.get("CUDA_VERSION", "")
    if declared and cuda and not version_prefix_agrees(cuda, declared, 2):
        problems.append(f"TensorFlow was built with CUDA {cuda} but the image declares CUDA_VERSION={declared}")
    want = os.environ.get("CUDNN_VERSION", "")
    if want and cudnn and not version_prefix_agrees(cudnn, want, len(cudnn.split("."))):
        problems.append(f"TensorFlow was built with cuDNN {cudnn} but the image declares CUDNN_VERSION={want}")
    if problems:
        raise Fail("; ".join(problems))
    details["reason"] = f"built with CUDA {cuda}, cuDNN {cudnn}, as the image declares"
    return details
