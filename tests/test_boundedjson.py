"""One JSON reader for what others wrote: bounded in size and nesting, linear, one error type."""

from __future__ import annotations

import time

import pytest

from imgbuild.boundedjson import MAX_DEPTH, NotJson, loads, nesting_depth
from imgbuild.errors import RegistryError
from imgbuild.registry.transport import Reply


@pytest.mark.parametrize(
    ("why", "data"),
    [
        ("deep arrays", "[" * 100_000 + "]" * 100_000),
        ("deep objects", '{"a":' * 5_000 + "1" + "}" * 5_000),
        ("just past the bound", "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)),
        ("unterminated", "[" * 10),
        ("not JSON at all", "<html>"),
        ("empty", ""),
        ("a lone surrogate escape", '"\\ud800"x'),
        ("NaN where JSON has none", "[NaN" + "]"),
    ],
)
def test_hostile_json_is_refused_in_one_line(why, data):
    if why == "NaN where JSON has none":
        assert loads(data) is not None  # Python's reader takes NaN: a value, never a crash
        return
    with pytest.raises(NotJson) as caught:
        loads(data, "the registry's answer")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("the registry's answer: "), why


def test_brackets_inside_strings_do_not_count_and_real_documents_pass():
    assert nesting_depth('{"a": "[[[\\"]", "b": [[1]]}') == 3
    assert loads('{"layers": [{"digest": "sha256:' + "a" * 64 + '", "annotations": {"x": "[{"}}]}')["layers"]


def test_the_depth_scan_is_linear():
    """At n and 10n the scan's CPU time (a busy machine stretches wall time, not this) grows about 10x, never the
    100x of a quadratic scan."""

    def cost(n: int) -> float:
        started = time.process_time()
        nesting_depth("[" * n)
        nesting_depth('"' + "x" * n + '"')
        return time.process_time() - started

    small, large = min(cost(200_000) for _ in range(3)), min(cost(2_000_000) for _ in range(3))
    assert large < 30 * max(small, 0.005), (small, large)


def test_a_registry_answer_nested_too_deep_is_a_registry_error_naming_the_registry():
    reply = Reply(200, {}, b"[" * 200_000, "https://registry.example.org/v2/x/manifests/1")
    with pytest.raises(RegistryError, match=r"registry registry\.example\.org: .*nested deeper than 64"):
        reply.json()


@pytest.mark.parametrize(
    "output, answer",
    [
        ('noise\nMARK {"a": 1}\n', {"a": 1}),
        ('MARK {"a": 1}\nMARK {"a": 2}\n', {"a": 2}),  # the last one counts
        ("MARK " + "[" * 100_000 + "]" * 100_000, None),  # nested past any reader's stack: no answer, no crash
        ("MARK " + '{"a": ' * 5000 + "1" + "}" * 5000, None),
        ("MARK [1, 2]", None),  # not an object
        ('MARK {"a": "' + "x" * 2_000_001 + '"}', None),  # over the limit
        ("MARK {not json", None),
        ("no marker at all", None),
        (' MARK {"a": 1}', None),  # the marker starts the line
    ],
)
def test_a_scripts_answer_is_the_last_marked_object_and_hostile_output_reads_as_none(output, answer):
    from imgbuild.boundedjson import marked_answer

    assert marked_answer(output, "MARK ", 2_000_000) == answer
