"""The driver matrix docs/gpus.md shows: which driver branch runs which NGC release, on data-center GPUs and on
GeForce and workstation GPUs, judged by the same rule as `smoke --for` and `tags --compatible` (fleet.driver_verdict)
from the support table. `python -m imgbuild.gpu.matrix` prints it; a test holds docs/gpus.md to it."""

from __future__ import annotations

from imgbuild.gpu.fleet import cuda_of, driver_verdict

#: NGC PyTorch releases and the CUDA each ships (CUDA_VERSION of its image; NGC's release notes and
#: shared ngc-real-facts: 23.10 12.2, 24.05 12.4, 25.03 12.8, 25.06 12.9, 25.10 13.0, 26.01 13.1, 26.03 13.2,
#: 26.09 13.4).
NGC_RELEASES: tuple[tuple[str, str], ...] = (
    ("23.10", "12.2"),
    ("24.05", "12.4"),
    ("25.03", "12.8"),
    ("25.06", "12.9"),
    ("25.10", "13.0"),
    ("26.01", "13.1"),
    ("26.03", "13.2"),
    ("26.09", "13.4"),
)

#: One released driver of each branch, as hosts run them.
DRIVERS: tuple[str, ...] = (
    "470.256.02",
    "525.147.05",
    "535.274.02",
    "550.163.01",
    "560.35.03",
    "565.57.01",
    "570.195.03",
    "575.64.05",
    "580.95.05",
    "590.44.01",
    "595.45.04",
    "610.43.02",
)


def cell(cuda: str, driver: str) -> str:
    """`all` (every GPU the release has kernels for), `data center` (forward compatibility), or `no`."""
    version = cuda_of(cuda)
    assert version is not None
    if driver_verdict(version, driver, datacenter=False)[0]:
        return "all"
    if driver_verdict(version, driver, datacenter=True)[0]:
        return "data center"
    return "no"


def markdown() -> str:
    head = "| NGC release (CUDA) | " + " | ".join(f"R{d.split('.')[0]}" for d in DRIVERS) + " |"
    rule = "|---" * (len(DRIVERS) + 1) + "|"
    rows = [
        f"| {release} ({cuda}) | " + " | ".join(cell(cuda, d) for d in DRIVERS) + " |" for release, cuda in NGC_RELEASES
    ]
    return "\n".join([head, rule, *rows]) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
