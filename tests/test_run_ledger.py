"""GPUs chosen and started atomically across users (the host's ledger), CPUs
pinned near the chosen GPUs with the thread variables to match."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imgbuild.engine.types import ContainerInfo
from imgbuild.errors import EnvironmentProblem, UsageError
from imgbuild.gpu.allocate import pick_cpus, select_gpus
from imgbuild.gpu.read import Gpu, numa_cpus
from imgbuild.hostio.host import caller, format_cpulist, parse_cpulist, process_start
from imgbuild.servers.holds import held_on_host
from imgbuild.servers.ledger import Entry, Ledger, alive
from imgbuild.servers.run import prepare
from imgbuild.servers.runwords import RunRequest
from tests.conftest import IMGBUILD, ROOT, run_words, use_site_config

ME = caller().name


def gpu(index: int, cpus: str = "", used: int = 0) -> Gpu:
    return Gpu(index, f"GPU-{index:08d}-aaaa", "NVIDIA H100 80GB HBM3", used, 81559, 0, cpu_affinity=cpus)


#: A DGX H100 as its topology reads: 8 GPUs, two sockets of 56 cores (and their SMT siblings).
DGX = [gpu(i, "0-55,112-167" if i < 4 else "56-111,168-223") for i in range(8)]


# --- the ledger ---------------------------------------------------------------------------------------


def test_an_entry_lives_while_its_process_lives(tmp_path):
    ledger = Ledger(tmp_path / "state")
    me = caller().name  # a user's own file names only them (root's may name anyone)
    with ledger.transaction() as book:
        mine = book.add(f"{me}_train_1", me, ["GPU-1"], [0, 1])
    assert alive(mine) and ledger.entries() == [mine]
    assert oct((tmp_path / "state").stat().st_mode & 0o7777) == "0o1777"  # every user of the host writes it
    own = tmp_path / "state" / f"ledger-{os.getuid()}.json"  # each user writes a file of their own
    assert own.stat().st_uid == os.getuid() and oct(own.stat().st_mode & 0o777) == "0o644"
    # A killed run leaves an entry whose process is gone: the next reader drops it.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = Entry("bob_lm_1", "bob", dead.pid, "12345", ["GPU-2"], [])
    assert not alive(gone)
    # A reused PID is not the same run: our own PID with another start time.
    reused = Entry("bob_lm_2", "bob", os.getpid(), "1", ["GPU-3"], [])
    assert process_start(os.getpid()) != "1" and not alive(reused)
    with ledger.transaction() as book:
        book.entries += [gone, reused]
    assert ledger.entries() == [mine]
    ledger.drop(f"{me}_train_1")
    assert ledger.entries() == []


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b'{"entries": [{"name": 1}]}',
        b'{"entries": "x"}',
        b"[]",
        b"{" * 100_000,
        b"\xff\xfe",
    ],
    ids=["garbage", "wrong-fields", "wrong-type", "a-list", "deep", "binary"],
)
def test_a_vandalised_ledger_reads_as_empty_and_is_rewritten(tmp_path, content):
    state = tmp_path / "state"
    state.mkdir()
    own = state / f"ledger-{os.getuid()}.json"
    own.write_bytes(content)
    ledger = Ledger(state)
    assert ledger.entries() == []
    assert json.loads(own.read_text()) == {"entries": [], "extended": {}}


def test_a_linked_ledger_or_state_folder_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (state / "ledger.lock").symlink_to(victim)
    if os.geteuid() == 0:  # root removes what was planted at its name, and never follows it
        assert Ledger(state).entries() == []
        assert not (state / "ledger.lock").is_symlink()
    else:
        with pytest.raises(EnvironmentProblem, match="is a symbolic link"):
            Ledger(state).entries()
    assert victim.read_text() == "precious"
    (state / "ledger.lock").unlink()
    (state / f"ledger-{os.getuid()}.json").unlink(missing_ok=True)
    (state / f"ledger-{os.getuid()}.json").symlink_to(victim)  # replaced by rename, never written through
    assert Ledger(state).entries() == [] and victim.read_text() == "precious"
    (tmp_path / "file").write_text("")
    with pytest.raises(EnvironmentProblem, match="state folder"):
        Ledger(tmp_path / "file").entries()


# --- selection against what is held -----------------------------------------------------------------


def test_gpus_held_by_containers_and_starting_runs_are_not_free():
    """A container holds its GPUs from its start, not from its first CUDA call; a run that has chosen
    GPUs but not started holds them through the ledger."""
    gpus = [gpu(i) for i in range(4)]
    rows = [
        ContainerInfo("bob_lm_1", user="bob", status="running", gpu_uuids=gpus[0].uuid, cpuset="0-3"),
        ContainerInfo("carol_old_1", user="carol", status="running", gpus="1", gpu_uuids=""),  # indices only
        ContainerInfo("dave_x_1", user="dave", status="exited", gpu_uuids=gpus[3].uuid),  # exited: holds nothing
        ContainerInfo(f"{ME}_dev_1", user=ME, status="running", gpu_uuids=gpus[3].uuid, cpuset="2"),
    ]
    entries = [Entry("erin_bert_2", "erin", 1, "1", [gpus[2].uuid], [4, 5])]
    held = held_on_host(rows, entries, gpus)
    assert held.cpus == {0: 1, 1: 1, 2: 2, 3: 1, 4: 1, 5: 1}
    with pytest.raises(UsageError) as refused:
        select_gpus("1", gpus, ME, claims=held.gpus)
    message = str(refused.value)
    assert "only 0 of 4 GPUs are free" in message
    for holder in ("bob (container bob_lm_1)", "carol (container carol_old_1)", "erin (erin_bert_2 starting)"):
        assert holder in message
    assert f"GPU 3: your container {ME}_dev_1" in message
    with pytest.raises(UsageError, match=r"GPU 2 is in use by erin \(erin_bert_2 starting\)"):
        select_gpus("device=2", gpus, ME, claims=held.gpus)
    assert select_gpus("device=3", gpus, ME, claims=held.gpus).uuids == [gpus[3].uuid]  # yours, named: allowed
    assert select_gpus("device=0", gpus, "bob", claims=held.gpus).uuids == [gpus[0].uuid]  # bob's own, named


def test_a_host_port_a_starting_run_holds_is_not_anothers_to_publish(monkeypatch):
    """bob's `--jupyter` chose port 8890 a moment ago and holds it in the ledger until his container has it:
    alice's `-p 127.0.0.1:8890:80` (any spelling of it, a range over it) is refused, not raced to the engine."""
    from imgbuild.servers.spec import published_ports

    monkeypatch.setattr("imgbuild.servers.run.read_gpus_or_none", lambda settings: [])
    held = held_on_host([], [Entry("bob_nb_1", "bob", 1, "1", ports=[8890])], [])
    from imgbuild.config.settings import load_settings

    settings = load_settings({})
    for spec in ("127.0.0.1:8890:80", "8890:80", "127.0.0.1:8880-8899:80/tcp"):
        with pytest.raises(UsageError, match="host port 8890 is another run's"):
            prepare(RunRequest("ubuntu:22.04", ["true"], ports=[spec], no_workspace=True), settings, held)
    assert prepare(RunRequest("ubuntu:22.04", ["true"], ports=["127.0.0.1:8891:80"], no_workspace=True), settings, held)
    assert published_ports(["127.0.0.1:8891:80", "80", "127.0.0.1::80", "[::1]:9000:90/udp"]) == [8891, 9000]


