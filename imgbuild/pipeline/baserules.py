"""What a base image allows a recipe to ask pip for: its framework stays (the version the base carries), its CUDA
libraries stay (and no package built for another CUDA major goes beside them), and each exact pin the base holds
(its constraint file or freeze) holds unless the recipe unpins it. One rule for the plan's check, `imgbuild
validate`, the lock and the build; pure: the base's facts come in a BaseImage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from imgbuild.ngc import CUDA_BUILD_RE, CUDA_PACKAGE_PREFIXES, FRAMEWORKS, cuda_build, cuda_major, is_cuda_library

# the pip step's own rules, at plan time
from imgbuild.payload.pip_versions import admit_together, framework_needs, needing

if TYPE_CHECKING:
    from collections.abc import Callable

    from imgbuild.pipeline.plan import BaseImage
    from imgbuild.recipe.reqfile import Pin


def protected_pins(base: BaseImage) -> tuple[str, ...]:
    """Constraints that keep the base's framework in place, known before the build from its config."""
    fw = FRAMEWORKS.get(base.framework)
    if not fw or not base.framework_version:
        return ()
    if fw.name != "pytorch":
        return ()  # TensorFlow's distribution name varies (tensorflow, tensorflow-cpu): the freeze pins it.
    # The release without its local label: PyPI's CUDA wheels say `2.13.0+cu130` in torch.__version__ (and
    # PYTORCH_VERSION) but `2.13.0` in their metadata, which a `==2.13.0+cu130` pin would call a conflict.
    # The base's own pins (its constraint file or a freeze) still hold the exact build installed.
    from packaging.version import InvalidVersion, Version

    try:
        return (f"torch=={Version(base.framework_version).public}",)
    except InvalidVersion:
        return (f"torch=={base.framework_version}",)


def base_pin_versions(base: BaseImage, unpinned: list[str] | tuple[str, ...] = ()) -> dict[str, tuple[str, str]]:
    """{canonical name: (name, version)} for each exact pin of the base that still holds: not the framework
    or the CUDA stack (those have their own check), not a package the recipe unpins."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    freed = {canonicalize_name(n) for n in unpinned}
    own = FRAMEWORKS.get(base.framework)
    guarded = set(own.packages) if own else set()
    found: dict[str, tuple[str, str]] = {}
    for line in base.pins:
        try:
            req = Requirement(line.split("#", 1)[0].strip())
        except InvalidRequirement:
            continue
        name = canonicalize_name(req.name)
        specs = list(req.specifier)
        if req.url or req.marker or len(specs) != 1 or specs[0].operator not in ("==", "==="):
            continue
        if name in freed or name in guarded or name.startswith(CUDA_PACKAGE_PREFIXES):
            continue
        found[name] = (req.name, specs[0].version)
    return found


def pin_conflict(req: Pin, base: BaseImage, pins: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    """(message, hint) when `req` asks for a version of a package the base pins that the pin excludes."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    name = canonicalize_name(req.name)
    if name not in pins or req.marker:  # a marker may not apply in the image: pip will judge it
        return None
    pinned, version = pins[name]
    hint = f"pinned by {base.pins_origin or 'the base'}: drop the pin, or let pip move it with pip.unpin: [{pinned}]"
    if blocked := framework_blocks(req, base) or base_blocks(req, base):
        framework, chain, spec = blocked
        via = f" via {chain}" if chain else ""
        hint = (
            f"pinned by {base.pins_origin or 'the base'}; pip.unpin: [{pinned}] cannot help: the base's {framework} "
            f"needs {pinned}{spec}{via}: drop the pin, or use a base whose {framework} admits {req.name}{req.specifier}"
        )
    if req.url:
        return f"{req.name} from a URL would replace the base's {pinned}=={version}", hint
    try:
        have = Version(version)
    except InvalidVersion:
        return None
    if not req.specifier or req.specifier.contains(have, prereleases=True):
        return None
    if have.is_prerelease and req.specifier.contains(Version(have.base_version), prereleases=True):
        # NGC's torchvision is a pre-release of the release the recipe names, as its torch is
        return prerelease_conflict(pinned, str(req.specifier), version, base.ref)
    return f"{req.name}{req.specifier} conflicts with the base's {pinned}=={version} ({base.ref})", hint


def framework_blocks(req: Pin, base: BaseImage) -> tuple[str, str, str] | None:
    """(framework distribution, the chain through which it needs `req`'s package, its clause) when the base's
    framework needs a version of that package `req` excludes altogether, so that moving it (pip.unpin) would break
    the framework: read from the base's own requirements (the pins probe), by the pip step's own rule. None when
    they were not read, or some version would meet both."""
    from packaging.utils import canonicalize_name

    own = FRAMEWORKS.get(base.framework)
    if own is None or not base.requires or not req.specifier:
        return None
    needs = framework_needs(str(canonicalize_name(req.name)), own.packages, requires=base.requirements_of)
    return next((need for need in needs if admit_together(str(req.specifier), need[2]) is False), None)


