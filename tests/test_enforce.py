"""Enforced mode. Users are not in the docker group; they run imgbuild's user commands through
sudo (the drop-in `imgbuild admin sudoers` prints) and get nothing they would not have without it.

The rules are tables of attempts, each refused with one line: pure ones here, and on the test bed the same
attempts made by real unprivileged users (imgbt-alice, imgbt-bob) through Debian's sudo against the real engine.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imgbuild.config.site import run_rules
from imgbuild.errors import UsageError
from imgbuild.hostio import acting
from imgbuild.hostio.host import Caller
from imgbuild.servers import enforce
from imgbuild.servers.runwords import RunRequest

ALICE = Caller("alice", 1001, 1001, via_sudo=True)
HOUSE = run_rules(
    {
        "allowed_images": ["nvcr.io/nvidia/*", "{user}/*"],
        "allowed_mounts": ["{home}", "/srv/datasets"],
    }
)


def req(**kw) -> RunRequest:
    return RunRequest(image="nvcr.io/nvidia/pytorch:25.10-py3", **kw)


@pytest.mark.parametrize(
    "why, request_, image, message",
    [
        ("run as root in the container", req(as_user="0:0"), None, "--user: under this server's rules"),
        ("take another user's GPU", req(force=True), None, "--force: only root"),
        ("a stranger's image", req(), "docker.io/library/alpine:3", "not an image this server allows"),
        ("another user's namespace", req(), "bob/secret:1", "not an image this server allows"),
        ("every GPU of the host", req(env=["NVIDIA_VISIBLE_DEVICES=all"]), None, "-e NVIDIA_VISIBLE_DEVICES: set by"),
        ("the hook's capabilities", req(env=["NVIDIA_DRIVER_CAPABILITIES=all"]), None, "set by imgbuild"),
        ("a preload for the NVIDIA hook (CVE-2025-23266)", req(env=["LD_PRELOAD=/x.so"]), None, "-e LD_PRELOAD"),
        ("CUDA's view of the GPUs", req(env=["CUDA_VISIBLE_DEVICES=0,1,2,3"]), None, "set by imgbuild"),
        ("a variable name with a newline", req(env=["A\nB=1"]), None, "not a variable name"),
        ("a privileged port", req(ports=["127.0.0.1:80:80"]), None, "below 1024"),
        ("every interface", req(ports=["0.0.0.0:8888:8888"]), None, "publish on this host only"),
        ("no address at all", req(ports=["8888:8888"]), None, "publish on this host only"),
        ("a port range", req(ports=["127.0.0.1:9000-9100:9000-9100"]), None, "not 127.0.0.1:HOSTPORT"),
        ("fullwidth digits", req(ports=["127.0.0.1:８８８８:8888"]), None, "not 127.0.0.1:HOSTPORT"),
    ],
)
def test_run_flags_a_user_may_not_give_through_sudo(why, request_, image, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("[", r"\[")):
        enforce.check_run(request_, ALICE, HOUSE, image or request_.image)


def test_what_a_user_may_give():
    enforce.check_run(req(env=["HF_TOKEN=x", "OMP_NUM_THREADS=8"], ports=["127.0.0.1:8888:8888"]), ALICE, HOUSE,
                      "nvcr.io/nvidia/pytorch:25.10-py3")  # fmt: skip
    enforce.check_run(req(), ALICE, HOUSE, "alice/research:v1")  # her own builds


def _probe(paths: dict[str, dict]):
    return lambda who, path: paths.get(path, {"error": "No such file or directory"})


SEEN = {"dev": 1, "ino": 2, "dir": True}


@pytest.mark.parametrize(
    "why, spec, seen, message",
    [
        (
            "the host's /etc",
            "/etc:/host",
            {"/etc": {"path": "/etc", **SEEN}},
            "outside what this server lets runs mount",
        ),
        (
            "a link in her home to /root",
            "/home/alice/r:/r",
            {"/home/alice/r": {"path": "/root", **SEEN}},
            "/root is outside",
        ),
        (
            "a folder she cannot read",
            "/home/bob/private:/b",
            {"/home/bob/private": {"error": "you cannot read it"}},
            "you cannot read it",
        ),
        ("a missing folder (docker would make it as root)", "/home/alice/nope:/x", {}, "No such file"),
        ("a named volume (maybe another user's)", "bobs-data:/data", {}, "a host path"),
        (
            "into the container's /proc",
            "/home/alice/d:/proc/x",
            {"/home/alice/d": {"path": "/home/alice/d", **SEEN}},
            "not a place in the container",
        ),
        (
            "over the container's root",
            "/home/alice/d:/",
            {"/home/alice/d": {"path": "/home/alice/d", **SEEN}},
            "not a place",
        ),
        (
            "a prefix of an allowed root",
            "/srv/datasets-private:/d",
            {"/srv/datasets-private": {"path": "/srv/datasets-private", **SEEN}},
            "outside",
        ),
        ("an odd mode", "/home/alice/d:/d:rw,z", {}, "HOSTPATH:CONTAINERPATH"),
        ("too many colons", "/a:/b:/c:ro", {}, "HOSTPATH:CONTAINERPATH"),
    ],
)
def test_mounts_a_user_may_not_ask_for(why, spec, seen, message, monkeypatch):
    monkeypatch.setattr(enforce, "home_of", lambda who: "/home/alice")
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("[", r"\[")):
        enforce.check_mounts([spec], ALICE, HOUSE, probe=_probe(seen))


def test_mounts_a_user_may_ask_for(monkeypatch):
    monkeypatch.setattr(enforce, "home_of", lambda who: "/home/alice")
    seen = {
        "/home/alice/data": {"path": "/home/alice/data", **SEEN},
        "/srv/datasets/imagenet": {"path": "/srv/datasets/imagenet", "dev": 3, "ino": 4, "dir": True},
    }
    mounts = enforce.check_mounts(["{home}/data:/data", "/srv/datasets/imagenet:/in:ro"], ALICE, HOUSE, _probe(seen))
    assert [(m.source, m.target, m.read_only) for m in mounts] == [
        ("/home/alice/data", "/data", False),
        ("/srv/datasets/imagenet", "/in", True),
    ]


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        (["run", "-e", "HF_TOKEN=hf_secret", "--env=A=b", "-eX=1", "img"],
         ["run", "-e", "HF_TOKEN=…", "--env=A=…", "-eX=…", "img"]),
        (["queue", "add", "-deHF_TOKEN=hf_secret", "img"], ["queue", "add", "-deHF_TOKEN=…", "img"]),
        (["run", "--force=1", "-eHF_TOKEN=hf_secret", "img"], ["run", "--force=…", "-eHF_TOKEN=…", "img"]),  # refused
        (["ps", "--all"], ["ps", "--all"]),
    ],
)  # fmt: skip
def test_the_audit_log_keeps_no_variable_value(args, kept):
    assert enforce._summary(args) == kept


def test_the_sudoers_binary_must_be_a_plain_absolute_path():
    for bad in ("imgbuild", "/usr/bin/imgbuild ALL", "/usr/bin/img,build", "/usr/bin/imgbuild\n"):
        with pytest.raises(UsageError, match="--binary"):
            enforce.sudoers(bad)


# --- real users, Debian's sudo, the real engine --------------------------------------------------------

BINARY = str(Path(sys.executable).parent / "imgbuild")
USERS = ("imgbt-alice", "imgbt-bob")


def _have_users() -> bool:
    try:
        return all(pwd.getpwnam(u) for u in USERS) and bool(shutil.which("visudo"))
    except KeyError:
        return False


@pytest.fixture
def enforced(testbed, tmp_path, unique):
    """The test bed as an enforced server: the sudoers drop-in for this checkout's imgbuild, a site config with
    the rules, two GPUs from a snapshot; restored afterwards."""
    assert os.geteuid() == 0, "enforced mode is root's to install: the tests that set it up run as root"
    assert _have_users(), "the test bed makes imgbt-alice, imgbt-bob and installs sudo (tests/testbed/up --all)"
    reg = testbed["IMGBUILD_TESTBED_REGISTRY"]
    shared = Path(f"/srv/imgbt-shared-{unique}")
    shared.mkdir(parents=True)
    (shared / "README").write_text("shared data\n")
    state = Path(f"/var/tmp/imgbt-state-{unique}")
    snapshot = shared / "gpus.json"
    gpus = [
        {"index": i, "uuid": f"GPU-{i}-{unique}", "name": "NVIDIA A100-SXM4-80GB", "memory_used_mib": 0,
         "memory_total_mib": 81920, "utilization": 0, "processes": [], "compute_cap": "8.0", "driver": "580.95.05"}
        for i in range(2)
    ]  # fmt: skip
    snapshot.write_text(json.dumps({"gpus": gpus}))
    site = Path("/etc/imgbuild/config.yaml")
    kept = site.read_bytes() if site.exists() else None
    site.parent.mkdir(exist_ok=True)
    cli = f"docker_cli: {testbed['IMGBUILD_DOCKER_CLI']}\n" if testbed.get("IMGBUILD_DOCKER_CLI") else ""
    site.write_text(
        f"ngc_registry: {reg}\ninsecure_registries: [{reg}]\ngpu_snapshot: {snapshot}\n{cli}"
        f"run:\n  ulimits: {{memlock: 8388608}}\n  gpu_flag: env\n  state_dir: {state}\n  max_gpus_per_user: 1\n"
        f'  allowed_images: ["{reg}/nvidia/*", "{{user}}/*"]\n  allowed_mounts: ["{{home}}", "{shared}"]\n'
    )
    drop_in = Path("/etc/sudoers.d/imgbuild-test")
    candidate = tmp_path / "sudoers"
    candidate.write_text(enforce.sudoers(BINARY))
    assert subprocess.run(["visudo", "-cf", str(candidate)], capture_output=True).returncode == 0
    shutil.copyfile(candidate, drop_in)
    os.chmod(drop_in, 0o440)
    try:
        yield {"registry": reg, "shared": shared, "state": state, "image": f"{reg}/nvidia/pytorch:24.05-py3"}
    finally:
        drop_in.unlink(missing_ok=True)
        if kept is None:
            site.unlink(missing_ok=True)
        else:
            site.write_bytes(kept)
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
        subprocess.run(
            ["sh", "-c", f"docker ps -aq --filter name={unique} | xargs -r docker rm -f"], capture_output=True
        )


def as_user(
    user: str,
    *args: str,
    sudo_args: tuple[str, ...] = (),
    timeout: int = 120,
    cwd: str | None = None,
    environ: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """What `user` types: `sudo imgbuild ARGS`, in their home (or `cwd`), with their own `environ` besides."""
    home = pwd.getpwnam(user).pw_dir
    return subprocess.run(
        ["runuser", "-u", user, "--", "sudo", "-n", *sudo_args, BINARY, *args],
        cwd=cwd or home,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": home, "LANG": "C.UTF-8", **(environ or {})},
    )


@pytest.mark.root("staging binds are mount(8)'s")
@pytest.mark.alone
@pytest.mark.engine
def test_a_folder_swapped_for_a_link_after_the_check_is_never_mounted(tmp_path, monkeypatch):
    """The check resolves the path as the caller; the start binds the very object checked (same device and
    inode, walked without following links): a link swapped in between is refused, not followed as root."""
    assert os.geteuid() == 0, "staging binds are root's (mount(8))"
    folder = tmp_path / "mine"
    folder.mkdir()
    who = Caller("root", 0, 0)
    (mount,) = enforce.check_mounts([f"{folder}:/data"], who, run_rules({"allowed_mounts": [str(tmp_path)]}))
    folder.rename(tmp_path / "moved")
    folder.symlink_to("/etc")
    with pytest.raises(UsageError, match="changed since it was checked"), enforce.staged([mount]):
        pass
    folder.unlink()
    (tmp_path / "moved").rename(folder)
    with enforce.staged([mount]) as specs:
        point = specs[0].split(":")[0]
        assert (os.stat(point).st_dev, os.stat(point).st_ino) == (mount.dev, mount.ino)  # the object itself
    assert not os.path.exists(point)


@pytest.mark.parametrize(
    "who, acting",
    [
        (Caller("alice", 1001, 1001, via_sudo=True), True),  # through the drop-in
        (Caller("root", 0, 0, via_sudo=True), False),  # root saying sudo
        (Caller("alice", 1001, 1001), False),  # alice with her own engine access: the engine's rules, not ours
    ],
)
def test_who_is_held_to_the_rules(who, acting, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert enforce.acting_for_user(who) is acting


def test_a_member_of_the_sudo_group_is_an_admin(monkeypatch):
    import grp

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(grp, "getgrall", lambda: [grp.struct_group(("sudo", "x", 27, ["carol"]))])
    monkeypatch.setattr(grp, "getgrgid", lambda gid: grp.struct_group(("carol", "x", gid, [])))
    assert Caller("carol", 1005, 1005, via_sudo=True).is_admin
    assert not Caller("dave", 1006, 1006, via_sudo=True).is_admin

    def unnamed(gid):
        raise KeyError(gid)

    monkeypatch.setattr(grp, "getgrgid", unnamed)  # a primary group with no name here: membership still counts
    assert Caller("carol", 4321, 4322, via_sudo=True).is_admin


@pytest.mark.parametrize("spec", ["{0}:/x", "{user.__class__.__mro__}:/x", "{home!r}:/x", "{:>99999999}:/x", "{"])
def test_a_mount_is_never_a_format_string(spec, monkeypatch):
    """`-v` text went through str.format: `{0}` raised IndexError (an unexpected-error exit), `{user.__class__}` read
    attributes. Only {user}, {home} and {uid} are replaced; anything else stays text and is refused as a path."""
    from imgbuild.hostio.host import expand

    assert expand(spec, user="alice", home="/home/alice", uid=1001) == spec
    assert expand("{home}/{user}/{uid}", user="alice", home="/home/alice", uid=1001) == "/home/alice/alice/1001"
    monkeypatch.setattr(enforce, "home_of", lambda who: "/home/alice")
    with pytest.raises(UsageError):
        enforce.check_mounts([spec], ALICE, HOUSE, probe=_probe({}))


@pytest.mark.root("becomes another user")
@pytest.mark.alone
@pytest.mark.engine
def test_a_path_is_resolved_with_the_callers_own_permissions():
    """resolve_as forks, becomes the caller (UID, GID, groups) and looks: root's view is not the question."""
    assert os.geteuid() == 0, "becoming another user is root's"
    alice = pwd.getpwnam("imgbt-alice")
    who = Caller("imgbt-alice", alice.pw_uid, alice.pw_gid, via_sudo=True)
    assert enforce.resolve_as(who, "/root") == {"error": "you cannot read it"}
    assert enforce.resolve_as(who, "/etc/shadow") == {"error": "you cannot read it"}
    assert enforce.resolve_as(who, "/nonexistent-imgbt")["error"] == "No such file or directory"
    assert enforce.resolve_as(who, "/dev/null") == {"error": "not a folder or a regular file"}
    seen = enforce.resolve_as(who, alice.pw_dir)
    assert seen["path"] == os.path.realpath(alice.pw_dir) and seen["dir"] is True


