"""The Podman engine: builds through `podman build` (Buildah: cache, secret and bind mounts, build stages,
`--timestamp`), the image store and containers through Podman's Docker-compatible API socket (`podman system
service`), the same docker-py code as Docker's; pushes through the podman CLI. The only code that runs Podman.

Names: Podman qualifies a short name (`lab/x:1`) with `localhost/` when it builds, and its compatible API with
`docker.io/` when it tags. Every reference without a registry host is qualified here, once, as `localhost/`:
what a build tags and what a promotion tags are then the same image, as `podman run lab/x:1` finds it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from imgbuild import imageref
from imgbuild.engine.buildkit import drive, input_args
from imgbuild.engine.containers import DockerContainers
from imgbuild.engine.docker import Engine
from imgbuild.engine.emulation import emulator, missing_emulator
from imgbuild.engine.images import PUSH_QUIET_SECONDS, DockerImages, transfer_failure
from imgbuild.engine.types import (
    BuildRequest,
    ImageInfo,
    LocalImage,
    ProgressFn,
    Redactor,
    StepTracker,
    own_status,
    step_name,
)
from imgbuild.errors import EngineUnavailable, ImgbuildError, RegistryUnavailable
from imgbuild.hostio.regular import LogWriter, open_log

#: `[2/3] STEP 4/9: RUN ...` (a multi-stage build) or `STEP 4/9: RUN ...`
_STEP = re.compile(r"(?:\[([0-9]+)/[0-9]+\] )?STEP (([0-9]+)/[0-9]+): (.*)")
_ERROR = re.compile(r"(?:Error|error): (.*)")
PUSH_SECONDS = 3600  # one `podman push`


def cache_repository(image: str) -> str:
    """Where Buildah keeps `image`'s registry cache: a repository beside it, one tag per step."""
    return f"{image}-imgbuild-cache"


def default_socket(environ: dict[str, str] | None = None) -> str:
    """Podman's API socket: CONTAINER_HOST when set, root's, or the user's (rootless)."""
    env = os.environ if environ is None else environ
    if env.get("CONTAINER_HOST"):
        return env["CONTAINER_HOST"]
    if os.geteuid() == 0:
        return "unix:///run/podman/podman.sock"
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    return f"unix://{runtime}/podman/podman.sock"


def local(ref: str) -> str:
    """`lab/x:1` -> `localhost/lab/x:1`; a reference with a registry host, or an image id, as it is."""
    if ref.startswith("sha256:") or re.fullmatch(r"[0-9a-f]{12,64}", ref):
        return ref
    parsed = imageref.parse(ref)
    return ref if parsed.host else f"localhost/{ref}"


class PodmanImages(DockerImages):
    """Podman's image store through its Docker-compatible API, every short name qualified as `localhost/`;
    pushes through the podman CLI."""

    def __init__(self, client: Any, podman_cli: str):
        super().__init__(client)
        self.podman = podman_cli

    def image(self, ref: str) -> ImageInfo | None:
        return super().image(local(ref))

    def tag(self, image_id: str, ref: str) -> None:
        super().tag(image_id, local(ref))

    def untag(self, ref: str) -> None:
        super().untag(local(ref))

    def local_images(self) -> list[LocalImage]:
        """Every tag, short names as imgbuild writes them (`localhost/` dropped)."""
        return [replace(i, ref=i.ref.removeprefix("localhost/")) for i in super().local_images()]

    def discard(self, ref: str) -> str:
        return super().discard(local(ref))

    def tags_of(self, repository: str) -> list[str]:
        return super().tags_of(local(repository))

    def inspect_local(self, ref: str) -> tuple[str, dict[str, Any]] | None:
        img = self.image(ref)
        return None if img is None else img.inspected(local(ref))

    def save(self, ref: str, path: Path) -> None:
        super().save(local(ref), path)

    def untag_repository(self, repository: str) -> None:
        """Buildah names each step it pushes to or pulls from a registry cache `<repository>:<key>`: those names
        go, the layers stay (as every intermediate layer does). `podman untag IMAGE NAME`, not `untag`: the
        API's removal of an image's only name removes the image. Best effort, bounded."""
        from docker.errors import DockerException
        from requests.exceptions import RequestException

        try:
            found = self.client.images.list(name=repository)
        except (DockerException, RequestException):  # the build's result stands either way
            return
        # a short name (Docker Hub's) is listed as Podman qualifies it
        wanted = {repository, f"docker.io/{repository}", f"docker.io/library/{repository}"}
        names = [n for img in found for n in img.tags if n.rsplit(":", 1)[0] in wanted]
        for name in names:
            try:
                subprocess.run([self.podman, "untag", name, name], capture_output=True, timeout=60)
            except subprocess.TimeoutExpired:
                return

    def push(
        self, ref: str, auth: dict[str, str] | None, progress: ProgressFn, quiet_seconds: float = PUSH_QUIET_SECONDS
    ) -> str:
        """`podman push` (its compatible API's push stream names no digest); credentials through a private
        auth file for this push alone, never argv. Podman says nothing while a layer uploads, so its bound is the
        whole push's (PUSH_SECONDS), not `quiet_seconds`."""
        with tempfile.TemporaryDirectory(prefix="imgbuild-push-") as tmp:
            digestfile = Path(tmp) / "digest"
            cmd = [self.podman, "push", "--digestfile", str(digestfile), *authfile_args(Path(tmp), ref, auth)]
            progress(f"{ref}: pushing")
            try:
                proc = subprocess.run([*cmd, local(ref)], capture_output=True, text=True, timeout=PUSH_SECONDS)
            except subprocess.TimeoutExpired:
                raise RegistryUnavailable(
                    f"push of {ref} ran past {PUSH_SECONDS} s and was stopped: the registry "
                    f"{imageref.parse(ref).registry} stalled, or is too slow"
                ) from None
            if proc.returncode != 0:
                why = (proc.stderr.strip().splitlines() or ["podman push failed"])[-1]
                raise transfer_failure("push", ref, why[:300])
            digest = digestfile.read_text().strip() if digestfile.is_file() else ""
        if not imageref.DIGEST_RE.fullmatch(digest):
            raise ImgbuildError(f"push of {ref} ended without a digest")
        return digest


