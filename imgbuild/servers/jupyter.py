"""`run --jupyter`: the address is printed only once Jupyter answers on it. An image without `jupyter` is named
before anything starts; a notebook that exits (not installed after all, refusing to run as root, a crash) or
never answers is said with its exit code and last lines of output, and its container is removed."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING

from imgbuild.engine.types import ContainerInfo
from imgbuild.errors import ImgbuildError, UsageError
from imgbuild.payload.probes import HAS_JUPYTER

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.engine.types import ImageEngine

#: How long a notebook may take to answer (a cold image's first import of JupyterLab on a busy machine).
SERVE_SECONDS = 120
POLL_SECONDS = 0.5


def check_present(engine: ImageEngine, image: str, settings: Settings | None) -> None:
    """Refuse, before anything starts, an image that has no `jupyter` on its PATH (looked for as the user the run
    is for: the image may be their own)."""
    from imgbuild.hostio.acting import container_user

    probe = HAS_JUPYTER.probe()  # read only for a --jupyter run
    code, output, _ = engine.containers.run_script(
        image, probe, [], {}, gpus=None, timeout=60, as_user=container_user(settings)
    )
    answer = probe.answer(output)
    if answer is None:
        return  # the image could not say (no python3): the start will tell, with the container's own words
    if not answer.get("jupyter"):
        raise UsageError(
            f"{image} has no `jupyter` on its PATH: build it with `pip: [jupyterlab]` in its recipe, or run "
            "another image (NGC's PyTorch and TensorFlow images carry JupyterLab)"
        )


def answers(port: int, timeout: float = 2.0) -> bool:
    """Does a Jupyter server answer on 127.0.0.1:`port`? (`/api` needs no token and says its version.)"""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api", timeout=timeout) as reply:  # noqa: S310
            return reply.status == 200 and b"version" in reply.read(4096)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_until_serving(
    engine: ImageEngine,
    name: str,
    port: int,
    seconds: float = SERVE_SECONDS,
    ask: Callable[[int], bool] = answers,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[str], None] = lambda text: None,
) -> None:
    """Return once the notebook in container `name` answers on `port`; else remove the container and raise, with
    its exit code (or the wait) and the last lines it printed."""
    started = clock()
    told = -10.0
    while True:
        if ask(port):
            return
        rows = [r for r in engine.containers.rows(name) if r.name == name]
        state = rows[0] if rows else ContainerInfo(name, status="gone")
        waited = clock() - started
        if state.status != "running" or waited > seconds:
            tail = " | ".join(line.strip() for line in engine.containers.log_tail(name, 8).splitlines()[-4:])
            engine.containers.remove(name)
            why = (
                f"its container exited {state.exit_code}"
                if state.status in ("exited", "dead")
                else f"it did not answer in {seconds:.0f} s"
                if state.status == "running"
                else "its container is gone"
            )
            raise ImgbuildError(
                f"Jupyter did not start in {name}: {why}; it said: {tail[:600] or '(nothing)'}; the container "
                "was removed"
            )
        if waited - told >= 10:
            progress(f"waiting for Jupyter in {name} to answer ({waited:.0f} s)")
            told = waited
        sleep(POLL_SECONDS)
