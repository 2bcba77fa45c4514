"""How far one parameter travels: the walks of the house review (`imgbuild build RECIPE`'s recipe path, with and
without `--push`, and `imgbuild run --gpus 2`'s GPU request), traced through the real command line on the in-memory
engine and registry.

A function counts when one of its arguments is the followed value or an object that carries it; a hop is a
change of module between two such functions, in call order. The ceilings below are the counts measured when the
walks were last shortened: a change that scatters one of these values over more modules fails here first.
`python -m tests.test_walks` prints the table.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import imgbuild
from tests.support import server

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "pytorch-research.yaml"


@dataclass
class Walk:
    """The functions the followed value passed through, in call order, and the whole command's module traffic."""

    path: list[tuple[str, str]] = field(default_factory=list)  # (module, function) per call that got the value
    entered: set[str] = field(default_factory=set)  # every imgbuild module the command ran code in
    switches: int = 0  # calls from one imgbuild module into another

    @property
    def functions(self) -> int:
        return len(set(self.path))

    @property
    def modules(self) -> list[str]:
        return sorted({m for m, _ in self.path})

    @property
    def hops(self) -> int:
        return sum(1 for a, b in zip(self.path, self.path[1:], strict=False) if a[0] != b[0])


def _import_everything() -> None:
    """Every imgbuild module imported before tracing: import-time frames are not the walk."""
    for info in pkgutil.walk_packages(imgbuild.__path__, "imgbuild."):
        if ".payload." not in info.name and not info.name.endswith("__main__"):
            importlib.import_module(info.name)


@contextmanager
def traced(carries: Callable[[str, Any], bool]) -> Iterator[Walk]:
    _import_everything()
    walk = Walk()
    last = [""]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("imgbuild"):
            return
        walk.entered.add(module)
        if module != last[0]:
            walk.switches += bool(last[0])
            last[0] = module
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(carries(name, frame.f_locals.get(name)) for name in names):
            walk.path.append((module, code.co_qualname))

    sys.setprofile(profile)
    try:
        yield walk
    finally:
        sys.setprofile(None)


def _run_main(argv: list[str]) -> int:
    from imgbuild.cli import main

    try:
        main(argv)
    except SystemExit as ended:
        return int(ended.code or 0)
    return 0


def _carries_the_recipe() -> Callable[[str, Any], bool]:
    """The recipe path, the LoadedRecipe holding it, and the BuildJob holding that."""
    from imgbuild.pipeline.build import BuildJob
    from imgbuild.recipe.load import LoadedRecipe

    wanted = {str(RECIPE), "recipes/pytorch-research.yaml"}

    def carries(name: str, value: Any) -> bool:
        return isinstance(value, (LoadedRecipe, BuildJob)) or (isinstance(value, (str, Path)) and str(value) in wanted)

    return carries


def walk_recipe_in_build(tmp: Path) -> Walk:
    """(a) `imgbuild build recipes/pytorch-research.yaml`: the recipe path, and the values carrying it."""
    from imgbuild.engine.fake import FakeEngine
    from tests.fake_nvcr import FakeNvcr

    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        env = _env(IMGBUILD_NGC_REGISTRY=nvcr.host, IMGBUILD_IMAGES_DIR=str(tmp / "images"))
        with env, _engine(FakeEngine()), traced(_carries_the_recipe()) as walk:
            code = _run_main(["build", "recipes/pytorch-research.yaml"])
    assert code == 0, "the build walk must succeed to be measured"
    return walk


def walk_recipe_in_build_push(tmp: Path, connections: list[int] | None = None) -> Walk:
    """(c) `imgbuild build recipes/pytorch-research.yaml --push`, into a registry on 127.0.0.1: the recipe path and
    the values carrying it, through the build and the push. `connections` counts the engine's connections."""
    from imgbuild.engine.fake import FakeEngine
    from tests.fake_nvcr import FakeNvcr
    from tests.fake_registry import ServedRegistry

    fake = FakeEngine()
    registry = ServedRegistry()
    fake.images.push = registry.engine_push(fake)  # type: ignore[method-assign]
    try:
        with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
            env = _env(
                IMGBUILD_NGC_REGISTRY=nvcr.host,
                IMGBUILD_IMAGES_DIR=str(tmp / "images"),
                IMGBUILD_IMAGE_REGISTRY=registry.host,
                IMGBUILD_INSECURE_REGISTRIES=registry.host,
            )
            with env, _engine(fake, connections), traced(_carries_the_recipe()) as walk:
                code = _run_main(["build", "recipes/pytorch-research.yaml", "--push"])
    finally:
        registry.close()
    assert code == 0, "the build --push walk must succeed to be measured"
    assert any(tag == "24.05" for _, tag in registry.tags), "nothing was pushed"
    return walk


