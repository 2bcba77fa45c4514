"""GPU usage a lab can account for. The sums are checked against a recorded log with known
answers, hostile log lines as a table, the Prometheus textfile with prometheus_client's own parser, and the
command as a user runs it."""

from __future__ import annotations

import json
import os
from fractions import Fraction
from pathlib import Path

import pytest

from imgbuild.errors import EnvironmentProblem, UsageError
from imgbuild.servers import usage
from tests.conftest import run_cli

H = 3600
A, B, C = "GPU-aaaaaaaa", "GPU-bbbbbbbb", "GPU-cccccccc"


def hold(user: str, group: str, container: str, *gpus: tuple[str, float | None]) -> dict:
    return {"user": user, "group": group, "container": container, "gpus": [{"uuid": u, "util": x} for u, x in gpus]}


#: Four reaper runs: the first covers nothing; the last came an hour after the third (capped at 15 minutes).
#: B is a MIG slice (no utilisation): held, not used, its hours listed apart.
RECORDED = [
    {"time": 1000.0, "seconds": 0.0, "holds": [hold("alice", "vision", "alice_a_1", (A, 100))]},
    {
        "time": 1300.0,
        "seconds": 300.0,
        "holds": [hold("alice", "vision", "alice_a_1", (A, 50), (B, None)), hold("bob", "nlp", "bob_b_1", (C, 0))],
    },
    {
        "time": 1600.0,
        "seconds": 300.0,
        "holds": [hold("alice", "vision", "alice_a_1", (A, 100)), hold("bob", "nlp", "bob_b_1", (C, 100))],
    },
    {"time": 5200.0, "seconds": 900.0, "holds": [hold("bob", "nlp", "bob_b_2", (C, 20))]},
]

#: The known answers, in exact fractions of an hour.
KNOWN = {
    "user": {
        "alice": (Fraction(900, H), Fraction(450, H), Fraction(300, H), 1),  # held, used, unmeasured, containers
        "bob": (Fraction(1500, H), Fraction(480, H), Fraction(0), 2),
    },
    "group": {
        "vision": (Fraction(900, H), Fraction(450, H), Fraction(300, H), 1),
        "nlp": (Fraction(1500, H), Fraction(480, H), 0, 2),
    },  # fmt: skip
    "gpu": {
        A: (Fraction(600, H), Fraction(450, H), 0, 1),
        B: (Fraction(300, H), 0, Fraction(300, H), 1),
        C: (Fraction(1500, H), Fraction(480, H), 0, 2),
    },
}


@pytest.mark.parametrize("by", ["user", "group", "gpu"])
def test_usage_matches_a_recorded_log_exactly(by):
    rows = {r.key: r for r in usage.summarize(RECORDED, by)}
    assert set(rows) == set(KNOWN[by])
    for key, (held, used, unmeasured, containers) in KNOWN[by].items():
        row = rows[key]
        assert row.held_hours == pytest.approx(float(held), abs=1e-12), key
        assert row.used_hours == pytest.approx(float(used), abs=1e-12), key
        assert row.unmeasured_hours == pytest.approx(float(unmeasured), abs=1e-12), key
        assert len(row.containers) == containers, key
    assert rows.get("alice") is None or rows["alice"].mean_util == pytest.approx(75.0)  # 450 / (900 - 300)
    assert rows.get("bob") is None or rows["bob"].mean_util == pytest.approx(32.0)  # 480 / 1500


