"""NGC facts as data: the tag grammar, framework repositories, and what an image's config says about it."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

#: The NGC tag grammar (`24.05`, `24.05-py3`, `24.05-tf2-py3`, `24.03-py3-igpu`), matched whole-string.
TAG_RE = re.compile(
    r"(?P<yy>[0-9]{2})\.(?P<mm>[0-9]{2})(?:-(?P<fw>tf[12]))?(?:-py(?P<py>[23]))?"
    r"(?:-(?P<variant>[a-z0-9]+))?"
)
#: What a recipe's base.tag / base.follow may say: a tag, `latest`, or a glob over releases (`24.*`).
TAG_OR_PATTERN_RE = re.compile(rf"(?:{TAG_RE.pattern}|latest|[0-9.*]{{1,8}}\*[0-9a-z.*-]{{0,32}})")


@dataclass(frozen=True)
class Framework:
    name: str
    repository: str  # under the NGC registry host
    tag_suffix: str  # what `24.05` expands to
    version_env: str  # env var carrying the framework version
    release_env: str  # env var carrying the NGC release (YY.MM)
    packages: tuple[str, ...]  # pip distributions that are the framework itself
    module: str
    tag_fw: str | None  # the tag's framework part: 24.05-tf2-py3 -> "tf2"; pytorch has none


FRAMEWORKS = {
    "pytorch": Framework(
        "pytorch", "nvidia/pytorch", "-py3", "PYTORCH_VERSION", "NVIDIA_PYTORCH_VERSION", ("torch",), "torch", None
    ),
    "tensorflow": Framework(
        "tensorflow",
        "nvidia/tensorflow",
        "-tf2-py3",
        "TENSORFLOW_VERSION",
        "NVIDIA_TENSORFLOW_VERSION",
        ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "intel-tensorflow", "tensorflow-intel"),
        "tensorflow",
        "tf2",
    ),
}
#: Every framework's distributions, canonical (PEP 503): what no lock or pip step may install over a base.
FRAMEWORK_PACKAGES = frozenset(
    re.sub(r"[-_.]+", "-", name).lower() for fw in FRAMEWORKS.values() for name in fw.packages
)
#: Name prefixes of distributions that may belong to the base's CUDA stack (the base's pins of these are
#: judged by their own check, not as ordinary pins).
CUDA_PACKAGE_PREFIXES = ("nvidia-", "cupy-cuda", "jax-cuda")
#: The CUDA libraries themselves as wheels (NVIDIA's and the CUDA builds of CuPy and JAX): a recipe or its lock
#: may never pin them. Other `nvidia-*` distributions (nvidia-ml-py, nvidia-dali-*, nvidia-modelopt) are
#: ordinary packages.
CUDA_LIBRARY_RE = re.compile(
    r"nvidia-(?:cuda-[a-z0-9-]+|cudnn|cublas|cublasmp|cufft|cufile|curand|cusolver|cusparse|cusparselt|nccl|"
    r"nvjitlink|nvtx|nvshmem|npp|nvjpeg|nvcomp|nvvm|cuda)(?:-cu[0-9]{1,3})?|cupy-cuda[0-9a-z]+|jax-cuda[0-9]+-[a-z]+"
)


def is_cuda_library(name: str) -> bool:
    """Is `name` (canonical) a CUDA library wheel of the kind the base carries?"""
    return bool(CUDA_LIBRARY_RE.fullmatch(name))


#: How a wheel or an extra says which CUDA it is built for: `nvidia-cudnn-cu12`, `cupy-cuda12x`, `cupy-cuda117`,
#: `jax-cuda12-plugin`, `jax[cuda12]`, `jax[cuda12_local]`.
CUDA_BUILD_RE = re.compile(r"(?:(?<=-)cu|(?:^|(?<=-))cuda)([0-9]{2,3})(?=x?(?:$|[-_]))")


def cuda_build(name: str) -> str | None:
    """The CUDA major a distribution name (canonical) or an extra is built for (`12`), or None."""
    found = CUDA_BUILD_RE.search(name)
    if not found:
        return None
    digits = found.group(1)
    return digits if len(digits) == 2 else digits[:2].lstrip("0") or None  # cupy-cuda117: CUDA 11.7


def cuda_major(env: dict[str, str]) -> str | None:
    """The base's CUDA major from its CUDA_VERSION (`13.0.2.006`: `13`), or None when it says none."""
    first = env.get("CUDA_VERSION", "").split(".")[0]
    return first if first.isascii() and first.isdigit() and len(first) <= 3 else None


