"""Will an image run on the GPUs it is meant for? Pure judgement, no GPU needed.

An image's GPU facts (its CUDA version and the archs its framework was compiled for) against targets (GPU
models by name, or compute capabilities) and a driver version. The kernel rule is the smoke script's own
(`payload/smoke/arch.kernels_for`, also used inside images on real GPUs); the driver rule is CUDA's: the release's
own driver, else minor-version compatibility within the CUDA major, else forward compatibility on
data-center GPUs where NGC documents it. `smoke --for`, `tags --compatible`, `bump` and promotion in
`build`/`rebuild` all judge here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from imgbuild.errors import UsageError
from imgbuild.gpu.support import ARCH_DRIVER_BRANCHES, CUDA_MIN_CAPABILITY, CUDA_MIN_DRIVER, GPU_MODELS, SUPPORT
from imgbuild.gpu.toolkit import version_tuple
from imgbuild.payload.smoke.arch import explain_kernels, parse_archs

_CAPABILITY_RE = re.compile(r"(?:sm_([0-9]{1,2})([0-9])|([0-9]{1,2})\.([0-9]))")
_DRIVER_RE = re.compile(r"[0-9]{3}(\.[0-9]{1,3}){1,2}")
_CUDA_RE = re.compile(r"([0-9]{1,2})\.([0-9]{1,2})(\.[0-9.]+)?")


@dataclass(frozen=True)
class Target:
    """One kind of GPU in a fleet: a model by name (`l40s`), or a bare capability (`sm_89`, `8.9`)."""

    label: str
    capability: tuple[int, int]
    datacenter: bool | None = None  # None: not known (given as a capability)
    cpu: str = "any"  # arm64: the GPU comes only in arm64 machines (Grace, DGX Spark, Jetson)
    min_driver: str = ""  # a full version NVIDIA requires for this model within its branch (HGX B200)
    model: str = ""  # the support table's key, where the target is a model: its Jetson drivers are read by it

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


#: AMD's data-centre and Radeon GPUs by name or LLVM target (MI250X, MI300A, gfx90a): out of imgbuild's scope.
AMD_GPU_RE = re.compile(r"(?:amd|instinct)?(?:mi[0-9]{2,3}[a-z]{0,2}|radeon[a-z0-9]*|gfx[0-9a-f]{3,4})")


def _capability(text: str) -> tuple[int, int] | None:
    """A compute capability as `sm_89` or `8.9`, from Kepler (3.x) to well past anything announced; None else."""
    match = _CAPABILITY_RE.fullmatch(text.strip().lower())
    if match is None:
        return None
    major, minor = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    return (int(major), int(minor)) if 3 <= int(major) <= 20 else None


def check_capability(text: str) -> tuple[int, int]:
    """A compute capability as a GPU reader reports it (`8.9`); UsageError naming what is not one."""
    capability = _capability(text) if "." in text else None
    if capability is None:
        raise UsageError(f"compute_cap: {text.strip()[:40]!r} is not a compute capability (3.0 to 20.x, e.g. 8.9)")
    return capability


def parse_target(word: str, flag: str = "--for") -> Target:
    text = word.strip().lower()
    key = text.replace(" ", "").replace("-", "").replace("_", "")
    if key in GPU_MODELS:
        model = GPU_MODELS[key]
        return Target(key, model.capability, model.datacenter, model.cpu, model.min_driver, key)
    capability = _capability(text)
    if capability is not None:
        return Target(text, capability)
    if AMD_GPU_RE.fullmatch(key):
        raise UsageError(
            f"{flag} {word.strip()[:40]!r}: an AMD GPU; NGC images are CUDA builds and cannot use it (imgbuild is for "
            "NVIDIA GPUs: on AMD sites such as LUMI use the site's ROCm containers)"
        )
    raise UsageError(
        f"{flag}: {word.strip()[:40]!r} is not a GPU imgbuild knows; use a compute capability (sm_89 or 8.9) "
        f"or a name such as {', '.join(list(GPU_MODELS)[:12])} ({len(GPU_MODELS)} known: docs/gpus.md)"
    )


_BRAND_WORDS = frozenset({"nvidia", "geforce", "tesla", "jetson", "agx"})  # words that name no model
#: Words in a GPU's name that mark a consumer card: no forward compatibility on those (NGC's support matrix).
_CONSUMER_WORDS = ("GeForce", "TITAN")


def _name_words(name: str) -> tuple[str, ...]:
    return tuple(w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w not in _BRAND_WORDS)


def host_target(name: str, compute_cap: str) -> Target | None:
    """A GPU as a reader saw it (`NVIDIA GeForce RTX 4090`, `8.9`) as a target carrying its model's facts
    (data-center or not, its own minimum driver, Jetson drivers): the table's model whose name's words begin the
    driver's name, of the same capability, the longest such; else a consumer card known as one (no forward
    compatibility), any other name not known either way. None where the reader gave no capability."""
    capability = _capability(compute_cap) if "." in compute_cap else None
    if capability is None:
        return None
    words = _name_words(name)
    best: tuple[int, str] | None = None
    for key, model in GPU_MODELS.items():
        own = _name_words(model.name)
        if own and model.capability == capability and words[: len(own)] == own and (not best or len(own) > best[0]):
            best = (len(own), key)
    label = f"this host's {name}"
    if best is None:
        return Target(label, capability, False if any(w in name for w in _CONSUMER_WORDS) else None)
    model = GPU_MODELS[best[1]]
    return Target(label, capability, model.datacenter, model.cpu, model.min_driver, best[1])


def parse_targets(words: str | Iterable[str], flag: str = "--for") -> list[Target]:
    """`v100,l40s,sm_90` (or a list of such words) as targets, each once, in the order given; a word that names
    no GPU is a usage error naming `flag`."""
    items = words.split(",") if isinstance(words, str) else [w for word in words for w in str(word).split(",")]
    targets: list[Target] = []
    for item in items:
        if item.strip() and (target := parse_target(item, flag)) not in targets:
            targets.append(target)
    if not targets:
        raise UsageError(f"{flag}: name at least one GPU (e.g. {flag} v100,a100,h100)")
    return targets


def check_driver(text: str | None) -> str | None:
    if text is None or text == "":
        return None
    if not _DRIVER_RE.fullmatch(text.strip()):
        raise UsageError(f"--driver: {text.strip()[:40]!r} is not an NVIDIA driver version (e.g. 535.104.05)")
    return text.strip()


def cuda_of(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a CUDA version as images write it: `12.4.1.003`, `13.0`, `13.0.96`."""
    match = _CUDA_RE.fullmatch((text or "").strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def branch_outside(capability: tuple[int, int], driver: str) -> tuple[str, int, int] | None:
    """Where a driver's branch falls outside the ones that drive this architecture (facts.ARCH_DRIVER_BRANCHES):
    ("before", branch, the first) or ("after", branch, the last); None inside, or for an architecture not listed."""
    branches = ARCH_DRIVER_BRANCHES.get(capability)
    if branches is None:
        return None
    first, last = branches
    branch = version_tuple(driver)[0]
    if branch < first:
        return "before", branch, first
    if last is not None and branch > last:
        return "after", branch, last
    return None


def arch_driver_verdict(capability: tuple[int, int], driver: str) -> tuple[bool, str] | None:
    """Can this driver branch drive the GPU at all? None where it can (or the architecture is not in the table)."""
    outside = branch_outside(capability, driver)
    if outside is None:
        return None
    where, branch, bound = outside
    sm = f"sm_{capability[0]}{capability[1]}"
    if where == "before":
        return False, f"driver {driver} (R{branch}) predates {sm}, which needs R{bound} or later"
    return False, f"driver {driver} (R{branch}) no longer supports {sm} (R{bound} was its last branch)"


def driver_verdict(
    cuda: tuple[int, int], driver: str, datacenter: bool | None, ptx_only: bool = False
) -> tuple[bool, str]:
    """Can a driver run an image built with CUDA `cuda`? (ok, reason in words). `ptx_only`: the GPU has only
    PTX to JIT-compile, which the driver must do at the image's exact CUDA version (or, on a data-center GPU,
    the image's forward-compatibility libraries do). A CUDA minor newer than the table knows has no known driver:
    its PTX is never taken as compilable."""
    have = version_tuple(driver)
    name = f"CUDA {cuda[0]}.{cuda[1]}"
    exact = CUDA_MIN_DRIVER.get(cuda)
    known = [k for k in CUDA_MIN_DRIVER if k[0] == cuda[0]]
    newer_than_known = bool(known) and cuda > max(known)
    if exact and have >= version_tuple(exact):
        return True, f"driver {driver} >= {exact} ({name})"
    floor = SUPPORT.minor_version_floor(cuda[0])
    forward = _forward(cuda, driver, have, datacenter, floor)
    if floor and have >= version_tuple(floor):
        if ptx_only and (exact or newer_than_known):
            if forward is not None and forward[0]:
                return True, forward[1] + ", whose newer PTX compiler JITs its PTX"
            need = exact or f"the driver of {name}, newer than imgbuild's table knows"
            return False, (
                f"driver {driver} runs {name} only through minor-version compatibility, which cannot JIT-compile "
                f"its PTX (the only code for this GPU): needs {need}"
            )
        need = f" (PTX JIT and {name}-only APIs need {exact})" if exact else ""
        return True, f"driver {driver} runs {name} through minor-version compatibility{need}"
    if forward is not None:
        return forward
    why = f"driver {driver} is older than {floor or exact} needed by {name}"
    branches = SUPPORT.forward_branches(cuda)
    if branches:
        why += f" (or a data-center forward-compatible branch: {', '.join(branches)})"
    return False, why


def tegra_verdict(cuda: tuple[int, int], native: tuple[int, int], driver: str, ptx_only: bool) -> tuple[bool, str]:
    """A Jetson's own driver (JetPack's numbering, not a desktop branch: Thor's 580.00 is CUDA 13.0's) against the
    image's CUDA: natively up to the CUDA its JetPack ships, a newer minor of the same major by minor-version
    compatibility (its SASS only), never a newer major."""
    name, own = f"CUDA {cuda[0]}.{cuda[1]}", f"CUDA {native[0]}.{native[1]}"
    if cuda <= native:
        return True, f"Jetson driver {driver} is JetPack's for {own}, which runs {name}"
    if cuda[0] == native[0] and not ptx_only:
        return True, f"Jetson driver {driver} ({own}) runs {name} through minor-version compatibility"
    if cuda[0] == native[0]:
        return False, (
            f"Jetson driver {driver} ({own}) runs {name} only through minor-version compatibility, which cannot "
            "JIT-compile its PTX (the only code for this GPU): needs a JetPack with " + name
        )
    return False, f"Jetson driver {driver} is JetPack's for {own}; {name} needs a JetPack release with CUDA {cuda[0]}"


def _forward(
    cuda: tuple[int, int], driver: str, have: tuple[int, ...], datacenter: bool | None, floor: str | None
) -> tuple[bool, str] | None:
    """The forward-compatibility verdict where the driver's branch is one NVIDIA lists for this CUDA release
    (data-center GPUs only); None where it is not."""
    name = f"CUDA {cuda[0]}.{cuda[1]}"
    branch = have[:1]
    for minimum in SUPPORT.forward_branches(cuda):
        if version_tuple(minimum)[:1] == branch and have >= version_tuple(minimum):
            if datacenter is False:
                return False, (
                    f"driver {driver} is older than {floor} for {name}; forward compatibility "
                    "(R" + str(branch[0]) + ") works on data-center GPUs only"
                )
            where = "" if datacenter else " if this is a data-center GPU"
            return True, (
                f"driver {driver} runs {name} through forward compatibility (the image's cuda-compat libraries){where}"
            )
    if datacenter and floor and have >= version_tuple(floor):  # the major's own branches: the compat libraries too
        return True, f"driver {driver} runs {name} through forward compatibility (the image's cuda-compat libraries)"
    return None


@dataclass(frozen=True)
class GpuFacts:
    """What an image offers GPUs: its CUDA version and the archs its framework was compiled for."""

    image: str
    cuda: str  # "13.0"; empty: no CUDA build of the framework
    archs: str  # space-separated arch entries, torch's own form (sm_80 compute_90) or NGC's (8.0 9.0+PTX)
    source: str  # where the archs were read
    platforms: tuple[str, ...] = ()  # the CPU architectures the image exists for (amd64, arm64); () unknown


@dataclass(frozen=True)
class Verdict:
    target: str
    capability: str
    runs: bool
    kernels: str  # sass | ptx | none | unknown
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def judge(facts: GpuFacts, targets: list[Target], driver: str | None = None) -> list[Verdict]:
    """One verdict per target: kernels for its arch, and a driver that can run the image's CUDA."""
    verdicts = []
    cuda = cuda_of(facts.cuda)
    for target in targets:
        cap = f"{target.capability[0]}.{target.capability[1]}"
        if target.cpu != "any" and facts.platforms and target.cpu not in facts.platforms:
            have = ", ".join(facts.platforms)
            why = f"a {target.label} host is {target.cpu}; this image has no {target.cpu} variant (only {have})"
            verdicts.append(Verdict(target.label, cap, False, "none", why))
            continue
        if cuda is None:
            verdicts.append(Verdict(target.label, cap, False, "none", "the image's framework has no CUDA build"))
            continue
        reasons = []
        if parse_archs(facts.archs):
            runs, kernels, why = explain_kernels(facts.archs, target.capability)
        else:
            runs, kernels, why = _no_arch_list(cuda, target)
        reasons.append(why)
        jetpack = SUPPORT.tegra_cuda(target.model, driver) if driver and target.model else None
        if driver and jetpack is not None:
            ok, why = tegra_verdict(cuda, jetpack, driver, ptx_only=kernels == "ptx")
            runs = runs and ok
            reasons.append(why)
        elif driver:
            ok, why = driver_verdict(cuda, driver, target.datacenter, ptx_only=kernels == "ptx")
            runs = runs and ok
            reasons.append(why)
            refused = arch_driver_verdict(target.capability, driver)
            if refused:
                runs = False
                reasons.append(refused[1])
            elif target.min_driver and version_tuple(driver) < version_tuple(target.min_driver):
                runs = False
                reasons.append(
                    f"driver {driver} is older than {target.min_driver}, which NVIDIA requires for {target.label}"
                )
        verdicts.append(Verdict(target.label, cap, runs, kernels, "; ".join(reasons)))
    return verdicts


def _no_arch_list(cuda: tuple[int, int], target: Target) -> tuple[bool, str, str]:
    """No arch list declared: what the CUDA major still builds for is the most it can hold."""
    floor = CUDA_MIN_CAPABILITY.get(cuda[0])
    if floor and target.capability < floor:
        why = f"{target.sm}: CUDA {cuda[0]} builds nothing below sm_{floor[0]}{floor[1]} (no arch list declared)"
        return False, "none", why
    return True, "unknown", f"{target.sm}: the image declares no arch list (not checked)"


def judge_per_platform(
    facts: GpuFacts, targets: list[Target], driver: str | None, variants: dict[str, dict[str, str]] | None = None
) -> list[Verdict]:
    """Each target judged on the image of its own platform: a GPU that comes only in arm64 machines on the
    arm64 variant's CUDA and arch list where the registry has one (`variants`), else on `facts`."""
    verdicts = []
    for target in targets:
        variant = (variants or {}).get(target.cpu)
        if variant is not None:
            source = f"its {target.cpu} image"
            judged = GpuFacts(facts.image, variant["cuda"], variant["arch_list"], source, facts.platforms)
        else:
            judged = facts
        verdicts += judge(judged, [target], driver)
    return verdicts


def judge_tag(
    tag: str,
    cuda: str,
    archs: str,
    targets: list[Target],
    driver: str | None,
    platforms: tuple[str, ...] = (),
    variants: dict[str, dict[str, str]] | None = None,
) -> list[Verdict]:
    """A registry tag, from what its image config declares (CUDA_VERSION, TORCH_CUDA_ARCH_LIST): each target,
    or with no target the driver alone (one verdict with an empty target). `tags --compatible` and `bump`.
    A target that comes only in arm64 machines is judged on the tag's arm64 variant (`variants`), and cannot
    run a tag whose `platforms` lack it."""
    if targets:
        return judge_per_platform(
            GpuFacts(tag, cuda, archs, "TORCH_CUDA_ARCH_LIST", platforms), targets, driver, variants
        )
    version = cuda_of(cuda)
    if version is None or not driver:
        return [Verdict("", "", True, "unknown", "the tag declares no CUDA version")]
    ok, why = driver_verdict(version, driver, None)
    return [Verdict("", "", ok, "unknown", why)]


def blockers(verdicts: list[Verdict]) -> list[str]:
    return [f"{v.target}: {v.reason}" if v.target else v.reason for v in verdicts if not v.runs]


def ok_and_why(verdicts: list[Verdict]) -> tuple[bool, str]:
    """(every target runs, what stops the ones that do not)."""
    blocked = blockers(verdicts)
    return not blocked, "; ".join(blocked)


def _as_rule(check: Callable[[str], Any]) -> Callable[[str], str]:
    """A fleet check as a field rule: ValueError with the message less its `--flag: ` prefix."""

    def rule(value: str) -> str:
        try:
            check(value)
        except UsageError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None
        return value

    return rule


#: smoke.targets and the config's fleet.gpus; the config's fleet.driver; a GPU snapshot's driver and compute_cap.
target_rule = _as_rule(parse_target)
driver_rule = _as_rule(check_driver)
capability_rule = _as_rule(check_capability)
