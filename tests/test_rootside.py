"""What runs as root trusts no path, variable or file a user can write: its import path, its environment, the
queue's child processes, the docker CLI's environment, the names root keeps in the shared state folder.

The attacks by real users through Debian's sudo on the real engine are in tests/test_enforce.py; these are the
same properties, one function at a time, each with the attack first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgbuild.engine.runargs import env_file, env_file_text, run_argv
from imgbuild.engine.types import RunOptions
from imgbuild.errors import UsageError
from imgbuild.hostio import rootside
from imgbuild.hostio.regular import clear_planted
from imgbuild.servers import queue as jobs

needs_root = pytest.mark.root("makes folders of other owners and runs children as root")


def _planted_package(folder: Path, proof: Path) -> None:
    """A package named imgbuild in `folder` that leaves `proof` behind if anything imports it."""
    package = folder / "imgbuild"
    package.mkdir(parents=True)
    code = f"import os\nopen({str(proof)!r}, 'w').write(f'uid={{os.getuid()}}')\n"
    (package / "__init__.py").write_text(code)
    (package / "__main__.py").write_text(code)


# --- the import path -----------------------------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize(
    ("why", "owner", "mode", "trusted"),
    [
        ("root's folder, writable by root alone", 0, 0o755, True),
        ("a user's folder", 1234, 0o755, False),
        ("root's folder that anyone can write", 0, 0o777, False),
        ("root's folder that its group can write", 0, 0o775, False),
        ("root's sticky folder, world-writable (like /tmp itself)", 0, 0o1777, False),
    ],
)
def test_a_folder_is_trusted_for_imports_only_when_only_root_can_change_it(tmp_path, why, owner, mode, trusted):
    assert os.geteuid() == 0, "making folders of other owners is root's"
    folder = tmp_path / "lib"
    folder.mkdir()
    os.chown(folder, owner, 0)
    os.chmod(folder, mode)
    assert rootside.trusted_folder(str(folder)) is trusted, why


@needs_root
def test_a_root_folder_under_a_users_folder_is_not_trusted(tmp_path):
    """A user who owns a folder above can rename root's folder away and put their own in its place."""
    users = tmp_path / "users"
    (users / "lib").mkdir(parents=True)
    os.chown(users, 1234, 1234)
    assert not rootside.trusted_folder(str(users / "lib"))


@pytest.mark.parametrize("entry", ["", ".", "relative/dir"])
def test_the_working_folder_and_relative_entries_never_stay_on_roots_import_path(entry):
    assert entry not in rootside.import_path([entry, sys.prefix])


