"""Which foreign platforms this machine's kernel can run: qemu-user registered with binfmt_misc.

An arm64 image built on an amd64 runner runs its `RUN` steps, and its smoke test, under qemu (Debian's
qemu-user-static). The entry must carry the F flag (the kernel opens the emulator when it is registered), so that
a container, whose root file system has no qemu in it, can use it.
"""

from __future__ import annotations

from pathlib import Path

from imgbuild.platforms import QEMU_NAMES, arch_of

BINFMT = Path("/proc/sys/fs/binfmt_misc")


def emulator(platform: str, binfmt: Path = BINFMT) -> str:
    """The registered emulator that runs `platform`'s programs in containers here, "" where there is none (not
    registered, disabled, or without the F flag). binfmt_misc's files are the kernel's: a few lines, read bounded."""
    name = QEMU_NAMES.get(arch_of(platform))
    if name is None:
        return ""
    try:
        with open(binfmt / f"qemu-{name}", "rb") as fh:
            lines = fh.read(4096).decode("ascii", "replace").splitlines()
    except OSError:
        return ""
    fields = dict(line.split(" ", 1) for line in lines[1:] if " " in line)
    flags = fields.get("flags:", "")
    if not lines or lines[0] != "enabled" or "F" not in flags:
        return ""
    return fields.get("interpreter", "").strip()


def missing_emulator(platform: str) -> str:
    """What to do where `platform` cannot run here: one line."""
    name = QEMU_NAMES.get(arch_of(platform), arch_of(platform))
    return (
        f"{platform} images run here only under emulation, and no qemu-{name} is registered with binfmt_misc (with "
        f"the F flag): install qemu-user-static (Debian, Ubuntu: apt install qemu-user-static), or build on a "
        f"{platform} runner"
    )
