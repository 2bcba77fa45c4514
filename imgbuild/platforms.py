"""The platforms imgbuild builds for: a closed set, matched whole, and what each is called where.

NGC's PyTorch and TensorFlow tags are manifest lists of linux/amd64 and linux/arm64 (Grace: GH200, GB200, GB300,
DGX Spark). `--platform` takes those two and nothing else; an image of another platform is refused in one line
before any engine is asked.
"""

from __future__ import annotations

import re

from imgbuild.errors import UsageError

#: Every platform imgbuild builds, by its OCI name; the CPU architecture is the part after `linux/`.
PLATFORMS = ("linux/amd64", "linux/arm64")
#: OCI's variant spelling of arm64 (`linux/arm64/v8`) names the same platform.
_SPELLINGS = {"linux/amd64": "linux/amd64", "linux/arm64": "linux/arm64", "linux/arm64/v8": "linux/arm64"}
#: What kernels, engines and registries call each architecture: `uname -m`, Docker's `Architecture`, OCI's.
_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
#: qemu-user's name for each architecture (its binfmt_misc entry is `qemu-<name>`).
QEMU_NAMES = {"amd64": "x86_64", "arm64": "aarch64"}
_LIST = re.compile(r"[a-z0-9/]{1,20}(?:,[a-z0-9/]{1,20}){0,3}")


def parse_platforms(text: str, field: str = "--platform") -> tuple[str, ...]:
    """`linux/amd64,linux/arm64` -> ("linux/amd64", "linux/arm64"): each one of PLATFORMS, none twice, in the
    order given. Anything else (another platform, a space, a letter outside ASCII, an empty entry) is refused."""
    choices = ", ".join(PLATFORMS)
    if not _LIST.fullmatch(text):
        shown = text[:40].encode("ascii", "backslashreplace").decode()
        raise UsageError(f"{field}: {shown!r} is not a comma-separated list of platforms ({choices})")
    out: list[str] = []
    for item in text.split(","):
        platform = _SPELLINGS.get(item)
        if platform is None:
            raise UsageError(f"{field}: {item} is not a platform imgbuild builds ({choices})")
        if platform in out:
            raise UsageError(f"{field}: {item} is named twice")
        out.append(platform)
    return tuple(out)


def arch_of(platform: str) -> str:
    """`linux/arm64` -> `arm64`."""
    return platform.rsplit("/", 1)[-1]


def arch_of_machine(machine: str) -> str:
    """A CPU architecture as OCI names it, from what a kernel or an engine calls it (`x86_64` -> `amd64`);
    "" for one imgbuild does not know."""
    return _ARCHES.get(machine.strip().lower(), "")


def platform_of_machine(machine: str) -> str:
    """The platform of a machine as its kernel or engine names it (`x86_64`, `aarch64`, `amd64`); "" unknown."""
    arch = arch_of_machine(machine)
    return f"linux/{arch}" if arch else ""
