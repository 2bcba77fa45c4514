"""Programs imgbuild runs inside an image, for itself: the smoke test, the base's pins, the pip lock, the GPU read.

Each is a stdlib Python script that answers on one line: its marker, then JSON. One type for all of them, so the
engine runs any of them the same way (`ContainerRunner.run_script`), each caller reads its answer the same way, and
the fake engine answers each by name without knowing the pipeline's scripts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from imgbuild import limits
from imgbuild.boundedjson import marked_answer

#: Where a script's cache volume (`run_script(cache=...)`: `imgbuild lock`'s pip and uv caches) is mounted.
SCRIPT_CACHE = "/var/cache/imgbuild"


@dataclass(frozen=True)
class Probe:
    name: str  # what the fake engine answers by: "smoke", "pins", "lock", "gpus"
    script: str  # Python source, run by the image's python3
    marker: str  # the answer's line starts with this
    #: Files put beside the script in /tmp before it starts (name under /tmp, content): what it is told that is
    #: too large for an environment variable, always written, so an image's own file of that name never counts.
    files: tuple[tuple[str, bytes], ...] = ()

    def answer(self, output: str) -> dict[str, Any] | None:
        """The JSON object on the last line that starts with the marker; None when there is none, or it is not an
        object, or not JSON, or longer than an HTTP body may be (hostile output reads as no answer)."""
        return marked_answer(output, self.marker, limits.HTTP_BODY_BYTES)

    def says(self, data: dict[str, Any]) -> str:
        """The line the script prints to answer `data` (what a fake engine answers)."""
        return self.marker + json.dumps(data)
