"""The Docker engine: builds (through the BuildKit or the Engine API backend), with the image store
(`images.py`) and the containers (`containers.py`) beside it. The only package that talks to Docker."""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any

from imgbuild.engine import buildkit, sdk
from imgbuild.engine.containers import DockerContainers
from imgbuild.engine.images import DockerImages
from imgbuild.engine.lease import DockerLeases
from imgbuild.engine.types import BuildRequest, ProgressFn, Redactor
from imgbuild.errors import EngineFault, EngineUnavailable, UsageError
from imgbuild.hostio.regular import open_log
from imgbuild.platforms import platform_of_machine


class Engine:
    """A connection to a Docker engine: its two build backends, `images` (the image store) and
    `containers` (the smoke test's container and the docker CLI)."""

    name = "docker"

    def __init__(self, client: Any, docker_cli: str | None = None):
        self.client = client
        self._cli_hint = docker_cli
        self.images = DockerImages(client)
        self.containers = DockerContainers(client, self.images, docker_cli)
        self.leases = DockerLeases(client)
        self._shares: bool | None = None  # shares_host's answer: asked of the kernel once per engine
        self._platform: str | None = None  # host_platform's answer: asked of the engine once

    @classmethod
    def connect(cls, docker_cli: str | None = None) -> Engine:
        try:
            import docker
            from docker.errors import DockerException
        except ImportError as exc:  # pragma: no cover - installed with imgbuild
            raise EngineUnavailable(f"the docker SDK is missing ({exc})") from None
        from imgbuild.engine import dockerctx
        from imgbuild.hostio.dockerconfig import docker_config_path

        point = dockerctx.endpoint(dict(os.environ), docker_config_path().parent)
        dockerctx.apply(point, os.environ)  # the CLIs imgbuild starts talk to the same engine
        host = point.host or "unix:///var/run/docker.sock"
        where = f"{host} ({point.source})" if point.source not in ("DOCKER_HOST", "the local engine") else host
        try:
            # ssh:// (a context over SSH): the ssh client itself, with the user's keys, agent and known hosts
            client = docker.from_env(timeout=600, use_ssh_client=host.startswith("ssh://"))
            client.ping()
        except DockerException as exc:
            if "Permission denied" in str(exc) or "PermissionError" in str(exc):
                raise EngineUnavailable(
                    f"the Docker engine at {where} refused this user (permission denied on the socket): ask an "
                    "admin to add you to the docker group, or, where the server runs imgbuild's enforced mode, "
                    "run it through sudo (sudo imgbuild ...)"
                ) from None
            reason = str(exc).split("(")[0].strip().rstrip(":")
            raise EngineUnavailable(
                f"no Docker engine at {where} ({reason[:80]}): start dockerd, or point DOCKER_HOST or the docker "
                "context at one (on a test machine, tests/testbed/up starts one)"
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
        with open_log(req.log_path) as log:
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
            "platform": platform_of_machine(str(info.get("Architecture", ""))),
        }

    def host_platform(self) -> str:
        """The platform of the engine's host (`linux/amd64`), as the engine reports it; else this machine's. Asked
        once per engine: a build asks it at every stage (refusal, the built image's check, Podman's argv, smoke)."""
        if self._platform is None:
            self._platform = str(self.host_info().get("platform") or "") or platform_of_machine(os.uname().machine)
        return self._platform

    def platform_refusal(self, platform: str) -> str:
        """Why this engine cannot build and smoke-test `platform` images, in one line; "" where it can. Docker's
        built-in BuildKit without buildx builds the host's platform only (Podman builds others under qemu)."""
        own = self.host_platform()
        if platform == own:
            return ""
        return (
            f"the Docker engine here builds and smoke-tests {own} images only (a {platform} build needs buildx, "
            "which this docker has not): use Podman (engine: podman) and qemu-user-static, or a "
            f"{platform} runner"
        )

    def shares_host(self) -> bool:
        """Whether the engine runs on this machine's kernel, so that this machine's GPUs, driver and NVML are
        the engine's: a local socket, and imgbuild not itself in a container (where the socket is mounted in,
        this machine's /dev holds no GPU even on a GPU host)."""
        if self._shares is None:
            self._shares = _shares_this_machine()
        return self._shares

    def host_has_gpus(self) -> bool:
        """Whether the engine's host may have NVIDIA GPUs, without starting anything: this machine's device nodes
        where the engine shares this machine; else what the engine reports (an NVIDIA runtime, CDI GPU devices).
        A guess for a remote engine (a runtime can be registered on a host without GPUs): the smoke test reads
        the GPUs through the engine instead (imgbuild.pipeline.smoke.host_gpus); this serves the cheap safety checks."""
        from imgbuild.gpu.read import gpu_devices_present

        if self.shares_host() or (_local_socket() and gpu_devices_present()):  # in a container given GPUs
            return gpu_devices_present()
        info = self.host_info()
        return "nvidia" in info.get("runtimes", []) or any("nvidia.com/gpu" in d for d in info.get("cdi_devices", []))


def _local_socket() -> bool:
    host = os.environ.get("DOCKER_HOST", "")
    return not host or host.startswith(("unix://", "npipe://"))


def _engine_pid() -> int | None:
    """The engine's PID as this process's PID namespace sees it (SO_PEERCRED of its unix socket: 0 where the
    engine is in a namespace above ours); None where that cannot be asked."""
    import socket
    import struct

    host = os.environ.get("DOCKER_HOST", "") or "unix:///var/run/docker.sock"
    option = getattr(socket, "SO_PEERCRED", None)
    if not host.startswith("unix://") or option is None:
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(host.removeprefix("unix://"))
            pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    except OSError:
        return None
    return int(pid)


def _shares_this_machine() -> bool:
    """Engine.shares_host, asked of the kernel: the socket's peer and its mount namespace."""
    if not _local_socket():
        return False
    pid = _engine_pid()
    if pid is None:  # not answered over a unix socket here: a container's marker files are all there is
        return not any(os.path.exists(p) for p in ("/.dockerenv", "/run/.containerenv"))
    if pid == 0:  # the kernel's word: the engine is in a PID namespace above ours (its socket was mounted in)
        return False
    try:  # in our PID namespace; the same mount namespace sees the same /dev (a daemon in the same container)
        mine, theirs = os.stat("/proc/self/ns/mnt"), os.stat(f"/proc/{pid}/ns/mnt")
    except OSError:  # another user's daemon cannot be looked into: it is on this machine
        return True
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)
