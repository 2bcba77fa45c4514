"""Where the engine mounts a probe's cache. A probe itself (a script imgbuild runs inside an image and the marker
its answer line starts with) is declared in `imgbuild.payload.probes`, one object for both sides."""

from __future__ import annotations

#: Where a script's cache volume (`run_script(cache=...)`: `imgbuild lock`'s pip and uv caches) is mounted.
SCRIPT_CACHE = "/var/cache/imgbuild"