@dataclass(frozen=True, order=True)
class NgcTag:
    """A parsed NGC tag; sorts oldest to newest, plain tags after variants of the same release."""

    yy: int
    mm: int
    plain: bool
    text: str
    fw: str | None = None
    py: str | None = None
    variant: str | None = None

    @property
    def release(self) -> str:
        return f"{self.yy:02d}.{self.mm:02d}"


def parse_tag(tag: str) -> NgcTag | None:
    m = TAG_RE.fullmatch(tag)
    if not m:
        return None
    return NgcTag(int(m["yy"]), int(m["mm"]), m["variant"] is None, tag, m["fw"], m["py"], m["variant"])


def is_pattern(tag: str) -> bool:
    return tag == "latest" or "*" in tag


def expand_tag(framework: str, tag: str) -> str:
    """`24.05` -> `24.05-py3` (pytorch) or `24.05-tf2-py3` (tensorflow); full tags and patterns pass."""
    fw = FRAMEWORKS[framework]
    if re.fullmatch(r"[0-9]{2}\.[0-9]{2}", tag):
        return tag + fw.tag_suffix
    return tag


def newest_matching(framework: str | None, pattern: str, tags: list[str]) -> str | None:
    """The newest plain (no variant) tag that matches `pattern` (`latest`, `24.*`, `2?.1*`)."""
    found = matching(framework, pattern, tags)
    return found[0] if found else None


def matching(framework: str | None, pattern: str, tags: list[str]) -> list[str]:
    """The plain (no variant) tags that match `pattern`, newest first."""
    wanted = "*" if pattern == "latest" else pattern
    candidates = [
        parsed
        for parsed in map(parse_tag, tags)
        if parsed is not None
        and parsed.plain
        and parsed.py != "2"
        and (framework is None or parsed.fw == FRAMEWORKS[framework].tag_fw)
        and (fnmatch.fnmatchcase(parsed.release, wanted) or fnmatch.fnmatchcase(parsed.text, wanted))
    ]
    return [parsed.text for parsed in sorted(candidates, reverse=True)]


#: A fact taken from an image config (a registry's answer: untrusted) must look like a version or a name.
FACT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_:~ -]{0,127}")


def config_env(config: dict[str, Any]) -> dict[str, str]:
    """The image config's Env as a mapping (shape-checked: a registry's answer is untrusted)."""
    cfg = config.get("config") or config.get("Config") or {}
    items = cfg.get("Env") if isinstance(cfg, dict) else None
    return dict(
        item.split("=", 1)
        for item in (items if isinstance(items, list) else [])
        if isinstance(item, str) and "=" in item
    )


def describe_config(config: dict[str, Any]) -> dict[str, str]:
    """What an image config says: CUDA, cuDNN, framework, Python, driver (from Env and Labels).

    Values that are not one plain line (a newline would become a Dockerfile instruction or a pip option
    once rendered) are dropped."""
    facts = _describe(config)
    return {k: (v if not v or FACT_RE.fullmatch(v) else "") for k, v in facts.items()}


def _describe(config: dict[str, Any]) -> dict[str, str]:
    cfg = config.get("config") or config.get("Config") or {}
    env = config_env(config)
    raw_labels = cfg.get("Labels") if isinstance(cfg, dict) else None
    labels = {str(k): str(v) for k, v in raw_labels.items()} if isinstance(raw_labels, dict) else {}
    out = {
        # Not the label com.nvidia.cuda.version: NGC writes 9.0 there in every release (NVIDIA_REQUIRE_CUDA too).
        "cuda": env.get("CUDA_VERSION", ""),
        "cudnn": env.get("CUDNN_VERSION", labels.get("com.nvidia.cudnn.version", "")),
        "driver": env.get("CUDA_DRIVER_VERSION", ""),
        "nccl": env.get("NCCL_VERSION", ""),
        "arch_list": env.get("TORCH_CUDA_ARCH_LIST", ""),
        "python": _python_version(env),
        "framework": "",
        "framework_version": "",
        "release": "",
    }
    for fw in FRAMEWORKS.values():
        if fw.version_env in env:
            out["framework"] = fw.name
            out["framework_version"] = env[fw.version_env]
            out["release"] = env.get(fw.release_env, "")
            break
    return out


def _python_version(env: dict[str, str]) -> str:
    for key in ("PYTHON_VERSION", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH"):
        m = re.search(r"python(3\.[0-9]+)", env.get(key, ""))
        if m:
            return m.group(1) if key != "PYTHON_VERSION" else env[key]
    return env.get("PYTHON_VERSION", "")
