"""Build end to end on the test bed: real engine, real registry, real PyTorch/TensorFlow in the image."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from tests import ngc_facts
from tests.conftest import IMGBUILD, ROOT, in_image, run_cli

pytestmark = pytest.mark.engine

STANDIN_TORCH = ngc_facts.BED_TORCH


def expected_ids() -> tuple[int, int]:
    """The host user as imgbuild sees it (under sudo, the invoking user)."""
    if os.getuid() == 0:
        return int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"])
    return os.getuid(), os.getgid()


@pytest.fixture
def as_host_user(monkeypatch):
    """In CI we are root: act as an admin who ran `sudo imgbuild build` (SUDO_UID is how we find them; a user who
    is no admin may not build through sudo: enforced mode)."""
    if os.getuid() == 0:
        monkeypatch.setenv("SUDO_UID", "4321")
        monkeypatch.setenv("SUDO_GID", "4322")
        monkeypatch.setenv("SUDO_USER", "imgbt-admin")  # the test bed's member of the sudo group
    return expected_ids()


def build(recipe: Path | str, out: Path, *extra: str, env: dict[str, str] | None = None):
    return run_cli("build", str(recipe), "-o", str(out), *extra, env=env)


def image_of(client, ref: str):
    return client.images.get(ref)


#: the smoke checks the research recipe's build ran on 2026-11-29, before this round's speed work (a GPU host runs
#: the same list; without one the GPU checks say skip)
RESEARCH_CHECKS = [
    "framework", "cuda libraries", "pip check", "imports", "recipe checks", "cpu compute", "cuda", "cuda arch",
    "cudnn conv", "tensor cores", "amp training", "nccl all-reduce", "p2p", "torch.compile", "fp8", "shared memory",
]  # fmt: skip


@pytest.mark.frontdoor
def test_pytorch_research_example_builds_and_works(testbed, docker_client, tmp_path, as_host_user, cleanup_images):
    cleanup_images.append("imgbuildtest/pytorch-research:24.05")
    res = build(ROOT / "recipes/pytorch-research.yaml", tmp_path / "ctx")
    assert res.code == 0, res.err
    assert "smoke test passed" in res.err and "no GPU visible" in res.out
    uid, gid = as_host_user
    out = in_image(
        docker_client,
        "imgbuildtest/pytorch-research:24.05",
        """
        import glob, os, pwd, subprocess, sys
        import einops, jupyterlab, tensorboard, torch
        st = os.stat("/workspace")
        lists = glob.glob("/var/lib/apt/lists/*Packages*")
        caches = [p for p in ("/root/.cache/pip", os.path.expanduser("~researcher/.cache/pip")) if os.path.exists(p) and os.listdir(p)]
        print(torch.__version__, os.getuid(), os.getgid(), pwd.getpwuid(os.getuid()).pw_name, st.st_uid, st.st_gid, len(lists), len(caches), flush=True)
        subprocess.run(["git", "--version"], check=True, capture_output=True)
        subprocess.run([sys.executable, "/opt/research/train_smoke.py"], check=True)
        argv = [sys.executable, "/opt/imgbuild/smoke", "--libraries-only", "--format", "table"]
        smoke = subprocess.run(argv, capture_output=True, text=True)  # the smoke package, run as its folder
        print("folder-run", smoke.returncode, (smoke.stdout or smoke.stderr[-300:]).splitlines()[0], flush=True)
        """,
    )
    version, run_uid, run_gid, name, ws_uid, ws_gid, lists, caches = out.split()[:8]
    assert re.search(r"folder-run 0 framework +PASS", out), out[-2000:]
    assert version == STANDIN_TORCH, "the base's torch was replaced"
    assert (int(run_uid), int(run_gid), name) == (uid, gid, "researcher")
    assert (int(ws_uid), int(ws_gid)) == (uid, gid), "the user must own /workspace"
    assert lists == "0", "apt lists remain in the image"
    assert caches == "0", "pip cache remains in the image"
    report = json.loads((tmp_path / "ctx" / "smoke.json").read_text())
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    # No speed is won by skipping a check (issue 67): the same checks, in the same order, as when the speed work
    # began, and the base-stack check after each kind of step (apt, pip, user, files, env) and on the bare base
    assert [c["name"] for c in report["checks"]] == RESEARCH_CHECKS
    dockerfile = (tmp_path / "ctx" / "Dockerfile").read_text()
    assert dockerfile.count("stack_check.py record ") == 1 and dockerfile.count("$s/stack_check.py \\\n") == 5
    assert statuses["framework"] == statuses["pip check"] == "pass"
    gpu_checks = (
        "cuda",
        "cudnn conv",
        "tensor cores",
        "amp training",
        "nccl all-reduce",
        "p2p",
        "torch.compile",
        "fp8",
    )
    assert all(statuses[k] == "skip" for k in gpu_checks)
    labels = image_of(docker_client, "imgbuildtest/pytorch-research:24.05").labels
    lock = json.loads((tmp_path / "ctx" / "imgbuild.lock.json").read_text())
    assert labels["org.imgbuild.input-hash"] == lock["input_hash"]
    assert labels["org.imgbuild.base-digest"] == lock["base"]["digest"].strip()
    # the OCI base annotations, for Renovate, crane and registry UIs
    assert labels["org.opencontainers.image.base.name"] == lock["base"]["ref"]
    assert labels["org.opencontainers.image.base.digest"] == lock["base"]["digest"]
    assert statuses["imports"] == "pass"  # einops, tensorboard, jupyterlab and their dependencies import


def test_team_recipe_extends_house_recipe(testbed, docker_client, tmp_path, as_host_user, cleanup_images):
    cleanup_images.append("imgbuildtest/team-vision:24.05")
    res = build(ROOT / "recipes/team-vision.yaml", tmp_path / "ctx")
    assert res.code == 0, res.err
    out = in_image(
        docker_client,
        "imgbuildtest/team-vision:24.05",
        """
        import os, cv2, einops, PIL, torch
        print(torch.__version__, os.environ["TEAM"], os.path.exists("/opt/research/train_smoke.py"))
        """,
    )
    assert out.split() == [STANDIN_TORCH, "vision", "True"]


def test_tensorflow_example_builds_with_the_sdk_backend(testbed, docker_client, tmp_path, as_host_user, cleanup_images):
    cleanup_images.append("imgbuildtest/tensorflow-keras:24.05")
    res = build(ROOT / "recipes/tensorflow-keras.yaml", tmp_path / "ctx", "--backend", "sdk")
    assert res.code == 0, res.err
    assert "--mount" not in (tmp_path / "ctx" / "Dockerfile").read_text()
    report = json.loads((tmp_path / "ctx" / "smoke.json").read_text())
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["framework"] == "pass" and statuses["mixed precision"] == "pass"
    assert statuses["cuda"] == "skip"
    uid, _ = as_host_user
    out = in_image(
        docker_client,
        "imgbuildtest/tensorflow-keras:24.05",
        """
        import glob, os, keras_tuner, tensorflow as tf
        print(tf.__version__ == os.environ["TENSORFLOW_VERSION"], os.getuid(), len(glob.glob("/root/.cache/pip/*")))
        """,
    )
    assert out.split() == ["True", str(uid), "0"]


def test_both_backends_give_equivalent_images(testbed, docker_client, tmp_path, write, as_host_user, cleanup_images):
    write("files/hello.txt", "hello\n")
    recipe = write(
        "r.yaml",
        """
        name: twoways
        tag: buildkit
        base: {framework: pytorch, tag: "24.05"}
        apt: [jq]
        pip: [six==1.16.0]
        user: true
        files: [{src: files/hello.txt, dest: /workspace/hello.txt, mode: "0640"}]
        env: {GREETING: hi}
        """,
    )
    cleanup_images.extend(["imgbuildtest/twoways:buildkit", "imgbuildtest/twoways:sdk"])
    assert build(recipe, tmp_path / "bk", "--backend", "buildkit").code == 0
    res = build(recipe, tmp_path / "sdk", "--backend", "sdk", env={"TAG": "x"})
    assert res.code == 0, res.err
    # same recipe, same tag: the sdk build replaced the buildkit one and kept it as -previous
    probe = """
        import os, stat, six, shutil
        st = os.stat("/workspace/hello.txt")
        print(six.__version__, oct(st.st_mode & 0o777), st.st_uid == os.getuid(), os.environ["GREETING"], bool(shutil.which("jq")))
        """
    now = in_image(docker_client, "imgbuildtest/twoways:buildkit", probe)
    before = in_image(docker_client, "imgbuildtest/twoways:buildkit-previous", probe)
    assert now.split() == before.split() == ["1.16.0", "0o640", "True", "hi", "True"]


@pytest.mark.frontdoor
def test_failed_smoke_test_never_replaces_a_working_tag(testbed, docker_client, tmp_path, write, cleanup_images):
    cleanup_images.append("imgbuildtest/promo:v1")
    good = write("good.yaml", 'name: promo\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\nenv: {STAGE: good}\n')
    assert build(good, tmp_path / "ctx").code == 0
    working = docker_client.images.get("imgbuildtest/promo:v1").id
    # the recipe's own check fails in the built image: the working tag stays.
    broken = write(
        "broken.yaml",
        'name: promo\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\n'
        'smoke: {run: ["exit 4"]}\nenv: {STAGE: broken}\n',
    )
    res = build(broken, tmp_path / "ctx")
    assert res.code == 1, res.err
    assert "smoke test failed: " in res.err and "exited 4" in res.err
    assert "imgbuildtest/promo:v1 was left as it was" in res.err
    assert docker_client.images.get("imgbuildtest/promo:v1").id == working
    left = [t for img in docker_client.images.list(name="imgbuildtest/promo") for t in img.tags]
    assert not [t for t in left if ":imgbuild-candidate-" in t], left


def test_upgrading_torch_fails_before_building(testbed, docker_client, tmp_path, write):
    recipe = write(
        "up.yaml",
        'name: upgrade\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\npip:\n  - einops\n  - torch==2.3.0\n',
    )
    res = build(recipe, tmp_path / "ctx")
    assert res.code == 2
    assert (
        f"up.yaml:6:5: pip.packages[1]: torch==2.3.0 conflicts with the base's torch {ngc_facts.BED_TORCH_ENV}"
        in res.err
    )
    with pytest.raises(ImageNotFound):
        docker_client.images.get("imgbuildtest/upgrade:v1")


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_dependency_that_needs_another_torch_fails_the_build_naming_the_conflict(
    installer, testbed, docker_client, tmp_path, write, cleanup_images
):
    cleanup_images.append("imgbuildtest/tvconflict:v1")
    # torchaudio 2.3.0 requires torch==2.3.0: the installer must refuse rather than replace the base's torch.
    pip = f"{{packages: [torchaudio==2.3.0], installer: {installer}}}"
    recipe = write("tv.yaml", f'name: tvconflict\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\npip: {pip}\n')
    res = build(recipe, tmp_path / "ctx")
    assert res.code == 1, res.err
    assert "build failed at the pip step [" in res.err
    # One line naming the package and the pin it breaks, from either installer's explanation.
    assert "pip step failed: torchaudio 2.3.0 needs torch==2.3.0, but the base holds torch==2.13.0" in res.err
    assert f"requirement(s) with {installer} under" in res.err
    with pytest.raises(ImageNotFound):
        docker_client.images.get("imgbuildtest/tvconflict:v1")


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_no_secret_reaches_the_image_history_or_log(installer, testbed, docker_client, tmp_path, write, cleanup_images):
    ngc_key = "nvapi-FAKEKEY-imgbuild-test-0123456789"
    pip_password = "pipPassw0rd-imgbuild-test"
    recipe = write(
        "sec.yaml",
        f'name: secrets\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\n'
        f"pip: {{packages: [six], installer: {installer}}}\napt: [jq]\n",
    )
    cleanup_images.append("imgbuildtest/secrets:v1")
    env = {"NGC_API_KEY": ngc_key, "IMGBUILD_PIP_INDEX_URL": f"https://imgbuild:{pip_password}@pypi.org/simple"}
    res = build(recipe, tmp_path / "ctx", "--no-cache", env=env)  # pip must really run with them
    assert res.code == 0, res.err
    history = subprocess.run(
        [testbed.get("IMGBUILD_DOCKER_CLI", "docker"), "history", "--no-trunc", "imgbuildtest/secrets:v1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tarball = tmp_path / "image.tar"
    with open(tarball, "wb") as fh:
        for chunk in docker_client.images.get("imgbuildtest/secrets:v1").save(named=True):
            fh.write(chunk)
    log_dir = Path(os.environ["IMGBUILD_CACHE_DIR"]) / "logs"
    log = "".join(p.read_text() for p in log_dir.glob("*secrets*"))
    assert f"requirement(s) with {installer} under" in log, "the build log was not written"
    if installer == "uv":  # uv installed six from the credentialed index, and uv itself is not in the image
        assert "+ six==" in log
        cli = testbed.get("IMGBUILD_DOCKER_CLI", "docker")
        probe = "test ! -e /tmp/imgbuild-uv/bin && ! command -v uv && ! python3 -c 'import uv' 2>/dev/null"
        gone = subprocess.run([cli, "run", "--rm", "imgbuildtest/secrets:v1", "sh", "-c", probe], capture_output=True)
        assert gone.returncode == 0, gone.stderr
    blob = tarball.read_bytes()
    context = b"".join(p.read_bytes() for p in (tmp_path / "ctx").rglob("*") if p.is_file())
    for secret in (ngc_key, pip_password):
        assert secret not in history
        assert secret.encode() not in blob
        assert secret not in log
        assert secret not in res.out + res.err
        assert secret.encode() not in context


def test_smoke_command_on_stock_ngc_images(testbed, tmp_path):
    registry = testbed["IMGBUILD_TESTBED_REGISTRY"]
    for image, framework in (
        (f"{registry}/nvidia/pytorch:24.05-py3", "pytorch"),
        (f"{registry}/nvidia/tensorflow:24.05-tf2-py3", "tensorflow"),
    ):
        report_path = tmp_path / f"{framework}.json"
        res = run_cli("smoke", image, "--json", "--report", str(report_path))
        assert res.code == 0, res.err
        data = json.loads(res.out)
        assert data == json.loads(report_path.read_text())
        assert data["ok"] and data["meta"]["framework"] == framework
        checks = {c["name"]: c for c in data["checks"]}
        assert checks["framework"]["status"] == "pass" and checks["cpu compute"]["status"] == "pass"
        assert checks["cuda"]["status"] == "skip" and checks["cuda"]["reason"].startswith("no GPU visible")
    required = run_cli("smoke", f"{registry}/nvidia/pytorch:24.05-py3", "--require-gpu")
    assert required.code == 1 and "a GPU is required" in required.out + required.err


def test_two_builds_of_one_recipe_at_once_do_not_corrupt_each_other(
    testbed, docker_client, tmp_path, write, cleanup_images
):

    recipe = write(
        "lock.yaml",
        'name: locked\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\nrun: ["sleep 3"]\nenv: {X: "1"}\n',
    )
    cleanup_images.append("imgbuildtest/locked:v1")
    procs = [
        subprocess.Popen(
            [*IMGBUILD, "build", str(recipe), "-o", str(tmp_path / "ctx"), "--no-cache"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=900), p.stderr.read()) for p in procs]
    assert all(code == 0 for code, _ in results), results
    assert any("waiting for another build of imgbuildtest/locked:v1" in err for _, err in results)
    current = docker_client.images.get("imgbuildtest/locked:v1")
    previous = docker_client.images.get("imgbuildtest/locked:v1-previous")
    assert current.id != previous.id  # the second build replaced the first and kept it reachable
    assert (tmp_path / "ctx" / "Dockerfile").is_file()
    out = in_image(
        docker_client, "imgbuildtest/locked:v1", "import os, torch; print(os.environ['X'], torch.__version__)"
    )
    assert out.split() == ["1", STANDIN_TORCH]


SITE = "/usr/local/lib/python3.11/dist-packages"  # the stand-in's site folder (Debian's layout, as NGC's)
#: One recipe per door, each changing the base's stack in a way its own door lets through; the build fails at the
#: byte check after that step, naming the file. (door, recipe lines, files beside the recipe, what it names)
DOOR_CHANGES = [
    ("pip", "pip: {packages: [sbhook], index_url: INDEX, trusted_hosts: [GATEWAY]}\n", {}, "torch/_sbhook.py: added"),
    ("run", f"run: [\"echo '#' >> {SITE}/torch/version.py\"]\n", {}, f"{SITE}/torch/version.py: modified"),
    (
        "files",
        f"files: [{{src: v.py, dest: {SITE}/numpy/version.py}}]\n",
        {"v.py": "version = '0'\n"},
        f"{SITE}/numpy/version.py: modified",
    ),
    (  # a CUDA-named library the linker's cache now points into, through a configuration removed after ldconfig
        "run",
        "run: ['mkdir /opt/ldc && cp /usr/lib/x86_64-linux-gnu/libz.so.1 /opt/ldc/libcudart.so.12 && echo /opt/ldc "
        "> /etc/ld.so.conf.d/0-ldc.conf && ldconfig && rm /etc/ld.so.conf.d/0-ldc.conf']\n",
        {},
        "/opt/ldc/libcudart.so.12: added",
    ),
    (
        "env",
        "files: [{src: t.py, dest: /opt/shadow/torch/__init__.py}]\nenv: {PYTHONPATH: /opt/shadow}\n",
        {"t.py": "raise SystemExit('not torch')\n"},
        "shadowed for `import torch` by /opt/shadow/torch/__init__.py",
    ),
]


def _stack_recipe(tmp_path: Path, door: str, lines: str, beside: dict[str, str]) -> tuple[Path, str]:
    import uuid

    for name, text in beside.items():
        (tmp_path / name).write_text(text)
    (tmp_path / ".git").mkdir(exist_ok=True)
    name = f"stack-{door}-{uuid.uuid4().hex[:6]}"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: {name}\nbase: {{framework: pytorch, tag: "24.05"}}\n{lines}')
    return recipe, name


@pytest.mark.parametrize(
    ("door", "lines", "beside", "names"), DOOR_CHANGES, ids=["pip", "run", "files", "run-ldcache", "env"]
)
def test_the_byte_check_fails_the_build_at_the_door_that_changed_the_bases_stack(
    door, lines, beside, names, testbed, docker_client, tmp_path
):
    from tests.conftest import bridge_gateway
    from tests.fake_index import FakeIndex, Release

    gateway = bridge_gateway(docker_client)
    index = FakeIndex(gateway, {"sbhook": [Release("1.0", files={"torch/_sbhook.py": b"", "sbhook/__init__.py": b""})]})
    body = lines.replace("INDEX", json.dumps(index.url)).replace("GATEWAY", json.dumps(gateway))
    recipe, name = _stack_recipe(tmp_path, door, body, beside)
    try:
        res = build(recipe, tmp_path / "ctx")
    finally:
        index.close()
    assert res.code == 1, res.err[-3000:]
    assert "build failed at the base-stack check" in res.err, res.err[-3000:]
    assert f"imgbuild: the {door} step changed the base's stack: " in res.err and names in res.err, res.err[-3000:]
    assert not [i for i in docker_client.images.list() if any(name in t for t in i.tags)]


def test_the_byte_check_catches_what_apt_installs_where_its_door_would_let_it_by(testbed, docker_client, tmp_path):
    """apt's door refuses the CUDA stack's packages by name; behind it, the rendered Dockerfile's check after the apt
    step catches a CUDA-family library the step installed where the loader looks (the door's list edited out of
    the way: on a Debian base no package the door admits touches the stack)."""
    recipe, name = _stack_recipe(tmp_path, "apt", "apt: [jq]\n", {})
    assert run_cli("render", str(recipe), "--backend", "sdk", "-o", str(tmp_path / "ctx")).code == 0
    dockerfile = tmp_path / "ctx" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("      jq \\\n", "      libnvidia-egl-wayland1 \\\n"))
    done = subprocess.run(
        ["docker", "build", "--rm", "--force-rm", str(tmp_path / "ctx")],
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0, done.stdout
    said = "imgbuild: the apt step changed the base's stack: /usr/lib/x86_64-linux-gnu/libnvidia-egl-wayland.so.1"
    assert said in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
