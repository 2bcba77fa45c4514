"""The engine-wide lease (engine.lease): runs sharing one engine (CI runners in containers on the host's socket) take
turns at a target's promotion, push and signing, and a holder the engine can judge gone never blocks anyone."""

from __future__ import annotations

import pytest

from imgbuild.engine.fake import FakeLeases
from imgbuild.engine.lease import Holder, holder_gone, lease, lease_name
from imgbuild.errors import EnvironmentProblem
from imgbuild.facts import Label
from imgbuild.hostio.host import engine_token, namespace_id, token_state

KEY = "registry.test:5000/lab/x:v1"
NOW = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW
        self.slept = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += 1


def held_by(store: FakeLeases, token: str, host: str = "runner", until: float = NOW + 600) -> None:
    store.held[lease_name(KEY)] = Holder(token, host, until).labels(KEY)


def take(store: FakeLeases, clock: Clock, said: list[str], wait_seconds: float = 60) -> None:
    with lease(store, KEY, "sha256:img", 300, said.append, wait_seconds=wait_seconds, clock=clock, sleep=clock.sleep):
        assert Label.LEASE_OF in store.held[lease_name(KEY)]


def test_a_free_lease_is_taken_and_given_back_even_when_the_block_fails():
    store, clock = FakeLeases([]), Clock()
    take(store, clock, [])
    assert store.held == {} and store.calls == [f"lease {lease_name(KEY)}", f"release {lease_name(KEY)}"]
    with pytest.raises(RuntimeError), lease(store, KEY, "sha256:img", 300, print, clock=clock):
        raise RuntimeError("push failed")
    assert store.held == {}


def test_a_live_holder_is_waited_for_and_the_wait_is_said_once():
    store, clock, said = FakeLeases([]), Clock(), []
    held_by(store, engine_token())  # this very process: alive

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.slept == 4:
            store.held.clear()  # the other run is done

    with lease(store, KEY, "sha256:img", 300, said.append, clock=clock, sleep=sleep):
        pass
    assert clock.slept == 4 and len(said) == 1 and lease_name(KEY) in said[0]


def test_a_holder_that_never_lets_go_ends_the_wait_with_exit_3_naming_its_container():
    store, clock = FakeLeases([]), Clock()
    held_by(store, engine_token(), until=NOW + 10**6)
    with pytest.raises(EnvironmentProblem, match=lease_name(KEY)) as caught:
        take(store, clock, [], wait_seconds=30)
    assert caught.value.exit_code == 3


GONE = f"4000000:1:{namespace_id()}"  # no such PID here
ELSEWHERE = "1:2:5x00000000"  # another PID namespace (a CI runner's container)

HOLDERS = [
    # (what holds it, token, host, until, running container ids, taken at once)
    ("a live run of this namespace", engine_token(), "h", NOW + 600, set(), False),
    ("a killed run of this namespace", GONE, "h", NOW + 600, set(), True),
    ("any run past its time", engine_token(), "h", NOW - 1, set(), True),
    ("a runner container the engine still runs", ELSEWHERE, "0123456789ab", NOW + 600, {"0123456789abcdef"}, False),
    ("a runner container the engine no longer runs", ELSEWHERE, "0123456789ab", NOW + 600, set(), True),
    ("another host (its name no container id)", ELSEWHERE, "ci-host-7", NOW + 600, set(), False),
    ("a label with no token (unknown: held until its time)", "", "0123456789ab", NOW + 600, set(), False),
    ("a garbage token", "x:y:z:w", "h", NOW + 600, set(), False),
]


@pytest.mark.parametrize("what, token, host, until, running, taken", HOLDERS, ids=[h[0] for h in HOLDERS])
def test_whether_a_holder_is_gone(what, token, host, until, running, taken):
    gone = holder_gone(Holder(token, host, until), NOW, token_state, lambda p: any(i.startswith(p) for i in running))
    assert gone is taken


HOSTILE_UNTIL = ["", "9" * 40, "1e30", "-5", "١٢٣", "12.5", None, "nan"]


@pytest.mark.parametrize("until", HOSTILE_UNTIL)
def test_a_hostile_until_label_holds_nothing(until):
    labels = {Label.STARTED_BY: engine_token(), Label.LEASE_HOST: "h", Label.LEASE_UNTIL: until}
    assert Holder.from_labels(labels).until == 0.0
    assert holder_gone(Holder.from_labels(labels), NOW, token_state, lambda p: True)


@pytest.mark.parametrize(
    "token, state",
    [
        (engine_token(), "alive"),
        (GONE, "gone"),
        (ELSEWHERE, "elsewhere"),
        ("", "unknown"),  # `imgbuild run` sets the label empty: never judged gone (its jobs were swept before)
        ("1:2:3:4", "unknown"),
        ("١:٢", "unknown"),  # digits, but not ASCII
        ("12:", "unknown"),
    ],
    ids=["this-process", "gone", "elsewhere", "empty", "four-parts", "non-ascii-digits", "no-start-time"],
)
def test_a_token_is_judged_only_where_its_process_can_be_seen(token, state):
    assert token_state(token) == state
