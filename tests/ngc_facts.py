"""What real NGC framework images carry, per release, as data: the one home of these facts in the project.

Every value is copied from `../shared/docs/ngc-real-facts.md` (the key in brackets names its source there).
Two users:

- unit tests feed imgbuild's parsers and checks the *real* strings (`REAL`), never what the stand-ins say;
- the test bed builds its stand-ins from them (`standin`): the same env, labels, entrypoint and version shapes,
  with only the differences listed in `DIFFERENCES` (what cannot be reproduced here, and why it cannot hide
  a bug). README's table "How the stand-ins differ" is written from the same list.

Stdlib only: `tests/testbed/up` runs it with the host's python3 before anything is installed.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field

#: Env every PyTorch release carries with the same value [E23.10][H25.10a][H26.07].
PYTORCH_COMMON_ENV = {
    "NVIDIA_REQUIRE_CUDA": "cuda>=9.0",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility,video",
    "NVIDIA_PRODUCT_NAME": "PyTorch",
    "PYTORCH_BUILD_NUMBER": "0",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1",
    "CUDA_MODULE_LOADING": "LAZY",
    "PYTORCH_HOME": "/opt/pytorch/pytorch",
    "CUDA_HOME": "/usr/local/cuda",
    "_CUDA_COMPAT_PATH": "/usr/local/cuda/compat",
    "ENV": "/etc/shinit_v2",
    "BASH_ENV": "/etc/bash.bashrc",
    "SHELL": "/bin/bash",
    "PYTHONIOENCODING": "utf-8",
    "LC_ALL": "C.UTF-8",
    "PIP_DEFAULT_TIMEOUT": "100",
    "JUPYTER_PORT": "8888",
    "TENSORBOARD_PORT": "6006",
    "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS": "",
}
#: TensorFlow images share the CUDA part of the env (the release notes list the same stack) [RN-P24.05].
TENSORFLOW_COMMON_ENV = {
    k: v for k, v in PYTORCH_COMMON_ENV.items() if not k.startswith(("PYTORCH", "TORCH", "NVIDIA_PRODUCT"))
} | {"NVIDIA_PRODUCT_NAME": "TensorFlow"}
#: Labels every release carries with the same value: `com.nvidia.cuda.version` is 9.0 in all of them, like
#: NVIDIA_REQUIRE_CUDA, never the real CUDA version [H25.10a][H26.07].
COMMON_LABELS = {"com.nvidia.volumes.needed": "nvidia_driver", "com.nvidia.cuda.version": "9.0"}

ARCHS_24 = "5.2 6.0 6.1 7.0 7.2 7.5 8.0 8.6 8.7 9.0+PTX"  # 23.10 to 24.x [E23.10][ARCH24]
ARCHS_25_AMD64 = "7.5 8.0 8.6 9.0 10.0 12.0+PTX"  # 25.10 amd64 [A25.10x86]
ARCHS_25_ARM64 = "8.0 8.6 9.0 10.0 11.0 12.0+PTX"  # 25.10 arm64: adds Thor, drops Turing [H25.10a]


def _paths(python: str) -> dict[str, str]:
    """PATH and LD_LIBRARY_PATH as 25.10 writes them; both carry the Python minor [H25.10a][E23.10]."""
    site = f"/usr/local/lib/python{python}/dist-packages"
    return {
        "PATH": f"{site}/torch_tensorrt/bin:/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/mpi/bin:"
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/ucx/bin:/opt/tensorrt/bin",
        "LD_LIBRARY_PATH": f"{site}/torch/lib:{site}/torch_tensorrt/lib:/usr/local/cuda/compat/lib:"
        "/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
    }


@dataclass(frozen=True)
class Release:
    """One NGC tag as the real image is: what imgbuild may read from its config or find inside it."""

    repo: str  # nvidia/pytorch | nvidia/tensorflow
    tag: str
    framework: str  # pytorch | tensorflow
    release: str  # YY.MM
    ubuntu: str
    python: str  # X.Y.Z
    env: dict[str, str]  # what the config's Env says (beyond the common part)
    module_version: str  # torch.__version__ / tf.__version__
    dist_name: str  # the framework's distribution
    dist_version: str  # importlib.metadata / pip form (normalised: nv25.1 for nv25.01)
    arch_lists: dict[str, str] = field(default_factory=dict)  # platform -> TORCH_CUDA_ARCH_LIST
    build_ids: dict[str, str] = field(default_factory=dict)  # platform -> NVIDIA_BUILD_ID
    constraint_file: bool = False  # /etc/pip/constraint.txt and PIP_CONSTRAINT (PyTorch 25.03 on)
    original_constraint_file: bool = False  # /etc/pip/original_constraint.txt (26.07 on)
    license: str = "dlc"  # dlc: "NVIDIA Deep Learning Container License"; sla: "GOVERNING TERMS" (~26.01 on)
    sources: str = ""

    @property
    def key(self) -> str:
        return f"{self.repo.split('/')[-1]}:{self.tag}"

    @property
    def version_env(self) -> str:
        return "PYTORCH_VERSION" if self.framework == "pytorch" else "TENSORFLOW_VERSION"

    def config_env(self, platform: str = "amd64") -> dict[str, str]:
        """The image config's Env for one platform (the amd64 and arm64 configs differ)."""
        common = PYTORCH_COMMON_ENV if self.framework == "pytorch" else TENSORFLOW_COMMON_ENV
        out = {**common, **_paths(self.python.rsplit(".", 1)[0]), **self.env}
        if self.framework == "pytorch":
            out["PYTORCH_BUILD_VERSION"] = out["PYTORCH_VERSION"]
        if platform in self.arch_lists:
            out["TORCH_CUDA_ARCH_LIST"] = self.arch_lists[platform]
        if platform in self.build_ids:
            out["NVIDIA_BUILD_ID"] = self.build_ids[platform]
        if self.constraint_file:
            out["PIP_CONSTRAINT"] = "/etc/pip/constraint.txt"
        if self.ubuntu >= "24.04":
            out["PIP_BREAK_SYSTEM_PACKAGES"] = "1"
        return out

    def labels(self, platform: str = "amd64") -> dict[str, str]:
        env = self.config_env(platform)
        out = dict(COMMON_LABELS)
        for key, label in (("CUDNN_VERSION", "cudnn"), ("NCCL_VERSION", "nccl"), ("CUBLAS_VERSION", "cublas")):
            if env.get(key):
                out[f"com.nvidia.{label}.version"] = env[key]
        if self.framework == "pytorch":
            out["com.nvidia.pytorch.version"] = env["PYTORCH_VERSION"]
        if env.get("NVIDIA_BUILD_ID"):
            out["com.nvidia.build.id"] = env["NVIDIA_BUILD_ID"]
        out["org.opencontainers.image.ref.name"] = "ubuntu"
        out["org.opencontainers.image.version"] = self.ubuntu
        return out