@needs_root
def test_the_entry_point_as_root_does_not_import_a_package_planted_in_the_working_folder(tmp_path):
    """`python -m imgbuild` (what the queue used to run) puts the working folder first on sys.path; the console
    script and the queue's child never do, and a root process drops such entries at start."""
    work = tmp_path / "work"
    proof = tmp_path / "proof"
    _planted_package(work, proof)
    os.chown(work, 1234, 1234)
    script = Path(sys.executable).parent / "imgbuild"
    done = subprocess.run([str(script), "--version"], cwd=work, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "imgbuild" in done.stdout, done.stderr
    assert not proof.exists()


# --- the environment -------------------------------------------------------------------------------------------


def test_roots_environment_keeps_no_variable_a_user_could_bring():
    hostile = {
        "HOME": "/home/alice",
        "PATH": "/home/alice/bin:/usr/bin",
        "PYTHONPATH": "/home/alice",
        "PYTHONSTARTUP": "/home/alice/x.py",
        "LD_PRELOAD": "/home/alice/x.so",
        "XDG_CONFIG_HOME": "/home/alice/.config",
        "DOCKER_CONFIG_EXTRA": "x",
        "http_proxy": "http://alice:1",
        "HTTPS_PROXY": "http://alice:1",
        "SUDO_UID": "1001",
        "SUDO_GID": "1001",
        "SUDO_USER": "alice",
        "LANG": "C.UTF-8",
        "IMGBUILD_SITE_CONFIG": "/etc/imgbuild/config.yaml",
    }
    env = rootside.environment(hostile)
    assert env["PATH"] == rootside.SECURE_PATH and env["HOME"] == rootside.root_home()
    for name in ("PYTHONPATH", "PYTHONSTARTUP", "LD_PRELOAD", "XDG_CONFIG_HOME", "http_proxy", "HTTPS_PROXY"):
        assert name not in env, name
    assert env["SUDO_UID"] == "1001" and env["LANG"] == "C.UTF-8"
    assert env["IMGBUILD_SITE_CONFIG"] == "/etc/imgbuild/config.yaml"  # root's own: sudo's env_reset drops a user's
    assert "SUDO_UID" not in rootside.environment(hostile, sudo=False)


# --- the queue's child -----------------------------------------------------------------------------------------


@needs_root
def test_the_queue_child_imports_nothing_from_the_jobs_folder_and_its_args_are_in_no_argv(tmp_path):
    """The job's folder is the user's: the child is `python -I`, its arguments on standard input."""
    work = tmp_path / "job"
    proof = tmp_path / "proof"
    _planted_package(work, proof)
    env = {**jobs._child_env(None), "PYTHONPATH": str(work)}  # even a variable naming it is ignored (-I)
    code, said = jobs._child(["--help"], str(work), env)
    assert code == 0, said
    assert not proof.exists(), proof.read_text() if proof.exists() else ""


def test_the_queue_child_runs_isolated_with_its_arguments_on_stdin(monkeypatch):
    seen: dict = {}

    def fake_run(argv, **kwargs):
        seen.update(argv=argv, **kwargs)
        return subprocess.CompletedProcess(argv, 0, "", "starting x_1 (")

    monkeypatch.setattr(jobs.subprocess, "run", fake_run)
    jobs._child(["-d", "-e", "HF_TOKEN=hf_secret", "img"], "/home/alice/proj", {})
    assert seen["argv"][:3] == [sys.executable, "-I", "-c"]
    assert "hf_secret" not in " ".join(seen["argv"])
    assert json.loads(seen["input"]) == {
        "cwd": "/home/alice/proj",
        "words": ["-d", "-e", "HF_TOKEN=hf_secret", "img"],
        "user": "",  # whom a refusal at the folder names: no job's user given
    }
    assert seen["cwd"] == "/"  # the child enters the job's folder itself, as whoever it runs as


@needs_root
def test_a_job_from_a_users_own_file_starts_as_that_user(monkeypatch):
    """Root starts a job it did not file (a file the user wrote) with the user's own IDs, never its own."""
    seen: dict = {}

    def fake_run(argv, **kwargs):
        seen.update(kwargs)
        return subprocess.CompletedProcess(argv, 1, "", "permission denied")

    monkeypatch.setattr(jobs.subprocess, "run", fake_run)
    job = jobs.Job("0000000a", "nobody", 65534, 65534, 0.0, "/", ["img"])
    jobs._start(job, as_root=True, root_filed=False)
    assert (seen["user"], seen["group"]) == (65534, 65534)
    assert "SUDO_UID" not in seen["env"] and seen["env"]["HOME"]


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["-e", "HF_TOKEN=hf_x", "img"], ["-e", "HF_TOKEN=***", "img"]),
        (["--env", "A=b", "img"], ["--env", "A=***", "img"]),
        (["--env=A=b", "img"], ["--env=A=***", "img"]),
        (["-eA=b", "img"], ["-eA=***", "img"]),
        (["-e", "NAME_ONLY", "img"], ["-e", "NAME_ONLY", "img"]),
        (["img", "--", "python", "-e", "x=1"], ["img", "--", "python", "-e", "x=1"]),  # the command's own words
        (["-deHF_TOKEN=hf_x", "img"], ["-deHF_TOKEN=***", "img"]),  # -d and -e in one word, as run reads it
        (["-dvx:y", "-e", "A=b", "img"], ["-dvx:y", "-e", "A=***", "img"]),
        (["--detach=yes", "-eA=b", "img"], ["--detach=***", "-eA=***", "img"]),  # words run refuses: no value
    ],
)
def test_queue_ls_shows_a_variables_name_never_its_value(args, shown):
    assert jobs.shown_args(args) == shown


