"""Long work never looks hung: a live clock that keeps running on a terminal; whole lines, folded into a group,
in CI logs; errors as annotations where the CI system shows them."""

from __future__ import annotations

import io
import time
from pathlib import Path

from rich.console import Console

from imgbuild import ui


def _progress(terminal: bool, monkeypatch, ci: str = "") -> tuple[ui.Progress, io.StringIO]:
    for name in ("GITHUB_ACTIONS", "GITLAB_CI"):
        monkeypatch.delenv(name, raising=False)
    if ci:
        monkeypatch.setenv({"github": "GITHUB_ACTIONS", "gitlab": "GITLAB_CI"}[ci], "true")
    progress = ui.Progress("imgbuild smoke x")
    buffer = io.StringIO()
    progress.console = Console(file=buffer, force_terminal=terminal, width=200)
    return progress, buffer


def test_the_clock_keeps_running_while_one_step_takes_long(monkeypatch):
    """The elapsed time stopped at [1.6s] during a 100 s smoke test."""
    progress, buffer = _progress(True, monkeypatch)
    with progress:
        progress("smoke-testing lab/x:1-candidate")
        time.sleep(2.6)
    assert "[   2." in buffer.getvalue(), buffer.getvalue()[-500:]


def test_a_log_line_is_kept_whole(monkeypatch):
    progress, buffer = _progress(False, monkeypatch)
    step = "rendered /a/very/long/path/" + "x" * 300 + " (buildkit backend)"
    with progress:
        progress(step)
    assert step in buffer.getvalue() and "..." not in buffer.getvalue()


def test_ci_logs_fold_each_command_into_a_group(monkeypatch):
    progress, buffer = _progress(False, monkeypatch, ci="github")
    with progress:
        progress("built")
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "::group::imgbuild smoke x" and lines[-1] == "::endgroup::"
    progress, buffer = _progress(False, monkeypatch, ci="gitlab")
    with progress:
        progress("built")
    text = buffer.getvalue()
    assert "section_start:" in text and "section_end:" in text and "[collapsed=true]" in text


def test_errors_are_annotations_under_github_actions_and_plain_elsewhere():
    from imgbuild.annotation import Annotation, shown

    assert shown(Annotation("a.yaml:3:1: pip: bad\nsecond"), {"GITHUB_ACTIONS": "true"}) == (
        "::error::a.yaml:3:1: pip: bad%0Asecond"
    )
    assert shown(Annotation("100% bad"), {"GITHUB_ACTIONS": "true"}) == "::error::100%25 bad"
    assert shown(Annotation("plain"), {}) == "plain"
    assert shown(Annotation("plain\x1b[31m"), {"GITLAB_CI": "true"}) == "plain\ufffd[31m"


def test_a_push_says_each_layers_state_once_not_each_progress_update():
    """928 repeated `Pushing` lines for one push."""
    from imgbuild.engine.images import DockerImages

    chunks = [{"status": "Preparing", "id": "aaa"}, {"status": "Preparing", "id": "bbb"}]
    chunks += [
        {"status": "Pushing", "id": layer, "progressDetail": {"current": n}}
        for n in range(400)
        for layer in ("aaa", "bbb")
    ]
    chunks += [{"status": "Pushed", "id": "aaa"}, {"status": "Layer already exists", "id": "bbb"}]
    chunks += [{"aux": {"Digest": "sha256:" + "d" * 64}}]

    class Api:
        def push(self, repo, tag, stream, decode, auth_config):
            return iter(chunks)

    class Client:
        api = Api()

    said: list[str] = []
    digest = DockerImages(Client()).push("127.0.0.1:5000/lab/x:1", None, said.append)
    assert digest == "sha256:" + "d" * 64
    assert len(said) == 6 and sum("Pushing" in line for line in said) == 2


def test_a_live_only_progress_shows_a_running_clock_on_a_terminal_and_nothing_in_a_log(monkeypatch):
    """`lock` was silent for 101 s and `smoke IMAGE` for 151 s at a terminal; their logs stay as they were."""
    from unittest import mock

    for terminal in (True, False):
        with mock.patch.object(Console, "is_terminal", new=mock.PropertyMock(return_value=terminal)):
            assert ui.Progress("imgbuild lock r.yaml", live_only=True).enabled is terminal
            assert ui.Progress("imgbuild build r.yaml").enabled is True  # a build's steps go to its log too