def base_blocks(req: Pin, base: BaseImage) -> tuple[str, str, str] | None:
    """(a base distribution, "", its clause) where one of the base's distributions needs a version
    of `req`'s package that `req` excludes altogether (pip.unpin would break it), by the pip step's own rule
    (pip_versions.needing); None when the base's requirements were not read or none does."""
    from packaging.utils import canonicalize_name

    if not base.requires or not req.specifier:
        return None
    dists = [(name, "", base.requirements_of(name)) for name in sorted(base.requires)]
    found = needing(str(canonicalize_name(req.name)), str(req.specifier), dists)
    return found[0] if found else None  # (name, "" as its version, need): framework_blocks' shape


def base_refuses(req: Pin, base: BaseImage, pins: dict[str, tuple[str, str]]) -> bool:
    """Whether the base refuses `req`: its framework or CUDA libraries, or a version its pins exclude."""
    return bool(framework_conflict(req, base) or pin_conflict(req, base, pins))


def framework_conflict(req: Pin, base: BaseImage) -> tuple[str, ...] | None:
    """(message, hint[, a package the hint names, the hint if the index lacks it]) when `req` would replace the
    base's CUDA libraries or framework, else None."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    name = canonicalize_name(req.name)
    own = FRAMEWORKS.get(base.framework)
    if found := _other_cuda(name, req, base):
        return found
    if is_cuda_library(name) and (req.specifier or req.url):
        return (
            f"{req.name} would replace a CUDA library of the base",
            "the base's CUDA stack is protected; drop the pin",
        )
    other = next((fw for fw in FRAMEWORKS.values() if name in fw.packages and fw is not own), None)
    if other is not None and own is not None:
        return (
            f"{req.name} is {other.name}, but the base is a {own.name} image ({base.ref})",
            f"build on a {other.name} base for {other.name}",
        )
    if own is None or name not in own.packages:
        return None
    if req.url:
        return (
            f"{req.name} from a URL would replace the base's {req.name} {base.framework_version}".rstrip(),
            "the base's framework is protected: drop it",
        )
    try:
        have = Version(base.framework_version) if base.framework_version else None
    except InvalidVersion:
        have = None
    if have is not None and req.specifier and not req.specifier.contains(have, prereleases=True):
        if have.is_prerelease and req.specifier.contains(Version(have.base_version), prereleases=True):
            return prerelease_conflict(req.name, str(req.specifier), base.framework_version, base.ref)
        return (
            f"{req.name}{req.specifier} conflicts with the base's {req.name} {base.framework_version} ({base.ref})",
            f"the base's framework is protected: drop the pin, or choose a base tag that carries "
            f"{req.name}{req.specifier}",
        )
    return None


def _other_cuda(name: str, req: Pin, base: BaseImage) -> tuple[str, ...] | None:
    """When `req` asks for a build for another CUDA major than the base's (`jax[cuda12]`, `cupy-cuda12x`,
    `nvidia-cudnn-cu12` on a CUDA 13 base): its libraries go beside or over the base's, its code built for them."""
    major = cuda_major(base.env)
    if major is None:
        return None

    def for_base(word: str) -> str:  # the same name or extra, for the base's major: cuda12_pip -> cuda13_pip
        return for_cuda(word, major)

    asked = [(req.name, cuda_build(name), for_base(name))]  # extras match as words after a "-", as names do
    asked += [
        (f"{req.name}[{x}]", cuda_build("-" + x), f"{req.name}[{for_base('-' + x)[1:]}]") for x in sorted(req.extras)
    ]
    for shown, theirs, cure in asked:
        if theirs is None or theirs == major:
            continue
        said = (
            f"{shown} is built for CUDA {theirs}, but the base has CUDA {major} ({base.ref}): it brings CUDA "
            f"{theirs} libraries beside or over the base's, and its own code is built for them",
            f"ask for the CUDA {major} build ({cure}), or drop it",
        )
        if shown != req.name:  # an extra: the project is the one asked for, its extra may not exist
            return (
                *said,
                cure,
                f"{req.name} declares no [{cure[len(req.name) + 1 : -1]}] extra: ask for {req.name} without "
                f"[{shown[len(req.name) + 1 : -1]}] and, beside it, the CUDA {major} build of each package that extra "
                "brings, or drop it",
            )
        lacks = f"the index has no CUDA {major} build of {req.name} ({cure} is not there)"
        return (*said, cure, f"{lacks}: drop it, or use a base with CUDA {theirs}")
    return None


