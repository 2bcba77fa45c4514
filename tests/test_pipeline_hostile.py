"""`imgbuild lock`, validate and render under hostile inputs: index credentials never reach the container, a killed
lock is swept, every refusal is made before any registry is asked."""

from __future__ import annotations

import json
import time

import pytest

from imgbuild.errors import RecipeError
from imgbuild.pipeline.plan import make_plan
from imgbuild.recipe import load_recipe
from tests.conftest import IMGBUILD, run_cli
from tests.support import RECIPE_HEAD, fake_inspect, settings


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_lock_keeps_index_credentials_out_of_the_container_and_a_killed_lock_is_swept(testbed, tmp_path, docker_client):
    """`imgbuild lock` wrote the index password into the container's files (pip.conf, and the script
    itself), and after a SIGKILL that container stayed with it forever."""
    import os
    import signal
    import subprocess
    import uuid

    from imgbuild.facts import Label
    from tests.conftest import ROOT, bridge_gateway
    from tests.fake_index import FakeIndex, Release

    gateway = bridge_gateway(docker_client)
    # pip waits here: time to look, even on a busy runner (the kill comes long before the index answers). A name of
    # this run's own: no installer's cache on the engine can hold its wheel from an earlier run (immutable, by URL)
    slow = f"slowpkg{uuid.uuid4().hex[:8]}"
    index = FakeIndex(gateway, {slow: [Release("1.0.0")]}, delay=180)
    host = index.url.split("//", 1)[1].split("/", 1)[0]
    secret = "CANARY-p4ss-0123456789"
    try:
        (tmp_path / ".git").mkdir()
        recipe = tmp_path / "recipes" / "lock4.yaml"
        recipe.parent.mkdir()
        recipe.write_text(RECIPE_HEAD + f'pip: {{packages: [{slow}], trusted_hosts: ["{gateway}"]}}\n')
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
        assert f"{slow}==1.0.0" in (tmp_path / "recipes" / "lock4.lock.txt").read_text()
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
    """`validate` missed the `nvidia-* @ URL` refusal that `render` makes."""
    from tests.conftest import run_cli

    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(RECIPE_HEAD + f"pip: {pip}\n")
    res = run_cli("validate", str(tmp_path / "r.yaml"), env={"IMGBUILD_NGC_REGISTRY": "127.0.0.1:9"})
    assert res.code == 2 and words in res.err and "r.yaml:3:" in res.err, res.err


# --- hostile recipes: for each field, each way it can be abused ----------------------------------------

#: a GitHub token: a refusal never echoes it
TOKEN = "ghp_" + "Q" * 36

