"""`imgbuild.lock.json`, the context record, has one owner (build.record): written by render, read back
by `rebuild --check` from a repository, where it is untrusted. Each way a committed record can be wrong is refused
as "not a record" (render it again), never followed, never a hang, never a crash."""

from __future__ import annotations

import json
import os

import pytest

from imgbuild.pipeline.record import MAX_BYTES, Record
from imgbuild.pipeline.render import render
from tests.support import plan_for


def _written(tmp_path) -> dict:
    (tmp_path / ".git").mkdir(exist_ok=True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: [einops]\n')
    return json.loads(render(plan_for(recipe)).text("imgbuild.lock.json"))


def test_what_render_writes_reads_back_the_same(tmp_path):
    data = _written(tmp_path)
    path = tmp_path / "imgbuild.lock.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    record = Record.read(path)
    assert record.text() == path.read_text()  # byte for byte: committed contexts stay current
    assert record.namespace == data["image"].split("/")[0] and record.base.ref == data["base"]["ref"]


def _shape(change):
    def spoil(path, data):
        change(data)
        path.write_text(json.dumps(data))

    return spoil


@pytest.mark.parametrize(
    "why, spoil",
    [
        ("a link to another file", lambda path, data: path.symlink_to("/etc/hostname")),
        ("a FIFO", lambda path, data: os.mkfifo(path)),
        ("over the size cap", lambda path, data: path.write_text(" " * (MAX_BYTES + 1) + "{}")),
        ("not JSON", lambda path, data: path.write_text("{")),
        ("not UTF-8", lambda path, data: path.write_bytes(b"\xff\xfe{}")),
        ("a list", lambda path, data: path.write_text("[]")),
        ("no base", _shape(lambda d: d.pop("base"))),
        ("a base that is text", _shape(lambda d: d.update(base="nvcr.io/nvidia/pytorch:25.10-py3"))),
        ("a base ref that is a number", _shape(lambda d: d["base"].update(ref=5))),
        ("a base ref that is no reference", _shape(lambda d: d["base"].update(ref="../../etc"))),
        ("an image that is no reference", _shape(lambda d: d.update(image="-rf /"))),
        ("no image", _shape(lambda d: d.pop("image"))),
    ],
)
def test_a_committed_record_that_is_not_one_is_refused(tmp_path, why, spoil):
    data = _written(tmp_path)
    path = tmp_path / "imgbuild.lock.json"
    spoil(path, data)
    with pytest.raises(ValueError, match="not a record"):
        Record.read(path)


def test_odd_field_types_read_as_empty_not_as_a_crash(tmp_path):
    data = _written(tmp_path)
    data.update(content_hash=5, extends=[1, "a.yaml"], backend="kaniko", protected=None)
    data["base"].update(cuda=["x"], digest={"a": 1})
    path = tmp_path / "imgbuild.lock.json"
    path.write_text(json.dumps(data))
    record = Record.read(path)
    assert record.content_hash == "" and record.extends == ("a.yaml",) and record.backend == "buildkit"
    assert record.base.cuda == "" and record.base.digest == "" and record.protected == ()
