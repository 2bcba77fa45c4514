"""Stage 2: plan a build. Resolve the base to a digest, find the framework pins to protect, compute hashes.

Pure apart from the `inspect_base` callable passed in (the registry client in production, a dict in tests).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild import imageref
from imgbuild.config.settings import Settings
from imgbuild.errors import Problem, RecipeError, UsageError
from imgbuild.ngc import (
    FRAMEWORKS,
    config_env,
    describe_config,
    expand_tag,
    is_pattern,
)
from imgbuild.payload import PAYLOAD_DIR, PIP_SCRIPTS, SMOKE_MODULES, SMOKE_PACKAGE, STACK_SCRIPT
from imgbuild.pipeline.baserules import base_pin_versions, framework_conflict, pin_conflict, protected_pins
from imgbuild.pipeline.stack import ProtectedStack, door_problems, env_problems, protected_stack
from imgbuild.pipeline.targets import TARGET_HINT, target_refusal
from imgbuild.recipe import LoadedRecipe
from imgbuild.recipe.reqfile import LockedPin, ReqLine

if TYPE_CHECKING:
    from imgbuild.recipe.reqfile import Pin

TEMPLATES_DIR = Path(__file__).parent.parent / "templates"
#: The files of TEMPLATES_DIR that shape a Docker image, by name. Only these are hashed: an installed copy holds
#: other entries too (pip byte-compiles the .py scripts into `__pycache__/`), and the Apptainer template is left out
#: so that editing it does not make every image due. A test keeps this list equal to the package data.
OTHER_TEMPLATES = ("apptainer.def.j2", "ci-github.yml.j2", "ci-gitlab.yml.j2")  # shape no Docker image
IMAGE_TEMPLATES = ("Dockerfile.buildkit.j2", "Dockerfile.j2", "add-user.sh", "install.sh")


@dataclass(frozen=True)
class BaseImage:
    """The base as resolved: a concrete reference, its digest, and what its config says."""

    ref: str
    digest: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)
    requested: str = ""
    image_id: str = ""  # for a local, never-pushed base (e.g. another recipe's image): no digest exists
    pins: tuple[str, ...] = ()  # every `name==version` the base holds its packages at (see bases.pin_reader)
    pins_origin: str = ""  # where those pins were read: the base's PIP_CONSTRAINT file, or a freeze
    #: each installed distribution's Requires-Dist lines, by canonical name, read with the pins
    requires: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def requirements_of(self, name: str) -> list[str]:
        """The base's distribution `name` (canonical) requirements as the pins probe read them (none when unread)."""
        return list(self.requires.get(name, ()))

    @property
    def pinned(self) -> str:
        return f"{self.ref}@{self.digest}" if self.digest else self.ref

    @property
    def identity(self) -> str:
        """What changes when the base changes: its registry digest, or the local image id."""
        return self.digest or self.image_id

    @property
    def framework(self) -> str:
        return self.facts.get("framework", "")

    @property
    def framework_version(self) -> str:
        return self.facts.get("framework_version", "")


#: (reference) -> (digest, image config); raises RegistryUnavailable / RegistryError.
InspectBase = Callable[[str], tuple[str, dict[str, Any]]]
#: (repository reference without tag, pattern) -> concrete tag.
ResolveTag = Callable[[str, str | None, str], str]


@dataclass(frozen=True)
class BasePins:
    """What a base holds its packages at (`name==version` lines, and where they come from) and what each of its
    distributions requires, read inside it."""

    origin: str = ""
    pins: tuple[str, ...] = ()
    requires: dict[str, tuple[str, ...]] = field(default_factory=dict)  # canonical name -> Requires-Dist lines


#: (resolved base) -> its pins; reads inside the base image.
ReadPins = Callable[["BaseImage"], BasePins]


@dataclass(frozen=True)
class Plan:
    loaded: LoadedRecipe
    image: str
    tag: str
    base: BaseImage
    content_hash: str
    input_hash: str
    uid: int
    gid: int
    protected: tuple[str, ...]
    stack: ProtectedStack

    @property
    def target(self) -> str:
        return f"{self.image}:{self.tag}"

    @property
    def name(self) -> str:
        return self.loaded.recipe.name


def base_reference(loaded: LoadedRecipe, settings: Settings) -> tuple[str, str | None, str]:
    """(repository reference, framework or None, tag or pattern) for the recipe's base."""
    base = loaded.recipe.base
    if base.image:
        ref = imageref.parse(base.image)
        return (str(ref), None, "") if ref.digest else (ref.name, None, ref.tag or "latest")
    assert base.framework and base.tag
    fw = FRAMEWORKS[base.framework]
    return f"{settings.ngc_registry}/{fw.repository}", base.framework, expand_tag(base.framework, base.tag)