# (why, recipe text, field named, words)
HOSTILE = [
    # targets that overwrite what others build on
    (
        "the site mirror's NGC base",
        'name: x\nimage: registry.test:5000/nvidia/pytorch:24.05-py3\nbase: {framework: pytorch, tag: "24.05"}\n',
        "image",
        "own base",
    ),
    (
        "the mirror's pytorch repository, another tag",
        'name: x\nimage: registry.test:5000/nvidia/pytorch:mine\nbase: {framework: pytorch, tag: "24.05"}\n',
        "image",
        "site's NGC base",
    ),
    (
        "the mirror's tensorflow repository",
        'name: x\nimage: registry.test:5000/nvidia/tensorflow:24.05-tf2-py3\nbase: {framework: pytorch, tag: "24.05"}\n',
        "image",
        "site's NGC base",
    ),
    *[
        (
            f"the mirror's base as {spelling}",
            f"name: x\nimage: {spelling}/nvidia/pytorch:mine\n" + RECIPE_HEAD.split("\n", 1)[1],
            "image",
            "site's NGC base",
        )
        for spelling in ("REGISTRY.TEST:5000", "registry.test:05000", "Registry.Test:05000")
    ],  # fmt: skip
    (
        "its own base with the default port",
        "name: x\nimage: lab.example:443/base:v1\nbase: lab.example/base:v1\n",
        "image",
        "own base",
    ),  # fmt: skip
    (
        "its own base on loopback by another name",
        "name: x\nimage: 127.0.0.1:5000/b:v1\nbase: localhost:5000/b:v1\n",
        "image",
        "own base",
    ),  # fmt: skip
    (
        "its own base in capitals",
        "name: x\nimage: LAB.EXAMPLE/base:v1\nbase: lab.example/base:v1\n",
        "image",
        "own base",
    ),  # fmt: skip
    ("its own base, a local image", "name: x\nimage: lab/base:v1\nbase: lab/base:v1\n", "image", "own base"),
    ("its own base, latest spelled two ways", "name: x\nimage: lab/base\nbase: lab/base:latest\n", "image", "own base"),
    (
        "its own base on Docker Hub spelled in full",
        "name: x\nimage: docker.io/library/ubuntu:22.04\nbase: ubuntu:22.04\n",
        "image",
        "own base",
    ),
    # names imgbuild keeps for itself
    ("a candidate tag", RECIPE_HEAD + "tag: v1-candidate\n", "tag", "keeps for itself"),
    ("a previous tag", RECIPE_HEAD + "tag: v1-previous\n", "tag", "keeps for itself"),
    ("the registry cache's tag", RECIPE_HEAD + "tag: imgbuild-cache\n", "tag", "keeps for itself"),
    ("Buildah's cache repository", RECIPE_HEAD + "image: lab/x-imgbuild-cache:v1\n", "image", "keeps for itself"),
    ("a cosign signature tag", RECIPE_HEAD + "tag: sha256-abc.sig\n", "tag", "keeps for itself"),
    ("a smoke record tag", RECIPE_HEAD + "tag: x.smoke\n", "tag", "keeps for itself"),
    ("a candidate tag inside image", RECIPE_HEAD + "image: lab/x:v1-candidate\n", "image", "keeps for itself"),
    (
        "imgbuild's own folder as a destination",
        RECIPE_HEAD + "files: [{src: demo.yaml, dest: /opt/imgbuild/x}]\n",
        "files[0].dest",
        "",
    ),
    # the image's own environment steering imgbuild
    (
        "IMGBUILD_SMOKE_KNOWN_GOOD in env",
        RECIPE_HEAD + "env: {IMGBUILD_SMOKE_KNOWN_GOOD: 'p==1'}\n",
        "env",
        "IMGBUILD_",
    ),
    ("IMGBUILD_SMOKE_SKIP_IMPORTS in env", RECIPE_HEAD + "env: {IMGBUILD_SMOKE_SKIP_IMPORTS: p}\n", "env", "IMGBUILD_"),
    ("IMGBUILD_SMOKE_RUN in env", RECIPE_HEAD + "env: {IMGBUILD_SMOKE_RUN: '[]'}\n", "env", "IMGBUILD_"),
    ("an IMGBUILD_ arg", RECIPE_HEAD + "args: {IMGBUILD_X: '1'}\n", "args", "reserved"),
    # installers reached through args
    ("PIP_CONSTRAINT as an arg", RECIPE_HEAD + "args: {PIP_CONSTRAINT: /tmp/c.txt}\n", "args", "installers"),
    ("PIP_FIND_LINKS as an arg", RECIPE_HEAD + "args: {PIP_FIND_LINKS: 'http://10.0.0.1/w'}\n", "args", "installers"),
    (
        "UV_INDEX_URL as an arg",
        RECIPE_HEAD + "args: {UV_INDEX_URL: 'https://idx.example/simple'}\n",
        "args",
        "installers",
    ),
    ("HTTPS_PROXY as an arg", RECIPE_HEAD + "args: {HTTPS_PROXY: 'http://p:3128'}\n", "args", "installers"),
    ("SSL_CERT_FILE as an arg", RECIPE_HEAD + "args: {SSL_CERT_FILE: /tmp/ca.pem}\n", "args", "installers"),
    ("PYTHONPATH as an arg", RECIPE_HEAD + "args: {PYTHONPATH: /tmp}\n", "args", "installers"),
    # credentials by their shape, in any free-text field
    ("a GitHub token in env", RECIPE_HEAD + f"env: {{NOTE: {TOKEN}}}\n", "env.NOTE", "credential"),
    (
        "a GitLab token in a run step",
        RECIPE_HEAD + "run: ['curl -H \"PRIVATE-TOKEN: glpat-" + "x" * 20 + "\" https://g']\n",
        "run[0]",
        "credential",
    ),
    ("a Hugging Face token in an arg", RECIPE_HEAD + "args: {HFT: hf_" + "a" * 34 + "}\n", "args.HFT", "credential"),
    (
        "a Slack webhook in a label",
        RECIPE_HEAD + "labels: {org.example.hook: 'https://hooks.slack.com/services/T0/B0/abc'}\n",
        "labels",
        "credential",
    ),
    ("an AWS access key in env", RECIPE_HEAD + "env: {K: AKIA" + "B" * 16 + "}\n", "env.K", "credential"),
    (
        "a private key header in the description",
        RECIPE_HEAD + "description: '-----BEGIN RSA PRIVATE KEY-----'\n",
        "description",
        "credential",
    ),
    ("a JWT in env", RECIPE_HEAD + "env: {T: eyJhbGciOiJI.eyJzdWIiOiIx.c2ln}\n", "env.T", "credential"),
    (
        "an OpenAI-style key in cmd",
        RECIPE_HEAD + "cmd: ['python', '--key', 'sk-" + "z" * 40 + "']\n",
        "cmd",
        "credential",
    ),
    (
        "a Discord webhook in the entrypoint",
        RECIPE_HEAD + "entrypoint: 'notify https://discord.com/api/webhooks/1/abc'\n",
        "entrypoint",
        "credential",
    ),
    (
        "a PyPI token in smoke.run",
        RECIPE_HEAD + "smoke: {run: ['echo pypi-" + "a" * 60 + "']}\n",
        "smoke.run[0]",
        "credential",
    ),
]


