"""Grace (arm64) images from this amd64 machine, for real: Podman builds a recipe for linux/amd64 and linux/arm64
over the bed's NGC PyTorch 24.05, whose manifest list holds a real arm64 image (`tests/testbed/up --all`: an arm64
Debian with PyPI's aarch64 torch), the arm64 one under Debian's qemu-user-static; each is smoke-tested, the arm64
one under emulation; the push is one signed manifest list that `verify` checks and `smoke --for gh200,gb10` judges
on its arm64 image. Docker, which has no buildx here, refuses the foreign platform in one line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest

from imgbuild.engine.emulation import emulator
from tests.conftest import run_cli
from tests.cosign_keys import write_key_pair

pytestmark = pytest.mark.engine

LIST_TYPES = (
    "application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.index.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
)


def _get(url: str) -> tuple[bytes, str]:
    req = urllib.request.Request(url, headers={"Accept": LIST_TYPES})
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - the bed's registry on 127.0.0.1
        return resp.read(), resp.headers.get("Content-Type", "")


def _podman_arch(ref: str) -> str:
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Architecture}}", ref], capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip()


@pytest.fixture
def podman(testbed, monkeypatch):
    socket = testbed.get("IMGBUILD_TESTBED_PODMAN")
    if not socket:
        pytest.fail("no Podman on the bed: bring it up with tests/testbed/up --all")
    if not emulator("linux/arm64"):
        pytest.fail("no qemu-aarch64 registered with binfmt_misc: tests/testbed/up --all registers it")
    monkeypatch.setenv("IMGBUILD_PODMAN_SOCKET", socket)
    monkeypatch.setenv("IMGBUILD_ENGINE", "podman")
    return testbed


def _recipe(tmp_path: Path, image: str) -> Path:
    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / "files").mkdir(exist_ok=True)
    (tmp_path / "files" / "hello.py").write_text("import platform\nprint('hello from', platform.machine())\n")
    recipe = tmp_path / "grace.yaml"
    recipe.write_text(
        f'name: grace\ntag: v1\nimage: {image}\nbase: {{framework: pytorch, tag: "24.05"}}\n'
        "pip: {packages: [einops==0.8.1]}\n"
        "files: [{src: files/hello.py, dest: /opt/app/hello.py}]\n"
        'smoke: {run: ["python3 /opt/app/hello.py"]}\n'
        "platforms: [linux/amd64, linux/arm64]\n"
    )
    return recipe


@pytest.mark.podman
def test_a_recipe_is_built_for_amd64_and_arm64_and_pushed_as_one_signed_manifest_list(podman, tmp_path):
    registry = os.environ["IMGBUILD_TESTBED_REGISTRY"]
    repo = f"imgbuildtest/grace-{uuid.uuid4().hex[:8]}"
    image = f"{registry}/{repo}"
    recipe = _recipe(tmp_path, image)
    private, public = write_key_pair(tmp_path, b"grace-pw")
    res = run_cli(
        "build", str(recipe), "--platform", "linux/amd64,linux/arm64", "--push", "--sign-key", str(private), "--json",
        cwd=tmp_path, env={"IMGBUILD_SIGN_PASSWORD": "grace-pw"}, timeout=1500,
    )  # fmt: skip
    assert res.code == 0, res.err[-3000:]
    made = json.loads(res.out)
    own, arm = made["platforms"]
    assert (own["image"], own["platform"]) == (f"{image}:v1", None)
    assert (arm["image"], arm["platform"]) == (f"{image}:v1-arm64", "linux/arm64")
    assert _podman_arch(f"{image}:v1") == "amd64" and _podman_arch(f"{image}:v1-arm64") == "arm64"
    # the arm64 smoke test ran the recipe's own check under qemu, and says what it could not prove
    checks = {c["name"]: c for c in arm["smoke"]["checks"]}
    assert checks["recipe checks"]["status"] == "pass" and checks["imports"]["status"] == "pass"
    assert checks["emulation"]["status"] == "skip" and "not proven under emulation" in checks["emulation"]["reason"]
    assert arm["smoke"]["meta"]["machine"] == "aarch64" and own["smoke"]["meta"]["machine"] == "x86_64"
    # the registry: a manifest list of both, each entry the digest of what the registry serves for it
    body, kind = _get(f"http://{registry}/v2/{repo}/manifests/v1")
    listing = json.loads(body)
    assert kind.startswith("application/vnd.docker.distribution.manifest.list.v2+json")
    platforms = {m["platform"]["architecture"]: m for m in listing["manifests"]}
    assert set(platforms) == {"amd64", "arm64"} and platforms["arm64"]["platform"]["variant"] == "v8"
    for arch, entry in platforms.items():
        served, _ = _get(f"http://{registry}/v2/{repo}/manifests/{entry['digest']}")
        assert "sha256:" + hashlib.sha256(served).hexdigest() == entry["digest"] and len(served) == entry["size"]
        config = json.loads(_get(f"http://{registry}/v2/{repo}/blobs/{json.loads(served)['config']['digest']}")[0])
        assert config["architecture"] == arch
    assert made["pushed_digest"] == "sha256:" + hashlib.sha256(body).hexdigest()
    # what a Grace node pulls is signed, and judged runnable on Grace GPUs from its arm64 image
    verified = run_cli("verify", f"{image}:v1", "--key", str(public), "--recipe", str(recipe))
    assert verified.code == 0, verified.out + verified.err
    assert verified.out.splitlines()[0].startswith("ok signature")
    judged = run_cli("smoke", f"{image}:v1", "--for", "gh200,gb10", "--json")
    assert judged.code == 0, judged.out + judged.err
    fleet = next(c for c in json.loads(judged.out)["checks"] if c["name"] == "fleet")
    assert {v["target"]: v["runs"] for v in fleet["details"]["verdicts"]} == {"gh200": True, "gb10": True}
    # the recipe names both platforms: rebuild finds both here and in the registry, signed, and builds nothing
    again = run_cli(
        "rebuild", str(recipe), "--push", "--sign-key", str(private), "--json",
        cwd=tmp_path, env={"IMGBUILD_SIGN_PASSWORD": "grace-pw"}, timeout=900,
    )  # fmt: skip
    assert again.code == 0, again.err[-3000:]
    assert [i["status"] for i in json.loads(again.out)["images"]] == ["fresh"], again.out
    # the arm64 image runs its code as an arm64 machine
    out = subprocess.run(
        ["podman", "run", "--rm", "--platform", "linux/arm64", "--entrypoint", "python3", f"{image}:v1-arm64",
         "/opt/app/hello.py"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "hello from aarch64"
    for ref in (f"{image}:v1", f"{image}:v1-arm64", f"{image}:v1-amd64"):
        subprocess.run(["podman", "untag", ref], capture_output=True, timeout=60)


def test_docker_refuses_a_foreign_platform_in_one_line_before_building(testbed, tmp_path, monkeypatch):
    monkeypatch.setenv("IMGBUILD_ENGINE", "docker")
    recipe = _recipe(tmp_path, f"imgbuildtest/grace-{uuid.uuid4().hex[:8]}")
    res = run_cli("build", str(recipe), "--platform", "linux/arm64", cwd=tmp_path)
    assert res.code == 3, res.err
    lines = res.err.strip().splitlines()
    assert lines[-1].startswith("imgbuild: the Docker engine here builds and smoke-tests linux/amd64 images only")
    assert "Podman" in lines[-1] and "Traceback" not in res.err
    assert not (tmp_path / "images").exists() or not list((tmp_path / "images").rglob("smoke*.json"))
