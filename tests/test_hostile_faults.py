"""Faults, as a table: kills at each stage of a real build, concurrent builds of same-name recipes, a user
without access to the Docker socket, read-only and full folders on a small tmpfs.

Each ends with exit 3 (environment) or a clean failure, names the path and cause, and loses nothing: a
working tag is never replaced, and no candidate tag, smoke container, staging folder or secret file is
left behind (a SIGKILL's leftovers are removed by the next run of the same target).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IMGBUILD, ROOT, run_cli


def _recipe(folder: Path, file: str, name: str, tag: str, *, hang: bool = False, extra: str = "") -> Path:
    path = folder / file
    hanging = 'smoke: {run: ["sleep 900"]}\n' if hang else ""  # the smoke test runs until it is killed
    path.write_text(
        f'name: {name}\ntag: {tag}\nbase: {{framework: pytorch, tag: "24.05"}}\n'
        f'labels: {{variant: "{file}"}}\n{hanging}{extra}'
    )
    return path


def _smoke_containers(client, target: str) -> list:
    """Smoke containers of any build run's candidate of `target` (each run has its own, imgbuild-candidate-<run>)."""
    found = client.containers.list(all=True, filters={"label": "org.imgbuild.smoke-of"})
    return [c for c in found if str(c.labels.get("org.imgbuild.smoke-of", "")).startswith(f"{target}:imgbuild-cand")]


def _candidates(client, target: str) -> list[str]:
    return [t for img in client.images.list(name=target) for t in img.tags if ":imgbuild-candidate-" in t]


def _image(client, ref: str):
    from docker.errors import ImageNotFound

    try:
        return client.images.get(ref)
    except ImageNotFound:
        return None


def _start_build(recipe: Path, ctx: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*IMGBUILD, "build", str(recipe), "-o", str(ctx)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for(check, proc: subprocess.Popen, seconds: float = 180) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return
        if proc.poll() is not None:
            raise AssertionError(
                f"imgbuild ended early ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}"
            )
        time.sleep(0.5)
    raise AssertionError("timed out waiting")


@pytest.fixture
def names(unique: str, cleanup_images: list[str]) -> Iterator[tuple[str, str]]:
    name = f"fault{unique}"
    target = f"imgbuildtest/{name}"
    cleanup_images += [f"{target}:v1", f"{target}:v2"]
    yield name, target


@pytest.mark.engine
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_kill_during_the_smoke_test_loses_nothing_and_leaves_nothing(sig, testbed, docker_client, names, tmp_path):
    name, target = names
    hanging = _recipe(tmp_path, "hang.yaml", name, "v1", hang=True)
    proc = _start_build(hanging, tmp_path / "ctx")
    try:
        _wait_for(lambda: any(c.status == "running" for c in _smoke_containers(docker_client, target)), proc)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert _image(docker_client, f"{target}:v1") is None  # never promoted
    if sig == signal.SIGTERM:  # cleaned at once
        assert proc.returncode == 130, proc.stderr.read()
        assert _smoke_containers(docker_client, target) == []
        assert _candidates(docker_client, target) == []
        return
    # SIGKILL: nothing could clean up; the next run of the same target does, and builds.
    assert _smoke_containers(docker_client, target) != [] and _candidates(docker_client, target) != []
    good = _recipe(tmp_path, "good.yaml", name, "v1")
    result = run_cli("build", str(good), "-o", str(tmp_path / "ctx"))
    assert result.code == 0, result.err
    assert _smoke_containers(docker_client, target) == []
    assert _candidates(docker_client, target) == []
    assert _image(docker_client, f"{target}:v1").labels["variant"] == "good.yaml"


@pytest.mark.engine
def test_a_failing_smoke_test_keeps_the_working_tag_and_leaves_no_candidate(testbed, docker_client, names, tmp_path):
    name, target = names
    good = _recipe(tmp_path, "good.yaml", name, "v1")
    assert run_cli("build", str(good), "-o", str(tmp_path / "ctx")).code == 0
    working = _image(docker_client, f"{target}:v1").id
    broken = _recipe(tmp_path, "broken.yaml", name, "v1", extra="smoke: {run: ['exit 4']}\n")
    result = run_cli("build", str(broken), "-o", str(tmp_path / "ctx"))
    assert result.code == 1 and "was left as it was" in result.err, result.err
    assert _image(docker_client, f"{target}:v1").id == working
    assert _candidates(docker_client, target) == []
    assert _smoke_containers(docker_client, target) == []


@pytest.mark.engine
def test_same_name_recipes_with_two_tags_build_concurrently_into_their_own_tags(
    testbed, docker_client, names, tmp_path
):
    name, target = names
    v1 = _recipe(tmp_path, "v1.yaml", name, "v1")
    v2 = _recipe(tmp_path, "v2.yaml", name, "v2")
    procs = [_start_build(v1, tmp_path / "ctx"), _start_build(v2, tmp_path / "ctx")]
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err
    assert _image(docker_client, f"{target}:v1").labels["variant"] == "v1.yaml"
    assert _image(docker_client, f"{target}:v2").labels["variant"] == "v2.yaml"
    assert not list(tmp_path.glob(".ctx*")), "a staging folder or iid file was left beside the context"


def test_rebuild_refuses_two_recipes_sharing_a_name(tmp_path):
    (tmp_path / ".git").mkdir()
    for tag in ("v1", "v2"):
        _recipe(tmp_path, f"{tag}.yaml", "shared", tag)
    result = run_cli(
        "rebuild", "--check", str(tmp_path), "--json", env={"IMGBUILD_IMAGES_DIR": str(tmp_path / "images")}
    )
    assert result.code == 1
    import json

    report = json.loads(result.out)
    assert [i["status"] for i in report["images"]] == ["invalid", "invalid"]
    assert all("share the name 'shared'" in i["error"] for i in report["images"])


@pytest.mark.root("becomes another user (setpriv)")
def test_a_user_without_docker_access_gets_exit_3_naming_the_cause():
    """A non-root user outside the docker group: the socket refuses, and imgbuild says so (not 'start dockerd')."""
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="imgbuild-nobody-"))
    home.chmod(0o777)
    try:
        _as_nobody_without_docker(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "env"]