def resolve_base(
    loaded: LoadedRecipe, settings: Settings, inspect_base: InspectBase | None, resolve_tag: ResolveTag | None = None
) -> BaseImage:
    repo, framework, tag = base_reference(loaded, settings)
    requested = f"{repo}:{tag}" if tag else repo
    if tag and is_pattern(tag) and (framework or tag != "latest"):
        if resolve_tag is None:
            raise UsageError(f"{loaded.display}: base.tag: {tag!r} needs the registry to resolve it")
        tag = resolve_tag(repo, framework, tag)
    ref = f"{repo}:{tag}" if tag else repo
    if inspect_base is None:
        return BaseImage(ref=ref, requested=requested)
    digest, config = inspect_base(ref)
    cfg = config.get("config") or config.get("Config") or {}
    raw_labels = cfg.get("Labels") if isinstance(cfg, dict) else None
    labels = {str(k): str(v) for k, v in raw_labels.items()} if isinstance(raw_labels, dict) else {}
    image_id = str(config.get("Id", ""))
    return BaseImage(
        ref=ref.split("@")[0],
        digest=digest if imageref.DIGEST_RE.fullmatch(digest or "") else None,
        env=config_env(config),
        labels=dict(labels),
        facts=describe_config(config),
        requested=requested,
        image_id=image_id if imageref.DIGEST_RE.fullmatch(image_id) else "",
    )


def field_problem(loaded: LoadedRecipe, at: tuple[str | int, ...], message: str, hint: str) -> Problem:
    """A problem at a field of the recipe: its line and column where the recipe was read from YAML."""
    if loaded.located is not None:
        return loaded.located.problem(at, message, hint)
    return Problem(loaded.display, 0, 0, ".".join(map(str, at)), message, hint)


def check_conflicts(loaded: LoadedRecipe, base: BaseImage) -> None:
    """A recipe that asks for another torch/tensorflow or CUDA library than the base carries, or for a
    version of any package the base pins (numpy, torchvision, ...) that the pin excludes, fails here: every
    conflict at once, each at its line (pip.packages, pip.constraints, the requirements files' lines)."""
    from packaging.requirements import Requirement

    from imgbuild.errors import Problem

    def where(at: tuple[str | int, ...] | ReqLine, message: str, hint: str, *unsure: str) -> Problem:
        if isinstance(at, ReqLine):  # a line of the requirements file (or a file it nests), or of the lock
            field = "lock" if loaded.lock_path and at.file.endswith(loaded.lock_path.name) else "pip.requirements"
            found = Problem(at.file, at.line, 1, field, message, hint)
        else:
            found = field_problem(loaded, at, message, hint)
        return dataclasses.replace(found, needs=unsure[0], otherwise=unsure[1]) if unsure else found

    # the recipe's own asks are checked against its lock too; the lock is input as well: a torch pin in it
    # would meet the base's framework only in the pip step
    specs = [(at, spec, True) for at, spec in recipe_specs(loaded)]
    pinned = set(loaded.lock_pins)  # a set: a tuple's `in` made this quadratic in the lock's length
    specs += [(line, line.spec, False) for line in loaded.lock_lines if line.spec in pinned]
    pins = base_pin_versions(base, loaded.recipe.pip.unpin)
    locked = lock_index(loaded)
    shown = loaded.display  # resolved against the working folder once, not once per requirement
    problems = []
    for at, spec, own in specs:
        req = Requirement(spec) if own else LockedPin.of(spec)  # a lock's name==version, read cheaply
        found = framework_conflict(req, base) or pin_conflict(req, base, pins)
        if found is None and own:
            found = lock_conflict(req, locked, shown)
        if found is not None:
            problems.append(where(at, *found))
    if problems:
        raise RecipeError(problems)


def recipe_specs(loaded: LoadedRecipe) -> list[tuple[tuple[str | int, ...] | ReqLine, str]]:
    """Every requirement and constraint the recipe itself asks for, each with where it stands: pip.packages,
    pip.constraints, and the requirements files' lines (not the lock's)."""
    recipe = loaded.recipe
    specs: list[tuple[tuple[str | int, ...] | ReqLine, str]] = []
    specs += [(("pip", "packages", i), s) for i, s in enumerate(recipe.pip.packages)]
    specs += [(("pip", "constraints", i), s) for i, s in enumerate(recipe.pip.constraints)]
    specs += [(line, line.spec) for line in (*loaded.requirements, *loaded.requirement_constraints)]
    return specs


def hashed_pins(loaded: LoadedRecipe) -> list[str]:
    """The lock's pins as requirement lines, each with its `--hash=sha256:` options where the lock has them."""
    hashes = {line.spec: line.hashes for line in loaded.lock_lines}
    return [" ".join((pin, *hashes.get(pin, ()))) for pin in loaded.lock_pins]


