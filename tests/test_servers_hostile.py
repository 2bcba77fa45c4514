"""A shared server's other users are untrusted: forged ledger entries, planted locks and FIFOs, another user's state
folder, garbage numbers and images given to `run`, no variable value in the docker CLI's argv, the reaper's notes."""

from __future__ import annotations

import json
import re
import time
import types

import pytest

from imgbuild.errors import UsageError
from tests.conftest import use_site_config

NOBODY = 65534


def _user_file(state, uid: int, entries: list, extended: dict | None = None, owner: int | None = None):
    import os

    path = state / f"ledger-{uid}.json"
    path.write_text(json.dumps({"entries": entries, "extended": extended or {}}))
    os.chown(path, NOBODY if owner is None else owner, -1)
    return path


def _entry(**fields):
    import os

    from imgbuild.hostio.host import process_start

    base = {
        "name": "ghost_1",
        "user": "nobody",
        "pid": os.getpid(),
        "started": process_start(os.getpid()),
        "gpus": ["GPU-0", "GPU-1"],
        "cpus": [],
        "since": time.time(),
        "ports": [8888],
        "waiting": "",
        "uid": NOBODY,
    }
    return {**base, **fields}


HOSTILE_IMAGES = [
    "x;rm -rf /",
    "127.0.0.1:5000/a b:1",
    "nvcr.io/nvidia/pytorch:２４.05",
    "lab/x@sha256:zz",
    "lab/x\u202e:1",
    "lab/x:1\n",
    "",
    "a" * 300,
    "typo.yaml",
    "$(touch PWNED)",
]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"cpus": float("nan")}, "--cpus nan: not a number of CPUs"),
        ({"cpus": float("inf")}, "--cpus inf: not a number of CPUs"),
        ({"cpus": -5.0}, "--cpus -5.0: not a number of CPUs"),
        ({"cpus": 1e308}, "not a number of CPUs"),
        ({"cpus": 0.001}, "--cpus 0.001: not a number of CPUs (from 0.01, the engine's least"),
        ({"time": "0"}, "--time 0: a deadline must be later than now"),
        ({"time": "0d"}, "a deadline must be later than now"),
        ({"time": "١h"}, "is not a duration"),
    ],
)
def test_run_refuses_garbage_numbers_as_usage_errors(flags, words, tmp_path, monkeypatch):
    """`--cpus nan` was a traceback (exit 1), `--cpus 1e308` reached docker, `--time 0` meant now."""
    from imgbuild.config.settings import load_settings
    from imgbuild.servers.run import prepare
    from imgbuild.servers.runwords import RunRequest

    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": []}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    with pytest.raises(UsageError, match=re.escape(words)):
        prepare(RunRequest("img", ["true"], **flags), load_settings({}), gpus=[])


def test_no_env_value_stands_in_the_docker_clis_argv(tmp_path, monkeypatch):
    """The Jupyter token was on the docker CLI's command line, readable by every user in /proc."""
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.runargs import run_argv
    from imgbuild.servers.run import prepare
    from imgbuild.servers.runwords import RunRequest
    from imgbuild.servers.spec import jupyter_notes

    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": []}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    use_site_config(monkeypatch, str(tmp_path / "site.yaml"))
    (tmp_path / "site.yaml").write_text(f"run: {{state_dir: {tmp_path / 'state'}, env: {{SITE_VAR: site-value}}}}\n")
    request = RunRequest("img", ["python3", "-e", "A=B"], jupyter=True, env=["HF_TOKEN=hf_CANARY"])
    spec = prepare(request, load_settings({}), gpus=[])
    argv, env = run_argv(spec.options())
    token = env["JUPYTER_TOKEN"]
    assert len(token) == 48 and not any(token in word for word in argv)
    assert env["HF_TOKEN"] == "hf_CANARY" and not any("CANARY" in word for word in argv)
    assert env["SITE_VAR"] == "site-value" and "JUPYTER_TOKEN" not in argv[:-3]  # by env file, not even by name
    assert argv[-3:] == ["python3", "-e", "A=B"], "the command's own words are the command's"
    assert any(token in line for line in jupyter_notes(spec, "host"))  # told to the user, on their terminal


