"""One discipline for imgbuild's JSON caches under `cache_dir`: registry answers about bases and tags, tag details,
a base's pins, the blobs a mirror target already has.

One small file per key (its name a hash of the key, so no key names a path), written whole (a temporary file,
then a rename: a reader never sees half of one), read back only while fresh, only from a regular file (never
through a link, never a FIFO that would block), only below a size cap, and only when this user wrote it: in a
shared cache folder another user's entry (planted first, with a base's answer of their choosing) is a miss. An
entry dated in the future is stale, whatever its mtime says. Anything else reads as a miss. A cache
is an optimisation: one that cannot be written or read costs a round trip, never the answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from imgbuild import limits
from imgbuild.hostio.regular import read_regular, write_atomic

FUTURE_SLACK = 5.0  # seconds an entry may seem to come from the future (clock steps between writer and reader)


class JsonCache:
    def __init__(self, folder: Path, ttl: float | None = None, max_bytes: int = limits.MIB) -> None:
        """`ttl`: seconds an entry stays fresh (None: always; 0 or less: never kept, never read)."""
        self.folder, self.ttl, self.max_bytes = Path(folder), ttl, max_bytes

    def path(self, key: str) -> Path:
        return self.folder / (hashlib.sha256(key.encode()).hexdigest()[:40] + ".json")

    def get(self, key: str) -> Any | None:
        found = self.get_with_age(key)
        return None if found is None else found[0]

    def get_with_age(self, key: str) -> tuple[Any, float] | None:
        """(the entry, its age in seconds), or None: missing, stale, too big, not a regular file, not JSON, or an
        entry written for another key (two keys whose hashes met)."""
        if self.ttl is not None and self.ttl <= 0:
            return None
        try:
            found = read_regular(self.path(key), self.max_bytes)
        except OSError:
            return None
        if found is None:
            return None
        data, info = found
        if info.st_uid != os.geteuid():
            return None  # another user's: never believed (a shared cache_dir)
        age = time.time() - info.st_mtime
        if age < -FUTURE_SLACK or (self.ttl is not None and age > self.ttl):
            return None
        try:
            record = json.loads(data)
        except ValueError:
            return None
        if not isinstance(record, dict) or record.get("key") != key or "value" not in record:
            return None
        return record["value"], max(0.0, age)

    def put(self, key: str, value: Any) -> None:
        if self.ttl is not None and self.ttl <= 0:
            return
        path = self.path(key)
        data = json.dumps({"key": key, "value": value}, sort_keys=True)
        if len(data) > self.max_bytes:
            return  # kept by no one: it would not be read back
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data, mode=0o600)