def test_since_keeps_the_window_and_the_first_run_covers_nothing():
    later = {r.key: r for r in usage.summarize(RECORDED, "user", since=1600.0)}
    assert later["alice"].held_hours == pytest.approx(300 / H) and later["bob"].held_hours == pytest.approx(1200 / H)
    assert usage.record(1000.0, None, [])["seconds"] == 0  # no previous run: nothing to cover
    assert usage.record(1300.0, 1000.0, [])["seconds"] == 300
    assert usage.record(90000.0, 1000.0, [])["seconds"] == usage.MAX_INTERVAL  # a reaper that stopped for a day
    assert usage.record(900.0, 1000.0, [])["seconds"] == 0  # a clock set back
    assert usage.since_of("30d", now=100 * 86400.0) == 70 * 86400.0
    for bad in ("soon", "-1d", "0", "1e9d", "３d"):
        with pytest.raises(UsageError, match="--since"):
            usage.since_of(bad, now=0.0)


GOOD = {"time": 10.0, "seconds": 60.0, "holds": [hold("carol", "x", "carol_c_1", (A, 50))]}


@pytest.mark.parametrize(
    "why, rec, held",
    [
        ("a good record", GOOD, 60),
        ("not a mapping", [GOOD], 0),
        ("time as text", {**GOOD, "time": "10"}, 0),
        ("time as true", {**GOOD, "time": True}, 0),
        ("time NaN", {**GOOD, "time": float("nan")}, 0),
        ("time infinite", {**GOOD, "time": float("inf")}, 0),
        ("negative seconds", {**GOOD, "seconds": -600.0}, 0),
        ("seconds beyond the cap (a forged year)", {**GOOD, "seconds": 3.15e7}, usage.MAX_INTERVAL),
        ("holds not a list", {**GOOD, "holds": {"a": 1}}, 0),
        ("a hold that is text", {**GOOD, "holds": ["carol"]}, 0),
        ("gpus not a list", {**GOOD, "holds": [{"user": "carol", "gpus": "GPU-a"}]}, 0),
        ("a gpu entry that is text", {**GOOD, "holds": [{"user": "carol", "gpus": ["GPU-a"]}]}, 0),
        (
            "10 000 GPUs in one hold: 64 counted",
            {**GOOD, "holds": [hold("carol", "x", "c", *[(A, 1)] * 10000)]},
            64 * 60,
        ),
    ],
)
def test_hostile_records_count_for_no_more_than_they_can_say(why, rec, held):
    rows = usage.summarize([rec], "user")
    assert sum(r.held_hours for r in rows) * H == pytest.approx(held), why


@pytest.mark.parametrize(
    "why, user, util, key, used",
    [
        ("utilisation above 100", "carol", 1000, "carol", None),
        ("negative utilisation", "carol", -5, "carol", None),
        ("utilisation as text", "carol", "99", "carol", None),
        ("a control character in the name", "ca\nrol", 50, "?", 30),
        ("a name of 1000 characters", "c" * 1000, 50, "?", 30),
        ("no name at all", None, 50, "?", 30),
        ("quotes and backslashes (kept; escaped where printed)", 'a"b\\c', 50, 'a"b\\c', 30),
    ],
)
def test_hostile_names_and_utilisations(why, user, util, key, used):
    rec = {**GOOD, "holds": [{"user": user, "container": "x", "gpus": [{"uuid": A, "util": util}]}]}
    (row,) = usage.summarize([rec], "user")
    assert row.key == key, why
    if used is None:  # not a utilisation: held, unmeasured
        assert row.used_hours == 0 and row.unmeasured_hours * H == pytest.approx(60), why
    else:
        assert row.used_hours * H == pytest.approx(used), why


def test_the_prometheus_textfile_parses_with_prometheus_client():
    from prometheus_client.parser import text_string_to_metric_families

    hostile = {**GOOD, "holds": [hold('a"b\\c', "x", "c", (B, 100))]}
    records = [*RECORDED, hostile]
    text = usage.prometheus(usage.summarize(records, "user"), usage.summarize(records, "gpu"), None, 7000.0)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    held = {s.labels["user"]: s.value for s in families["imgbuild_gpu_hours_held_by_user"].samples}
    assert held["alice"] == pytest.approx(0.25) and held["bob"] == pytest.approx(1500 / H)
    assert held['a"b\\c'] == pytest.approx(60 / H)  # the label round-trips through the exposition format
    used = {s.labels["gpu"]: s.value for s in families["imgbuild_gpu_hours_used_by_gpu"].samples}
    assert used[C] == pytest.approx(480 / H) and used[B] == pytest.approx(60 / H)
    assert families["imgbuild_gpu_hours_held_by_gpu"].type == "gauge"
    assert families["imgbuild_usage_generated_seconds"].samples[0].value == 7000.0


