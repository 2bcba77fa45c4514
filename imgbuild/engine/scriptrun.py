"""A script's container (the smoke test, a base's pins, a lock, the jupyter check, the engine's GPU read): its
create() arguments (the user it runs as, hardened and capped, its labels, IPC and cache), its environment (the
GPUs it sees), how it starts (fed a secret on its standard input), falls back where the GPUs' request fails, and
hands on its output line by line. `containers.DockerContainers.run_script` runs one."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from imgbuild.engine.probe import SCRIPT_CACHE
from imgbuild.engine.runargs import hide_gpus, own_ipc, shown_gpus
from imgbuild.errors import ImgbuildError
from imgbuild.facts import Label
from imgbuild.hostio.acting import ContainerUser

SMOKE_LABEL = Label.SMOKE_OF


def start_otherwise(
    prepared: Any, gpus: list[str], stdin: bytes | None, env: dict[str, str], kwargs: dict[str, Any], why: str
) -> tuple[Any, str]:
    """The GPUs' device request failed at start: (the started container, a note saying why it has no GPUs or "").
    Where the engine has no legacy `nvidia` device driver, the same GPUs by CDI name; else, no GPU, said."""
    from docker.errors import APIError
    from docker.types import DeviceRequest

    if cdi_only(why):  # a CDI-only host (the toolkit in cdi mode, the GPU Operator), or no toolkit at all
        names = [f"nvidia.com/gpu={g}" for g in gpus] if gpus else ["nvidia.com/gpu=all"]
        container = prepared([DeviceRequest(driver="cdi", device_ids=names)])
        try:
            start_fed(container, stdin)
            return container, ""
        except APIError as cdi_exc:
            container.remove(force=True)
            why += f"; by CDI: {str(cdi_exc.explanation)[:200]}"
    note = f"the host has GPUs but the engine cannot pass them ({why}); install nvidia-container-toolkit" + (
        ", or on a CDI-only host generate its specs (nvidia-ctk cdi generate) for an engine with CDI"
        if cdi_only(why)
        else ""
    )
    kwargs["environment"] = script_env(env, None)
    kwargs["labels"] = {**kwargs["labels"], Label.GPU_UUIDS: ""}  # started without them: it holds none
    container = prepared(None)
    try:
        start_fed(container, stdin)
    except APIError as again:  # a default nvidia runtime whose hook fails for every container
        container.remove(force=True)
        raise ImgbuildError(
            f"{note}; the engine cannot start it without GPUs either "
            f"({str(again.explanation)[:200]}): check the engine's default runtime"
        ) from None
    return container, note


#: What an engine says when it has no legacy `nvidia` device driver for `--gpus` but the host has CDI specs: Docker
#: before moby/moby#50228 ("could not select device driver"), the NVIDIA runtime in cdi mode (its hook refuses).
CDI_ONLY = ("could not select device driver", "invoking the nvidia container runtime hook directly")


def cdi_only(error: str) -> bool:
    return any(words in error.lower() for words in CDI_ONLY)


def script_env(env: dict[str, str], gpus: list[str] | None) -> dict[str, str]:
    """A script's environment: with no GPU asked for, none seen either; with some, those named (`[]`: every GPU,
    asked for by count). Where the engine's default runtime is nvidia, an NGC image's own
    NVIDIA_VISIBLE_DEVICES=all would hand it every GPU of the host (other users' included) beside or without
    any device request."""
    if gpus is None:
        return dict(hide_gpus(env.items()))
    return dict(shown_gpus(env.items(), gpus)) if gpus else dict(env)


def script_container(
    image: str,
    env: dict[str, str],
    stdin: bool,
    ipc: str | None,
    shm_size: str | None,
    as_user: ContainerUser | None = None,
    cache: str | None = None,
    gpus: list[str] | None = None,
) -> dict:
    """The create() arguments of a script's container: labelled with the image, the process running it, whom it
    runs for and the GPUs it holds (every other key imgbuild reads set empty: an image's own `org.imgbuild.*`
    labels never make it another user's, hold GPUs or move a deadline); for a user imgbuild acts for (`as_user`),
    as that user, hardened and capped as their `imgbuild run` is, IPC its own."""
    from imgbuild.hostio.host import engine_token

    labels = {**dict.fromkeys(Label.CONTAINER_KEYS, ""), SMOKE_LABEL: image, Label.STARTED_BY: engine_token()}
    labels[Label.USER] = as_user.name if as_user else ""
    labels[Label.GPU_UUIDS] = ",".join(gpus or [])  # every GPU ([]) names none to label
    kwargs: dict[str, Any] = dict(environment=env, detach=True, labels=labels)
    if stdin:
        kwargs.update(stdin_open=True, tmpfs={"/run/imgbuild": "size=16m,mode=0700"})
    if as_user:
        kwargs.update(user=as_user.ids, security_opt=["no-new-privileges"], cap_drop=["ALL"])
        if as_user.pids_limit:
            kwargs["pids_limit"] = as_user.pids_limit
        if as_user.memory:
            kwargs.update(mem_limit=as_user.memory, memswap_limit=as_user.memory)  # no swap past the cap
        if as_user.cgroup_parent:
            kwargs["cgroup_parent"] = as_user.cgroup_parent
    ipc = own_ipc(ipc, as_user is not None)
    if shm_size:
        kwargs["shm_size"] = shm_size
    elif ipc:
        kwargs["ipc_mode"] = ipc
    if cache:
        kwargs["volumes"] = {cache: {"bind": SCRIPT_CACHE, "mode": "rw"}}
    return kwargs


def follow_lines(container: Any, on_line: Callable[[str], None]) -> Any:
    """A thread handing each line of the container's output to `on_line` as it comes; it ends with the container.
    A line is cut at 4 KiB (what is shown of it is the caller's to bound further)."""
    import threading

    def follow() -> None:
        pending = b""
        with contextlib.suppress(Exception):  # the stream ends, or the container is gone: the run's result says why
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    on_line(line[:4096].decode(errors="replace"))
                pending = pending[-4096:]

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread


def start_fed(container: Any, stdin: bytes | None) -> None:
    """Start the container; with `stdin`, attached first, then fed `<length>\\n<bytes>` and let go."""
    feed = container.attach_socket(params={"stdin": 1, "stream": 1}) if stdin is not None else None
    container.start()
    if feed is not None and stdin is not None:
        raw = getattr(feed, "_sock", feed)
        try:
            raw.sendall(str(len(stdin)).encode() + b"\n" + stdin)
        finally:
            with contextlib.suppress(OSError):
                raw.close()
