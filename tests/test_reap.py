"""Deadlines, idle reaping, old containers, unnamed containers, notices and the action log.

The decisions are a pure function tested as tables; one test drives real containers on the test bed,
with GPU readings from snapshots and the time injected (no test sleeps for real)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from imgbuild.config.site import reap_policy, run_rules
from imgbuild.engine.types import ContainerInfo
from imgbuild.errors import UsageError
from imgbuild.gpu.read import Gpu
from imgbuild.hostio.host import caller
from imgbuild.servers import usage
from imgbuild.servers.containers import effective_deadline
from imgbuild.servers.ledger import Extension
from imgbuild.servers.reap import Action, State, decide, idle_since, load_state, reap, save_state, write_notice
from imgbuild.servers.run import prepare
from imgbuild.servers.runwords import RunRequest
from tests.conftest import IMGBUILD, run_words, use_site_config
from tests.support import users_home

ME = caller().name
H = 3600.0
RULES = reap_policy({"idle_timeout": "2h", "warn_lead": "30m", "exited_max_age": "7d"})


def row(name: str, status: str = "running", **extra) -> ContainerInfo:
    fields = {"id": name[-12:], "user": name.split("_")[0], "status": status, "labelled": True, **extra}
    return ContainerInfo(name, **fields)


def verbs(actions: list[Action]) -> list[tuple[str, str, str]]:
    return [(a.verb, a.name, a.rule) for a in actions]


def run_decide(rows, state=None, now=100 * H, rules=RULES, deadlines=None):
    return decide(rows, state or State(), now, rules, deadlines or {}, known_user=lambda u: u in ("alice", "bob"))


# --- the rules, as tables -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "warned", "expected"),
    [
        (10 * H - 31 * 60, {}, []),  # before the warning window
        (10 * H - 30 * 60, {}, [("warn", "alice_a_1", "deadline")]),  # warned a lead ahead
        (10 * H - 10 * 60, {"deadline": 10 * H - 30 * 60}, []),  # warned: nothing until the deadline
        (10 * H, {"deadline": 10 * H - 30 * 60}, [("stop", "alice_a_1", "deadline")]),
        (12 * H, {}, [("warn", "alice_a_1", "deadline")]),  # never warned (reap was down): warn first
        (12 * H + 29 * 60, {"deadline": 12 * H}, []),
        (12 * H + 30 * 60, {"deadline": 12 * H}, [("stop", "alice_a_1", "deadline")]),
    ],
)
def test_a_deadline_is_warned_then_enforced(now, warned, expected):
    state = State(warned={"alice_a_1": warned} if warned else {})
    assert verbs(run_decide([row("alice_a_1")], state, now, deadlines={"alice_a_1": 10 * H})) == expected


def test_an_extended_deadline_is_warned_again():
    state = State(warned={"alice_a_1": {"deadline": 10 * H - 30 * 60}})
    moved = {"alice_a_1": 34 * H}  # `extend 1d` after the first warning
    assert run_decide([row("alice_a_1")], state, 20 * H, deadlines=moved) == []
    assert verbs(run_decide([row("alice_a_1")], state, 34 * H - 30 * 60, deadlines=moved)) == [
        ("warn", "alice_a_1", "deadline")
    ]


def samples(pattern: str, end: float, step: float = 600) -> list[list[float]]:
    """'i' idle, 'b' busy, one per `step` seconds, the last at `end`."""
    return [[end - step * (len(pattern) - 1 - i), 1.0 if c == "b" else 0.0] for i, c in enumerate(pattern)]


@pytest.mark.parametrize(
    ("pattern", "warned", "expected"),
    [
        ("b" * 30, {}, []),  # busy: never
        ("i" * 12, {}, []),  # idle 1 h 50 min: not yet
        ("i" * 13, {}, [("warn", "bob_x_1", "idle")]),  # idle 2 h
        ("i" * 14, {"idle": 100 * H - 600}, []),  # warned 10 min ago
        ("i" * 17, {"idle": 100 * H - 1800}, [("stop", "bob_x_1", "idle")]),  # warned 30 min ago, still idle
        ("i" * 20 + "b", {"idle": 100 * H - 1800}, []),  # busy again: never stopped
        ("b" * 5 + "i" * 3, {}, []),  # idle only since the last busy sample
        ("", {}, []),  # no samples (no GPUs, or just started)
    ],
)
def test_idle_gpus_are_warned_then_stopped_and_a_busy_container_never(pattern, warned, expected):
    state = State(samples={"bob_x_1": samples(pattern, 100 * H)}, warned={"bob_x_1": warned} if warned else {})
    assert verbs(run_decide([row("bob_x_1")], state)) == expected


def test_idle_since_is_the_start_of_the_trailing_idle_run():
    assert idle_since([]) is None
    assert idle_since([[1, 0], [2, 1], [3, 0], [4, 0]]) == 3
    assert idle_since([[1, 0], [2, 1]]) is None


@pytest.mark.parametrize(
    ("container", "rules", "expected"),
    [
        (row("alice_old_1", "exited", finished_ts=90 * H), RULES, []),  # removing is not asked for
        (row("alice_old_1", "exited", finished_ts=90 * H), replace(RULES, remove=True), []),  # 110 h: too young
        (
            row("alice_old_1", "exited", finished_ts=1 * H),
            replace(RULES, remove=True),
            [("remove", "alice_old_1", "exited")],
        ),  # fmt: skip
        (
            row("alice_new_1", "created", created_ts=1 * H),
            replace(RULES, remove=True),
            [("remove", "alice_new_1", "exited")],
        ),  # fmt: skip
        (row("registry", "exited", finished_ts=1 * H, labelled=False), replace(RULES, remove=True), []),  # not a user's
        (row("registry", labelled=False), RULES, []),  # unnamed: left alone unless the site says
        (row("registry", labelled=False), replace(RULES, unnamed=True), [("stop", "registry", "unnamed")]),
        (row("registry", labelled=False), replace(RULES, unnamed=True, exempt=["regis*"]), []),
        (
            row("mallory_x_1", labelled=False),
            replace(RULES, unnamed=True),
            [("stop", "mallory_x_1", "unnamed")],
        ),  # no such user  # fmt: skip
        (row("bob_x_1", labelled=False), replace(RULES, unnamed=True), []),  # named by hand after a real user
        (row("alice_a_1", smoke=True), replace(RULES, unnamed=True), []),  # smoke containers are imgbuild's own
    ],
)
def test_old_unnamed_and_exempt_containers(container, rules, expected):
    assert verbs(run_decide([container], now=200 * H, rules=rules)) == expected


def test_with_remove_set_the_final_action_removes():
    state = State(warned={"alice_a_1": {"deadline": 0.0}})
    rules = replace(RULES, remove=True)
    assert verbs(run_decide([row("alice_a_1")], state, rules=rules, deadlines={"alice_a_1": 1.0})) == [
        ("remove", "alice_a_1", "deadline")
    ]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"idle_timeout": "soon"}, "reap.idle_timeout"),
        ({"warn_lead": "-1"}, "reap.warn_lead"),
        ({"remove": "maybe"}, "reap.remove"),
        ({"idle_percent": 101}, "idle_percent"),
        ({"exempt": "registry"}, "reap.exempt"),
        ({"log": "reap.log"}, "reap.log"),
        ({"reap_everything": True}, "unknown setting"),
    ],
)
def test_bad_reap_settings_are_refused(setting, message):
    with pytest.raises(UsageError, match=message):
        reap_policy(setting)


def test_time_and_its_site_maximum():
    house = run_rules({"default_time": "1d", "max_time": "3d"})
    assert house.default_seconds == 86400 and house.max_seconds == 3 * 86400
    with pytest.raises(UsageError, match=r"--time 4d: this site allows at most 3d \(run.max_time\)"):
        prepare(RunRequest("img", ["true"], time="4d"), _settings(), house=house)
    spec = prepare(RunRequest("img", ["true"], time="2h"), _settings(), house=house)
    assert spec.deadline is not None and abs(spec.deadline - time.time() - 7200) < 60
    assert f"org.imgbuild.deadline={spec.deadline:.0f}" in run_words(spec)
    default = prepare(RunRequest("img", ["true"]), _settings(), house=house)
    assert default.deadline is not None and abs(default.deadline - time.time() - 86400) < 60
    assert prepare(RunRequest("img", ["true"]), _settings(), house=run_rules({})).deadline is None
    # `extend` moves a deadline, never past the start plus max_time, whatever the ledger says
    container = ContainerInfo("alice_x_1", id="abc", deadline=100.0, created_ts=0.0, user="alice")
    assert effective_deadline(container, {"abc": Extension(50.0, "alice")}, house) == 100.0
    assert effective_deadline(container, {"abc": Extension(5000.0, "alice")}, house) == 5000.0
    assert effective_deadline(container, {"abc": Extension(5000.0, "mallory")}, house) == 100.0  # not hers
    assert effective_deadline(container, {"abc": Extension(10**9, "alice")}, house) == 3 * 86400


def _settings():
    from imgbuild.config.settings import load_settings

    return load_settings({})


# --- state, notices ----------------------------------------------------------------------------------------


def test_state_written_by_anyone_else_is_not_believed(tmp_path):
    path = tmp_path / "reap-state.json"
    save_state(path, State({"x": [[1.0, 0.0]]}, {"x": {"idle": 1.0}}))
    assert load_state(path).samples == {"x": [[1.0, 0.0]]}
    os.chmod(path, 0o666)  # writable by others: forged idle samples would stop a busy job
    assert load_state(path) == State()
    os.chmod(path, 0o644)
    path.write_text("{not json")
    assert load_state(path) == State()
    (tmp_path / "link.json").symlink_to(path)
    with pytest.raises(Exception, match="cannot read"):
        load_state(tmp_path / "link.json")


def test_notices_go_to_a_file_the_user_owns_never_through_a_link(tmp_path, monkeypatch):
    home = users_home(tmp_path, monkeypatch)
    assert write_notice("someone", "first")
    assert write_notice("someone", "second")
    assert (home / "imgbuild-notices.txt").read_text() == "first\nsecond\n"
    (home / "imgbuild-notices.txt").unlink()
    target = tmp_path / "shadow"
    target.write_text("root:x\n")
    (home / "imgbuild-notices.txt").symlink_to(target)
    assert not write_notice("someone", "pwned") and target.read_text() == "root:x\n"


# --- real containers ---------------------------------------------------------------------------------------


def gpu(index: int, util: int) -> Gpu:
    return Gpu(index, f"GPU-{index:08d}-reap", "NVIDIA A100-SXM4-80GB", 1000, 81920, util)


@pytest.mark.alone
@pytest.mark.engine
@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_reap_on_real_containers(testbed, docker_client, tmp_path, unique, monkeypatch):
    """A deadline passed is warned then stopped; an idle container is warned, then stopped after the lead
    time, a busy one never; a never-started container is removed only when the site allows it; an unnamed
    one only when the site says; dry-run lists exactly what the run does; a second run does nothing more."""
    from imgbuild.engine import Engine
    from tests.conftest import run_cli

    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [gpu(0, 0).to_json(), gpu(1, 93).to_json()]}))
    state = tmp_path / "state"
    config = tmp_path / "config.yaml"
    config.write_text(f"run:\n  ulimits: {{memlock: 8388608}}\n  gpu_flag: env\n  state_dir: {state}\n")
    env = {"IMGBUILD_CONFIG": str(config), "IMGBUILD_SITE_CONFIG": str(config), "IMGBUILD_GPU_SNAPSHOT": str(snapshot)}
    monkeypatch.setenv("IMGBUILD_CONFIG", str(config))
    use_site_config(monkeypatch, str(config))  # the site's rules
    late, idle, busy = (f"{ME}_{n}{unique}_1" for n in ("late", "idle", "busy"))
    never, unnamed = f"{ME}_never{unique}_1", f"handmade{unique}"
    notices: list[tuple[str, str]] = []
    job = ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]  # a job that ends on SIGTERM, as a trainer does
    try:
        for short, flags in (("late", ["--time", "60"]), ("idle", ["--gpus", "device=0"]), ("busy", ["--gpus", "device=1"])):  # fmt: skip
            res = run_cli("run", "-d", *flags, "--name", f"{short}{unique}", image, "--", *job, cwd=tmp_path, env=env)  # fmt: skip
            assert res.code == 0, res.err
        subprocess.run(["docker", "create", "--name", never, "--label", f"org.imgbuild.user={ME}", image, "true"], check=True, capture_output=True)  # fmt: skip
        subprocess.run(["docker", "run", "-d", "--name", unnamed, image, *job], check=True, capture_output=True)  # fmt: skip
        engine = Engine.connect(None)
        house = run_rules({"state_dir": str(state)})
        rules = reap_policy({"idle_timeout": "2h", "warn_lead": "30m", "exited_max_age": "1d"})
        gpus = [gpu(0, 0), gpu(1, 93)]
        t0 = time.time()

        def run(now, rules=rules, dry=False):
            report = reap(
                engine, gpus, house, rules, now, dry_run=dry, notify=lambda u, t: notices.append((u, t)) or True
            )
            return {(a.verb, a.name, a.rule) for a in report.actions if unique in a.name}

        assert run(t0 + 61, dry=True) == {("warn", late, "deadline")}
        assert run(t0 + 61) == {("warn", late, "deadline")}  # the late one's deadline passed: warned first
        assert run(t0 + 62) == set()  # a second run does nothing more
        logs = docker_client.containers.get(late).logs().decode()
        assert f"imgbuild reap: {late} will be stopped at about" in logs and "its deadline passed" in logs
        assert notices and notices[0][0] == ME and late in notices[0][1]
        assert run(t0 + 2 * H + 120) == {("stop", late, "deadline"), ("warn", idle, "idle")}
        assert docker_client.containers.get(late).status == "exited"
        expected = {("stop", idle, "idle")}
        assert run(t0 + 2 * H + 33 * 60, dry=True) == expected
        assert run(t0 + 2 * H + 33 * 60) == expected  # dry-run listed exactly this
        assert run(t0 + 2 * H + 34 * 60) == set()
        assert docker_client.containers.get(idle).status == "exited"
        assert docker_client.containers.get(busy).status == "running"  # busy: never
        assert docker_client.containers.get(never).status == "created"  # removing was not asked for
        everything = replace(rules, remove=True, unnamed=True)
        later = run(t0 + 2 * 86400, rules=everything)
        assert (("remove", never, "exited") in later) and (("remove", unnamed, "unnamed") in later)
        assert ("remove", late, "exited") in later and ("remove", idle, "exited") in later
        names = {c.name for c in docker_client.containers.list(all=True)}
        assert never not in names and unnamed not in names and busy in names
        log = [json.loads(line) for line in (state / ".reap" / "reap.log").read_text().splitlines()]
        mine = [entry for entry in log if unique in entry["name"]]
        assert sorted((e["verb"], e["rule"], e["name"]) for e in mine[:4]) == [
            ("stop", "deadline", late),
            ("stop", "idle", idle),
            ("warn", "deadline", late),
            ("warn", "idle", idle),
        ]
        assert all(e["outcome"] in ("stopped", "removed") or e["outcome"].startswith("warned") for e in mine)
        # each run recorded what the GPUs were held for since the previous run (capped at 15
        # minutes): the busy container (GPU 1 at 93%) was running at all six runs, the idle one until it stopped.
        records = usage.read(state / ".reap")
        for rec in records:
            rec["holds"] = [h for h in rec["holds"] if unique in h["container"]]
        by_gpu = {r.key: r for r in usage.summarize(records, "gpu")}
        assert set(by_gpu) == {gpu(0, 0).uuid, gpu(1, 93).uuid}
        assert by_gpu[gpu(1, 93).uuid].held_hours * H == pytest.approx(1 + 900 + 900 + 60 + 900)
        assert by_gpu[gpu(1, 93).uuid].used_hours * H == pytest.approx(0.93 * 2761)
        assert by_gpu[gpu(0, 0).uuid].held_hours * H == pytest.approx(1 + 900 + 900)
        assert by_gpu[gpu(0, 0).uuid].used_hours == 0
        assert [r.key for r in usage.summarize(records, "user")] == [ME]
        cli = run_cli("reap", "--dry-run", "--json", env=env)
        assert cli.code == 0, cli.err
        assert isinstance(json.loads(cli.out), list)
    finally:
        for name in (late, idle, busy, never, unnamed):
            with contextlib.suppress(Exception):
                docker_client.containers.get(name).remove(force=True)


@pytest.mark.alone
@pytest.mark.engine
@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_deadlines_extend_lost_gpus_and_a_second_shell_on_real_containers(testbed, docker_client, tmp_path, unique):
    """`run --time` labels the deadline, `ps` shows the time left, `extend` moves it within the site's
    max_time; a container whose GPUs vanished (NVML: Unknown Error) is flagged by `ps` and `gpus` with the
    fix; `shell` opens another shell in a kept container, as the user."""
    from tests.conftest import run_cli

    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [gpu(0, 0).to_json(), gpu(1, 0).to_json()]}))
    config = tmp_path / "config.yaml"
    config.write_text(
        f"run:\n  ulimits: {{memlock: 8388608}}\n  gpu_flag: env\n  state_dir: {tmp_path / 'state'}\n  max_time: 2h\n"
    )
    env = {"IMGBUILD_CONFIG": str(config), "IMGBUILD_SITE_CONFIG": str(config), "IMGBUILD_GPU_SNAPSHOT": str(snapshot)}
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'Failed to initialize NVML: Unknown Error'\nexit 255\n")
    (tools / "nvidia-smi").chmod(0o755)
    smi = f"{tools / 'nvidia-smi'}:/usr/bin/nvidia-smi:ro"  # where NVIDIA's toolkit binds the host's
    dev, lost = f"{ME}_dev{unique}_1", f"{ME}_lost{unique}_1"
    try:
        res = run_cli("run", "-d", "--keep", "--time", "1h", "--name", f"dev{unique}", image, "--", "sleep", "600", cwd=tmp_path, env=env)  # fmt: skip
        assert res.code == 0, res.err
        res = run_cli("run", "-d", "--gpus", "device=1", "-v", smi, "--name", f"lost{unique}", image, "--", "sleep", "600", cwd=tmp_path, env=env)  # fmt: skip
        assert res.code == 0, res.err
        too_long = run_cli("run", "-d", "--time", "3h", image, "--", "true", cwd=tmp_path, env=env)
        assert too_long.code == 2 and "at most 2h (run.max_time)" in too_long.err
        rows = {r["name"]: r for r in json.loads(run_cli("ps", "--json", env=env).out)}
        assert rows[dev]["time_left"] in ("59m", "1h")
        refused = run_cli("extend", f"dev{unique}", "2h", env=env)
        assert refused.code == 2 and "allows 2h from its start (run.max_time)" in refused.err
        moved = run_cli("extend", f"dev{unique}", "30m", env=env)
        assert moved.code == 0 and "deadline" in moved.out, moved.err
        rows = {r["name"]: r for r in json.loads(run_cli("ps", "--json", env=env).out)}
        assert rows[dev]["time_left"] in ("1h 29m", "1h 30m")
        assert rows[lost]["gpus_lost"].startswith("GPUs lost (NVML: Unknown Error") and not rows[dev]["gpus_lost"]
        assert f"imgbuild stop --rm {lost}" in rows[lost]["gpus_lost"]
        shown = run_cli("gpus", env=env)
        assert f"{lost}: GPUs lost" in shown.err
        assert json.loads(run_cli("gpus", "--json", env=env).out)["lost"][0]["name"] == lost
        shell = subprocess.run(
            [*IMGBUILD, "shell", f"dev{unique}"],
            input="id -u; pwd\n", capture_output=True, text=True, env={**os.environ, **env}, timeout=120,
        )  # fmt: skip
        assert shell.returncode == 0 and shell.stdout.split() == [str(os.getuid()), "/workspace"], shell.stderr
    finally:
        for name in (dev, lost):
            with contextlib.suppress(Exception):
                docker_client.containers.get(name).remove(force=True)


@pytest.mark.alone
@pytest.mark.engine
def test_a_persistent_environment_with_passwordless_sudo(testbed, docker_client, tmp_path, write, cleanup_images):
    """`user: {sudo: true}` gives the recipe's user passwordless sudo in their own
    container (the image gains the sudo package); without it, sudo is absent."""
    from tests.conftest import in_image, run_cli

    recipe = write(
        "r.yaml",
        """
        name: devbox
        tag: sudo
        base: {framework: pytorch, tag: "24.05"}
        user: {name: dev, sudo: true}
        """,
    )
    cleanup_images.append("imgbuildtest/devbox:sudo")
    res = run_cli("build", str(recipe), "-o", str(tmp_path / "ctx"))
    assert res.code == 0, res.err
    out = in_image(
        docker_client,
        "imgbuildtest/devbox:sudo",
        """
        import os, subprocess
        root = subprocess.run(["sudo", "-n", "id", "-u"], capture_output=True, text=True, check=True).stdout.strip()
        print(os.getuid() != 0, root, oct(os.stat("/etc/sudoers.d/90-imgbuild-dev").st_mode & 0o777))
        """,
        user="dev",
    )
    assert out.split() == ["True", "0", "0o440"]
    plain = write("p.yaml", 'name: devbox\ntag: plain\nbase: {framework: pytorch, tag: "24.05"}\nuser: {name: dev}\n')
    from imgbuild.recipe import load_recipe

    assert "sudo" not in load_recipe(plain).recipe.apt and load_recipe(recipe).recipe.apt == ["sudo"]


# --- notices of `run --notify` jobs ---------------------------------------------------

from imgbuild.servers.reap import job_notice  # noqa: E402

ENDED = {
    "id": "c1", "name": "alice_train_1", "user": "alice", "status": "exited", "notify": True, "exit_code": 0,
    "started_ts": 1000.0, "finished_ts": 1000.0 + 2 * H, "gpu_uuids": "GPU-a,GPU-b",
}  # fmt: skip


@pytest.mark.parametrize(
    "why, change, expected",
    [
        ("finished", {}, "alice_train_1 finished after 2h, 4.00 GPU-hours on 2 GPU(s)"),
        ("failed", {"exit_code": 3}, "alice_train_1 failed (exit 3) after 2h"),
        ("an exit code that is no number", {"exit_code": "3; rm -rf /"}, "failed (exit unknown)"),
        ("an exit code that is a bool", {"exit_code": True}, "failed (exit unknown)"),
        ("no start time: no hours made up", {"started_ts": None}, "after 0s, 0.00 GPU-hours"),
        ("GPUs by index", {"gpu_uuids": "", "gpus": "0,1,2"}, "on 3 GPU(s)"),
        ("still running", {"status": "running"}, None),
        ("not asked for", {"notify": False}, None),
        ("given already", {"id": "noticed-before"}, None),
        ("a name that is not the user's (a hand-made container naming a victim)", {"name": "mallory_x_1"}, None),
        ("no user", {"user": ""}, None),
    ],
)
def test_which_ended_jobs_get_a_notice_and_what_it_says(why, change, expected):
    notice = job_notice(ContainerInfo(**{**ENDED, **change}), {"noticed-before": 1.0})
    if expected is None:
        assert notice is None, why
        return
    assert notice is not None and expected in notice[0], (why, notice)
    text, facts = notice
    assert facts["IMGBUILD_NOTICE_TEXT"] == text and facts["IMGBUILD_NOTICE_USER"] == "alice"


def test_a_notify_command_by_relative_path_is_refused():
    with pytest.raises(UsageError, match="notify_command: 'mail': the program by absolute path"):
        reap_policy({"notify_command": ["mail", "-s", "done"]})


class _Containers:
    def __init__(self, rows):
        self._rows = rows

    def rows(self):
        return self._rows


class _Engine:
    def __init__(self, rows):
        self.containers = _Containers(rows)


def test_a_notice_is_given_once_with_the_facts_in_the_site_commands_environment(tmp_path):
    """The site's notify_command gets the facts as environment variables (a value with shell syntax stays data)
    and runs once per job; the notice line goes to the user's file; the action log records it."""
    out = tmp_path / "facts.json"
    command = tmp_path / "notify.py"
    command.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{k: v for k, v in os.environ.items() if k.startswith('IMGBUILD_NOTICE_')}} | "
        f"{{'argv': sys.argv[1:]}}, open({str(out)!r}, 'w'))\n"
    )
    command.chmod(0o755)
    rows = [ContainerInfo(**{**ENDED, "name": "alice_$(id)_1", "exit_code": 2})]
    house = run_rules({"state_dir": str(tmp_path / "state")})
    rules = reap_policy({"notify_command": [str(command), "--subject", "job ended"]})
    given: list[tuple[str, str]] = []
    for now in (5 * H, 5 * H + 300):
        reap(_Engine(rows), [], house, rules, now, notify=lambda u, t: given.append((u, t)) or True)
    assert len(given) == 1 and given[0][0] == "alice" and "alice_$(id)_1 failed (exit 2)" in given[0][1]
    facts = json.loads(out.read_text())
    assert facts["argv"] == ["--subject", "job ended"]
    assert facts["IMGBUILD_NOTICE_CONTAINER"] == "alice_$(id)_1" and facts["IMGBUILD_NOTICE_EXIT"] == "2"
    assert facts["IMGBUILD_NOTICE_GPU_HOURS"] == "4.0000" and facts["IMGBUILD_NOTICE_SECONDS"] == "7200"
    log = [json.loads(line) for line in (tmp_path / "state" / ".reap" / "reap.log").read_text().splitlines()]
    assert [(e["verb"], e["outcome"]) for e in log] == [("notice", "noticed (notice file, notify_command exit 0)")]


