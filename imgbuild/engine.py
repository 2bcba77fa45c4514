"""Stage 4: the container engine. The only module that talks to Docker.

Two build backends behind one interface: BuildKit through the docker CLI (`docker buildx build` where the
plugin exists, `DOCKER_BUILDKIT=1 docker build` with a CLI older than 23 that has it built in), and the
Docker Engine API through the `docker` SDK (no BuildKit: no cache mounts, no secrets). Everything else
(inspect, tag, run, push) goes through the SDK.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import requests

from imgbuild import imageref, limits
from imgbuild.errors import BuildFailed, EngineUnavailable, ImgbuildError, UsageError
from imgbuild.facts import Label

ProgressFn = Callable[[str], None]


class Redactor:
    """Replaces secret values in any text that goes to a log or a terminal."""

    def __init__(self, secrets: Iterable[str]):
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "****")
        return text


@dataclass
class BuildRequest:
    context: Path
    tag: str
    build_args: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, Path] = field(default_factory=dict)  # id -> file (BuildKit only)
    no_cache: bool = False
    log_path: Path | None = None
    builder: str | None = None
    iidfile: Path | None = None  # where BuildKit writes the image id; one per build, never shared
    timeout: float = limits.BUILD_SECONDS  # the build is stopped past this


@dataclass(frozen=True)
class ImageInfo:
    """What the pipeline needs to know of a local image (the engine's own type, not docker-py's)."""

    id: str
    labels: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # the image config's Config block (Env, Entrypoint, ...)
    repo_digests: tuple[str, ...] = ()

    def inspected(self, ref: str) -> tuple[str, dict[str, Any]]:
        """(registry digest of `ref`'s repository or "", config with the image "Id"), as plan.InspectBase."""
        repo = ref.split("@")[0].rsplit(":", 1)[0]
        digests = [d.split("@", 1)[1] for d in self.repo_digests if d.split("@")[0] == repo]
        return (digests[0] if digests else ""), {"config": self.config, "Id": self.id}


class ImageEngine(Protocol):
    """What the build pipeline, the smoke test and rebuild ask of an engine; `Engine` talks to Docker,
    `imgbuild.fake_engine.FakeEngine` keeps images in memory for unit tests of the pipeline's logic."""

    def pick_backend(self, wanted: str) -> str: ...
    def build(self, backend: str, req: BuildRequest, progress: ProgressFn, redact: Redactor) -> str: ...
    def image(self, ref: str) -> ImageInfo | None: ...
    def image_id(self, ref: str) -> str | None: ...
    def tag(self, image_id: str, ref: str) -> None: ...
    def untag(self, ref: str) -> None: ...
    def inspect_local(self, ref: str) -> tuple[str, dict[str, Any]] | None: ...
    def push(self, ref: str, auth: dict[str, str] | None, progress: ProgressFn) -> str: ...
    def host_has_gpus(self) -> bool: ...
    def remove_leftovers(self, candidate: str) -> None: ...
    def run_script(
        self,
        image: str,
        script: str,
        args: list[str],
        env: dict[str, str],
        *,
        gpus: bool,
        timeout: int = ...,
        shm_size: str = ...,
    ) -> tuple[int, str, str]: ...


@dataclass
class StepTracker:
    """Follows build output: which step runs now, and the last lines of each step for error reports."""

    current: str = ""
    steps: dict[str, str] = field(default_factory=dict)  # BuildKit vertex id -> step title
    tails: dict[str, deque[str]] = field(default_factory=dict)
    failed: str = ""

    def tail(self, key: str, n: int = 15) -> list[str]:
        return list(self.tails.get(key, deque()))[-n:]


_BK_STEP = re.compile(r"^#(\d+) (\[[^\]]+\] .*)$")
_BK_LINE = re.compile(r"^#(\d+) (?:\d+\.\d+ )?(.*)$")
_BK_ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")
_SDK_STEP = re.compile(r"^Step (\d+/\d+) : (.*)$")


class Engine:
    """A connection to a Docker engine."""

    def __init__(self, client: Any, docker_cli: str | None = None):
        self.client = client
        self._cli_hint = docker_cli

    @classmethod
    def connect(cls, docker_cli: str | None = None) -> Engine:
        try:
            import docker
            from docker.errors import DockerException
        except ImportError as exc:  # pragma: no cover - installed with imgbuild
            raise EngineUnavailable(f"the docker SDK is missing ({exc})") from None
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        try:
            client = docker.from_env(timeout=600)
            client.ping()
        except DockerException as exc:
            if "Permission denied" in str(exc) or "PermissionError" in str(exc):
                raise EngineUnavailable(
                    f"the Docker engine at {host} refused this user (permission denied on the socket): "
                    "ask an admin to add you to the docker group"
                ) from None
            reason = str(exc).split("(")[0].strip().rstrip(":")
            raise EngineUnavailable(
                f"no Docker engine at {host} ({reason[:80]}): start dockerd or set DOCKER_HOST "
                "(on a test machine, tests/testbed/up starts one)"
            ) from None
        return cls(client, docker_cli)

    # -- backends -----------------------------------------------------------------------------------

    @cached_property
    def buildkit_cli(self) -> tuple[str, bool] | None:
        """(docker CLI path, has buildx) for a CLI that can drive BuildKit, or None."""
        candidates = [self._cli_hint, shutil.which("docker"), "/usr/bin/docker"]
        for cli in dict.fromkeys(c for c in candidates if c):
            if not (os.path.isfile(cli) and os.access(cli, os.X_OK)):
                continue
            if _quiet([cli, "buildx", "version"]):
                return cli, True
            out = _output([cli, "version", "--format", "{{.Client.Version}}"])
            major = re.match(r"(\d+)\.", out or "")
            # The CLI >= 23 refuses DOCKER_BUILDKIT=1 without the buildx plugin; older ones have it built in.
            if major and int(major.group(1)) < 23:
                return cli, False
        return None

    def pick_backend(self, wanted: str) -> str:
        if wanted == "sdk":
            return "sdk"
        if self.buildkit_cli:
            return "buildkit"
        if wanted == "buildkit":
            raise EngineUnavailable(
                "the buildkit backend needs a docker CLI with the buildx plugin "
                "(or Debian's docker.io CLI); install one or use --backend sdk"
            )
        return "sdk"

    def build(self, backend: str, req: BuildRequest, progress: ProgressFn, redact: Redactor) -> str:
        """Build `req.context` and tag it `req.tag`; returns the image id. Raises BuildFailed."""
        if req.log_path:
            req.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(req.log_path or os.devnull, "w", encoding="utf-8") as log:
            if backend == "buildkit":
                return self._build_buildkit(req, progress, redact, log)
            if req.secrets:
                raise UsageError(
                    "build secrets need the buildkit backend: the Engine API builder would "
                    "bake them into a layer (use --backend buildkit)"
                )
            return self._build_sdk(req, progress, redact, log)

    def _build_buildkit(self, req: BuildRequest, progress: ProgressFn, redact: Redactor, log: Any) -> str:
        assert self.buildkit_cli
        cli, buildx = self.buildkit_cli
        iidfile = req.iidfile or req.context.parent / f".{req.context.name}.{os.getpid()}.iid"
        cmd = [cli, "buildx", "build", "--load"] if buildx else [cli, "build"]
        if buildx and req.builder:
            cmd += ["--builder", req.builder]
        cmd += ["--progress=plain", "--iidfile", str(iidfile), "-t", req.tag]
        for key, value in sorted(req.build_args.items()):
            cmd += ["--build-arg", f"{key}={value}"]
        for sid, path in sorted(req.secrets.items()):
            cmd += ["--secret", f"id={sid},src={path}"]
        if req.no_cache:
            cmd.append("--no-cache")
        cmd.append(str(req.context))
        env = dict(os.environ, DOCKER_BUILDKIT="1", BUILDKIT_PROGRESS="plain")
        tracker = StepTracker()
        try:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1, errors="replace"
            )
        except OSError as exc:
            raise EngineUnavailable(f"cannot run {cli}: {exc.strerror}") from None
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
            self._follow_buildkit(proc, progress, redact, log, tracker, error_lines)
            rc = proc.wait()
        finally:
            overtime.cancel()
            if proc.poll() is None:
                proc.kill()  # Ctrl-C or SIGTERM in imgbuild: the CLI goes too, and BuildKit cancels the build
                proc.wait()
        if timed_out.is_set():
            raise BuildFailed(
                f"the build ran past {req.timeout:.0f} s (build_timeout) and was stopped"
                + (f"\n  full log: {req.log_path}" if req.log_path else "")
            )
        if rc != 0:
            step = tracker.steps.get(tracker.failed, "") if tracker.failed else ""
            tail = tracker.tail(tracker.failed) if tracker.failed else error_lines[-15:]
            raise BuildFailed(_failure_text(step, tail, error_lines, req.log_path))
        try:
            image_id = iidfile.read_text().strip()
        finally:
            iidfile.unlink(missing_ok=True)
        return image_id

    @staticmethod
    def _follow_buildkit(
        proc: subprocess.Popen[str],
        progress: ProgressFn,
        redact: Redactor,
        log: Any,
        tracker: StepTracker,
        error_lines: list[str],
    ) -> None:
        assert proc.stdout
        for raw in proc.stdout:
            line = redact(raw.rstrip("\n"))
            log.write(line + "\n")
            if m := _BK_STEP.match(line):
                tracker.steps[m.group(1)] = m.group(2)
                tracker.current = m.group(1)
                progress(m.group(2))
            elif m := _BK_ERROR.match(line):
                tracker.failed = tracker.failed or m.group(1)
                error_lines.append(m.group(2))
            elif m := _BK_LINE.match(line):
                tracker.tails.setdefault(m.group(1), deque(maxlen=40)).append(m.group(2))
            elif line.startswith(("error:", "ERROR:", "failed to solve")):
                error_lines.append(line)

    def _build_sdk(self, req: BuildRequest, progress: ProgressFn, redact: Redactor, log: Any) -> str:
        from docker.errors import APIError

        tracker = StepTracker()
        outcome = {"image_id": "", "error": ""}
        try:
            stream = self.client.api.build(
                path=str(req.context),
                tag=req.tag,
                rm=True,
                forcerm=True,
                decode=True,
                buildargs=req.build_args,
                nocache=req.no_cache,
                dockerfile="Dockerfile",
            )
            for chunk in stream:
                _follow_sdk_chunk(chunk, tracker, outcome, progress, redact, log)
        except APIError as exc:
            outcome["error"] = redact(str(exc.explanation or exc))
        except requests.RequestException as exc:  # the engine went quiet past the client's read timeout
            outcome["error"] = f"the engine stopped answering ({type(exc).__name__})"
        if outcome["error"] or not outcome["image_id"]:
            step = tracker.steps.get(tracker.current, "")
            errors = [outcome["error"] or "no image id"]
            raise BuildFailed(_failure_text(step, tracker.tail(tracker.current), errors, req.log_path))
        return outcome["image_id"]

    # -- images ------------------------------------------------------------------------------------

    def image(self, ref: str) -> ImageInfo | None:
        from docker.errors import ImageNotFound

        try:
            img = self.client.images.get(ref)
        except ImageNotFound:
            return None
        config = img.attrs.get("Config") or {}
        return ImageInfo(
            id=img.id,
            labels=dict(config.get("Labels") or {}),
            config=config,
            repo_digests=tuple(img.attrs.get("RepoDigests") or ()),
        )

    def image_id(self, ref: str) -> str | None:
        img = self.image(ref)
        return img.id if img else None

    def tag(self, image_id: str, ref: str) -> None:
        parsed = imageref.parse(ref)
        self.client.api.tag(image_id, parsed.name, parsed.tag or "latest", force=True)

    def untag(self, ref: str) -> None:
        from docker.errors import APIError, ImageNotFound

        with contextlib.suppress(ImageNotFound, APIError):
            self.client.api.remove_image(ref, noprune=True)

    def inspect_local(self, ref: str) -> tuple[str, dict[str, Any]] | None:
        """(registry digest or "", config with the image "Id") of a local image."""
        img = self.image(ref)
        return None if img is None else img.inspected(ref)

    def save(self, ref: str, path: Path) -> None:
        """`docker save` to a file (for Apptainer's docker-archive bootstrap)."""
        with open(path, "wb") as fh:
            for chunk in self.client.images.get(ref).save(named=True):
                fh.write(chunk)

    def push(self, ref: str, auth: dict[str, str] | None, progress: ProgressFn) -> str:
        """Push and return the pushed digest. The engine reports push errors inside the stream."""
        parsed = imageref.parse(ref)
        repo, tag = parsed.name, parsed.tag or "latest"
        digest = ""
        for chunk in self.client.api.push(repo, tag=tag, stream=True, decode=True, auth_config=auth):
            if "error" in chunk or "errorDetail" in chunk:
                msg = chunk.get("errorDetail", {}).get("message") or chunk.get("error")
                raise ImgbuildError(f"push of {ref} failed: {msg}")
            if chunk.get("aux", {}).get("Digest"):
                digest = chunk["aux"]["Digest"]
            elif chunk.get("status") and chunk.get("id"):
                progress(f"pushing {ref}: {chunk['id']} {chunk['status']}")
        if not digest:
            raise ImgbuildError(f"push of {ref} ended without a digest")
        return digest

    # -- containers --------------------------------------------------------------------------------

    def cli(self) -> str:
        """A docker CLI for interactive commands (run -it, attach, exec); any version will do."""
        for cli in (self._cli_hint, shutil.which("docker"), "/usr/bin/docker"):
            if cli and os.path.isfile(cli) and os.access(cli, os.X_OK):
                return cli
        raise EngineUnavailable("no docker CLI found: install docker (the client) or set IMGBUILD_DOCKER_CLI")

    def run_cli(self, args: list[str]) -> int:
        """Run the docker CLI with the terminal attached; returns its exit code."""
        return subprocess.run([self.cli(), *args]).returncode

    def exec_cli(self, args: list[str]) -> None:
        """Become the docker CLI (attach, logs, exec): signals and the terminal go straight to it, and
        nothing is left behind when imgbuild is killed."""
        cli = self.cli()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(cli, [cli, *args])

    def run_cli_captured(self, args: list[str]) -> tuple[int, str]:
        """Run the docker CLI, passing stdout through and keeping stderr to explain failures."""
        proc = subprocess.run([self.cli(), *args], stderr=subprocess.PIPE, text=True)
        if proc.stderr:
            sys.stderr.write(proc.stderr)
        return proc.returncode, proc.stderr

    def container_names(self) -> set[str]:
        return {c.name for c in self.client.containers.list(all=True)}

    def containers(self, name_prefix: str = "") -> list[dict[str, Any]]:
        rows = []
        for c in self.client.containers.list(all=True):
            if name_prefix and not c.name.startswith(name_prefix):
                continue
            host = c.attrs.get("HostConfig") or {}
            labels = (c.attrs.get("Config") or {}).get("Labels") or {}
            rows.append(
                {
                    "name": c.name,
                    "id": c.short_id,
                    "image": (c.attrs.get("Config") or {}).get("Image", ""),
                    "status": c.status,
                    "user": labels.get(Label.USER, c.name.split("_", 1)[0]),
                    "gpus": labels.get(Label.GPUS, ""),
                    "cpus": (host.get("NanoCpus") or 0) / 1e9 or None,
                    "created": c.attrs.get("Created", "")[:19].replace("T", " "),
                }
            )
        return sorted(rows, key=lambda r: r["name"])

    def cpu_percent(self, name: str) -> float | None:
        """The container's CPU use as a percentage of its limit (or of the host), from one stats read."""
        from docker.errors import APIError, NotFound

        try:
            container = self.client.containers.get(name)
            stats = container.stats(stream=False)
        except (NotFound, APIError):
            return None
        cpu, pre = stats.get("cpu_stats") or {}, stats.get("precpu_stats") or {}
        try:
            used = cpu["cpu_usage"]["total_usage"] - pre["cpu_usage"]["total_usage"]
            system = cpu["system_cpu_usage"] - pre["system_cpu_usage"]
        except (KeyError, TypeError):
            return None
        online = cpu.get("online_cpus") or os.cpu_count() or 1
        if system <= 0:
            return None
        limit = (container.attrs.get("HostConfig", {}).get("NanoCpus") or 0) / 1e9 or online
        return 100.0 * used / system * online / limit

    def host_has_gpus(self) -> bool:
        return any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"))

    def remove_leftovers(self, candidate: str) -> None:
        """Remove what a killed run left for `candidate`: smoke containers (labelled) and the candidate tag."""
        from docker.errors import APIError, NotFound

        try:
            stale = self.client.containers.list(all=True, filters={"label": f"{SMOKE_LABEL}={candidate}"})
        except APIError:
            stale = []
        for container in stale:
            with contextlib.suppress(APIError, NotFound):
                container.remove(force=True)
        self.untag(candidate)

    def run_script(
        self,
        image: str,
        script: str,
        args: list[str],
        env: dict[str, str],
        *,
        gpus: bool,
        timeout: int = 1800,
        shm_size: str = "1g",
    ) -> tuple[int, str, str]:
        """Run a Python script inside `image` (copied in, so remote engines work too).

        Returns (exit code, output, note). `note` says why GPUs were asked for but not given. The container
        is labelled with the image it tests, removed on every way out, and removed by the next run of the
        same target if this process is killed."""
        from docker.errors import APIError
        from docker.types import DeviceRequest

        img = self.client.images.get(image)
        entrypoint = (img.attrs.get("Config") or {}).get("Entrypoint") or []
        keep_entrypoint = not entrypoint or any("nvidia_entrypoint" in part for part in entrypoint)
        command = ["python3", "/tmp/imgbuild-smoke.py", *args]
        kwargs: dict[str, Any] = dict(
            environment=env, shm_size=shm_size, detach=True, user="root", labels={SMOKE_LABEL: image}
        )
        if not keep_entrypoint:
            kwargs["entrypoint"] = command[:1]
            command = command[1:]
        note = ""
        device_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None
        container = self.client.containers.create(image, command, device_requests=device_requests, **kwargs)
        try:
            container.put_archive("/tmp", _script_tar(script))
            try:
                container.start()
            except APIError as exc:
                if not device_requests:
                    raise
                # Docker applies device requests at start: no toolkit, an old driver, CUDA error 804.
                note = (
                    f"the host has GPUs but the engine cannot pass them ({str(exc.explanation)[:200]}); "
                    "install nvidia-container-toolkit"
                )
                container.remove(force=True)
                container = self.client.containers.create(image, command, **kwargs)
                container.put_archive("/tmp", _script_tar(script))
                container.start()
            try:
                code = container.wait(timeout=timeout)["StatusCode"]
            except requests.RequestException:  # the SDK's read timeout: the script ran past `timeout`
                container.kill()
                raise ImgbuildError(f"the smoke test in {image} ran past {timeout} s") from None
            out = container.logs(stdout=True, stderr=False).decode(errors="replace")
            err = container.logs(stdout=False, stderr=True).decode(errors="replace")
            return code, out + ("\n" + err if err else ""), note
        finally:
            with contextlib.suppress(APIError):
                container.remove(force=True)


