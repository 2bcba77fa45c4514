"""The pipeline's engine-level guarantees on both real engines of the bed: Docker (Engine
20.10, its BuildKit through the docker CLI) and Podman 4.3 (Buildah 1.28 builds, the rest through Podman's
Docker-compatible API socket, `tests/testbed/up --all`). The same recipe, the same checks, parametrized:
the BuildKit Dockerfile's cache, bind and secret mounts and build stages build; the smoke test runs in the
image; only a working image is promoted, a failure leaves the tag and no candidate; and on Podman the same
inputs build to the same digest (`build --reproducible`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import IMGBUILD, run_cli
from tests.cosign_keys import write_key_pair
from tests.support import buildkit_gate

pytestmark = pytest.mark.engine


@pytest.fixture(params=["docker", pytest.param("podman", marks=pytest.mark.podman)])
def engine(request, testbed, monkeypatch):
    """The engine under test: IMGBUILD_ENGINE for imgbuild, a docker-py client of its API for the checks, and
    how it names a short reference (Podman: localhost/)."""
    import docker

    from imgbuild.engine.podman import local

    if request.param == "podman":
        socket = testbed.get("IMGBUILD_TESTBED_PODMAN")
        if not socket:
            pytest.fail("no Podman on the bed: bring it up with tests/testbed/up --all")
        monkeypatch.setenv("IMGBUILD_PODMAN_SOCKET", socket)
        client = docker.DockerClient(base_url=socket, timeout=600)
        named = local
    else:
        client = docker.from_env(timeout=600)
        named = str
    monkeypatch.setenv("IMGBUILD_ENGINE", request.param)
    made: list[str] = []
    yield SimpleNamespace(kind=request.param, client=client, ref=named, made=made)
    for ref in made:
        for suffix in ("", "-previous"):
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(named(ref + suffix), noprune=True)
    client.close()


def _project(tmp_path: Path, body: str) -> tuple[Path, str]:
    """A repository with one recipe named for this test run; (recipe, its image reference)."""
    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / "files").mkdir(exist_ok=True)
    name = f"engines-{uuid.uuid4().hex[:8]}"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: {name}\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\n{body}')
    return recipe, f"imgbuildtest/{name}:v1"


def _id(engine, ref: str) -> str | None:
    import docker

    try:
        return engine.client.images.get(engine.ref(ref)).id
    except docker.errors.ImageNotFound:
        return None


def _candidates(engine, ref: str) -> list[str]:
    """The candidate tags of `ref`'s repository (each build run its own, `imgbuild-candidate-<run>`)."""
    repo = engine.ref(ref).rsplit(":", 1)[0]
    found = engine.client.images.list(name=repo)
    return [t for img in found for t in img.tags if t.startswith(f"{repo}:imgbuild-candidate-")]


def _smoke_containers(engine, ref: str) -> list:
    """Smoke-test containers of any candidate of `ref`'s repository."""
    prefix = ref.rsplit(":", 1)[0] + ":imgbuild-candidate-"
    found = engine.client.containers.list(all=True, filters={"label": "org.imgbuild.smoke-of"})
    return [c for c in found if str(c.labels.get("org.imgbuild.smoke-of", "")).startswith(prefix)]


def _log(ref: str) -> Path:
    return Path(os.environ["IMGBUILD_CACHE_DIR"]) / "logs" / (ref.replace("/", "_").replace(":", "_") + ".log")


def _pip_step(engine, ref: str) -> str:
    """How the build log of `ref` says the pip step went: "cached" or "ran". BuildKit: the step's `#N CACHED`;
    Buildah: `--> Using cache` after the step's line (pulled from a registry cache first, or not)."""
    lines = _log(ref).read_text().splitlines()
    if engine.kind == "podman":
        at = next(n for n, line in enumerate(lines) if "STEP" in line and "imgbuild-pip/install.sh" in line)
        return "cached" if any(line.startswith("--> Using cache") for line in lines[at + 1 : at + 3]) else "ran"
    step = next(line.split()[0] for line in lines if line.startswith("#") and "imgbuild-pip/install.sh" in line)
    return "cached" if f"{step} CACHED" in lines else "ran"