@pytest.mark.alone
@pytest.mark.engine
@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_run_notify_on_a_real_container_leaves_one_notice(testbed, docker_client, tmp_path, unique, monkeypatch):
    """`imgbuild run --notify` keeps the container when it ends (a foreground run is otherwise removed), and the
    reaper's next run leaves one notice naming its exit code."""
    from imgbuild.engine import Engine
    from tests.conftest import run_cli

    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    state = tmp_path / "state"
    config = tmp_path / "config.yaml"
    config.write_text(f"run:\n  ulimits: {{memlock: 8388608}}\n  gpu_flag: env\n  state_dir: {state}\n")
    env = {"IMGBUILD_CONFIG": str(config), "IMGBUILD_SITE_CONFIG": str(config)}
    name = f"{ME}_notify{unique}_1"
    try:
        res = run_cli("run", "--notify", "--name", f"notify{unique}", image, "--", "sh", "-c", "exit 3", cwd=tmp_path, env=env)  # fmt: skip
        assert res.code == 3, res.err
        assert docker_client.containers.get(name).status == "exited"  # kept for the notice
        given: list[tuple[str, str]] = []
        house, rules = run_rules({"state_dir": str(state)}), reap_policy({})
        for now in (time.time(), time.time() + 300):
            reap(Engine.connect(None), [], house, rules, now, notify=lambda u, t: given.append((u, t)) or True)
        mine = [(u, t) for u, t in given if name in t]
        assert len(mine) == 1 and mine[0][0] == ME and f"{name} failed (exit 3)" in mine[0][1], given
    finally:
        with contextlib.suppress(Exception):
            docker_client.containers.get(name).remove(force=True)