def lock_index(loaded: LoadedRecipe) -> dict[str, ReqLine]:
    """The recipe's lock lines by canonical name."""
    from packaging.utils import canonicalize_name

    return {str(canonicalize_name(line.spec.split("==", 1)[0])): line for line in loaded.lock_lines}


def lock_conflict(req: Pin, locked: dict[str, ReqLine], recipe: str) -> tuple[str, str] | None:
    """(message, hint) when the recipe asks for a version its own lock's pin (`locked`: lock_index) excludes: the
    recipe was edited since `imgbuild lock` ran (the lock, not the base, is what holds the other version)."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    line = locked.get(canonicalize_name(req.name))
    if line is None or not req.specifier or req.marker is not None:
        return None
    version = line.spec.split("==", 1)[1]
    try:
        if req.specifier.contains(Version(version), prereleases=True):
            return None
    except InvalidVersion:
        return None
    return (
        f"{req.name}{req.specifier} excludes {line.spec}, which the recipe's lock holds ({line.file}:{line.line})",
        f"the recipe changed since its lock was written: run imgbuild lock {recipe} (it re-resolves {req.name})",
    )


def check_offline(loaded: LoadedRecipe) -> None:
    """What `check_conflicts` can judge with no registry, for `imgbuild validate`: a CUDA library pinned or
    named by URL, the framework from a URL or under another framework's name (render and build check again,
    with the base's own facts and pins)."""
    declared = loaded.recipe.base.framework
    check_stack(loaded, None)
    check_conflicts(loaded, BaseImage(ref=f"the {declared or 'base'} image", facts={"framework": declared or ""}))


def check_offline_settings(loaded: LoadedRecipe, settings: Settings) -> None:
    """What the recipe and the settings decide with no registry, checked first by `make_plan` so that `validate`
    (which may not reach the base) and `render` give one verdict: the target is not the recipe's own base or the
    site mirror's, the image user's IDs are not system IDs."""
    image, tag = image_and_tag(loaded, settings)
    repo, _, base_tag = base_reference(loaded, settings)
    refused = target_refusal(f"{image}:{tag}", f"{repo}:{base_tag}" if base_tag else repo, settings.ngc_registry)
    if refused:  # at the field that names the target
        raise RecipeError(
            [field_problem(loaded, ("image",) if loaded.recipe.image else ("name",), refused, TARGET_HINT)]
        )
    check_ids(loaded, settings)


def check_stack(loaded: LoadedRecipe, base: BaseImage | None) -> None:
    """The recipe's loader and import variables against the base's (`base` None: not read, as offline), and the
    steps that name the base's stack outright (stack.door_problems): every problem at once, each at its field. The
    image is judged by the byte check after the build."""
    recipe = loaded.recipe
    known = base.env if base is not None and (base.env or base.identity) else None
    hint = "the base's framework and CUDA stack stay as the base has them: add beside them"
    found: list[tuple[tuple[str | int, ...], str]] = [
        (("env", name), why) for name, why in env_problems(recipe.env, recipe.args, known)
    ]
    copied = {dest: tuple(f.rel for f in files) for dest, files in loaded.file_manifest.items()}
    found += door_problems(recipe, copied)
    if found:
        raise RecipeError([field_problem(loaded, at, why, hint) for at, why in found])


def _with_pins(base: BaseImage, read_pins: ReadPins) -> BaseImage:
    read = read_pins(base)
    return dataclasses.replace(base, pins=read.pins, pins_origin=read.origin, requires=read.requires)


def with_base_pins(plan: Plan, read_pins: ReadPins) -> Plan:
    """`plan` (made without them, e.g. by `rebuild` to judge staleness) checked against the base's pins."""
    if plan.base.pins_origin:
        return plan
    base = _with_pins(plan.base, read_pins)
    check_conflicts(plan.loaded, base)
    return dataclasses.replace(plan, base=base)


def check_ids(loaded: LoadedRecipe, settings: Settings) -> None:
    """The one ID rule: a UID or GID the recipe or the settings name is `min_image_id` or more (the invoking user's
    own IDs are theirs, whatever they are)."""
    user = loaded.recipe.user
    floor = settings.min_image_id
    for name, value in (("uid", user.uid if user else None), ("gid", user.gid if user else None)):
        if value is not None and value < floor:
            raise RecipeError(
                [field_problem(loaded, ("user", name), f"{value} is a system ID of the base (below {floor})",
                               f"choose {floor} or more, or leave it out (the invoking user's is taken)")]
            )  # fmt: skip
    for name in ("uid", "gid"):
        value = getattr(settings, name)
        if value is not None and value < floor:
            raise UsageError(f"{name}: {value} is a system ID of the base (below min_image_id, {floor})")