def walk_gpus_in_run(tmp: Path) -> Walk:
    """(b) `imgbuild run --gpus 2 -d ubuntu:22.04 sleep 1` on a DGX A100's snapshot: the request, and the
    RunCall, RunRequest, Selection, RunSpec and RunOptions carrying it."""
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.engine.types import ImageInfo, RunOptions
    from imgbuild.gpu.allocate import Selection
    from imgbuild.servers.runwords import RunCall, RunRequest
    from imgbuild.servers.spec import RunSpec

    def carries(name: str, value: Any) -> bool:
        if isinstance(value, (RunCall, RunRequest, Selection, RunSpec, RunOptions)):
            return True
        return ("gpu" in name or "request" in name) and value == "2"

    snapshot = tmp / "snapshot.json"
    snapshot.write_text(json.dumps({"gpus": [g.to_json() for g in server("dgx-a100")]}))
    config = tmp / "config.yaml"
    config.write_text(f"run:\n  state_dir: {tmp / 'state'}\n")
    fake = FakeEngine()
    fake.images.add("sha256:" + "1" * 64, ImageInfo("sha256:" + "1" * 64), "ubuntu:22.04")
    env = _env(IMGBUILD_GPU_SNAPSHOT=str(snapshot), IMGBUILD_CONFIG=str(config))
    with env, _engine(fake), traced(carries) as walk:
        code = _run_main(["run", "--gpus", "2", "-d", "ubuntu:22.04", "sleep", "1"])
    assert code == 0, "the run walk must succeed to be measured"
    return walk


@contextmanager
def _engine(fake: Any, connections: list[int] | None = None) -> Iterator[None]:
    """Every module's `connect_engine` (imported by name at module level or in a function) answers `fake`; each
    connection is counted in `connections`."""
    from imgbuild import engine as engine_module

    _import_everything()
    real = engine_module.connect_engine
    bound = [m for m in list(sys.modules.values()) if getattr(m, "connect_engine", None) is real]
    counted = connections if connections is not None else []

    def connect(*args: Any, **kwargs: Any) -> Any:
        counted.append(1)
        return fake

    for module in bound:
        module.connect_engine = connect
    try:
        yield
    finally:
        for module in bound:
            module.connect_engine = real


@contextmanager
def _env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: (walk, most modules the value may cross, most hops), as measured when last shortened. The builds went from 19
#: hops to 18 when the build became one BuildJob made at the edge: the command line loads the recipe into it, and the
#: pipeline runs every stage, the push included, with no second load and no return to the command line; 18 to 16 when
#: the recipe's name (`recipes/x.yaml`) became a fact of the loaded recipe, fixed at load, which the render, the
#: record and the provenance read instead of each asking the loaded recipe's module to work it out again; 16 to 14
#: when the path as its writer sees it (`display`) became such a fact too, which the plan's messages read; 10 modules
#: to 9 and 14 hops to 13 when the LoadedRecipe came to live with its maker (recipe.load) and how a path is shown
#: with the positions that show it (yamlpos). (b) went
#: from 18 to 15 when the site's rules over a GPU request became one step (servers.holds.choose_gpus: the request
#: that could never start, the choice, the quota) instead of three calls to and fro. (b) crosses servers.runwords
#: since run's grammar and its typed RunCall have one home, where the command line and the queue's child both read
#: words (16 hops with RunCall followed as a carrier: the words read, the command line's edge, then the launch,
#: which checks and resolves the image once where it was resolved twice).
CEILINGS = {
    "build": (walk_recipe_in_build, 9, 13),
    "build --push": (walk_recipe_in_build_push, 9, 13),
    "run": (walk_gpus_in_run, 8, 16),
}


def test_build_push_connects_the_engine_once(tmp_path, monkeypatch):
    """The edge connects the engine and hands it on: the build and the push that follows share one connection."""
    monkeypatch.chdir(ROOT)
    connections: list[int] = []
    walk_recipe_in_build_push(tmp_path, connections)
    assert len(connections) == 1


@pytest.mark.parametrize("name", sorted(CEILINGS))
def test_a_walked_value_crosses_no_more_modules_than_when_last_measured(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    measure, most_modules, most_hops = CEILINGS[name]
    walk = measure(tmp_path)
    assert walk.path, "the traced value was never seen: the tracer follows nothing"
    assert len(walk.modules) <= most_modules, walk.modules
    assert walk.hops <= most_hops, [m for m, _ in walk.path]


def _table() -> None:
    import tempfile

    os.chdir(ROOT)
    print("| walk | functions | modules | hops | modules entered | module switches |")
    print("|---|---|---|---|---|---|")
    for name, (measure, _, _) in sorted(CEILINGS.items()):
        with tempfile.TemporaryDirectory() as tmp:
            walk = measure(Path(tmp))
        print(
            f"| {name} | {walk.functions} | {len(walk.modules)} | {walk.hops} | {len(walk.entered)} | {walk.switches} |"
        )
        print(f"|  | {' → '.join(_compress([m.removeprefix('imgbuild.') for m, _ in walk.path]))} |||||")


def _compress(modules: list[str]) -> list[str]:
    return [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]


if __name__ == "__main__":
    _table()