SMOKE_LABEL = Label.SMOKE_OF


def _follow_sdk_chunk(
    chunk: dict[str, Any],
    tracker: StepTracker,
    outcome: dict[str, str],
    progress: ProgressFn,
    redact: Redactor,
    log: Any,
) -> None:
    """One decoded chunk of the Engine API's build stream: step lines, output, an error, the image id."""
    for raw in chunk.get("stream", "").splitlines():
        line = redact(raw.rstrip())
        if not line:
            continue
        log.write(line + "\n")
        if m := _SDK_STEP.match(line):
            tracker.current = m.group(1)
            tracker.steps[m.group(1)] = f"[{m.group(1)}] {m.group(2)}"
            progress(tracker.steps[m.group(1)])
        else:
            tracker.tails.setdefault(tracker.current, deque(maxlen=40)).append(line)
    if "error" in chunk or "errorDetail" in chunk:
        outcome["error"] = redact((chunk.get("errorDetail") or {}).get("message") or chunk.get("error", ""))
        log.write("ERROR: " + outcome["error"] + "\n")
    if isinstance(chunk.get("aux"), dict) and "ID" in chunk["aux"]:
        outcome["image_id"] = chunk["aux"]["ID"]


def _script_tar(script: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = script.encode()
        info = tarfile.TarInfo("imgbuild-smoke.py")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _failure_text(step: str, tail: list[str], errors: list[str], log_path: Path | None) -> str:
    head = f"build failed at {step}" if step else "build failed"
    reason = next((e for e in reversed(errors) if e), "")
    if reason:
        head += f": {reason.strip()[:300]}"
    lines = [head]
    lines += [f"  | {t}" for t in tail[-12:]]
    if log_path:
        lines.append(f"  full log: {log_path}")
    return "\n".join(lines)


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