def _img(ref: str, image_id: str, created: float, size: int = 100) -> object:
    from imgbuild.engine.types import LocalImage

    return LocalImage(ref, image_id, size, created)


def test_users_images_unused_past_the_sites_age_are_discarded_and_none_a_container_needs():
    from imgbuild.servers.reap import decide_images

    day = 86400.0
    now = 100 * day
    images = [
        _img("alice/old:1", "sha256:a", 0),  # unused for 100 days: goes
        _img("alice/fresh:1", "sha256:b", now - day),  # built yesterday: stays
        _img("alice/run:1", "sha256:c", 0),  # a running container's: stays
        _img("alice/run:1-previous", "sha256:d", 0),  # the way back from the running tag: stays
        _img("alice/stopped:1", "sha256:e", 0),  # an exited container's: stays (the engine needs it)
        _img("alice/seen:1", "sha256:f", 0),  # a container used it last week (the reaper saw it): stays
        _img("nvcr.io/nvidia/pytorch:24.05-py3", "sha256:g", 0),  # not a user's: never the reaper's
        _img("nobodyknown/x:1", "sha256:h", 0),  # no such user on this host
    ]
    rows = [ContainerInfo("alice_run_1", image="alice/run:1", image_id="sha256:c", status="running"),
            ContainerInfo("alice_old_1", image="alice/stopped:1", image_id="sha256:e", status="exited")]  # fmt: skip
    state = State(images_used={"sha256:f": now - 7 * day})
    rules = reap_policy({"image_max_age": "30d"})
    actions = decide_images(images, rows, state, now, rules, lambda user: user == "alice")  # type: ignore[arg-type]
    assert [(a.verb, a.name, a.user, a.rule) for a in actions] == [("discard", "alice/old:1", "alice", "image")]
    assert decide_images(images, rows, state, now, reap_policy({}), lambda u: True) == []  # type: ignore[arg-type]