def _in_image(engine, ref: str, code: str) -> str:
    out = engine.client.containers.run(engine.ref(ref), ["python3", "-c", code], remove=True, entrypoint=[])
    return out.decode().strip().splitlines()[-1]


RECIPE = """user: {name: researcher, uid: 4242, gid: 4242}
pip: {packages: [einops==0.8.1]}
files: [{src: files/train.py, dest: /opt/app/train.py}]
env: {STAGE: "1"}
"""


def test_a_recipe_builds_through_every_mount_is_smoke_tested_and_promoted(engine, tmp_path):
    recipe, ref = _project(tmp_path, RECIPE)
    engine.made.append(ref)
    (tmp_path / "files" / "train.py").write_text("print('one')\n")
    res = run_cli("build", str(recipe), cwd=tmp_path)
    assert res.code == 0, res.err[-3000:]
    assert "smoke test passed" in res.err and f"{ref} -> sha256:" in res.out
    first = _id(engine, ref)
    assert first and _candidates(engine, ref) == []
    labels = engine.client.images.get(engine.ref(ref)).labels
    assert labels["org.imgbuild.recipe"].endswith("r.yaml") and labels["org.imgbuild.recipe-hash"].startswith("sha256:")
    said = _in_image(
        engine,
        ref,
        "import os, einops; print(os.getuid(), einops.__version__, open('/opt/app/train.py').read().strip())",
    )
    assert said == "4242 0.8.1 print('one')"
    # the base's packages as recorded by the base stage; no secret left at its mount point
    assert (
        _in_image(
            engine,
            ref,
            "import os; print(os.path.exists('/opt/imgbuild/dists.base'), os.path.exists('/run/secrets/imgbuild-ca.crt'))",
        )
        == "True False"
    )

    (tmp_path / "files" / "train.py").write_text("print('two')\n")  # an edit: only the COPY runs again
    again = run_cli("build", str(recipe), cwd=tmp_path)
    assert again.code == 0, again.err[-3000:]
    assert _id(engine, ref + "-previous") == first and _id(engine, ref) != first
    assert _in_image(engine, ref, "print(open('/opt/app/train.py').read().strip())") == "print('two')"
    assert _pip_step(engine, ref) == "cached"

    # Another version: another pip layer (run now, or built before by another test: both engines' caches are
    # shared). Buildah keys a step by its line alone, never by the files it bind-mounts
    # (containers/buildah#5400): without the line's digest, Podman kept einops 0.8.1.
    recipe.write_text(recipe.read_text().replace("einops==0.8.1", "einops==0.8.0"))
    again = run_cli("build", str(recipe), cwd=tmp_path)
    assert again.code == 0, again.err[-3000:]
    assert _in_image(engine, ref, "import einops; print(einops.__version__)") == "0.8.0"


def test_a_failed_smoke_test_or_step_never_replaces_the_working_tag_and_leaves_no_candidate(engine, tmp_path):
    recipe, ref = _project(tmp_path, RECIPE)
    engine.made.append(ref)
    (tmp_path / "files" / "train.py").write_text("print('ok')\n")
    assert run_cli("build", str(recipe), cwd=tmp_path).code == 0
    working = _id(engine, ref)

    recipe.write_text(recipe.read_text() + 'smoke: {run: ["exit 4"]}\n')  # the recipe's own check fails
    res = run_cli("build", str(recipe), cwd=tmp_path)
    assert res.code == 1 and "smoke test failed: " in res.err and "exited 4" in res.err, res.err[-3000:]
    assert f"{ref} was left as it was" in res.err
    assert _id(engine, ref) == working and _candidates(engine, ref) == []

    recipe.write_text(recipe.read_text().replace('smoke: {run: ["exit 4"]}', 'run: ["exit 3"]'))  # a step fails
    res = run_cli("build", str(recipe), cwd=tmp_path)
    assert res.code == 1 and "build failed at " in res.err, res.err[-3000:]
    assert _id(engine, ref) == working and _candidates(engine, ref) == []