@pytest.mark.root("installs a sudoers drop-in and a site config, acts as other users")
@pytest.mark.alone
@pytest.mark.engine
def test_the_queue_with_two_users_through_sudo(enforced, unique, docker_client):
    """alice queues two jobs through sudo; the first starts at once (as her,
    under the rules), the second waits (her quota is one GPU); bob cannot take it back; a drained queue starts
    nothing; resumed, root's `queue run` (what the reaper's timer does) starts it when the first has ended."""
    import time

    from tests.conftest import run_cli

    image = enforced["image"]
    root = {"IMGBUILD_SITE_CONFIG": "/etc/imgbuild/config.yaml"}
    alice = pwd.getpwnam("imgbt-alice")
    first = as_user("imgbt-alice", "queue", "add", "--gpus", "1", "--notify", "--name", f"q1{unique}", image, "--", "sleep", "4")  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert f"started imgbt-alice_q1{unique}_1" in first.stderr
    second = as_user("imgbt-alice", "queue", "add", "--gpus", "1", "--name", f"q2{unique}", image, "--", "true")
    assert second.returncode == 0 and "started" not in second.stderr, second.stderr
    waiting = second.stdout.strip()
    listed = {j["id"]: j for j in json.loads(as_user("imgbt-alice", "queue", "ls", "--json").stdout)}
    assert listed[waiting]["state"] == "queued" and listed[waiting]["user"] == "imgbt-alice"
    assert waiting not in {j["id"] for j in json.loads(as_user("imgbt-bob", "queue", "ls", "--json").stdout)}
    taken = as_user("imgbt-bob", "queue", "rm", waiting)
    assert taken.returncode == 2 and "is imgbt-alice's, not yours" in taken.stderr
    refused = as_user("imgbt-bob", "queue", "drain")
    assert refused.returncode == 2 and "the admin's" in refused.stderr
    assert run_cli("queue", "drain", env=root).code == 0
    deadline = time.monotonic() + 60
    while docker_client.containers.get(f"imgbt-alice_q1{unique}_1").status == "running" and time.monotonic() < deadline:
        time.sleep(0.5)
    nothing = run_cli("queue", "run", env=root)
    assert "nothing started" in nothing.err, nothing.err
    assert run_cli("queue", "resume", env=root).code == 0
    went = run_cli("queue", "run", env=root)
    assert f"started imgbt-alice_q2{unique}_1" in went.err, went.err
    started = docker_client.containers.get(f"imgbt-alice_q2{unique}_1")
    assert started.attrs["Config"]["User"] == f"{alice.pw_uid}:{alice.pw_gid}"
    assert "no-new-privileges" in (started.attrs["HostConfig"]["SecurityOpt"] or [])
    # notices, for both users: alice's queued job (--notify) ended; bob's own run --notify fails
    bobs = as_user("imgbt-bob", "run", "--notify", "--name", f"nb{unique}", image, "--", "sh", "-c", "exit 4")
    assert bobs.returncode == 4, bobs.stderr
    from imgbuild.config.site import reap_policy, run_rules
    from imgbuild.engine import Engine
    from imgbuild.servers.reap import reap

    given: list[tuple[str, str]] = []
    house = run_rules({"state_dir": str(enforced["state"])})
    reap(
        Engine.connect(None), [], house, reap_policy({}), time.time(), notify=lambda u, t: given.append((u, t)) or True
    )
    mine = sorted((u, t.split(" after ")[0]) for u, t in given if unique in t)
    assert mine == [
        ("imgbt-alice", f"imgbuild: imgbt-alice_q1{unique}_1 finished"),
        ("imgbt-bob", f"imgbuild: imgbt-bob_nb{unique}_1 failed (exit 4)"),
    ], given


@pytest.mark.parametrize(
    "args, allowed",
    [
        (["run", "img"], True),
        (["queue", "add", "img"], True),
        (["build", "r.yaml"], True),  # the recipe's files are read as the user (test_builds_through_sudo_...)
        (["smoke", "img"], True),
        (["rebuild"], False),  # CI's: pushes with the registry login
        (["lock", "r.yaml"], False),
        (["reap"], False),
        (["--user", "bob", "run", "img"], False),  # a global flag before the command
        (["admin", "sudoers"], False),
        ([], False),
        (["run\n"], False),
    ],
)
def test_the_gate_lets_a_user_through_sudo_run_only_the_user_commands(args, allowed):
    if allowed:
        enforce.gate(args)
    else:
        with pytest.raises(UsageError, match="through sudo, imgbuild runs only run, ps, logs"):
            enforce.gate(args)


@pytest.mark.root("installs a sudoers drop-in and a site config, acts as other users")
@pytest.mark.alone
@pytest.mark.engine
def test_builds_through_sudo_read_as_the_user_and_tag_into_her_namespace(enforced, unique, docker_client):
    """`sudo imgbuild build` reads every file of the recipe, and writes the context, as the user; the engine
    builds root's private copy; the image goes only into her namespace. Each attempt to use root's reach through
    a build or a smoke test is refused with one line; her own build works and is hers."""
    alice = pwd.getpwnam("imgbt-alice")
    repo = Path(alice.pw_dir) / f"repo-{unique}"
    (repo / "files").mkdir(parents=True)
    (repo / "files" / "hello.txt").write_text("hello\n")
    (repo / ".git").mkdir()
    head = f'name: mine-{unique}\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\n'
    recipes = {
        "ok.yaml": head + "files:\n  - {src: files/hello.txt, dest: /opt/hello.txt}\n",
        "shadow.yaml": head + "files:\n  - {src: files/shadow, dest: /opt/s}\n",
        "ca.yaml": head + "pip: {packages: [six], ca_bundle: files/shadow}\n",
        "bobs.yaml": head.replace("tag: v1", f"image: imgbt-bob/mine-{unique}:v1"),
        "alpine.yaml": f"name: a-{unique}\nbase: {{image: docker.io/library/alpine:3}}\n",
    }
    for name, text in recipes.items():
        (repo / name).write_text(text)
    subprocess.run(["chown", "-R", f"{alice.pw_uid}:{alice.pw_gid}", str(repo)], check=True)
    os.link("/etc/shadow", repo / "files" / "shadow")  # made for her by root (protected_hardlinks stops her)
    linked = Path(alice.pw_dir) / f"linked-{unique}"
    (linked / ".git").mkdir(parents=True)
    (linked / "ok.yaml").write_text(
        recipes["ok.yaml"].replace("files:\n  - {src: files/hello.txt, dest: /opt/hello.txt}\n", "")
    )
    (linked / "images").symlink_to("/root")
    subprocess.run(["chown", "-R", "-h", f"{alice.pw_uid}:{alice.pw_gid}", str(linked)], check=True)
    attempts = [
        ("a hard link to /etc/shadow copied into the image", ["build", str(repo / "shadow.yaml")], "files"),
        ("the same link as the CA bundle (a build secret)", ["build", str(repo / "ca.yaml")], "ca_bundle"),
        ("a recipe only root can read", ["build", "/etc/shadow"], "shadow"),
        ("bob's namespace", ["build", str(repo / "bobs.yaml")], "you build only imgbt-alice/"),
        ("a base this server does not allow", ["build", str(repo / "alpine.yaml")], "base docker.io/library/alpine:3"),
        ("push with root's registry login", ["build", "--push", str(repo / "ok.yaml")], "--push"),
        ("a remote builder", ["build", "--builder", "x", str(repo / "ok.yaml")], "--builder"),
        ("the context into root's home", ["build", "-o", f"/root/ctx-{unique}", str(repo / "ok.yaml")], "/root"),
        ("images/ a link to /root", ["build", str(linked / "ok.yaml")], "Permission denied"),
        ("smoke-test an image from elsewhere", ["smoke", "docker.io/library/alpine:3"], "not an image this server"),
        ("smoke-test bob's image", ["smoke", f"imgbt-bob/x-{unique}:1"], "not an image this server"),
    ]
    for why, args, names in attempts:
        res = as_user("imgbt-alice", *args, timeout=300)
        assert res.returncode in (2, 3), (why, res.returncode, res.stdout, res.stderr)
        said = [line for line in res.stderr.splitlines() if line.startswith("imgbuild: ")]  # not progress lines
        assert len(said) == 1 and "Traceback" not in res.stderr, (why, res.stderr)
        assert names in said[0], (why, res.stderr)
    assert not Path(f"/root/ctx-{unique}").exists()
    target = f"imgbt-alice/mine-{unique}:v1"
    try:
        built = as_user("imgbt-alice", "build", "--skip-gpu", str(repo / "ok.yaml"), timeout=900)
        assert built.returncode == 0, built.stderr[-3000:]
        assert target in built.stdout
        out = docker_client.containers.run(target, ["cat", "/opt/hello.txt"], remove=True)
        assert out.endswith(b"\nhello\n")  # after the base image's banner
        context = repo / "images" / f"mine-{unique}"
        for path in [context, context / "Dockerfile", context / "smoke.json"]:
            assert path.stat().st_uid == alice.pw_uid, path  # written as her, not as root
        assert json.loads((context / "smoke.json").read_text())["ok"] is True
        report = as_user("imgbt-alice", "smoke", "--skip-gpu", target, "--report", f"/etc/imgbt-{unique}.json")
        assert report.returncode == 3 and "cannot write /etc/imgbt-" in report.stderr, report.stderr
        assert not Path(f"/etc/imgbt-{unique}.json").exists()  # written as her, so not at all
        assert not list(Path("/root/.cache/imgbuild/runs").glob("context-*")), "root's private copy is removed"
        audit = (enforced["state"] / ".reap" / "audit.log").read_text().splitlines()
        assert any('"build"' in line and '"exit 0"' in line and "imgbt-alice" in line for line in audit)
    finally:
        subprocess.run(["docker", "rmi", "-f", target], capture_output=True)
        (repo / "files" / "shadow").unlink()
        shutil.rmtree(repo, ignore_errors=True)
        shutil.rmtree(linked, ignore_errors=True)


