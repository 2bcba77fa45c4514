"""The Docker engine: builds (through the BuildKit or the Engine API backend), with the image store
(`images.py`) and the containers (`containers.py`) beside it. The only package that talks to Docker."""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any

from imgbuild.engine import buildkit, sdk
from imgbuild.engine.containers import DockerContainers
from imgbuild.engine.images import DockerImages
from imgbuild.engine.types import BuildRequest, ProgressFn, Redactor
from imgbuild.errors import EngineFault, EngineUnavailable, UsageError


class Engine:
    """A connection to a Docker engine: its two build backends, `images` (the image store) and
    `containers` (the smoke test's container and the docker CLI)."""

    def __init__(self, client: Any, docker_cli: str | None = None):
        self.client = client
        self._cli_hint = docker_cli
        self.images = DockerImages(client)
        self.containers = DockerContainers(client, self.images, docker_cli)

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
                try:
                    return buildkit.build(*self.buildkit_cli, req, progress, redact, log)
                except EngineFault as exc:
                    # BuildKit loses a step's container now and then (moby/buildkit#4483); the steps done
                    # are cached, so one more try costs little. A step's own failure is never retried.
                    first = str(exc).splitlines()[0]
                    progress(f"the engine failed on its own ({first[:120]}); building once more")
                    log.write(f"--- imgbuild: engine fault, building once more: {first}\n")
                    return buildkit.build(*self.buildkit_cli, req, progress, redact, log)
            if req.secrets:
                raise UsageError(
                    "build secrets need the buildkit backend: the Engine API builder would "
                    "bake them into a layer (use --backend buildkit)"
                )
            return sdk.build(self.client, req, progress, redact, log)

    # -- both ---------------------------------------------------------------------------------------

    def host_info(self) -> dict[str, Any]:
        """What the engine says of its host: its version (for `doctor` and provenance records), default and known
        runtimes, cgroup version, CDI devices; {"error": why} when it does not answer."""
        import requests
        from docker.errors import DockerException

        try:
            info = self.client.info()
        except (DockerException, requests.RequestException) as exc:
            return {"error": str(exc).splitlines()[0][:200]}
        devices = [str(d.get("ID", "")) for d in info.get("DiscoveredDevices") or [] if isinstance(d, dict)]
        return {
            "version": str(info.get("ServerVersion", "")),
            "default_runtime": str(info.get("DefaultRuntime", "")),
            "runtimes": sorted(info.get("Runtimes") or {}),
            "cgroup_version": str(info.get("CgroupVersion", "")),
            "cdi_devices": devices,
        }

    def host_has_gpus(self) -> bool:
        """Whether the engine's host has NVIDIA GPUs: this machine's device nodes for a local engine; for a
        remote one (tcp://, ssh://) what the engine reports (an NVIDIA runtime, or CDI GPU devices)."""
        from imgbuild.gpus import gpu_devices_present

        host = os.environ.get("DOCKER_HOST", "")
        if not host or host.startswith(("unix://", "npipe://")):
            return gpu_devices_present()
        info = self.host_info()
        return "nvidia" in info.get("runtimes", []) or any("nvidia.com/gpu" in d for d in info.get("cdi_devices", []))