@pytest.mark.root("writes ledger files as other users (chown)")
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("case", "entry", "owner"),
    [
        ("queue-block-pid-1", {"pid": 1, "waiting": "--gpus 1"}, None),
        ("hold-in-root-s-name", {"user": "root"}, None),
        ("someone-else-s-process", {}, None),  # this test's own process is root's, not nobody's
        ("uid-claims-another", {"uid": 0}, None),
        ("file-of-another-owner", {}, 0),
        ("stale-hold", {"since": 1.0}, None),
        ("stale-queue-place", {"waiting": "--gpus 1", "since": 1.0, "seen": 1.0}, None),
        ("wrong-type-cpus", {"cpus": [{}]}, None),
        ("wrong-type-gpus", {"gpus": [["GPU-x"]]}, None),
        ("wrong-type-name", {"name": ["x"]}, None),
        ("wrong-type-pid", {"pid": True}, None),
        ("wrong-type-since", {"since": "now"}, None),
        ("unknown-field", {"admin": True}, None),
    ],
)
def test_a_forged_ledger_entry_holds_nothing_and_crashes_nobody(case, entry, owner, tmp_path):
    """An entry naming PID 1 blocked every GPU run forever; one in another user's name held every
    GPU and port; wrongly typed fields crashed everyone's `run`."""
    from imgbuild.servers.ledger import Ledger

    state = tmp_path / "state"
    state.mkdir(mode=0o1777)
    _user_file(state, NOBODY, [_entry(**entry)], owner=owner)
    book = Ledger(state).read()
    assert book.entries == [] and book.holds() == [] and book.queue() == []
    with Ledger(state).transaction() as book:  # a run's view: the same, and nothing of nobody's is rewritten
        assert book.entries == []


@pytest.mark.root("writes another user's ledger file (chown)")
@pytest.mark.timeout(60)
def test_another_users_live_entry_counts_and_cannot_be_framed(tmp_path):
    """The honest case: nobody's own live process, in nobody's own file, holds what it says; the same file
    naming root is dropped."""
    import os
    import subprocess

    from imgbuild.hostio.host import process_start
    from imgbuild.servers.ledger import Ledger

    state = tmp_path / "state"
    state.mkdir(mode=0o1777)
    proc = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while os.stat(f"/proc/{proc.pid}").st_uid != NOBODY and time.monotonic() < deadline:
            time.sleep(0.02)
        live = _entry(pid=proc.pid, started=process_start(proc.pid))
        _user_file(state, NOBODY, [live])
        engine_user = Ledger(state, holds_of=lambda uid: True)  # nobody as a member of the docker group
        assert [e.name for e in engine_user.read().holds()] == ["ghost_1"]
        # the same file, written by a user who cannot start containers themself (enforced mode): holds nothing
        assert Ledger(state, holds_of=lambda uid: False).read().holds() == []
        _user_file(state, NOBODY, [{**live, "user": "root"}])
        assert engine_user.read().entries == []
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.root("writes another user's ledger file (chown)")
def test_an_extension_moves_only_its_owners_container(tmp_path):
    from imgbuild.config.site import run_rules
    from imgbuild.engine.types import ContainerInfo
    from imgbuild.servers.containers import effective_deadline
    from imgbuild.servers.ledger import Extension, Ledger

    state = tmp_path / "state"
    state.mkdir(mode=0o1777)
    _user_file(state, NOBODY, [], {"victim-id": {"deadline": 10**9, "user": "root"}, "own-id": 5000.0})
    book = Ledger(state).read()
    assert book.extended["victim-id"] == Extension(10**9, "nobody")  # nobody's file speaks for nobody only
    victim = ContainerInfo("alice_x_1", id="victim-id", user="alice", deadline=100.0, created_ts=0.0)
    assert effective_deadline(victim, book.extended, run_rules({})) == 100.0


@pytest.mark.root("root clearing what another user planted")
@pytest.mark.timeout(30)
@pytest.mark.parametrize("plant", ["fifo", "folder", "hard link"])
def test_a_planted_lock_never_blocks_and_root_clears_it(plant, tmp_path):
    """A FIFO, a folder, or a hard link to root's own file (where the kernel lets users link files not theirs:
    root made a shared lock 0666, so the linked file too) at the lock's name: root takes it away and goes on."""
    import os

    from imgbuild.servers.ledger import Ledger

    state = tmp_path / "state"
    state.mkdir(mode=0o1777)
    shadow = tmp_path / "shadow"
    shadow.write_text("root:x\n")
    shadow.chmod(0o600)
    plants = {"fifo": os.mkfifo, "folder": os.mkdir, "hard link": lambda path: os.link(shadow, path)}
    plants[plant](state / "ledger.lock")
    with Ledger(state).transaction() as book:  # root removes what was planted and goes on
        book.add("x_1", "root", [], [])
    assert (state / "ledger.lock").is_file() and os.stat(state / "ledger.lock").st_nlink == 1
    assert oct(shadow.stat().st_mode & 0o777) == oct(0o600) and shadow.stat().st_nlink == 1


