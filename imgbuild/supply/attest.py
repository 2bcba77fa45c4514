"""Supply chain: what a pushed image holds (SBOM), how it was made (provenance), and a signature over both.

Formats that other tools read, in the registry beside the image (distribution 2.8 has no referrers API, so
cosign's tag scheme: `sha256-<hex>.sig`, `.att`, `.sbom` in the image's repository):
- `.sig`: a sigstore "simple signing" payload (the repository and the manifest digest) signed with an ECDSA
  P-256 key, as cosign signs and as containers/image (skopeo, podman: a `sigstoreSigned` policy) verifies;
- `.att`: an in-toto Statement with a SLSA v1 provenance predicate, in a DSSE envelope signed by the same key;
  it names the SBOM by digest, so the SBOM cannot change unseen;
- `.sbom`: a CycloneDX 1.5 JSON document of what the recipe added over its base (CycloneDX: a container
  image's layers of Python distributions, OS packages and files are its native shape, and syft reads it).

Keys are cosign's: `cosign generate-key-pair` writes them (an scrypt + nacl/secretbox encrypted PKCS#8 P-256
key, and a PEM public key). The key and its password never leave this process: no argv, log or message.
Pure in the middle (documents, envelopes, manifests); the registry client at the edges.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias
from urllib.parse import quote

from imgbuild.boundedjson import loads as bounded_loads
from imgbuild.errors import EnvironmentProblem, UsageError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey, EllipticCurvePublicKey


class AttachmentRegistry(Protocol):
    """The registry calls that attach cosign's artifacts to an image and read them back: a RegistryClient's."""

    def has_blob(self, repo: str, digest: str) -> bool: ...
    def upload_blob(self, repo: str, digest: str, source: Path) -> None: ...
    def put_manifest(self, repo: str, reference: str, content: bytes, media_type: str) -> None: ...
    def manifest_raw(self, repo: str, reference: str) -> tuple[bytes, str, str]: ...
    def blob_bytes(self, repo: str, digest: str) -> bytes: ...


#: cosign's public key, as `verify` takes it (load_verifier) and a Signer gives it: ECDSA P-256.
PublicKey: TypeAlias = "EllipticCurvePublicKey"

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
DSSE = "application/vnd.dsse.envelope.v1+json"
IN_TOTO = "application/vnd.in-toto+json"
CYCLONEDX = "application/vnd.cyclonedx+json"
STATEMENT = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/imgbuild/imgbuild/recipe-build/v1"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
KINDS = ("sig", "att", "sbom", "smoke")
#: `.smoke`: what imported in a pushed image, on which base (smoke_record): a fresh runner's next smoke test
#: imports only what changed. Unsigned: it can only spare imports, never pass an image.
SMOKE_RECORD = "application/vnd.imgbuild.smoke-record.v1+json"
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
MAX_ATTACHMENT = 16 * 2**20  # bytes of one attachment blob read back (an SBOM of thousands of packages fits)


def attachment_tag(digest: str, kind: str) -> str:
    """cosign's tag for an image digest's signature, attestation or SBOM (or imgbuild's smoke record)."""
    if not DIGEST_RE.fullmatch(digest) or kind not in KINDS:
        raise ValueError(f"not an attachment of a sha256 digest: {digest[:80]!r} {kind!r}")
    return f"sha256-{digest.removeprefix('sha256:')}.{kind}"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(document: Any) -> bytes:
    """One byte form of a JSON document: what is hashed and signed is what is stored."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# --- the documents ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Made:
    """What imgbuild knows of a promoted image: the recipe, its inputs and the smoke test's findings."""

    image: str  # the pushed repository (REGISTRY/REPO), no tag
    digest: str  # the pushed manifest's digest
    tag: str
    recipe_path: str  # as the repository names it
    recipe_sha256: str
    content_hash: str  # the plan's: the recipe, its parents, requirements, lock, copied files and templates
    git_commit: str | None
    lock_path: str | None
    lock_sha256: str | None
    base_ref: str
    base_digest: str
    added: tuple[tuple[str, str, str], ...]  # (distribution, version, license) the recipe added or changed
    hashes: dict[str, tuple[str, ...]]  # distribution -> the requirement's --hash values
    apt: tuple[tuple[str, str], ...]  # (Debian package, version; "" where unknown) the image added
    files: dict[str, str]  # destination -> sha256 of what was copied
    builder: dict[str, str]  # engine, version, backend
    imgbuild_version: str
    smoke: dict[str, Any]  # ok, summary
    fleet: tuple[str, ...]  # the fleet verdicts
    git_dirty: bool = False  # the recipe or a file it names had uncommitted changes when it was built
    finished: str = ""  # RFC 3339, UTC: when the image was pushed and described
    started: str = ""  # RFC 3339, UTC: when the imgbuild run that built it started
    invocation: str = ""  # that run's own id: the images one run built share it
    requirements_path: str | None = None  # the recipe's pip requirements file, as the repository names it
    requirements_sha256: str | None = None
    pip: tuple[str, ...] = ()  # every requirement the pip step was given, as written


def sbom(made: Made) -> dict[str, Any]:
    """CycloneDX 1.5 of what the recipe added over its base; the base itself one component, pinned by digest."""
    base_name, _, base_version = made.base_ref.rpartition(":")
    components: list[dict[str, Any]] = [
        {
            "type": "container",
            "bom-ref": "base",
            "name": base_name or made.base_ref,
            "version": made.base_digest,
            "description": f"the base image {made.base_ref}, pinned by digest",
            "hashes": [{"alg": "SHA-256", "content": made.base_digest.removeprefix("sha256:")}],
        }
    ]
    for name, version, license_ in made.added:
        component: dict[str, Any] = {
            "type": "library",
            "bom-ref": f"pypi:{name}",
            "name": name,
            "version": version,
            "purl": f"pkg:pypi/{name}@{version}",
        }
        if license_:
            component["licenses"] = [{"license": {"name": license_[:200]}}]
        if made.hashes.get(name):
            component["hashes"] = [
                {"alg": "SHA-256", "content": h.split(":", 1)[1]} for h in made.hashes[name] if h.startswith("sha256:")
            ]
        components.append(component)
    for package, version in made.apt:
        deb: dict[str, Any] = {"type": "library", "bom-ref": f"deb:{package}", "name": package}
        deb["purl"] = f"pkg:deb/debian/{package}@{quote(version, safe='')}" if version else f"pkg:deb/{package}"
        if version:
            deb["version"] = version
        components.append(deb)
    for dest, digest in sorted(made.files.items()):
        components.append(
            {
                "type": "file",
                "bom-ref": f"file:{dest}",
                "name": dest,
                "hashes": [{"alg": "SHA-256", "content": digest.removeprefix("sha256:")}],
            }
        )
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "imgbuild", "version": made.imgbuild_version}]},
            "component": {
                "type": "container",
                "bom-ref": "image",
                "name": made.image,
                "version": made.digest,
            },
        },
        "components": components,
        "dependencies": [{"ref": "image", "dependsOn": [c["bom-ref"] for c in components]}],
    }


