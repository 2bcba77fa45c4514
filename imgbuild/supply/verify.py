"""`imgbuild verify`: check what a pushed image carries beside it, as another site would: the signature over its
digest, the provenance statement (signed, naming this recipe and the SBOM by digest) and the SBOM itself."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from imgbuild.boundedjson import loads as bounded_loads
from imgbuild.supply.attest import (
    CYCLONEDX,
    DSSE,
    IN_TOTO,
    SIGNATURE_ANNOTATION,
    SIMPLE_SIGNING,
    SLSA_PROVENANCE,
    attached_layers,
    pae,
    sha256,
    signature_ok,
)

if TYPE_CHECKING:
    from imgbuild.supply.attest import AttachmentRegistry, PublicKey


@dataclass(frozen=True)
class Verdict:
    check: str  # signature, provenance, recipe, sbom
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAIL'} {self.check}: {self.detail}"


def signed_payload(public_key: PublicKey, payload: bytes, signature: str) -> bool:
    """Whether `signature` (base64, as an annotation or envelope holds it) is `public_key`'s over `payload`."""
    try:
        raw = base64.b64decode(signature, validate=True)
    except (ValueError, TypeError):  # not base64, or not text at all (an envelope's "sig" is untrusted)
        return False
    return signature_ok(public_key, raw, payload)


def check_signature(client: AttachmentRegistry, repo: str, image: str, digest: str, public_key: PublicKey) -> Verdict:
    for payload, notes in attached_layers(client, repo, digest, "sig", SIMPLE_SIGNING):
        if not signed_payload(public_key, payload, notes.get(SIGNATURE_ANNOTATION, "")):
            continue
        try:
            critical = bounded_loads(payload)["critical"]
            signed_digest = critical["image"]["docker-manifest-digest"]
            signed_image = critical["identity"]["docker-reference"]
        except (ValueError, KeyError, TypeError):
            continue
        if signed_digest == digest and signed_image == image:
            return Verdict("signature", True, f"{image}@{digest} signed by the key")
    return Verdict("signature", False, f"no signature by this key over {image}@{digest}")


def check_attestation(
    client: AttachmentRegistry,
    repo: str,
    image: str,
    digest: str,
    public_key: PublicKey,
    recipe_content: str | None,
) -> tuple[list[Verdict], dict[str, Any] | None]:
    """The provenance verdicts, and the statement when one is signed by the key for this digest."""
    for envelope_bytes, _ in attached_layers(client, repo, digest, "att", DSSE):
        try:
            envelope = bounded_loads(envelope_bytes)
            statement_bytes = base64.b64decode(envelope["payload"], validate=True)
            signatures = [s["sig"] for s in envelope["signatures"]]
            if envelope["payloadType"] != IN_TOTO:
                continue
        except (ValueError, KeyError, TypeError):
            continue
        if not any(signed_payload(public_key, pae(IN_TOTO, statement_bytes), sig) for sig in signatures):
            continue
        try:
            statement = bounded_loads(statement_bytes)
            subjects = {s["digest"]["sha256"] for s in statement["subject"]}
        except (ValueError, KeyError, TypeError):
            continue
        if digest.removeprefix("sha256:") not in subjects or statement.get("predicateType") != SLSA_PROVENANCE:
            continue
        verdicts = [Verdict("provenance", True, f"signed SLSA provenance for {digest}")]
        if recipe_content is not None:
            recipe = statement["predicate"]["buildDefinition"]["externalParameters"].get("recipe", {})
            same = recipe.get("contentHash") == recipe_content
            if "contentHash" not in recipe:
                detail = f"built from {recipe.get('path')}, but its provenance records no content hash to compare"
            else:
                detail = f"built from {recipe.get('path')} " + (
                    "as it is here (with its parents, requirements, lock and files)"
                    if same
                    else "as it was then; it or its parents, requirements, lock or files have changed"
                )
            verdicts.append(Verdict("recipe", same, detail))
        return verdicts, statement
    return [Verdict("provenance", False, f"no provenance signed by this key for {digest}")], None


def check_sbom(client: AttachmentRegistry, repo: str, digest: str, statement: dict[str, Any] | None) -> Verdict:
    """The SBOM attached to `digest`: every layer of it (a consumer reads them all) the one the signed provenance
    names, naming the base by its digest."""
    layers = attached_layers(client, repo, digest, "sbom", CYCLONEDX)
    if not layers:
        return Verdict("sbom", False, f"no SBOM for {digest}")
    if statement is None:
        return Verdict("sbom", False, "an SBOM, but no signed provenance vouches for it")
    try:
        run = statement["predicate"]["runDetails"]
        named = {b["digest"]["sha256"] for b in run["byproducts"] if b.get("name") == "sbom"}
        base = statement["predicate"]["buildDefinition"]["resolvedDependencies"][0]["digest"]["sha256"]
        documents = [bounded_loads(content) for content, _ in layers]
        bases = [{c.get("version") for c in d.get("components", []) if c.get("bom-ref") == "base"} for d in documents]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return Verdict("sbom", False, "the SBOM or the provenance is malformed")
    for n, (content, _) in enumerate(layers, 1):
        if sha256(content).removeprefix("sha256:") not in named:
            return Verdict(
                "sbom", False, "the SBOM is not the one the signed provenance names (changed or added since: layer "
                f"{n} of {len(layers)}, {sha256(content)})",
            )  # fmt: skip
    if any(f"sha256:{base}" not in named_bases for named_bases in bases):
        return Verdict("sbom", False, "the SBOM does not name the base image's digest")
    count = len(documents[0].get("components", []))
    return Verdict("sbom", True, f"{count} components over the base sha256:{base}")


def verify(
    client: AttachmentRegistry,
    repo: str,
    image: str,
    digest: str,
    public_key: PublicKey,
    recipe_content: str | None,
) -> list[Verdict]:
    """Every check of a pushed image: its signature, its signed provenance (and recipe), its SBOM."""
    verdicts = [check_signature(client, repo, image, digest, public_key)]
    provenance_verdicts, statement = check_attestation(client, repo, image, digest, public_key, recipe_content)
    return [*verdicts, *provenance_verdicts, check_sbom(client, repo, digest, statement)]