def test_the_pip_step_names_its_failure_on_both_engines(engine, tmp_path):
    """The guard's one line reaches the user through either builder's output."""
    recipe, ref = _project(tmp_path, 'pip: {packages: ["torch==1.0.0"], installer: pip}\n')
    engine.made.append(ref)
    res = run_cli("build", str(recipe), cwd=tmp_path)
    assert res.code == 2 and "torch==1.0.0 conflicts with the base's torch" in res.err, res.err[-2000:]
    recipe.write_text(recipe.read_text().replace("torch==1.0.0", "imgbuild-no-such-package-x7q==1.0"))
    res = run_cli("build", str(recipe), cwd=tmp_path)
    assert res.code == 1, res.err[-3000:]
    assert "build failed at the pip step" in res.err, res.err[-3000:]
    assert "imgbuild-no-such-package-x7q==1.0: no such package or version on the index" in res.err, res.err[-2000:]
    assert _id(engine, ref) is None and _candidates(engine, ref) == []


def test_the_same_inputs_build_to_the_same_digest_on_podman_and_docker_says_why_not(engine, tmp_path):
    recipe, ref = _project(tmp_path, "pip: [einops==0.8.1]\n")
    engine.made.append(ref)
    ids = []
    for _ in range(2):
        res = run_cli("build", "--reproducible", "--no-cache", str(recipe), cwd=tmp_path)
        assert res.code == 0, res.err[-3000:]
        ids.append(_id(engine, ref))
    verified = run_cli("rebuild", "--verify-reproducible", "--json", str(recipe), cwd=tmp_path)
    (verdict,) = json.loads(verified.out)
    assert verdict["promoted"] == ids[1] and verdict["rebuilt"].startswith("sha256:"), verified.err[-2000:]
    assert _id(engine, ref) == ids[1]  # the check promotes nothing, nor takes the promoted image's report
    name = ref.split("/")[1].split(":")[0]
    assert json.loads((tmp_path / "images" / name / "smoke.json").read_text())["promoted"] == ids[1]
    assert (tmp_path / "images" / name / "smoke.verify.json").is_file()
    if engine.kind == "podman":
        assert ids[0] == ids[1]
        created = engine.client.images.get(engine.ref(ref)).attrs["Created"]
        assert created.startswith("1970-01-01"), created
        assert verified.code == 0 and verdict["reproducible"] is True and verdict["rebuilt"] == ids[1]
    else:
        assert ids[0] != ids[1]
        assert "the docker CLI's BuildKit cannot set layer times" in res.err
        assert verified.code == 1 and verdict["reproducible"] is False


