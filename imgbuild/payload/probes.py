"""Programs imgbuild runs inside an image, for itself: the smoke test, the base's pins, the pip lock, the GPU read,
whether an image has jupyter.

Each is one object here holding its script and its marker, used by both sides: the engine runs the script with
the marker in its environment (`MARKER_VARIABLE`), the script prints its one answer line after it, and the host
reads the answer through the same object. A marker is written nowhere else (tests/test_probes.py scans for one).
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from imgbuild import limits
from imgbuild.boundedjson import marked_answer
from imgbuild.payload import PAYLOAD_DIR, SMOKE_MODULES, SMOKE_PACKAGE
from imgbuild.payload.smoke.report import MARKER_VARIABLE

#: Where the engine copies a probe's script (SCRIPT_NAME) and its files, in the container it runs it in.
SCRIPT_FOLDER = "/tmp"
SCRIPT_NAME = "imgbuild-smoke.py"
#: The folder a package probe is copied to, beside its launcher: its name is the package's inside the image.
PACKAGE_FOLDER = "imgbuild_smoke"


@dataclass(frozen=True)
class Probe:
    """One run of a probe's script: what the engine copies in and runs, and the marker it answers after."""

    name: str  # what the fake engine answers by: "smoke", "pins", "lock", "gpus", "jupyter"
    script: str  # Python source, run by the image's python3
    marker: str  # the answer's line starts with this (the script finds it in MARKER_VARIABLE)
    #: Files put beside the script in /tmp before it starts (path under /tmp, content): what it is told that is
    #: too large for an environment variable, and a package's modules; always written, so an image's own file of
    #: that name never counts.
    files: tuple[tuple[str, bytes], ...] = ()

    def answer(self, output: str) -> dict[str, Any] | None:
        """The JSON object on the last line that starts with the marker; None when there is none, or it is not an
        object, or not JSON, or longer than an HTTP body may be (hostile output reads as no answer)."""
        return marked_answer(output, self.marker, limits.HTTP_BODY_BYTES)

    def says(self, data: dict[str, Any]) -> str:
        """The line the script prints to answer `data` (what a fake engine answers)."""
        return self.marker + json.dumps(data)

    def tar(self) -> bytes:
        """The script and its files as a tar for SCRIPT_FOLDER; a file in a folder (a package's module) comes after
        its folder's own entry, so the engine makes the folder with a mode, not guessing one."""
        buf = io.BytesIO()
        folders = sorted({str(PurePosixPath(name).parent) for name, _ in self.files} - {"."})
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for folder in folders:
                entry = tarfile.TarInfo(folder)
                entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(entry)
            for name, data, mode in [
                (SCRIPT_NAME, self.script.encode(), 0o755),
                *((n, d, 0o644) for n, d in self.files),
            ]:
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), mode
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        """`env` with the script's marker in it: how the script learns it."""
        return {**env, MARKER_VARIABLE: self.marker}


@dataclass(frozen=True)
class ProbeScript:
    """A probe as imgbuild ships it: its script (a file, or a package folder run through its `__main__`) and the
    marker its answer line starts with."""

    name: str
    path: Path
    marker: str
    modules: tuple[str, ...] = ()  # a package's modules (`path` its folder); none for a single file

    def package_files(self) -> tuple[tuple[str, bytes], ...]:
        """A package's modules under PACKAGE_FOLDER; none for a single file."""
        return tuple((f"{PACKAGE_FOLDER}/{name}", (self.path / name).read_bytes()) for name in self.modules)

    def source(self) -> str:
        """The script the engine runs: the file, or a launcher that runs the package folder beside it."""
        if not self.modules:
            return self.path.read_text(encoding="utf-8")
        return (
            "import os, runpy\n"
            f"runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), {PACKAGE_FOLDER!r}),"
            " run_name='__main__')\n"
        )

    def probe(self, call: str = "", files: tuple[tuple[str, bytes], ...] = ()) -> Probe:
        """A run of it: `call` appended to the script (its arguments, as Python), `files` beside it. Reads the
        script, so only when it is about to run."""
        return Probe(self.name, self.source() + call, self.marker, (*self.package_files(), *files))

    def answer(self, output: str) -> dict[str, Any] | None:
        """Its answer in `output`, as `Probe.answer` reads it."""
        return Probe(self.name, "", self.marker).answer(output)

    def says(self, data: dict[str, Any]) -> str:
        """The line it prints to answer `data`."""
        return Probe(self.name, "", self.marker).says(data)


#: The smoke test (payload/smoke, a package), answering its report.
SMOKE = ProbeScript("smoke", SMOKE_PACKAGE, "IMGBUILD-SMOKE-REPORT ", SMOKE_MODULES)
#: `imgbuild lock`'s resolver, run in the recipe's base (pipeline.pins appends its call).
LOCK = ProbeScript("lock", PAYLOAD_DIR / "lock_resolve.py", "IMGBUILD-LOCK-REPORT ")
#: The pins install.sh will hold a base's packages at (imgbuild.pipeline.resolve reads the answer).
BASE_PINS = ProbeScript("pins", PAYLOAD_DIR / "base_pins.py", "IMGBUILD-BASE-PINS ")
#: The engine's GPUs as a short-lived container of the image sees them (imgbuild.gpu.engine_read judges the answer).
ENGINE_GPUS = ProbeScript("gpus", PAYLOAD_DIR / "engine_gpus.py", "IMGBUILD-ENGINE-GPUS ")
#: Whether an image has `jupyter` on its PATH (imgbuild.servers.jupyter).
HAS_JUPYTER = ProbeScript("jupyter", PAYLOAD_DIR / "has_jupyter.py", "IMGBUILD-JUPYTER ")
PROBES = (SMOKE, LOCK, BASE_PINS, ENGINE_GPUS, HAS_JUPYTER)
