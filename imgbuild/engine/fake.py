"""An in-memory engine: images are records, builds and probes are scripted. For fast unit tests of the
pipeline's logic (promotion never replaces a working tag, cleanup on every way out, rebuild ordering, the pip
lock) without a Docker daemon; the integration tests drive the real one.

A build "produces" an image whose labels are what the rendered context's record says (recipe and input
hashes, base digest), so rebuild's staleness rules see what they would see on a real engine. A probe (a script
imgbuild runs in an image, engine.probe) is answered by its name: a test gives `answers[name]`; the smoke test,
the base's pins and the GPU read have defaults. Nothing here knows the pipeline's scripts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgbuild.engine.types import (
    BuildRequest,
    ContainerInfo,
    ImageInfo,
    LocalImage,
    ProgressFn,
    Redactor,
    RunOptions,
)
from imgbuild.errors import BuildFailed, ImgbuildError
from imgbuild.hostio.acting import ContainerUser
from imgbuild.imageref import parse
from imgbuild.payload.probes import Probe
from imgbuild.platforms import arch_of

#: A scripted smoke verdict for an image ref: True passes, False fails, an exception is raised in the run.
SmokeScript = Callable[[str], bool]
#: A scripted build for a request: return nothing to build, raise BuildFailed (or anything) to fail.
BuildScript = Callable[[BuildRequest], None]


@dataclass(frozen=True)
class ProbeRun:
    """One run of a probe on the fake, as the engine was asked for it."""

    image: str
    probe: Probe
    args: list[str]
    env: dict[str, str]
    stdin: bytes | None
    gpus: list[str] | None
    as_user: ContainerUser | None = None
    cache: str | None = None  # the named volume asked for


#: A scripted probe: (exit code, the answer's JSON object or the raw output, the engine's note).
ProbeAnswer = Callable[[ProbeRun], tuple[int, "dict[str, Any] | str", str]]


@dataclass
class FakeImages:
    """The image store: refs -> image ids -> ImageInfo."""

    calls: list[str]
    tags: dict[str, str] = field(default_factory=dict)  # normal ref -> image id
    store: dict[str, ImageInfo] = field(default_factory=dict)  # image id -> info
    pushed: dict[str, str] = field(default_factory=dict)
    listed: dict[str, tuple[int, float | None]] = field(default_factory=dict)  # image id -> (bytes, created)

    @staticmethod
    def _key(ref: str) -> str:
        return parse(ref).normal()

    def add(self, image_id: str, info: ImageInfo, ref: str) -> str:
        self.store[image_id] = info
        self.tags[self._key(ref)] = image_id
        return image_id

    def image(self, ref: str) -> ImageInfo | None:
        image_id = self.tags.get(self._key(ref)) if not ref.startswith("sha256:") else ref
        return self.store.get(image_id) if image_id else None

    def image_id(self, ref: str) -> str | None:
        info = self.image(ref)
        return info.id if info else None

    def tag(self, image_id: str, ref: str) -> None:
        self.calls.append(f"tag {ref}")
        self.tags[self._key(ref)] = image_id

    def untag(self, ref: str) -> None:
        self.calls.append(f"untag {ref}")
        self.tags.pop(self._key(ref), None)

    def local_images(self) -> list[LocalImage]:
        """Every tag; sizes and times from `listed` (image id -> (bytes, created)), else 0 and unknown."""
        rows = []
        for key, image_id in sorted(self.tags.items()):
            size, created = self.listed.get(image_id, (0, None))
            rows.append(LocalImage(key.removeprefix("docker.io/").removeprefix("library/"), image_id, size, created))
        return rows

    def discard(self, ref: str) -> str:
        self.calls.append(f"discard {ref}")
        return "removed" if self.tags.pop(self._key(ref), None) else "gone already"

    def tags_of(self, repository: str) -> list[str]:
        wanted = parse(repository).normal().rsplit(":", 1)[0]
        named = [parse(key) for key in self.tags]
        return sorted(ref.tag for ref in named if ref.tag and ref.normal().rsplit(":", 1)[0] == wanted)

    def inspect_local(self, ref: str) -> tuple[str, dict[str, Any]] | None:
        info = self.image(ref)
        return None if info is None else info.inspected(ref)

    def pull(self, ref: str, quiet_seconds: float = 0.0) -> None:
        self.calls.append(f"pull {ref}")
        if self.image(ref) is None:
            raise ImgbuildError(f"pull of {ref} failed: not in the fake registry")

    def save(self, ref: str, path: Path) -> None:
        if self.image(ref) is None:
            raise ImgbuildError(f"no such image: {ref}")
        from imgbuild.hostio.regular import write_atomic

        write_atomic(path, json.dumps({"saved": ref}))

    def push(self, ref: str, auth: dict[str, str] | None, progress: ProgressFn, quiet_seconds: float = 0.0) -> str:
        image_id = self.image_id(ref)
        if image_id is None:
            raise ImgbuildError(f"push of {ref} failed: no such image")
        self.pushed[ref] = image_id
        return image_id


@dataclass
class FakeLeases:
    """Leases as the engine keeps them (`held`: name -> labels; a test puts another run's there)."""

    calls: list[str]
    held: dict[str, dict[str, str]] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)  # ids of containers the engine runs (a CI runner's)

    def claim(self, name: str, image: str, labels: dict[str, str]) -> bool:
        if name in self.held:
            return False
        self.calls.append(f"lease {name}")
        self.held[name] = dict(labels)
        return True

    def holder_labels(self, name: str) -> dict[str, str] | None:
        return self.held.get(name)

    def running_prefix(self, prefix: str) -> bool:
        return any(i.startswith(prefix) for i in self.running)

    def remove(self, name: str) -> None:
        if self.held.pop(name, None) is not None:
            self.calls.append(f"release {name}")


