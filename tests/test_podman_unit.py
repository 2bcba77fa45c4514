"""The Podman engine's pure parts: how it names images, the `podman build` it runs, how it
reads Buildah's output into a failure that names imgbuild's step, and which engine `auto` picks. The real
engine runs in tests/test_engines.py."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from imgbuild.engine import podman
from imgbuild.engine.types import BuildRequest, Redactor, StepTracker, _failure_text


@pytest.mark.parametrize(
    ("ref", "named"),
    [
        ("lab/x:1", "localhost/lab/x:1"),
        ("x:1", "localhost/x:1"),
        ("localhost/lab/x:1", "localhost/lab/x:1"),
        ("127.0.0.1:5000/lab/x:1", "127.0.0.1:5000/lab/x:1"),
        ("registry.example.org/lab/x@sha256:" + "a" * 64, "registry.example.org/lab/x@sha256:" + "a" * 64),
        ("sha256:" + "b" * 64, "sha256:" + "b" * 64),
        ("b" * 12, "b" * 12),  # an image id
    ],
)
def test_a_short_name_is_podmans_localhost_once_and_everything_else_as_it_is(ref, named):
    assert podman.local(ref) == named
    assert podman.local(podman.local(ref)) == named


def test_the_build_command_carries_secrets_as_files_and_reproducibility_as_podmans_flags(tmp_path):
    req = BuildRequest(
        context=tmp_path / "ctx",
        tag="lab/x:1-candidate",
        build_args={"IMGBUILD_UID": "1000", "SOURCE_DATE_EPOCH": "0"},
        secrets={"imgbuild-pip.conf": tmp_path / "pip.conf"},
        no_cache=True,
        timestamp=0,
        cache_from=("127.0.0.1:5000/lab/x-imgbuild-cache",),
        cache_to="127.0.0.1:5000/lab/x-imgbuild-cache",
        cache_auth={"username": "ci", "password": "hunter2"},
    )
    argv = podman.build_argv("/usr/bin/podman", req, tmp_path / "iid", ["--authfile", "/private/auth.json"])
    assert argv[:6] == ["/usr/bin/podman", "build", "--authfile", "/private/auth.json", "--layers", "--format"]
    argv = podman.build_argv("/usr/bin/podman", req, tmp_path / "iid")
    assert argv[:4] == ["/usr/bin/podman", "build", "--layers", "--format"]
    assert argv[4] == "oci" and "--omit-history" in argv and argv[argv.index("--timestamp") + 1] == "0"
    assert argv[argv.index("-t") + 1] == "localhost/lab/x:1-candidate"
    assert f"id=imgbuild-pip.conf,src={tmp_path / 'pip.conf'}" in argv and "--no-cache" in argv
    assert argv[argv.index("--cache-to") + 1] == argv[argv.index("--cache-from") + 1] == req.cache_to
    assert not any("hunter2" in word for word in argv)  # credentials go in an auth file (authfile_args)
    assert argv[-1] == str(tmp_path / "ctx")
    plain = podman.build_argv("podman", BuildRequest(context=tmp_path, tag="x:1"), tmp_path / "iid")
    assert plain[4] == "docker" and "--timestamp" not in plain and "--omit-history" not in plain
    assert "--cache-to" not in plain and "--cache-from" not in plain


@pytest.mark.parametrize(
    ("ref", "auth", "host"),
    [
        ("127.0.0.1:5000/lab/x-imgbuild-cache", {"username": "ci", "password": "hunter2"}, "127.0.0.1:5000"),
        ("registry.example.org/lab/x:1", {"username": "ci"}, "registry.example.org"),
        ("lab/x:1", {"username": "ci", "password": "s3cr3t-pw"}, "docker.io"),
        ("registry.example.org/lab/x:1", None, None),
        ("registry.example.org/lab/x:1", {"username": "", "password": "p"}, None),  # no user: no file
    ],
)
def test_registry_credentials_reach_podman_as_a_private_auth_file_never_argv(tmp_path, ref, auth, host):
    import base64
    import json
    import stat

    args = podman.authfile_args(tmp_path, ref, auth)
    if host is None:
        assert args == [] and not list(tmp_path.iterdir())
        return
    assert args[0] == "--authfile" and all((auth.get("password") or "~") not in a for a in args)
    path = Path(args[1])
    assert path.parent == tmp_path and stat.S_IMODE(path.stat().st_mode) == 0o600
    (entry,) = json.loads(path.read_text())["auths"].items()
    user, _, password = base64.b64decode(entry[1]["auth"]).decode().partition(":")
    assert entry[0] == host and (user, password) == (auth["username"], auth.get("password", ""))


BUILDAH_FAILURE = """[1/3] STEP 1/3: FROM 127.0.0.1:5000/nvidia/pytorch:24.05-py3 AS imgbuild-base-record
--> Using cache 80d9c880070248e443a72f3f135439e87df5f47cc578b7eeb13c51c18b306896
[3/3] STEP 4/9: RUN --mount=type=bind,source=imgbuild/pip,target=/tmp/imgbuild-pip --mount=type=cache,id=imgbuild-pip-cd32 sh /tmp/imgbuild-pip/install.sh
imgbuild: installing 1 requirement(s) with uv under 12 pins from a freeze of the base's packages
imgbuild: pip step failed: a package or version does not exist on the index for this Python and platform; see above
Error: building at STEP "RUN --mount=type=bind,source=imgbuild/pip sh /tmp/imgbuild-pip/install.sh": while running runtime: exit status 1
"""


def test_buildahs_output_gives_the_failed_step_by_imgbuilds_name_its_tail_and_the_status_lines():
    tracker, errors, shown = StepTracker(), [], []
    proc = SimpleNamespace(stdout=io.StringIO(BUILDAH_FAILURE))
    log = io.StringIO()
    podman._follow(proc, shown.append, Redactor([]), log, tracker, errors)
    assert tracker.failed == "3.4"
    text = _failure_text(tracker.steps[tracker.failed], tracker.tail(tracker.failed), errors, Path("/tmp/build.log"))
    first, *rest = text.splitlines()
    assert first.startswith(  # the cause first: the pip step's own verdict, then the engine's words
        "build failed at the pip step [stage-3 4/9]: a package or version does not exist on the index"
    )
    assert rest[0].startswith('  engine: building at STEP "RUN')
    assert any(ln.startswith("  | imgbuild: pip step failed: a package or version does not exist") for ln in rest)
    assert "imgbuild: installing 1 requirement(s) with uv under 12 pins from a freeze of the base's packages" in shown
    assert log.getvalue() == BUILDAH_FAILURE


def test_a_secret_in_buildahs_output_is_redacted_in_the_log_and_the_progress():
    tracker, errors, shown = StepTracker(), [], []
    proc = SimpleNamespace(stdout=io.StringIO("STEP 1/1: RUN echo hunter2-token\nimgbuild: hunter2-token\n"))
    log = io.StringIO()
    podman._follow(proc, shown.append, Redactor(["hunter2-token"]), log, tracker, errors)
    assert "hunter2-token" not in log.getvalue() and not any("hunter2-token" in s for s in shown)


@pytest.mark.parametrize(
    ("engine", "docker_host", "docker_socket", "podman_installed", "picked"),
    [
        ("auto", "", True, True, "docker"),
        ("auto", "", False, True, "podman"),  # Docker absent, Podman present
        ("auto", "", False, False, "docker"),  # neither: Docker's error says what to start
        ("auto", "tcp://10.0.0.5:2376", False, True, "docker"),  # DOCKER_HOST names a Docker
        ("docker", "", False, True, "docker"),
        ("podman", "", True, True, "podman"),
    ],
)
def test_which_engine_auto_picks(monkeypatch, engine, docker_host, docker_socket, podman_installed, picked):
    import os
    import shutil

    import imgbuild.engine as eng

    monkeypatch.setenv("DOCKER_HOST", docker_host) if docker_host else monkeypatch.delenv("DOCKER_HOST", raising=False)
    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: docker_socket if p == "/var/run/docker.sock" else real_exists(p))
    monkeypatch.setattr(
        shutil, "which", lambda name: "/usr/bin/podman" if podman_installed and name == "podman" else None
    )
    swept: list[str] = []

    def connected(name):
        return SimpleNamespace(name=name, containers=SimpleNamespace(sweep_orphans=lambda: swept.append(name)))

    monkeypatch.setattr(eng.Engine, "connect", classmethod(lambda cls, cli: connected("docker")))
    monkeypatch.setattr(podman.PodmanEngine, "connect_podman", classmethod(lambda cls, socket: connected("podman")))
    settings = SimpleNamespace(engine=engine, docker_cli=None, podman_socket=None)
    assert eng.connect_engine(settings).name == picked
    assert swept == [picked]  # a killed run's smoke container goes with the next command that connects


@pytest.mark.parametrize(
    ("value", "ok"), [("docker", True), ("podman", True), ("auto", True), ("Podman", False), ("crio", False)]
)
def test_the_engine_setting_is_one_of_three(value, ok):
    from imgbuild.config.settings import load_settings
    from imgbuild.errors import UsageError

    if ok:
        assert load_settings({"engine": value}, environ={}).engine == value
    else:
        with pytest.raises(UsageError, match="engine: must be one of auto, docker, podman"):
            load_settings({"engine": value}, environ={})


def test_source_date_epoch_is_ascii_digits_or_zero(monkeypatch):
    from imgbuild.pipeline.scratch import source_date_epoch

    for text, want in [("1700000000", 1700000000), ("", 0), ("-5", 0), ("１７", 0), ("1e9", 0), ("9" * 13, 0)]:
        monkeypatch.setenv("SOURCE_DATE_EPOCH", text)
        assert source_date_epoch() == want, text


@pytest.mark.parametrize(
    ("repository", "listed", "untagged"),
    [
        ("127.0.0.1:5000/lab/x-imgbuild-cache", ["127.0.0.1:5000/lab/x-imgbuild-cache:k1"], ["k1"]),
        ("lab/x-imgbuild-cache", ["docker.io/lab/x-imgbuild-cache:k2", "docker.io/lab/x:v1"], ["k2"]),
        ("x-imgbuild-cache", ["docker.io/library/x-imgbuild-cache:k3"], ["k3"]),
        ("lab/x-imgbuild-cache", ["docker.io/lab/x-imgbuild-cache-other:k4", "localhost/lab/x:v1-candidate"], []),
    ],
)
def test_the_names_buildah_gives_a_registry_caches_layers_go_and_only_those(monkeypatch, repository, listed, untagged):
    """Only `<repository>:<key>` names are removed (`podman untag IMAGE NAME`, that name alone): never the
    candidate's or another repository's, whose names may share a prefix."""
    calls = []
    monkeypatch.setattr(podman.subprocess, "run", lambda argv, **kw: calls.append(argv))
    image = SimpleNamespace(tags=listed)
    client = SimpleNamespace(images=SimpleNamespace(list=lambda name: [image]))
    podman.PodmanImages(client, "podman").untag_repository(repository)
    assert [argv[-1].rsplit(":", 1)[1] for argv in calls] == untagged
    assert all(argv[:2] == ["podman", "untag"] and argv[2] == argv[3] for argv in calls)
