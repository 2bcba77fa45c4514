"""`imgbuild admin setup` from nothing, again (nothing changes), after an admin's edit (kept), and doctor's line for
each piece, broken one at a time, naming its fix."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from imgbuild.errors import EnvironmentProblem
from imgbuild.servers import setup
from imgbuild.servers.doctor import Line

BINARY = "/opt/imgbuild/bin/imgbuild"


def _layout(root: Path) -> setup.Layout:
    return setup.Layout.of(Path("/var/lib/imgbuild"), Path("/etc/imgbuild/config.yaml"), BINARY, root)


def _lines(layout: setup.Layout) -> dict[str, Line]:
    return {line.check: line for line in setup.judge(setup.collect(layout))}


@pytest.mark.root("the state folder is made root's")
def test_setup_from_nothing_then_doctor_finds_every_piece_in_order(tmp_path, monkeypatch):
    layout = _layout(tmp_path)
    monkeypatch.setattr(setup, "_timer_enabled", lambda: None)
    first = dict(setup.apply(layout))
    assert set(first.values()) == {"made", "written"}
    folder = os.lstat(layout.state_dir)
    assert folder.st_uid == 0 and stat.S_IMODE(folder.st_mode) == 0o1777
    assert stat.S_IMODE(os.lstat(layout.state_dir / ".reap").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(layout.sudoers).st_mode) == 0o440
    assert f"ExecStart={BINARY} reap" in layout.service.read_text()
    assert "state_dir: /var/lib/imgbuild" in layout.site_config.read_text()  # the real path, not the staging one
    again = dict(setup.apply(layout))
    assert set(again.values()) == {"ok"}  # idempotent: nothing rewritten
    lines = _lines(layout)
    for check in ("state folder", "site config", "sudoers drop-in", "reap timer"):
        assert lines[check].status == "ok", lines[check]


@pytest.mark.root("the state folder is made root's")
def test_setup_keeps_what_an_admin_edited_and_updates_only_its_own(tmp_path):
    layout = _layout(tmp_path)
    setup.apply(layout)
    edited = layout.site_config.read_text().replace("max_gpus_per_user: 2", "max_gpus_per_user: 4")
    layout.site_config.write_text(edited)
    own = setup.marked("[Unit]\nDescription=an older text of setup's own\n")
    layout.timer.write_text(own)
    done = dict(setup.apply(layout))
    assert done[str(layout.site_config)].startswith("kept: edited by an admin")
    assert layout.site_config.read_text() == edited
    assert done[str(layout.timer)].startswith("updated") and layout.timer.read_text() == setup.marked(setup.TIMER_TEXT)


def test_a_state_folder_someone_else_made_first_is_refused_not_adopted(tmp_path):
    layout = _layout(tmp_path)
    layout.state_dir.parent.mkdir(parents=True)
    layout.state_dir.symlink_to(tmp_path)
    with pytest.raises(EnvironmentProblem, match="not root's folder: someone made it first"):
        setup.apply(layout)


def _facts(**change: object) -> setup.SetupFacts:
    ok_file = setup.FileFacts("/etc/x", True, 0, 0o100644, True, f"{BINARY} run")
    facts = setup.SetupFacts(
        "/var/lib/imgbuild", 0, 0o41777, True, False, ok_file, ok_file, True, BINARY, ok_file, True, ""
    )
    return replace(facts, **change)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change, check, status, fix",
    [
        ({"state_uid": None, "state_parent_open": True}, "state folder", "fail", "sudo imgbuild admin setup"),
        ({"state_uid": None}, "state folder", "warn", "sudo imgbuild admin setup"),
        ({"state_uid": 1001}, "state folder", "fail", "rm -r /var/lib/imgbuild"),
        ({"state_mode": 0o40755}, "state folder", "fail", "chmod 1777 /var/lib/imgbuild"),
        ({"state_is_dir": False}, "state folder", "fail", "rm /var/lib/imgbuild"),
        ({"site_config": setup.FileFacts("/etc/x")}, "site config", "warn", "sudo imgbuild admin setup"),
        ({"site_config": setup.FileFacts("/etc/x", True, 1001, 0o100644)}, "site config", "fail", "chown root"),
        ({"sudoers_parses": False}, "sudoers drop-in", "fail", "rm /etc/x"),
        (
            {"sudoers": setup.FileFacts("/etc/x", True, 0, 0o100666, text=f"{BINARY} run")},
            "sudoers drop-in",
            "fail",
            "chmod 440",
        ),  # fmt: skip
        (
            {"sudoers": setup.FileFacts("/etc/x", True, 0, 0o100440, text="/usr/bin/x run")},
            "sudoers drop-in",
            "warn",
            "--binary",
        ),  # fmt: skip
        ({"timer": setup.FileFacts("/etc/t")}, "reap timer", "warn", "sudo imgbuild admin setup"),
        ({"timer_enabled": False}, "reap timer", "fail", "systemctl enable --now imgbuild-reap.timer"),
        ({"interpreter_blocked": "/root"}, "python", "fail", "/usr/bin/python3 -m venv"),
    ],
)
def test_doctor_names_each_broken_piece_with_its_fix(change, check, status, fix):
    healthy = {line.check: line for line in setup.judge(_facts())}
    assert all(line.status == "ok" for line in healthy.values()), healthy
    line = {line.check: line for line in setup.judge(_facts(**change))}[check]
    assert line.status == status and fix in line.fix, line


def test_the_interpreters_way_is_checked_for_other_users():
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's own folders are closed to others
    try:
        top.chmod(0o755)
        closed = top / "home"
        (closed / "venv" / "bin").mkdir(parents=True)
        closed.chmod(0o700)
        assert setup.blocked_on_the_way(closed / "venv" / "bin" / "python") == str(closed)
        closed.chmod(0o755)
        assert setup.blocked_on_the_way(closed / "venv" / "bin" / "python") == ""
    finally:
        shutil.rmtree(top)