def _pip_form(version: str) -> str:
    """How pip and the metadata write an NGC local version: `nv25.01` -> `nv25.1` [PIPNORM]."""
    return re.sub(r"\.nv(\d{2})\.0?(\d{1,2})", r".nv\1.\2", version)


def _pytorch(tag: str, env_version: str, torch_version: str, **kw) -> Release:
    release = tag.split("-")[0]
    env = {"PYTORCH_VERSION": env_version, "NVIDIA_PYTORCH_VERSION": release, **kw.pop("env")}
    return Release(
        "nvidia/pytorch",
        tag,
        "pytorch",
        release,
        env=env,
        module_version=torch_version,
        dist_name="torch",
        dist_version=_pip_form(torch_version),
        **kw,
    )


def _tensorflow(tag: str, tf_version: str, **kw) -> Release:
    release = tag.split("-")[0]
    env = {"TENSORFLOW_VERSION": tf_version, "NVIDIA_TENSORFLOW_VERSION": f"{release}-tf2", **kw.pop("env")}
    yy, mm = release.split(".")
    return Release(
        "nvidia/tensorflow",
        tag,
        "tensorflow",
        release,
        env=env,
        module_version=tf_version,
        dist_name="tensorflow",
        dist_version=f"{tf_version}+nv{yy}.{int(mm)}",
        **kw,
    )