def test_a_user_has_at_most_the_sites_containers_at_once_and_others_are_not_held_back(monkeypatch):
    """Every run has its memory and pids caps; `run.max_containers_per_user` bounds one user's runs together (and
    the engine's disk): stopped ones and starts under way count, script containers and other users' do not."""
    from imgbuild.config.settings import load_settings
    from imgbuild.config.site import run_rules

    monkeypatch.setattr("imgbuild.servers.run.read_gpus_or_none", lambda settings: [])
    rows = [ContainerInfo(f"{ME}_j_{i}", user=ME, status="exited") for i in range(2)]
    rows += [ContainerInfo("bob_j_1", user="bob", status="running"), ContainerInfo("x_1", user=ME, smoke=True)]
    held = held_on_host(rows, [Entry(f"{ME}_j_9", ME, 1, "1")], [])
    settings, req = load_settings({}), RunRequest("ubuntu:22.04", ["true"], no_workspace=True)
    with pytest.raises(UsageError, match=r"you have 3 containers.*run.max_containers_per_user"):
        prepare(req, settings, held, run_rules({"max_containers_per_user": 3}))
    assert prepare(req, settings, held, run_rules({"max_containers_per_user": 4}))
    assert run_rules({}).max_containers_per_user == 64


@pytest.mark.root("another user's files in the shared state folder")
def test_names_a_user_makes_by_the_thousand_in_the_state_folder_are_never_opened_or_looked_up(tmp_path, monkeypatch):
    """Every `run` reads the ledger under its lock: thousands of `ledger-<uid>.json` (and `ledger-000…1.json`)
    that nobody made in the sticky state folder cost every user seconds of user lookups and opens. Only a file
    owned by the uid its name gives is read: nobody's own."""
    import pwd

    from imgbuild.servers import ledger as ledger_module

    tmp_path.chmod(0o1777)
    nobody = pwd.getpwnam("nobody")
    for i in range(1, 301):
        for name in (f"ledger-{i:010d}.json", f"ledger-{i}.json"):
            path = tmp_path / name
            path.write_text('{"entries": []}')
            os.chown(path, nobody.pw_uid, nobody.pw_gid)
    for name in (f"ledger-{nobody.pw_uid}.json", f"ledger-0{nobody.pw_uid}.json"):  # the second: a spelling
        (tmp_path / name).write_text('{"entries": []}')
        os.chown(tmp_path / name, nobody.pw_uid, nobody.pw_gid)
    read: list[int] = []
    real = ledger_module._read_user_file
    monkeypatch.setattr(ledger_module, "_read_user_file", lambda path, uid: read.append(uid) or real(path, uid))
    Ledger(tmp_path).read()
    assert read == [nobody.pw_uid]


# --- CPUs -----------------------------------------------------------------------------------------------


def test_cpu_lists_round_trip_and_bad_ones_are_refused():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert parse_cpulist("") == [] and format_cpulist([]) == ""
    for bad in ("0-3;rm", "a", "1,,2", "-1", "0-3,"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)


