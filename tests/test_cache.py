"""One JSON cache for the four that were written four ways (base answers, base pins, tag lists and
details, a mirror target's known blobs). What may sit in a cache folder is untrusted: each way an entry can be
wrong reads as a miss, never as an answer, a hang or a crash."""

from __future__ import annotations

import json
import os
import time

import pytest

from imgbuild.hostio.cache import JsonCache


def test_an_entry_is_read_back_with_its_age(tmp_path):
    cache = JsonCache(tmp_path / "c", ttl=60)
    cache.put("nvcr.io/nvidia/pytorch:25.10-py3", {"digest": "sha256:" + "a" * 64})
    data, age = cache.get_with_age("nvcr.io/nvidia/pytorch:25.10-py3")
    assert data == {"digest": "sha256:" + "a" * 64} and 0 <= age < 5
    assert cache.get("another") is None
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.endswith(".tmp")]  # written whole, then renamed


def _stale(path):
    old = time.time() - 3600
    os.utime(path, (old, old))


def _link(path):
    path.unlink()
    path.symlink_to("/etc/hostname")


def _fifo(path):
    path.unlink()
    os.mkfifo(path)


def _big(path):
    path.write_text(json.dumps({"key": "k", "value": "x" * 5000}))


def _other_key(path):
    path.write_text(json.dumps({"key": "someone else's", "value": {"digest": "forged"}}))


def _future(path):
    ahead = time.time() + 5 * 365 * 86400
    os.utime(path, (ahead, ahead))


@pytest.mark.parametrize(
    "why, spoil",
    [
        ("older than its ttl", _stale),
        ("dated five years ahead (fresh forever)", _future),
        ("a link to another file", _link),
        ("a FIFO (would block a reader)", _fifo),
        ("over the size cap", _big),
        ("written for another key", _other_key),
        ("not JSON", lambda path: path.write_text("{not json")),
        ("JSON but not a record", lambda path: path.write_text("[1, 2]")),
        ("a record without a value", lambda path: path.write_text(json.dumps({"key": "k"}))),
        ("a folder", lambda path: (path.unlink(), path.mkdir())),
    ],
)
def test_a_spoiled_entry_reads_as_a_miss(tmp_path, why, spoil):
    cache = JsonCache(tmp_path / "c", ttl=60, max_bytes=4096)
    cache.put("k", {"v": 1})
    assert cache.get("k") == {"v": 1}
    spoil(cache.path("k"))
    assert cache.get("k") is None, why


@pytest.mark.parametrize("ttl", [60, None])
def test_another_users_entry_is_a_miss_and_a_future_one_too_even_without_a_ttl(tmp_path, monkeypatch, ttl):
    """In a shared (1777) cache_dir a co-user planted the answer for a base with another release's
    digest; root's render pinned it. An entry is believed only from the user reading it."""
    import imgbuild.hostio.cache as cache_module

    cache = JsonCache(tmp_path / "c", ttl=ttl)
    cache.put("nvcr.io/nvidia/pytorch:24.05-py3", {"digest": "sha256:" + "a" * 64})
    assert cache.get("nvcr.io/nvidia/pytorch:24.05-py3") is not None
    monkeypatch.setattr(cache_module.os, "geteuid", lambda: os.getuid() + 4242)  # read by another user
    assert cache.get("nvcr.io/nvidia/pytorch:24.05-py3") is None
    monkeypatch.undo()
    _future(cache.path("nvcr.io/nvidia/pytorch:24.05-py3"))
    assert cache.get("nvcr.io/nvidia/pytorch:24.05-py3") is None


def test_a_cache_that_cannot_be_written_costs_nothing_but_speed(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    JsonCache(tmp_path / "file" / "c").put("k", 1)  # no error
    off = JsonCache(tmp_path / "off", ttl=0)
    off.put("k", 1)
    assert off.get("k") is None and not (tmp_path / "off").exists()
    small = JsonCache(tmp_path / "small", max_bytes=64)
    small.put("k", "x" * 100)  # too big to be read back: not kept
    assert small.get("k") is None and not small.path("k").exists()


def test_a_key_never_names_a_path(tmp_path):
    cache = JsonCache(tmp_path / "c")
    for key in ("../../etc/passwd", "/abs", "a/b:c", "\x00", "é" * 300):
        cache.put(key, key)
        assert cache.path(key).parent == tmp_path / "c" and cache.get(key) == key
