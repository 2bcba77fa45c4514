"""A lock every imgbuild on one engine sees, wherever it runs: CI runners in containers that share the host's
engine socket share no file system, no PID namespace and no lock file, only the engine. A container name is
unique in an engine, and its creation is atomic (Docker and Podman answer 409 to a second): the lease is a
container created (never started) under a name the key gives, labelled with its holder and how long it holds.

A holder the engine can judge gone frees the lease at once: a process of this PID namespace that ended, or a CI
runner container (its host name is its container id) the engine no longer runs. Any other holder holds it until
its time is up; the waiting message names the container, so an admin can remove it sooner.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from imgbuild.errors import EnvironmentProblem
from imgbuild.facts import Label

LEASE_PREFIX = "imgbuild-lease-"
#: How often a waiting run asks again, in seconds.
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its labels say: `token` (host.engine_token), `host` (the holder's host name) and
    `until` (seconds since the epoch)."""

    token: str
    host: str
    until: float

    def labels(self, key: str) -> dict[str, str]:
        return {Label.LEASE_OF: key[:200], Label.STARTED_BY: self.token, Label.LEASE_HOST: self.host,
                Label.LEASE_UNTIL: str(int(self.until))}  # fmt: skip

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> Holder:
        """A hostile or foreign label holds nothing past its time: an `until` that is not ASCII digits is 0."""
        until = str(labels.get(Label.LEASE_UNTIL, ""))
        seconds = float(until) if until.isascii() and until.isdigit() and len(until) <= 12 else 0.0
        return cls(str(labels.get(Label.STARTED_BY, ""))[:200], str(labels.get(Label.LEASE_HOST, ""))[:64], seconds)


def lease_name(key: str) -> str:
    return LEASE_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:24]


def holder_gone(holder: Holder, now: float, token_state: Callable[[str], str], running: Callable[[str], bool]) -> bool:
    """Past its time; or a process of this namespace that ended; or a container's host name (12 hex digits, as
    Docker and Podman name a container's host) of a container this engine no longer runs."""
    if holder.until <= now:
        return True
    state = token_state(holder.token)
    if state == "gone":
        return True
    return state == "elsewhere" and bool(re.fullmatch(r"[0-9a-f]{12}", holder.host)) and not running(holder.host)


class LeaseStore(Protocol):
    """What a lease asks of the engine (`engine.leases`)."""

    def claim(self, name: str, image: str, labels: dict[str, str]) -> bool: ...  # False: the name is taken
    def holder_labels(self, name: str) -> dict[str, str] | None: ...  # None: no such container
    def running_prefix(self, prefix: str) -> bool: ...  # a running container's id starts with it
    def remove(self, name: str) -> None: ...


@contextmanager
def lease(
    store: LeaseStore,
    key: str,
    image: str,
    seconds: float,
    waiting: Callable[[str], None],
    *,
    wait_seconds: float = 3600,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[None]:
    """Hold `key` on this engine for at most `seconds` while the block runs; wait (saying so once) while another
    holds it, at most `wait_seconds` (then exit 3). `image`: what the lease's container is created from (an image
    the caller has; it never runs)."""
    from socket import gethostname

    from imgbuild.hostio.host import engine_token, token_state

    name = lease_name(key)
    deadline, told = clock() + wait_seconds, False
    while True:
        mine = Holder(engine_token(), gethostname()[:64], clock() + seconds)
        if store.claim(name, image, mine.labels(key)):
            break
        labels = store.holder_labels(name)
        if labels is not None and holder_gone(Holder.from_labels(labels), clock(), token_state, store.running_prefix):
            store.remove(name)
            continue
        if clock() > deadline:
            raise EnvironmentProblem(
                f"{key}: another run held it for over {int(wait_seconds)} s (the engine's container {name}; "
                "remove it if that run is gone)"
            )
        if not told:
            waiting(f"waiting for another run on this engine to finish with it (its lock: container {name})")
            told = True
        sleep(POLL_SECONDS)
    try:
        yield
    finally:
        store.remove(name)


class DockerLeases:
    """Leases as containers of a Docker engine, or of Podman's Docker-compatible API."""

    def __init__(self, client: Any):
        self.client = client

    def claim(self, name: str, image: str, labels: dict[str, str]) -> bool:
        from docker.errors import APIError

        # a label the image carries must not stand for the lease's own (every key imgbuild reads, set)
        wanted = {**dict.fromkeys(Label.CONTAINER_KEYS, ""), **labels}
        try:
            self.client.containers.create(image, name=name, labels=wanted, command=["true"], entrypoint=[])
        except APIError as exc:
            if exc.status_code == 409 or "already in use" in str(exc):
                return False
            raise EnvironmentProblem(f"the engine refused the lock {name}: {str(exc.explanation)[:200]}") from None
        return True

    def holder_labels(self, name: str) -> dict[str, str] | None:
        from docker.errors import APIError, NotFound

        try:
            return dict(self.client.containers.get(name).labels or {})
        except NotFound:
            return None
        except APIError:
            return {}  # unreadable: held until its time, which an empty label set has not (until 0)

    def running_prefix(self, prefix: str) -> bool:
        from docker.errors import APIError

        try:
            return bool(self.client.containers.list(filters={"id": prefix, "status": "running"}))
        except APIError:
            return True  # cannot tell: the holder stands until its time

    def remove(self, name: str) -> None:
        from docker.errors import APIError, NotFound

        with contextlib.suppress(NotFound, APIError):  # gone already, or another run removed a stale one
            self.client.containers.get(name).remove(force=True)
