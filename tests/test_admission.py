"""imgbuild.servers.admission: which images a site admits to run (`run.signed_only`), judged by what a registry
is, not by how its name is spelled."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "image, prefix, under",
    [
        ("localhost:5000/lab/x:1", "127.0.0.1:5000/lab", True),  # the same registry, another name
        ("127.0.0.1:5000/lab/x:1", "localhost:5000/lab", True),
        ("LOCALHOST:5000/lab/x:1", "127.0.0.1:5000/lab/", True),
        ("index.docker.io/lab/x:1", "docker.io/lab", True),
        ("lab/x:1", "docker.io/lab", True),
        ("registry.example.org:443/lab/x:1", "registry.example.org/lab", True),
        ("127.0.0.1:5001/lab/x:1", "127.0.0.1:5000/lab", False),  # another port: another registry
        ("127.0.0.1:5000/labx/y:1", "127.0.0.1:5000/lab", False),  # a prefix of a name is not a folder
        ("127.0.0.1:5000/other/x:1", "127.0.0.1:5000/lab", False),
        ("127.0.0.1:5000/anything:1", "127.0.0.1:5000", True),
    ],
)
def test_signed_only_compares_registries_by_what_they_are(image, prefix, under):
    from imgbuild import imageref
    from imgbuild.servers.admission import under_prefix

    assert under_prefix(imageref.parse(image), prefix) is under
