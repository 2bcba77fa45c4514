"""The NVIDIA Container Toolkit, from the images' side: which releases fix a container escape, and whether an image
that sets a preload (LD_PRELOAD, LD_AUDIT: NVIDIAScape, CVE-2025-23266) may start on this host. `doctor`, the smoke
test and `run` ask here."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

from imgbuild.facts import LOADER_ENV

#: NVIDIA Container Toolkit releases that fix a container escape (NVIDIA security bulletins): a toolkit older
#: than the fix is refused by `doctor` with the advisory's name.
TOOLKIT_ADVISORIES = (
    (
        "1.17.8",
        "CVE-2025-23266 (NVIDIAScape: an image's LD_PRELOAD runs on the host through the createContainer "
        "hook) and CVE-2025-23267",
    ),
    ("1.16.2", "CVE-2024-0132 (a crafted image's symlinks reach the host's files, TOCTOU)"),
)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"[0-9]+", text)[:3])


def preload_verdict(image_env: list[str], toolkit: str | None, gpu_host: bool) -> tuple[str, str] | None:
    """("fail" | "warn", why) for an image whose config sets LD_PRELOAD or LD_AUDIT (NVIDIAScape): refused on a
    GPU host whose toolkit is 1.17.7 or older (or unknown), said elsewhere; None for an image that sets neither."""
    names = _preloads(image_env)
    if not names:
        return None
    what = f"the image's config sets {' and '.join(names)}"
    fixed = TOOLKIT_ADVISORIES[0][0]
    if gpu_host and (toolkit is None or version_tuple(toolkit) < version_tuple(fixed)):
        have = f"NVIDIA Container Toolkit {toolkit}" if toolkit else "a toolkit of unknown version"
        return "fail", (
            f"{what}; on this host ({have}) it would run code on the host through the toolkit's hook "
            f"(CVE-2025-23266): refused until the toolkit is {fixed} or later"
        )
    return "warn", f"{what}: it runs in every process of the container (and on hosts with toolkits before {fixed})"


def _preloads(image_env: list[str]) -> list[str]:
    return sorted({item.split("=", 1)[0] for item in image_env} & LOADER_ENV)


def image_preload_verdict(
    image_env: list[str], gpu_host: Callable[[], bool], local: bool = True
) -> tuple[str, str] | None:
    """`preload_verdict` for an image about to start on the engine's host: the host (its GPUs, then its toolkit) is
    asked only when the image sets a preload at all. `local`: the engine runs on this machine, so this machine's
    toolkit is the host's; for a remote engine it is unknown (this machine's says nothing of it), and refused."""
    if not _preloads(image_env):
        return None
    on_gpus = gpu_host()
    toolkit = toolkit_version() if on_gpus and local else None
    if toolkit is not None and hook_disabled():
        toolkit = TOOLKIT_ADVISORIES[0][0]  # the mitigation NVIDIA's bulletin gives: the hook never runs
    return preload_verdict(image_env, toolkit, on_gpus)


TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
HOOK_FLAG = "disable-cuda-compat-lib-hook"


def hook_disabled(path: str = "") -> bool:
    """Whether the toolkit's config sets `features.disable-cuda-compat-lib-hook = true` (NVIDIA's mitigation for
    CVE-2025-23266 on 1.17.x): the createContainer hook that runs an image's preload is then never started."""
    try:
        with open(path or TOOLKIT_CONFIG, encoding="utf-8") as handle:
            text = handle.read(256 * 1024)
    except OSError:
        return False
    section = ""
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[] ")
            continue
        key, _, value = line.partition("=")
        name = key.strip().strip('"')
        if (
            section == "features"
            and name == "disable-cuda-compat-lib-hook"
            or name == "features.disable-cuda-compat-lib-hook"
        ):
            return value.strip().lower() == "true"
    return False


def command_output(args: list[str]) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def toolkit_version() -> str | None:
    for args in (["nvidia-ctk", "--version"], ["nvidia-container-cli", "--version"]):
        found = re.search(r"version:?\s*v?([0-9]+\.[0-9]+\.[0-9]+)", command_output(args), re.IGNORECASE)
        if found:
            return found.group(1)
    return None