#: One release per generation imgbuild supports, and the shapes that break naive code.
REAL: dict[str, Release] = {
    r.key: r
    for r in (
        # Up to 24.02 torch.__version__ equals the env (no .nv suffix); CUDA 12.2, cuDNN 8 [E23.10][VLLM1781].
        _pytorch(
            "23.10-py3",
            "2.1.0a0+32f93b1",
            "2.1.0a0+32f93b1",
            ubuntu="22.04",
            python="3.10.12",
            env={
                "CUDA_VERSION": "12.2.2.009",
                "CUDA_DRIVER_VERSION": "535.104.05",
                "CUDNN_VERSION": "8.9.5.29",
                "NCCL_VERSION": "2.19.3",
                "CUBLAS_VERSION": "12.2.5.6",
                "CUDA_CACHE_DISABLE": "1",
            },
            arch_lists={"amd64": ARCHS_24, "arm64": ARCHS_24},
            build_ids={"amd64": "71422337"},
            sources="[E23.10][B23.10][VLLM1781]",
        ),
        # 24.01's cuDNN carries a `+cuda12.2` tail [E24.01]; torch 2.2 has the old AMP scaler [R24.01].
        _pytorch(
            "24.01-py3",
            "2.2.0a0+81ea7a4",
            "2.2.0a0+81ea7a4",
            ubuntu="22.04",
            python="3.10.12",
            env={"CUDA_VERSION": "12.3.2.001", "CUDNN_VERSION": "8.9.7.29+cuda12.2"},
            arch_lists={"amd64": ARCHS_24},
            build_ids={"amd64": "80741402"},
            sources="[E24.01][B24.01][R24.01]",
        ),
        # From 24.03 the env is short and torch carries `<10 hex>.nvYY.MM`; a month with a leading zero,
        # which the metadata writes nv24.5 [B24.05][T24.05][TRITON-COMPAT][RN-P24.05].
        _pytorch(
            "24.05-py3",
            "2.4.0a0+07cecf4",
            "2.4.0a0+07cecf4168.nv24.05",
            ubuntu="22.04",
            python="3.10.12",
            env={
                "CUDA_VERSION": "12.4.1.003",
                "CUDA_DRIVER_VERSION": "550.54.15",
                "CUDNN_VERSION": "9.1.0.70",
                "NCCL_VERSION": "2.21.5",
                "CUBLAS_VERSION": "12.4.5.8",
            },
            arch_lists={"amd64": ARCHS_24, "arm64": ARCHS_24},
            sources="[B24.05][T24.05][TRITON-COMPAT][RN-P24.05]",
        ),
        # Ubuntu 24.04 and Python 3.12 from 25.01; leading-zero month again [T25.01][V25.01][B25.01].
        _pytorch(
            "25.01-py3",
            "2.6.0a0+ecf3bae",
            "2.6.0a0+ecf3bae40a.nv25.01",
            ubuntu="24.04",
            python="3.12.3",
            env={"CUDA_VERSION": "12.8.0.038", "CUDA_DRIVER_VERSION": "570.86.10"},
            build_ids={"amd64": "134983853"},
            sources="[B25.01][T25.01][V25.01][PIPNORM]",
        ),
        # CUDA 13, the constraint file, per-platform arch lists [H25.10a][T25.10][A25.10x86][DYNAMO].
        _pytorch(
            "25.10-py3",
            "2.9.0a0+145a3a7",
            "2.9.0a0+145a3a7bda.nv25.10",
            ubuntu="24.04",
            python="3.12.3",
            env={
                "CUDA_VERSION": "13.0.2.006",
                "CUDA_DRIVER_VERSION": "580.95.05",
                "CUDNN_VERSION": "9.14.0.64",
                "NCCL_VERSION": "2.27.7",
                "CUBLAS_VERSION": "13.1.0.3",
                "PYTORCH_TRITON_VERSION": "3.4.0+gitc817b9b6",
            },
            arch_lists={"amd64": ARCHS_25_AMD64, "arm64": ARCHS_25_ARM64},
            build_ids={"arm64": "222161059"},
            constraint_file=True,
            sources="[H25.10a][B25.10][T25.10][A25.10x86][G25.10]",
        ),
        # A build-number tail on torch's local version, and the new license text [T26.01][T26.01b][I26.01].
        _pytorch(
            "26.01-py3",
            "2.10.0a0+a36e1d3",
            "2.10.0a0+a36e1d39eb.nv26.01.42222806",
            ubuntu="24.04",
            python="3.12.3",
            env={"CUDA_VERSION": "13.1.1.006", "CUDA_DRIVER_VERSION": "590.48.01"},
            arch_lists={"amd64": ARCHS_25_AMD64, "arm64": ARCHS_25_ARM64},
            constraint_file=True,
            license="sla",
            sources="[T26.01][T26.01b][I26.01][V26.01] (PYTORCH_VERSION: pattern only)",
        ),
        # TensorFlow: the distribution is `tensorflow` with an +nvYY.M local version; the env is bare;
        # NVIDIA_TENSORFLOW_VERSION carries -tf2; no constraint file [TF24.01][RN-P24.05].
        _tensorflow(
            "24.05-tf2-py3",
            "2.15.0",
            ubuntu="22.04",
            python="3.10.12",
            env={"CUDA_VERSION": "12.4.1.003", "CUDNN_VERSION": "9.1.0.70", "NCCL_VERSION": "2.21.5"},
            sources="[RN-P24.05] (TF version ?)",
        ),
        # The last TensorFlow release [TF25.02][TF25.02b][I26.01].
        _tensorflow(
            "25.02-tf2-py3",
            "2.17.0",
            ubuntu="24.04",
            python="3.12.3",
            env={"CUDA_VERSION": "12.8.0.38"},
            build_ids={"amd64": "143088767", "arm64": "143088766"},
            sources="[TF25.02][TF25.02b][I26.01]",
        ),
    )
}

