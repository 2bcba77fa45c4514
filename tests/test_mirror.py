"""`imgbuild mirror` between two real registries: the test bed's (the source, standing in for nvcr.io) and a
second `docker-registry` started here (the site mirror)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import IMGBUILD, ROOT, run_cli

ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


class Mirror:
    """A docker-registry on a free loopback port, with delete enabled; stop() and start() keep its data."""

    def __init__(self, root: Path):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.host = f"127.0.0.1:{probe.getsockname()[1]}"
        root.mkdir(parents=True, exist_ok=True)
        self.data = root / "data"
        self.config = root / "config.yml"
        self.config.write_text(
            f"version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {self.data}}}\n"
            f"  delete: {{enabled: true}}\nhttp: {{addr: {self.host}}}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("docker-registry")
        assert binary, "tests/testbed/up installs docker-registry"
        self.proc = subprocess.Popen(
            [binary, "serve", str(self.config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(100):
            try:
                if requests.get(f"http://{self.host}/v2/", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                time.sleep(0.1)
        raise AssertionError("the mirror registry did not come up")

    def stop(self) -> None:
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def digest(self, repo: str, tag: str) -> str | None:
        resp = requests.head(f"http://{self.host}/v2/{repo}/manifests/{tag}", headers={"Accept": ACCEPT}, timeout=10)
        return resp.headers.get("Docker-Content-Digest") if resp.status_code == 200 else None


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    registry = Mirror(tmp_path / "mirror")
    registry.start()
    yield registry
    registry.stop()


def _source_digest(testbed: dict[str, str], repo: str, tag: str) -> str:
    host = testbed["IMGBUILD_TESTBED_REGISTRY"]
    resp = requests.head(f"http://{host}/v2/{repo}/manifests/{tag}", headers={"Accept": ACCEPT}, timeout=10)
    return resp.headers["Docker-Content-Digest"]


@pytest.mark.engine
@pytest.mark.fidelity
def test_mirror_copies_with_digests_kept_and_a_second_run_copies_nothing(testbed, mirror, tmp_path):
    first = run_cli("mirror", "tensorflow", "--to", mirror.host, "--since", "24.01", "--json")
    assert first.code == 0, first.err
    assert {c["tag"] for c in json.loads(first.out)} == {"24.05-tf2-py3", "25.02-tf2-py3"}
    (copied,) = [c for c in json.loads(first.out) if c["tag"] == "24.05-tf2-py3"]
    assert copied["status"] == "copied" and copied["blobs_copied"] >= 2
    assert sum(c["bytes_copied"] for c in json.loads(first.out)) > 100 * 2**20  # the two share TensorFlow's layers
    want = _source_digest(testbed, "nvidia/tensorflow", "24.05-tf2-py3")
    assert copied["digest"] == want == mirror.digest("nvidia/tensorflow", "24.05-tf2-py3")
    # NGC's tags are manifest lists: the arm64 image (config only, on the bed) is copied with the amd64 one
    listing = requests.get(
        f"http://{mirror.host}/v2/nvidia/tensorflow/manifests/24.05-tf2-py3", headers={"Accept": ACCEPT}, timeout=10
    ).json()
    assert {m["platform"]["architecture"] for m in listing["manifests"]} == {"amd64", "arm64"}
    again = run_cli("mirror", "tensorflow", "--to", mirror.host, "--tag", "24.05-tf2-py3", "--json")
    nothing = {"blobs_copied": 0, "blobs_present": 0, "blobs_mounted": 0, "bytes_copied": 0}
    assert json.loads(again.out) == [{**copied, **nothing, "status": "present"}]
    # another repository sharing the Debian base layer: mounted on the mirror, not copied again
    torch = run_cli("mirror", "pytorch", "--to", mirror.host, "--tag", "24.05-py3", "--json")
    (moved,) = json.loads(torch.out)
    assert moved["status"] == "copied" and moved["blobs_mounted"] >= 1, moved
    assert mirror.digest("nvidia/pytorch", "24.05-py3") == _source_digest(testbed, "nvidia/pytorch", "24.05-py3")


@pytest.mark.engine
@pytest.mark.fidelity
def test_a_copy_interrupted_when_the_mirror_stops_resumes_and_completes(testbed, mirror):
    args = ["--to", mirror.host, "--tag", "23.10-py3", "--json"]
    env = {**os.environ, **testbed, "IMGBUILD_REGISTRY_BACKOFF": "0.02", "IMGBUILD_REGISTRY_TIMEOUT": "5"}
    proc = subprocess.Popen(
        [*IMGBUILD, "mirror", "pytorch", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    uploads = mirror.data / "docker/registry/v2/repositories/nvidia/pytorch/_uploads"
    for _ in range(600):  # until a blob upload is under way
        if uploads.is_dir() and any(uploads.iterdir()):
            break
        time.sleep(0.05)
    mirror.stop()  # mid-blob
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 3 and ("is unreachable" in err or "broke off" in err), err
    mirror.start()
    resumed = run_cli("mirror", "pytorch", *args)
    assert resumed.code == 0, resumed.err
    (done,) = json.loads(resumed.out)
    assert done["status"] == "copied"
    assert mirror.digest("nvidia/pytorch", "23.10-py3") == _source_digest(testbed, "nvidia/pytorch", "23.10-py3")


@pytest.mark.engine
@pytest.mark.fidelity
def test_keep_prunes_only_older_mirrored_tags_and_recipes_build_from_the_mirror(testbed, mirror, tmp_path):
    for tag in ("23.10-py3", "24.05-py3"):
        assert run_cli("mirror", "pytorch", "--to", mirror.host, "--tag", tag).code == 0
    dry = run_cli("mirror", "pytorch", "--to", mirror.host, "--tag", "24.05-py3", "--keep", "1", "--dry-run", "--json")
    assert [(r["tag"], r["status"]) for r in json.loads(dry.out)] == [
        ("24.05-py3", "present"),
        ("23.10-py3", "would prune"),
    ]
    assert mirror.digest("nvidia/pytorch", "23.10-py3")  # a dry run prunes nothing
    pruned = run_cli("mirror", "pytorch", "--to", mirror.host, "--tag", "24.05-py3", "--keep", "1", "--json")
    assert [r["status"] for r in json.loads(pruned.out)] == ["present", "pruned"]
    assert mirror.digest("nvidia/pytorch", "23.10-py3") is None and mirror.digest("nvidia/pytorch", "24.05-py3")
    # the site points ngc_registry at its mirror: a recipe is planned, pinned and built from it
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "m.yaml"
    recipe.write_text('name: mirrored\nbase: {framework: pytorch, tag: "24.05"}\nenv: {M: "1"}\n')
    env = {"IMGBUILD_NGC_REGISTRY": mirror.host, "IMGBUILD_INSECURE_REGISTRIES": mirror.host}
    built = run_cli("build", str(recipe), "-o", str(tmp_path / "ctx"), cwd=tmp_path, env=env)
    assert built.code == 0, built.err
    lock = json.loads((tmp_path / "ctx" / "imgbuild.lock.json").read_text())
    assert lock["base"]["ref"] == f"{mirror.host}/nvidia/pytorch:24.05-py3"
    assert lock["base"]["digest"] == _source_digest(testbed, "nvidia/pytorch", "24.05-py3")
    subprocess.run(["docker", "rmi", built.out.strip().splitlines()[-1].split(" -> ")[0]], capture_output=True)


@pytest.mark.engine
@pytest.mark.fidelity
def test_bad_targets_are_usage_errors(testbed):
    for args in (
        ["--to", "not a host"],
        ["--to", testbed["IMGBUILD_TESTBED_REGISTRY"]],
        ["--to", "x.example", "--since", "soon"],
    ):
        res = run_cli("mirror", "pytorch", *args)
        assert res.code == 2 and "Traceback" not in res.err, (args, res.err)


@pytest.mark.parametrize("target", ["registry.lab.example:5000", "127.0.0.1:5999"])
def test_the_ngc_key_goes_to_the_ngc_host_only(target, monkeypatch, tmp_path):
    """Source and target get a client each; the mirror's client never carries the NGC key."""
    from imgbuild.config.settings import load_settings
    from imgbuild.registry.client import RegistryClient

    monkeypatch.setenv("HOME", str(tmp_path))  # no docker login here
    settings = load_settings({"ngc_registry": "nvcr.io", "ngc_api_key": "nvapi-secret-key"}, environ={})
    source = RegistryClient.for_host("nvcr.io", settings)
    mirror = RegistryClient.for_host(target, settings)
    assert source.credentials and source.credentials.password == "nvapi-secret-key"
    assert mirror.credentials is None
