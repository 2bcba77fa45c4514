"""Stage 4: the container engine, behind the `ImageEngine` protocol.

- `types`: the engine's own types (BuildRequest, ImageInfo, Redactor) and the protocol;
- `docker`: `Engine`, the Docker engine (with `images` and `containers`, the only code that talks to Docker);
- `buildkit`, `sdk`: its two build backends; `images`: the image store; `containers`: containers and the CLI;
- `fake`: `FakeEngine`, in memory, for unit tests of the pipeline's logic.
"""

from imgbuild.engine.containers import SMOKE_LABEL
from imgbuild.engine.docker import Engine
from imgbuild.engine.types import (
    BuildRequest,
    ContainerRunner,
    ImageEngine,
    ImageInfo,
    ImageStore,
    ProgressFn,
    Redactor,
    StepTracker,
)

__all__ = [
    "SMOKE_LABEL",
    "BuildRequest",
    "ContainerRunner",
    "Engine",
    "ImageEngine",
    "ImageInfo",
    "ImageStore",
    "ProgressFn",
    "Redactor",
    "StepTracker",
]
