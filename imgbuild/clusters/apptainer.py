"""Apptainer: a recipe's definition file exported (from the built image's archive, or the rendered context), the
.sif built with the site's apptainer or singularity, and the one name a .sif of an image has.

Docker is not allowed on most Slurm clusters; Apptainer runs the image there (`--nv` for GPUs).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imgbuild.errors import EnvironmentProblem, JobFailed, UsageError
from imgbuild.imageref import APPTAINER_ENDINGS, is_file_path
from imgbuild.pipeline.plan import Plan
from imgbuild.pipeline.render import apptainer_definition

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.engine.types import ImageEngine


def sif_name(image: str) -> str:
    """The one name of an image's .sif: `lab/pytorch-research:24.05` -> `pytorch-research_24.05.sif`
    (what `export --apptainer` builds and what `slurm` runs)."""
    from imgbuild.imageref import parse

    ref = parse(image)
    return ref.path.rsplit("/", 1)[-1] + (f"_{ref.tag}" if ref.tag else "") + ".sif"


def sif_path(image: str, sif_dir: str | None) -> str:
    """`lab/pytorch-research:24.05` -> `<sif_dir>/pytorch-research_24.05.sif`; an Apptainer image file, or any
    path (a sandbox folder, a SquashFS image: apptainer reads what it is), passes through."""
    if image.lower().endswith(APPTAINER_ENDINGS) or is_file_path(image):
        return image
    return f"{sif_dir.rstrip('/')}/{sif_name(image)}" if sif_dir else sif_name(image)


@dataclass
class Exported:
    definition: str
    archive: str | None = None  # the docker save tar, for the docker-archive bootstrap
    context: Path | None = None  # the rendered context, for the native bootstrap
    sif: Path | None = None  # the built image, where apptainer is installed


def export_apptainer(
    plan: Plan, settings: Settings, bootstrap: str, out: Path | None, engine: ImageEngine | None = None
) -> Exported:
    """The Apptainer definition for `plan` (plus what its bootstrap needs: a saved archive, a context)."""
    from imgbuild.pipeline.context import context_dir, render_into

    archive = None
    context = None
    if bootstrap == "docker-archive":
        if engine is None or engine.images.image(plan.target) is None:
            raise UsageError(f"{plan.target} is not built: run imgbuild build on its recipe first")
        archive = str((out or Path(sif_name(plan.target))).with_suffix(".tar"))
        engine.images.save(plan.target, Path(archive))
    if bootstrap == "native":
        context = render_into(plan, context_dir(plan, settings), "buildkit", settings)
    return Exported(apptainer_definition(plan, bootstrap, archive), archive, context)


def apptainer_tool() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")


def build_sif(tool: str, definition: Path, cwd: Path | None) -> Path:
    """`apptainer build` the definition, then `apptainer test` it (the %test section runs the smoke test)."""
    sif = definition.with_suffix(".sif")
    steps = (
        [tool, "build", "--force", str(sif.resolve()), str(definition.resolve())],
        [tool, "test", str(sif.resolve())],
    )
    for args in steps:
        if subprocess.run(args, cwd=cwd).returncode != 0:
            raise JobFailed(f"{' '.join(args[:2])} failed for {definition}")
    return sif


@dataclass
class Written:
    exported: Exported
    path: Path | None  # the definition file; None: for standard output
    sif: Path | None = None  # the .sif built from it, where apptainer is installed


def export_definition(
    plan: Plan,
    settings: Settings,
    bootstrap: str,
    out: Path | None,
    *,
    to_stdout: bool,
    build: bool,
    say: Callable[[str], None],
) -> Written:
    """`imgbuild export --apptainer`: the definition (to `out`, default `<image>_<tag>.def`; with `to_stdout` it is
    the caller's to print), and with `build` the .sif and its %test where apptainer is installed (else `say` how
    to build it elsewhere)."""
    from imgbuild.engine import connect_engine

    out = None if to_stdout else (out or Path(sif_name(plan.target)).with_suffix(".def"))
    engine = connect_engine(settings) if bootstrap == "docker-archive" else None
    exported = export_apptainer(plan, settings, bootstrap, out, engine)
    if exported.archive:
        say(f"saved {plan.target} to {exported.archive}")
    if exported.context:
        say(f"rendered {exported.context}: run apptainer build from that folder (%files paths are relative)")
    if out is None:
        return Written(exported, None)
    try:
        from imgbuild.hostio.regular import write_atomic

        write_atomic(out, exported.definition)  # never through a link committed in the repository
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write {out}: {exc.strerror}") from None
    tool = apptainer_tool() if build else None
    if build and not tool:
        say(
            "note: apptainer is not installed here: copy the definition to a machine that has it and run "
            f"`apptainer build {out.with_suffix('.sif').name} {out.name}` and copy it to the site's slurm.sif_dir"
        )
    return Written(exported, out, build_sif(tool, out, exported.context) if tool else None)
