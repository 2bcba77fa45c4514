"""The batch queue. Order and fairness as tables, the files' trust rules against forged
entries, advancing with a scripted start; the real engine with two users through sudo is in test_enforce.py."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from imgbuild.errors import UsageError
from imgbuild.hostio.host import Caller, caller
from imgbuild.servers import queue as jobs


def job(user: str, submitted: float, uid: int | None = None, n: int = 0, state: str = "queued") -> jobs.Job:
    me = caller()
    uid = me.uid if uid is None else uid
    return jobs.Job(f"{int(submitted * 10) + n:08x}", user, uid, uid, submitted, "/", ["img", "--", "true"], state)


def test_users_take_turns_and_each_users_jobs_keep_their_order():
    queued = [job("alice", 1), job("alice", 2), job("alice", 3), job("bob", 1.5), job("carol", 0.5),
              job("dave", 0.1, state="started")]  # fmt: skip
    assert [(j.user, j.submitted) for j in jobs.order(queued)] == [
        ("carol", 0.5), ("alice", 1), ("bob", 1.5), ("alice", 2), ("alice", 3),
    ]  # fmt: skip


def _write(state: Path, uid: int, entries: list, mode: int = 0o644, owner: int | None = None) -> Path:
    path = state / f"queue-{uid}.json"
    path.write_text(json.dumps({"jobs": entries}))
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, -1)
    return path


def test_a_queue_file_is_believed_only_for_its_own_users_jobs(tmp_path):
    me = caller()
    good = asdict(job(me.name, 1))
    _write(tmp_path, me.uid, [good, {**good, "id": "0000000b", "user": "bob"}, {**good, "id": "nothex!!"},
                              {**good, "id": "0000000c", "args": "rm -rf /"}, {"id": 1}, "text", {**good, "id": "0000000d", "state": "running"}])  # fmt: skip
    assert [j.id for j in jobs.Queue(tmp_path).load().jobs] == [good["id"]]
    _write(tmp_path, me.uid, [good], mode=0o666)  # writable by others: forged jobs could start as this user
    assert jobs.Queue(tmp_path).load().jobs == []
    (tmp_path / f"queue-{me.uid}.json").write_text("{not json")
    assert jobs.Queue(tmp_path).load().jobs == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner is root's")
def test_a_queue_file_owned_by_someone_else_is_not_believed(tmp_path):
    me = caller()
    _write(tmp_path, me.uid, [asdict(job(me.name, 1))], owner=me.uid + 4242)
    assert jobs.Queue(tmp_path).load().jobs == []


def test_advancing_starts_in_turn_and_a_user_whose_job_waits_waits_behind_it(tmp_path):
    me = caller()
    queue = jobs.Queue(tmp_path)
    queue.jobs = [job(me.name, 1, n=1), job(me.name, 2, n=2), job(me.name, 3, n=3)]
    queue.save(me.uid)
    answers = {queue.jobs[0].id: (0, "me_job_1"), queue.jobs[1].id: (jobs.BUSY, "busy"), queue.jobs[2].id: (0, "x")}
    tried = jobs.advance(tmp_path, me, start=lambda j, as_root: answers[j.id])
    assert [(j.id, j.state, j.container) for j in tried] == [(queue.jobs[0].id, "started", "me_job_1")]
    states = {j.id: j.state for j in jobs.Queue(tmp_path).load().jobs}
    assert list(states.values()) == ["started", "queued", "queued"]  # the third waits behind the second
    answers[queue.jobs[1].id] = (2, "image not allowed")
    tried = jobs.advance(tmp_path, me, start=lambda j, as_root: answers[j.id])
    assert [(j.state, j.detail) for j in tried] == [("failed", "image not allowed"), ("started", "")]


def test_a_drained_queue_starts_nothing_and_only_the_admin_drains(tmp_path, monkeypatch):
    me = caller()
    queue = jobs.Queue(tmp_path)
    queue.jobs = [job(me.name, 1)]
    queue.save(me.uid)
    (tmp_path / ".reap").mkdir(mode=0o700)
    jobs.set_drained(tmp_path, True)
    assert jobs.advance(tmp_path, me, start=lambda j, as_root: (0, "x")) == []
    jobs.set_drained(tmp_path, False)
    assert len(jobs.advance(tmp_path, me, start=lambda j, as_root: (0, "x"))) == 1


@pytest.mark.root("two users' jobs in a root-owned state folder")
def test_a_user_advances_and_removes_only_their_own_jobs(tmp_path, monkeypatch):
    me = caller()
    other = Caller("someoneelse", me.uid + 1, me.uid + 1)
    monkeypatch.setattr(os, "geteuid", lambda: me.uid + 1)  # not root: is_admin is false
    queue = jobs.Queue(tmp_path)
    queue.jobs = [job(me.name, 1)]
    queue.save(me.uid)
    assert jobs.advance(tmp_path, other, start=lambda j, as_root: (0, "x")) == []
    with pytest.raises(UsageError, match=f"is {me.name}'s, not yours"):
        jobs.remove(tmp_path, other, queue.jobs[0].id)
    with pytest.raises(UsageError, match="no job"):
        jobs.remove(tmp_path, other, "ffffffff")


@pytest.mark.parametrize(
    "args, check, cwd, message",
    [
        (["--user", "0", "img"], (2, "--user: under this server's rules containers run as you"), "/", "--user: under"),
        (["img"], (0, ""), "relative/folder", "cannot be a job's folder"),
        (["img"], (0, ""), "/a/../b", "cannot be a job's folder"),
    ],
)
def test_a_job_is_checked_before_it_is_filed(tmp_path, args, check, cwd, message):
    with pytest.raises(UsageError, match=message):
        jobs.add(tmp_path, caller(), args, cwd, check=lambda a, c: check)
    assert jobs.Queue(tmp_path).load().jobs == []


@pytest.fixture
def in_the_child(monkeypatch):
    """The queue's child's code run in this process: the folder it enters, its import path (as root, hardened) and
    its signal handlers are put back afterwards."""
    import signal
    import sys

    monkeypatch.chdir(os.getcwd())
    monkeypatch.setattr(sys, "path", list(sys.path))
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("wait", [["--wait", "40s"], ["--wait=40s"], ["--wait"]])
def test_a_queued_jobs_start_refuses_to_wait_in_any_spelling(wait, tmp_path, in_the_child, capsys):
    from imgbuild.servers import queuechild

    assert queuechild.start(str(tmp_path), [*wait, "--dry-run", "img", "--", "true"]) == 2
    assert "waits in the queue" in capsys.readouterr().err


def test_the_queues_child_starts_a_job_by_runs_own_grammar_with_the_command_line_unimportable(
    tmp_path, in_the_child, monkeypatch, capsys
):
    """The child's program (`_CHILD`) reads the job's words with `run`'s grammar of the servers package and makes
    its call there: with the command line's package made unimportable it still starts the job (the launch a
    fake)."""
    import io
    import sys
    from types import SimpleNamespace

    from imgbuild.servers import run
    from imgbuild.servers.runwords import RunCall

    calls: list[RunCall] = []

    def launch(call: RunCall, settings: object, say) -> SimpleNamespace:
        calls.append(call)
        say("starting alice_job_1 (img)")
        return SimpleNamespace(command_line="", notes=[])

    monkeypatch.setattr(run, "launch", launch)
    monkeypatch.setitem(sys.modules, "imgbuild.cli", None)  # an import of it raises
    words = ["-d", "--gpus", "1", "-e", "HF_TOKEN=hf_x", "--name", "job", "img", "--", "python", "-V"]
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"cwd": str(tmp_path), "words": words})))
    with pytest.raises(SystemExit) as ended:
        exec(jobs._CHILD, {})
    assert ended.value.code == 0, capsys.readouterr().err
    (call,) = calls
    assert (call.request.image, call.request.gpu_request, call.request.env) == ("img", "1", ["HF_TOKEN=hf_x"])
    assert call.request.detach and call.request.command == ["python", "-V"] and call.words == tuple(words)
    assert os.getcwd() == str(tmp_path)  # it entered the job's folder
    assert "starting alice_job_1 (" in capsys.readouterr().err
    assert sys.modules["imgbuild.cli"] is None


def test_words_the_command_line_refuses_are_refused_by_the_queues_child_alike(tmp_path, in_the_child, capsys):
    from imgbuild.servers import queuechild

    assert queuechild.start(str(tmp_path), ["-d", "--cpus", "many", "img"]) == 2
    assert "'many' is not a valid float" in capsys.readouterr().err


def test_a_hand_written_submitted_time_does_not_jump_the_queue(tmp_path):
    me = Caller("nobody", 65534, 65534) if os.geteuid() == 0 else caller()  # a file of the user's own
    _write(tmp_path, me.uid, [asdict(job(me.name, 0, uid=me.uid))], mode=0o600, owner=me.uid if me.uid else None)
    changed = os.stat(tmp_path / f"queue-{me.uid}.json").st_ctime
    assert [j.submitted for j in jobs.Queue(tmp_path).load().jobs] == [changed]


@pytest.mark.parametrize("cwd", ["relative", "/a/../etc", "/a//b", "//a", "/a\nb", "/" + "x" * 5000, 7])
def test_a_queue_file_naming_a_folder_two_ways_or_none_is_not_believed(tmp_path, cwd):
    me = caller()
    _write(tmp_path, me.uid, [{**asdict(job(me.name, 1)), "cwd": cwd}], mode=0o600)
    assert jobs.Queue(tmp_path).load().jobs == []


@pytest.mark.parametrize("number", [float("inf"), float("nan"), 1e400, 10**400, -1, True])
def test_a_queue_file_with_numbers_out_of_range_is_not_believed(tmp_path, number):
    me = caller()
    (tmp_path / f"queue-{me.uid}.json").write_text(
        json.dumps({"jobs": [{**asdict(job(me.name, 1)), "submitted": number}]})
    )
    os.chmod(tmp_path / f"queue-{me.uid}.json", 0o600)
    assert jobs.Queue(tmp_path).load().jobs == []


def test_jobs_start_outside_the_queues_lock(tmp_path):
    """While one job starts, another process takes the queue's lock at once (to file a job, or take one back)."""
    me = caller()
    queue = jobs.Queue(tmp_path)
    queue.jobs = [job(me.name, 1)]
    queue.save(me.uid)
    seen: list[str] = []

    def start(j: jobs.Job, as_root: bool) -> tuple[int, str]:
        with jobs.Queue(tmp_path).locked() as during:  # would wait out the lock's bound if the start held it
            seen.append(next(x.state for x in during.jobs if x.id == j.id))
        return 0, "me_job_1"

    tried = jobs.advance(tmp_path, me, start=start)
    assert seen == ["starting"] and [j.state for j in tried] == ["started"]