@dataclass(frozen=True)
class CudaBuildAnswer:
    """What the index says of a package's builds for the base's CUDA major: the releases it marks as such
    (`0.11.0+cu130`), and whether the same project named for that major (`faiss-gpu-cu13` for `faiss-gpu-cu12`)
    is there (None: not asked, the name carries no CUDA major). None in place of this: the index did not answer."""

    releases: tuple[str, ...]
    renamed: str = ""
    renamed_there: bool | None = None


def other_cuda_cure(name: str, theirs: str, have: str, answer: CudaBuildAnswer | None) -> str:
    """The cure for `name`, built for CUDA `theirs`, in a base with CUDA `have`: a build the index has for `have`,
    named only where the index has it; else what would be needed instead."""
    elsewhere = f"or use a base with CUDA {theirs}"
    if answer is None:
        return f"the index could not be asked whether it has a CUDA {have} build of {name}: {elsewhere}"
    if answer.renamed and answer.renamed_there:
        return f"ask for its CUDA {have} build, {answer.renamed} (on the index), {elsewhere}"
    if answer.releases:
        return f"ask for its CUDA {have} build, {name}=={answer.releases[-1]} (on the index), {elsewhere}"
    missing = f"no release of {name} is marked +cu{have}"
    missing += f", and {answer.renamed} is not there" if answer.renamed else ""
    return (
        f"the index has no CUDA {have} build of {name} ({missing}): what would be needed is {name} built for CUDA "
        f"{have}: from source against the base (a requirements file (pip.requirements) with the lines `--no-binary "
        f"{name}` and `{name}`, and pip.no_build_isolation: [{name}]; it compiles, with nvcc), where its requirements "
        f"admit the base's framework; {elsewhere}"
    )


def renamed_for(name: str, major: str) -> str:
    """The same project named for CUDA `major` where its name carries another's (faiss-gpu-cu12 -> faiss-gpu-cu13),
    else ""."""
    from packaging.utils import canonicalize_name

    canonical = str(canonicalize_name(name))
    theirs = cuda_build(canonical)
    return for_cuda(canonical, major) if theirs is not None and theirs != major else ""


def for_cuda(word: str, major: str) -> str:
    """The same distribution name or extra built for CUDA `major`: cupy-cuda12x -> cupy-cuda13x, cuda12_pip ->
    cuda13_pip."""
    return CUDA_BUILD_RE.sub(lambda m: m.group(0).replace(m.group(1), major), word)


def extra_cure(need: str, extras: dict[str, tuple[str, ...]], has: Callable[[str], bool | None]) -> str:
    """The cure for an extra the project does not declare (`need`: spacy[cuda13x]), from the extras it does declare
    (`extras`: {extra: the distributions it brings}): the project, and the CUDA build of the base's major of what its
    extra for another major brings (spacy and cupy-cuda13x), named only where `has` (the recipe's index) has each;
    what would be needed where it lacks one; "" when no declared extra is another major's form."""
    name, _, wanted = need.rstrip("]").partition("[")
    major = cuda_build("-" + wanted)
    newest_first = sorted(extras.items(), key=lambda item: (cuda_build("-" + item[0]) or "").zfill(3), reverse=True)
    for extra, brings in newest_first:
        if major and extra != wanted and for_cuda("-" + extra, major)[1:] == wanted and brings:
            cured = [for_cuda(dist, major) for dist in brings]
            found = {dist: has(dist) for dist in cured}
            if lacking := [dist for dist, there in found.items() if there is False]:
                return (
                    f"{name} declares no [{wanted}] extra, and the index has no {', '.join(lacking)} (the CUDA "
                    f"{major} build of what its [{extra}] extra brings): what would be needed is a CUDA {major} build "
                    f"of {', '.join(brings)}; drop it, or use a base with CUDA {cuda_build('-' + extra)}"
                )
            unsure = [dist for dist, there in found.items() if there is None]
            unchecked = f"; the index could not be asked whether it has {', '.join(unsure)}" if unsure else ""
            return (
                f"{name} declares no [{wanted}] extra: ask for {name} and {', '.join(cured)} (the CUDA {major} build "
                f"of what its [{extra}] extra brings), or drop it{unchecked}"
            )
    return ""


def prerelease_conflict(name: str, specifier: str, have: str, ref: str) -> tuple[str, str]:
    """(message, hint) for NGC's everyday trap: its framework is a pre-release (`2.9.0a0+145a3a7`), and
    under PEP 440 `2.9.0a0 < 2.9`, so `torch>=2.9` excludes the very build it was written for."""
    from packaging.version import Version

    public = Version(have).public
    return (
        f"{name}{specifier} is not met by the base's {name} {have} ({ref}): NGC's {name} is a pre-release of "
        f"{Version(have).base_version}, and under PEP 440 {public} sorts before {Version(have).base_version}",
        f"the base's {name} is what you asked for: drop the pin, or write it to admit the pre-release "
        f"({name}>={public})",
    )
