"""probe-4's classes of hostile recipes, as tables: for each field, each way it can be abused. Each is refused
with one problem naming the file, line and field, never echoing a credential; the rows that need a registry,
a co-user or a kill live beside the code they test (test_spared, test_cache, test_tree, test_attest)."""

from __future__ import annotations

import pytest

from imgbuild.errors import RecipeError
from imgbuild.pipeline.plan import make_plan
from imgbuild.recipe import load_recipe
from tests.conftest import run_cli
from tests.support import fake_inspect, settings

HEAD = 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\n'
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
    ("its own base, a local image", "name: x\nimage: lab/base:v1\nbase: lab/base:v1\n", "image", "own base"),
    ("its own base, latest spelled two ways", "name: x\nimage: lab/base\nbase: lab/base:latest\n", "image", "own base"),
    (
        "its own base on Docker Hub spelled in full",
        "name: x\nimage: docker.io/library/ubuntu:22.04\nbase: ubuntu:22.04\n",
        "image",
        "own base",
    ),
    # names imgbuild keeps for itself
    ("a candidate tag", HEAD + "tag: v1-candidate\n", "tag", "keeps for itself"),
    ("a previous tag", HEAD + "tag: v1-previous\n", "tag", "keeps for itself"),
    ("the registry cache's tag", HEAD + "tag: imgbuild-cache\n", "tag", "keeps for itself"),
    ("Buildah's cache repository", HEAD + "image: lab/x-imgbuild-cache:v1\n", "image", "keeps for itself"),
    ("a cosign signature tag", HEAD + "tag: sha256-abc.sig\n", "tag", "keeps for itself"),
    ("a smoke record tag", HEAD + "tag: x.smoke\n", "tag", "keeps for itself"),
    ("a candidate tag inside image", HEAD + "image: lab/x:v1-candidate\n", "image", "keeps for itself"),
    (
        "imgbuild's own folder as a destination",
        HEAD + "files: [{src: demo.yaml, dest: /opt/imgbuild/x}]\n",
        "files[0].dest",
        "",
    ),
    # the image's own environment steering imgbuild
    ("IMGBUILD_SMOKE_KNOWN_GOOD in env", HEAD + "env: {IMGBUILD_SMOKE_KNOWN_GOOD: 'p==1'}\n", "env", "IMGBUILD_"),
    ("IMGBUILD_SMOKE_SKIP_IMPORTS in env", HEAD + "env: {IMGBUILD_SMOKE_SKIP_IMPORTS: p}\n", "env", "IMGBUILD_"),
    ("IMGBUILD_SMOKE_RUN in env", HEAD + "env: {IMGBUILD_SMOKE_RUN: '[]'}\n", "env", "IMGBUILD_"),
    ("an IMGBUILD_ arg", HEAD + "args: {IMGBUILD_X: '1'}\n", "args", "reserved"),
    # installers reached through args
    ("PIP_CONSTRAINT as an arg", HEAD + "args: {PIP_CONSTRAINT: /tmp/c.txt}\n", "args", "installers"),
    ("PIP_FIND_LINKS as an arg", HEAD + "args: {PIP_FIND_LINKS: 'http://10.0.0.1/w'}\n", "args", "installers"),
    ("UV_INDEX_URL as an arg", HEAD + "args: {UV_INDEX_URL: 'https://idx.example/simple'}\n", "args", "installers"),
    ("HTTPS_PROXY as an arg", HEAD + "args: {HTTPS_PROXY: 'http://p:3128'}\n", "args", "installers"),
    ("SSL_CERT_FILE as an arg", HEAD + "args: {SSL_CERT_FILE: /tmp/ca.pem}\n", "args", "installers"),
    ("PYTHONPATH as an arg", HEAD + "args: {PYTHONPATH: /tmp}\n", "args", "installers"),
    # credentials by their shape, in any free-text field
    ("a GitHub token in env", HEAD + f"env: {{NOTE: {TOKEN}}}\n", "env.NOTE", "credential"),
    (
        "a GitLab token in a run step",
        HEAD + "run: ['curl -H \"PRIVATE-TOKEN: glpat-" + "x" * 20 + "\" https://g']\n",
        "run[0]",
        "credential",
    ),
    ("a Hugging Face token in an arg", HEAD + "args: {HFT: hf_" + "a" * 34 + "}\n", "args.HFT", "credential"),
    (
        "a Slack webhook in a label",
        HEAD + "labels: {org.example.hook: 'https://hooks.slack.com/services/T0/B0/abc'}\n",
        "labels",
        "credential",
    ),
    ("an AWS access key in env", HEAD + "env: {K: AKIA" + "B" * 16 + "}\n", "env.K", "credential"),
    (
        "a private key header in the description",
        HEAD + "description: '-----BEGIN RSA PRIVATE KEY-----'\n",
        "description",
        "credential",
    ),
    ("a JWT in env", HEAD + "env: {T: eyJhbGciOiJI.eyJzdWIiOiIx.c2ln}\n", "env.T", "credential"),
    ("an OpenAI-style key in cmd", HEAD + "cmd: ['python', '--key', 'sk-" + "z" * 40 + "']\n", "cmd", "credential"),
    (
        "a Discord webhook in the entrypoint",
        HEAD + "entrypoint: 'notify https://discord.com/api/webhooks/1/abc'\n",
        "entrypoint",
        "credential",
    ),
    (
        "a PyPI token in smoke.run",
        HEAD + "smoke: {run: ['echo pypi-" + "a" * 60 + "']}\n",
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
    (tmp_path / "demo.yaml").write_text(HEAD + f"env: {{NOTE: {TOKEN}}}\n")
    done = run_cli("validate", "demo.yaml", cwd=tmp_path, timeout=120)
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1 and TOKEN not in done.err + done.out
    (tmp_path / "demo.yaml").write_text(
        "name: x\nimage: registry.test:5000/nvidia/pytorch:mine\n" + HEAD.split("\n", 1)[1]
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


# probe-4 CF1: a config value of the wrong type was echoed whole, a key or a password with it
CONFIG_VALUES = [
    ("ngc_api_key", "[sk-FAKE-P4cfg-0123456789abcdefghij]", "sk-FAKE"),
    ("ngc_api_key", "{a: nvapi-secret}", "nvapi-secret"),
    ("pip_extra_index_urls", '{a: "https://bob:p4pw@idx.example/simple"}', "p4pw"),
    ("pip_index_url", '["https://bob:p4pw@idx.example/simple"]', "p4pw"),
    ("run_timeout", '"https://bob:p4pw@x"', "p4pw"),
    ("smoke_import_timeout", '"ghp_' + "z" * 36 + '"', "ghp_"),
]


@pytest.mark.parametrize("field, value, secret", CONFIG_VALUES)
def test_a_config_error_never_echoes_a_credential(tmp_path, field, value, secret):
    config = tmp_path / "config.yaml"
    config.write_text(f"{field}: {value}\n")
    done = run_cli("doctor", "--json", env={"IMGBUILD_CONFIG": str(config)}, timeout=120)
    assert secret not in done.out + done.err, done.err
    assert done.code in (2, 3) and field in done.err and "Traceback" not in done.err, (done.code, done.err)


def test_a_full_disk_under_the_build_log_names_the_log(tmp_path):
    """probe-4 D2: a build with cache_dir on a full disk said `cannot use: No space left on device`, naming no
    path (write() and close() errors carry none); the log's errors name it now."""
    import errno
    from pathlib import Path

    from imgbuild.cli import _outcome
    from imgbuild.regular import open_log

    with pytest.raises(OSError) as caught, open_log(Path("/dev/full")) as log:
        log.write("#5 [2/5] RUN pip install ...\n" * 1000)
        log.flush()
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == "/dev/full"
    lines, code = _outcome(caught.value)
    assert lines == ["imgbuild: cannot use /dev/full: No space left on device"] and code == 3


@pytest.mark.parametrize("text", ["", "\n", "   \n\n"])
def test_an_empty_lock_is_refused_not_taken_for_no_pins(tmp_path, text):
    """probe-4 K2: a kill during `lock` left 0 bytes, `validate` said ok, and the next build installed unlocked."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "demo.yaml").write_text(HEAD + "pip: [einops==0.8.0]\n")
    (tmp_path / "demo.lock.txt").write_text(text)
    with pytest.raises(RecipeError, match="lock: is empty"):
        load_recipe(tmp_path / "demo.yaml", environ={})
    (tmp_path / "demo.lock.txt").write_text("# imgbuild lock: what pip resolved\n")  # a lock of no pins is one
    load_recipe(tmp_path / "demo.yaml", environ={})


@pytest.mark.parametrize(
    "image, prefix, under",
    [
        ("localhost:5000/lab/x:1", "127.0.0.1:5000/lab", True),  # supply-4: the same registry, another name
        ("127.0.0.1:5000/lab/x:1", "localhost:5000/lab", True),
        ("LOCALHOST:5000/lab/x:1", "127.0.0.1:5000/lab/", True),
        ("index.docker.io/lab/x:1", "docker.io/lab", True),
        ("lab/x:1", "docker.io/lab", True),
        ("registry.example.org:443/lab/x:1", "registry.example.org/lab", True),
        ("127.0.0.1:5001/lab/x:1", "127.0.0.1:5000/lab", False),  # another port: another registry
        ("127.0.0.1:5000/labx/y:1", "127.0.0.1:5000/lab", False),  # a prefix of a name is not a folder
        ("127.0.0.1:5000/other/x:1", "127.0.0.1:5000/lab", False),
        ("127.0.0.1:5000/anything:1", "127.0.0.1:5000", True),
    ],
)
def test_signed_only_compares_registries_by_what_they_are(image, prefix, under):
    from imgbuild import imageref
    from imgbuild.servers.admission import under_prefix

    assert under_prefix(imageref.parse(image), prefix) is under