@pytest.mark.root("a state folder another user owns (chown)")
@pytest.mark.timeout(30)
def test_a_state_folder_another_user_owns_is_refused_by_run_and_reap(tmp_path):
    """The first user to run imgbuild owned the state folder and deleted root's state and log."""
    import os

    from imgbuild.errors import EnvironmentProblem
    from imgbuild.servers.ledger import Ledger, reaper_dir

    state = tmp_path / "state"
    state.mkdir(mode=0o1777)
    os.chown(state, NOBODY, -1)
    with pytest.raises(EnvironmentProblem, match=r"belongs to nobody.*chown root"):
        Ledger(state).entries()
    with pytest.raises(EnvironmentProblem, match="belongs to nobody"):
        reaper_dir(state)
    os.chown(state, 0, -1)
    assert reaper_dir(state) == state / ".reap" and oct((state / ".reap").stat().st_mode & 0o777) == "0o700"
    os.chown(state / ".reap", NOBODY, -1)
    (state / ".reap" / "planted").write_text("hers")
    # root's name in the sticky state folder: what another user holds there is removed and made again, root's
    assert reaper_dir(state) == state / ".reap"
    info = (state / ".reap").stat()
    assert info.st_uid == 0 and oct(info.st_mode & 0o777) == "0o700" and not (state / ".reap" / "planted").exists()


@pytest.mark.root("a reap log another user owns (chown)")
@pytest.mark.timeout(30)
@pytest.mark.parametrize("plant", ["fifo", "folder", "symlink", "hardlink", "other-owner"])
def test_the_reap_log_is_only_ever_the_reapers_own_regular_file(plant, tmp_path):
    import os

    from imgbuild.errors import EnvironmentProblem
    from imgbuild.servers.reap import Action, append_log

    log = tmp_path / "reap.log"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    if plant == "fifo":
        os.mkfifo(log)
    elif plant == "folder":
        log.mkdir()
    elif plant == "symlink":
        log.symlink_to(victim)
    elif plant == "hardlink":
        os.link(victim, log)
    else:
        log.write_text("")
        os.chown(log, NOBODY, -1)
    with pytest.raises(EnvironmentProblem):
        append_log(log, 0.0, Action("warn", "x_1", "x", "idle", "idle"), "warned")
    assert victim.read_text() == "precious\n"


@pytest.mark.timeout(30)
def test_a_fifo_at_a_users_notices_file_never_blocks_root(tmp_path, monkeypatch):
    import os

    from imgbuild.servers.reap import write_notice
    from tests.support import users_home

    home = users_home(tmp_path, monkeypatch)
    os.mkfifo(home / "imgbuild-notices.txt")
    assert write_notice("someone", "you will be stopped") is False


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_the_reapers_note_reaches_a_container_running_as_its_user(testbed, docker_client, unique):
    """The note was written as uid 0, which may not open the PID 1 output of a container started
    `--user UID:GID`: every warning read `no container log`."""
    from imgbuild.engine import Engine

    name = f"imgbuildtest_note_{unique}"
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    docker_client.containers.run(image, ["sleep", "120"], name=name, user="65534:65534", detach=True)
    try:
        containers = Engine.connect(testbed.get("IMGBUILD_DOCKER_CLI")).containers
        assert containers.note(name, "imgbuild reap: a test note")
        deadline = time.monotonic() + 10
        while "a test note" not in docker_client.containers.get(name).logs().decode() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "imgbuild reap: a test note" in docker_client.containers.get(name).logs().decode()
    finally:
        docker_client.containers.get(name).remove(force=True)


def test_a_dry_run_of_reap_makes_no_folder(tmp_path):
    """`reap --dry-run` reads: the reaper's own folder is made by a real run only."""
    from imgbuild.config.site import reap_policy, run_rules
    from imgbuild.servers.reap import reap

    class NoContainers:
        containers = types.SimpleNamespace(rows=lambda: [])

    state = tmp_path / "state"
    house = run_rules({"state_dir": str(state)})
    assert reap(NoContainers(), [], house, reap_policy({}), 0.0, dry_run=True).actions == []
    assert not state.exists()
    reap(NoContainers(), [], house, reap_policy({}), 0.0)
    assert (state / ".reap").is_dir()


@pytest.mark.parametrize("image", HOSTILE_IMAGES, ids=range(len(HOSTILE_IMAGES)))
@pytest.mark.parametrize(
    "command",
    [["run", "--dry-run"], ["slurm", "--runtime", "docker"], ["slurm", "--runtime", "pyxis"], ["k8s"]],
    ids=["run", "slurm-docker", "slurm-pyxis", "k8s"],
)
def test_the_image_argument_is_a_reference_a_recipe_or_nothing(command, image, tmp_path):
    """An image argument that is no reference (nor recipe, nor image file) is refused at once with one line:
    it was passed on to docker (`run`), to a job that failed hours later in the queue (`slurm`), or crashed
    (`k8s`: an unexpected BadReference, exit 1)."""
    from tests.conftest import run_cli

    res = run_cli(command[0], image, *command[1:], "--", "python3", "t.py", cwd=tmp_path)
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1 and "Traceback" not in res.err, res.err
    assert "give REGISTRY/REPO:TAG or a recipe file" in res.err or "no such recipe file" in res.err
    assert not (tmp_path / "PWNED").exists()


