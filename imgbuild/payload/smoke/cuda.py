"""The CUDA check: a GPU is visible and runs a kernel, and the framework carries kernels for each GPU's architecture."""

from __future__ import annotations

from .arch import arch_verdict, tf_arch_list
from .report import Fail, Skip


def cuda_available(torch) -> tuple:
    """(is CUDA usable, why not in CUDA's own words): torch says why only in a warning ("the NVIDIA driver on
    your system is too old", error 804 "forward compatibility was attempted on non supported HW", 802 "system
    not yet initialized" when the fabric manager is down), which a bare is_available() throws away."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = bool(torch.cuda.is_available())
    why = ""
    for warning in caught:
        text = " ".join(str(warning.message).split())
        if "cuda" in text.lower() or "driver" in text.lower():
            why = text[:300]
            break
    return usable, why


def torch_cuda(torch) -> dict:
    usable, why = cuda_available(torch)
    if not usable:
        raise Skip("no GPU visible" + (f": {why}" if why else ""))
    names = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        x = torch.ones(1, device=f"cuda:{i}") + 1
        torch.cuda.synchronize(i)
        if float(x.item()) != 2.0:
            raise Fail(f"a one-element kernel on GPU {i} gave the wrong answer")
        names.append(f"{torch.cuda.get_device_name(i)} (sm_{major}{minor})")
    return {
        "devices": torch.cuda.device_count(),
        "names": names,
        "cuda": torch.version.cuda,
        "reason": f"{', '.join(names)}, CUDA {torch.version.cuda}",
    }


def torch_arch_list(torch) -> list:
    """The archs this torch was compiled for, with or without a GPU (`get_arch_list()` is empty without one)."""
    flags = getattr(torch._C, "_cuda_getArchFlags", None)
    text = flags() if callable(flags) else ""
    return str(text or "").split() or list(torch.cuda.get_arch_list())


def torch_arch(torch) -> dict:
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    archs = torch_arch_list(torch)
    return arch_verdict(archs, [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())])


def mig_instance(torch) -> bool:
    return any("MIG" in str(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count()))


def tf_gpus(tf) -> dict:
    gpus = tf.config.list_physical_devices("GPU")
    info = tf.sysconfig.get_build_info()
    if not gpus:
        raise Skip("no GPU visible" + ("" if info.get("is_cuda_build") else " (and this is not a CUDA build)"))
    return {
        "gpus": len(gpus),
        "cuda": info.get("cuda_version"),
        "cudnn": info.get("cudnn_version"),
        "reason": f"{len(gpus)} GPU(s); built with CUDA {info.get('cuda_version')}, cuDNN {info.get('cudnn_version')}",
    }


def tf_arch(tf) -> dict:
    """The GPUs' kernels in TensorFlow's own arch list (its build info), by the rule torch's check uses."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise Skip("no GPU visible")
    info = tf.sysconfig.get_build_info()
    archs = tf_arch_list(info)
    if not archs:
        raise Skip("TensorFlow's build info names no CUDA arch list")
    details = [tuple(tf.config.experimental.get_device_details(gpu).get("compute_capability") or ()) for gpu in gpus]
    capabilities = [c for c in details if len(c) == 2]
    if not capabilities:
        raise Skip("TensorFlow does not say its GPUs' compute capability")
    return {**arch_verdict(" ".join(archs), capabilities), "arch_list": archs}
