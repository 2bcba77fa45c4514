"""`images/<name>/imgbuild.lock.json`, the context record: what a rendered context was made from, enough to know
when a rebuild is due. One owner, both ways: `Record.of(plan, backend)` is what render writes, `Record.read(path)`
what `rebuild --check` reads back from a repository (untrusted: bounded, and shaped as imgbuild writes it).

(Not to be mixed up with `<recipe>.lock.txt`, the pip pins `imgbuild lock` writes: build.pins.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from imgbuild import __version__, imageref
from imgbuild.hostio.regular import read_regular
from imgbuild.ngc import FRAMEWORKS
from imgbuild.pipeline.plan import Plan, templates_digest
from imgbuild.recipe import stable_name

RECORD_FILE = "imgbuild.lock.json"
MAX_BYTES = 64 * 1024
BACKENDS = ("buildkit", "sdk")


@dataclass(frozen=True)
class RecordedBase:
    requested: str
    ref: str
    digest: str  # the base's identity: its registry digest, or a local image's id
    framework: str = ""
    framework_version: str = ""
    cuda: str = ""
    cudnn: str = ""

    def env(self) -> list[str]:
        """The base's env as far as the record keeps it: enough to plan exactly as at render time."""
        env = [f"CUDA_VERSION={self.cuda}"] if self.cuda else []
        env += [f"CUDNN_VERSION={self.cudnn}"] if self.cudnn else []
        fw = FRAMEWORKS.get(self.framework)
        if fw and self.framework_version:
            env.append(f"{fw.version_env}={self.framework_version}")
        return env

    def reference(self) -> imageref.ImageRef:
        return imageref.parse(self.ref)


@dataclass(frozen=True)
class Record:
    recipe: str
    image: str
    base: RecordedBase
    content_hash: str
    input_hash: str
    scripts: str
    extends: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()
    backend: str = "buildkit"
    imgbuild: str = __version__

    @classmethod
    def of(cls, plan: Plan, backend: str) -> Record:
        base = plan.base
        return cls(
            recipe=plan.loaded.name,
            image=plan.target,
            base=RecordedBase(
                requested=base.requested,
                ref=base.ref,
                digest=base.identity,
                framework=base.framework or "",
                framework_version=base.framework_version or "",
                cuda=base.facts.get("cuda", ""),
                cudnn=base.facts.get("cudnn", ""),
            ),
            content_hash=plan.content_hash,
            input_hash=plan.input_hash,
            scripts=templates_digest(),  # imgbuild's own scripts in the context (not committed)
            extends=tuple(stable_name(p) for p in plan.loaded.chain[:-1]),
            protected=tuple(plan.protected),
            backend=backend,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "imgbuild": self.imgbuild,
            "recipe": self.recipe,
            "extends": list(self.extends),
            "image": self.image,
            "base": {
                "requested": self.base.requested,
                "ref": self.base.ref,
                "digest": self.base.digest,
                "framework": self.base.framework or None,
                "framework_version": self.base.framework_version or None,
                "cuda": self.base.cuda,
                "cudnn": self.base.cudnn,
            },
            "protected": list(self.protected),
            "content_hash": self.content_hash,
            "scripts": self.scripts,
            "input_hash": self.input_hash,
            "backend": self.backend,
        }

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    @property
    def namespace(self) -> str:
        """The image's first path component (`lab` of `lab/pytorch-research:24.05`)."""
        return imageref.parse(self.image).path.split("/")[0]

    @classmethod
    def read(cls, path: Path) -> Record:
        """The record at `path`, as committed to a repository: a regular file (no link, no FIFO), at most MAX_BYTES,
        of the shape imgbuild writes; ValueError (saying nothing of the content) otherwise."""
        try:
            found = read_regular(path, MAX_BYTES)
        except OSError:
            found = None
        if found is None:
            raise ValueError("not a record")
        try:
            data = json.loads(found[0].decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ValueError("not a record") from None
        return cls._shaped(data)

    @classmethod
    def _shaped(cls, data: Any) -> Record:
        base = data.get("base") if isinstance(data, dict) else None
        if not isinstance(base, dict) or not isinstance(data.get("image"), str) or not isinstance(base.get("ref"), str):
            raise ValueError("not a record")

        def text(d: dict[str, Any], key: str) -> str:
            return d[key] if isinstance(d.get(key), str) else ""

        try:
            imageref.parse(data["image"])
            imageref.parse(base["ref"])
        except imageref.BadReference:
            raise ValueError("not a record") from None
        words = lambda key: tuple(str(w) for w in data.get(key) or [] if isinstance(w, str))  # noqa: E731
        return cls(
            recipe=text(data, "recipe"),
            image=data["image"],
            base=RecordedBase(
                requested=text(base, "requested"),
                ref=base["ref"],
                digest=text(base, "digest"),
                framework=text(base, "framework"),
                framework_version=text(base, "framework_version"),
                cuda=text(base, "cuda"),
                cudnn=text(base, "cudnn"),
            ),
            content_hash=text(data, "content_hash"),
            input_hash=text(data, "input_hash"),
            scripts=text(data, "scripts"),
            extends=words("extends"),
            protected=words("protected"),
            backend=data.get("backend") if data.get("backend") in BACKENDS else "buildkit",
            imgbuild=text(data, "imgbuild"),
        )