#: Distributions NGC's PyTorch images ship beside torch, as pip lists them (name, version, source), where a public
#: dump records the version: what a stand-in carries as metadata-only distributions (tests/testbed/bundled.py), so
#: that a recipe asking for torchvision meets the base's own, as on nvcr.io. A release or a package with no
#: recorded version is left out, never guessed (apex's version, DALI's before 26.07, torchaudio's).
BUNDLED: dict[str, tuple[tuple[str, str, str], ...]] = {
    "pytorch:25.06-py3": (
        ("torchvision", "0.22.0a0+95f10a4e", "[C25.06]"),
        ("pytorch-triton", "3.3.0+git96316ce52.nvinternal", "[C25.06]"),
    ),
    "pytorch:25.08-py3": (("pytorch-triton", "3.3.1+gitc8757738", "[TRTLLM-M]"),),
    "pytorch:25.10-py3": (
        ("torchvision", "0.24.0a0+094e7af5", "[DYNAMO]"),
        ("flash-attn", "2.7.4.post1+25.10", "[DYNAMO]"),
        ("pytorch-triton", "3.4.0+gitc817b9b6", "[H25.10a]"),
    ),
    "pytorch:26.07-py3": (
        ("transformer-engine", "2.17", "[H26.07] TRANSFORMER_ENGINE_VERSION"),
        ("nvidia-dali-cuda130", "2.2.0", "[H26.07] DALI_VERSION; the name as 25.10 lists it [H25.10a]"),
    ),
}

#: torchvision's public version beside the bed's torch: PyPI's torchvision 0.28.0 requires torch==2.13.0, the torch the
#: bed installs (tests/testbed/up). NGC builds both from source, so its torchvision is an `a0` pre-release like its
#: torch; the stand-ins' torchvision follows their torch as NGC's follows its own.
BED_TORCHVISION_PUBLIC = "0.28.0a0"
#: The CUDA stand-in's compiler: the nvcc of its CUDA runtime's series (13.0, as the torch it carries was built with),
#: and what nvcc needs to compile device code (cicc in nvidia-nvvm, the crt headers), from PyPI; unpacked where NGC's
#: toolkit is, /usr/local/cuda, as system files no installer lists (tests/testbed/ngc_shape.py).
CUDA_STANDIN_NVCC = ("nvidia-cuda-nvcc==13.0.88", "nvidia-cuda-crt==13.0.88", "nvidia-nvvm==13.0.88")
#: Real wheels the CUDA stand-in's release layer installs (without dependencies) over its frozen framework image:
#: PyPI's torchvision built for its torch (2.13.0, CUDA 13), shaped as NGC's (`bundled_standin`), with the Pillow it
#: imports (NGC's constraint file lists one [H26.07]: PyPI's, unversioned in any dump), and the compiler.
#: The CPU stand-ins get no real torchvision: PyPI's is the CUDA build, whose extension does not load beside a CPU
#: torch, and the CPU build is not on PyPI; theirs is metadata only.
CUDA_STANDIN_WHEELS = ("torchvision==0.28.0", "pillow==13.0.0", *CUDA_STANDIN_NVCC)


