"""`imgbuild bump` edits a recipe as it is written: line endings, BOM, anchors and quotes kept; never through a link."""

from __future__ import annotations

import pytest

from imgbuild.errors import UsageError

FOLLOWING = 'name: b\nbase:\n  framework: pytorch\n  tag: {tag}\n  follow: "24.*"\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (FOLLOWING.format(tag='"24.01"').replace("\n", "\r\n"), FOLLOWING.format(tag='"24.05"').replace("\n", "\r\n")),
        (
            "\ufeff" + 'base: {framework: pytorch, tag: "24.01", follow: "24.*"}\nname: b\n',
            "\ufeff" + 'base: {framework: pytorch, tag: "24.05", follow: "24.*"}\nname: b\n',
        ),
        (
            FOLLOWING.format(tag='&t "24.01"') + "labels: {was: *t}\n",
            FOLLOWING.format(tag='&t "24.05"') + "labels: {was: *t}\n",
        ),
        (FOLLOWING.format(tag="'24.01'") + "# a comment\n", FOLLOWING.format(tag="'24.05'") + "# a comment\n"),
    ],
    ids=["crlf", "bom", "anchor", "single-quotes"],
)
def test_bump_keeps_line_endings_bom_anchors_and_quotes(text, expected, tmp_path):
    """A CRLF recipe came back LF (every line changed in review); a BOM or an anchor gave exit 2."""
    from imgbuild.ci.bump import bump

    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(text.encode())
    moved = bump([recipe], tags_for=lambda fw: ["24.01-py3", "24.05-py3"])
    assert moved[0].changed and recipe.read_bytes().decode() == expected


def test_bump_never_edits_through_a_link_or_an_alias(tmp_path):
    from imgbuild.ci.bump import bump

    outside = tmp_path / "outside.yaml"
    outside.write_text(FOLLOWING.format(tag='"24.01"'))
    (tmp_path / "recipes").mkdir()
    link = tmp_path / "recipes" / "link.yaml"
    link.symlink_to(outside)
    with pytest.raises(UsageError, match="never through a link"):
        bump([link], tags_for=lambda fw: ["24.05-py3"])
    assert outside.read_text() == FOLLOWING.format(tag='"24.01"')
    aliased = tmp_path / "aliased.yaml"
    aliased.write_text('x: &t "24.01"\nname: b\nbase:\n  framework: pytorch\n  tag: *t\n  follow: "24.*"\n')
    with pytest.raises(UsageError, match="a YAML alias"):
        bump([aliased], tags_for=lambda fw: ["24.05-py3"])
