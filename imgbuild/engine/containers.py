"""Docker containers: the smoke test's container, and the docker CLI for `imgbuild run`, attach and exec."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from imgbuild.engine.buildkit import docker_clis
from imgbuild.engine.images import DockerImages, engine_time
from imgbuild.engine.runargs import env_file, run_argv
from imgbuild.engine.scriptrun import (
    follow_lines,
    script_container,
    script_env,
    start_fed,
    start_otherwise,
)
from imgbuild.engine.types import ContainerInfo, RunOptions
from imgbuild.errors import EngineUnavailable, ImgbuildError
from imgbuild.facts import Label
from imgbuild.hostio.acting import ContainerUser
from imgbuild.payload.probes import SCRIPT_FOLDER, SCRIPT_NAME, Probe

#: The longest a call into a running container may take (a note from the reaper, a probe for `ps`).
EXEC_SECONDS = 10
#: The only PATH an exec into a container is given: never the one its owner set.
EXEC_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class DockerContainers:
    """Containers on the engine: listed, measured, started through the docker CLI, or run for a script."""

    def __init__(self, client: Any, images: DockerImages, docker_cli: str | None = None):
        self.client = client
        self.images = images
        self._cli_hint = docker_cli
        self._stalled: set[str] = set()  # containers an exec of this process's did not end in (exec_bounded)

    def cli(self) -> str:
        """A docker CLI for interactive commands (run -it, attach, exec); any version will do."""
        found = docker_clis(self._cli_hint)
        if found:
            return found[0]
        raise EngineUnavailable("no docker CLI found: install docker (the client) or set IMGBUILD_DOCKER_CLI")

    def run(self, options: RunOptions) -> tuple[int, str]:
        """`docker run` for `options`: detached, stdout passed through and stderr kept to explain a failure;
        else with the terminal attached. (exit code, stderr). The container's variables reach the CLI as data, in
        an env file read from a private descriptor (`--env-file /dev/fd/N`): never its argv, and never the CLI's
        own environment (a container's HOME, PATH or proxy would steer the CLI itself: its config, credential
        helpers, context)."""
        argv, env = run_argv(options)
        with env_file(env) as (fd, path):
            argv, fds = ([argv[0], "--env-file", path, *argv[1:]], (fd,)) if env else (argv, ())
            if not options.detach:
                return subprocess.run([self.cli(), *argv], pass_fds=fds).returncode, ""
            proc = subprocess.run([self.cli(), *argv], stderr=subprocess.PIPE, text=True, pass_fds=fds)
        if proc.stderr:
            sys.stderr.write(proc.stderr)
        return proc.returncode, proc.stderr

    def attach(self, name: str) -> None:
        self._become(["attach", name])

    def logs(self, name: str, tail: str, follow: bool) -> None:
        self._become(["logs", "--tail", tail, *(["-f"] if follow else []), name])

    def exec_in(self, name: str, command: tuple[str, ...], tty: bool) -> None:
        self._become(["exec", "-it" if tty else "-i", name, *command])

    def _become(self, args: list[str]) -> None:
        """Become the docker CLI (attach, logs, exec): signals and the terminal go straight to it, and
        nothing is left behind when imgbuild is killed."""
        cli = self.cli()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(cli, [cli, *args])

    def names(self) -> set[str]:
        return {c.name for c in self.client.containers.list(all=True)}

    def rows(self, name_prefix: str = "") -> list[ContainerInfo]:
        """Every container, as imgbuild reads it; one removed while the list is read is left out, never an error."""
        rows = []
        for c in self.client.containers.list(all=True, ignore_removed=True):
            if name_prefix and not c.name.startswith(name_prefix):
                continue
            host = c.attrs.get("HostConfig") or {}
            labels = (c.attrs.get("Config") or {}).get("Labels") or {}
            state = c.attrs.get("State") or {}
            code = state.get("ExitCode")
            rows.append(
                ContainerInfo(
                    name=c.name,
                    id=c.short_id,
                    labelled=bool(labels.get(Label.USER)),
                    smoke=bool(labels.get(Label.SMOKE_OF)),
                    deadline=_number(labels.get(Label.DEADLINE)),
                    notify=labels.get(Label.NOTIFY) == "1",
                    exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                    started_ts=engine_time(state.get("StartedAt")),
                    created_ts=engine_time(c.attrs.get("Created")),
                    finished_ts=engine_time(state.get("FinishedAt")),
                    image=str((c.attrs.get("Config") or {}).get("Image", "")),
                    image_id=str(c.attrs.get("Image") or ""),
                    status=str(c.status),
                    user=str(labels.get(Label.USER, c.name.split("_", 1)[0] if "_" in c.name else "")),
                    gpus=str(labels.get(Label.GPUS, "")),
                    gpu_uuids=str(labels.get(Label.GPU_UUIDS, "")),
                    cpuset=str(host.get("CpusetCpus") or ""),
                    ports=tuple(_host_ports(host.get("PortBindings"))),
                    cpus=(host.get("NanoCpus") or 0) / 1e9 or None,
                    created=str(c.attrs.get("Created", ""))[:19].replace("T", " "),
                    memory=_positive(host.get("Memory")),
                    pids_limit=_positive(host.get("PidsLimit")),
                    cgroup_parent=str(host.get("CgroupParent") or ""),
                    runs_as=_unprivileged_user(c.attrs),
                )
            )
        return sorted(rows, key=lambda r: r.name)

    def stop(self, name: str, timeout: int = 30) -> None:
        """Stop a container (SIGTERM, then SIGKILL after `timeout` s); gone already is fine."""
        from docker.errors import APIError, NotFound

        with contextlib.suppress(NotFound):
            try:
                self.client.containers.get(name).stop(timeout=timeout)
            except APIError as exc:
                raise ImgbuildError(f"could not stop {name}: {exc.explanation}") from None

    def remove(self, name: str) -> None:
        from docker.errors import APIError, NotFound

        with contextlib.suppress(NotFound):
            try:
                self.client.containers.get(name).remove(force=True)
            except APIError as exc:
                raise ImgbuildError(f"could not remove {name}: {exc.explanation}") from None

    def discard_unstarted(self, name: str) -> bool:
        """Remove `name` if it was created but never ran (a `docker run` whose start failed leaves it `Created`,
        and the next run's name moves on); a container that ran, or another's, is left alone."""
        from docker.errors import APIError, NotFound

        try:
            container = self.client.containers.get(name)
            started = str((container.attrs.get("State") or {}).get("StartedAt") or "0001")
            if container.status != "created" or not started.startswith("0001"):  # Go's zero time: never started
                return False
            container.remove(force=True)
        except (NotFound, APIError):
            return False
        return True

    def log_tail(self, name: str, lines: int = 20) -> str:
        """The last `lines` lines of a container's output (stdout and stderr); "" when it is gone."""
        from docker.errors import APIError, NotFound

        try:
            data = self.client.containers.get(name).logs(tail=lines, stdout=True, stderr=True)
        except (APIError, NotFound):
            return ""
        return data.decode("utf-8", "replace")[-16_384:]

    def note(self, name: str, text: str) -> bool:
        """Write a line into a running container's own log (its PID 1's output); False where it cannot, or where
        the container does not let it finish within EXEC_SECONDS. Run as the container's own user: that is who
        may write its PID 1's output (root inside a container started `--user 1002:1002` may not), and the
        image's shell never runs as root for it."""
        code, _ = self.exec_bounded(name, ["/bin/sh", "-c", 'printf "%s\\n" "$0" >> /proc/1/fd/1', text])
        return code == 0

    def probe(self, name: str, command: list[str], timeout: float | None = None) -> tuple[int, str]:
        """Run a command in a running container as its user: (exit code, output); (-1, why) where it cannot, or
        where it has not ended after `timeout` seconds. `command[0]` by absolute path."""
        return self.exec_bounded(name, command, timeout)

    def exec_bounded(self, name: str, argv: list[str], seconds: float | None = None) -> tuple[int, str]:
        """`docker exec` of `argv` in container `name`, as the container's own user: (exit code, output), or
        (-1, why). Nothing in it is looked up in the container's environment: the program is named by absolute
        path (a word would be found on a PATH the container's owner sets: their own `sh` or `timeout`, that
        never returns), and the exec gets a fixed PATH. Bounded: past `seconds` (EXEC_SECONDS) the caller goes on
        (the program is left to its container, whose owner made it so), and this process makes no further call into
        that container (its waiting thread is the only one)."""
        import threading

        seconds = EXEC_SECONDS if seconds is None else seconds
        from docker.errors import APIError, NotFound

        if not argv or not argv[0].startswith("/"):
            raise ValueError(f"exec_bounded: {argv[:1]!r}: the program by absolute path")
        if name in self._stalled:  # one waiting thread per container at most: `gpus --watch` asks again and again
            return -1, "an earlier call into it has not ended"
        api = self.client.api
        try:
            exec_id = api.exec_create(name, argv, stdout=True, stderr=True, environment={"PATH": EXEC_PATH})["Id"]
        except (APIError, NotFound) as exc:
            return -1, str(exc)[:200]
        answer: dict[str, Any] = {}

        def run() -> None:
            try:
                answer["output"] = api.exec_start(exec_id)
                answer["code"] = api.exec_inspect(exec_id).get("ExitCode")
            except Exception as exc:  # noqa: BLE001 - any failure of the engine's answer is the caller's -1
                answer["error"] = str(exc)[:200]

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(seconds)
        if thread.is_alive():
            self._stalled.add(name)
            return -1, f"it did not end within {seconds:g} s"
        if "error" in answer:
            return -1, str(answer["error"])
        code = answer.get("code")
        output = answer.get("output") or b""
        text = output.decode(errors="replace") if isinstance(output, bytes) else str(output)
        return (code if isinstance(code, int) else -1), text[-2000:]

    def cpu_percent(self, name: str) -> float | None:
        """The container's CPU use as a percentage of its limit (or of the host), from one stats read."""
        from docker.errors import APIError, NotFound

        try:
            container = self.client.containers.get(name)
            stats = container.stats(stream=False)
        except (NotFound, APIError):
            return None
        cpu, pre = stats.get("cpu_stats") or {}, stats.get("precpu_stats") or {}
        try:
            used = cpu["cpu_usage"]["total_usage"] - pre["cpu_usage"]["total_usage"]
            system = cpu["system_cpu_usage"] - pre["system_cpu_usage"]
        except (KeyError, TypeError):
            return None
        online = cpu.get("online_cpus") or os.cpu_count() or 1
        if system <= 0:
            return None
        limit = (container.attrs.get("HostConfig", {}).get("NanoCpus") or 0) / 1e9 or online
        return 100.0 * used / system * online / limit

    def remove_labelled(self, label: str, value: str) -> None:
        """Remove every container labelled `label=value`, running or not (what a killed run left)."""
        from docker.errors import APIError, NotFound

        try:
            stale = self.client.containers.list(all=True, filters={"label": f"{label}={value}"})
        except APIError:
            stale = []
        for container in stale:
            with contextlib.suppress(APIError, NotFound):
                container.remove(force=True)

    def sweep_orphans(self) -> int:
        """Remove script containers (smoke test, `lock`, the base's pins) whose imgbuild process is gone: a
        SIGKILL leaves one behind, and with it whatever it was given. Returns how many."""
        from docker.errors import APIError, NotFound

        from imgbuild.hostio.host import token_state

        removed = 0
        with contextlib.suppress(APIError):
            for container in self.client.containers.list(all=True, filters={"label": Label.STARTED_BY}):
                # a process of another PID namespace (a CI runner sharing this engine) is not ours to judge
                if token_state(str((container.labels or {}).get(Label.STARTED_BY, ""))) == "gone":
                    with contextlib.suppress(APIError, NotFound):
                        container.remove(force=True)
                        removed += 1
        return removed

    def run_script(
        self,
        image: str,
        probe: Probe,
        args: list[str],
        env: dict[str, str],
        *,
        stdin: bytes | None = None,
        gpus: list[str] | None,
        timeout: int = 1800,
        ipc: str | None = None,
        shm_size: str | None = None,
        as_user: ContainerUser | None,
        cache: str | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> tuple[int, str, str]:
        """Run `probe`'s Python script inside `image` (copied in, so remote engines work too), as the image's user;
        `as_user` (a user imgbuild acts for through sudo): as them instead, with no new privileges, no
        capabilities, a private IPC namespace and their runs' caps, labelled theirs.

        `gpus`: None for no GPU, [] for all of them, else the GPUs' UUIDs. Returns (exit code, output, note);
        `note` says why GPUs were asked for but not given. The container is labelled with the image it
        tests and the process that runs it, removed on every way out, and removed by the next run of a script
        if this process is killed. `stdin` (a secret: index credentials) reaches the script on its standard
        input, `<length>\\n<bytes>`, never a file of the container or its config, and the container has a
        tmpfs at /run/imgbuild for what the script must write of it. `cache`: a named volume of the engine's, mounted
        at /var/cache/imgbuild (created on first use; the caller's own, kept between runs). `on_line`: called with
        each line of output as it comes (from a thread of its own), for a live progress line."""
        import requests
        from docker.errors import APIError
        from docker.types import DeviceRequest

        info = self.images.image(image)
        entrypoint = (info.config.get("Entrypoint") if info else None) or []
        keep_entrypoint = not entrypoint or any("nvidia_entrypoint" in part for part in entrypoint)
        command = ["python3", f"{SCRIPT_FOLDER}/{SCRIPT_NAME}", *args]
        env = probe.environment(env)  # the script's marker: the one way a probe learns it
        self.sweep_orphans()
        kwargs = script_container(image, script_env(env, gpus), stdin is not None, ipc, shm_size, as_user, cache, gpus)
        if not keep_entrypoint:
            kwargs["entrypoint"] = command[:1]
            command = command[1:]
        payload = probe.tar()

        def prepared(device_requests: list[Any] | None) -> Any:
            """A created container with the script copied in; removed again if the copy fails."""
            container = self.client.containers.create(image, command, device_requests=device_requests, **kwargs)
            try:
                container.put_archive(SCRIPT_FOLDER, payload)
            except BaseException:
                with contextlib.suppress(APIError):
                    container.remove(force=True)
                raise
            return container

        note = ""
        gpu_requests = None
        if gpus is not None:
            chosen = {"device_ids": list(gpus)} if gpus else {"count": -1}
            gpu_requests = [DeviceRequest(capabilities=[["gpu"]], **chosen)]
        container = prepared(gpu_requests)
        try:
            try:
                start_fed(container, stdin)
            except APIError as exc:
                if not gpu_requests:
                    raise
                container.remove(force=True)
                container = None
                why = str(exc.explanation)[:200]
                container, note = start_otherwise(prepared, list(gpus or []), stdin, env, kwargs, why)
            follower = follow_lines(container, on_line) if on_line is not None else None
            try:
                code = container.wait(timeout=timeout)["StatusCode"]
            except requests.RequestException:  # the SDK's read timeout: the script ran past `timeout`
                container.kill()
                raise ImgbuildError(f"the {probe.name} script in {image} ran past {timeout} s") from None
            if follower is not None:
                follower.join(timeout=5)
            out = container.logs(stdout=True, stderr=False).decode(errors="replace")
            err = container.logs(stdout=False, stderr=True).decode(errors="replace")
            return code, out + ("\n" + err if err else ""), note
        finally:
            if container is not None:
                with contextlib.suppress(APIError):
                    container.remove(force=True)


def _number(text: Any) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _positive(value: Any) -> int | None:
    """An engine's limit (bytes, a count); None for its "none" (0, -1, absent)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _unprivileged_user(attrs: dict[str, Any]) -> str:
    """The user a container runs as, where it runs without privileges: not privileged, every capability dropped
    and none added, no new privileges (no setuid binary in it makes root); "" for any other container."""
    host, config = attrs.get("HostConfig") or {}, attrs.get("Config") or {}
    dropped = {str(c).upper().removeprefix("CAP_") for c in host.get("CapDrop") or []}
    opts = {str(o).replace("=", ":") for o in host.get("SecurityOpt") or []}
    plain = not host.get("Privileged") and not host.get("CapAdd") and "ALL" in dropped
    if plain and opts & {"no-new-privileges", "no-new-privileges:true"}:
        return str(config.get("User") or "")
    return ""


def _host_ports(bindings: Any) -> list[int]:
    """The host ports a container publishes (HostConfig.PortBindings)."""
    ports = []
    for binds in (bindings or {}).values() if isinstance(bindings, dict) else ():
        for bind in binds or []:
            port = str((bind or {}).get("HostPort") or "")
            if port.isdigit():
                ports.append(int(port))
    return ports
