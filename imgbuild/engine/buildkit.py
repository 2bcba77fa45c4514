"""The BuildKit backend: the docker CLI (`docker buildx build`, or `DOCKER_BUILDKIT=1 docker build` with a CLI
older than 23, which has BuildKit built in). Cache mounts, bind mounts and secrets work here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from imgbuild.engine.types import (
    _BK_ERROR,
    _BK_LINE,
    _BK_STEP,
    BuildRequest,
    ProgressFn,
    Redactor,
    StepTracker,
    _failure_text,
    engine_fault,
    own_status,
    step_name,
)
from imgbuild.errors import BuildFailed, EngineFault, EngineUnavailable
from imgbuild.hostio.regular import LogWriter


def docker_clis(hint: str | None) -> list[str]:
    """The docker CLIs to try, in order: the one the settings name, the PATH's, /usr/bin/docker; executable ones."""
    candidates = [hint, shutil.which("docker"), "/usr/bin/docker"]
    return [c for c in dict.fromkeys(c for c in candidates if c) if os.path.isfile(c) and os.access(c, os.X_OK)]


def find_cli(hint: str | None) -> tuple[str, bool] | None:
    """(docker CLI path, has buildx) for a CLI that can drive BuildKit, or None."""
    for cli in docker_clis(hint):
        if _quiet([cli, "buildx", "version"]):
            return cli, True
        out = _output([cli, "version", "--format", "{{.Client.Version}}"])
        major = re.match(r"([0-9]+)\.", out or "")
        # The CLI >= 23 refuses DOCKER_BUILDKIT=1 without the buildx plugin; older ones have it built in.
        if major and int(major.group(1)) < 23:
            return cli, False
    return None


def build(cli: str, buildx: bool, req: BuildRequest, progress: ProgressFn, redact: Redactor, log: LogWriter) -> str:
    """Build with BuildKit through the docker CLI (`buildx build --load`, or a pre-23 CLI's built-in BuildKit)."""
    iidfile = req.iidfile or req.context.parent / f".{req.context.name}.{os.getpid()}.iid"
    cmd = [cli, "buildx", "build", "--load"] if buildx else [cli, "build"]
    if buildx and req.builder:
        cmd += ["--builder", req.builder]
    cmd += ["--progress=plain", "--iidfile", str(iidfile), "-t", req.tag, *input_args(req)]
    cmd += cache_args(req, buildx)
    cmd.append(str(req.context))
    if req.timestamp is not None:
        progress(
            "--reproducible: the docker CLI's BuildKit cannot set layer times (BuildKit 0.8 has no SOURCE_DATE_EPOCH), "
            "so this image's digest differs run to run; its bytecode does not (engine: podman builds it bit for bit)"
        )
    env = dict(os.environ, DOCKER_BUILDKIT="1", BUILDKIT_PROGRESS="plain")
    return drive(cmd, env, req, iidfile, _follow, progress, redact, log)


def input_args(req: BuildRequest) -> list[str]:
    """What both build CLIs (docker's, podman's) spell alike: build arguments, secrets as files, no cache."""
    args: list[str] = []
    for key, value in sorted(req.build_args.items()):
        args += ["--build-arg", f"{key}={value}"]
    for sid, path in sorted(req.secrets.items()):
        args += ["--secret", f"id={sid},src={path}"]
    return [*args, "--no-cache"] if req.no_cache else args


#: Reads one CLI's build output: (proc, progress, redact, log, tracker, error_lines).
Follower = Callable[[subprocess.Popen[str], ProgressFn, Redactor, LogWriter, StepTracker, list[str]], None]