@dataclass
class FakeContainers:
    """Smoke containers, scripted; `alive` holds the image of each one still there (a kill leaves them)."""

    calls: list[str]
    smoke: SmokeScript = lambda image: True
    alive: list[str] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)  # each smoke run's arguments
    meta: dict[str, Any] = field(default_factory=dict)  # what the script reports of the image (cuda, arch_list)
    gpu_note: str = ""  # a host whose engine cannot pass GPUs: the run goes on without them, saying so
    base_pins: list[str] = field(default_factory=list)  # what the base's PIP_CONSTRAINT file holds
    engine_read: tuple[int, str, str] = (0, "", "")  # the GPU read through the engine: (exit code, output, note)
    answers: dict[str, ProbeAnswer] = field(default_factory=dict)  # probe name -> its scripted answer
    probed: list[ProbeRun] = field(default_factory=list)
    started: list[RunOptions] = field(default_factory=list)  # every container `run` started, as asked
    start_code: int = 0  # what a start exits with (125: the engine refused it)
    listed: list[ContainerInfo] = field(default_factory=list)  # what `rows` answers (the engine's containers)
    tails: dict[str, str] = field(default_factory=dict)  # container name -> the last lines of its output

    def run_script(
        self,
        image: str,
        probe: Probe,
        args: list[str],
        env: dict[str, str],
        *,
        stdin: bytes | None = None,
        gpus: list[str] | None,
        timeout: int = 1800,
        ipc: str | None = None,
        shm_size: str | None = None,
        as_user: ContainerUser | None,
        cache: str | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> tuple[int, str, str]:
        run = ProbeRun(image, probe, list(args), dict(env), stdin, gpus, as_user, cache)
        self.probed.append(run)
        if probe.name in self.answers:
            self.calls.append(f"{probe.name} {image}")
            code, answer, note = self.answers[probe.name](run)
            output = probe.says(answer) if isinstance(answer, dict) else answer
            if on_line is not None:
                for line in output.splitlines():
                    on_line(line)  # as the real engine does, line by line as the script prints
            return code, output, note
        if probe.name == "gpus":
            self.calls.append(f"read gpus {image} gpus={gpus}")
            return self.engine_read
        if probe.name == "pins":
            self.calls.append(f"pins {image}")
            return 0, probe.says({"origin": "the base's constraint file", "lines": self.base_pins}), ""
        if probe.name != "smoke":
            raise ImgbuildError(
                f"the fake engine has no answer for the {probe.name} probe (give answers[{probe.name!r}])"
            )
        self.calls.append(f"smoke {image}")
        self.runs.append(
            {
                "image": image,
                "args": list(args),
                "gpus": gpus,
                "ipc": ipc,
                "shm_size": shm_size,
                "env": dict(env),
                "files": dict(probe.files),
            }
        )
        self.alive.append(image)
        ok = self.smoke(image)  # may raise (a Ctrl-C in the middle of the smoke test)
        self.alive.remove(image)
        note = self.gpu_note if gpus is not None else ""
        check: dict[str, Any] = {
            "name": "framework",
            "status": "pass" if ok else "fail",
            "details": {},
            "reason": "" if ok else "scripted failure",
            "seconds": 0,
        }
        report = {"ok": ok, "checks": [check], "meta": dict(self.meta)}
        return (0 if ok else 1), probe.says(report), note

    def remove_labelled(self, label: str, value: str) -> None:
        self.alive = [c for c in self.alive if c != value]

    def names(self) -> set[str]:
        return set()

    def rows(self, name_prefix: str = "") -> list[ContainerInfo]:
        return [row for row in self.listed if row.name.startswith(name_prefix)]

    def cpu_percent(self, name: str) -> float | None:
        return None

    def stop(self, name: str, timeout: int = 30) -> None:
        self.calls.append(f"stop {name}")

    def remove(self, name: str) -> None:
        self.calls.append(f"remove {name}")

    def discard_unstarted(self, name: str) -> bool:
        self.calls.append(f"discard {name}")
        return self.start_code != 0

    def note(self, name: str, text: str) -> bool:
        self.calls.append(f"note {name}")
        return True

    def log_tail(self, name: str, lines: int = 20) -> str:
        return self.tails.get(name, "")

    def probe(self, name: str, command: list[str], timeout: float | None = None) -> tuple[int, str]:
        return -1, "the fake engine runs nothing"

    def run(self, options: RunOptions) -> tuple[int, str]:
        """Records the container as the engine was asked for it; `start_code` says how the start went."""
        self.calls.append(f"run {options.name} {options.image}")
        self.started.append(options)
        return self.start_code, "" if self.start_code == 0 else "docker: scripted start failure"

    def attach(self, name: str) -> None:
        self.calls.append(f"attach {name}")

    def logs(self, name: str, tail: str, follow: bool) -> None:
        self.calls.append(f"logs {name} tail={tail} follow={follow}")

    def exec_in(self, name: str, command: tuple[str, ...], tty: bool) -> None:
        self.calls.append(f"exec {name} {' '.join(command)}")


@dataclass
class FakeEngine:
    name: str = "docker"  # the engine it imitates
    builds: BuildScript = lambda req: None
    gpus: bool = False
    shares: bool = True  # False: a remote engine, or imgbuild in a container (GPUs are read through the engine)
    cdi_gpus: list[str] = field(default_factory=list)  # the CDI devices the engine lists
    platforms: tuple[str, ...] = ("linux/amd64",)  # what it builds: its host's first, then any it emulates
    calls: list[str] = field(default_factory=list)
    images: FakeImages = field(init=False)
    containers: FakeContainers = field(init=False)
    leases: FakeLeases = field(init=False)

    def __post_init__(self) -> None:
        self.images = FakeImages(self.calls)
        self.containers = FakeContainers(self.calls)
        self.leases = FakeLeases(self.calls)

    def add_image(self, ref: str, labels: dict[str, str] | None = None, env: list[str] | None = None) -> str:
        """Put an image in the store (a base, or a build from an earlier run)."""
        image_id = "sha256:" + hashlib.sha256(f"{ref}{labels}{env}{len(self.images.store)}".encode()).hexdigest()
        info = ImageInfo(image_id, dict(labels or {}), {"Env": env or [], "Labels": labels or {}})
        return self.images.add(image_id, info, ref)

    # -- the ImageEngine protocol ------------------------------------------------------------------

    def pick_backend(self, wanted: str) -> str:
        return "sdk" if wanted == "sdk" else "buildkit"

    def build(self, backend: str, req: BuildRequest, progress: ProgressFn, redact: Redactor) -> str:
        self.calls.append(f"build {req.tag}" + (f" for {req.platform}" if req.platform else ""))
        progress(f"[fake] building {req.tag}")
        self.builds(req)
        dockerfile = (req.context / "Dockerfile").read_bytes()
        labels = dockerfile_labels(dockerfile.decode())  # what a real build's image carries
        made = dockerfile + json.dumps(req.build_args).encode() + req.platform.encode()
        image_id = "sha256:" + hashlib.sha256(made).hexdigest()
        arch = arch_of(req.platform or self.platforms[0])
        return self.images.add(image_id, ImageInfo(image_id, labels, {"Labels": labels}, architecture=arch), req.tag)

    def host_has_gpus(self) -> bool:
        return self.gpus

    def shares_host(self) -> bool:
        return self.shares

    def host_platform(self) -> str:
        return self.platforms[0]

    def platform_refusal(self, platform: str) -> str:
        return "" if platform in self.platforms else f"[fake] this engine builds {', '.join(self.platforms)} only"

    def host_info(self) -> dict[str, Any]:
        return {
            "version": "fake",
            "default_runtime": "runc",
            "runtimes": ["runc"],
            "cgroup_version": "2",
            "cdi_devices": list(self.cdi_gpus),
        }


def failing_build(message: str = "scripted build failure") -> BuildScript:
    def fail(req: BuildRequest) -> None:
        raise BuildFailed(message)

    return fail


_LABEL_PAIR = re.compile(r'"((?:[^"\\]|\\.)*)"="((?:[^"\\]|\\.)*)"')


def dockerfile_labels(dockerfile: str) -> dict[str, str]:
    """The `LABEL "key"="value" ...` pairs of a Dockerfile (continuation lines joined), as a build sets them."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    labels: dict[str, str] = {}
    for line in joined.splitlines():
        if line.lstrip().upper().startswith("LABEL "):
            labels.update({k.replace('\\"', '"'): v.replace('\\"', '"') for k, v in _LABEL_PAIR.findall(line)})
    return labels