def test_numa_cpus_come_from_the_gpus_pci_device(tmp_path):
    device = tmp_path / "bus/pci/devices/0000:c1:00.0"
    device.mkdir(parents=True)
    (device / "local_cpulist").write_text("56-111,168-223\n")
    assert numa_cpus("00000000:C1:00.0", tmp_path) == "56-111,168-223"
    assert numa_cpus("0000:c1:00.0", tmp_path) == "56-111,168-223"
    assert numa_cpus("00000000:C2:00.0", tmp_path) == ""  # not there: unknown, not an error
    assert numa_cpus("../../../../etc/passwd", tmp_path) == ""
    (device / "local_cpulist").write_text("garbage")
    assert numa_cpus("0000:c1:00.0", tmp_path) == ""


def test_cpus_are_pinned_near_the_gpus_and_away_from_other_containers():
    host = list(range(224))
    near = parse_cpulist(DGX[5].cpu_affinity)
    first = pick_cpus(24, near, host, {})
    assert first == list(range(56, 80))  # the GPU's own socket
    taken = dict.fromkeys(first, 1)
    second = pick_cpus(24, near, host, taken)
    assert second == list(range(80, 104))  # the same socket, not the first container's cores
    whole_socket = dict.fromkeys(near, 1)
    assert pick_cpus(8, near, host, whole_socket) == list(range(0, 8))  # socket full: free cores elsewhere
    everything = dict.fromkeys(host, 1)
    assert pick_cpus(4, near, host, {**everything, 60: 0}) == [56, 57, 58, 60]  # least shared, near first
    assert pick_cpus(2, [], [0, 1], {}) == []  # the whole host: nothing to pin


def test_run_pins_cpus_and_sets_threads_per_gpu_worker(tmp_path, monkeypatch):
    """`--cpus 48` alone let PyTorch see 256 cores (2147% CPU at num_workers=0)."""
    from imgbuild.config.settings import load_settings

    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [g.to_json() for g in DGX]}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    monkeypatch.setattr("imgbuild.hostio.host.usable_cpus", lambda: list(range(224)))
    settings = load_settings({})
    spec = prepare(RunRequest("ubuntu:22.04", ["python", "t.py"], gpu_request="device=4,5", cpus=48), settings)
    argv = run_words(spec)
    assert argv[argv.index("--cpuset-cpus") + 1] == "56-103"  # 48 CPUs on the GPUs' socket
    env = [argv[i + 1] for i, word in enumerate(argv) if word == "-e"]
    assert {"OMP_NUM_THREADS=24", "MKL_NUM_THREADS=24", "OPENBLAS_NUM_THREADS=24"} <= set(env)  # 48 / 2 GPUs
    own = run_words(
        prepare(
            RunRequest("ubuntu:22.04", ["true"], gpu_request="device=4", cpus=8, env=["OMP_NUM_THREADS=2"]), settings
        )
    )
    own_env = [own[i + 1] for i, word in enumerate(own) if word == "-e"]
    assert "OMP_NUM_THREADS=2" in own_env and "OMP_NUM_THREADS=8" not in own_env  # the user's -e wins
    cpu_job = run_words(prepare(RunRequest("ubuntu:22.04", ["true"], cpus=4), settings))
    assert "--cpuset-cpus" in cpu_job and "OMP_NUM_THREADS=4" in cpu_job
    config = tmp_path / "config.yaml"
    config.write_text("run: {pin_cpus: false}\n")
    monkeypatch.setenv("IMGBUILD_CONFIG", str(config))
    use_site_config(monkeypatch, str(config))  # the site's rules
    settings = load_settings({})
    unpinned = run_words(prepare(RunRequest("ubuntu:22.04", ["true"], gpu_request="device=4", cpus=8), settings))
    assert "--cpuset-cpus" not in unpinned and "OMP_NUM_THREADS=8" in unpinned  # threads still match the quota
    for bad, message in (
        ("{gpu_flag: nvidia}", "gpu_flag"),
        ("{pin_cpus: 3}", "pin_cpus"),
        ("{state_dir: x}", "state"),
    ):
        config.write_text(f"run: {bad}\n")
        with pytest.raises(UsageError, match=message):
            load_settings({})


# --- the race, for real -------------------------------------------------------------------------------