def _reaper_folder(tmp_path: Path, records: list) -> Path:
    folder = tmp_path / "state" / ".reap"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o700)
    for rec in records:
        usage.append(folder, rec)
    return folder


def test_the_log_is_appended_and_read_back_and_a_forged_one_is_refused(tmp_path):
    folder = _reaper_folder(tmp_path, RECORDED)
    assert usage.read(folder) == RECORDED
    log = folder / usage.USAGE_FILE
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    with log.open("a") as handle:
        handle.write('{"time": 1, "seconds"\n')  # a torn last line (a crash mid-write)
        handle.write("[" * 100_000 + "\n")  # deeper than the parser goes
    assert usage.read(folder) == RECORDED
    os.chmod(log, 0o666)  # writable by others: its figures are forged
    with pytest.raises(EnvironmentProblem, match="not the reaper's own file"):
        usage.read(folder)
    log.unlink()
    log.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(EnvironmentProblem, match="symbolic link|not a regular file|cannot"):
        usage.append(folder, RECORDED[0])
    log.unlink()
    os.mkfifo(log)  # a FIFO must not hang the reaper
    with pytest.raises(EnvironmentProblem, match="not a regular file"):
        usage.append(folder, RECORDED[0])


def test_a_big_log_is_rotated_once_and_both_halves_are_read(tmp_path, monkeypatch):
    monkeypatch.setattr(usage, "LOG_BYTES", 300)
    folder = _reaper_folder(tmp_path, RECORDED)
    assert (folder / (usage.USAGE_FILE + ".1")).exists()
    assert usage.read(folder)[-1] == RECORDED[-1]


@pytest.mark.root("names a site config for imgbuild processes it starts, and reads root's usage log")
@pytest.mark.root("names a site config for the imgbuild processes it starts (IMGBUILD_SITE_CONFIG is root's alone)")
def test_the_usage_command(tmp_path):
    _reaper_folder(tmp_path, RECORDED)
    site = tmp_path / "site.yaml"
    site.write_text(f"run:\n  state_dir: {tmp_path / 'state'}\n")
    env = {"IMGBUILD_SITE_CONFIG": str(site)}
    table = run_cli("usage", env=env)
    assert table.code == 0, table.err
    assert "alice" in table.out and "0.25" in table.out and "75%" in table.out and "4 reaper runs" in table.out
    prom = tmp_path / "imgbuild.prom"
    data = run_cli("usage", "--by", "group", "--json", "--prometheus", str(prom), env=env)
    assert data.code == 0, data.err
    rows = {r["key"]: r for r in json.loads(data.out)}
    assert rows["nlp"]["gpu_hours_held"] == round(1500 / H, 4) and rows["vision"]["mean_utilization"] == 75.0
    assert "imgbuild_gpu_hours_held_by_user" in prom.read_text()
    assert not list(tmp_path.glob(".imgbuild.prom*"))  # written whole, nothing left beside it
    bad = run_cli("usage", "--since", "soon", env=env)
    assert bad.code == 2 and "--since" in bad.err and "Traceback" not in bad.err
    empty = tmp_path / "empty.yaml"
    empty.write_text(f"run:\n  state_dir: {tmp_path / 'none'}\n")
    nothing = run_cli("usage", env={"IMGBUILD_SITE_CONFIG": str(empty)})
    assert nothing.code == 0 and "no GPU use recorded" in nothing.out