def resolve_ids(loaded: LoadedRecipe, settings: Settings, host_ids: tuple[int, int]) -> tuple[int, int]:
    """UID/GID for the image user: recipe > setting > the invoking user (via sudo too) > 1000 for root."""
    user = loaded.recipe.user
    uid = (user.uid if user else None) or settings.uid
    gid = (user.gid if user else None) or settings.gid
    host_uid, host_gid = host_ids
    if uid is None:
        uid = host_uid or 1000
    if gid is None:
        gid = host_gid or (uid if host_uid == 0 else 1000)
    return uid, gid


@functools.cache
def templates_digest() -> str:
    """imgbuild's own templates, the pip step's scripts and the smoke package, what shapes a Docker image (package
    data), read and hashed at first use, once per process (importing this module reads nothing). The Apptainer
    template is not among them: editing it must not make every image due."""
    h = hashlib.sha256()
    for name in IMAGE_TEMPLATES:
        h.update(name.encode() + b"\0" + (TEMPLATES_DIR / name).read_bytes())
    for name in PIP_SCRIPTS:
        h.update(name.encode() + b"\0" + (PAYLOAD_DIR / name).read_bytes())
    for name in SMOKE_MODULES:
        h.update(name.encode() + b"\0" + (SMOKE_PACKAGE / name).read_bytes())
    h.update(STACK_SCRIPT.read_bytes())
    return h.hexdigest()


def content_hash(loaded: LoadedRecipe) -> str:
    """Everything in the recipe that shapes the image: fields, copied files' content, requirements, templates."""
    data = dataclasses.asdict(loaded.recipe)
    del data["extends"]
    del data["platforms"]  # which platforms are built shapes no image (rebuild counts each one: ci.rebuild)
    for spec in data["files"]:
        spec["src"] = loaded.file_digests.get(spec["dest"], "")
    if loaded.requirements_path:
        data["pip"]["requirements"] = {
            "requirements": [[line.spec, *line.hashes] for line in loaded.requirements],
            "constraints": [line.spec for line in loaded.requirement_constraints],
            "options": list(loaded.requirement_options),
        }
    if loaded.lock_pins:
        data["pip"]["lock"] = hashed_pins(loaded)  # a lock's hashes are what it installs too
    data["pip"]["ca_bundle"] = None  # mounted at build time, never part of the image
    data["templates"] = templates_digest()
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def image_and_tag(loaded: LoadedRecipe, settings: Settings) -> tuple[str, str]:
    """(`[<image_registry>/]<user>/<name>` or the recipe's `image`, tag); a tag in `image` wins over `tag`."""
    recipe = loaded.recipe
    if not recipe.image:
        prefix = f"{settings.image_registry}/" if settings.image_registry else ""
        return f"{prefix}{settings.user.lower()}/{recipe.name}", recipe.tag
    ref = imageref.parse(recipe.image)
    return ref.name, ref.tag or recipe.tag


def make_plan(
    loaded: LoadedRecipe,
    settings: Settings,
    inspect_base: InspectBase | None,
    resolve_tag: ResolveTag | None = None,
    host_ids: tuple[int, int] = (0, 0),
    read_pins: ReadPins | None = None,
) -> Plan:
    """The plan. Pure but for `inspect_base`/`resolve_tag` (a registry, a dict in tests), `read_pins` (the base's
    own pins, read in the base by a build; without it only the framework is checked) and imgbuild's own package
    data, read once per process at first use (templates_digest); `host_ids`: the caller's UID/GID, read at the edge
    (resolve.plan_recipe; root's (0, 0) gives 1000). Nothing here asks who is calling."""
    check_offline_settings(loaded, settings)
    base = resolve_base(loaded, settings, inspect_base, resolve_tag)
    image, tag = image_and_tag(loaded, settings)
    if read_pins is not None:
        base = _with_pins(base, read_pins)
    check_stack(loaded, base)
    check_conflicts(loaded, base)
    uid, gid = resolve_ids(loaded, settings, host_ids)
    chash = content_hash(loaded)
    inputs = json.dumps(
        {"content": chash, "base": base.identity or base.ref, "uid": uid, "gid": gid}, sort_keys=True
    ).encode()
    return Plan(
        loaded=loaded,
        image=image,
        tag=tag,
        base=base,
        content_hash=chash,
        input_hash="sha256:" + hashlib.sha256(inputs).hexdigest(),
        uid=uid,
        gid=gid,
        protected=protected_pins(base),
        stack=protected_stack(loaded.recipe),
    )