def bundled_standin(key: str) -> tuple[str, ...]:
    """`name==version` of what the stand-in of release `key` carries beside its framework, as metadata-only
    distributions (tests/testbed/bundled.py): torchvision in every PyTorch release (NGC ships it in each), its
    public version the bed's torch's companion and every other part of the string the release's own where
    recorded; the rest of what the release records (`BUNDLED`) as NGC names and versions it."""
    real = REAL[key]
    if real.framework != "pytorch":
        return ()
    recorded = {name: version for name, version, _ in BUNDLED.get(key, ())}
    local = recorded.pop("torchvision", "").partition("+")[2]
    torchvision = BED_TORCHVISION_PUBLIC + (f"+{local}" if local else "")
    return (f"torchvision=={torchvision}", *(f"{name}=={version}" for name, version in sorted(recorded.items())))


#: The releases the test bed builds, and what each needs (the CUDA one needs the CUDA stand-in).
STANDIN_KEYS = (
    "pytorch:23.10-py3",
    "pytorch:24.05-py3",
    "pytorch:26.01-py3",
    "tensorflow:24.05-tf2-py3",
    "tensorflow:25.02-tf2-py3",
)
CUDA_STANDIN_KEY = "pytorch:25.10-py3"

#: (fact, real value, stand-in value, why the difference cannot hide a bug): README's table.
DIFFERENCES = (
    (
        "OS and Python",
        "Ubuntu 22.04 / Python 3.10 (<= 24.10), Ubuntu 24.04 / Python 3.12 (>= 25.01) [E23.10][T25.01]",
        "Debian 12 / Python 3.11 (mmdebstrap, or debootstrap: no Ubuntu mirror is reachable here)",
        "the same Debian layout (`/usr/bin/python3`, `/usr/local/lib/python3.X/dist-packages`, no venv); "
        "PATH and LD_LIBRARY_PATH carry `python3.11` in NGC's shape, so the Python is found the same way",
    ),
    (
        "the framework's public version",
        "torch 2.1.0a0 ... 2.10.0a0 [VLLM1781][T24.10][T25.10][T26.01]; TensorFlow 2.17.0 [TF25.02b]",
        "torch 2.13.0a0 (PyPI's 2.13.0 renamed), TensorFlow 2.21 (PyPI's tensorflow-cpu renamed)",
        "every other part of the string is NGC's: the `a0` pre-release, the short env hash, torch's "
        "`<hash>.nvYY.MM` local version (`.nv26.01.42222806` too), the metadata's `nv24.5`, TensorFlow's "
        "`+nvYY.M` distribution and bare env; the real strings are tested at unit level (tests/ngc_facts.py)",
    ),
    (
        "CUDA, cuDNN, NCCL in the CPU stand-ins",
        "installed under /usr/local/cuda and /usr/lib/<arch>-linux-gnu [RN-25.12][B26.03]",
        "absent: the env says the real versions, nothing is installed",
        "the library checks run for real on the CUDA stand-in (25.10); the CPU ones prove everything but CUDA",
    ),
    (
        "CUDA libraries in the CUDA stand-in (25.10)",
        "system libraries, no `nvidia-*` wheels; cuDNN 9.14.0.64, NCCL 2.27.7 [H25.10a]",
        "NVIDIA's `nvidia-*-cu13` wheels from PyPI (CUDA runtime 13.0, cuDNN 9.20, NCCL 2.29); CUDA_VERSION is "
        "the real `13.0.2.006`, CUDNN_VERSION and NCCL_VERSION say what is installed, in NGC's forms",
        "the constraint file leaves the wheels out, as NGC's has no such lines; the library checks compare what "
        "loads with the env (CUDA to major.minor, cuDNN to three fields), as on a real image",
    ),
    (
        "torchvision, pytorch-triton and the rest of NGC's Python stack",
        "about 200 distributions, among them 25.10's `torchvision==0.24.0a0+094e7af5`, `flash-attn==2.7.4.post1+25.10`"
        " and `pytorch-triton==3.4.0+gitc817b9b6` [DYNAMO][H25.10a], listed in the constraint file from 25.03 [C25.06]",
        f"torchvision in every PyTorch stand-in at {BED_TORCHVISION_PUBLIC} (the release made for the bed's torch, "
        "in NGC's `a0` form, with the release's own local label where recorded): real on the CUDA stand-in (PyPI's "
        "build for its torch, renamed so), metadata only on the CPU ones (PyPI has no CPU build of it); the rest a "
        "release records (`BUNDLED`: 25.10's flash-attn and pytorch-triton) as NGC names and versions them, metadata "
        "only (tests/testbed/bundled.py); what no dump versions (apex, transformer-engine and DALI before 26.07, "
        "torchaudio) is absent, never guessed. The constraint file and every freeze list them as NGC's do",
        "pip and uv resolve against them as on nvcr.io: an unpinned `torchvision` is met by the base's own, a "
        "pinned PyPI release conflicts with it. Shape only on the CPU stand-ins: a package that imports torchvision "
        "as it is imported (timm) fails the import check there, as on no real release; such sets are judged on the "
        "CUDA stand-in, whose torchvision imports",
    ),
    (
        "the CUDA compiler",
        "`/usr/local/cuda/bin/nvcc` of the image's CUDA, with a C++ compiler beside it (nvcc V13.4.59 in 26.09 "
        "[F26.09])",
        "the CUDA stand-in: NVIDIA's nvcc of its CUDA series from PyPI (" + ", ".join(CUDA_STANDIN_NVCC) + ") "
        "unpacked into /usr/local/cuda with the CUDA runtime's headers, as system files (no distribution); the CPU "
        "stand-ins: none; no stand-in has a C++ compiler or the toolkit's other headers (CCCL)",
        "a CUDA extension's setup.py finds nvcc where NGC's is and reads its CUDA version; compiling it here also "
        "needs `apt: [g++]`, which imgbuild names, and fails where it needs CCCL: the bed proves the words, real NGC "
        "the compile",
    ),
    (
        "platforms",
        "amd64 and arm64 images whose configs differ (arch list, build id) [H25.10a][TF25.02]",
        "a manifest list with the amd64 image and an arm64 image: for 24.05 a real one (`up --all`: an arm64 "
        "Debian 12 with PyPI's CPU-only torch 2.7.1 for aarch64, built under qemu), for the other releases a config-only image carrying NGC's arm64 config",
        "arm64 builds and smoke tests run for real under qemu on 24.05 (no GPU; the report says what emulatio"
        "n cannot prove); registry code, `tags` and fleet checks read every arm64 config as they would. The arm64 torch is older than the amd64 one: its version string is the amd64 one's, as NGC ships one version on both",
    ),
    (
        "GPU, driver and compat library",
        "`/usr/local/cuda/compat`, the driver through the NVIDIA Container Toolkit [H25.10a][H26.07][ENTRY]",
        "none: the entrypoint finds no driver and exports NVIDIA_CPU_ONLY=1, as NGC's does without a GPU",
        "GPU checks report `skip: no GPU visible`; docs/smoke-on-gpu.md is the plan on hardware",
    ),
)