def test_a_job_taken_back_while_it_starts_is_not_written_back(tmp_path):
    me = caller()
    queue = jobs.Queue(tmp_path)
    queue.jobs = [job(me.name, 1)]
    queue.save(me.uid)

    def start(j: jobs.Job, as_root: bool) -> tuple[int, str]:
        jobs.remove(tmp_path, me, j.id)
        return 0, "x"

    assert jobs.advance(tmp_path, me, start=start) == []
    assert jobs.Queue(tmp_path).load().jobs == []


@pytest.mark.root("a job started as another user")
def test_a_users_job_never_enters_a_folder_they_cannot(tmp_path):
    """The job's user (nobody) cannot enter the folder: refused before anything starts, checked as them; and where
    root stays root to act for them (a file root wrote), the child itself enters the folder with their
    permissions only, and stops there, exit 2 (a link swapped in after the check changes nothing); a folder they
    may enter it enters, and goes on as root. Where root drops to them (their own file), the child is theirs
    before it enters anything."""
    import pwd

    nobody = pwd.getpwnam("nobody")
    private = tmp_path / "private"
    (private / "proj").mkdir(parents=True)
    private.chmod(0o700)
    tmp_path.chmod(0o755)
    victim = jobs.Job("0000000a", "nobody", nobody.pw_uid, nobody.pw_gid, 1.0, str(private / "proj"), ["img"])
    code, said = jobs._start(victim, as_root=True, root_filed=False)
    assert code == 2 and "checked as nobody" in said
    code, said = jobs._start(victim, as_root=True, root_filed=True)
    assert code == 2 and "checked as nobody" in said, said
    code, said = jobs._child(["--help"], str(private / "proj"), {"PATH": "/usr/bin:/bin"}, as_user=victim)
    assert code != 0 and "Permission denied" in said
    env = {"PATH": "/usr/bin:/bin"}
    code, said = jobs._child(["--help"], str(private / "proj"), env, enter_as=victim)  # no check before it
    assert code == 2 and said.endswith("Permission denied (as nobody)"), said
    code, said = jobs._child(["--help"], "/tmp", env, enter_as=victim)
    assert code == 0, said


