"""What `merge-reports` may believe of the runners' reports: each row checked against the plan the runners were
given and against the registry, never taken on a runner's word.

A plan (`rebuild --plan --json`) is read as untrusted input and refused when its waves are out of dependency order
(a child planned in or before the wave of an image it builds on: it would be built, and signed, on its parent's old
image). Against it, a report's row for a recipe nobody planned, or for another image than planned, is a failed row,
and so is a planned recipe no report names. A "built" row is believed only where the registry's tag holds the
digest it names, a "fresh" one only where the tag holds an image; with the signer's public key, only where what
the tag holds is that key's build of this plan: signed by it, with a signed provenance naming the recipe as it is
here (a stale image re-reported as "fresh", or its old digest as "built", was merged green on its old signature),
built on what its base holds now (a child built first, on its parent's old image; an image on a moved base).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.ci.fanout import MAX_IMAGES, read_json
from imgbuild.ci.rebuild import BUILT, FAILED, FRESH, Item
from imgbuild.config.settings import Settings
from imgbuild.errors import ImgbuildError, UsageError
from imgbuild.imageref import DIGEST_RE
from imgbuild.recipe.load import CI_PATH_RE

if TYPE_CHECKING:
    from imgbuild.registry.client import RegistryClient
    from imgbuild.supply.attest import PublicKey


@dataclass(frozen=True)
class PlannedRecipe:
    recipe: str
    image: str
    wave: int  # 1 for the first
    after: tuple[str, ...]  # the planned recipes whose images it builds on


@dataclass(frozen=True)
class FanoutPlan:
    source: str
    rows: tuple[PlannedRecipe, ...]

    def by_recipe(self) -> dict[str, PlannedRecipe]:
        return {row.recipe: row for row in self.rows}


def read_plan(path: Path, settings: Settings) -> FanoutPlan:
    """The plan `rebuild --plan --json` wrote, checked as untrusted input (one line naming the file and the field,
    exit 2), its waves in dependency order: as it says, and as the recipes it names say where they are here."""
    shown = str(path)
    data = read_json(path)
    waves = data.get("waves") if isinstance(data, dict) else None
    if not isinstance(waves, list) or not all(isinstance(w, list) for w in waves):
        raise UsageError(f"{shown}: not a plan of imgbuild rebuild --plan --json (no list of waves)")
    if sum(len(w) for w in waves) > MAX_IMAGES:
        raise UsageError(f"{shown}: more than {MAX_IMAGES} images planned")
    rows = tuple(
        _row(row, n, f"{shown}: waves[{n - 1}][{i}]") for n, w in enumerate(waves, 1) for i, row in enumerate(w)
    )
    plan = FanoutPlan(shown, rows)
    if len(plan.by_recipe()) != len(rows):
        raise UsageError(f"{shown}: a recipe is planned twice")
    refuse_out_of_order(plan, recipes_build_on(plan, settings))
    return plan


def _row(row: Any, wave: int, where: str) -> PlannedRecipe:
    if not isinstance(row, dict):
        raise UsageError(f"{where}: not an object")
    recipe, image, after = row.get("recipe"), row.get("image"), row.get("after", [])
    if not isinstance(recipe, str) or len(recipe) > 1024 or not CI_PATH_RE.fullmatch(recipe):
        # the one rule of a recipe path CI passes on (recipe.ci_path), as rebuild --plan wrote it
        raise UsageError(f"{where}.recipe: not a recipe's path CI passes on (letters, digits and . _ / -)")
    if not isinstance(image, str) or len(image) > 1024:
        raise UsageError(f"{where}.image: not an image reference")
    if row.get("wave", wave) != wave:
        raise UsageError(f"{where}.wave: {str(row.get('wave'))[:20]!r}, but it is listed in wave {wave}")
    if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
        raise UsageError(f"{where}.after: not a list of planned recipes")
    return PlannedRecipe(recipe, image, wave, tuple(after))


def refuse_out_of_order(plan: FanoutPlan, builds_on: dict[str, tuple[str, ...]] | None = None) -> None:
    """Refuse `plan` where a recipe is planned in or before the wave of a planned recipe it builds on: as the plan
    says (`after`), and as the recipes themselves say where they were read (`builds_on`: recipe -> the planned
    recipes whose images it builds on)."""
    waves = {row.recipe: row.wave for row in plan.rows}
    for row in plan.rows:
        for parent in (*row.after, *(builds_on or {}).get(row.recipe, ())):
            if parent in waves and waves[parent] >= row.wave:
                raise UsageError(
                    f"{plan.source}: {row.recipe} is planned in wave {row.wave} but builds on {parent}, planned in "
                    f"wave {waves[parent]}: the waves are out of dependency order (make the plan again)"
                )


def recipes_build_on(plan: FanoutPlan, settings: Settings) -> dict[str, tuple[str, ...]]:
    """For each planned recipe that is here to read, the planned recipes it builds on, as its file says."""
    from imgbuild.ci.rebuild import load_graph

    present = [Path(row.recipe) for row in plan.rows if Path(row.recipe).is_file()]
    items = load_graph(present, settings) if present else []
    planned_by_target = {item.target: item.name for item in items if item.target and item.name in plan.by_recipe()}
    return {item.name: tuple(planned_by_target[d] for d in item.deps if d in planned_by_target) for item in items}


def against_plan(items: list[Item], plan: FanoutPlan) -> list[Item]:
    """`items` (the merged rows) as the plan allows them: a recipe nobody planned, or another image than planned,
    fails; a planned recipe without a row is a failed row of its own."""
    planned = plan.by_recipe()
    out: list[Item] = []
    for item in items:
        row = planned.get(item.name)
        if row is None:
            out.append(_failed(item, f"{item.name} is in no wave of {plan.source}: a recipe nobody planned"))
        elif item.target != row.image:
            out.append(_failed(item, f"reported as {item.target or 'no image'}, but {plan.source} plans {row.image}"))
        else:
            out.append(item)
    seen = {item.name for item in items}
    for row in plan.rows:
        if row.recipe not in seen:
            missing = Item(Path(row.recipe), target=row.image)
            out.append(_failed(missing, f"planned in wave {row.wave} of {plan.source}, but no report names it"))
    return out


def against_registry(items: list[Item], settings: Settings, verifier: PublicKey | None = None) -> None:
    """Fail each "built" row whose digest the registry's tag does not hold, and each "fresh" row whose tag holds
    nothing; with `verifier` (the signer's public key), each whose image there is not the key's build of the plan
    (_unvouched)."""
    from imgbuild.registry.client import RegistryClient
    from imgbuild.registry.manifest import split_reference

    for n, item in enumerate(items):
        if item.status not in (BUILT, FRESH):
            continue
        said = f"reported built as {item.pushed}" if item.status == BUILT else "reported fresh"
        if item.status == BUILT and not DIGEST_RE.fullmatch(item.pushed):
            items[n] = _failed(item, "reported built, but names no pushed digest")
            continue
        try:
            host, repo, tag = split_reference(item.target)
            client = RegistryClient.for_host(host, settings)
            held = client.content_digest(repo, tag)
            if not held or (item.status == BUILT and held != item.pushed):
                items[n] = _failed(item, f"{said}, but {item.target} holds {held or 'nothing'} in the registry")
            elif verifier is not None and (why := _unvouched(client, item, held, verifier, settings)):
                items[n] = _failed(item, f"{said}, but {item.target}@{held} {why}")
        except ImgbuildError as exc:
            items[n] = _failed(item, f"{said}, but the registry could not show {item.target}: {exc}")


def _unvouched(client: RegistryClient, item: Item, digest: str, verifier: PublicKey, settings: Settings) -> str:
    """Why the image at `digest` (what `item`'s tag holds) is not the key's build of this plan, or "": it must be
    signed by the key, with a provenance signed by it that names the recipe as it is here (where it is here), built
    on what its base holds now (a planned parent's new image, a moved NGC tag's), or on the digest the recipe pins."""
    from imgbuild.registry.client import RegistryClient
    from imgbuild.registry.manifest import split_reference
    from imgbuild.supply.verify import check_attestation, check_signature

    host, repo, _ = split_reference(item.target)
    image = f"{host}/{repo}"
    if not check_signature(client, repo, image, digest, verifier).ok:
        return "is not signed there by the key"
    content, pinned = _recipe_here(item, settings)
    verdicts, statement = check_attestation(client, repo, image, digest, verifier, content)
    if bad := next((v for v in verdicts if not v.ok), None):
        return f"is not this plan's build: {bad.detail}"
    if pinned:  # the base is the digest the recipe names, and the content hash just compared covers that name
        return ""
    base_ref, base = _base_of(statement or {})
    if not base_ref:
        return "is not this plan's build: its provenance names no base image"
    base_host, base_repo, reference = split_reference(base_ref)
    current = RegistryClient.for_host(base_host, settings).content_digest(base_repo, reference)
    if current != base:
        return f"was built on {base_ref}@{base}, not on what it holds now ({current or 'nothing'})"
    return ""


def _recipe_here(item: Item, settings: Settings) -> tuple[str | None, bool]:
    """(the content hash of `item`'s recipe as it is here, whether it names its base by digest); (None, False) where
    it is not here, or does not load."""
    from imgbuild import imageref
    from imgbuild.pipeline.plan import content_hash
    from imgbuild.recipe import load_recipe

    if not item.path.is_file():
        return None, False
    try:
        loaded = load_recipe(item.path, secrets=settings.secrets())
        pinned = bool(loaded.recipe.base.image and imageref.parse(loaded.recipe.base.image).digest)
        return content_hash(loaded), pinned
    except (ImgbuildError, imageref.BadReference):
        return None, False


def _base_of(statement: dict[str, Any]) -> tuple[str, str]:
    """(the base image's reference, its digest) as a provenance names them, or ("", "")."""
    try:
        base = statement["predicate"]["buildDefinition"]["resolvedDependencies"][0]
        uri, digest = base["uri"], base["digest"]["sha256"]
    except (KeyError, IndexError, TypeError):
        return "", ""
    if not isinstance(uri, str) or not uri.startswith("oci://") or not isinstance(digest, str):
        return "", ""
    return uri.removeprefix("oci://"), f"sha256:{digest}"


def merged(
    reports: list[Path], plan: FanoutPlan | None, settings: Settings, verifier: PublicKey | None = None
) -> list[Item]:
    """The runners' reports as one list of rows: a report that cannot be read is a failed row naming the file (the
    others still merge); with `plan`, each row checked against it and each "built" digest against the registry."""
    from imgbuild.ci.fanout import merge, read_report

    read: list[list[Item]] = []
    unreadable: list[Item] = []
    for path in reports:
        try:
            read.append(read_report(path))
        except UsageError as exc:
            unreadable.append(Item(path, target="", status=FAILED, error=str(exc)))
    items = merge(read)
    if plan is not None:
        items = against_plan(items, plan)
        against_registry(items, settings, verifier)
    return items + unreadable


def _failed(item: Item, why: str) -> Item:
    failed = Item(item.path, target=item.target, status=FAILED, error=why, seconds=item.seconds)
    failed.pushed = item.pushed
    return failed