def provenance(made: Made, sbom_digest: str) -> dict[str, Any]:
    """An in-toto Statement, SLSA v1 provenance: the recipe (path, hash, commit), the lock, the base, the builder,
    imgbuild, the smoke result and fleet verdicts, and the SBOM by digest."""
    parameters: dict[str, Any] = {
        "recipe": {"path": made.recipe_path, "sha256": made.recipe_sha256, "contentHash": made.content_hash}
    }
    if made.git_commit:
        parameters["recipe"]["gitCommit"] = made.git_commit
        parameters["recipe"]["gitTreeDirty"] = made.git_dirty  # the commit alone does not say what was built
    if made.lock_path:
        parameters["lock"] = {"path": made.lock_path, "sha256": made.lock_sha256}
    if made.requirements_path:
        parameters["requirements"] = {"path": made.requirements_path, "sha256": made.requirements_sha256}
    if made.pip:
        parameters["pip"] = list(made.pip)
    run = {"invocationId": made.invocation, "startedOn": made.started, "finishedOn": made.finished}
    return {
        "_type": STATEMENT,
        "subject": [{"name": made.image, "digest": {"sha256": made.digest.removeprefix("sha256:")}}],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": parameters,
                "internalParameters": {"tag": made.tag},
                "resolvedDependencies": [
                    {"uri": f"oci://{made.base_ref}", "digest": {"sha256": made.base_digest.removeprefix("sha256:")}}
                ],
            },
            "runDetails": {
                "builder": {
                    "id": "https://github.com/imgbuild/imgbuild",
                    "version": {"imgbuild": made.imgbuild_version, **made.builder},
                },
                "metadata": {key: value for key, value in run.items() if value},
                "byproducts": [
                    {"name": "sbom", "mediaType": CYCLONEDX, "digest": {"sha256": sbom_digest.removeprefix("sha256:")}},
                    {"name": "smoke", "content": base64.b64encode(canonical(made.smoke)).decode()},
                    {"name": "fleet", "content": base64.b64encode(canonical(list(made.fleet))).decode()},
                ],
            },
        },
    }


