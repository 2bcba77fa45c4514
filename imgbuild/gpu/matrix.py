"""The matrices docs/gpus.md shows, made from the support table by the verdict `smoke --for`, `tags --compatible`,
`bump` and promotion use (fleet.judge_tag; its driver rule, fleet.driver_verdict, for the summary):

- which driver branch runs which NGC release, on data-center GPUs and on GeForce and workstation GPUs;
- per GPU model, per NGC release and driver branch: runs natively, through forward compatibility only, from which
  driver of the branch on, or not, and why not (no kernels for the GPU, or the driver);
- Jetson models on their own JetPack drivers.

`python -m imgbuild.gpu.matrix` prints them, `--write docs/gpus.md` rewrites them there; a test holds the docs to
it. Nothing here decides a verdict: a cell is what judge_tag says at the driver versions the table names within
each branch (its verdict can change at no other version), so the documents cannot drift from the rule.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from imgbuild.gpu.fleet import Target, cuda_of, driver_verdict, judge_tag, parse_target
from imgbuild.gpu.support import SUPPORT, SupportTable
from imgbuild.gpu.toolkit import version_tuple
from imgbuild.hostio.regular import write_atomic


@dataclass(frozen=True)
class NgcRelease:
    """An NGC PyTorch release as its image config declares it: CUDA_VERSION and TORCH_CUDA_ARCH_LIST per platform.
    An arch list nobody recorded is empty: the release is then judged only by what its CUDA major builds for."""

    release: str
    cuda: str
    archs: str  # TORCH_CUDA_ARCH_LIST of the amd64 image ("" not recorded)
    arm64_archs: str = ""  # the arm64 image's ("" not recorded)
    source: str = ""

    @property
    def variants(self) -> dict[str, dict[str, str]]:
        """The arm64 image's facts: GPUs that come only in arm64 machines are judged on them (an arch list not
        recorded is judged by what the CUDA major builds for, never on the amd64 image's list)."""
        return {"arm64": {"cuda": self.cuda, "arch_list": self.arm64_archs}}


_NGC_24 = "5.2 6.0 6.1 7.0 7.2 7.5 8.0 8.6 8.7 9.0+PTX"
_NGC_25 = "7.5 8.0 8.6 9.0 10.0 12.0+PTX"

#: NGC PyTorch releases, their CUDA and arch lists (NGC's release notes; the image env dumps cited in the shared
#: NGC facts: 23.10 [E23.10], 24.05 [ARCH24], 25.10 amd64 [A25.10x86] and arm64 [H25.10a], 26.07 [H26.07]).
NGC_RELEASES_FACTS: tuple[NgcRelease, ...] = (
    NgcRelease("23.10", "12.2", _NGC_24, source="env dump of 23.10"),
    NgcRelease("24.05", "12.4", _NGC_24, source="2024 NGC arch list (same as 23.10)"),
    NgcRelease("25.03", "12.8", "", source="CUDA from the release notes; arch list not recorded"),
    NgcRelease("25.06", "12.9", "", source="CUDA from the release notes; arch list not recorded"),
    NgcRelease("25.10", "13.0", _NGC_25, "8.0 8.6 9.0 10.0 11.0 12.0+PTX", "env dumps of both platforms' images"),
    NgcRelease("26.01", "13.1", "", source="CUDA_VERSION 13.1.1.006; arch list not recorded"),
    NgcRelease("26.03", "13.2", "", source="CUDA from the release notes; arch list not recorded"),
    NgcRelease("26.07", "13.3", _NGC_25, source="env dump of 26.07 (amd64)"),
    NgcRelease("26.09", "13.4", "", source="nvcc V13.4.59; arch list not recorded"),
)

#: (release, CUDA) pairs, the summary's rows.
NGC_RELEASES: tuple[tuple[str, str], ...] = tuple((r.release, r.cuda) for r in NGC_RELEASES_FACTS)

#: One released driver of each branch, as hosts run them: the summary's columns (each cell of the model matrix
#: covers its whole branch).
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

BRANCHES: tuple[int, ...] = tuple(version_tuple(d)[0] for d in DRIVERS)


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


# --- per model -------------------------------------------------------------------------------------------------


@cache
def branch_probes(branch: int) -> tuple[str, ...]:
    """The driver versions of a branch at which a verdict can change: the branch's first, and each version the
    table names in it (a release's own driver, a minor-version floor, a forward-compatibility minimum, a model's
    own minimum), ascending."""
    named = [
        *SUPPORT.cuda_min_driver.values(),
        *SUPPORT.minor_floor.values(),
        *(v for branches in SUPPORT.forward_compat.values() for v in branches),
        *(m.min_driver for m in SUPPORT.models.values() if m.min_driver),
    ]
    start = f"{branch}.0"
    inside = {v for v in named if version_tuple(v)[:1] == (branch,) and version_tuple(v) > version_tuple(start)}
    return (start, *sorted(inside, key=version_tuple))


def _anonymous(target: Target) -> Target:
    """The target less what names it: its model key is kept only where the table reads drivers by it (Jetson)."""
    return replace(target, label="", model=target.model if target.model in SUPPORT.tegra_drivers else "")


@cache
def _verdict(release: NgcRelease, target: Target, driver: str) -> tuple[bool, str]:
    """(runs, kernels) by judge_tag for one target (anonymous: cached on its facts, not its name)."""
    verdict = judge_tag(release.release, release.cuda, release.archs, [target], driver, (), release.variants)[0]
    return verdict.runs, verdict.kernels