@pytest.mark.parametrize("why, text, field, words", HOSTILE, ids=[row[0] for row in HOSTILE])
def test_a_hostile_recipe_is_refused_naming_its_field(tmp_path, why, text, field, words):
    (tmp_path / ".git").mkdir()
    path = tmp_path / "demo.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as caught:
        make_plan(load_recipe(path, environ={}), settings(), fake_inspect)
    said = str(caught.value)
    assert field in said and words in said, (why, said)
    assert "demo.yaml:" in said and TOKEN not in said and "Q" * 20 not in said
    for problem in caught.value.problems:
        assert problem.line > 0, (why, said)  # at its line


def test_a_hostile_recipe_is_one_line_and_exit_2_from_the_command(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "demo.yaml").write_text(RECIPE_HEAD + f"env: {{NOTE: {TOKEN}}}\n")
    done = run_cli("validate", "demo.yaml", cwd=tmp_path, timeout=120)
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1 and TOKEN not in done.err + done.out
    (tmp_path / "demo.yaml").write_text(
        "name: x\nimage: registry.test:5000/nvidia/pytorch:mine\n" + RECIPE_HEAD.split("\n", 1)[1]
    )
    done = run_cli(
        "render",
        "--offline",
        "demo.yaml",
        "-o",
        str(tmp_path / "out"),
        cwd=tmp_path,
        timeout=120,
        env={"IMGBUILD_NGC_REGISTRY": "registry.test:5000"},
    )
    assert done.code == 2 and "site's NGC base" in done.err and not (tmp_path / "out").exists(), done.err


@pytest.mark.parametrize(
    "text",
    [
        'name: x\nimage: REGISTRY.TEST:05000/nvidia/pytorch:mine\nbase: {framework: pytorch, tag: "24.05"}\n',
        'name: x\nimage: registry.test:5000/nvidia/pytorch:24.05-py3\nbase: {framework: pytorch, tag: "24.*"}\n',
        "name: x\nimage: lab.example:443/base:v1\nbase: lab.example/base:v1\n",
    ],
    ids=["the mirror's base in another spelling", "the base a pattern resolves to", "its own base"],
)
def test_validate_refuses_a_protected_target_as_render_does(text, tmp_path):
    """Both decide with no registry: `validate` on a host that never read the base says what `render` says."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "r.yaml").write_text(text)
    env = {"IMGBUILD_NGC_REGISTRY": "registry.test:5000"}
    said = [run_cli(*args, "r.yaml", cwd=tmp_path, env=env) for args in (["validate"], ["render", "--offline"])]
    assert [done.code for done in said] == [2, 2], [done.err for done in said]
    assert all("r.yaml:2:" in done.err and " image: " in done.err for done in said), [done.err for done in said]