def test_reap_discards_through_the_engine_and_remembers_what_containers_used(tmp_path, monkeypatch):
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.servers import reap as reaper

    monkeypatch.setattr(reaper, "known_user", lambda name: name == "alice")
    engine = FakeEngine()
    old = engine.add_image("alice/old:1")
    used = engine.add_image("alice/used:1")
    engine.images.listed = {old: (10, 0.0), used: (20, 0.0)}
    engine.containers.listed = [ContainerInfo("alice_u_1", image="alice/used:1", image_id=used, status="running")]
    house = run_rules({"state_dir": str(tmp_path)})
    rules = reap_policy({"image_max_age": "1d"})
    report = reap(engine, [], house, rules, 10 * 86400.0, notify=lambda u, t: True)  # type: ignore[arg-type]
    assert [(a.verb, a.name) for a in report.actions if a.verb == "discard"] == [("discard", "alice/old:1")]
    assert "discard alice/old:1" in engine.calls and report.outcomes[-1] == "removed"
    assert load_state(tmp_path / ".reap" / "reap-state.json").images_used == {used: 10 * 86400.0}


def test_usage_disk_counts_each_users_distinct_images_once():
    rows = usage.disk_use(
        [
            _img("alice/a:1", "sha256:1", 0, 500),
            _img("alice/a:latest", "sha256:1", 0, 500),  # one image, two tags
            _img("alice/b:1", "sha256:2", 0, 300),
            _img("bob/c:1", "sha256:3", 0, 2000),
            _img("nvcr.io/nvidia/pytorch:1", "sha256:4", 0, 9000),
        ],  # fmt: skip
        lambda user: user in ("alice", "bob"),
    )  # type: ignore[arg-type]
    assert [r.to_json() for r in rows] == [
        {"user": "bob", "images": 1, "tags": 1, "bytes": 2000},
        {"user": "alice", "images": 2, "tags": 3, "bytes": 800},
    ]


