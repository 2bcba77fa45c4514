"""Stage 4: the container engine, behind the `ImageEngine` protocol.

- `types`: the engine's own types (BuildRequest, ImageInfo, Redactor) and the protocol;
- `docker`: `Engine`, the Docker engine (the only code that talks to Docker);
- `buildkit`, `sdk`: its two build backends;
- `fake`: `FakeEngine`, in memory, for unit tests of the pipeline's logic.
"""

from imgbuild.engine.docker import SMOKE_LABEL, Engine
from imgbuild.engine.types import BuildRequest, ImageEngine, ImageInfo, ProgressFn, Redactor, StepTracker

__all__ = ["SMOKE_LABEL", "BuildRequest", "Engine", "ImageEngine", "ImageInfo", "ProgressFn", "Redactor", "StepTracker"]