class PodmanContainers(DockerContainers):
    """Containers through the compatible API; `imgbuild run`, attach and exec through the podman CLI."""

    def __init__(self, client: Any, images: DockerImages, podman_cli: str):
        super().__init__(client, images, None)
        self.podman = podman_cli

    def cli(self) -> str:
        return self.podman


class PodmanEngine(Engine):
    """A connection to Podman: `podman build` for builds, its API socket for images and containers."""

    name = "podman"
    images: PodmanImages

    def __init__(self, client: Any, podman_cli: str, socket: str):
        super().__init__(client, None)
        self.podman, self.socket = podman_cli, socket
        self.images = PodmanImages(client, podman_cli)
        self.containers = PodmanContainers(client, self.images, podman_cli)

    @classmethod
    def connect_podman(cls, socket: str | None = None) -> PodmanEngine:
        podman = shutil.which("podman")
        if not podman:
            raise EngineUnavailable("no podman on PATH: install podman (Debian: apt install podman) or use Docker")
        socket = socket or default_socket()
        try:
            import docker
            from docker.errors import DockerException
        except ImportError as exc:  # pragma: no cover - installed with imgbuild
            raise EngineUnavailable(f"the docker SDK is missing ({exc})") from None
        try:
            client = docker.DockerClient(base_url=socket, timeout=600)
            client.ping()
        except DockerException as exc:
            reason = str(exc).split("(")[0].strip().rstrip(":")
            raise EngineUnavailable(
                f"no Podman API at {socket} ({reason[:80]}): start it (systemctl enable --now podman.socket, "
                "or podman system service --time=0 &) or set podman_socket"
            ) from None
        return cls(client, podman, socket)

    def pick_backend(self, wanted: str) -> str:
        """Buildah builds the BuildKit Dockerfile (its mounts, secrets and stages) as it is."""
        if wanted == "sdk":
            raise EngineUnavailable("the sdk backend is Docker's Engine API builder: on Podman, use buildkit")
        return "buildkit"

    @property
    def buildkit_cli(self) -> tuple[str, bool] | None:
        return None

    def build(self, backend: str, req: BuildRequest, progress: ProgressFn, redact: Redactor) -> str:
        """`podman build` of `req.context`, tagged `req.tag`; the image id. Raises BuildFailed."""
        if req.log_path:
            req.log_path.parent.mkdir(parents=True, exist_ok=True)
        iidfile = req.iidfile or req.context.parent / f".{req.context.name}.{os.getpid()}.iid"
        with (
            open_log(req.log_path) as log,
            tempfile.TemporaryDirectory(prefix="imgbuild-build-") as tmp,
        ):
            cache = req.cache_to or (req.cache_from[0] if req.cache_from else "")
            auth = authfile_args(Path(tmp), cache, req.cache_auth) if cache else []
            try:
                argv = build_argv(self.podman, req, iidfile, auth, self.host_platform())
                return drive(argv, dict(os.environ), req, iidfile, _follow, progress, redact, log)
            finally:
                if req.cache_to:
                    self.images.untag_repository(req.cache_to)

    def platform_refusal(self, platform: str) -> str:
        """Podman builds and runs a foreign platform's image under qemu where this machine registers it with
        binfmt_misc (engine.emulation) and the engine is on this machine; "" where it can."""
        own = self.host_platform()
        if platform == own:
            return ""
        if not self.shares_host():
            return f"the Podman engine is not on this machine, so whether it can run {platform} images is unknown"
        return "" if emulator(platform) else missing_emulator(platform)

    def shares_host(self) -> bool:
        if self._shares is None:
            self._shares = self.socket.startswith("unix://") and not os.path.exists("/run/.containerenv")
        return self._shares