def test_the_smoke_test_says_each_check_as_it_goes_and_a_long_one_every_few_seconds(monkeypatch):
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.payload.smoke import report as smoke_report
    from imgbuild.pipeline import smoke

    said: list[str] = []
    report = smoke_report.Report()
    with monkeypatch.context() as patched:  # the script's own lines, as the container's output carries them
        patched.setattr(smoke_report, "say", lambda text: said.append(smoke_report.PROGRESS + text))
        report.run("framework", lambda: {"reason": "ok"})
        report.run("cuda", lambda: (_ for _ in ()).throw(smoke_report.Skip("no GPU")))
    assert said == [
        "imgbuild-smoke: check 1: framework ...",
        "imgbuild-smoke: check 1: framework PASS (0.0 s)",
        "imgbuild-smoke: check 2: cuda ...",
        "imgbuild-smoke: check 2: cuda SKIP (0.0 s)",
    ]
    monkeypatch.setattr(smoke.StepHeartbeat, "HEARTBEAT_SECONDS", 0.2)
    steps: list[str] = []

    class SlowScript(FakeEngine):
        def __post_init__(self) -> None:
            super().__post_init__()
            run_script = self.containers.run_script

            def slow(*args, on_line=None, **kwargs):
                for line in [*said[:3], "pip noise, not a step"]:
                    on_line(line)
                time.sleep(0.7)  # a check that takes long: said again while it runs
                return run_script(*args, on_line=on_line, **kwargs)

            self.containers.run_script = slow

    engine = SlowScript()
    engine.add_image("lab/x:1", env=["PYTORCH_VERSION=2.4.0"])
    smoke.run_smoke(engine, smoke.SmokeRequest("lab/x:1", skip_gpu=True), on_step=steps.append)
    assert steps[:2] == ["starting the smoke test", "smoke check 1: framework PASS (0.0 s)"]  # a start: only if long
    assert len(steps) >= 4 and all(s.startswith("smoke check 2: cuda: still running (") for s in steps[2:])


# --- text others wrote, through every table and progress line ----------------------------------------------

#: What a failed step, a runner's report or a recipe can put in front of a user.
HOSTILE = [
    "executor failed running [/bin/sh -c pip install x]: exit code: 1",
    "[bold]not bold[/bold] and [/] and [link=http://x]y[/link]",
    "::error file=README.md,line=1::forged",
    "::stop-commands::p5stop",
    "  ::warning::indented",
    "a ##[error]older form",
    "title\x1b]0;pwned\x07 bell \x1b[31mred \x9b31m c1 \u202eevil\u202c \u2066iso\u2069 \x00nul",
    "second line\n::error::after a newline",
    "lone surrogate \ud800 and \uffff",
]


def _no_command_starts(text: str, own: tuple[str, ...] = ()) -> None:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in own:
            continue
        assert not stripped.startswith("::"), line
        assert "##[" not in line, line


def _no_hostile_controls(text: str) -> None:
    for bad in ("\x07", "\x9b", "\u202e", "\u2066", "\x00", "\ud800", "\uffff", "\x1b]0;", "\x1b[31mred"):
        assert bad not in text, repr(bad)


def test_a_table_shows_markup_controls_and_workflow_commands_as_text(capsys, monkeypatch):
    from unittest import mock

    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    for terminal in (False, True):
        with mock.patch.object(Console, "is_terminal", new=mock.PropertyMock(return_value=terminal)):
            ui.print_table(["recipe", "why"], [[h, h] for h in HOSTILE], title=HOSTILE[1])
        out = capsys.readouterr().out
        _no_hostile_controls(out)
        _no_command_starts(out)
        assert "[/bin/sh -c pip install x]" in out and "[bold]not bold[/bold]" in out


def test_every_progress_line_shows_markup_controls_and_workflow_commands_as_text(monkeypatch):
    for terminal, ci in ((False, "github"), (False, "gitlab"), (False, ""), (True, "")):
        progress, buffer = _progress(terminal, monkeypatch, ci)
        progress.title = HOSTILE[0]
        with progress:
            for text in HOSTILE:
                progress(text)
                progress.note(text)
            time.sleep(1.2 if terminal else 0)  # the live line's ticker redraws the last step
        out = buffer.getvalue()
        if ci == "github":  # the only system that reads commands from a log
            _no_command_starts(out, own=("::group::" + ui.for_log(HOSTILE[0]), "::endgroup::"))
        if not terminal:
            _no_hostile_controls(out.replace("\x1b[0Ksection", ""))
            assert "[/bin/sh -c pip install x]" in out


def test_errors_and_said_lines_never_start_a_workflow_command(capsys, monkeypatch):
    from imgbuild.annotation import Annotation, shown

    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    for text in HOSTILE:
        line = shown(Annotation(text, file=text))
        assert line.startswith("::error file=") and "\n" not in line and "\r" not in line
        _no_hostile_controls(line)
        ui.say(text)
    err = capsys.readouterr().err
    _no_hostile_controls(err)
    _no_command_starts(err)


def test_every_line_the_cli_hands_a_command_to_say_goes_through_ui_say():
    """A build's, an export's or a launch's lines (a RUN step's output: `\\r::stop-commands::`, escape sequences) are
    printed by the command line through the one helper that makes them safe for a terminal and a CI log; a callback
    that echoes them raw is a door around it."""
    import re

    cli = Path(ui.__file__).parent / "cli"
    raw = [
        f"{path.name}: {m.group(0)}"
        for path in sorted(cli.glob("*.py"))
        for m in re.finditer(r"lambda \w+: click\.echo\(|def say\([^)]*\)[^:]*:\s+click\.echo\(", path.read_text())
    ]
    assert raw == []
