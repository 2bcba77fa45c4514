"""What a smoke test may spare: the added distributions that imported in the last promoted image of this recipe,
believed only where nothing that could break their import has changed since.

A distribution is spared by its name, version and the fingerprint of the files it installed (the sha256 of its
RECORD: a wheel swapped at the same version installs other files), and only when the image's *system scope* is
the same: the base's digest and every recipe field that is not a Python requirement (apt packages, copied files
where Python or the loader can reach them, environment, run steps, user, build args) with imgbuild's templates.
Dropping `libmagic1` under an unchanged `python-magic` changes the scope, so everything is imported again. A copied
file counts by content where an import could read it (the working folder, which `python -c` puts first on the
path; a folder on the image's PYTHONPATH or LD_LIBRARY_PATH; /usr, /lib*, /etc, /opt/conda, /root; any
site-packages or dist-packages; a `.pth`); elsewhere (the training script in /opt/app) by its destination only,
so editing it spares the imports it cannot touch.

Two places say what imported: the local smoke report of the image promoted now (`smoke.json` in the build
context, the user's own), and, on a fresh CI runner, the `.smoke` record pushed beside the registry's copy. The
registry record counts only when signed by a key this run trusts (the `--sign-key` in use, else the site's
`run.signing_key`) and bound to the digest the tag serves; anything else is ignored, and the run says so. Both are
bounded (MAX_VOUCHED entries, or nothing at all) and reach the smoke test as a file (build.smoke.smoke_probe).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.config.settings import Settings
from imgbuild.errors import ImgbuildError
from imgbuild.pipeline.plan import Plan, templates_digest

if TYPE_CHECKING:
    from imgbuild.supply.attest import PublicKey, Signer

MAX_VOUCHED = 5000  # a record naming more distributions than this is believed for none of them
REPORT_BYTES = 16 * 1024 * 1024
WORD_RE = re.compile(r"[A-Za-z0-9._-]{1,200}==[A-Za-z0-9.+!_-]{1,100} [0-9a-f]{64}")
#: Recipe fields that cannot change whether an installed distribution imports (naming, metadata, the smoke test's
#: own settings, the Python requirements, which the fingerprints cover).
NOT_SYSTEM = ("extends", "pip", "name", "tag", "image", "description", "smoke", "labels", "entrypoint", "cmd")
IMPORT_ROOTS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt/conda", "/root")


def import_roots(plan: Plan) -> tuple[str, ...]:
    """Folders whose files an import can read in the image: the system's, the working folder, and every entry of
    PYTHONPATH and LD_LIBRARY_PATH the recipe or the base sets."""
    env = {**plan.base.env, **plan.loaded.recipe.env}
    listed = [p for key in ("PYTHONPATH", "LD_LIBRARY_PATH") for p in env.get(key, "").split(":")]
    return (*IMPORT_ROOTS, plan.loaded.recipe.workdir, *(p for p in listed if p.startswith("/")))


def reaches_imports(dest: str, roots: tuple[str, ...]) -> bool:
    """Whether a file copied to `dest` could change what an import does."""
    if dest.endswith(".pth") or "/site-packages/" in dest or "/dist-packages/" in dest:
        return True
    return any(dest == r or dest.startswith(r.rstrip("/") + "/") for r in roots)  # "/" reaches every file


def smoke_scope(plan: Plan) -> str:
    """The hash of what, besides the Python distributions themselves, decides whether they import."""
    data = dataclasses.asdict(plan.loaded.recipe)
    for key in NOT_SYSTEM:
        data.pop(key, None)
    roots = import_roots(plan)
    for spec in data.get("files") or []:
        reached = reaches_imports(spec["dest"], roots)
        spec["src"] = plan.loaded.file_digests.get(spec["dest"], "") if reached else "(not on an import path)"
    data["base"] = plan.base.identity or plan.base.ref
    data["templates"] = templates_digest()
    return "sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def vouched(data: Any, base: str, scope: str, digest: str | None = None) -> tuple[str, ...]:
    """What a passed smoke report or record vouches for: `name==version fingerprint` lines (ASCII only); nothing
    from another base, another system scope, another image (`digest`, for a registry record), a failed report,
    or a record over MAX_VOUCHED entries."""
    if not isinstance(data, dict) or data.get("ok") is not True:
        return ()
    if data.get("base") != base or data.get("scope") != scope:
        return ()
    if digest is not None and data.get("digest") != digest:
        return ()
    meta = data.get("meta")
    added = meta.get("added") if isinstance(meta, dict) else None
    if not isinstance(added, list) or len(added) > MAX_VOUCHED:
        return ()
    rows = [r for r in added if isinstance(r, list) and len(r) >= 3 and all(isinstance(x, str) for x in r)]
    words = [f"{row[0]}=={row[1]} {row[-1]}" for row in rows]
    return tuple(w for w in words if WORD_RE.fullmatch(w))


def local_known_good(path: Path, current: str | None, base: str, scope: str) -> tuple[str, ...]:
    """What the smoke report of the image promoted now (`current`) vouches for; nothing where the report is
    another image's, another base's or scope's, or unreadable."""
    try:
        data = json.loads(path.read_bytes()[:REPORT_BYTES]) if current and path.is_file() else {}
    except (OSError, ValueError, RecursionError):
        return ()
    return vouched(data, base, scope) if isinstance(data, dict) and data.get("promoted") == current else ()


