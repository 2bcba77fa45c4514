"""`imgbuild lock`, validate and render under hostile inputs: index credentials never reach the container, a killed
lock is swept, every refusal is made before any registry is asked."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import IMGBUILD
from tests.support import RECIPE_HEAD


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_lock_keeps_index_credentials_out_of_the_container_and_a_killed_lock_is_swept(testbed, tmp_path, docker_client):
    """probe-3 #4: `imgbuild lock` wrote the index password into the container's files (pip.conf, and the script
    itself), and after a SIGKILL that container stayed with it forever."""
    import os
    import signal
    import subprocess

    from imgbuild.facts import Label
    from tests.conftest import ROOT, bridge_gateway
    from tests.fake_index import FakeIndex, Release

    gateway = bridge_gateway(docker_client)
    index = FakeIndex(gateway, {"slowpkg": [Release("1.0.0")]}, delay=60)  # pip waits here: time to look
    host = index.url.split("//", 1)[1].split("/", 1)[0]
    secret = "CANARY-p4ss-0123456789"
    try:
        (tmp_path / ".git").mkdir()
        recipe = tmp_path / "recipes" / "lock4.yaml"
        recipe.parent.mkdir()
        recipe.write_text(RECIPE_HEAD + f'pip: {{packages: [slowpkg], trusted_hosts: ["{gateway}"]}}\n')
        env = {
            **os.environ,
            **testbed,
            "IMGBUILD_PIP_INDEX_URL": f"http://bob:{secret}@{host}/simple",
            "PYTHONPATH": str(ROOT),
        }
        proc = subprocess.Popen([*IMGBUILD, "lock", str(recipe)], cwd=tmp_path, env=env)
        found = []
        deadline = time.monotonic() + 240
        while not found and time.monotonic() < deadline:
            time.sleep(0.5)
            found = [  # the lock's own container (the base's pins are read in one before it, briefly)
                c
                for c in docker_client.containers.list(all=True, filters={"label": Label.STARTED_BY})
                if str(proc.pid) == c.labels[Label.STARTED_BY].split(":")[0] and c.attrs["Config"].get("OpenStdin")
            ]
        assert found, "the lock's container did not start"
        container = found[0]
        time.sleep(5)  # pip is resolving (the index holds the wheel back)
        attrs = docker_client.api.inspect_container(container.id)
        assert secret not in json.dumps(attrs), "the secret is in the container's config"
        listing = container.exec_run(["sh", "-c", "cat /tmp/imgbuild-smoke.py /tmp/imgbuild-pip/* 2>/dev/null"])
        assert secret not in listing.output.decode(errors="replace"), "the secret is in the container's files"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert docker_client.containers.get(container.id)  # left behind by the kill
        from imgbuild.engine import Engine

        assert Engine.connect(testbed.get("IMGBUILD_DOCKER_CLI")).containers.sweep_orphans() >= 1
        import docker.errors

        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(container.id)
        index.delay = 0  # and the credentials did reach pip: slowpkg is on that index alone
        done = subprocess.run(
            [*IMGBUILD, "lock", str(recipe)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert "slowpkg==1.0.0" in (tmp_path / "recipes" / "lock4.lock.txt").read_text()
        assert secret not in done.stdout + done.stderr
    finally:
        index.close()


@pytest.mark.parametrize(
    ("pip", "words"),
    [
        ('["nvidia-cudnn-cu12 @ https://example.org/cudnn.whl"]', "nvidia-cudnn-cu12 would replace a CUDA library"),
        ('["nvidia-nccl-cu12==2.20.5"]', "would replace a CUDA library"),
        ('["torch @ https://example.org/torch.whl"]', "torch from a URL would replace the base's torch"),
        ('["tensorflow==2.15"]', "tensorflow is tensorflow, but the base is a pytorch image"),
    ],
)
def test_validate_makes_every_refusal_render_makes_without_a_registry(pip, words, tmp_path):
    """probe-3: `validate` missed the `nvidia-* @ URL` refusal that `render` makes."""
    from tests.conftest import run_cli

    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(RECIPE_HEAD + f"pip: {pip}\n")
    res = run_cli("validate", str(tmp_path / "r.yaml"), env={"IMGBUILD_NGC_REGISTRY": "127.0.0.1:9"})
    assert res.code == 2 and words in res.err and "r.yaml:3:" in res.err, res.err