def authfile_args(folder: Path, ref: str, auth: dict[str, str] | None) -> list[str]:
    """`--authfile FILE` for `ref`'s registry where there are credentials: a 0600 file in `folder` (the caller's
    private temporary folder), so they are never in argv; nothing where there are none."""
    if not (auth and auth.get("username")):
        return []
    token = base64.b64encode(f"{auth['username']}:{auth.get('password', '')}".encode()).decode()
    authfile = folder / "auth.json"
    authfile.touch(mode=0o600)
    authfile.write_text(json.dumps({"auths": {imageref.parse(ref).host or "docker.io": {"auth": token}}}))
    return ["--authfile", str(authfile)]


def build_argv(
    podman: str, req: BuildRequest, iidfile: Path, auth: list[str] | None = None, platform: str = ""
) -> list[str]:
    """The `podman build` command for `req`: layers kept (the edit loop's cache), Docker's image format (labels,
    healthchecks and the rest as Docker has them), secrets as files; Buildah's registry cache, every step's
    layer, from and to `cache_to`'s repository (pipeline.registry_cache), with `auth` (authfile_args); `platform`:
    the engine's own, named where `req` names none."""
    # Docker's format records the build container's id and hostname (random); a reproducible build is OCI's.
    image_format = "oci" if req.timestamp is not None else "docker"
    cmd = [podman, "build", *(auth or []), "--layers", "--format", image_format, "--iidfile", str(iidfile)]
    cmd += ["-t", local(req.tag)]
    # Always the platform by name: where a base's list digest names local images of two platforms, Podman takes the
    # named one (unnamed, whichever it finds). A foreign one runs its steps under qemu (engine.emulation), its bases
    # pulled for it: where only another platform's image is local, Podman would take that one.
    if platform or req.platform:
        cmd += ["--platform", req.platform or platform, *(["--pull=always"] if req.platform else [])]
    cmd += input_args(req)
    for ref in req.cache_from:
        cmd += ["--cache-from", ref]
    if req.cache_to:
        cmd += ["--cache-to", req.cache_to]
    if req.timestamp is not None:  # created times of the config and every file in the layers; no history, whose
        cmd += ["--timestamp", str(req.timestamp), "--omit-history"]  # entries name intermediate images' ids
    cmd.append(str(req.context))
    return cmd


def _follow(
    proc: subprocess.Popen[str],
    progress: ProgressFn,
    redact: Redactor,
    log: LogWriter,
    tracker: StepTracker,
    error_lines: list[str],
) -> None:
    """podman build's plain output: `STEP n/m: INSTRUCTION` lines start steps; what follows is the step's."""
    assert proc.stdout
    for raw in proc.stdout:
        line = redact(raw.rstrip("\n"))
        log.write(line + "\n")
        if m := _STEP.fullmatch(line):  # titled as BuildKit titles steps: `[stage-3 4/9] RUN ...`
            key = f"{m.group(1) or 1}.{m.group(3)}"
            tracker.steps[key] = f"[stage-{m.group(1) or 1} {m.group(2)}] {m.group(4)}"
            tracker.current = key
            progress(step_name(tracker.steps[key]))
        elif (m := _ERROR.fullmatch(line)) and line.startswith(("Error:", "error:")):
            tracker.failed = tracker.failed or tracker.current
            error_lines.append(m.group(1))
        elif tracker.current:
            tracker.tails.setdefault(tracker.current, deque(maxlen=40)).append(line)
            if status := own_status(line):
                progress(status)