@pytest.mark.alone
@pytest.mark.engine
@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_two_runs_started_at_the_same_moment_get_different_gpus_and_cpus(testbed, docker_client, tmp_path, unique):
    """Two `--gpus 1` starts at the same moment got the same GPU. Two real containers
    started concurrently must hold different GPUs (as the nvidia runtime reads them) and CPUs; a third
    start is refused, naming both."""
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    two = [gpu(0, "0"), gpu(1, "1")]
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [g.to_json() for g in two]}))
    config = tmp_path / "config.yaml"
    config.write_text(
        "run:\n  ulimits: {memlock: 8388608}\n  gpu_flag: env\n"  # the engine has no GPU runtime: env mode
        f"  state_dir: {tmp_path / 'state'}\n"
    )
    env = {
        **os.environ,
        "IMGBUILD_CONFIG": str(config),
        "IMGBUILD_SITE_CONFIG": str(config),
        "IMGBUILD_GPU_SNAPSHOT": str(snapshot),
    }
    args = ["run", "-d", "--gpus", "1", "--cpus", "1", "--name", f"race{unique}", image, "--", "sleep", "120"]
    names = [f"{ME}_race{unique}_{n}" for n in (1, 2, 3)]
    try:
        starts = [
            subprocess.Popen(
                [*IMGBUILD, *args],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        results = [p.communicate(timeout=300) for p in starts]
        assert [p.returncode for p in starts] == [0, 0], results
        seen = {}
        for name in names[:2]:
            attrs = docker_client.containers.get(name).attrs
            visible = next(e for e in attrs["Config"]["Env"] if e.startswith("NVIDIA_VISIBLE_DEVICES="))
            seen[name] = (visible.split("=", 1)[1], attrs["HostConfig"]["CpusetCpus"])
            assert attrs["Config"]["Labels"]["org.imgbuild.gpu-uuids"] == seen[name][0]
        by_gpu = dict(seen.values())
        assert sorted(by_gpu) == [two[0].uuid, two[1].uuid], seen  # one GPU each
        assert by_gpu == {two[0].uuid: "0", two[1].uuid: "1"}  # each pinned to its GPU's own CPU
        third = subprocess.run([*IMGBUILD, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert third.returncode == 2 and "only 0 of 2 GPUs are free" in third.stderr
        assert names[0] in third.stderr and names[1] in third.stderr
        assert Ledger(tmp_path / "state").entries() == []  # started: the containers hold them now
    finally:
        for name in names:
            with contextlib.suppress(Exception):
                docker_client.containers.get(name).remove(force=True)


def test_a_killed_start_leaves_no_hold(tmp_path):
    """A run killed between choosing and starting (here: blocked in the engine) holds nothing after."""
    state = tmp_path / "state"
    code = (
        "import sys, time\n"
        "from imgbuild.servers.ledger import Ledger\n"
        f"with Ledger({str(state)!r}).transaction() as book:\n"
        f"    book.add('{caller().name}_x_1', {caller().name!r}, ['GPU-1'], [0])\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        assert [e.name for e in Ledger(state).entries()] == [f"{caller().name}_x_1"]
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while Ledger(state).entries() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Ledger(state).entries() == []


def test_the_run_that_loses_the_race_to_create_the_lock_opens_the_winners(tmp_path, monkeypatch):
    """CI stop 36: two starts on a fresh state folder both found the lock absent; the one whose O_EXCL
    create lost said "ledger.lock: File exists" (exit 3). The loser opens the file the winner made."""
    import imgbuild.hostio.regular as regular_module

    path = tmp_path / "ledger.lock"
    real_open = os.open
    calls: list[int] = []

    def racing_open(name, flags, mode=0o777):
        calls.append(flags)
        if len(calls) == 1:  # the plain open: absent ...
            raise FileNotFoundError(2, "No such file or directory")
        if len(calls) == 2:  # ... and before our create, the other run creates it
            Path(name).write_text("")
        return real_open(name, flags, mode)

    monkeypatch.setattr(regular_module.os, "open", racing_open)
    fd = regular_module.open_regular(path, os.O_RDWR | os.O_CREAT, 0o666)
    assert fd is not None
    os.close(fd)
    assert len(calls) == 3 and calls[1] & os.O_EXCL and not calls[2] & os.O_CREAT


@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_dry_run_does_not_touch_the_ledger(tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text(f"run: {{state_dir: {tmp_path / 'state'}}}\n")
    from tests.conftest import run_cli

    res = run_cli(
        "run",
        "--dry-run",
        "ubuntu:22.04",
        "--",
        "true",
        env={"IMGBUILD_CONFIG": str(config), "IMGBUILD_SITE_CONFIG": str(config)},
    )
    assert res.code == 0, res.err
    assert not Path(tmp_path / "state").exists()


# --- Jupyter on a shared server ----------------------------------------------------------------------


def test_jupyter_dry_run_binds_localhost_only_and_runs_jupyter_lab(tmp_path):
    from tests.conftest import run_cli

    res = run_cli("run", "--jupyter", "--dry-run", "ubuntu:22.04", cwd=tmp_path)
    assert res.code == 0, res.err
    import shlex

    argv = shlex.split(res.out.strip())
    published = argv[argv.index("-p") + 1]
    host, port, inner = published.split(":")
    assert host == "127.0.0.1" and 8888 <= int(port) < 9888 and inner == "8888"  # never on the host's network
    assert argv[-6:] == [
        "jupyter",
        "lab",
        "--ip=0.0.0.0",
        "--port=8888",
        "--no-browser",
        "--ServerApp.root_dir=/workspace",
    ]
    assert "-d" in argv and "--rm" not in argv
    tokens = [a for a in argv if a.startswith("JUPYTER_TOKEN=")]
    assert len(tokens) == 1 and len(tokens[0].split("=", 1)[1]) == 48
    assert "JUPYTER_RUNTIME_DIR=/tmp/jupyter/runtime" in argv  # the caller's UID may have no home in the image


@pytest.mark.alone
@pytest.mark.engine
@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_jupyter_gets_a_free_port_reachable_through_the_tunnel(testbed, docker_client, tmp_path, unique):
    """`run --jupyter` picks a port no container publishes, binds it to 127.0.0.1, prints the tunnel; a
    second one gets another port. (The stand-in has no JupyterLab: a web server stands in on 8888.)"""
    import urllib.request

    from tests.conftest import run_cli

    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    config = tmp_path / "config.yaml"
    config.write_text(f"run:\n  ulimits: {{memlock: 8388608}}\n  state_dir: {tmp_path / 'state'}\n")
    env = {"IMGBUILD_CONFIG": str(config), "IMGBUILD_SITE_CONFIG": str(config)}
    names = [f"{ME}_nb{unique}_{n}" for n in (1, 2)]
    (tmp_path / "hello.txt").write_text("from the workspace\n")
    (tmp_path / "api").write_text('{"version": "2.14.0"}')  # what Jupyter's /api answers: run waits for it
    try:
        ports = []
        for name in names:
            res = run_cli(
                "run", "--jupyter", "--name", f"nb{unique}", image, "--",
                "python3", "-m", "http.server", "8888", cwd=tmp_path, env=env,
            )  # fmt: skip
            assert res.code == 0, res.err
            tunnel = next(line for line in res.out.splitlines() if "ssh -N -L" in line)
            port = int(tunnel.split("-L ")[1].split(":")[0])
            assert f"ssh -N -L {port}:127.0.0.1:{port} {ME}@" in tunnel
            bindings = docker_client.containers.get(name).attrs["HostConfig"]["PortBindings"]
            assert bindings == {"8888/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
            ports.append(port)
        assert ports[0] != ports[1]
        deadline = time.monotonic() + 60
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/hello.txt", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert body == b"from the workspace\n"
    finally:
        for name in names:
            with contextlib.suppress(Exception):
                docker_client.containers.get(name).remove(force=True)


# --- wait instead of refuse, quotas ----------------------------------------------------------------


class Rows:
    """The engine's container list, as the ledger reads it (the pipeline's logic, no engine)."""

    def __init__(self, rows: list[ContainerInfo]):
        self.rows_now = rows
        self.containers = self

    def rows(self) -> list[ContainerInfo]:
        return list(self.rows_now)

    def host_info(self) -> dict:  # how the engine takes GPUs (run.gpu_path): an engine with the nvidia runtime
        return {"runtimes": ["nvidia", "runc"], "cdi_devices": []}


def _site(tmp_path, monkeypatch, extra: str = "", gpus: list[Gpu] | None = None):
    from imgbuild.config.settings import load_settings

    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [g.to_json() for g in gpus or [gpu(0)]]}))
    monkeypatch.setenv("IMGBUILD_GPU_SNAPSHOT", str(snapshot))
    config = tmp_path / "config.yaml"
    config.write_text(f"run:\n  state_dir: {tmp_path / 'state'}\n  wait_poll: 1\n{extra}")
    monkeypatch.setenv("IMGBUILD_CONFIG", str(config))
    use_site_config(monkeypatch, str(config))  # the site's rules
    return load_settings({})


@pytest.mark.root("another user's queue place (root's file may name anyone)")
def test_wait_queues_first_come_first_served_and_starts_when_free(tmp_path, monkeypatch):
    from imgbuild.servers.run import reserved

    settings = _site(tmp_path, monkeypatch)
    engine = Rows([ContainerInfo("bob_lm_1", user="bob", status="running", gpu_uuids=gpu(0).uuid)])
    ledger = Ledger(tmp_path / "state")
    now = [0.0]
    seen: list[tuple[int, str]] = []
    with ledger.transaction() as book:  # carol queued first (a live process: this one, another ticket)
        book.enqueue("wait-carol", "carol", "--gpus 1")

    def sleep(seconds: float) -> None:
        now[0] += seconds
        queue = [e.name for e in ledger.entries() if e.waiting]
        if now[0] == 3:  # bob's job ends: the GPU is free, but carol came first
            assert queue == ["wait-carol", f"wait-{os.getpid()}"]
            engine.rows_now = []
        if now[0] == 5:  # carol has started
            with ledger.transaction() as book:
                book.leave("wait-carol")
            engine.rows_now = [ContainerInfo("carol_x_1", user="carol", status="running", gpu_uuids="")]

    request = RunRequest("ubuntu:22.04", ["true"], gpu_request="1")
    with reserved(request, settings, engine, wait=60, on_wait=lambda p, w: seen.append((p, w)), clock=lambda: now[0], sleep=sleep) as spec:  # fmt: skip
        assert spec.gpus.uuids == [gpu(0).uuid] and now[0] == 5
        holds = [e for e in ledger.entries() if not e.waiting]
        assert [e.name for e in holds] == [spec.name] and not [e for e in ledger.entries() if e.waiting][1:]
    assert seen[0] == (2, "1 ahead of you") and seen[-1] == (2, "1 ahead of you")
    assert ledger.entries() == []  # started: nothing left in the ledger
    with ledger.transaction() as book:
        book.enqueue("wait-carol", "carol", "--gpus 1")
    cpu_only = RunRequest("ubuntu:22.04", ["true"])
    with reserved(cpu_only, settings, engine) as spec:  # a queue for GPUs does not hold up CPU-only runs
        assert not spec.gpus.gpus
    gpu_run = RunRequest("ubuntu:22.04", ["true"], gpu_request="1")
    queued_first = pytest.raises(UsageError, match=r"1 run\(s\) wait for GPUs before you .* add --wait to queue")
    with queued_first, reserved(gpu_run, settings, Rows([]), clock=lambda: now[0], sleep=sleep):
        raise AssertionError("jumped the queue")


def test_wait_gives_up_at_its_timeout_and_leaves_no_place(tmp_path, monkeypatch):
    from imgbuild.servers.run import WaitTimedOut, reserved

    settings = _site(tmp_path, monkeypatch)
    engine = Rows([ContainerInfo("bob_lm_1", user="bob", status="running", gpu_uuids=gpu(0).uuid)])
    now = [0.0]
    whys: list[str] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    from imgbuild.servers import run as runmod

    resolved: list[str] = []
    real_resolve = runmod.resolve_image
    monkeypatch.setattr(
        runmod, "resolve_image", lambda image, s, **kw: resolved.append(image) or real_resolve(image, s, **kw)
    )
    request = RunRequest("ubuntu:22.04", ["true"], gpu_request="1")
    gave_up = pytest.raises(WaitTimedOut, match=r"gave up waiting after 10 s \(--gpus 1: only 0 of 1 GPUs are free")
    with gave_up, reserved(request, settings, engine, wait=10, on_wait=lambda p, w: whys.append(w), clock=lambda: now[0], sleep=sleep):  # fmt: skip
        raise AssertionError("started")
    assert now[0] == 10 and "bob (container bob_lm_1)" in whys[0]
    assert len(whys) > 3 and resolved == ["ubuntu:22.04"]  # the image resolved once, not on every look
    monkeypatch.undo()
    assert Ledger(tmp_path / "state").entries() == []
    refused = pytest.raises(UsageError, match="GPU 0 is in use by bob")  # without --wait: refused at once
    with refused, reserved(RunRequest("ubuntu:22.04", ["true"], gpu_request="device=0"), settings, engine):
        raise AssertionError("started")


def test_quota_refuses_naming_the_containers_that_hold_your_gpus(tmp_path, monkeypatch):
    import grp

    from imgbuild.config.settings import load_settings

    group = grp.getgrgid(os.getgid()).gr_name
    four = [gpu(i) for i in range(4)]
    settings = _site(tmp_path, monkeypatch, f"  max_gpus_per_user: 2\n  max_gpus_per_group: {{{group}: 2}}\n", four)
    rows = [ContainerInfo(f"{ME}_a_1", user=ME, status="running", gpu_uuids=four[0].uuid)]
    held = held_on_host(rows, [], four)
    assert prepare(RunRequest("img", ["true"], gpu_request="1"), settings, held).gpus.uuids == [four[1].uuid]
    with pytest.raises(UsageError) as refused:
        prepare(RunRequest("img", ["true"], gpu_request="2"), settings, held)
    assert str(refused.value) == (
        f"quota: at most 2 GPUs at once (run.max_gpus_per_user); you hold 1 ({ME}: container {ME}_a_1) and this "
        "run asks for 2 more"
    )
    assert prepare(RunRequest("img", ["true"], gpu_request="device=0"), settings, held).gpus  # the one you hold
    other = f"{ME}x"  # a group member's container counts against the group's share
    monkeypatch.setattr("imgbuild.servers.holds.group_members", lambda g: {ME, other})
    rows.append(ContainerInfo(f"{other}_b_1", user=other, status="running", gpu_uuids=four[1].uuid))
    held = held_on_host(rows, [], four)
    with pytest.raises(UsageError, match=f"run.max_gpus_per_group {group}.*group {group} holds 2"):
        prepare(RunRequest("img", ["true"], gpu_request="1"), settings, held)
    for bad, key in (("max_gpus_per_user: -1", "max_gpus_per_user"), ("max_gpus_per_group: [a]", "group"), ("wait_poll: 0", "wait_poll")):  # fmt: skip
        (tmp_path / "config.yaml").write_text(f"run:\n  {bad}\n")
        with pytest.raises(UsageError, match=key):
            load_settings({})  # read once, by every command, before anything runs


@pytest.mark.root("names a site config for imgbuild processes it starts (root's alone)")
def test_a_bare_wait_does_not_swallow_the_image(tmp_path):
    from tests.conftest import run_cli

    res = run_cli("run", "--wait", "--dry-run", "ubuntu:22.04", "--", "true", cwd=tmp_path)
    assert res.code == 0 and "ubuntu:22.04 true" in res.out, res.err
    bad = run_cli("run", "--wait=soon", "ubuntu:22.04", cwd=tmp_path)
    assert bad.code == 2 and "--wait: 'soon' is not a duration" in bad.err


@pytest.mark.alone
@pytest.mark.engine
@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_two_users_queued_for_one_gpu_start_in_order_and_a_killed_waiter_leaves_nothing(
    testbed, docker_client, tmp_path, unique
):
    """Real processes and containers: A holds the only GPU; B then C queue (`--wait`); a waiter killed
    with SIGKILL leaves no stale place; when A ends B starts, C still waits; when B ends C starts."""
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(json.dumps({"gpus": [gpu(0).to_json()]}))
    config = tmp_path / "config.yaml"
    config.write_text(
        f"run:\n  ulimits: {{memlock: 8388608}}\n  gpu_flag: env\n  wait_poll: 0.2\n  state_dir: {tmp_path / 'state'}\n"
    )
    env = {
        **os.environ,
        "IMGBUILD_CONFIG": str(config),
        "IMGBUILD_SITE_CONFIG": str(config),
        "IMGBUILD_GPU_SNAPSHOT": str(snapshot),
    }
    ledger = Ledger(tmp_path / "state")

    def start(name: str, *extra: str) -> subprocess.Popen:
        args = ["run", "-d", *extra, "--gpus", "1", "--name", f"{name}{unique}", image, "--", "sleep", "300"]
        return subprocess.Popen(
            [*IMGBUILD, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def until(check, what: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.1)

    def queued() -> int:
        return len([e for e in ledger.entries() if e.waiting])

    def running(name: str) -> bool:
        with contextlib.suppress(Exception):
            return docker_client.containers.get(f"{ME}_{name}{unique}_1").status == "running"
        return False

    waiters: list[subprocess.Popen] = []
    try:
        first = start("a")
        assert first.wait(timeout=120) == 0, first.communicate()
        waiters.append(start("b", "--wait", "120"))
        until(lambda: queued() == 1, "b queued")
        doomed = start("d", "--wait")
        waiters.append(doomed)
        until(lambda: queued() == 2, "d queued")
        waiters.append(start("c", "--wait", "120"))
        until(lambda: queued() == 3, "c queued")
        doomed.kill()
        doomed.wait()
        until(lambda: queued() == 2, "the killed waiter's place is gone")
        docker_client.containers.get(f"{ME}_a{unique}_1").remove(force=True)
        until(lambda: running("b"), "b started when a ended")
        assert waiters[0].wait(timeout=60) == 0
        assert "waiting: place 1 in the queue" in waiters[0].communicate()[1]
        time.sleep(1)  # c keeps waiting: b holds the GPU now
        assert not running("c") and queued() == 1
        docker_client.containers.get(f"{ME}_b{unique}_1").remove(force=True)
        until(lambda: running("c"), "c started when b ended")
        assert waiters[2].wait(timeout=60) == 0 and ledger.entries() == []
    finally:
        for proc in waiters:
            with contextlib.suppress(Exception):
                proc.kill()
        for name in ("a", "b", "c", "d"):
            with contextlib.suppress(Exception):
                docker_client.containers.get(f"{ME}_{name}{unique}_1").remove(force=True)


def test_reading_the_ledger_writes_nothing(tmp_path):
    """`ps` and `reap --dry-run` only read the ledger: no folder or file is made, a bad file stays as it is,
    a linked or planted one is never followed and never blocks."""
    from imgbuild.servers.ledger import Extension

    state = tmp_path / "state"
    assert Ledger(state).read().entries == [] and not state.exists()
    state.mkdir()
    own = state / f"ledger-{os.getuid()}.json"
    text = '{"entries":  [], "extended": {"abc": {"deadline": 5, "user": "' + caller().name + '"}}}'
    own.write_text(text)
    book = Ledger(state).read()
    assert book.entries == [] and book.extended == {"abc": Extension(5.0, caller().name)}
    assert own.read_text() == text  # as it was
    own.write_text("garbage")
    assert Ledger(state).read().entries == [] and own.read_text() == "garbage"
    own.unlink()
    own.symlink_to(tmp_path / "elsewhere")
    assert Ledger(state).read().entries == [] and not (tmp_path / "elsewhere").exists()
    own.unlink()
    os.mkfifo(own)  # a FIFO is never opened for reading (it would block `ps` and root's reaper forever)
    assert Ledger(state).read().entries == []


def test_runs_start_path_on_the_fake_engine(tmp_path, monkeypatch):
    """`imgbuild run`'s start path on the fake engine, which records the typed RunOptions (no docker
    words outside engine/): the GPU chosen under the ledger, the caller's IDs and labels, the house rules; the
    ledger's hold is gone once the container runs; a start the engine refuses says why and holds nothing."""
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.errors import ImgbuildError
    from imgbuild.facts import Label
    from imgbuild.servers.run import reserved, start_detached

    settings = _site(tmp_path, monkeypatch, "  ulimits: {memlock: -1}\n  env: {SITE: 'yes'}\n")
    engine = FakeEngine()
    request = RunRequest("ubuntu:22.04", ["python", "train.py"], gpu_request="1", detach=True, env=["HF_TOKEN=t"])
    with reserved(request, settings, engine) as spec:
        assert [e.name for e in Ledger(tmp_path / "state").entries()] == [spec.name]  # held while it starts
        start_detached(engine, spec)
    (started,) = engine.containers.started
    assert started.name == spec.name and started.command == ("python", "train.py") and started.detach
    assert started.gpus == (gpu(0).uuid,) and started.user == f"{os.getuid()}:{os.getgid()}"
    assert dict(started.labels)[Label.GPU_UUIDS] == gpu(0).uuid and dict(started.labels)[Label.USER] == spec.user
    assert ("memlock", "-1") in started.ulimits and started.ipc == "host" and not started.hardened
    assert {("SITE", "yes"), ("HF_TOKEN", "t")} <= set(started.env)
    assert Ledger(tmp_path / "state").entries() == []  # started: the ledger holds nothing
    engine.containers.start_code = 125
    with pytest.raises(ImgbuildError, match="the container did not start"), reserved(request, settings, engine) as spec:
        start_detached(engine, spec)
    assert Ledger(tmp_path / "state").entries() == []


def test_an_engine_that_may_not_raise_memlock_names_the_value_and_exits_3_never_125(tmp_path, monkeypatch):
    import resource

    from imgbuild.engine.fake import FakeEngine
    from imgbuild.servers.run import reserved, start_attached
    from imgbuild.servers.startfail import explain_start_failure

    said = explain_start_failure(
        "docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create "
        "failed: unable to start container process: error during container init: error setting rlimit type 8: "
        "operation not permitted: unknown."
    )
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    value = hard if hard != resource.RLIM_INFINITY else 67108864
    assert f"put run: {{ulimits: {{memlock: {value}}}}} in ~/.config/imgbuild/config.yaml" in said
    assert "error setting rlimit type 8: operation not permitted)" in said
    settings = _site(tmp_path, monkeypatch, "  ulimits: {memlock: -1}\n")
    engine = FakeEngine()
    engine.containers.start_code = 125
    request = RunRequest("ubuntu:22.04", ["true"], detach=True)
    with reserved(request, settings, engine) as spec:
        assert start_attached(engine, spec, settings).code == 3  # docker's own 125: the engine's, never passed on
    engine.containers.start_code = 127
    with reserved(request, settings, engine) as spec:
        assert start_attached(engine, spec, settings).code == 1  # the command could not be run in it


def test_a_run_that_could_never_start_is_refused_at_once_not_waited_for(tmp_path, monkeypatch):
    from imgbuild.gpu.allocate import GpusBusy
    from imgbuild.servers.run import reserved

    four = [gpu(i) for i in range(4)]
    settings = _site(tmp_path, monkeypatch, "  max_gpus_per_user: 1\n", four)
    for request in ("2", "all", "0,1", "device=0,1", "9"):
        never = reserved(RunRequest("img", ["true"], gpu_request=request), settings, Rows([]), wait=600)
        with pytest.raises(UsageError, match="could never start") as refused, never:
            raise AssertionError("started")
        assert not isinstance(refused.value, GpusBusy)  # a queued job with it fails, never waits forever
    assert Ledger(tmp_path / "state").entries() == []  # no place was taken in the queue


def test_a_waiter_held_back_by_its_own_quota_holds_nobody_else_back(tmp_path, monkeypatch):
    from imgbuild.servers.run import WaitTimedOut, reserved

    four = [gpu(i) for i in range(4)]
    settings = _site(tmp_path, monkeypatch, "  max_gpus_per_user: 1\n", four)
    mine = Rows([ContainerInfo(f"{ME}_a_1", user=ME, status="running", gpu_uuids=four[0].uuid)])
    now = [0.0]
    places: list[list[str]] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds
        places.append([e.name for e in Ledger(tmp_path / "state").entries() if e.waiting])

    waiter = reserved(RunRequest("img", ["true"], gpu_request="1"), settings, mine, wait=3, clock=lambda: now[0], sleep=sleep)  # fmt: skip
    with pytest.raises(WaitTimedOut, match="gave up waiting .*quota"), waiter:
        raise AssertionError("started")
    assert places and all(p == [] for p in places)  # never a place ahead of another user's run


def test_the_user_with_fewer_gpu_hours_of_late_goes_first():
    from imgbuild.servers import queue as jobs

    def job(user: str, submitted: float) -> jobs.Job:
        return jobs.Job(f"{int(submitted):08x}", user, 1, 1, submitted, "/", ["img"])

    waiting = [job("heavy", 1), job("light", 5), job("heavy", 6)]
    assert [j.user for j in jobs.order(waiting, now=10)] == ["heavy", "light", "heavy"]  # no use known: by time
    use = {"heavy": 40.0, "light": 2.0}
    assert [j.user for j in jobs.order(waiting, now=10, use=use)] == ["light", "heavy", "heavy"]
    from imgbuild.servers.ledger import Book, Entry

    entries = [Entry("wait-1", "heavy", 1, "", since=1.0, waiting="--gpus 1"),
               Entry("wait-2", "light", 2, "", since=5.0, waiting="--gpus 1")]  # fmt: skip
    assert [e.user for e in Book(entries, time.time).queue()] == ["heavy", "light"]
    assert [e.user for e in Book(entries, time.time).queue(use)] == ["light", "heavy"]


def test_fair_share_sums_each_users_gpu_hours_within_the_window(tmp_path):
    from imgbuild.servers import usage

    folder = tmp_path / ".reap"
    folder.mkdir(mode=0o700)
    hold = {"user": "heavy", "group": "g", "container": "heavy_x_1", "gpus": [{"uuid": "GPU-1", "util": 90}]}
    for when in (100.0, 1000.0, 1900.0):
        usage.append(folder, usage.record(when, when - 900, [hold]))
    assert usage.fair_share(tmp_path, "1h", now=4000.0) == {"heavy": 0.5}  # the two records of the last hour
    assert usage.fair_share(tmp_path, None, now=2000.0) == {}


def test_the_default_state_folder_is_in_a_folder_only_root_writes():
    from imgbuild.config import site

    assert site.run_rules({}).ledger_dir == Path(site.DEFAULT_STATE_DIR)
    parent = Path(site.DEFAULT_STATE_DIR).parent
    assert not parent.exists() or (parent.stat().st_uid == 0 and not parent.stat().st_mode & 0o022)
