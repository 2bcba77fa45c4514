"""`imgbuild admin setup`: a shared server's own set-up, made the way the docs describe, and `doctor`'s look at it.

The pieces: the state folder (root's, sticky and world-writable like /tmp, with root's own 0700 folder inside), a
minimal enforced-mode site config, the sudoers drop-in (`enforce.sudoers`), and the reaper's systemd service and
timer (docs/reap.md). Each file imgbuild writes carries a first line with the hash of the rest: a later `setup`
replaces a file only while that hash still holds (its own, unedited), and keeps one an admin edited or wrote
themself, saying so. Running it twice changes nothing.

Pure in the middle: `plan(Layout)` says what each file should hold; `judge(SetupFacts)` says doctor's lines from
what was read. `apply` and `collect` are the edges.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from imgbuild.errors import EnvironmentProblem
from imgbuild.servers.doctor import Line

SUDOERS_FILE = "/etc/sudoers.d/imgbuild"
REAP_SERVICE = "/etc/systemd/system/imgbuild-reap.service"
REAP_TIMER = "/etc/systemd/system/imgbuild-reap.timer"
_MARK = "# imgbuild admin setup wrote this file (sha256 of the rest: {digest}); edit it and setup leaves it alone\n"
FIX = "sudo imgbuild admin setup"


@dataclass(frozen=True)
class Layout:
    """Where the pieces go: the real paths, or all of them under one folder (`admin setup --root DIR`)."""

    state_dir: Path
    site_config: Path
    sudoers: Path
    service: Path
    timer: Path
    binary: str  # imgbuild's absolute path, as the drop-in and the service name it
    named_state_dir: Path  # the state folder as the site config names it (never under `--root`)

    @classmethod
    def of(cls, state_dir: Path, site_config: Path, binary: str, root: Path | None = None) -> Layout:
        def at(path: str | Path) -> Path:
            return root / str(path).lstrip("/") if root is not None else Path(path)

        return cls(
            at(state_dir), at(site_config), at(SUDOERS_FILE), at(REAP_SERVICE), at(REAP_TIMER), binary, state_dir
        )


@dataclass(frozen=True)
class Piece:
    path: Path
    text: str  # without the first line `setup` adds
    mode: int


def site_config_text(state_dir: Path) -> str:
    """The minimal enforced-mode site config: the state folder, what a run may use and mount, caps, deadlines."""
    return (
        "# The site's rules for every user of this server (docs/servers.md). `imgbuild config` shows each value\n"
        "# and where it came from.\n"
        "run:\n"
        f"  state_dir: {state_dir}          # root's, made by `imgbuild admin setup`\n"
        "  allowed_images: [nvcr.io/nvidia/*, '{user}/*']   # enforced mode: what a run may start\n"
        "  allowed_mounts: ['{home}']       # enforced mode: what a run may mount (checked as the user)\n"
        "  max_gpus_per_user: 2\n"
        "  default_time: 2d                 # a run's deadline without --time\n"
        "  max_time: 7d\n"
        "  pids_limit: 4096                 # per run; memory: three quarters of the host unless run.memory says\n"
        "reap:\n"
        "  idle_timeout: 4h\n"
        "  exited_max_age: 7d\n"
        "  image_max_age: 30d               # users' images no container used for this long: removed\n"
        "  remove: true\n"
    )


def service_text(binary: str) -> str:
    return (
        "[Unit]\n"
        "Description=imgbuild reap: enforce the GPU server's house rules\n"
        "After=docker.service\n"
        "Requires=docker.service\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"ExecStart={binary} reap\n"
        "ProtectSystem=full\n"
        "TimeoutStartSec=10min\n"
    )


TIMER_TEXT = (
    "[Unit]\n"
    "Description=Run imgbuild reap every 5 minutes\n\n"
    "[Timer]\n"
    "OnBootSec=5min\n"
    "OnUnitActiveSec=5min\n"
    "AccuracySec=30s\n\n"
    "[Install]\n"
    "WantedBy=timers.target\n"
)


def plan(layout: Layout) -> list[Piece]:
    """What each file of the set-up should hold (pure)."""
    from imgbuild.servers.enforce import sudoers

    return [
        Piece(layout.site_config, site_config_text(layout.named_state_dir), 0o644),
        Piece(layout.sudoers, sudoers(layout.binary), 0o440),
        Piece(layout.service, service_text(layout.binary), 0o644),
        Piece(layout.timer, TIMER_TEXT, 0o644),
    ]


def marked(text: str) -> str:
    return _MARK.format(digest=hashlib.sha256(text.encode()).hexdigest()[:16]) + text


def ours_unedited(found: str) -> bool:
    """A file `setup` wrote whose text is still what it wrote (its first line's hash holds)."""
    first, _, rest = found.partition("\n")
    return first + "\n" == _MARK.format(digest=hashlib.sha256(rest.encode()).hexdigest()[:16])


# --- the edge: making it ---------------------------------------------------------------------------------


def apply(layout: Layout, dry_run: bool = False) -> list[tuple[str, str]]:
    """Make every piece: (what, what happened) each. The state folder first (root's 1777, root's 0700 `.reap`),
    then each file: written when absent, replaced when it is setup's own unedited older text, kept otherwise."""
    done = [(f"state folder {layout.state_dir}", _state_folder(layout.state_dir, dry_run))]
    for piece in plan(layout):
        done.append((str(piece.path), _file(piece, dry_run, check=_visudo if piece.path == layout.sudoers else None)))
    return done


def _state_folder(folder: Path, dry_run: bool) -> str:
    from imgbuild.servers.ledger import REAPER_DIR

    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise EnvironmentProblem(f"cannot read {folder}: {exc.strerror}") from None
    if info is not None and (not stat.S_ISDIR(info.st_mode) or info.st_uid != 0):
        who = "a link or a file" if not stat.S_ISDIR(info.st_mode) else f"uid {info.st_uid}'s"
        raise EnvironmentProblem(
            f"{folder} is {who}, not root's folder: someone made it first; look at what is in it, remove it "
            "(rm -r), then run setup again"
        )
    if dry_run:
        return "would make" if info is None else "checked"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if info is None:
            os.mkdir(folder, 0o755)  # made private first, opened to all once it is certainly root's folder
        os.chown(folder, 0, 0, follow_symlinks=False)
        os.chmod(folder, 0o1777, follow_symlinks=False)
        own = folder / REAPER_DIR
        with contextlib.suppress(FileExistsError):
            os.mkdir(own, 0o700)
        own_info = os.lstat(own)
        if not stat.S_ISDIR(own_info.st_mode) or own_info.st_uid != 0:
            raise EnvironmentProblem(f"{own} is not root's folder; remove it, then run setup again")
        os.chmod(own, 0o700, follow_symlinks=False)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot make the state folder {folder}: {exc.strerror} (run setup as root)") from None
    return "made" if info is None else "ok"


def _file(piece: Piece, dry_run: bool, check: object = None) -> str:
    from imgbuild.hostio.regular import read_regular, write_atomic

    wanted = marked(piece.text)
    try:
        found = read_regular(piece.path, 1024 * 1024)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        raise EnvironmentProblem(f"cannot read {piece.path}: {exc.strerror}") from None
    if found is not None:
        text = found[0].decode(errors="replace")
        if text == wanted:
            return "ok"
        if not ours_unedited(text):
            return "kept: edited by an admin (or not setup's); compare with `imgbuild admin setup --print`"
    elif piece.path.exists():
        return "kept: not a regular file"
    if dry_run:
        return "would write" if found is None else "would update"
    if callable(check):
        check(wanted)
    try:
        piece.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(piece.path, wanted, mode=piece.mode)
        os.chmod(piece.path, piece.mode)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write {piece.path}: {exc.strerror} (run setup as root)") from None
    return "written" if found is None else "updated (setup's own older text)"


def _visudo(text: str) -> None:
    """Refuse a drop-in sudo would not parse (sudo then refuses every rule, the admin's own included)."""
    visudo = shutil.which("visudo") or next((p for p in ("/usr/sbin/visudo", "/sbin/visudo") if os.path.exists(p)), "")
    if not visudo:
        return  # no sudo on this host yet: the drop-in waits for it; doctor checks it once sudo is there
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".sudoers") as draft:
        draft.write(text)
        draft.flush()
        done = subprocess.run([visudo, "-cf", draft.name], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise EnvironmentProblem(f"visudo refuses the drop-in: {(done.stderr or done.stdout).strip()[:200]}")


# --- doctor's look at it -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileFacts:
    path: str
    exists: bool = False
    uid: int = -1
    mode: int = 0
    ours_unedited: bool = False
    text: str = ""


@dataclass(frozen=True)
class SetupFacts:
    state_dir: str
    state_uid: int | None  # None: absent
    state_mode: int
    state_is_dir: bool
    state_parent_open: bool  # the folder it is made in is writable by others (/tmp): someone may make it first
    site_config: FileFacts  # it loads: every command, doctor too, reads it first and stops on its first bad line
    sudoers: FileFacts
    sudoers_parses: bool | None  # None: no visudo to ask
    binary: str
    timer: FileFacts
    timer_enabled: bool | None  # None: no systemd to ask
    interpreter_blocked: str  # a folder on the way to imgbuild's Python that other users cannot enter ("": none)


def judge(facts: SetupFacts) -> list[Line]:
    """Doctor's lines for imgbuild's own set-up, each with its fix."""
    return [
        _state_line(facts),
        _site_line(facts),
        _sudoers_line(facts),
        _timer_line(facts),
        _interpreter_line(facts),
    ]


def _state_line(facts: SetupFacts) -> Line:
    where = facts.state_dir
    if facts.state_uid is None and facts.state_parent_open:
        return Line(
            "state folder",
            "fail",
            f"{where} does not exist, in a folder others write: whoever makes it first owns it",
            FIX,
        )
    if facts.state_uid is None:
        return Line("state folder", "warn", f"{where} does not exist yet (root's first run makes it)", FIX)
    if not facts.state_is_dir:
        return Line("state folder", "fail", f"{where} is not a folder (a link or a file)", f"rm {where}; {FIX}")
    if facts.state_uid != 0:
        return Line(
            "state folder", "fail", f"{where} belongs to uid {facts.state_uid}, who can remove what others keep",
            f"rm -r {where}; {FIX}",
        )  # fmt: skip
    if stat.S_IMODE(facts.state_mode) != 0o1777:
        return Line(
            "state folder",
            "fail",
            f"{where} has mode {stat.S_IMODE(facts.state_mode):o}, not 1777",
            f"chmod 1777 {where}",
        )
    return Line("state folder", "ok", f"{where}: root's, 1777")


def _site_line(facts: SetupFacts) -> Line:
    site = facts.site_config
    if not site.exists:
        return Line("site config", "warn", f"{site.path} does not exist: every rule is imgbuild's default", FIX)
    return _others_may_change("site config", site, 0o644) or Line("site config", "ok", f"{site.path} loads")


def _others_may_change(check: str, file: FileFacts, mode: int) -> Line | None:
    """The failing line of a file of root's that someone else owns or may write; None when it is root's alone."""
    if file.uid == 0 and not file.mode & 0o022:
        return None
    fix = f"chown root {file.path}; chmod {mode:o} {file.path}"
    return Line(check, "fail", f"{file.path} can be changed by others", fix)


def _sudoers_line(facts: SetupFacts) -> Line:
    drop_in = facts.sudoers
    if not drop_in.exists:
        return Line(
            "sudoers drop-in",
            "info",
            f"{drop_in.path} does not exist: no enforced mode (users in the docker group)",
            FIX,
        )
    if facts.sudoers_parses is False:
        return Line(
            "sudoers drop-in",
            "fail",
            f"visudo -cf {drop_in.path} refuses it: sudo refuses every rule",
            f"rm {drop_in.path}; {FIX}",
        )
    if changeable := _others_may_change("sudoers drop-in", drop_in, 0o440):
        return changeable
    if f"{facts.binary} run" not in drop_in.text:
        return Line(
            "sudoers drop-in", "warn", f"{drop_in.path} does not name this imgbuild ({facts.binary})",
            f"imgbuild admin sudoers --binary {facts.binary}, or {FIX} after removing it",
        )  # fmt: skip
    return Line("sudoers drop-in", "ok", f"{drop_in.path} names {facts.binary}")


def _timer_line(facts: SetupFacts) -> Line:
    if not facts.timer.exists:
        return Line(
            "reap timer", "warn", f"{facts.timer.path} does not exist: nothing reaps or advances the queue", FIX
        )
    if facts.timer_enabled is False:
        return Line(
            "reap timer", "fail", "imgbuild-reap.timer is not enabled", "systemctl enable --now imgbuild-reap.timer"
        )
    return Line("reap timer", "ok", f"{facts.timer.path}" + (" enabled" if facts.timer_enabled else ""))


def _interpreter_line(facts: SetupFacts) -> Line:
    if facts.interpreter_blocked:
        return Line(
            "python", "fail",
            f"{facts.interpreter_blocked} on the way to imgbuild's Python is closed to other users: their queued "
            "jobs cannot start",
            "make the /opt venv from the system Python (/usr/bin/python3 -m venv /opt/imgbuild), not root's own",
        )  # fmt: skip
    return Line("python", "ok", "imgbuild's Python is reachable by every user")


def collect(layout: Layout) -> SetupFacts:
    """Read the set-up as it is on this host (changes nothing)."""
    state: tuple[int | None, int, bool]
    try:
        info = os.lstat(layout.state_dir)
        state = (info.st_uid, info.st_mode, stat.S_ISDIR(info.st_mode))
    except OSError:
        state = (None, 0, False)
    try:
        parent_open = bool(os.stat(layout.state_dir.parent).st_mode & 0o002)
    except OSError:
        parent_open = False
    drop_in = _file_facts(layout.sudoers)
    return SetupFacts(
        str(layout.state_dir), state[0], state[1], state[2], parent_open,
        _file_facts(layout.site_config),
        drop_in, _parses(layout.sudoers) if drop_in.exists else None, layout.binary,
        _file_facts(layout.timer), _timer_enabled(),
        blocked_on_the_way(Path(sys.executable)) or blocked_on_the_way(Path(os.path.realpath(sys.executable))),
    )  # fmt: skip


def _file_facts(path: Path) -> FileFacts:
    from imgbuild.hostio.regular import read_regular

    try:
        found = read_regular(path, 1024 * 1024)
    except OSError:
        return FileFacts(str(path))
    if found is None:
        return FileFacts(str(path), exists=True)
    text = found[0].decode(errors="replace")
    return FileFacts(str(path), True, found[1].st_uid, found[1].st_mode, ours_unedited(text), text)


def _parses(path: Path) -> bool | None:
    visudo = shutil.which("visudo") or next((p for p in ("/usr/sbin/visudo", "/sbin/visudo") if os.path.exists(p)), "")
    if not visudo:
        return None
    try:
        return subprocess.run([visudo, "-cf", str(path)], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None


def _timer_enabled() -> bool | None:
    if not os.path.isdir("/run/systemd/system") or not shutil.which("systemctl"):
        return None  # no systemd as PID 1 here
    try:
        done = subprocess.run(
            ["systemctl", "is-enabled", "imgbuild-reap.timer"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() == "enabled"


def blocked_on_the_way(path: Path) -> str:
    """The first folder on the way to `path` that other users cannot enter; "" when none."""
    for folder in [*reversed(path.parents)]:
        try:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return str(folder)
        except OSError:
            return str(folder)
    return ""