def drive(
    cmd: list[str],
    env: dict[str, str],
    req: BuildRequest,
    iidfile: Path,
    follow: Follower,
    progress: ProgressFn,
    redact: Redactor,
    log: LogWriter,
) -> str:
    """Run a build CLI (docker's, podman's) to its end within `req.timeout`, its output read by `follow`; the
    image id from `iidfile`. Raises BuildFailed (EngineFault for the engine's own failures)."""
    tracker = StepTracker()
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1, errors="replace"
        )
    except OSError as exc:
        raise EngineUnavailable(f"cannot run {cmd[0]}: {exc.strerror}") from None
    assert proc.stdout
    error_lines: list[str] = []
    timed_out = threading.Event()

    def stop_overtime() -> None:
        timed_out.set()
        proc.kill()

    overtime = threading.Timer(req.timeout, stop_overtime)  # a `run: sleep infinity` ends here
    overtime.daemon = True
    overtime.start()
    try:
        follow(proc, progress, redact, log, tracker, error_lines)
        rc = proc.wait()
    finally:
        overtime.cancel()
        if proc.poll() is None:
            proc.kill()  # Ctrl-C or SIGTERM in imgbuild: the CLI goes too, and the builder cancels the build
            proc.wait()
    if timed_out.is_set():
        raise BuildFailed(
            f"the build ran past {req.timeout:.0f} s (build_timeout) and was stopped"
            + (f"\n  full log: {req.log_path}" if req.log_path else "")
        )
    if rc != 0:
        step = tracker.steps.get(tracker.failed, "") if tracker.failed else ""
        tail = tracker.tail(tracker.failed) if tracker.failed else error_lines[-15:]
        failure = EngineFault if engine_fault(error_lines) else BuildFailed
        raise failure(_failure_text(step, tail, error_lines, req.log_path))
    try:
        image_id = iidfile.read_text().strip()
    finally:
        iidfile.unlink(missing_ok=True)
    return image_id


def cache_args(req: BuildRequest, buildx: bool) -> list[str]:
    """The registry-cache flags of a build. Every BuildKit has the inline cache (the image's config records the
    cache of its own layers; a pushed copy seeds a build anywhere, `--cache-from IMAGE`); a buildx builder of
    its own (`--builder`, docker-container driver) also exports every stage's cache to `cache_to` (mode=max)."""
    args: list[str] = []
    if req.inline_cache:
        args += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
    for ref in req.cache_from:
        args += ["--cache-from", f"type=registry,ref={ref}" if buildx else ref]
    if req.cache_to and buildx and req.builder:
        args += ["--cache-from", f"type=registry,ref={req.cache_to}"]
        args += ["--cache-to", f"type=registry,ref={req.cache_to},mode=max"]
    return args


def _follow(
    proc: subprocess.Popen[str],
    progress: ProgressFn,
    redact: Redactor,
    log: LogWriter,
    tracker: StepTracker,
    error_lines: list[str],
) -> None:
    assert proc.stdout
    cache_imports: set[str] = set()  # vertices importing a registry cache: their failure fails no build
    for raw in proc.stdout:
        line = redact(raw.rstrip("\n"))
        log.write(line + "\n")
        if m := _BK_STEP.fullmatch(line):
            tracker.steps[m.group(1)] = m.group(2)
            tracker.current = m.group(1)
            progress(step_name(m.group(2)))
        elif m := _BK_CACHE_IMPORT.fullmatch(line):
            cache_imports.add(m.group(1))
        elif (m := _BK_ERROR.fullmatch(line)) and m.group(1) in cache_imports:
            progress(f"no registry cache to start from ({m.group(2)[:160]})")  # a first push: nothing there yet
        elif m := _BK_ERROR.fullmatch(line):
            tracker.failed = tracker.failed or m.group(1)
            error_lines.append(m.group(2))
        elif m := _BK_LINE.fullmatch(line):
            tracker.tails.setdefault(m.group(1), deque(maxlen=40)).append(m.group(2))
            if status := own_status(m.group(2)):
                progress(status)
        elif line.startswith(("error:", "ERROR:", "failed to solve")):
            error_lines.append(line)


_BK_CACHE_IMPORT = re.compile(r"#([0-9]+) importing cache manifest from .*")


def _quiet(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _output(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        return proc.stdout.strip() if proc.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None