@needs_root
def test_a_jobs_gid_comes_from_the_password_database_never_from_its_file(tmp_path):
    """A hand-written job with the sudo group's gid (27) would have made its user an admin in root's child."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    job = {"id": "0000000a", "user": "nobody", "uid": nobody.pw_uid, "gid": 27, "submitted": 1.0, "cwd": "/",
           "args": ["--user", "0:0", "img"]}  # fmt: skip
    path = tmp_path / f"queue-{nobody.pw_uid}.json"
    path.write_text(json.dumps({"jobs": [job]}))
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    queue = jobs.Queue(tmp_path).load()
    assert [j.gid for j in queue.jobs] == [nobody.pw_gid]
    assert nobody.pw_uid not in queue.root_filed  # hers: started as her, never by root for her


# --- the docker CLI's environment ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"A": "line\nbreak"}, "line break"),
        ({"A": "carriage\rreturn"}, "line break"),
        ({"A": "nul\0"}, "line break"),
        ({"BAD NAME": "x"}, "not a variable name"),
        ({"1X": "x"}, "not a variable name"),
        ({"A=B": "x"}, "not a variable name"),
        ({"A": "\udcff"}, "not UTF-8"),
        ({"A": "x" * 70_000}, "a value of 70,003 bytes; a container's variable holds at most 65,000"),
    ],
)
def test_a_value_the_env_file_cannot_carry_is_refused_never_cut(env, refused):
    with pytest.raises(UsageError, match=refused):
        env_file_text(env)


def test_container_variables_go_to_the_cli_as_a_private_file_never_its_environment():
    options = RunOptions(image="img", env=(("HOME", "/home/alice"), ("PATH", "/home/alice/bin"), ("T", "s=e=c")))
    argv, env = run_argv(options)
    assert "/home/alice" not in " ".join(argv) and "s=e=c" not in " ".join(argv)
    assert "-e" not in argv, "a name-only -e takes the CLI's own value (root's PATH, HOME) over the file's"
    with env_file(env) as (fd, path):
        assert path == f"/dev/fd/{fd}"
        text = os.pread(fd, 4096, 0).decode()
    assert text.splitlines() == [
        "HOME=/home/alice",
        "PATH=/home/alice/bin",
        "T=s=e=c",
        "NVIDIA_VISIBLE_DEVICES=void",
        "CUDA_VISIBLE_DEVICES=",
    ]


def test_the_docker_cli_gets_imgbuilds_environment_and_the_variables_by_file(monkeypatch):
    from imgbuild.engine.containers import DockerContainers

    seen: dict = {}

    def fake_run(argv, **kwargs):
        seen["argv"] = argv
        seen["env"] = kwargs.get("env")
        seen["file"] = Path(argv[argv.index("--env-file") + 1]).read_text()
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr("imgbuild.engine.containers.subprocess.run", fake_run)
    containers = DockerContainers(None, None)  # type: ignore[arg-type]
    monkeypatch.setattr(containers, "cli", lambda: "/usr/bin/docker")
    containers.run(RunOptions(image="img", env=(("HOME", "/home/alice"),), detach=True))
    assert seen["env"] is None  # the CLI inherits imgbuild's own environment, untouched
    assert "HOME=/home/alice" in seen["file"]
    assert seen["argv"][:3] == ["/usr/bin/docker", "run", "--env-file"]


# --- the names root keeps in the shared state folder ------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("planted", ["folder", "fifo", "link", "users file", "hard link"])
def test_root_removes_what_a_user_planted_at_its_name(tmp_path, planted):
    target = tmp_path / "ledger-0.json"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    if planted == "folder":
        (target / "inner").mkdir(parents=True)
    elif planted == "fifo":
        os.mkfifo(target)
    elif planted == "link":
        target.symlink_to(victim)
    elif planted == "users file":
        target.write_text("{}")
        os.chown(target, 1234, 1234)
    else:
        os.link(victim, target)
    clear_planted(target)
    assert not os.path.lexists(target) and victim.read_text() == "precious"


@needs_root
def test_roots_own_file_and_the_owners_file_stay(tmp_path):
    mine = tmp_path / "queue-1234.json"
    mine.write_text("{}")
    os.chown(mine, 1234, 1234)
    clear_planted(mine, owner=1234)
    assert mine.exists()
    ours = tmp_path / "ledger-0.json"
    ours.write_text("{}")
    clear_planted(ours)
    assert ours.exists()


@needs_root
def test_a_user_holding_the_shared_lock_stalls_no_root_run(unique):
    """Any user can open the shared lock file and hold it; root orders its own runs by a lock of its own."""
    import fcntl
    import shutil
    import time

    from imgbuild.servers.ledger import LOCK_FILE, SHARED_LOCK_SECONDS, Ledger

    state = Path(f"/var/tmp/imgbuild-test-lock-{unique}")  # a place another user reaches, as a state folder is
    Ledger(state).folder()
    holder = subprocess.Popen(
        ["/usr/bin/python3", "-c", "import fcntl,sys,time;f=open(sys.argv[1],'a');fcntl.flock(f,fcntl.LOCK_EX);"
         "print('held',flush=True);time.sleep(60)", str(state / LOCK_FILE)],
        stdout=subprocess.PIPE, text=True, user=65534,
    )  # fmt: skip
    try:
        assert holder.stdout and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        assert Ledger(state).entries() == []
        assert time.monotonic() - started < SHARED_LOCK_SECONDS + 5
        own = os.stat(state / ".reap" / LOCK_FILE)
        assert own.st_uid == 0 and own.st_mode & 0o777 == 0o600
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(state, ignore_errors=True)
    assert fcntl  # the holder used flock(2), as imgbuild does


# --- images cannot steer the rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "local"),
    [
        ("alice/seed:1", True),  # the name imgbuild gives what it builds here
        ("alice/seed", True),
        ("docker.io/alice/seed:1", False),  # a registry named: pulled from there, as asked
        ("registry.example.org/alice/seed:1", False),
        ("bob/seed:1", False),  # not hers (refused elsewhere in enforced mode)
        ("alice", False),  # Docker Hub's library/alice
        ("Alice/seed:1", False),  # not a reference at all
        ("", False),
    ],
)
def test_an_image_in_the_users_namespace_is_never_pulled(image, local):
    from imgbuild.servers.admission import built_here

    assert built_here(image, {"alice", ""}) is local


def test_an_image_the_host_lacks_is_pulled_and_judged_before_its_first_run():
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.servers.admission import pull_to_inspect

    engine = FakeEngine()
    pulled: list[str] = []
    engine.images.pull = pulled.append  # type: ignore[method-assign]
    pull_to_inspect("registry.example.org/team/x:1", engine, local_only=False)
    assert pulled == ["registry.example.org/team/x:1"]
    pull_to_inspect("alice/x:1", engine, local_only=True)
    assert pulled == ["registry.example.org/team/x:1"], "one built here is never pulled"


@needs_root
def test_only_a_user_who_can_reach_the_engine_holds_gpus_by_their_own_ledger_file(tmp_path):
    """Enforced mode: a user outside the docker group starts containers only through sudo (root's file holds for
    them). A ledger file they write by hand, holding every GPU and port with a process of theirs kept alive,
    denied every other user: it now holds nothing. A docker-group member's own file still counts."""
    import grp
    import pwd
    import socket as sockets

    from imgbuild.servers.ledger import can_reach_engine

    path = tmp_path / "docker.sock"
    server = sockets.socket(sockets.AF_UNIX)
    server.bind(str(path))
    try:
        os.chown(path, 0, grp.getgrnam("root").gr_gid)  # a group nobody is not in
        os.chmod(path, 0o660)
        nobody = pwd.getpwnam("nobody").pw_uid
        assert can_reach_engine(0, str(path))
        assert not can_reach_engine(nobody, str(path))  # not in the socket's group
        os.chown(path, 0, pwd.getpwnam("nobody").pw_gid)  # the socket's group is nobody's own
        assert can_reach_engine(nobody, str(path))
        os.chmod(path, 0o600)  # the group may not write it
        assert not can_reach_engine(nobody, str(path))
        assert can_reach_engine(nobody, str(tmp_path / "absent.sock"))  # no local socket: cannot tell, believed
    finally:
        server.close()


