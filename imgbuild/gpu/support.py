"""NVIDIA's support table as data (support.json beside this module, each row citing its source): which GPUs
exist by the names people type, which driver branches drive each architecture, what each CUDA release needs of the
driver natively (and, as its own fact, the floor of minor-version compatibility in each CUDA major), which older
data-center branches run it through forward compatibility (one list per CUDA release, as NVIDIA's own images
declare it), and what Jetson's drivers, numbered on a scale of their own, run. The fleet check,
`smoke --for`, `tags --compatible`, `bump` and `doctor` all read it from here.

The table is checked when it is read: a malformed row is a one-line error naming it, never a wrong verdict.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgbuild.gpu.toolkit import version_tuple

TABLE = Path(__file__).with_name("support.json")
_CAPABILITY = re.compile(r"([0-9]{1,2})\.([0-9])")
_DRIVER = re.compile(r"[0-9]{3}(\.[0-9]{1,3}){0,2}")
_CUDA = re.compile(r"([0-9]{1,2})(?:\.([0-9]{1,2}))?")


class BadTable(ValueError):
    """The support table has a row imgbuild cannot read; the message names it."""


@dataclass(frozen=True)
class GpuModel:
    name: str
    capability: tuple[int, int]
    datacenter: bool  # data-center GPUs can run newer CUDA on older drivers (forward compatibility)
    cpu: str = "any"  # the host's CPU architecture where it is fixed: Grace, DGX Spark and Jetson are arm64
    tensor_cores: bool = True  # the GTX 16 series (Turing without tensor cores), Pascal and older: none
    min_driver: str = ""  # a full driver version NVIDIA requires for this model within its branch (HGX B200)
    source: str = ""


@dataclass(frozen=True)
class SupportTable:
    models: dict[str, GpuModel]
    arch_branches: dict[tuple[int, int], tuple[int, int | None]]
    cuda_min_capability: dict[int, tuple[int, int]]
    cuda_min_driver: dict[tuple[int, int], str]
    forward_compat: dict[tuple[int, int], tuple[str, ...]]
    sources: dict[str, str]
    minor_floor: dict[int, str] = field(default_factory=dict)  # per CUDA major: minor-version compatibility's floor
    tegra_drivers: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)  # model -> driver -> CUDA

    def forward_branches(self, cuda: tuple[int, int]) -> tuple[str, ...]:
        """The data-center branches that run `cuda` through forward compatibility. NVIDIA declares one list per
        CUDA release and the lists shrink as branches reach their end, so: the release's own row; for a release
        between two rows of its major, only the branches both neighbours allow (each at the stricter minimum);
        past the newest row, that row; before the oldest, that row."""
        rows = sorted(k for k in self.forward_compat if k[0] == cuda[0])
        if cuda in self.forward_compat:
            return self.forward_compat[cuda]
        below = [k for k in rows if k < cuda]
        above = [k for k in rows if k > cuda]
        if below and above:
            return _both_allow(self.forward_compat[below[-1]], self.forward_compat[above[0]])
        key = below[-1] if below else (above[0] if above else None)
        return self.forward_compat[key] if key else ()

    def minor_version_floor(self, major: int) -> str | None:
        """The oldest driver that runs any CUDA `major`.x release by minor-version compatibility (its SASS only)."""
        return self.minor_floor.get(major) or self.cuda_min_driver.get((major, 0))

    def tegra_cuda(self, model: str, driver: str) -> tuple[int, int] | None:
        """The CUDA release a Jetson's own driver runs natively (JetPack's numbering): that of the model's newest
        recorded JetPack driver of the same branch at or below it (a later JetPack update runs at least what its
        predecessor did); None where the driver is below every one of that model's releases in its branch."""
        have = version_tuple(driver)
        known = [
            (version_tuple(own), cuda)
            for own, cuda in self.tegra_drivers.get(model, {}).items()
            if version_tuple(own)[:1] == have[:1] and version_tuple(own) <= have
        ]
        return max(known)[1] if known else None


def _branch(version: str) -> int:
    return version_tuple(version)[0]


def _both_allow(older: tuple[str, ...], newer: tuple[str, ...]) -> tuple[str, ...]:
    """The branches two forward-compatibility lists share, each at the higher of its two minimums."""
    mins = {_branch(v): v for v in newer}
    return tuple(max(v, mins[_branch(v)], key=version_tuple) for v in older if _branch(v) in mins)


def _capability(text: Any, where: str) -> tuple[int, int]:
    match = _CAPABILITY.fullmatch(str(text))
    if not isinstance(text, str) or not match:
        raise BadTable(f"{where}: capability {str(text)[:20]!r} is not MAJOR.MINOR")
    return int(match.group(1)), int(match.group(2))


def _driver(text: Any, where: str) -> str:
    if not isinstance(text, str) or not _DRIVER.fullmatch(text):
        raise BadTable(f"{where}: driver {str(text)[:20]!r} is not an NVIDIA driver version")
    return text