def test_two_runs_making_the_reapers_folder_at_the_same_moment_both_go_on(tmp_path, monkeypatch):
    """The second of two runs started together found the folder made between its look and its mkdir, and stopped
    with "cannot use the reaper's folder": made by another run is made, and judged as any other."""
    import os

    from imgbuild.servers import ledger

    state = tmp_path / "state"
    ledger.Ledger(state).folder()
    made = os.mkdir

    def the_other_run_was_first(path, mode=0o777):
        made(path, mode)
        raise FileExistsError(17, "File exists", str(path))

    monkeypatch.setattr(ledger.os, "mkdir", the_other_run_was_first)
    assert ledger.reaper_dir(state) == state / ".reap" and (state / ".reap").is_dir()


class _StallingApi:
    """A Docker API whose exec never ends (a container whose `sh` sleeps), recording what it was asked."""

    def __init__(self) -> None:
        self.created: list[tuple[str, list[str], dict[str, str]]] = []

    def exec_create(self, name, cmd, stdout, stderr, environment):  # noqa: ANN001
        self.created.append((name, cmd, environment))
        return {"Id": "x"}

    def exec_start(self, exec_id):  # noqa: ANN001
        time.sleep(30)

    def exec_inspect(self, exec_id):  # noqa: ANN001
        return {"ExitCode": 0}


def test_an_exec_into_a_users_container_names_its_program_and_returns_within_its_bound(monkeypatch):
    from imgbuild.engine import containers as module
    from imgbuild.engine.containers import EXEC_PATH, DockerContainers

    monkeypatch.setattr(module, "EXEC_SECONDS", 0.3)
    api = _StallingApi()
    containers = DockerContainers(types.SimpleNamespace(api=api), images=None)  # type: ignore[arg-type]
    began = time.monotonic()
    assert containers.exec_bounded("alice_trap_1", ["/bin/sh", "-c", "true"]) == (-1, "it did not end within 0.3 s")
    assert containers.note("alice_trap_1", "imgbuild reap: a warning") is False
    assert time.monotonic() - began < 2.5
    # one waiting call per container and process: the note made none (a `gpus --watch` loop leaks no threads)
    assert [(name, cmd[0]) for name, cmd, _ in api.created] == [("alice_trap_1", "/bin/sh")]
    assert containers.exec_bounded("bob_job_1", ["/bin/true"]) == (-1, "it did not end within 0.3 s")
    assert [name for name, _, _ in api.created] == ["alice_trap_1", "bob_job_1"]  # another container: asked
    assert all(env == {"PATH": EXEC_PATH} for _, _, env in api.created)
    with pytest.raises(ValueError, match="absolute path"):
        containers.exec_bounded("alice_trap_1", ["timeout", "20", "nvidia-smi"])


def test_ps_probes_only_the_callers_own_containers(tmp_path, monkeypatch):
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.engine.types import ContainerInfo
    from imgbuild.hostio.host import Caller
    from imgbuild.servers import containers as view

    engine = FakeEngine()
    engine.containers.listed = [
        ContainerInfo("alice_trap_1", status="running", user="alice", gpus="0"),
        ContainerInfo("bob_train_1", status="running", user="bob", gpus="1"),
    ]
    probed: list[tuple[str, str]] = []
    monkeypatch.setattr(engine.containers, "probe", lambda name, cmd, timeout=10: (probed.append((name, cmd[0])), (0, ""))[1])  # fmt: skip
    run = types.SimpleNamespace(ledger_dir=tmp_path, max_seconds=None)
    settings = types.SimpleNamespace(run=run, caller=Caller("bob", 60002, 60002))
    monkeypatch.setattr(Caller, "is_admin", property(lambda self: False))
    rows = view.container_view(engine, settings, all_users=True)  # type: ignore[arg-type]
    assert {r["name"] for r in rows} == {"alice_trap_1", "bob_train_1"}
    assert probed == [("bob_train_1", "/usr/bin/nvidia-smi")]
    probed.clear()
    assert [r["name"] for r in view.container_view(engine, settings)] == ["bob_train_1"]  # type: ignore[arg-type]
    assert view.lost_containers(engine, settings.caller) == [] and probed[-1][0] == "bob_train_1"  # type: ignore[arg-type]