# --- files imgbuild writes for the user ----------------------------------------------------------------------


def test_a_file_is_replaced_whole_and_never_written_through_a_link(tmp_path):
    from imgbuild.hostio.regular import write_atomic

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "devcontainer.json"
    link.symlink_to(victim)  # a link committed in the repository
    write_atomic(link, "new\n")
    assert victim.read_text() == "precious\n" and not link.is_symlink() and link.read_text() == "new\n"
    script = tmp_path / "job.sh"
    script.write_text("old\n")
    script.chmod(0o750)
    write_atomic(script, "new\n")
    assert script.read_text() == "new\n" and script.stat().st_mode & 0o777 == 0o750  # its mode kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["devcontainer.json", "job.sh", "victim"]  # no leftovers


def test_a_kill_while_a_lock_or_recipe_is_written_leaves_the_old_file_whole(tmp_path):
    """bump and lock wrote in place: a kill left a 0-byte recipe or lock, and an empty lock validated."""
    import signal
    import sys

    path = tmp_path / "r.lock.txt"
    path.write_text("einops==0.8.1\n")
    code = (
        "import os, signal, sys\n"
        "sys.path[:0] = [p for p in sys.argv[2:]]\n"
        "import imgbuild.hostio.regular as r\n"
        "real = os.replace\n"
        "def killed(*a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "os.replace = killed\n"
        "r.write_atomic(__import__('pathlib').Path(sys.argv[1]), 'x' * 10_000_000)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path), *sys.path], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert path.read_text() == "einops==0.8.1\n"


@needs_root
def test_an_absent_import_path_entry_counts_only_where_only_root_could_create_it(tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    os.chown(users, 1234, 1234)
    roots = tmp_path / "roots"
    roots.mkdir()
    absent_under_user, absent_under_root = str(users / "later" / "site-packages"), str(roots / "later")
    kept = rootside.import_path([absent_under_user, absent_under_root])
    assert kept == [absent_under_root]


@needs_root
def test_the_folder_imgbuild_itself_came_from_is_kept_whoever_owns_it(tmp_path):
    """Whoever can write that folder has written imgbuild already: dropping it would only break the command."""
    users = tmp_path / "venv-site"
    users.mkdir()
    os.chown(users, 1234, 1234)
    assert rootside.import_path([str(users)]) == []
    assert rootside.import_path([str(users)], own=os.path.realpath(users)) == [str(users)]