def _site_env(tmp_path, extra: str = "") -> dict[str, str]:
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [gpu(0, 0).to_json()]}))
    config = tmp_path / "config.yaml"
    config.write_text(
        f"run:\n  ulimits: {{memlock: 8388608}}\n  gpu_flag: env\n  state_dir: {tmp_path / 'state'}\n{extra}"
    )
    return {"IMGBUILD_CONFIG": str(config), "IMGBUILD_SITE_CONFIG": str(config), "IMGBUILD_GPU_SNAPSHOT": str(snapshot)}


@pytest.mark.alone
@pytest.mark.engine
@pytest.mark.timeout(120)
@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_a_run_with_or_without_gpus_is_stopped_at_its_memory_and_pids_caps(testbed, tmp_path):
    from tests.conftest import run_cli

    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    env = _site_env(tmp_path, "  memory: 96m\n  pids_limit: 40\n")
    job = (
        "import subprocess\nstarted = []\n"
        "for _ in range(100):\n"
        "    try:\n        started.append(subprocess.Popen(['sleep', '30']))\n"
        "    except OSError:\n        break\n"
        "print('STARTED', len(started), flush=True)\n"
        "for p in started:\n    p.kill()\n"
        "held = bytearray(400 * 2**20)\nprint('ALLOCATED', flush=True)\n"
    )
    for gpus in ("none", "device=0"):
        res = run_cli("run", "--gpus", gpus, "--no-workspace", image, "--", "python3", "-c", job, cwd=tmp_path, env=env)
        started = int(res.out.split("STARTED", 1)[1].split()[0]) if "STARTED" in res.out else -1
        assert 0 <= started < 40, (gpus, res.out, res.err)  # the pids cap, not the 100 asked for
        assert "ALLOCATED" not in res.out and res.code == 137, (gpus, res.code, res.err)  # killed at 96 MiB


