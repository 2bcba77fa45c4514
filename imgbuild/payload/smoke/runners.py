"""Each framework's run: its checks in order."""

from __future__ import annotations

from .amp import tf_mixed_precision, torch_amp_training
from .budget import gpu_budget
from .collectives import torch_nccl, torch_p2p
from .commands import check_commands
from .compiling import torch_compile
from .cpu import tf_cpu_compute, torch_cpu_compute
from .cuda import tf_arch, tf_gpus, torch_arch, torch_arch_list, torch_cuda
from .cudnn import tf_conv, torch_cudnn
from .fp8 import torch_fp8
from .framework import check_framework_version, import_framework
from .imports import check_imports
from .libraries import tf_libraries, torch_libraries
from .pipcheck import check_pip
from .report import Report
from .shm import check_shm
from .throughput import tf_tensor_cores, torch_tensor_cores


def image_checks(report: Report) -> None:
    """What every image is checked for whatever its framework: `pip check`, the added packages' imports, the
    recipe's own commands."""
    report.run("pip check", check_pip)
    report.run("imports", check_imports)
    report.run("recipe checks", check_commands)


def run_pytorch(report: Report, libraries_only: bool = False) -> None:
    torch = import_framework(report, "torch", "pytorch")
    if torch is None:
        return
    report.run("framework", check_framework_version, torch, torch.__version__, "PYTORCH_VERSION")
    libraries = report.run("cuda libraries", torch_libraries, torch) or {}
    report.meta["cuda"] = libraries.get("cuda") or (torch.version.cuda or "")
    report.meta["arch_list"] = libraries.get("arch_list") or (torch_arch_list(torch) if torch.version.cuda else [])
    if libraries_only:
        return
    image_checks(report)
    report.run("cpu compute", torch_cpu_compute, torch)
    report.run("cuda", torch_cuda, torch)
    report.run("cuda arch", torch_arch, torch)
    report.run("cudnn conv", torch_cudnn, torch)
    report.run("tensor cores", torch_tensor_cores, torch)
    report.run("amp training", torch_amp_training, torch)
    budget = gpu_budget()
    report.run("nccl all-reduce", torch_nccl, torch, budget)
    report.run("p2p", torch_p2p, torch, budget)
    report.run("torch.compile", torch_compile, torch, budget)
    report.run("fp8", torch_fp8, torch, budget)
    report.run("shared memory", check_shm)


def run_tensorflow(report: Report, libraries_only: bool = False) -> None:
    tf = import_framework(report, "tensorflow", "tensorflow")
    if tf is None:
        return
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    report.run("framework", check_framework_version, tf, tf.__version__, "TENSORFLOW_VERSION")
    libraries = report.run("cuda libraries", tf_libraries, tf) or {}
    report.meta["cuda"] = libraries.get("cuda", "")
    report.meta["arch_list"] = libraries.get("arch_list", [])
    if libraries_only:
        return
    image_checks(report)
    report.run("cpu compute", tf_cpu_compute, tf)
    report.run("cuda", tf_gpus, tf)
    report.run("cuda arch", tf_arch, tf)
    report.run("cudnn conv", tf_conv, tf)
    report.run("mixed precision", tf_mixed_precision, tf)
    report.run("tensor cores", tf_tensor_cores, tf, gpu_budget())
    report.run("shared memory", check_shm)


RUNNERS = {"pytorch": run_pytorch, "tensorflow": run_tensorflow}