@pytest.mark.parametrize(
    "why, make, message",
    [
        ("a link to a root-only file", lambda d: (d / "x").symlink_to("/etc/shadow"), "Too many levels"),
        ("a link to a folder", lambda d: (d / "x").symlink_to("/root"), "Too many levels"),
        ("a FIFO (would block the build)", lambda d: os.mkfifo(d / "x"), "not a regular file or folder"),
        ("too many files", lambda d: [(d / f"f{i}").write_text("x") for i in range(5)], "more than 4 files"),
        ("too many bytes", lambda d: (d / "big").write_bytes(b"x" * 5000), "larger than"),
    ],
)
def test_a_private_copy_takes_only_the_users_own_files(why, make, message, tmp_path):
    """What a user can swap into her rendered context before the engine reads it is refused, not followed."""
    src, dest = tmp_path / "ctx", tmp_path / "copy"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "Dockerfile").write_text("FROM x\n")
    dest.mkdir()
    me = Caller("me", os.getuid(), os.getgid())
    make(src / "sub")
    with pytest.raises(UsageError, match=message):
        acting.private_copy(src, dest, me, 4096, 4)


def test_a_private_copy_keeps_folders_files_and_exec_bits(tmp_path):
    src, dest = tmp_path / "ctx", tmp_path / "copy"
    (src / "imgbuild").mkdir(parents=True)
    (src / "Dockerfile").write_text("FROM x\n")
    (src / "imgbuild" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "imgbuild" / "run.sh", 0o700)
    dest.mkdir()
    acting.private_copy(src, dest, Caller("me", os.getuid(), os.getgid()), 4096, 10)
    assert (dest / "Dockerfile").read_text() == "FROM x\n"
    assert oct((dest / "imgbuild" / "run.sh").stat().st_mode & 0o777) == "0o755"


@pytest.mark.parametrize(
    "target, ok",
    [
        ("alice/research:v1", True),
        ("bob/research:v1", False),
        ("alice:v1", False),  # no namespace at all
        ("registry.example.org/alice/research:v1", False),  # a registry's name: a push with root's login
        ("alicex/research:v1", False),
        ("library/alice:v1", False),
    ],
)
def test_a_build_for_a_user_tags_only_her_namespace(target, ok):
    if ok:
        acting.check_target(ALICE, target)
    else:
        with pytest.raises(UsageError, match="you build only alice/NAME:TAG"):
            acting.check_target(ALICE, target)


@pytest.mark.parametrize("flags", [{"push": True}, {"builder": "remote"}, {"sign_key": "/root/cosign.key"}])
def test_build_flags_that_reach_past_this_host_are_refused(flags):
    for_alice = acting.Acting(ALICE, ())
    given = {"push": False, "builder": None, "sign_key": None, **flags}
    with pytest.raises(UsageError, match="builds stay on this host"):
        enforce.check_build(for_alice, **given)
    enforce.check_build(None, **given)  # root, an admin, a user with her own engine: nothing to enforce


@functools.cache
def _source(module: str) -> Path | None:
    """The file of an imgbuild module, found without importing it; None for anything else."""
    import imgbuild

    root = Path(imgbuild.__file__).parent.parent
    parts = module.split(".")
    if parts[0] != "imgbuild":
        return None
    for path in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__init__.py")):
        if path.is_file():
            return path
    return None


@functools.cache
def _tree(module: str):
    import ast

    return ast.parse(_source(module).read_text())


@functools.cache
def _imports(module: str) -> tuple[set[str], set[str]]:
    """(modules imported at the top, modules imported inside a function) by `module`."""
    import ast

    tree = _tree(module)
    top = {name for node in tree.body for name in _named(node)}
    late: set[str] = set()
    todo = [(node, False) for node in tree.body]
    while todo:
        node, inside = todo.pop()
        if inside:
            late |= _named(node)
        inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        todo += [(child, inside) for child in ast.iter_child_nodes(node) if not isinstance(child, ast.expr)]
    return top, late - {"__future__"}


def _is_module(name: str) -> bool:
    return _source(name) is not None


def _named(node) -> set[str]:
    """The modules an import statement names (`from imgbuild.recipe import reqfile` names the submodule too)."""
    import ast

    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        subs = {f"{node.module}.{a.name}" for a in node.names} if node.module.startswith("imgbuild") else set()
        return {node.module} | {sub for sub in subs if _is_module(sub)}
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    return set()


def _called_names(node, where: dict[str, str]) -> set[tuple[str, str]]:
    """(module, name) of each call under `node` to a name `where` traces to an imgbuild module (`spared.x()` is
    (the module `spared` names, "x"); `load_recipe()` is (its module, "load_recipe"))."""
    import ast

    found = set()
    for call in (c for c in ast.walk(node) if isinstance(c, ast.Call)):
        head, attrs = call.func, []
        while isinstance(head, ast.Attribute):
            attrs.append(head.attr)
            head = head.value
        if isinstance(head, ast.Name) and head.id in where:
            module = where[head.id]
            found.add(
                (module, attrs[-1]) if attrs and _is_module(module) and module.endswith(head.id) else (module, head.id)
            )
    return found


@functools.cache
def _module_tree(module: str):
    import ast

    tree = _tree(module)
    where = {
        alias.asname or alias.name: sub if _is_module(sub := f"{node.module}.{alias.name}") else node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("imgbuild")
        for alias in node.names
    }
    return tree, where


def _as_user_blocks() -> tuple[set[str], set[str]]:
    """(the modules that open an `as_user` block, the imgbuild modules the code called in one may import): for
    each function called in a block, its module's top imports and the imports inside it, followed through the
    functions it calls."""
    import ast

    import imgbuild

    package = Path(imgbuild.__file__).parent
    openers, todo = set(), set()
    for path in sorted(package.rglob("*.py")):
        if "as_user(" not in path.read_text():
            continue
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        tree, where = _module_tree(name)
        for node in ast.walk(tree):
            if isinstance(node, ast.With) and any(
                isinstance(item.context_expr, ast.Call) and ast.unparse(item.context_expr.func).endswith("as_user")
                for item in node.items
            ):
                openers.add(name)
                todo |= _called_names(ast.Module(body=node.body, type_ignores=[]), where)
    starts, seen = set(), set()
    while todo:
        module, function = todo.pop()
        if (module, function) in seen:
            continue
        seen.add((module, function))
        tree, where = _module_tree(module)
        own = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        if function in own:  # its module's top imports, and the imports inside it and what it calls
            starts |= {m for n in tree.body for m in _named(n) if m.startswith("imgbuild.")}
            starts |= {m for inner in ast.walk(own[function]) for m in _named(inner)}
            todo |= {(module, n.id) for n in ast.walk(own[function]) if isinstance(n, ast.Name) and n.id in own}
            todo |= _called_names(own[function], where)
        elif function in where:  # a package's re-export
            todo.add((where[function], function))
        else:
            starts.add(module)
    return openers, {m for m in starts if m.startswith("imgbuild.")}


def _closure(start: set[str], late_too: bool) -> set[str]:
    """The imgbuild modules `start` imports, and those they import: at the top only, or inside functions too."""
    seen, todo = set(), list(start)
    while todo:
        module = todo.pop()
        if module in seen or module == "imgbuild.config.settings" or not _is_module(module):
            continue  # the settings: a type the code is handed, its reading done before any block
        seen.add(module)
        top, late = _imports(module)
        todo += [m for m in (top | late if late_too else top) if m.startswith("imgbuild.")]
    return seen


def test_what_runs_as_the_user_imports_nothing_after_the_switch():
    """A build acting for a user reads her files as her (`as_user`); Python's own files may be where she cannot
    read them (this bed's Python is under /root), so an import inside the block failed with ModuleNotFoundError.
    Every import inside the functions called in a block, and inside any function of every imgbuild module they
    import, is imported before the switch: imgbuild's own by the module that opens the block (at its top), the
    rest by as_user itself (acting.PRELOAD, which names no imgbuild module: a lower level never imports a
    higher one by name)."""
    openers, called = _as_user_blocks()
    assert {"imgbuild.pipeline.build", "imgbuild.hostio.acting"} <= openers
    ready = _closure(openers, late_too=False)
    user_side = _closure(called, late_too=True)
    assert {"imgbuild.fields", "imgbuild.text", "imgbuild.gpu.fleet", "imgbuild.recipe.reqfile"} <= user_side
    assert not [name for name in acting.PRELOAD if name.startswith("imgbuild")]
    for module in sorted(user_side):
        late = _imports(module)[1] - {"imgbuild", "imgbuild.config.settings"}
        ours = {m for m in late if m.startswith("imgbuild.")}
        assert ours <= ready, (
            f"{module} imports {sorted(ours - ready)} inside a function: import it at the top of {sorted(openers)}"
        )
        others = {m for m in late - ours if m.split(".")[0] not in ("imgbuild", "typing")}
        assert others <= set(acting.PRELOAD), (
            f"{module} imports {sorted(others - set(acting.PRELOAD))} inside a function: add it to acting.PRELOAD"
        )


def _as_plain(user: str, script: str, stdin: str = "") -> subprocess.CompletedProcess:
    """`user` in their own shell, without sudo: what they can do to files by hand."""
    return subprocess.run(
        ["runuser", "-u", user, "--", "sh", "-c", script], input=stdin, capture_output=True, text=True, timeout=60
    )


