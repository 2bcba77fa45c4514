"""The shared-memory check: /dev/shm large enough for data loaders and NCCL."""

from __future__ import annotations

import os

from .report import Warn

SHM_DEFAULT_BYTES = 64 * 1024 * 1024


def check_shm() -> dict:
    st = os.statvfs("/dev/shm")
    size = st.f_frsize * st.f_blocks
    mib = size // (1024 * 1024)
    if size <= SHM_DEFAULT_BYTES:
        raise Warn(
            f"/dev/shm is {mib} MiB (Docker's default): DataLoader workers and NCCL need more; "
            "run with --ipc host or --shm-size (imgbuild run does)"
        )
    return {"shm_mib": mib, "reason": f"/dev/shm is {mib} MiB"}
