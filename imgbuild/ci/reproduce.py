"""`imgbuild rebuild --verify-reproducible`: each recipe built again from nothing (no layer cache, every time
SOURCE_DATE_EPOCH), never promoted, its image id compared with the promoted image's. The same recipe, lock
and base digest must give the same id; on Podman they do (`build --reproducible`). Docker's built-in
BuildKit 0.8 cannot stamp layer times, so there the check reports the difference it cannot avoid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from imgbuild.ci.rebuild import discover, load_graph
from imgbuild.config.settings import Settings
from imgbuild.engine import ImageEngine
from imgbuild.errors import ImgbuildError
from imgbuild.pipeline.build import BuildJob, build_job
from imgbuild.recipe import load_recipe


@dataclass
class Verdict:
    recipe: str
    image: str
    promoted: str  # the promoted image's id, "" when there is none
    rebuilt: str  # the scratch build's id, "" when it failed
    error: str = ""

    @property
    def same(self) -> bool:
        return bool(self.promoted) and self.promoted == self.rebuilt

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "reproducible": self.same}


def verify(paths: list[str], settings: Settings, log: Callable[[str], None], engine: ImageEngine) -> list[Verdict]:
    """One verdict per recipe under `paths`, dependencies first: the engine's own platform's build of each."""
    verdicts = []
    for item in load_graph(discover(paths), settings):
        promoted = (engine.images.image_id(item.target) or "") if item.target else ""
        verdict = Verdict(str(item.path), item.target, promoted, "")
        if item.error:
            verdict.error = item.error
        elif not promoted:
            verdict.error = f"{item.target} is not built here: build it with --reproducible first"
        else:

            def said(step: str, target: str = item.target) -> None:
                log(f"{target}: {step}")

            try:
                job = BuildJob(
                    load_recipe(item.path, secrets=settings.secrets()),
                    (engine.host_platform(),),  # the promoted image it is compared with is this platform's
                    no_cache=True,
                    reproducible=True,
                    promote=False,
                )
                result = build_job(job, settings, engine, said).own()
                verdict.rebuilt = result.image_id
            except ImgbuildError as exc:
                verdict.error = str(exc).splitlines()[0][:300]
        verdicts.append(verdict)
    return verdicts