def _cuda(text: Any, where: str) -> tuple[int, int]:
    match = _CUDA.fullmatch(str(text))
    if not isinstance(text, str) or not match:
        raise BadTable(f"{where}: cuda {str(text)[:20]!r} is not MAJOR.MINOR")
    return int(match.group(1)), int(match.group(2) or 0)


def _source(row: Any, sources: dict[str, str], where: str) -> str:
    if not isinstance(row, dict) or row.get("source") not in sources:
        raise BadTable(f"{where}: names no source of the table's")
    return str(row["source"])


def _models(rows: list[Any], sources: dict[str, str]) -> dict[str, GpuModel]:
    models: dict[str, GpuModel] = {}
    for i, row in enumerate(rows):
        where = f"support table models[{i}]"
        _source(row, sources, where)
        if not re.fullmatch(r"[a-z0-9]{2,20}", str(row.get("key", ""))):
            raise BadTable(f"{where}: needs a key of lower-case letters and digits")
        if not isinstance(row.get("datacenter"), bool) or row.get("cpu", "any") not in ("any", "amd64", "arm64"):
            raise BadTable(f"{where}: datacenter must be true or false, cpu any, amd64 or arm64")
        models[row["key"]] = GpuModel(
            str(row.get("name") or row["key"])[:80],
            _capability(row.get("capability"), where),
            row["datacenter"],
            row.get("cpu", "any"),
            bool(row.get("tensor_cores", True)),
            _driver(row["min_driver"], where) if row.get("min_driver") else "",
            str(row["source"]),
        )
    return models


def _minor_floors(rows: list[Any], sources: dict[str, str]) -> dict[int, str]:
    floors: dict[int, str] = {}
    for i, row in enumerate(rows):
        where = f"support table cuda_minor_floor[{i}]"
        _source(row, sources, where)
        floors[_cuda(row.get("cuda"), where)[0]] = _driver(row.get("driver"), where)
    return floors


def _tegra_drivers(
    rows: list[Any], sources: dict[str, str], models: dict[str, GpuModel]
) -> dict[str, dict[str, tuple[int, int]]]:
    tegra: dict[str, dict[str, tuple[int, int]]] = {}
    for i, row in enumerate(rows):
        where = f"support table tegra_drivers[{i}]"
        _source(row, sources, where)
        if row.get("model") not in models or models[row["model"]].cpu != "arm64":
            raise BadTable(f"{where}: model must be a Jetson of the table's models")
        tegra.setdefault(row["model"], {})[_driver(row.get("driver"), where)] = _cuda(row.get("cuda"), where)
    return tegra


def parse(data: Any) -> SupportTable:
    """The table from its JSON document; BadTable naming the first row that is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("sources"), dict):
        raise BadTable("support table: not an object with sources")
    sources = {str(k): str(v) for k, v in data["sources"].items()}
    models = _models(data.get("models") or [], sources)
    branches: dict[tuple[int, int], tuple[int, int | None]] = {}
    for i, row in enumerate(data.get("arch_branches") or []):
        where = f"support table arch_branches[{i}]"
        _source(row, sources, where)
        first, last = row.get("first"), row.get("last")
        if not isinstance(first, int) or not (last is None or isinstance(last, int)):
            raise BadTable(f"{where}: first and last must be branch numbers (last null while supported)")
        branches[_capability(row.get("capability"), where)] = (first, last)
    minimum: dict[int, tuple[int, int]] = {}
    for i, row in enumerate(data.get("cuda_min_capability") or []):
        where = f"support table cuda_min_capability[{i}]"
        _source(row, sources, where)
        minimum[_cuda(row.get("cuda"), where)[0]] = _capability(row.get("capability"), where)
    drivers: dict[tuple[int, int], str] = {}
    for i, row in enumerate(data.get("cuda_min_driver") or []):
        where = f"support table cuda_min_driver[{i}]"
        _source(row, sources, where)
        drivers[_cuda(row.get("cuda"), where)] = _driver(row.get("driver"), where)
    forward: dict[tuple[int, int], tuple[str, ...]] = {}
    for i, row in enumerate(data.get("forward_compat") or []):
        where = f"support table forward_compat[{i}]"
        _source(row, sources, where)
        if not isinstance(row.get("branches"), list):
            raise BadTable(f"{where}: branches must be a list")
        forward[_cuda(row.get("cuda"), where)] = tuple(_driver(b, where) for b in row["branches"])
    floors = _minor_floors(data.get("cuda_minor_floor") or [], sources)
    tegra = _tegra_drivers(data.get("tegra_drivers") or [], sources, models)
    return SupportTable(models, branches, minimum, drivers, forward, sources, floors, tegra)


def load(path: Path = TABLE) -> SupportTable:
    try:
        return parse(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise BadTable(f"{path}: {exc}") from None


SUPPORT = load()
GPU_MODELS = SUPPORT.models
ARCH_DRIVER_BRANCHES = SUPPORT.arch_branches
CUDA_MIN_CAPABILITY = SUPPORT.cuda_min_capability
CUDA_MIN_DRIVER = SUPPORT.cuda_min_driver