# --- what the test bed builds from these facts ------------------------------------------------------------


def standin_version(real: str, public: str) -> str:
    """The real version string with the stand-in's public version: `2.4.0a0+07cecf4168.nv24.05` with
    `2.13.0a0` -> `2.13.0a0+07cecf4168.nv24.05` (every NGC part of the shape kept)."""
    head, plus, local = real.partition("+")
    return public + plus + local


def standin(key: str, public: str) -> dict:
    """The stand-in of one release, given the public version of the framework it has installed."""
    real = REAL[key]
    python = "3.11"
    out_env = {}
    for platform in ("amd64", "arm64"):
        env = real.config_env(platform)
        env.update(_paths(python))
        env[real.version_env] = standin_version(env[real.version_env], public)
        if real.framework == "pytorch":
            env["PYTORCH_BUILD_VERSION"] = env["PYTORCH_VERSION"]
        out_env[platform] = env
    labels = {p: real.labels(p) for p in ("amd64", "arm64")}
    for p in labels:
        if real.framework == "pytorch":
            labels[p]["com.nvidia.pytorch.version"] = out_env[p]["PYTORCH_VERSION"]
        labels[p]["org.imgbuild.testbed.standin"] = "true"
    return {
        "key": key,
        "repo": real.repo,
        "tag": real.tag,
        "framework": real.framework,
        "release": real.release,
        "env": out_env,
        "labels": labels,
        "module_version": standin_version(real.module_version, public),
        "dist_name": real.dist_name,
        "dist_version": _pip_form(standin_version(real.dist_version, public)),
        "constraint_file": real.constraint_file,
        "original_constraint_file": real.original_constraint_file,
        "bundled": list(bundled_standin(key)),
        "wheels": list(CUDA_STANDIN_WHEELS) if key == CUDA_STANDIN_KEY else [],
        "nvcc": CUDA_STANDIN_NVCC[0].partition("==")[2].split(".")[0] if key == CUDA_STANDIN_KEY else "",
        "license": real.license,
        "build_id": real.build_ids.get("amd64", ""),
    }