def test_a_build_killed_during_its_smoke_test_leaves_no_candidate_nor_container(engine, tmp_path):
    import signal
    import subprocess
    import time

    recipe, ref = _project(tmp_path, 'smoke: {run: ["sleep 600"]}\n')
    engine.made.append(ref)

    def smoke_containers() -> list:
        return _smoke_containers(engine, ref)

    proc = subprocess.Popen(
        [*IMGBUILD, "build", str(recipe)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + 300
        while not any(c.status == "running" for c in smoke_containers()):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < end, "the smoke test never started"
            time.sleep(0.5)
        time.sleep(2)  # inside the recipe's command now
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, proc.stderr.read() if proc.stderr else ""
    assert smoke_containers() == []
    assert _candidates(engine, ref) == [] and _id(engine, ref) is None


def _fresh_runner(engine, ref: str) -> None:
    """A CI runner that starts empty: the image gone, and this engine's cache of its layers with it (Docker: the
    build cache; Podman: every image but the base's, and Buildah's cache-mount folders)."""
    import docker

    if engine.kind == "docker":
        for suffix in ("", "-previous"):
            with contextlib.suppress(docker.errors.ImageNotFound):
                engine.client.images.remove(ref + suffix, force=True)
        with buildkit_gate():  # no other line's build runs while the whole cache goes
            engine.client.api.prune_builds(all=True)  # without all, BuildKit keeps the layers it last used
        return
    base = engine.client.images.get(f"{os.environ['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3").id
    doomed = [img.id for img in engine.client.images.list(all=True) if img.id != base]
    if doomed:
        subprocess.run(["podman", "rmi", "-f", *doomed], capture_output=True, timeout=300, check=False)
    for folder in Path("/var/tmp").glob("buildah-cache*"):
        shutil.rmtree(folder, ignore_errors=True)


def test_a_fresh_runner_restores_the_pip_step_from_the_registry_and_reruns_only_the_copy(engine, tmp_path):
    """A CI runner starts empty. Docker: the pushed image carries BuildKit's inline cache, and the build
    is seeded from the registry's copy. Podman: Buildah pushes every step's layer to `<image>-imgbuild-cache` and
    pulls them back. After a copied file's edit the pip step is restored and only the COPY runs; after a
    requirement's edit it runs (on Podman with uv installed in the step: Buildah 1.28 mounts a restored stage
    empty) and the image has the new version."""
    registry = os.environ["IMGBUILD_TESTBED_REGISTRY"]
    recipe, short = _project(tmp_path, RECIPE)
    ref = f"{registry}/{short}"
    recipe.write_text(recipe.read_text().replace("tag: v1\n", f"image: {ref.rsplit(':', 1)[0]}\ntag: v1\n"))
    engine.made.append(ref)
    app = tmp_path / "files" / "train.py"
    app.write_text("print('one')\n")

    # the smoke record a fresh runner believes is signed by the key it signs with (build.spared)
    private, _ = write_key_pair(tmp_path, b"fresh-runner-pw")
    signing = ["--sign-key", str(private)]

    def rebuild() -> str:
        res = run_cli(
            "rebuild", "--push", *signing, "--report-json", "report.json", str(recipe), cwd=tmp_path,
            env={"IMGBUILD_SIGN_PASSWORD": "fresh-runner-pw"},
        )  # fmt: skip
        assert res.code == 0, res.err[-3000:]
        (item,) = json.loads((tmp_path / "report.json").read_text())["images"]
        return str(item["status"])

    _fresh_runner(engine, ref)  # the other tests' builds share this pip layer (it is the same for every uid)
    assert rebuild() == "built" and _pip_step(engine, ref) == "ran"
    _fresh_runner(engine, ref)
    assert rebuild() == "fresh" and _id(engine, ref) is None  # the registry is current: nothing built nor pulled
    for edit in ("two", "two and a half"):  # twice: Docker's BuildKit missed every second runner (moby/buildkit#1981)
        app.write_text(f"print('{edit}')\n")
        _fresh_runner(engine, ref)
        assert rebuild() == "built"
        assert _pip_step(engine, ref) == "cached", _log(ref).read_text()[-3000:]
        said = _in_image(
            engine, ref, "import os, einops; print(os.getuid(), einops.__version__, open('/opt/app/train.py').read())"
        )
        assert said == f"4242 0.8.1 print('{edit}')"
        # the registry's copy vouches (its signed `.smoke` record) for what imported in it: not imported again
        report = json.loads((tmp_path / "images" / short.split("/")[1].split(":")[0] / "smoke.json").read_text())
        reasons = [check.get("reason") or "" for check in report["checks"]]
        assert any("1 unchanged since the last promoted image" in reason for reason in reasons), reasons
    if engine.kind == "podman":  # Buildah names the cache's layers <repository>:<key> locally: those names went
        assert not engine.client.images.list(name=f"{ref.rsplit(':', 1)[0]}-imgbuild-cache")

    recipe.write_text(recipe.read_text().replace("einops==0.8.1", "einops==0.8.0"))
    _fresh_runner(engine, ref)
    assert rebuild() == "built" and _pip_step(engine, ref) == "ran"
    if engine.kind == "podman":
        assert "installing uv==" in _log(ref).read_text()
    assert _in_image(engine, ref, "import einops; print(einops.__version__)") == "0.8.0"


def test_three_runners_on_one_engine_leave_the_tag_at_one_runners_signed_image_with_its_own_records(engine, tmp_path):
    """CI runners sharing the host's engine, each with its own project copy and cache, push and sign one
    target at once (runners a and c build the same inputs, b others). None fails for another's containers or tags;
    the tag ends at one runner's image, whose signature and records are its own (`verify --recipe` with that
    runner's recipe passes, with the other's fails); no lease or candidate is left."""
    registry = os.environ["IMGBUILD_TESTBED_REGISTRY"]
    private, public = write_key_pair(tmp_path, b"race-pw")
    name = f"race-{uuid.uuid4().hex[:8]}"
    ref = f"{registry}/imgbuildtest/{name}"
    engine.made.append(f"{ref}:v1")
    runners = {"a": "one", "b": "two", "c": "one"}
    started = {}
    for runner, value in runners.items():
        home = tmp_path / runner
        (home / ".git").mkdir(parents=True)
        (home / "recipes").mkdir()
        (home / "recipes" / "race.yaml").write_text(
            f'name: {name}\ntag: v1\nimage: {ref}\nbase: {{framework: pytorch, tag: "24.05"}}\nenv: {{RUNNER: "{value}"}}\n'
        )
        env = {**os.environ, "IMGBUILD_CACHE_DIR": str(home / "cache"), "IMGBUILD_SIGN_PASSWORD": "race-pw"}
        started[runner] = subprocess.Popen(
            [*IMGBUILD, "rebuild", "--push", "--sign-key", str(private), "--json"],
            cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    pushed = {}
    for runner, proc in started.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"runner {runner}: {err[-3000:]}"
        (item,) = json.loads(out)["images"]
        assert item["status"] == "built", (runner, item)
        pushed[runner] = item["pushed_digest"]
    said = {}
    for runner in runners:
        recipe = tmp_path / runner / "recipes" / "race.yaml"
        res = run_cli("verify", f"{ref}:v1", "--key", str(public), "--recipe", str(recipe))
        said[runner] = (res.code, res.out)
    winners = [r for r, (code, _) in said.items() if code == 0]
    assert winners in (["a", "c"], ["b"]), said  # the same inputs verify alike; the other's recipe fails
    for runner in runners:
        lines = said[runner][1].splitlines()
        assert lines[0].startswith("ok signature") and lines[-1].startswith("ok sbom"), said[runner]
        assert ("ok recipe" in said[runner][1]) is (runner in winners)
    at_tag = said[winners[0]][1].split("@", 1)[1].split()[0]
    assert any(pushed[w].startswith(at_tag) for w in winners), (at_tag, pushed)
    assert not engine.client.containers.list(all=True, filters={"name": "imgbuild-lease-"})
    assert _candidates(engine, f"{ref}:v1") == []


def test_a_smoke_test_sweeps_only_what_a_gone_run_of_its_own_namespace_left(engine):
    """The sweep before each script container: a killed run's container goes; an `imgbuild run` job (its label set
    empty) and another PID namespace's (a CI runner sharing the engine) stay."""
    from imgbuild.engine.containers import DockerContainers
    from imgbuild.engine.images import DockerImages
    from imgbuild.hostio.host import namespace_id

    base = f"{os.environ['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    if not engine.client.images.list(name=base):
        engine.client.images.pull(base)
    tokens = {"killed": f"4000000:1:{namespace_id()}", "job": "", "elsewhere": "1:2:5x00000000"}
    made = {}
    try:
        for what, token in tokens.items():
            labels = {"org.imgbuild.started-by": token, "org.imgbuild.smoke-of": ""}
            made[what] = engine.client.containers.create(
                base, ["true"], labels=labels, name=f"sweep-{what}-{uuid.uuid4().hex[:6]}"
            )
        DockerContainers(engine.client, DockerImages(engine.client)).sweep_orphans()
        left = {c.name for c in engine.client.containers.list(all=True, filters={"name": "sweep-"})}
        assert left == {made["job"].name, made["elsewhere"].name}
    finally:
        for container in made.values():
            with contextlib.suppress(Exception):
                container.remove(force=True)
