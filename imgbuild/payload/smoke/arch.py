"""GPU architectures: which kernels run on which GPU.

The one implementation of the rule (imgbuild.gpu.fleet imports it for `smoke --for`, `tags --compatible` and
`bump`; the smoke test uses it on the GPUs it sees). It follows CUDA's binary compatibility, as PyTorch's own
`_check_cubins` does: SASS `sm_XY` runs on a GPU of the same major with minor >= Y; `sm_XYa` only on exactly X.Y;
`sm_XYf` on the family (same major, minor >= Y); PTX `compute_XY` is JIT-compiled by the driver for any GPU >= X.Y
(slow first start), `compute_XYa` only for X.Y, `compute_XYf` for the family."""

from __future__ import annotations

import re

from .report import Fail, Warn

ARCH_RE = re.compile(r"(sm|compute)_([0-9]{2,3})([af]?)")
TORCH_ARCH_RE = re.compile(r"([0-9]{1,2})\.([0-9])([af]?)(\+PTX)?")


def parse_archs(text) -> list:
    """Arch entries from `torch.cuda.get_arch_list()` (a list, or `sm_80 compute_90`) or from
    TORCH_CUDA_ARCH_LIST (`7.5 8.0 9.0a 12.0+PTX`, spaces or semicolons): (kind, major, minor, suffix)
    tuples, kind "sm" or "compute". Names it does not know ("Ampere", "sm_xx") are left out."""
    words = text if isinstance(text, (list, tuple)) else str(text).replace(";", " ").split()
    out = []
    for word in words:
        word = str(word).strip()
        match = ARCH_RE.fullmatch(word)
        if match:
            major, minor = divmod(int(match.group(2)), 10)
            out.append((match.group(1), major, minor, match.group(3)))
            continue
        match = TORCH_ARCH_RE.fullmatch(word)
        if match:
            major, minor, suffix = int(match.group(1)), int(match.group(2)), match.group(3)
            out.append(("sm", major, minor, suffix))
            if match.group(4):
                out.append(("compute", major, minor, suffix))
    return out


def arch_name(entry) -> str:
    kind, major, minor, suffix = entry
    return f"{kind}_{major}{minor}{suffix}"


#: Integrated GPUs (Jetson TX1, TX2, Xavier, Orin; sm_101 Thor before CUDA 13 named it sm_110). As PyTorch's
#: own capability check has it: their SASS runs on themselves alone (sm_101 also on 11.0, the same chip), and no
#: discrete GPU's SASS runs on them, whatever the minor.
IGPU_CAPABILITIES = frozenset({(5, 3), (6, 2), (7, 2), (8, 7), (10, 1)})


def _entry_runs(entry, capability) -> bool:
    kind, major, minor, suffix = entry
    cap_major, cap_minor = capability = tuple(capability)
    if suffix == "a":
        return capability == (major, minor)
    if kind == "sm" and (major, minor) == (10, 1):
        return capability in ((10, 1), (11, 0))
    if kind == "sm" and (major, minor) in IGPU_CAPABILITIES:
        return capability == (major, minor)
    if kind == "sm" and capability in IGPU_CAPABILITIES:
        return False
    if kind == "sm" or suffix == "f":
        return cap_major == major and cap_minor >= minor
    return (cap_major, cap_minor) >= (major, minor)  # plain PTX: the driver compiles it for newer GPUs


def kernels_for(archs, capability) -> tuple:
    """How an image built for `archs` runs on a GPU of `capability` (major, minor):
    ("sass", entry) with native kernels, ("ptx", entry) only through the driver's JIT, or ("none", None)."""
    entries = parse_archs(archs)
    sass = [e for e in entries if e[0] == "sm" and _entry_runs(e, capability)]
    if sass:  # the closest: an exact match first, then the highest minor below
        return "sass", max(sass, key=lambda e: (e[1], e[2], e[3] == "a"))
    ptx = [e for e in entries if e[0] == "compute" and _entry_runs(e, capability)]
    if ptx:
        return "ptx", max(ptx, key=lambda e: (e[1], e[2]))
    return "none", None


def explain_kernels(archs, capability) -> tuple:
    """(runs, how, reason) in words, for one GPU of `capability`."""
    how, entry = kernels_for(archs, capability)
    gpu = f"sm_{capability[0]}{capability[1]}"
    known = " ".join(arch_name(e) for e in parse_archs(archs)) or "nothing"
    if how == "sass":
        if (entry[1], entry[2]) == tuple(capability):
            return True, how, f"{gpu}: native kernels ({arch_name(entry)})"
        return True, how, f"{gpu}: native kernels ({arch_name(entry)}, binary-compatible within major {entry[1]})"
    if how == "ptx":
        return (
            True,
            how,
            (
                f"{gpu}: no native kernels; the driver JIT-compiles {arch_name(entry)} PTX "
                "(the first start takes minutes, cache it with CUDA_CACHE_PATH)"
            ),
        )
    return False, how, f"{gpu}: no kernels for this GPU (the image has {known})"


def bf16_usable(capability) -> bool:
    """bf16 has tensor-core support from Ampere (8.0) on; `torch.cuda.is_bf16_supported()` also says
    True on Volta and Turing, where bf16 is emulated and slow."""
    return tuple(capability) >= (8, 0)


def arch_verdict(archs, capabilities: list) -> dict:
    """The framework's arch list against each visible GPU: fail where one has no kernels, warn where one JITs."""
    verdicts = [explain_kernels(archs, capability) for capability in capabilities]
    problems = [reason for runs, _, reason in verdicts if not runs]
    if problems:
        raise Fail("; ".join(problems) + " (choose an NGC release that supports this GPU)")
    jit = [reason for _, how, reason in verdicts if how == "ptx"]
    if jit:
        raise Warn("; ".join(jit))
    return {"arch_list": archs, "reason": "; ".join(sorted({reason for _, _, reason in verdicts}))}


def tf_arch_list(info) -> list:
    """TensorFlow's build-info arch list, as words: it is a list (`['sm_70', 'compute_90']`) or a string
    (`sm_70,sm_80`) depending on the release; either way the words, without quotes or brackets."""
    words = str(info.get("cuda_compute_capabilities") or "").replace(",", " ").split()
    return [w.strip("[]'\"") for w in words if w.strip("[]'\"")]