@pytest.mark.root("a queue file of root's beside a user's")
def test_root_files_a_users_jobs_where_no_user_can_put_anything_first(tmp_path):
    me = Caller("nobody", 65534, 65534)
    tmp_path.chmod(0o1777)
    (tmp_path / "queue-65534.json").mkdir()  # planted at the name of the shared folder: not in root's way
    filed = jobs.add(tmp_path, me, ["img"], "/", check=lambda a, c: (0, ""))
    assert (tmp_path / ".reap" / "queue-65534.json").stat().st_uid == 0
    loaded = jobs.Queue(tmp_path).load()
    assert [j.id for j in loaded.jobs] == [filed.id] and loaded.root_filed == {65534}


def test_a_job_whose_gpus_are_busy_now_is_filed(tmp_path):
    filed = jobs.add(tmp_path, caller(), ["--gpus", "1", "img"], "/", check=lambda a, c: (jobs.BUSY, "busy"))
    assert [j.id for j in jobs.Queue(tmp_path).load().jobs] == [filed.id]


def test_queue_ls_shows_another_users_job_without_its_folder_command_or_error(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from imgbuild.cli import cli
    from imgbuild.servers import queue as module

    me = caller()
    other = jobs.Job("0000beef", "someone", me.uid + 7, me.uid + 7, 1.0, "/home/someone/secret-project",
                     ["-e", "TOKEN=x", "img", "--", "train.py"], "failed", detail="cannot read /home/someone/key")  # fmt: skip
    mine = job(me.name, 2)
    monkeypatch.setattr(module.Queue, "load", lambda self: setattr(self, "jobs", [other, mine]) or self)
    monkeypatch.setattr(Caller, "is_admin", property(lambda self: False))
    monkeypatch.setenv("IMGBUILD_CONFIG", str(tmp_path / "none.yaml"))
    listed = CliRunner().invoke(cli, ["queue", "ls", "--json"])
    assert [j["id"] for j in json.loads(listed.output)] == [mine.id]
    table = CliRunner().invoke(cli, ["queue", "ls"], terminal_width=200)
    assert "0000beef" in table.output and "someone" in table.output
    assert "secret-project" not in table.output and "train.py" not in table.output and "key" not in table.output


@pytest.mark.root("another user's files in the shared state folder")
def test_queue_files_a_user_makes_at_other_uids_names_are_never_opened(tmp_path, monkeypatch):
    """`queue-<uid>.json` names of other uids, and other spellings of one (`queue-0065534.json`), made by one user
    in the sticky state folder: only a file of the uid its name gives (or root's) is read."""
    import pwd

    tmp_path.chmod(0o1777)
    nobody = pwd.getpwnam("nobody")
    for name in [f"queue-{i}.json" for i in range(1, 200)] + [f"queue-0{nobody.pw_uid}.json"]:
        (tmp_path / name).write_text('{"jobs": []}')
        os.chown(tmp_path / name, nobody.pw_uid, nobody.pw_gid)
    read: list[int] = []
    real = jobs._read
    monkeypatch.setattr(
        jobs, "_read", lambda path, uid, root_only=False: read.append(uid) or real(path, uid, root_only)
    )
    jobs.Queue(tmp_path).load()
    assert read == []
