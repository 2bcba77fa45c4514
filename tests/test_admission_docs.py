"""docs/admission.md's two admission policies, judged by the rules each project publishes (no API server, no
policy-controller and no Kyverno can run here), and against a signature imgbuild makes:

- sigstore/policy-controller `config/300-clusterimagepolicy.yaml`: the ClusterImagePolicy CRD (group
  policy.sigstore.dev, versions v1alpha1 and v1beta1; `spec.images[].glob`, `spec.authorities[].key.data`,
  `.hashAlgorithm`, `.ctlog`); `pkg/webhook/validator.go`: a `key` authority with no `ctlog` gets no Rekor client and
  so `IgnoreTlog = true`; `pkg/apis/glob/glob.go`: a glob must match `^[a-zA-Z0-9-_:\\/\\*\\.@]+$`, `.` is literal,
  `**` is any characters, `*` any but `/`, anchored on both ends, matched against the parsed reference's name;
- kyverno `ext/wildcard/match.go` calls IGLOU-EU/go-wildcard v2 `Match`: `*` any characters (`/` too), `.` and `?`
  one character (`?` also none at the end), everything else literal; the key entry's `rekor.ignoreTlog` skips the log.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from imgbuild.supply import attest
from tests.cosign_keys import write_key_pair

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "admission.md"
FENCE = re.compile(r"(?ms)^<!-- docs: admission-policy -->\n```yaml\n(?P<body>.*?)^```")
DIGEST = "sha256:" + "c" * 64
#: imgbuild's images on the docs' registry: `<image_registry>/<user>/<name>:<tag>`, by tag and by digest.
OURS = ["registry.example.org/alice/research:v1", f"registry.example.org/bob/tf-keras@{DIGEST}"]
NOT_OURS = ["docker.io/library/ubuntu:22.04", "registry.example.org.evil.io/alice/research:v1"]


def policies() -> dict[str, dict]:
    found = {doc["kind"]: doc for doc in (yaml.safe_load(m["body"]) for m in FENCE.finditer(DOC.read_text()))}
    assert set(found) == {"ClusterImagePolicy", "ClusterPolicy"}, found.keys()
    return found


# --- the projects' matchers, as their source writes them ------------------------------------------------------


def policy_controller_glob(glob: str, image: str) -> bool:
    assert re.fullmatch(r"[a-zA-Z0-9\-_:/*.@]+", glob), f"the policy-controller refuses the glob {glob!r}"
    pattern = glob.replace(".", r"\.").replace("**", "#").replace("*", "[^/]*").replace("#", ".*")
    return re.fullmatch(pattern, image) is not None


def go_wildcard(pattern: str, s: str) -> bool:
    """IGLOU-EU/go-wildcard v2 Match, step for step (a backtracking scan with one remembered star)."""
    if pattern == "":
        return s == ""
    if pattern == "*" or s == pattern:
        return True
    p = i = last = 0
    star = -1
    while i < len(s):
        if p < len(pattern) and pattern[p] == "*":
            star, last, p = p, i, p + 1
            continue
        if p < len(pattern) and (pattern[p] in "?." or pattern[p] == s[i]):
            p, i = p + 1, i + 1
            continue
        if star == -1:
            return False
        p, last = star + 1, last + 1
        i = last
    while p < len(pattern) and pattern[p] in "*?":
        p += 1
    return p == len(pattern)


@pytest.mark.parametrize(
    "pattern, name, matched",
    [
        ("registry.example.org/*", "registry.example.org/alice/x:1", True),  # `*` crosses `/`
        ("registry.example.org/*", "registryXexampleYorg/alice/x:1", True),  # `.` is any one character
        ("ghcr.io/kyverno/test-verify-image*", "ghcr.io/kyverno/test-verify-image:signed", True),  # Kyverno's docs
        ("ghcr.io/kyverno/test-verify-image*", "ghcr.io/other/test-verify-image:signed", False),
        ("a?", "a", True),  # `?` may match nothing at the end
        ("*", "", True),
    ],
)
def test_the_wildcard_model_behaves_as_go_wildcards_own_examples(pattern, name, matched):
    assert go_wildcard(pattern, name) is matched


# --- the policies ---------------------------------------------------------------------------------------------


def test_the_cluster_image_policy_is_a_served_version_with_a_key_authority_and_no_log():
    cip = policies()["ClusterImagePolicy"]
    assert cip["apiVersion"] == "policy.sigstore.dev/v1beta1"  # served (v1alpha1 too), the CRD's storage is v1alpha1
    assert set(cip["spec"]) <= {"images", "authorities", "mode", "policy", "match"}
    (authority,) = cip["spec"]["authorities"]
    assert set(authority) == {"name", "key"}  # no ctlog: no Rekor client, so the controller ignores the log
    assert set(authority["key"]) <= {"data", "hashAlgorithm", "kms", "secretRef"}
    assert authority["key"].get("hashAlgorithm", "sha256") == "sha256"  # cosign's P-256 keys sign SHA-256


@pytest.mark.parametrize("image", OURS + NOT_OURS)
def test_the_cluster_image_policy_glob_covers_every_users_images_and_nothing_else(image):
    globs = [entry["glob"] for entry in policies()["ClusterImagePolicy"]["spec"]["images"]]
    assert any(policy_controller_glob(g, image) for g in globs) is (image in OURS), (globs, image)


def test_the_kyverno_rule_checks_imgbuilds_images_without_the_log():
    policy = policies()["ClusterPolicy"]
    assert policy["apiVersion"] == "kyverno.io/v1"
    (rule,) = policy["spec"]["rules"]
    (verify,) = rule["verifyImages"]
    assert verify["failureAction"] == "Enforce" and verify.get("mutateDigest", True) is True
    for image in OURS:
        assert any(go_wildcard(p, image) for p in verify["imageReferences"]), image
    (attestor,) = verify["attestors"]
    (entry,) = attestor["entries"]
    assert attestor["count"] == 1 and entry["keys"]["rekor"] == {"ignoreTlog": True}


def _keys_in_the_docs() -> list[str]:
    found = policies()
    cip_key = found["ClusterImagePolicy"]["spec"]["authorities"][0]["key"]["data"]
    kyverno_key = found["ClusterPolicy"]["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]["entries"][0]["keys"]
    return [cip_key, kyverno_key["publicKeys"]]


def test_both_policies_hold_a_cosign_public_key_as_cosign_pub_is_written():
    for pem in _keys_in_the_docs():
        key = serialization.load_pem_public_key(pem.encode())
        assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    first, second = _keys_in_the_docs()
    assert first.strip() == second.strip()


def test_an_imgbuild_signature_is_what_both_verify_with_the_key_as_the_policies_hold_it(tmp_path):
    """A signature imgbuild makes: at cosign's tag, in cosign's payload format, verified (cryptography, not
    imgbuild's verifier) with the public key as a policy holds it (its PEM re-indented out of the YAML), and
    without a Rekor bundle, which is why both policies must not demand the log."""
    private, public = write_key_pair(tmp_path, b"pw")
    cip = policies()["ClusterImagePolicy"]
    cip["spec"]["authorities"][0]["key"]["data"] = public.read_text()  # the site pastes its cosign.pub
    held = yaml.safe_load(yaml.safe_dump(cip))["spec"]["authorities"][0]["key"]["data"]
    key = serialization.load_pem_public_key(held.encode())
    signer = attest.load_signer(private, b"pw")
    made = attest.Made(
        image="registry.example.org/alice/research", digest=DIGEST, tag="v1", recipe_path="recipes/research.yaml",
        recipe_sha256="1" * 64, content_hash="2" * 64, git_commit=None, lock_path=None, lock_sha256=None,
        base_ref="nvcr.io/nvidia/pytorch:25.10-py3", base_digest="sha256:" + "3" * 64, added=(), hashes={}, apt=(),
        files={}, builder={"engine": "docker"}, imgbuild_version="0", smoke={"ok": True}, fleet=(),
    )  # fmt: skip
    _config, manifest, blobs = attest.attachments(made, signer)["sig"]  # what `build --push --sign-key` publishes
    (layer,) = json.loads(manifest)["layers"]
    assert attest.attachment_tag(DIGEST, "sig") == "sha256-" + "c" * 64 + ".sig"
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    assert set(layer["annotations"]) == {"dev.cosignproject.cosign/signature"}  # no dev.sigstore.cosign/bundle
    (blob,) = [b for b in blobs if attest.sha256(b) == layer["digest"]]
    assert json.loads(blob)["critical"]["image"]["docker-manifest-digest"] == DIGEST
    key.verify(base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"]), blob,
               ec.ECDSA(hashes.SHA256()))  # fmt: skip