def _python_for_nobody() -> str:
    """An interpreter of the running one's version that nobody may run: the running one itself, unless it lives
    where nobody cannot reach it (a pyenv under /root), then the system's of the same version."""
    import shutil
    import sys

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = "/usr/local/bin:/usr/bin:/bin"
    candidates = [os.path.realpath(sys.executable), shutil.which(f"python{version}", path=system)]
    for python in filter(None, candidates):
        said = subprocess.run([*AS_NOBODY, python, "-c", "import sys; print(sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        if said.returncode == 0 and said.stdout.strip() == str(sys.version_info[:2]):
            return python
    pytest.skip(f"no Python {version} that nobody may run (tried {', '.join(filter(None, candidates))})")


def _as_nobody_without_docker(tmp_path: Path) -> None:
    """The installed copy (the running environment's site-packages, wherever it lives), run as nobody."""
    import sysconfig

    start = (  # the site folder's .pth files read (an editable install's finder), then `python -m imgbuild`
        "import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); "
        "runpy.run_module('imgbuild', alter_sys=True, run_name='__main__')"
    )
    proc = subprocess.run(
        [
            *AS_NOBODY,
            f"HOME={tmp_path}",
            f"IMGBUILD_CACHE_DIR={tmp_path}/cache",
            f"IMGBUILD_CONFIG={tmp_path}/config.yaml",
            _python_for_nobody(),
            "-c",
            start,
            sysconfig.get_paths()["purelib"],
            "ps",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 3, proc.stderr
    assert "permission denied on the socket" in proc.stderr and proc.stderr.count("\n") == 1


@contextlib.contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _render(recipe: Path, out: Path, **env: str):
    return run_cli("render", str(recipe), "--offline", "-o", str(out), env=env)


@pytest.mark.root("mounts a read-only tmpfs (mount(8))")
def test_read_only_images_folder_is_exit_3_with_the_path(tmp_path):
    (tmp_path / ".git").mkdir()
    recipe = _recipe(tmp_path, "r.yaml", "ro", "v1")
    with _tmpfs(tmp_path / "images", "ro,size=1m") as images:
        result = _render(recipe, images / "ro")
    assert result.code == 3, result.err
    assert str(images) in result.err and "Read-only file system" in result.err
    assert result.err.count("\n") == 1 and "Traceback" not in result.err


@pytest.mark.root("mounts a small tmpfs (mount(8))")
def test_full_images_folder_is_exit_3_and_leaves_no_half_context(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "big.bin").write_bytes(os.urandom(512 * 1024))
    recipe = _recipe(tmp_path, "r.yaml", "full", "v1", extra="files: [{src: big.bin, dest: /opt/big.bin}]\n")
    with _tmpfs(tmp_path / "images", "size=256k") as images:
        result = _render(recipe, images / "full")
        left = sorted(p.name for p in images.iterdir())
    assert result.code == 3, result.err
    assert "No space left on device" in result.err
    assert left == []


@pytest.mark.root("mounts a read-only tmpfs (mount(8))")
@pytest.mark.engine
def test_read_only_cache_folder_is_exit_3_for_build(tmp_path, testbed):
    (tmp_path / ".git").mkdir()
    recipe = _recipe(tmp_path, "r.yaml", "rocache", "v1")
    with _tmpfs(tmp_path / "cache", "ro,size=1m") as cache:
        result = run_cli("build", str(recipe), "-o", str(tmp_path / "ctx"), env={"IMGBUILD_CACHE_DIR": str(cache)})
    assert result.code == 3, result.err
    assert str(cache) in result.err and "Read-only file system" in result.err


@pytest.mark.engine
def test_no_secret_file_survives_a_sigkill_mid_build(testbed, names, tmp_path):
    """The pip.conf with the index password lives in memory (memfd): a SIGKILL strands nothing on disk."""
    name, _ = names
    password = f"CANARY-{name}"
    recipe = _recipe(tmp_path, "r.yaml", name, "v1", extra="pip: [einops]\n")
    cache = tmp_path / "cache"
    env = {
        **os.environ,
        "IMGBUILD_CACHE_DIR": str(cache),
        "IMGBUILD_PIP_INDEX_URL": f"https://bob:{password}@127.0.0.1:9/simple",
    }
    proc = subprocess.Popen(
        [*IMGBUILD, "build", str(recipe), "-o", str(tmp_path / "ctx")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # kill once the pip step (which holds the secret) runs
        if "install.sh" in line:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    leaked = [p for place in (cache, Path("/tmp"), tmp_path) for p in _files_holding(place, password.encode())]
    assert leaked == []


def _files_holding(place: Path, secret: bytes) -> list[Path]:
    """Regular files under `place` that hold `secret` (what this user cannot read, it did not write: skipped)."""
    found = []
    for folder, _, names in os.walk(place, onerror=lambda error: None):
        for name in names:
            path = Path(folder) / name
            try:
                small = path.is_file() and not path.is_symlink() and path.stat().st_size < 1_000_000
                if small and secret in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


@pytest.fixture
def someone_elses_container(testbed, docker_client, unique) -> Iterator[str]:
    name = f"someoneelse_job{unique}_1"
    container = docker_client.containers.run(
        f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3",
        ["sleep", "300"],
        name=name,
        detach=True,
        entrypoint=[],
        labels={"org.imgbuild.user": "someoneelse"},
    )
    yield name
    container.remove(force=True)


# (verb and arguments, extra environment) -> refused: the flag never changes who is calling
OWNERSHIP_REFUSED = [
    (["logs", "{name}"], {}),
    (["exec", "{name}", "--", "true"], {}),
    (["attach", "{name}"], {}),
    (["stop", "{name}"], {}),
    (["--user", "someoneelse", "stop", "{name}"], {}),
    (["--user", "someoneelse", "logs", "{name}"], {"IMGBUILD_USER": "someoneelse"}),
    (["logs", "{name}"], {"SUDO_UID": "4321", "SUDO_GID": "4321", "SUDO_USER": "mallory"}),
]


@pytest.mark.engine
@pytest.mark.parametrize(
    "argv,env",
    OWNERSHIP_REFUSED,
    ids=[" ".join(a) + (" sudo" if e.get("SUDO_USER") else "") for a, e in OWNERSHIP_REFUSED],
)
def test_every_verb_refuses_another_users_container(argv, env, someone_elses_container, docker_client):
    result = run_cli(*[a.format(name=someone_elses_container) for a in argv], env=env, timeout=60)
    assert result.code == 2, result.err
    assert "belongs to someoneelse" in result.err and result.err.count("\n") == 1
    assert docker_client.containers.get(someone_elses_container).status == "running"


@pytest.mark.root("root acting on another user's container with --force")
@pytest.mark.engine
def test_the_owner_under_sudo_and_root_with_force_may_act(someone_elses_container, docker_client):
    owner = run_cli(
        "logs",
        someone_elses_container,
        env={"SUDO_UID": "4321", "SUDO_GID": "4321", "SUDO_USER": "someoneelse"},
        timeout=60,
    )
    assert owner.code == 0, owner.err
    admin = run_cli("stop", someone_elses_container, "--force", timeout=120)
    assert admin.code == 0, admin.err
    assert docker_client.containers.get(someone_elses_container).status == "exited"


@pytest.mark.engine
def test_a_build_step_that_never_ends_is_stopped_at_the_build_timeout(testbed, docker_client, names, tmp_path):
    name, target = names
    recipe = tmp_path / "forever.yaml"
    recipe.write_text(
        f'name: {name}\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\nrun: ["sleep 100000 # {name}"]\n'
    )
    start = time.monotonic()
    result = run_cli("build", str(recipe), "-o", str(tmp_path / "ctx"), env={"IMGBUILD_BUILD_TIMEOUT": "20"})
    assert time.monotonic() - start < 120
    assert result.code == 1, result.err
    assert "ran past 20 s (build_timeout)" in result.err
    assert _image(docker_client, f"{target}:v1") is None and _candidates(docker_client, target) == []


def test_concurrent_renders_of_one_recipe_leave_one_whole_context(tmp_path):
    (tmp_path / ".git").mkdir()
    recipe = _recipe(tmp_path, "r.yaml", "together", "v1", extra="pip: [einops]\n")
    out = tmp_path / "images" / "together"
    procs = [
        subprocess.Popen(
            [*IMGBUILD, "render", str(recipe), "--offline", "-o", str(out)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert any(code == 0 for code, _ in results)
    assert all(code in (0, 3) and "Traceback" not in err for code, err in results), results
    assert (out / "Dockerfile").is_file() and (out / "imgbuild" / "pip" / "requirements.txt").is_file()
    assert sorted(p.name for p in out.parent.iterdir()) == ["together"]  # no staging or old folder left


# --- the engine failing on its own ------------------------------------------------------------------------

# A stand-in docker CLI that prints BuildKit's plain progress: the first N builds fail the way the engine
# fails by itself (moby/buildkit#4483) or the way a step fails, then it builds.
FLAKY_CLI = """#!/bin/sh
count_file="$IMGBUILD_TEST_FLAKY_COUNT"; n=$(cat "$count_file" 2>/dev/null || echo 0); echo $((n+1)) > "$count_file"
while [ $# -gt 0 ]; do [ "$1" = --iidfile ] && iid="$2"; shift; done
echo '#5 [stage-2 2/6] RUN apt-get update'
if [ "$n" -lt "$IMGBUILD_TEST_FLAKY_FAILS" ]; then
  echo "#5 ERROR: $IMGBUILD_TEST_FLAKY_ERROR"
  exit 1
fi
echo '#5 DONE 0.1s'
echo sha256:feedbeef > "$iid"
"""


@pytest.mark.parametrize(
    "error,fails,builds,ok",
    [
        ("rpc error: code = Internal desc = unexpected EOF", 1, 2, True),  # retried once, then built
        ("runc run failed: container process is already dead", 1, 2, True),
        ("rpc error: code = Internal desc = unexpected EOF", 2, 2, False),  # a second fault is the answer
        ("executor failed running [/bin/sh -c apt-get update]: exit code: 100", 1, 1, False),  # the step's own
        (
            "process did not complete successfully: exit code: 1 (rpc error: code = Internal desc = unexpected EOF)",
            1,
            1,
            False,
        ),
    ],
)
def test_an_engine_fault_is_built_once_more_and_a_step_failure_never(tmp_path, monkeypatch, error, fails, builds, ok):
    from imgbuild.engine.docker import Engine
    from imgbuild.engine.types import BuildRequest
    from imgbuild.errors import BuildFailed

    cli = tmp_path / "docker"
    cli.write_text(FLAKY_CLI)
    cli.chmod(0o755)
    count = tmp_path / "count"
    monkeypatch.setenv("IMGBUILD_TEST_FLAKY_COUNT", str(count))
    monkeypatch.setenv("IMGBUILD_TEST_FLAKY_FAILS", str(fails))
    monkeypatch.setenv("IMGBUILD_TEST_FLAKY_ERROR", error)
    engine = object.__new__(Engine)
    engine.buildkit_cli = (str(cli), False)
    (tmp_path / "ctx").mkdir()
    said: list[str] = []
    req = BuildRequest(context=tmp_path / "ctx", tag="t/flaky:1", log_path=tmp_path / "build.log", timeout=30)
    if ok:
        assert engine.build("buildkit", req, said.append, lambda s: s) == "sha256:feedbeef"
        assert any("building once more" in s for s in said)
        assert "engine fault, building once more" in (tmp_path / "build.log").read_text()
    else:
        with pytest.raises(BuildFailed):
            engine.build("buildkit", req, said.append, lambda s: s)
    assert int(count.read_text()) == builds