def kind(release: NgcRelease, target: Target, driver: str) -> str:
    """`yes` (runs by the release's own driver or minor-version compatibility), `fc` (through forward
    compatibility only: the same GPU as a GeForce would not run), `no` (the driver), `-` (no kernels for this GPU
    in the release, or no image for its CPU: no driver helps). `*` marks a GPU the release reaches only through
    PTX JIT (the first start is slow)."""
    anonymous = _anonymous(target)
    runs, kernels = _verdict(release, anonymous, "")
    if not runs:
        return "-"
    runs, kernels = _verdict(release, anonymous, driver)
    if not runs:
        return "no"
    jit = "*" if kernels == "ptx" else ""
    if target.datacenter and not _verdict(release, replace(anonymous, datacenter=False), driver)[0]:
        return "fc" + jit
    return "yes" + jit


@cache
def _branch_cell(release: NgcRelease, target: Target, branch: int) -> str:
    regimes: list[tuple[str, str]] = []
    for probe in branch_probes(branch):
        now = kind(release, target, probe)
        if not regimes or regimes[-1][1] != now:
            regimes.append((probe, now))
    if len(regimes) > 1 and regimes[0][1] == "no":
        regimes = regimes[1:]
    start = f"{branch}.0"
    return ", ".join(now if probe == start else f"{now} ≥{probe}" for probe, now in regimes)


def branch_cell(release: NgcRelease, target: Target, branch: int) -> str:
    """What a whole driver branch does for one GPU model and release: each verdict from the driver version it
    starts at (`yes`, `fc`, `no`, `-`; `yes ≥570.26`: from that version on, nothing below it)."""
    return _branch_cell(release, _anonymous(target), branch)


def jetson_models(table: SupportTable = SUPPORT) -> tuple[str, ...]:
    """The models whose drivers are numbered on JetPack's scale (judged on those, not on desktop branches)."""
    return tuple(key for key in table.models if key in table.tegra_drivers)


def desktop_models(table: SupportTable = SUPPORT) -> tuple[str, ...]:
    return tuple(key for key in table.models if key not in table.tegra_drivers)


def model_rows(release: NgcRelease) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(the models, their cell per branch) for one release: models whose every cell agrees share a row, in the
    table's order."""
    rows: dict[tuple[str, ...], list[str]] = {}
    for key in desktop_models():
        cells = tuple(branch_cell(release, parse_target(key), branch) for branch in BRANCHES)
        rows.setdefault(cells, []).append(key)
    return [(tuple(models), cells) for cells, models in rows.items()]


def model_markdown() -> str:
    """One table per NGC release: its GPU models (rows) by driver branch (columns)."""
    parts = []
    for release in NGC_RELEASES_FACTS:
        lists = "; ".join(
            f"{platform} `{archs}`" if archs else f"{platform} arch list not recorded"
            for platform, archs in (("amd64", release.archs), ("arm64", release.arm64_archs))
        )
        parts.append(f"**NGC {release.release}** (CUDA {release.cuda}; {lists})\n")
        parts.append("| GPUs | " + " | ".join(f"R{b}" for b in BRANCHES) + " |")
        parts.append("|---" * (len(BRANCHES) + 1) + "|")
        for models, cells in model_rows(release):
            parts.append(f"| {' '.join(models)} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)


def jetson_markdown(table: SupportTable = SUPPORT) -> str:
    """Jetson models on their own JetPack drivers (rows) by NGC release (columns)."""
    head = "| Jetson (driver: CUDA) | " + " | ".join(r.release for r in NGC_RELEASES_FACTS) + " |"
    lines = [head, "|---" * (len(NGC_RELEASES_FACTS) + 1) + "|"]
    for key in jetson_models(table):
        target = parse_target(key)
        for driver, cuda in sorted(table.tegra_drivers[key].items(), key=lambda item: version_tuple(item[0])):
            label = f"{key} {driver}: {cuda[0]}.{cuda[1]}"
            lines.append(
                f"| {label} | " + " | ".join(kind(release, target, driver) for release in NGC_RELEASES_FACTS) + " |"
            )
    return "\n".join(lines) + "\n"


#: The generated blocks of docs/gpus.md: marker name -> what goes between its markers.
BLOCKS = {"driver-matrix": markdown, "model-matrix": model_markdown, "jetson-matrix": jetson_markdown}
COMMAND = "python -m imgbuild.gpu.matrix --write docs/gpus.md"


def _span(text: str, name: str) -> tuple[int, int]:
    """Where a block's text lies between its markers (ValueError where the document lacks them)."""
    opening = f"<!-- {name}: {COMMAND} -->\n"
    start = text.index(opening) + len(opening)
    return start, text.index(f"<!-- /{name} -->", start)


def block(text: str, name: str) -> str:
    """What a document holds between a block's markers."""
    start, end = _span(text, name)
    return text[start:end]


def rewrite(text: str) -> str:
    """The document with every block made anew."""
    for name, make in BLOCKS.items():
        start, end = _span(text, name)
        text = text[:start] + make() + text[end:]
    return text


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        write_atomic(path, rewrite(path.read_text(encoding="utf-8")), mode=path.stat().st_mode & 0o777)
        return 0
    if argv:
        print(f"usage: {COMMAND}  (no argument: print the blocks)", file=sys.stderr)
        return 2
    print("\n".join(f"<!-- {name} -->\n{make()}" for name, make in BLOCKS.items()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