#: The bed installs PyPI's torch 2.13.0 (tests/testbed/up): what the 24.05 stand-in then reports, for tests.
BED_TORCH_PUBLIC = "2.13.0a0"
BED_24_05 = standin("pytorch:24.05-py3", BED_TORCH_PUBLIC)
BED_TORCH = BED_24_05["module_version"]  # torch.__version__: 2.13.0a0+07cecf4168.nv24.05
BED_TORCH_ENV = BED_24_05["env"]["amd64"]["PYTORCH_VERSION"]  # PYTORCH_VERSION: 2.13.0a0+07cecf4
BED_TORCH_DIST = BED_24_05["dist_version"]  # pip's form: 2.13.0a0+07cecf4168.nv24.5


def main(argv: list[str]) -> int:
    """`python3 ngc_facts.py standin KEY PUBLIC`: the stand-in's facts as JSON (for tests/testbed/up)."""
    if len(argv) == 4 and argv[1] == "standin":
        print(json.dumps(standin(argv[2], argv[3])))
        return 0
    if len(argv) == 3 and argv[1] == "wheels":
        print(" ".join(standin(argv[2], "0")["wheels"]))
        return 0
    if len(argv) == 2 and argv[1] == "keys":
        print(" ".join(STANDIN_KEYS))
        return 0
    print("usage: ngc_facts.py standin KEY PUBLIC | wheels KEY | keys", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))


def readme_table() -> str:
    """README's "How the stand-ins differ": the releases the bed builds, then each difference (fact, real value
    with its source, stand-in value, why it cannot hide a bug). tests/test_docs_run.py keeps README equal to it."""
    releases = [REAL[k] for k in (*STANDIN_KEYS[:2], CUDA_STANDIN_KEY, *STANDIN_KEYS[2:])]
    rows = [
        "| release | what it stands for | real facts copied (sources in ngc-real-facts.md) |",
        "|---|---|---|",
    ]
    for r in releases:
        fw = f"{r.version_env}={r.env[r.version_env]}, {r.framework} {r.module_version} (pip: {r.dist_version})"
        extra = "constraint file" if r.constraint_file else "no constraint file"
        rows.append(f"| `{r.repo}:{r.tag}` | Ubuntu {r.ubuntu}, Python {r.python}; {fw}; {extra} | {r.sources} |")
    rows += [
        "",
        "| fact | real value (source) | stand-in value | why the difference cannot hide a bug |",
        "|---|---|---|---|",
    ]
    rows += [f"| {fact} | {real} | {standin_value} | {why} |" for fact, real, standin_value, why in DIFFERENCES]
    return "\n".join(rows) + "\n"