def _give(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for folder, _, files in os.walk(path):
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        for name in files:
            os.chown(os.path.join(folder, name), entry.pw_uid, entry.pw_gid)


@pytest.mark.root("installs a sudoers drop-in and a site config, acts as other users")
@pytest.mark.alone
@pytest.mark.engine
def test_nothing_a_user_writes_reaches_root_through_the_queue_the_cli_or_the_state_folder(
    enforced, unique, docker_client
):
    """The root paths of a shared server, each tried by a real user (imgbt-alice) through Debian's sudo on the real
    engine, attack first: a package named imgbuild in the folder a job is queued from; a queue file written by
    hand with the sudo group's gid and root's flags; HOME and PATH given as container variables to run her own
    credential helper in root's docker CLI; a docker config planted in a shared HOME to steer bob's runs; folders
    planted at root's names in a fresh state folder; the host's lock held; bob's queued secret read; an image whose
    labels would hide its container and hold every GPU. None of her code runs as root, none of bob's secrets
    reach her, and bob's runs go on."""
    import time

    from imgbuild.facts import Label
    from imgbuild.servers.ledger import Ledger
    from tests.conftest import run_cli

    image, state, reg = enforced["image"], enforced["state"], enforced["registry"]
    alice, bob = (pwd.getpwnam(u) for u in USERS)
    ahome = Path(alice.pw_dir)
    proof = Path(f"/tmp/imgbt-proof-{unique}")  # what any of her code leaves when it runs
    code = f"import os\nopen({str(proof)!r}, 'a').write(f'uid={{os.getuid()}}\\n')\n"
    root = {"IMGBUILD_SITE_CONFIG": "/etc/imgbuild/config.yaml"}
    planted_home = Path("/tmp/home")
    planted_home_is_ours = not planted_home.exists()
    holder = None
    try:
        # -- a fresh state folder (root's, sticky, as the first run makes it): she plants root's names first
        Ledger(state).folder()
        planted = _as_plain(
            "imgbt-alice",
            f"mkdir {state}/.reap {state}/ledger-0.json {state}/queue-{bob.pw_uid}.json && "
            f"echo '{{}}' > {state}/.reap/usage.jsonl",
        )
        assert planted.returncode == 0, planted.stderr
        went = as_user("imgbt-bob", "queue", "add", "--name", f"qb{unique}", "-e", f"HF_TOKEN=hf_bob_{unique}",
                       image, "--", "sleep", "30")  # fmt: skip
        assert went.returncode == 0 and "started" in went.stderr, went.stderr
        reap = os.lstat(state / ".reap")
        assert reap.st_uid == 0 and reap.st_mode & 0o777 == 0o700, "root's folder is root's again"
        bobs_file = os.stat(state / ".reap" / f"queue-{bob.pw_uid}.json")
        assert bobs_file.st_uid == 0 and bobs_file.st_mode & 0o777 == 0o600, "bob's queue: root's, private"

        # -- bob's secret is not hers to read
        for args in (["queue", "ls"], ["queue", "ls", "--json"]):
            listed = as_user("imgbt-alice", *args)
            assert listed.returncode == 0 and f"hf_bob_{unique}" not in listed.stdout + listed.stderr, listed.stdout
            assert "HF_TOKEN" not in listed.stdout  # another's job: id, user, state and place only
            own = as_user("imgbt-bob", *args)
            assert "HF_TOKEN=***" in own.stdout and f"hf_bob_{unique}" not in own.stdout, own.stdout
        read = _as_plain("imgbt-alice", f"cat {state}/.reap/queue-{bob.pw_uid}.json")
        assert read.returncode != 0 and f"hf_bob_{unique}" not in read.stdout

        # -- a queue file she writes by hand: the sudo group's gid, root in the container, the host's / mounted
        job = {"id": "0badc0de", "user": "imgbt-alice", "uid": alice.pw_uid, "gid": 27, "submitted": time.time(),
               "cwd": str(ahome), "args": ["--user", "0:0", "-v", "/:/host", "--no-workspace", "--name",
                                           f"qr{unique}", image, "--", "sh", "-c", f"id > /host{proof}"]}  # fmt: skip
        hers = state / f"queue-{alice.pw_uid}.json"
        wrote = _as_plain("imgbt-alice", f"umask 022; cat > {hers}", json.dumps({"jobs": [job]}))
        assert wrote.returncode == 0, wrote.stderr
        run_cli("queue", "run", env=root)  # root's timer advances the queue
        assert not proof.exists(), proof.read_text()
        assert not docker_client.containers.list(all=True, filters={"name": f"qr{unique}"})
        assert os.stat(hers).st_uid == alice.pw_uid, "her file stays hers: root never vouches for it"
        assert _as_plain("imgbt-alice", f"rm -f {hers}").returncode == 0

        # -- a package named imgbuild in the folder she queues from
        folder = ahome / f"q-{unique}"
        (folder / "imgbuild").mkdir(parents=True)
        for name in ("__init__.py", "__main__.py"):
            (folder / "imgbuild" / name).write_text(code)
        _give(folder, "imgbt-alice")
        queued = as_user("imgbt-alice", "queue", "add", "--name", f"qa{unique}", image, "--", "true", cwd=str(folder))
        assert queued.returncode == 0, queued.stderr
        run_cli("queue", "run", env=root)
        assert not proof.exists(), proof.read_text()

        # -- HOME and PATH as container variables, to run her credential helper in root's docker CLI
        fake_home, bin_dir = ahome / f"h-{unique}", ahome / f"bin-{unique}"
        (fake_home / ".docker").mkdir(parents=True)
        (fake_home / ".docker" / "config.json").write_text('{"credsStore": "imgbt"}')
        bin_dir.mkdir()
        helper = bin_dir / "docker-credential-imgbt"
        helper.write_text(f"#!/bin/sh\nid >> {proof}\necho '{{}}'\n")
        helper.chmod(0o755)
        _give(fake_home, "imgbt-alice")
        _give(bin_dir, "imgbt-alice")
        pulled = as_user("imgbt-alice", "run", "-e", f"HOME={fake_home}", "-e", f"PATH={bin_dir}:/usr/bin:/bin",
                         f"{reg}/nvidia/absent-{unique}:1", "--", "true")  # fmt: skip
        assert pulled.returncode != 0
        assert not proof.exists(), proof.read_text()

        # -- a docker config planted in the default HOME of every stock-image run, to steer bob's CLI
        if planted_home_is_ours:
            _as_plain("imgbt-alice", "mkdir -p /tmp/home/.docker && echo "
                      "'{\"proxies\":{\"default\":{\"httpProxy\":\"http://alice-proxy:3128\"}}}' > /tmp/home/.docker/config.json")  # fmt: skip
        seen = as_user("imgbt-bob", "run", image, "--", "env")
        assert seen.returncode == 0, seen.stderr
        assert "alice-proxy" not in seen.stdout, [ln for ln in seen.stdout.splitlines() if "prox" in ln.lower()]

        # -- the host's lock, held by her: bob's run still starts, within seconds
        holder = subprocess.Popen(
            ["runuser", "-u", "imgbt-alice", "--", "/usr/bin/python3", "-c",
             "import fcntl,sys,time;f=open(sys.argv[1],'a');fcntl.flock(f,fcntl.LOCK_EX);print('held',flush=True);"
             "time.sleep(120)", str(state / "ledger.lock")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert holder.stdout and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        quick = as_user("imgbt-bob", "run", image, "--", "true")
        assert quick.returncode == 0, quick.stderr
        assert time.monotonic() - started < 60

        # -- an image whose labels would hide its container from ps and the reaper and hold every GPU
        evil = f"imgbt-alice/evil{unique}:1"
        labels = {Label.SMOKE_OF: "x", Label.GPU_UUIDS: "GPU-0,GPU-1", Label.GPUS: "0,1", Label.DEADLINE: "9999999999"}
        docker_client.images.build(
            fileobj=__import__("io").BytesIO(f"FROM {image}\n".encode()), tag=evil, labels=labels, rm=True
        )
        try:
            ran = as_user("imgbt-alice", "run", "-d", "--name", f"ev{unique}", evil, "--", "sleep", "60")
            assert ran.returncode == 0, ran.stderr
            container = docker_client.containers.get(f"imgbt-alice_ev{unique}_1")
            got = container.attrs["Config"]["Labels"]
            assert {k: got.get(k) for k in labels} == dict.fromkeys(labels, ""), got
            shown = as_user("imgbt-alice", "ps", "--all")
            assert f"ev{unique}" in shown.stdout, shown.stdout
            # -- a ledger file she writes by hand: every GPU and port held by a process of hers kept alive
            from imgbuild.hostio.host import process_start

            sleeper = subprocess.Popen(["runuser", "-u", "imgbt-alice", "--", "sleep", "120"])
            try:
                time.sleep(0.3)
                pid = int(subprocess.run(["pgrep", "-u", "imgbt-alice", "-n", "-x", "sleep"], capture_output=True,
                                         text=True).stdout.split()[0])  # fmt: skip
                hold = {"name": "imgbt-alice_hog_1", "user": "imgbt-alice", "pid": pid, "started": process_start(pid),
                        "gpus": [f"GPU-{i}-{unique}" for i in range(2)], "cpus": [], "since": time.time(),
                        "ports": list(range(8888, 9888)), "waiting": "", "uid": alice.pw_uid, "seen": time.time()}  # fmt: skip
                ledger = state / f"ledger-{alice.pw_uid}.json"
                _as_plain("imgbt-alice", f"rm -f {ledger}")
                wrote = _as_plain("imgbt-alice", f"umask 022; cat > {ledger}", json.dumps({"entries": [hold]}))
                assert wrote.returncode == 0, wrote.stderr
                free = as_user("imgbt-bob", "run", "--gpus", "1", image, "--", "true")
                assert free.returncode == 0, free.stderr
            finally:
                sleeper.kill()
                sleeper.wait()
        finally:
            with contextlib.suppress(Exception):
                docker_client.images.remove(evil, force=True)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        proof.unlink(missing_ok=True)
        if planted_home_is_ours:
            shutil.rmtree(planted_home, ignore_errors=True)
        for name in ("q", "h", "bin"):
            shutil.rmtree(ahome / f"{name}-{unique}", ignore_errors=True)


@pytest.mark.root("runs a script's container as another user on the real engine")
@pytest.mark.alone
@pytest.mark.engine
def test_a_script_container_for_a_user_runs_as_them_hardened_with_its_own_ipc(testbed, docker_client):
    """The smoke test's container, acting for a user through sudo: their IDs, no new privileges, no capabilities,
    and an IPC namespace of its own (another user's /dev/shm segments are not in it)."""
    from imgbuild.engine import connect_engine
    from imgbuild.payload.probes import Probe

    script = (
        "import json,os\n"
        "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        "print('ANSWER' + json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'nnp': status['NoNewPrivs'].strip(),\n"
        "      'cap': status['CapEff'].strip(), 'ipc': os.readlink('/proc/self/ns/ipc')}))\n"
    )
    from imgbuild.config.settings import load_settings

    engine = connect_engine(load_settings({}))
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    probe = Probe("probe", script, "ANSWER")
    them = acting.ContainerUser(4321, 4322, "imgbt-nobody")
    code, output, _ = engine.containers.run_script(image, probe, [], {}, gpus=None, as_user=them, timeout=120)
    answer = probe.answer(output)
    assert code == 0 and answer, output
    assert (answer["uid"], answer["gid"], answer["nnp"]) == (4321, 4322, "1")
    assert int(answer["cap"], 16) == 0
    assert answer["ipc"] != os.readlink("/proc/self/ns/ipc")  # not the host's
    code, output, _ = engine.containers.run_script(
        image, probe, [], {}, gpus=None, ipc="host", timeout=120, as_user=None
    )
    plain = probe.answer(output)
    assert plain and plain["ipc"] == os.readlink("/proc/self/ns/ipc")  # root's own smoke test: the house's IPC
    code, output, _ = engine.containers.run_script(image, probe, [], {}, gpus=None, timeout=120, as_user=None)
    probing = probe.answer(output)  # a probe (pins, GPUs, a lock) asks for no IPC: the engine's own, not the host's
    assert probing and probing["ipc"] != os.readlink("/proc/self/ns/ipc")


@pytest.mark.engine  # Debian's sudo (visudo) comes with the whole bed: this runs with the bed's tests
def test_two_drop_ins_coexist_in_one_sudoers(tmp_path):
    """Two installs (or a test's drop-in beside a site's): each alias is its own, and sudo accepts both files
    together (one alias defined twice makes sudo grant neither)."""
    assert shutil.which("visudo"), "the test bed installs sudo (tests/testbed/up --all)"
    both = tmp_path / "sudoers"
    both.write_text(enforce.sudoers("/opt/imgbuild/bin/imgbuild") + enforce.sudoers("/usr/local/bin/imgbuild"))
    checked = subprocess.run(["visudo", "-cf", str(both)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    twice = tmp_path / "twice"
    twice.write_text(enforce.sudoers("/opt/imgbuild/bin/imgbuild") * 2)  # what one alias for all did
    assert subprocess.run(["visudo", "-cf", str(twice)], capture_output=True).returncode != 0


@pytest.mark.root("installs a sudoers drop-in and a site config, acts as other users")
@pytest.mark.alone
@pytest.mark.engine
def test_a_users_smoke_test_through_sudo_runs_their_image_as_them_without_privileges_or_the_hosts_ipc(
    enforced, unique, docker_client
):
    """Rows 28 and 30 of the shared-server review: an entrypoint hook in alice's image ran as root, with Docker's
    default capabilities, in the host's IPC namespace (bob's /dev/shm file read) during her `sudo imgbuild
    smoke`. The hook here ends the container (exit 42) if it has any of that; the control is root's own smoke
    test of the same image, where the hook does end it."""
    import io

    bob = pwd.getpwnam("imgbt-bob")
    secret = Path(f"/dev/shm/imgbt-bob-{unique}")
    secret.write_text("bob's dataloader segment\n")
    os.chown(secret, bob.pw_uid, bob.pw_gid)
    secret.chmod(0o600)
    hook = (
        f'if [ "$(id -u)" = 0 ] || grep -q "^NoNewPrivs:[[:space:]]*0" /proc/self/status '
        f'|| ! grep -q "^CapEff:[[:space:]]*0000000000000000" /proc/self/status || [ -e {secret} ]; then exit 42; fi\n'
    )
    image = f"imgbt-alice/hook{unique}:1"
    import base64

    encoded = base64.b64encode(hook.encode()).decode()
    dockerfile = (
        f"FROM {enforced['image']}\nRUN mkdir -p /opt/nvidia/entrypoint.d && echo {encoded} | base64 -d "
        "> /opt/nvidia/entrypoint.d/99-imgbt.sh\n"
    )
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=image, rm=True)
    try:
        from tests.conftest import run_cli

        control = run_cli("smoke", image, env={"IMGBUILD_SITE_CONFIG": "/etc/imgbuild/config.yaml"})
        assert control.code == 1 and "exited 42" in control.out + control.err, "root's own test: the hook ends it"
        hers = as_user("imgbt-alice", "smoke", image, timeout=300)
        assert hers.returncode == 0, hers.stdout[-2000:] + hers.stderr
    finally:
        secret.unlink(missing_ok=True)
        docker_client.images.remove(image, force=True)


def _calls_of(attr: str) -> list[tuple[str, str, object]]:
    """(file, innermost enclosing function, the Call node) for every call of `.attr(...)` in imgbuild's sources."""
    import ast

    package = Path(enforce.__file__).resolve().parents[1]
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        inside: dict[int, tuple[str, ast.Call]] = {}
        for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(func):  # outer functions come first: an inner one has the last word
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr:
                    inside[id(node)] = (func.name, node)
        found += [(str(path.relative_to(package.parent)), name, node) for name, node in inside.values()]
    return found


def test_every_script_container_runs_as_the_user_it_is_for_through_one_helper():
    """Each place that starts a script container of an image (a smoke test, the jupyter check, a base's pins, a
    lock, the engine's GPU read) says whom it runs as, and says it through `acting.container_user`."""
    import ast

    sites = [(f, fn, n) for f, fn, n in _calls_of("run_script") if f.startswith("imgbuild/") and fn != "run_script"]
    assert len(sites) >= 5
    for file, function, node in sites:
        given = {k.arg: k.value for k in node.keywords}  # type: ignore[attr-defined]
        assert "as_user" in given, f"{file}:{function} starts a script container without as_user"
        assert ast.unparse(given["as_user"]).startswith("container_user("), f"{file}:{function}"
    assert {f for f, _, _ in sites} >= {
        "imgbuild/servers/jupyter.py", "imgbuild/pipeline/resolve.py", "imgbuild/pipeline/pins.py",
        "imgbuild/pipeline/smoke.py",
    }  # fmt: skip


def test_the_engine_creates_containers_in_two_places_only():
    """The SDK's `containers.create` is called where a script container is made (its arguments from
    `scriptrun.script_container`, hardened for `as_user`) and for a lease's placeholder, which never starts."""
    sites = {(f, fn) for f, fn, _ in _calls_of("create") if f.startswith("imgbuild/engine/")}
    assert sites == {("imgbuild/engine/containers.py", "prepared"), ("imgbuild/engine/lease.py", "claim")}


def test_a_script_container_for_a_user_runs_as_them_without_privileges_within_their_runs_caps():
    from imgbuild.engine.scriptrun import script_container

    alice = acting.ContainerUser(1001, 1001, "alice", memory=2 << 30, pids_limit=100, cgroup_parent="u-1001.slice")
    hardened = script_container("alice/x:1", {}, False, "host", None, as_user=alice)
    assert hardened["user"] == "1001:1001" and hardened["cap_drop"] == ["ALL"]
    assert hardened["security_opt"] == ["no-new-privileges"] and hardened["ipc_mode"] == "private"
    assert hardened["pids_limit"] == 100 and hardened["mem_limit"] == hardened["memswap_limit"] == 2 << 30
    assert hardened["cgroup_parent"] == "u-1001.slice"
    plain = script_container("alice/x:1", {}, False, "host", None, as_user=None)  # root's own: the house's
    assert plain["ipc_mode"] == "host" and not {"user", "pids_limit", "mem_limit", "cgroup_parent"} & set(plain)


def test_a_script_containers_owner_and_gpus_are_imgbuilds_never_its_images_labels():
    """A smoke test of an image labelled as bob's, holding every GPU, past its deadline: the engine lays the
    create's labels over the image's, and every key imgbuild reads is the create's. The container is alice's,
    holds the GPU her test was given (the next run cannot take it), and nothing of bob's."""
    import types

    from imgbuild.engine.containers import DockerContainers
    from imgbuild.engine.scriptrun import script_container
    from imgbuild.facts import Label
    from imgbuild.servers.holds import check_quota, held_on_host

    image_labels = {Label.USER: "bob", Label.GPU_UUIDS: "GPU-0,GPU-1,GPU-2,GPU-3", Label.GPUS: "0,1,2,3",
                    Label.DEADLINE: "1", Label.NOTIFY: "1", Label.SLURM_JOB: "7"}  # fmt: skip
    alice = acting.ContainerUser(1001, 1001, "alice")

    def row(as_user: acting.ContainerUser | None, gpus: list[str] | None):  # type: ignore[no-untyped-def]
        made = script_container("alice/x:1", {}, False, "host", None, as_user=as_user, gpus=gpus)
        attrs = {"Config": {"Labels": {**image_labels, **made["labels"]}, "Image": "alice/x:1"}, "HostConfig": {}}
        container = types.SimpleNamespace(name="eager_hopper", short_id="c1", status="running", attrs=attrs)
        client = types.SimpleNamespace(containers=types.SimpleNamespace(list=lambda **kw: [container]))
        (found,) = DockerContainers(client, images=None).rows()  # type: ignore[arg-type]
        return found

    hers = row(alice, ["GPU-2"])
    assert (hers.user, hers.smoke, hers.deadline, hers.notify) == ("alice", True, None, False)
    held = held_on_host([hers], [], [])
    assert {uuid: [c.user for c in claims] for uuid, claims in held.gpus.items()} == {"GPU-2": ["alice"]}
    from imgbuild.gpu.allocate import Selection

    check_quota("bob", Selection([]), held, run_rules({"max_gpus_per_user": 1}))  # bob holds nothing
    assert row(None, None).user == "" and not held_on_host([row(None, None)], [], []).gpus  # nobody's, no GPU


def test_container_user_is_the_callers_ids_only_when_acting_for_them(monkeypatch):
    import types

    settings = types.SimpleNamespace(caller=Caller("alice", 1001, 1002, via_sudo=True), run=run_rules({}))
    monkeypatch.setattr(Caller, "is_admin", property(lambda self: False))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    given = acting.container_user(settings)  # type: ignore[arg-type]
    assert given is not None and (given.ids, given.name, given.pids_limit) == ("1001:1002", "alice", 4096)
    monkeypatch.setattr(os, "geteuid", lambda: 1001)  # the user's own engine (the docker group): no sudo
    assert acting.container_user(settings) is None  # type: ignore[arg-type]
    assert acting.container_user(None) is None


def test_every_users_run_starts_from_a_runspec_which_names_their_ids():
    """`imgbuild run`'s starts pass the RunSpec's options (user UID:GID from the caller, hardened under sudo):
    no other call of the engine's `containers.run` exists."""
    import ast

    sites = [(f, fn, n) for f, fn, n in _calls_of("run") if f.startswith("imgbuild/servers/")]
    runs = [(f, fn, ast.unparse(n)) for f, fn, n in sites if "containers.run(" in ast.unparse(n)]  # type: ignore[arg-type]
    assert runs and all(text.endswith("containers.run(spec.options())") for _, _, text in runs), runs


_FORK_100 = (
    "import subprocess\nstarted = []\n"
    "for _ in range(100):\n"
    "    try:\n        started.append(subprocess.Popen(['sleep', '20']))\n"
    "    except OSError:\n        break\n"
    "print('STARTED', len(started), flush=True)\n"
    "for p in started:\n    p.kill()\n"
)


#: An entrypoint hook (NGC's entrypoint runs every /opt/nvidia/entrypoint.d/*.sh) that ends any container of the
#: image started as root, with capabilities or without no-new-privileges: a run, a script container, a notebook.
_PRIVILEGED_HOOK = (
    'if [ "$(id -u)" = 0 ] || grep -q "^NoNewPrivs:[[:space:]]*0" /proc/self/status '
    '|| ! grep -q "^CapEff:[[:space:]]*0000000000000000" /proc/self/status; then echo E5-PRIVILEGED; exit 42; fi\n'
)
#: A stand-in `jupyter` that serves HTTP on 8888 (what `run --jupyter` waits for), whatever it is asked.
_SERVING_JUPYTER = (
    "#!/usr/bin/env python3\nimport http.server\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    '        self.send_response(200); self.end_headers(); self.wfile.write(b\'{"version": "2.14.0"}\')\n'
    "http.server.HTTPServer(('0.0.0.0', 8888), H).serve_forever()\n"
)


def _hostile_image(docker_client, base: str, tags: list[str]) -> None:
    """One image for every attempt that needs one: the hook above, a serving `jupyter`, device nodes (/dev/mem's
    1:1, a loop device's 7:0) and imgbuild's own labels claiming another user, a smoke test, a deadline passed."""
    import base64
    import io

    from imgbuild.facts import Label

    hook, jupyter = (base64.b64encode(text.encode()).decode() for text in (_PRIVILEGED_HOOK, _SERVING_JUPYTER))
    dockerfile = (
        f"FROM {base}\nRUN mkdir -p /opt/nvidia/entrypoint.d && echo {hook} | base64 -d > "
        f"/opt/nvidia/entrypoint.d/99-e5.sh && echo {jupyter} | base64 -d > /usr/local/bin/jupyter && "
        "chmod 755 /usr/local/bin/jupyter && mknod -m 0666 /opt/e5mem c 1 1 && mknod -m 0666 /opt/e5loop b 7 0\n"
    )
    labels = {Label.USER: "imgbt-bob", Label.STARTED_BY: "1:1", Label.DEADLINE: "1", Label.SMOKE_OF: "x"}
    image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tags[0], labels=labels, rm=True)
    for tag in tags[1:]:
        image.tag(tag)


def _refused(done: subprocess.CompletedProcess) -> bool:
    """imgbuild's refusal: exit 2 or 3, its one line last (after any progress line), no traceback."""
    said = done.stderr.strip().splitlines()
    return (
        done.returncode in (2, 3)
        and "Traceback" not in done.stderr
        and [line for line in said if line.startswith("imgbuild: ")] == said[-1:]
    )


def _sudo_refused(done: subprocess.CompletedProcess) -> bool:
    return done.returncode == 1 and "sudo" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.root("installs a sudoers drop-in and a site config, acts as other users")
@pytest.mark.alone
@pytest.mark.engine
def test_two_hostile_users_through_sudo_are_refused_every_attempt(enforced, unique, docker_client):
    """Two real users (imgbt-alice attacking, imgbt-bob the victim) through Debian's sudo on the real engine, with
    the bind mounts the daemon sees: sudo's own options, run's flags in every spelling, hand-written queue files,
    containers that trap root's exec, waiters that would hold the queues, a user's image run or read by root, a
    token to steal, the state folder to take first. Each attempt is one row; every row must be refused (or,
    where the attempt is a run, be harmless: proven by what the container saw)."""
    import concurrent.futures
    import re
    import socket
    import threading
    import time

    from imgbuild.config.site import reap_policy, run_rules
    from imgbuild.engine import Engine
    from imgbuild.engine.containers import EXEC_SECONDS
    from imgbuild.servers.reap import reap
    from tests.conftest import run_cli

    state, base = enforced["state"], enforced["image"]
    alice, bob = (pwd.getpwnam(u) for u in USERS)
    ahome, bhome = Path(alice.pw_dir), Path(bob.pw_dir)
    root = {"IMGBUILD_SITE_CONFIG": "/etc/imgbuild/config.yaml"}
    site = Path("/etc/imgbuild/config.yaml")
    site.write_text(site.read_text() + "  pids_limit: 40\n")
    img, bobs_img = f"imgbt-alice/e5{unique}:1", f"imgbt-bob/e5{unique}:1"
    outcomes: list[tuple[str, bool, str]] = []
    began_all = time.monotonic()

    def row(why: str, refused: bool, said: str | subprocess.CompletedProcess) -> None:
        text = said if isinstance(said, str) else f"exit {said.returncode}: {(said.stderr or said.stdout)[-300:]}"
        outcomes.append((f"[{time.monotonic() - began_all:5.1f}s] {why}", refused, text.strip()))

    # her files and bob's: a data folder, a project she runs from, a socket, a FIFO; his private project
    data, project = ahome / f"d-{unique}", ahome / f"p-{unique}"
    for folder in (data, project):
        folder.mkdir()
    (data / "train.txt").write_text("hers\n")
    os.mkfifo(ahome / f"fifo-{unique}")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(ahome / f"sock-{unique}"))
    listener.listen(4)
    listener.settimeout(0.1)
    for made in (data, project, ahome / f"fifo-{unique}", ahome / f"sock-{unique}"):
        _give(made, "imgbt-alice")
    link, hard = ahome / f"to-root-{unique}", ahome / f"shadow-{unique}"
    link.symlink_to("/root")
    os.link("/etc/shadow", hard)  # made for her: protected_hardlinks stops her making it herself
    private = bhome / f"private-{unique}"
    (private / "proj").mkdir(parents=True)
    (private / "proj" / "notes.txt").write_text("bob's notes\n")
    _give(private, "imgbt-bob")
    private.chmod(0o700)
    os.chmod(bhome, 0o755)
    fresh_state = Path(f"/var/lib/imgbt-e5-{unique}")
    _hostile_image(docker_client, base, [img, bobs_img])
    row("(the image built)", True, "")
    try:
        # -- refused before anything starts: sudo's options, and run's flags in every spelling
        v = f"{data}:"
        simple: list[tuple[str, tuple[str, ...], tuple[str, ...], dict[str, str], object]] = [
            (f"sudo {flag}", ("ps",), opts, {}, _sudo_refused)
            for flag, opts in [("-D /", ("-D", "/")), ("-R /", ("-R", "/")), ("-C 9", ("-C", "9")),
                               ("-g docker", ("-g", "docker")), ("-u imgbt-bob", ("-u", "imgbt-bob")), ("-E", ("-E",)),
                               ("-i", ("-i",)), ("-s", ("-s",))]
        ] + [
            ("sudo DOCKER_HOST=", ("ps",), (f"DOCKER_HOST=unix://{ahome}/sock-{unique}",), {}, _sudo_refused),
            ("sudo DOCKER_CONTEXT=", ("ps",), ("DOCKER_CONTEXT=e5bar",), {}, _sudo_refused),
        ] + [
            (why, ("run", *args), (), {}, _refused)
            for why, args in [
                ("-- --user=0:0 IMG id", ("--no-workspace", "--", "--user=0:0", img, "id")),
                ("--shm-size=--privileged", ("--no-workspace", "--shm-size=--privileged", img, "--", "true")),
                ("--shm-size '1g --privileged'", ("--no-workspace", "--shm-size", "1g --privileged", img, "--", "true")),
                ("-eLD_PRELOAD=", ("--no-workspace", "-eLD_PRELOAD=/tmp/e5.so", img, "--", "true")),
                ("--env=LD_AUDIT=", ("--no-workspace", "--env=LD_AUDIT=/tmp/e5.so", img, "--", "true")),
                ("--env=LD_PRELOAD (bare)", ("--no-workspace", "--env=LD_PRELOAD", img, "--", "true")),
                ("-e with LF", ("--no-workspace", "-e", "A=1\nLD_PRELOAD=/tmp/e5.so", img, "--", "true")),
                ("-e with CR", ("--no-workspace", "-e", "A=1\rLD_PRELOAD=/tmp/e5.so", img, "--", "true")),
                ("-e fullwidth L", ("--no-workspace", "-eＬD_PRELOAD=/tmp/e5.so", img, "--", "true")),
                ("-eDOCKER_CONTEXT=", ("--no-workspace", "-eDOCKER_CONTEXT=e5bar", img, "--", "true")),
                ("-e CUDA_VISIBLE_DEVICES=", ("--no-workspace", "-e", "CUDA_VISIBLE_DEVICES=0,1", img, "--", "true")),
                ("--volume=~/d:/dev/../dev/shm", ("--no-workspace", f"--volume={v}/dev/../dev/shm", img, "--", "true")),
                ("-v ~/d:/./proc/1", ("--no-workspace", "-v", f"{v}/./proc/1", img, "--", "true")),
                ("-v through bob's home by ..", ("--no-workspace", "-v", f"{data}/../../imgbt-bob/private-{unique}/proj:/b",
                                                 img, "--", "true")),
                ("-v bob's private folder", ("--no-workspace", "-v", f"{private}/proj:/b:ro", img, "--", "true")),
                ("-v a socket", ("--no-workspace", "-v", f"{ahome}/sock-{unique}:/s", img, "--", "true")),
                ("-v a FIFO", ("--no-workspace", "-v", f"{ahome}/fifo-{unique}:/f", img, "--", "true")),
                ("-v the engine's socket", ("--no-workspace", "-v", "/var/run/docker.sock:/s", img, "--", "true")),
                ("-v :rw,z", ("--no-workspace", "-v", f"{v}/x:rw,z", img, "--", "true")),
                ("-v :ro:rw", ("--no-workspace", "-v", f"{v}/x:ro:rw", img, "--", "true")),
                ("--user bob's ids", ("--no-workspace", "--user", f"{bob.pw_uid}:{bob.pw_gid}", img, "--", "id")),
                ("--user 0:0", ("--no-workspace", "--user", "0:0", img, "--", "id")),
                ("--force: another's GPU", ("--no-workspace", "--force", "--gpus", "1", img, "--", "true")),
                ("-e NVIDIA_VISIBLE_DEVICES=all", ("--no-workspace", "-e", "NVIDIA_VISIBLE_DEVICES=all", img, "--", "true")),
                ("-p a privileged port", ("--no-workspace", "-p", "127.0.0.1:80:80", img, "--", "true")),
                ("-p every interface", ("--no-workspace", "-p", "0.0.0.0:18888:8888", img, "--", "true")),
                ("-v the host's /etc", ("--no-workspace", "-v", "/etc:/host", img, "--", "true")),
                ("-v root's home", ("--no-workspace", "-v", "/root:/r", img, "--", "true")),
                ("-v a link in her home to /root", ("--no-workspace", "-v", f"{link}:/r", img, "--", "true")),
                ("-v a hard link to /etc/shadow", ("--no-workspace", "-v", f"{hard}:/s", img, "--", "true")),
                ("-v a named volume", ("--no-workspace", "-v", "bobs-data:/data", img, "--", "true")),
                ("-v a folder that does not exist", ("--no-workspace", "-v", f"{ahome}/nope-{unique}:/x", img, "--", "true")),
                ("-v into the container's /proc", ("--no-workspace", "-v", f"{v}/proc/x", img, "--", "true")),
                ("an image from elsewhere", ("--no-workspace", "docker.io/library/alpine:3", "--", "true")),
                ("bob's namespace", ("--no-workspace", f"imgbt-bob/secret-{unique}:1", "--", "true")),
                ("a recipe only root can read", ("--no-workspace", "/root/secret.yaml")),
                ("run ｅ5bar/x:1 (fullwidth)", ("--no-workspace", "ｅ5bar/x:1", "--", "true")),
                ("--gpus ２ (fullwidth)", ("--no-workspace", "--gpus", "２", img, "--", "true")),
                ("-p 127.0.0.１ (fullwidth)", ("--no-workspace", "-p", "127.0.0.１:18080:80", img, "--", "true")),
                ("-p a port past 65535", ("--no-workspace", "-p", "127.0.0.1:99999:80", img, "--", "true")),
                ("--gpus 2 --wait past the quota", ("--no-workspace", "--gpus", "2", "--wait", "10m", img, "--", "true")),
                ("--gpus 99999999999999999999", ("--no-workspace", "--gpus", "9" * 20, img, "--", "true")),
                ("--time 99999999999999999999d", ("--no-workspace", "--time", "9" * 20 + "d", img, "--", "true")),
                ("--shm-size 99999999999999999t", ("--no-workspace", "--shm-size", "9" * 17 + "t", img, "--", "true")),
                ("--name ../x", ("--no-workspace", "--name", "../x", img, "--", "true")),
            ]
            + [(f"--gpus {g!r} past the quota", ("--no-workspace", "--gpus", g, img, "--", "true"))
               for g in ("all", "device=0,1", "0,1", '"device=0,1"', "0,0,1", " 2", "00,1")]
        ] + [
            (why, args, (), {}, _refused)
            for why, args in [
                ("queue add --wait=40s", ("queue", "add", "--no-workspace", "--wait=40s", img, "--", "true")),
                ("queue add --wait 40s", ("queue", "add", "--no-workspace", "--wait", "40s", img, "--", "true")),
            ]
        ] + [
            (why, args, sudo_args, {}, _sudo_refused)
            for why, args, sudo_args in [
                ("rebuild (CI's, with its registry login)", ("rebuild",), ()),
                ("the reaper", ("reap",), ()),
                ("a global flag before the command", ("--user", "imgbt-bob", "run", img), ()),
                ("her own site config by variable", ("run", img), ("IMGBUILD_SITE_CONFIG=/tmp/evil.yaml",)),
            ]
        ] + [
            (why, ("run", *args), (), {}, _refused)
            for why, args in [
                ("a 100 KB -e", ("--no-workspace", "-e", "A=" + "x" * 100_000, img, "--", "true")),
                ("a 5,000-character -v", ("--no-workspace", "-v", "/" + "a" * 5000 + ":/x", img, "--", "true")),
                ("a 300-character --name", ("--no-workspace", "--name", "n" * 300, img, "--", "true")),
                ("a 400-character image", ("--no-workspace", "i" * 400 + ":1", "--", "true")),
            ]
        ]  # fmt: skip

        def attempt(entry):  # type: ignore[no-untyped-def]
            why, args, sudo_args, environ, judge = entry
            done = as_user("imgbt-alice", *args, sudo_args=sudo_args, environ=environ, timeout=120)
            return why, judge(done), done

        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
            for why, refused, done in pool.map(attempt, simple):
                row(why, refused, done)

        # -- her environment's DOCKER_HOST and DOCKER_CONTEXT, through sudo: stripped, her socket never asked
        seen = as_user("imgbt-alice", "ps", environ={"DOCKER_HOST": f"unix://{ahome}/sock-{unique}",
                                                     "DOCKER_CONTEXT": "e5bar"})  # fmt: skip
        try:
            listener.accept()
            asked = True
        except TimeoutError:
            asked = False
        row("DOCKER_HOST and DOCKER_CONTEXT in her environment", seen.returncode == 0 and not asked, seen)

        # -- a container that traps root's exec (her own `timeout` and `sh` first on its PATH, both sleeping)
        trap = f"imgbt-alice_trap{unique}_1"
        trapped = as_user(
            "imgbt-alice", "run", "-d", "--no-workspace", "--gpus", "1", "--time", "1m", "--name", f"trap{unique}",
            "-e", "PATH=/tmp/e5b:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", img, "--", "/bin/sh",
            "-c", "mkdir -p /tmp/e5b && printf '#!/bin/sh\\nexec sleep 300\\n' > /tmp/e5b/timeout && "
            "cp /tmp/e5b/timeout /tmp/e5b/sh && chmod 755 /tmp/e5b/* && exec sleep 600",
        )  # fmt: skip
        assert trapped.returncode == 0, trapped.stderr
        began = time.monotonic()
        listed = as_user("imgbt-bob", "ps", timeout=60)
        row("her trap container vs bob's ps", listed.returncode == 0 and time.monotonic() - began < 20, listed)
        engine = Engine.connect(None)
        every = engine.containers.rows
        engine.containers.rows = lambda: [r for r in every() if r.name == trap]  # type: ignore[method-assign]
        began = time.monotonic()
        reap(engine, [], run_rules({"state_dir": str(state)}), reap_policy({}), time.time(), notify=lambda u, t: True)
        took = time.monotonic() - began
        row("her trap container vs root's reap (a warning due)", took < EXEC_SECONDS + 20, f"reap took {took:.1f} s")
        for why, args in [("exec own -- -u 0 id", ["-u", "0", "id"]), ("exec own -- --user=0 id", ["--user=0", "id"]),
                          ("exec own -- --privileged id", ["--privileged", "id"]),
                          ("exec own -- -e LD_PRELOAD= env", ["-e", "LD_PRELOAD=/tmp/e5.so", "env"])]:  # fmt: skip
            done = as_user("imgbt-alice", "exec", f"trap{unique}_1", "--", *args, timeout=60)
            harmless = (
                "uid=0" not in done.stdout and "LD_PRELOAD=/tmp" not in done.stdout and "Traceback" not in done.stderr
            )
            row(why, harmless, done)

        # -- run from her project (the workspace and a data folder: bind mounts the daemon sees) with a VT inside a
        # value, look-alike variables, device nodes and imgbuild's labels in her image, 100 processes to fork
        bobs_shm, her_shm = Path(f"/dev/shm/imgbt-bob-{unique}"), Path(f"/dev/shm/e5-{unique}")
        bobs_shm.write_text("bob's dataloader segment\n")
        os.chown(bobs_shm, bob.pw_uid, bob.pw_gid)  # 0644: what a careless umask leaves in the host's /dev/shm
        probe = ("env; echo LDP=[$LD_PRELOAD]; echo uid=$(id -u); cat /data/train.txt /shared/README; grep -E '^(NoNewPrivs|CapEff)' /proc/self/status; "
                 "head -c 16 /opt/e5mem >/dev/null 2>&1 && echo READ-MEM; head -c 1 /opt/e5loop >/dev/null 2>&1 "
                 f"&& echo READ-LOOP; cat {bobs_shm} 2>/dev/null | grep -q dataloader && echo READ-BOB-SHM; "
                 f"echo hers > {her_shm}; touch /workspace/made; python3 -c {_shell_word(_FORK_100)}")  # fmt: skip
        outside = as_user("imgbt-alice", "run", img, "--", "true", cwd="/tmp")  # the workspace is a mount too
        row("the current folder as /workspace, outside what she may mount", _refused(outside)
            and "the current folder as /workspace" in outside.stderr and "--no-workspace" in outside.stderr, outside)  # fmt: skip
        ran = as_user("imgbt-alice", "run", "--keep", "--name", f"c1{unique}", "-v", f"{data}:/data:ro",
                      "-v", f"{enforced['shared']}:/shared:ro",
                      "-e", "A=1\vLD_PRELOAD=/tmp/e5.so", "-enVIDIA_VISIBLE_DEVICES=all",
                      img, "--", "sh", "-c", probe, cwd=str(project), timeout=180)  # fmt: skip
        assert ran.returncode == 0 and "hers\nshared data\n" in ran.stdout, ran.stdout[-2000:] + ran.stderr
        lines = ran.stdout.split("\n")  # never splitlines(): a VT inside A's value is no line break to env
        row("-e with VT: LD_PRELOAD inside A's value", "LDP=[]" in lines and "A=1\vLD_PRELOAD=/tmp/e5.so" in lines, ran)
        row("-enVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all" not in lines, ran)
        row("a run of her image: as her, no new privileges, no capabilities", f"uid={alice.pw_uid}" in lines and "NoNewPrivs:\t1" in lines
            and "CapEff:\t0000000000000000" in lines, ran)  # fmt: skip
        row("bob's file in the host's /dev/shm, from her run", "READ-BOB-SHM" not in lines, ran)
        row("her run's /dev/shm file left in the host's", not her_shm.exists(), f"host has it: {her_shm.exists()}")
        row("/dev/mem's node in her image", "READ-MEM" not in lines, ran)
        row("a loop device's node in her image", "READ-LOOP" not in lines, ran)
        started = int(ran.stdout.split("STARTED", 1)[1].split()[0])
        row("100 processes in a run (pids_limit 40)", started < 40, f"{started} started")
        made = (project / "made").stat()
        row("what a run writes into her workspace", (made.st_uid, made.st_gid) == (alice.pw_uid, alice.pw_gid),
            f"owned {made.st_uid}:{made.st_gid}")  # fmt: skip
        kept = docker_client.containers.get(f"imgbt-alice_c1{unique}_1").attrs["Config"]["Labels"]
        row("her image's labels: bob's, a smoke test's, a deadline passed", kept.get("org.imgbuild.user") ==
            "imgbt-alice" and not kept.get("org.imgbuild.smoke-of") and not kept.get("org.imgbuild.started-by")
            and kept.get("org.imgbuild.deadline") != "1", json.dumps(kept))  # fmt: skip
        for why, args in [
            ("run IMG -- --privileged", ["--no-workspace", img, "--", "--privileged"]),
            ("--entrypoint=--privileged", ["--no-workspace", "--entrypoint=--privileged", img]),
        ]:
            done = as_user("imgbt-alice", "run", *args, timeout=120)
            row(why, done.returncode != 0 and "Traceback" not in done.stderr, done)

        # -- root's script containers of her image: the jupyter check, a base's pins (the hook ends a privileged one)
        scripts_from = int(time.time())
        notebook = as_user(
            "imgbt-alice", "run", "--no-workspace", "--jupyter", "--name", f"jn{unique}", img, timeout=180
        )
        row("run --jupyter on her image (the jupyter check as root)", notebook.returncode == 0
            and "http://127.0.0.1:" in notebook.stdout + notebook.stderr, notebook)  # fmt: skip
        (project / "pins.yaml").write_text(f'name: e5pins\ntag: "1"\nbase: {{image: "{img}"}}\npip: [wheel==0.30.0]\n')
        (project / ".git").mkdir()
        _give(project, "imgbt-alice")
        pins = as_user("imgbt-alice", "build", "pins.yaml", cwd=str(project), timeout=300)
        row("build on her image (the base's pins read as root)", pins.returncode == 2
            and "pinned by a freeze of the base's packages" in pins.stderr, pins)  # fmt: skip
        created = docker_client.events(since=scripts_from, until=int(time.time()) + 1, decode=True,
                                       filters={"type": "container", "event": "create"})  # fmt: skip
        scripts = [
            a for a in (e["Actor"]["Attributes"] for e in created) if a.get("org.imgbuild.smoke-of", "").startswith(img)
        ]  # of her image (the engine is shared)
        row("her image's labels (bob's, a deadline passed) on root's script containers of it", len(scripts) >= 1
            and all(a.get("org.imgbuild.user") == "imgbt-alice" and not a.get("org.imgbuild.deadline")
                    for a in scripts), json.dumps(scripts)[:400])  # fmt: skip
        for why, target in [
            ("extends: a file in bob's private folder", f"{private}/proj/notes.txt"),
            ("extends: /etc/shadow", "/etc/shadow"),
        ]:
            (project / "ext.yaml").write_text(f"extends: {target}\nname: ext\n")
            _give(project, "imgbt-alice")
            done = as_user("imgbt-alice", "build", "ext.yaml", cwd=str(project))
            row(why, done.returncode != 0 and "bob's notes" not in done.stdout + done.stderr
                and "root:" not in done.stdout + done.stderr, done)  # fmt: skip

        # -- bob's notebook: its token is nowhere she can read; his container is not hers to reach
        his = as_user("imgbt-bob", "run", "--no-workspace", "--jupyter", "--name", f"jb{unique}", bobs_img, timeout=180)
        assert his.returncode == 0, his.stderr
        token = re.search(r"token=([0-9a-f]{16,})", his.stdout + his.stderr).group(1)
        hunt = _as_plain("imgbt-alice", "cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; "
                         f"cat $(find {state} -type f 2>/dev/null) 2>/dev/null")  # fmt: skip
        reads = [hunt.stdout] + [as_user("imgbt-alice", *a).stdout for a in (["ps", "--all", "--json"],
                                                                            ["queue", "ls", "--json"])]  # fmt: skip
        row("bob's Jupyter token", not any(token in text for text in reads), f"{len(hunt.stdout)} bytes read")
        notebook_name = f"imgbt-bob_jb{unique}_1"
        for why, args in [("logs of bob's notebook", ["logs", notebook_name]),
                          ("exec in bob's notebook", ["exec", notebook_name, "--", "env"]),
                          ("stop bob's notebook", ["stop", notebook_name]),
                          ("stop --force bob's notebook", ["stop", "--force", notebook_name]),
                          ("attach to bob's notebook", ["attach", notebook_name]),
                          ("extend bob's notebook", ["extend", notebook_name, "1d"])]:  # fmt: skip
            done = as_user("imgbt-alice", *args)
            row(why, _refused(done) and token not in done.stdout + done.stderr, done)

        # -- containers an admin started by hand, named hers (root inside, Docker's capabilities): not hers to enter
        by_hand = []
        for name in (f"imgbt-alice_debug{unique}", "imgbt-alice"):
            with contextlib.suppress(Exception):
                docker_client.containers.get(name).remove(force=True)
            by_hand.append(docker_client.containers.run(base, ["sleep", "120"], name=name, entrypoint=[], detach=True))
        try:
            for why, args in [("exec into a container an admin named hers", ["exec", f"debug{unique}", "--", "id"]),
                              ("shell in a container an admin named hers", ["shell", f"debug{unique}"]),
                              ("attach to a container an admin named hers", ["attach", f"debug{unique}"]),
                              ("exec into a container named just her user", ["exec", "imgbt-alice", "--", "id"])]:  # fmt: skip
                done = as_user("imgbt-alice", *args, timeout=60)
                row(why, _refused(done) and "uid=0" not in done.stdout, done)
        finally:
            for made in by_hand:
                with contextlib.suppress(Exception):
                    made.remove(force=True)
        began = time.monotonic()
        as_user("imgbt-bob", "ps", timeout=120)
        plain = time.monotonic() - began
        junk = f"cd {state} && seq -f 'ledger-%010g.json' 1 30000 | xargs touch"
        planted_junk = _as_plain("imgbt-alice", junk)
        began = time.monotonic()
        crowded = as_user("imgbt-bob", "ps", timeout=300)
        took = time.monotonic() - began
        for name in os.listdir(state):
            if name.startswith("ledger-") and len(name) == len("ledger-0000000001.json"):
                (state / name).unlink()
        row("30,000 ledger names of hers in the state folder vs bob's ps", planted_junk.returncode == 0
            and crowded.returncode == 0 and took < plain + 3, f"ps {plain:.1f} s, then {took:.1f} s")  # fmt: skip

        # -- her own queue file: a job in bob's private folder, two filed at time 0, one of absurd numbers; root's
        # queue runs it while bob files his first job, a folder planted at his queue file's name before
        hers = state / f"queue-{alice.pw_uid}.json"
        jobs = [
            {
                "id": "0badcafe",
                "user": "imgbt-alice",
                "uid": alice.pw_uid,
                "gid": alice.pw_gid,
                "submitted": 0,
                "cwd": str(private / "proj"),
                "args": ["--no-workspace", img, "--", "true"],
            }
        ]
        jobs += [{**jobs[0], "id": f"0000000{n}", "cwd": str(ahome)} for n in (1, 2)]
        absurd = {**jobs[0], "id": "0e5e5e5e", "uid": 10**40, "gid": -1, "submitted": 1e308, "cwd": str(ahome)}
        wrote = _as_plain("imgbt-alice", f"umask 077; cat > {hers}", json.dumps({"jobs": [*jobs, absurd]}))
        assert wrote.returncode == 0, wrote.stderr
        planted = _as_plain("imgbt-alice", f"mkdir {state}/queue-{bob.pw_uid}.json")
        said: list[str] = []
        runner = threading.Thread(target=lambda: said.append(run_cli("queue", "run", env=root).err))
        runner.start()
        time.sleep(1)
        began = time.monotonic()
        first = as_user("imgbt-bob", "queue", "add", "--no-workspace", "--name", f"qb{unique}", bobs_img, "--", "true")
        took = time.monotonic() - began
        row("a folder at bob's queue file's name", first.returncode == 0 or planted.returncode != 0, first)
        row("her jobs filed at time 0 while root's queue runs them: bob not held", first.returncode == 0 and took < 20,
            f"bob's queue add took {took:.1f} s")  # fmt: skip
        runner.join(timeout=300)
        tried = {j["id"]: j for j in json.loads(hers.read_text())["jobs"]}
        row("her queue file: a job whose folder is in bob's private one", tried["0badcafe"]["state"] == "failed"
            and "checked as imgbt-alice" in tried["0badcafe"]["detail"], json.dumps(tried["0badcafe"]))  # fmt: skip
        row("her queue file: absurd numbers", "0e5e5e5e" not in tried and "Traceback" not in "".join(said),
            "".join(said)[-300:])  # fmt: skip
        assert _as_plain("imgbt-alice", f"rm -f {hers}").returncode == 0
        bobs_job = first.stdout.strip()
        taken = as_user("imgbt-alice", "queue", "rm", bobs_job)
        row("queue rm of bob's job", _refused(taken), taken)

        # -- drained, she files a job from ~/q and swaps the folder for a link to /root; resumed, root runs it
        assert run_cli("queue", "drain", env=root).code == 0
        q = ahome / f"q-{unique}"
        q.mkdir()
        _give(q, "imgbt-alice")
        filed = as_user("imgbt-alice", "queue", "add", "--name", f"qa{unique}", img, "--", "true", cwd=str(q))
        assert filed.returncode == 0, filed.stderr
        job_id = filed.stdout.strip()
        q.rename(ahome / f"q-{unique}.old")
        q.symlink_to("/root")
        assert run_cli("queue", "resume", env=root).code == 0
        run_cli("queue", "run", env=root)
        listed = {j["id"]: j for j in json.loads(as_user("imgbt-alice", "queue", "ls", "--json").stdout)}
        swapped = listed.get(job_id, {})
        row("a queued job's folder swapped for a link to /root", swapped.get("state") == "failed"
            and "imgbt-alice" in swapped.get("detail", ""), json.dumps(swapped))  # fmt: skip

        # -- a bob's GPU run while her over-quota waiter was refused: he is not held
        gpu = as_user("imgbt-bob", "run", "--dry-run", "--no-workspace", "--gpus", "1", bobs_img, "--", "true")
        row("bob's GPU run after her --gpus 2 --wait", gpu.returncode == 0, gpu)

        # -- the state folder, not made yet in its place (a root-only parent): she cannot make it first
        site.write_text(site.read_text().replace(f"state_dir: {state}", f"state_dir: {fresh_state}"))
        first_maker = _as_plain("imgbt-alice", f"mkdir -m 1777 {fresh_state}")
        went = as_user("imgbt-bob", "run", "--no-workspace", "--name", f"r7{unique}", bobs_img, "--", "true")
        row("the state folder made first by her", first_maker.returncode != 0 and went.returncode == 0
            and fresh_state.stat().st_uid == 0, went)  # fmt: skip
    finally:
        listener.close()
        for shm in Path("/dev/shm").glob(f"*{unique}"):
            shm.unlink(missing_ok=True)
        for tag in (img, bobs_img):
            with contextlib.suppress(Exception):
                docker_client.images.remove(tag, force=True)
        for path in (data, project, private, fresh_state, ahome / f"q-{unique}.old"):
            shutil.rmtree(path, ignore_errors=True)
        for path in (ahome / f"fifo-{unique}", ahome / f"sock-{unique}", ahome / f"q-{unique}", link, hard):
            with contextlib.suppress(OSError):
                path.unlink()
    for why, refused, said in outcomes:
        print(f"{'refused' if refused else 'NOT REFUSED'}: {why}: {said[:200]}")
    assert not list(enforce.STAGING.glob("*/*")), "staging binds are undone after the start"
    audit = [json.loads(line) for line in (state / ".reap" / "audit.log").read_text().splitlines()]
    decisions = [a["decision"] for a in audit if a["user"] == "imgbt-alice"]
    assert sum(d.startswith(("exit 2", "exit 3")) for d in decisions) >= 50 and any(
        d.startswith("allowed: ") for d in decisions
    )
    assert oct((state / ".reap").stat().st_mode & 0o777) == "0o700"  # no user can write or read it
    assert len(outcomes) >= 100, len(outcomes)
    assert [why for why, refused, _ in outcomes if not refused] == []


def _shell_word(text: str) -> str:
    import shlex

    return shlex.quote(text)


def test_a_users_run_through_sudo_never_shares_the_hosts_ipc_namespace():
    """With the site's `ipc: host` (NVIDIA's advice), a run acting for a user gets its own IPC namespace and a
    /dev/shm as large as its memory cap: the host's /dev/shm holds other users' files, and what a run leaves
    there outlives it. Root's own run keeps the house's IPC, and a site's or a user's shm size stands."""
    from imgbuild.servers.spec import RunSpec
    from tests.conftest import run_words

    def words(enforced: bool, **rules: object) -> list[str]:
        spec = RunSpec("img:1", "x", "alice", 1001, 1001, house=run_rules(rules), memory=2 << 30, workspace=False,
                       enforced=[] if enforced else None)  # fmt: skip
        return run_words(spec)

    hers = words(True)
    assert hers[hers.index("--ipc") + 1] == "private" and hers[hers.index("--shm-size") + 1] == f"{2 << 30}b"
    root = words(False)
    assert root[root.index("--ipc") + 1] == "host" and "--shm-size" not in root
    sized = words(True, shm_size="8g")
    assert sized[sized.index("--shm-size") + 1] == "8g" and "--ipc" not in sized


def test_an_unlabelled_container_is_a_users_only_by_the_user_underscore_prefix():
    """An admin's `docker run --name ubuntu` (root inside, Docker's capabilities) is nobody's, not the host user
    `ubuntu`'s to `exec` into; `bob_debug` is bob's (the server convention), and a label has the last word."""
    import types

    from imgbuild.engine.containers import DockerContainers
    from imgbuild.facts import Label
    from imgbuild.servers.containers import check_owner, find_container

    def rows(*named: tuple[str, dict[str, str]]):  # type: ignore[no-untyped-def]
        made = [types.SimpleNamespace(name=name, short_id=name[:4], status="running",
                                      attrs={"Config": {"Labels": labels}, "HostConfig": {}}) for name, labels in named]  # fmt: skip
        client = types.SimpleNamespace(containers=types.SimpleNamespace(list=lambda **kw: made))
        return DockerContainers(client, images=None).rows()  # type: ignore[arg-type]

    found = {r.name: r.user for r in rows(("ubuntu", {}), ("bob_debug", {}), ("x_y", {Label.USER: "carol"}))}
    assert found == {"ubuntu": "", "bob_debug": "bob", "x_y": "carol"}
    ubuntu = Caller("ubuntu", 1000, 1000, via_sudo=True)
    with pytest.raises(UsageError, match="belongs to nobody known"):
        check_owner(find_container(rows(("ubuntu", {})), "ubuntu", "ubuntu"), ubuntu, "exec", force=False)


def test_through_sudo_a_user_enters_only_a_container_running_as_them_without_privileges(monkeypatch):
    """`alice_debug`, started by an admin with `docker run` (root inside, Docker's capabilities, setuid binaries
    that work), is alice's by its name: she may read its logs or stop it, never `exec`, `shell` or `attach` into
    it through sudo. Her own run (her UID, no capabilities, no new privileges) she enters as before; her smoke
    test's container, whose output imgbuild believes, takes no verb of hers at all."""
    import dataclasses
    import types

    from imgbuild.engine.containers import DockerContainers
    from imgbuild.servers.containers import check_owner

    hers = {"Config": {"User": "1001:1001"}, "HostConfig": {"CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges"]}}
    admins = {"Config": {"User": ""}, "HostConfig": {}}
    nearly = {"Config": {"User": "1001:1001"}, "HostConfig": {"CapDrop": ["ALL"], "CapAdd": ["CAP_SYS_ADMIN"],
                                                               "SecurityOpt": ["no-new-privileges"]}}  # fmt: skip
    made = [types.SimpleNamespace(name=n, short_id=n[:4], status="running", attrs=a)
            for n, a in (("alice_job_1", hers), ("alice_debug", admins), ("alice_x_1", nearly))]  # fmt: skip
    client = types.SimpleNamespace(containers=types.SimpleNamespace(list=lambda **kw: made))
    rows = {r.name: r for r in DockerContainers(client, images=None).rows()}  # type: ignore[arg-type]
    alice = Caller("alice", 1001, 1001, via_sudo=True)
    monkeypatch.setattr(Caller, "is_admin", property(lambda self: False))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for verb in ("exec", "attach", "logs", "stop"):
        check_owner(rows["alice_job_1"], alice, verb, force=False)
    for name in ("alice_debug", "alice_x_1"):
        for verb in ("exec", "attach"):
            with pytest.raises(UsageError, match="does not run as you"):
                check_owner(rows[name], alice, verb, force=False)
        check_owner(rows[name], alice, "logs", force=False)
    smoke = dataclasses.replace(rows["alice_job_1"], smoke=True)  # her smoke test's, hers for GPUs and quota
    for verb in ("exec", "attach", "logs", "stop"):  # its output is the answer imgbuild believes
        with pytest.raises(UsageError, match="runs for a check"):
            check_owner(smoke, alice, verb, force=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1001)  # her own engine (the docker group): hers to enter
    check_owner(rows["alice_debug"], Caller("alice", 1001, 1001), "exec", force=False)


def test_through_sudo_a_users_cached_answers_are_never_another_users(tmp_path, monkeypatch):
    """A base's pins are read in a container running as the user whose build needs them (one they can reach
    into): cached in root's shared cache, alice's answer for a base would be bob's build's. Through sudo each
    user's caches are their own folder; root's own and the docker group's stay where they were."""
    from imgbuild.config.settings import load_settings
    from imgbuild.pipeline.resolve import base_pins

    monkeypatch.setenv("IMGBUILD_CACHE_DIR", str(tmp_path))
    with monkeypatch.context() as acting_as_root:
        acting_as_root.setattr(Caller, "is_admin", property(lambda self: False))
        acting_as_root.setattr(os, "geteuid", lambda: 0)
        alice = load_settings({}, who=Caller("alice", 1001, 1001, via_sudo=True))
        bob = load_settings({}, who=Caller("bob", 1002, 1002, via_sudo=True))
    own = load_settings({}, who=Caller("carol", os.getuid(), os.getgid()))
    assert own.cache_dir == str(tmp_path) and alice.cache_dir == str(tmp_path / "users" / "1001")
    base_pins(alice).put("sha256:" + "a" * 64, {"origin": "hers", "lines": ["torch==0.0.1"]})
    assert base_pins(alice).get("sha256:" + "a" * 64) is not None
    assert base_pins(bob).get("sha256:" + "a" * 64) is None and base_pins(own).get("sha256:" + "a" * 64) is None


def test_a_user_has_at_most_the_sites_commands_running_through_sudo_at_once(tmp_path):
    """Each command through sudo is a root process her own limits do not count (a thousand `run --wait` waiters
    polling the ledger under its lock): past `run.max_commands_per_user` she is refused at once; bob's places are
    his own, and a place comes free when its command ends."""
    house = run_rules({"state_dir": str(tmp_path / "state"), "max_commands_per_user": 2})
    alice, bob = Caller("alice", 1001, 1001, via_sudo=True), Caller("bob", 1002, 1002, via_sudo=True)
    held = [enforce.command_place(alice, house) for _ in range(2)]
    with pytest.raises(UsageError, match=r"2 imgbuild commands running through sudo.*max_commands_per_user"):
        enforce.command_place(alice, house)
    os.close(enforce.command_place(bob, house))
    os.close(held.pop())
    held.append(enforce.command_place(alice, house))
    for fd in held:
        os.close(fd)


def test_every_container_imgbuild_starts_sets_each_label_imgbuild_reads():
    """`run`, a script container, a lease's placeholder and a Slurm node's docker each set every key imgbuild reads
    on a container (empty where unused): the engine lays them over the image's own, so no image's label makes a
    container another user's, holds GPUs or moves a deadline."""
    import shlex
    import types

    from imgbuild.engine.lease import DockerLeases
    from imgbuild.engine.noderun import NodeRun, docker_prefix
    from imgbuild.engine.runargs import run_argv
    from imgbuild.engine.scriptrun import script_container
    from imgbuild.facts import Label
    from imgbuild.servers.spec import RunSpec

    def flagged(words: list[str]) -> set[str]:
        return {words[i + 1].split("=", 1)[0] for i, word in enumerate(words) if word == "--label"}

    run_words, _ = run_argv(RunSpec("img:1", "x", "alice", 1001, 1001, workspace=False).options())
    node = shlex.split(docker_prefix(NodeRun(image="img"))[2].split("docker run ", 1)[1].split(" & wait", 1)[0])
    created: list[dict[str, str]] = []
    client = types.SimpleNamespace(
        containers=types.SimpleNamespace(create=lambda *a, **kw: created.append(kw["labels"]))
    )
    DockerLeases(client).claim("imgbuild-lease-x", "img", {Label.LEASE_OF: "k"})
    script = script_container("img", {}, False, None, None)["labels"]
    for site, keys in (("run", flagged(run_words)), ("a Slurm node", flagged(node)), ("a lease", set(created[0])),
                       ("a script", set(script))):  # fmt: skip
        assert set(Label.CONTAINER_KEYS) <= keys, f"{site} leaves {set(Label.CONTAINER_KEYS) - keys} to the image"
