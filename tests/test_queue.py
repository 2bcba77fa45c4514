"""The batch queue. Order and fairness as tables, the files' trust rules against forged
entries, advancing with a scripted start; the real engine with two users through sudo is in test_enforce.py."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from imgbuild.errors import UsageError
from imgbuild.host import Caller, caller
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
    "args, check, message",
    [
        (["-d", "img"], (0, ""), "starts detached"),
        (["--wait", "1h", "img"], (0, ""), "waits in the queue"),
        (["--user", "0", "img"], (2, "--user: under this server's rules containers run as you"), "--user: under"),
    ],
)
def test_a_job_is_checked_before_it_is_filed(tmp_path, args, check, message):
    with pytest.raises(UsageError, match=message):
        jobs.add(tmp_path, caller(), args, "/", check=lambda a, c: check)
    assert jobs.Queue(tmp_path).load().jobs == []


def test_a_job_whose_gpus_are_busy_now_is_filed(tmp_path):
    filed = jobs.add(tmp_path, caller(), ["--gpus", "1", "img"], "/", check=lambda a, c: (jobs.BUSY, "busy"))
    assert [j.id for j in jobs.Queue(tmp_path).load().jobs] == [filed.id]
