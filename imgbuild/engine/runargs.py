"""`docker run` (and `podman run`) from RunOptions: the words, the env file that carries the container's
variables, and the flags dev containers share. Pure, but for `env_file`'s in-memory file."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
from collections.abc import Iterable

from imgbuild.engine.types import RunOptions
from imgbuild.errors import UsageError
from imgbuild.facts import Label


def run_argv(o: RunOptions) -> tuple[list[str], dict[str, str]]:
    """The `docker run` words for `o` (without the binary), and the container's variables, which go to the CLI in
    an env file (`env_file`): no value (a Jupyter token, a user's HF_TOKEN) stands in an argv."""
    return _run_words(o, values=False), dict(container_env(o))


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
#: The longest `NAME=VALUE` line the docker and podman CLIs read from an env file (Go's bufio.Scanner: 64 KiB a
#: line); a longer one stops the CLI with "token too long".
ENV_LINE_BYTES = 65_000


def env_file_text(env: dict[str, str]) -> bytes:
    """`NAME=VALUE` lines as the docker and podman CLIs read an env file. A value the format cannot carry (a line
    break, NUL) is refused, never cut: the container would get another value than the one given."""
    lines = []
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"-e {name[:60]!r}: not a variable name (letters, digits, _)")
        if any(c in value for c in "\n\r\0"):
            raise UsageError(f"-e {name}: a value with a line break or NUL cannot be passed to a container")
        try:
            line = f"{name}={value}\n".encode()
        except UnicodeEncodeError:
            raise UsageError("-e: a value that is not UTF-8 text cannot be passed to a container") from None
        if len(line) > ENV_LINE_BYTES:
            raise UsageError(f"-e {name}: a value of {len(line):,} bytes; a container's variable holds at most "
                             f"{ENV_LINE_BYTES:,} (put a longer value in a file the run mounts)")  # fmt: skip
        lines.append(line)
    return b"".join(lines)


