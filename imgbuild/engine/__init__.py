"""Stage 4: the container engine, behind the `ImageEngine` protocol.

- `types`: the engine's own types (BuildRequest, ImageInfo, ContainerInfo, Redactor) and the protocol;
- `docker`: `Engine`, the Docker engine (with `images` and `containers`, the only code that talks to Docker);
- `buildkit`, `sdk`: its two build backends; `images`: the image store; `containers`: containers and the CLI;
- `podman`: `PodmanEngine`, the same protocol on Podman (builds with `podman build`, the rest through its
  Docker-compatible API socket);
- `lease`: a lock every run on one engine sees (CI runners sharing its socket): a never-started named container;
- `runargs`, `noderun`: `docker run`'s words, for `imgbuild run` and for a Slurm task's own container;
- `fake`: `FakeEngine`, in memory, for unit tests of the pipeline's logic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers; at run time each is imported from its home on first use
    from imgbuild.config.settings import Settings
    from imgbuild.engine.docker import Engine as Engine
    from imgbuild.engine.scriptrun import SMOKE_LABEL as SMOKE_LABEL
    from imgbuild.engine.types import BuildRequest as BuildRequest
    from imgbuild.engine.types import ContainerInfo as ContainerInfo
    from imgbuild.engine.types import ContainerRunner as ContainerRunner
    from imgbuild.engine.types import ImageEngine as ImageEngine
    from imgbuild.engine.types import ImageInfo as ImageInfo
    from imgbuild.engine.types import ImageStore as ImageStore
    from imgbuild.engine.types import ProgressFn as ProgressFn
    from imgbuild.engine.types import Redactor as Redactor
    from imgbuild.engine.types import StepTracker as StepTracker

#: Where each name lives, imported on first use: `imgbuild.engine.probe` (which validate and render reach) costs
#: no import of the Docker client's modules.
_HOMES = {
    "SMOKE_LABEL": "imgbuild.engine.scriptrun",
    "Engine": "imgbuild.engine.docker",
    **dict.fromkeys(
        (
            "BuildRequest",
            "ContainerInfo",
            "ContainerRunner",
            "ImageEngine",
            "ImageInfo",
            "ImageStore",
            "ProgressFn",
            "Redactor",
            "StepTracker",
        ),
        "imgbuild.engine.types",
    ),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def connect_engine(settings: Settings) -> ImageEngine:
    """The engine the settings name (`engine`): Docker, Podman, or `auto`: Docker, unless Docker is absent (no
    DOCKER_HOST, no /var/run/docker.sock) and podman is installed. A Docker that is there but refuses or is down
    is Docker's error, never hidden behind Podman's. Every command that connects first removes the script
    containers (a smoke test's, with the GPUs it was given) of an imgbuild process that was killed."""
    import contextlib
    import os
    import shutil

    from imgbuild.engine.docker import Engine
    from imgbuild.engine.podman import PodmanEngine

    docker_absent = (
        not os.environ.get("DOCKER_HOST")
        and not os.environ.get("DOCKER_CONTEXT")
        and not os.path.exists("/var/run/docker.sock")
    )
    engine: Engine | PodmanEngine
    if settings.engine == "podman" or (settings.engine == "auto" and docker_absent and shutil.which("podman")):
        engine = PodmanEngine.connect_podman(settings.podman_socket)
    else:
        engine = Engine.connect(settings.docker_cli)
    with contextlib.suppress(OSError):  # an engine that does not answer is the command's own error, met next
        engine.containers.sweep_orphans()
    return engine


__all__ = ["connect_engine", *_HOMES]