def simple_signing(image: str, digest: str) -> bytes:
    """The payload cosign signs and containers/image checks: the repository and the manifest digest."""
    payload = {
        "critical": {
            "identity": {"docker-reference": image},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature",
        },
        "optional": None,
    }
    return json.dumps(payload, separators=(",", ":")).encode()


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what an envelope's signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


# --- keys ---------------------------------------------------------------------------------------------------


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ec

        return ec
    except ImportError:
        raise EnvironmentProblem("signing needs the cryptography package: pip install 'imgbuild[sign]'") from None


class Signer:
    """An ECDSA P-256 private key, from cosign's encrypted key file. Its repr and errors never show it."""

    def __init__(self, key: EllipticCurvePrivateKey) -> None:
        self._key = key

    def __repr__(self) -> str:
        return "Signer(<private key>)"

    def sign(self, data: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes

        ec = _crypto()
        return bytes(self._key.sign(data, ec.ECDSA(hashes.SHA256())))

    def public_key(self) -> PublicKey:  # the public half, as `verify` takes it (load_verifier)
        return self._key.public_key()


_PEM_RE = re.compile(
    r"-----BEGIN ENCRYPTED (COSIGN|SIGSTORE) PRIVATE KEY-----\s+([A-Za-z0-9+/=\s]{1,65536}?)\s+-----END"
)


def load_signer(path: Path, password: bytes) -> Signer:
    """cosign's encrypted private key: scrypt derives the key that opens a nacl/secretbox over PKCS#8 DER."""
    from imgbuild.hostio.regular import read_named

    try:
        text = read_named(path, 70000).decode(errors="replace")
    except OSError as exc:
        raise UsageError(f"signing key {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"signing key {path}: {exc}") from None
    found = _PEM_RE.search(text)
    if not found:
        raise UsageError(f"signing key {path}: not a cosign private key (cosign generate-key-pair writes one)")
    try:
        import nacl.exceptions
        import nacl.secret
    except ImportError:
        raise EnvironmentProblem("signing needs the pynacl package: pip install 'imgbuild[sign]'") from None
    try:
        sealed = bounded_loads(base64.b64decode(found.group(2)))
        kdf, cipher = sealed["kdf"], sealed["cipher"]
        params = kdf["params"]
        if kdf["name"] != "scrypt" or cipher["name"] != "nacl/secretbox":
            raise ValueError
        n, r, p = int(params["N"]), int(params["r"]), int(params["p"])
        if not (2 <= n <= 2**20 and 1 <= r <= 32 and 1 <= p <= 16):  # bounded work and memory
            raise ValueError
        secret = hashlib.scrypt(
            password, salt=base64.b64decode(kdf["salt"]), n=n, r=r, p=p, dklen=32, maxmem=256 * 2**20
        )
        der = nacl.secret.SecretBox(secret).decrypt(
            base64.b64decode(sealed["ciphertext"]), base64.b64decode(cipher["nonce"])
        )
    except nacl.exceptions.CryptoError:
        raise UsageError(f"signing key {path}: the password does not open it") from None
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"signing key {path}: not a cosign private key (its sealed content is unreadable)") from None
    from cryptography.hazmat.primitives import serialization

    ec = _crypto()
    key = serialization.load_der_private_key(der, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise UsageError(f"signing key {path}: not an ECDSA P-256 key")
    return Signer(key)


def load_verifier(path: Path) -> PublicKey:
    """A PEM public key (cosign.pub)."""
    ec = _crypto()
    from cryptography.hazmat.primitives import serialization

    from imgbuild.hostio.regular import read_named

    try:
        data = read_named(path, 65536)
    except OSError as exc:
        raise UsageError(f"--key {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"--key {path}: {exc}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise UsageError(f"--key {path}: not a PEM public key (cosign.pub)") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):  # no cosign signature could verify under it
        raise UsageError(f"--key {path}: not an ECDSA public key (cosign.pub)")
    return key


def signature_ok(public_key: PublicKey, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes

    ec = _crypto()
    try:
        public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


# --- OCI artifacts ------------------------------------------------------------------------------------------


def artifact(layers: list[tuple[str, bytes, dict[str, str]]]) -> tuple[bytes, bytes, list[bytes]]:
    """(config, manifest, blobs) of an OCI artifact holding `layers` (media type, content, annotations), shaped
    as cosign writes its attachments (a config naming the layers' digests)."""
    config = canonical(
        {
            "architecture": "",
            "os": "",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [sha256(content) for _, content, _ in layers]},
        }
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "size": len(config), "digest": sha256(config)},
        "layers": [
            {
                "mediaType": media,
                "size": len(content),
                "digest": sha256(content),
                **({"annotations": notes} if notes else {}),
            }
            for media, content, notes in layers
        ],
    }
    return config, canonical(manifest), [content for _, content, _ in layers]


def attached_layers(
    client: AttachmentRegistry, repo: str, digest: str, kind: str, media: str
) -> list[tuple[bytes, dict[str, str]]]:
    """The `media` layers of `digest`'s `kind` attachment: (content, annotations); none when it is absent."""
    from imgbuild.errors import RegistryError

    try:
        body, _, _ = client.manifest_raw(repo, attachment_tag(digest, kind))
    except RegistryError:
        return []
    try:
        manifest = bounded_loads(body)
        layers = [layer for layer in manifest.get("layers", [])[:16] if layer.get("mediaType") == media]
    except (ValueError, AttributeError):
        return []
    out = []
    for layer in layers:
        blob_digest, notes, size = str(layer.get("digest", "")), layer.get("annotations") or {}, layer.get("size")
        sized = isinstance(size, int) and 0 <= size <= MAX_ATTACHMENT  # the registry's word is untrusted too
        if DIGEST_RE.fullmatch(blob_digest) and sized and isinstance(notes, dict):
            try:
                content = client.blob_bytes(repo, blob_digest)
            except RegistryError:  # absent, or served with another digest: this layer vouches for nothing
                continue
            out.append((content, {str(k): str(v) for k, v in notes.items()}))
    return out


def attachments(made: Made, signer: Signer) -> dict[str, tuple[bytes, bytes, list[bytes]]]:
    """The three artifacts for `made`, by kind: signature, attestation (provenance naming the SBOM), SBOM."""
    sbom_bytes = canonical(sbom(made))
    statement = canonical(provenance(made, sha256(sbom_bytes)))
    envelope = canonical(
        {
            "payloadType": IN_TOTO,
            "payload": base64.b64encode(statement).decode(),
            "signatures": [{"keyid": "", "sig": base64.b64encode(signer.sign(pae(IN_TOTO, statement))).decode()}],
        }
    )
    return {
        "sig": signature_artifact(made.image, made.digest, signer),
        "att": artifact([(DSSE, envelope, {"predicateType": SLSA_PROVENANCE})]),
        "sbom": artifact([(CYCLONEDX, sbom_bytes, {})]),
    }


def signature_artifact(image: str, digest: str, signer: Signer) -> tuple[bytes, bytes, list[bytes]]:
    """cosign's signature of `image@digest`: its simple-signing payload, signed."""
    payload = simple_signing(image, digest)
    signature = base64.b64encode(signer.sign(payload)).decode()
    return artifact([(SIMPLE_SIGNING, payload, {SIGNATURE_ANNOTATION: signature})])


def publish(
    client: AttachmentRegistry, repo: str, digest: str, parts: dict[str, tuple[bytes, bytes, list[bytes]]]
) -> list[str]:
    """Upload each artifact's blobs and manifest under cosign's tag for `digest`; the tags written. A signature is
    added to those already there (another key's, before a rotation), never put in their place."""
    import tempfile

    written = []
    for kind, part in parts.items():
        config, manifest, blobs = _with_earlier_signatures(client, repo, digest, part) if kind == "sig" else part
        for blob in (config, *blobs):
            blob_digest = sha256(blob)
            if client.has_blob(repo, blob_digest):
                continue
            with tempfile.NamedTemporaryFile(prefix="imgbuild-attach-") as tmp:
                tmp.write(blob)
                tmp.flush()
                client.upload_blob(repo, blob_digest, Path(tmp.name))
        tag = attachment_tag(digest, kind)
        client.put_manifest(repo, tag, manifest, OCI_MANIFEST)
        written.append(tag)
    return written


#: Signatures kept on one digest: the newest, within what a verifier reads (attached_layers' 16 layers).
MAX_SIGNATURES = 16


def _with_earlier_signatures(
    client: AttachmentRegistry, repo: str, digest: str, part: tuple[bytes, bytes, list[bytes]]
) -> tuple[bytes, bytes, list[bytes]]:
    """The `.sig` artifact `part` with the signatures already attached to `digest` before it (each once)."""
    _, manifest, blobs = part
    notes = [layer.get("annotations") or {} for layer in json.loads(manifest)["layers"]]
    new = [(SIMPLE_SIGNING, blob, note) for blob, note in zip(blobs, notes, strict=True)]
    earlier = [
        (SIMPLE_SIGNING, content, note)
        for content, note in attached_layers(client, repo, digest, "sig", SIMPLE_SIGNING)
    ]
    kept = [layer for layer in earlier if layer not in new]
    return artifact([*kept, *new][-MAX_SIGNATURES:])