def trusted_key(settings: Settings) -> PublicKey | None:
    """The site's public key (`run.signing_key`), or None."""
    from imgbuild.supply import attest

    path = settings.run.signing_key
    return attest.load_verifier(Path(path)) if path else None


def registry_known_good(
    plan: Plan, settings: Settings, key: PublicKey | None, scope: str, progress: Callable[[str], None]
) -> tuple[str, ...]:
    """On a fresh runner, what the registry's copy of the target vouches for in `scope` (smoke_scope): its `.smoke`
    record, signed by `key` and bound to the digest the tag serves now. Nothing on any doubt, and the run says why."""
    from imgbuild import imageref
    from imgbuild.boundedjson import loads as bounded_loads
    from imgbuild.registry.client import RegistryClient
    from imgbuild.supply import attest
    from imgbuild.supply.verify import signed_payload

    if key is None:
        progress(
            "the registry's smoke record is not used: no key to check its signature by (build --sign-key, or the "
            "site's run.signing_key); every added package is imported"
        )
        return ()
    try:
        ref = imageref.parse(plan.target)
        client = RegistryClient.for_host(ref.registry, settings, command_seconds=30)
        digest = client.content_digest(ref.repository, ref.tag or "latest")
        layers = attest.attached_layers(client, ref.repository, digest, "smoke", attest.SMOKE_RECORD) if digest else []
    except (ImgbuildError, ValueError):  # a bad reference is a ValueError too
        return ()
    for content, notes in layers:
        if not signed_payload(key, content, str(notes.get(attest.SIGNATURE_ANNOTATION, ""))):
            continue
        try:
            found = vouched(bounded_loads(content, "the smoke record"), plan.base.identity, scope, digest)
        except ValueError:
            continue
        if found:
            progress(f"the registry's {plan.target} vouches for {len(found)} distribution(s), signed: not re-imported")
            return found
    if layers:
        progress(
            f"the registry's smoke record for {plan.target} is not signed by the key, or not this image's: ignored"
        )
    return ()


def smoke_record(
    smoke: dict[str, Any], base: str, scope: str, digest: str, signer: Signer | None = None
) -> dict[str, tuple[bytes, bytes, list[bytes]]]:
    """The `.smoke` attachment of image `digest`, passed on `base` in `scope` (build.spared): what imported, each
    with its RECORD fingerprint; signed by `signer` when there is one (a fresh runner believes only that)."""
    from imgbuild.supply import attest

    meta = smoke.get("meta")
    meta = meta if isinstance(meta, dict) else {}
    rows = [row for row in meta.get("added") or [] if isinstance(row, list) and len(row) >= 4]
    added = [[str(row[0]), str(row[1]), str(row[3])] for row in rows]
    document = {"base": base, "scope": scope, "digest": digest, "ok": bool(smoke.get("ok")), "meta": {"added": added}}
    record = attest.canonical(document)
    notes = {attest.SIGNATURE_ANNOTATION: base64.b64encode(signer.sign(record)).decode()} if signer else {}
    return {"smoke": attest.artifact([(attest.SMOKE_RECORD, record, notes)])}
