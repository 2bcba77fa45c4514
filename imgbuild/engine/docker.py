"""The Docker engine: builds (through the BuildKit or the Engine API backend), the image store and the
containers the smoke test and `imgbuild run` start. The only place that talks to Docker."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from functools import cached_property
from pathlib import Path
from typing import Any

import requests

from imgbuild import imageref
from imgbuild.engine import buildkit, sdk
from imgbuild.engine.types import BuildRequest, ImageInfo, ProgressFn, Redactor
from imgbuild.errors import EngineUnavailable, ImgbuildError, UsageError
from imgbuild.facts import Label

SMOKE_LABEL = Label.SMOKE_OF


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
        return buildkit.find_cli(self._cli_hint)

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
                assert self.buildkit_cli
                return buildkit.build(*self.buildkit_cli, req, progress, redact, log)
            if req.secrets:
                raise UsageError(
                    "build secrets need the buildkit backend: the Engine API builder would "
                    "bake them into a layer (use --backend buildkit)"
                )
            return sdk.build(self.client, req, progress, redact, log)

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

        info = self.image(image)
        entrypoint = (info.config.get("Entrypoint") if info else None) or []
        keep_entrypoint = not entrypoint or any("nvidia_entrypoint" in part for part in entrypoint)
        command = ["python3", "/tmp/imgbuild-smoke.py", *args]
        kwargs: dict[str, Any] = dict(
            environment=env, shm_size=shm_size, detach=True, user="root", labels={SMOKE_LABEL: image}
        )
        if not keep_entrypoint:
            kwargs["entrypoint"] = command[:1]
            command = command[1:]
        payload = _script_tar(script)

        def prepared(device_requests: list[Any] | None) -> Any:
            """A created container with the script copied in; removed again if the copy fails."""
            container = self.client.containers.create(image, command, device_requests=device_requests, **kwargs)
            try:
                container.put_archive("/tmp", payload)
            except BaseException:
                with contextlib.suppress(APIError):
                    container.remove(force=True)
                raise
            return container

        note = ""
        gpu_requests = [DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None
        container = prepared(gpu_requests)
        try:
            try:
                container.start()
            except APIError as exc:
                if not gpu_requests:
                    raise
                # Docker applies device requests at start: no toolkit, an old driver, CUDA error 804.
                note = (
                    f"the host has GPUs but the engine cannot pass them ({str(exc.explanation)[:200]}); "
                    "install nvidia-container-toolkit"
                )
                container.remove(force=True)
                container = prepared(None)
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


def _script_tar(script: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = script.encode()
        info = tarfile.TarInfo("imgbuild-smoke.py")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