@contextlib.contextmanager
def env_file(env: dict[str, str]):  # type: ignore[no-untyped-def]
    """(fd, /dev/fd/fd) of an anonymous in-memory file holding `env` (no name on any disk, readable by this
    process and the child it is passed to only); (-1, "") for no variables."""
    if not env:
        yield -1, ""
        return
    data = env_file_text(env)
    fd = os.memfd_create("imgbuild-env", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd, f"/dev/fd/{fd}"
    finally:
        os.close(fd)


def run_command_line(o: RunOptions, docker: str = "docker") -> str:
    """The command as a user would type it (`run --dry-run`): values shown, since the user gave them."""
    return shlex.join([docker, *_run_words(o, values=True)])


def own_ipc(ipc: str | None, hardened: bool) -> str | None:
    """The IPC mode of a container: one started for a user imgbuild acts for through sudo (`hardened`) never
    shares the host's, where other users' /dev/shm files and System V segments are (and outlive the run);
    a `run` and a script container alike."""
    return "private" if hardened and ipc == "host" else ipc


def house_flags(o: RunOptions) -> list[tuple[str, str]]:
    """(flag, value) of a site's house rules: IPC or shm, ulimits, capped json-file logs. Dev containers' runArgs
    take the same (clusters.devcontainer). A hardened run's private IPC has a /dev/shm as large as its memory
    cap, which its tmpfs pages count against."""
    ipc = own_ipc(o.ipc, o.hardened)
    if o.shm_size:
        flags = [("--shm-size", o.shm_size)]
    elif ipc != o.ipc:
        flags = [("--ipc", "private"), *([("--shm-size", f"{o.memory}b")] if o.memory else [])]
    else:
        flags = [("--ipc", ipc)] if ipc else []
    flags += [("--ulimit", f"{key}={value}") for key, value in o.ulimits]
    if o.log_max_size or o.log_max_file:
        flags.append(("--log-driver", "json-file"))
        flags += [("--log-opt", f"max-size={o.log_max_size}")] if o.log_max_size else []
        flags += [("--log-opt", f"max-file={o.log_max_file}")] if o.log_max_file else []
    return flags


def resource_flags(o: RunOptions) -> list[tuple[str, str]]:
    """(flag, value) of the GPUs and CPUs chosen, with their labels, and the run's caps (memory, processes, the
    user's slice): `imgbuild run` and a dev container alike."""
    if o.gpus_by_env or not o.gpus:
        flags = []
    elif o.gpus_by_cdi:
        flags = [("--device", f"nvidia.com/gpu={uuid}") for uuid in o.gpus]
    else:
        flags = [("--gpus", f'"device={",".join(o.gpus)}"')]
    flags += [("--label", f"{key}={value}") for key, value in o.labels if key in (Label.GPUS, Label.GPU_UUIDS)]
    if o.cpus:
        flags.append(("--cpus", f"{o.cpus:g}"))
    if o.cpuset:
        flags.append(("--cpuset-cpus", o.cpuset))
    if o.memory:
        flags += [("--memory", f"{o.memory}b"), ("--memory-swap", f"{o.memory}b")]  # no swap past the cap
    if o.pids_limit:
        flags.append(("--pids-limit", str(o.pids_limit)))
    if o.cgroup_parent:
        flags.append(("--cgroup-parent", o.cgroup_parent))
    return flags


#: How a container is kept from every GPU, whatever the engine's runtime: the NVIDIA runtime (a default `nvidia`
#: runtime, or an NGC image's own NVIDIA_VISIBLE_DEVICES=all) mounts no device for `void`, and CUDA enumerates
#: none where a device is there anyway (CDI, a privileged container).
GPUS_HIDDEN = (("NVIDIA_VISIBLE_DEVICES", "void"), ("CUDA_VISIBLE_DEVICES", ""))


def hide_gpus(env: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """`env` for a container given no GPU: the one rule every engine path renders (`run`, a script, a Slurm
    node's docker). The hiding variables replace any of the same name and come last, the last word."""
    hidden = dict(GPUS_HIDDEN)
    return [(key, value) for key, value in env if key not in hidden] + list(GPUS_HIDDEN)


def shown_gpus(env: Iterable[tuple[str, str]], gpus: Iterable[str]) -> list[tuple[str, str]]:
    """`env` for a container given the GPUs `gpus` (UUIDs), however the engine is handed them (`--gpus`, CDI
    devices, the variable alone): NVIDIA_VISIBLE_DEVICES names exactly those, the last word. An NGC image's own
    `NVIDIA_VISIBLE_DEVICES=all` would otherwise have a default nvidia runtime (legacy or in CDI mode) add every
    GPU of the host to the ones a CDI device request asked for."""
    return [(key, value) for key, value in env if key != "NVIDIA_VISIBLE_DEVICES"] + [
        ("NVIDIA_VISIBLE_DEVICES", ",".join(gpus))
    ]


def container_env(o: RunOptions) -> list[tuple[str, str]]:
    """The container's variables: the given ones, then the GPUs' (the last word on NVIDIA_VISIBLE_DEVICES)."""
    return shown_gpus(o.env, o.gpus) if o.gpus else hide_gpus(o.env)


def _run_words(o: RunOptions, values: bool) -> list[str]:
    words = ["run", "--name", o.name, "--user", o.user]
    for key, value in o.labels:
        if key not in (Label.GPUS, Label.GPU_UUIDS):
            words += ["--label", f"{key}={value}"]
    for flag, value in house_flags(o):
        words += [flag, value]
    for mount in o.mounts:
        words += ["-v", mount]
    if o.workdir:
        words += ["-w", o.workdir]
    if values:  # shown to the user (`run --dry-run`); the real start passes them in an env file (`env_file`)
        for key, value in container_env(o):
            words += ["-e", f"{key}={value}"]
    for port in o.ports:
        words += ["-p", port]
    for flag, value in resource_flags(o):
        words += [flag, value]
    return [*words, *_mode_words(o), o.image, *o.command]


def _mode_words(o: RunOptions) -> list[str]:
    modes = [("--rm", o.remove), ("-d", o.detach), ("-i", o.interactive), ("-t", o.tty)]
    words = [flag for flag, on in modes if on] + ([] if o.pull else ["--pull", "never"])
    if o.hardened:
        words += ["--security-opt", "no-new-privileges", "--cap-drop", "ALL"]
    return words + (["--entrypoint", o.entrypoint] if o.entrypoint is not None else [])