@pytest.mark.alone
@pytest.mark.engine
@pytest.mark.timeout(120)
@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_a_container_whose_sh_and_nvidia_smi_never_return_stalls_neither_ps_nor_reap(
    testbed, docker_client, tmp_path, unique, monkeypatch
):
    from imgbuild.config.settings import load_settings
    from imgbuild.engine import connect_engine
    from imgbuild.engine import containers as module
    from imgbuild.servers.containers import container_view
    from tests.conftest import run_cli

    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    env = _site_env(tmp_path)
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/bash\nexec sleep 600\n")
    hang.chmod(0o755)
    name = f"{ME}_trap{unique}_1"
    mounts = ["-v", f"{hang}:/bin/sh:ro", "-v", f"{hang}:/usr/bin/nvidia-smi:ro"]
    try:
        res = run_cli("run", "-d", "--gpus", "device=0", "--no-workspace", *mounts, "--name", f"trap{unique}",
                      "--entrypoint", "sleep", image, "--", "120", cwd=tmp_path, env=env)  # fmt: skip
        assert res.code == 0, res.err
        monkeypatch.setattr(module, "EXEC_SECONDS", 2)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        use_site_config(monkeypatch, env["IMGBUILD_SITE_CONFIG"])
        settings = load_settings({})
        engine = connect_engine(settings)
        began = time.monotonic()
        rows = container_view(engine, settings)
        assert name in {r["name"] for r in rows}
        assert engine.containers.note(name, "imgbuild reap: a warning") is False
        assert time.monotonic() - began < 10  # two bounds of 2 s, not the SDK's 600
    finally:
        with contextlib.suppress(Exception):
            docker_client.containers.get(name).remove(force=True)
