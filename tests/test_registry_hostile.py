"""A hostile or failing registry is a registry error with its code, never a crash: mirroring from one, a transport
error mid-body, a missing blob asked again, a tag in other scripts' digits never taken for a release."""

from __future__ import annotations

import json
import time

import pytest

INDEX = "application/vnd.oci.image.index.v1+json"


MANIFEST = "application/vnd.oci.image.manifest.v1+json"


DIGEST = "sha256:" + "a" * 64


class _Source:
    host = "hostile.example"

    def __init__(self, answer):
        self.answer = answer

    def manifest_raw(self, repo, reference):
        content, media_type = self.answer(reference)
        return content, media_type, DIGEST

    def download_blob(self, repo, digest, size, path):
        raise AssertionError("a malformed blob must be refused before a byte is fetched")


class _Target:
    def content_digest(self, repo, reference):
        return None

    def has_blob(self, repo, digest):
        return False

    def put_manifest(self, *args):
        pass


def _nested(reference):
    return json.dumps({"mediaType": INDEX, "manifests": [{"digest": DIGEST}]}).encode(), INDEX


def test_a_registry_tag_in_other_digits_is_never_a_release():
    from imgbuild.ngc import matching, parse_tag

    assert parse_tag("٩٩.٩٩-py3") is None and parse_tag("２６.０１-py3") is None
    assert matching("pytorch", "latest", ["٩٩.٩٩-py3", "２６.０１-py3", "24.05-py3"]) == ["24.05-py3"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "answer",
    [
        lambda r: (b'["manifests", 1]', MANIFEST),
        lambda r: (b"not json", MANIFEST),
        lambda r: (json.dumps({"config": "x", "layers": ["y"]}).encode(), MANIFEST),
        lambda r: (json.dumps({"config": {"digest": DIGEST, "size": 1}, "layers": "y"}).encode(), MANIFEST),
        lambda r: (json.dumps({"layers": [{"digest": DIGEST, "size": "1TB"}]}).encode(), MANIFEST),
        lambda r: (json.dumps({"layers": [{"digest": DIGEST, "size": 2**50}]}).encode(), MANIFEST),
        lambda r: (json.dumps({"layers": [{"digest": DIGEST, "size": True}]}).encode(), MANIFEST),
        lambda r: (json.dumps({"layers": [{"digest": DIGEST, "size": -1}]}).encode(), MANIFEST),
        lambda r: (json.dumps({"layers": [{"digest": "sha256:../../x", "size": 1}]}).encode(), MANIFEST),
        lambda r: (json.dumps({"mediaType": INDEX, "manifests": "x"}).encode(), INDEX),
        lambda r: (json.dumps({"mediaType": INDEX, "manifests": [5]}).encode(), INDEX),
        _nested,  # an index of indexes, endlessly
        lambda r: (b"[" * 100_000 + b"]" * 100_000, MANIFEST),
    ],
    ids=[
        "list",
        "not-json",
        "strings",
        "layers-string",
        "size-text",
        "size-1PiB",
        "size-bool",
        "size-negative",
        "digest-path",
        "manifests-string",
        "manifests-number",
        "endless-index",
        "deep-json",
    ],
)
def test_a_hostile_source_registry_is_a_registry_error_never_a_crash(answer, tmp_path):
    """A list, strings, `size: "1TB"` crashed mirror; a 1 TB claimed layer streamed 2.7 GB to disk;
    an index nested 1,500 deep recursed for 55 s."""
    from imgbuild.errors import RegistryError
    from imgbuild.registry.mirror import TagCopy, _Copier

    copier = _Copier(_Source(answer), _Target(), "nvidia/pytorch", tmp_path, lambda s: None)
    start = time.monotonic()
    with pytest.raises(RegistryError):
        copier.manifest("24.05-py3", TagCopy("24.05-py3"), "24.05-py3")
    assert time.monotonic() - start < 5


def test_a_killed_mirrors_partial_blob_is_swept(tmp_path):
    import os
    import subprocess

    from imgbuild.hostio.host import process_start
    from imgbuild.registry.mirror import sweep_partial_blobs

    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"blob-{dead.pid}.12345-abc").write_bytes(b"x" * 1024)
    mine = tmp_path / f"blob-{os.getpid()}.{process_start(os.getpid())}-def"
    mine.write_bytes(b"y")
    (tmp_path / "blob-garbage").write_bytes(b"z")
    assert sweep_partial_blobs(tmp_path) == 2
    assert [p.name for p in tmp_path.iterdir()] == [mine.name]


@pytest.mark.parametrize("error", ["read-timeout", "protocol", "incomplete-read"])
def test_a_transport_error_while_reading_a_body_is_an_environment_error(error):
    """Found by CI: a registry stalling mid-body raised urllib3's ReadTimeoutError unwrapped (exit 1,
    "unexpected"); it is an environment error (exit 3), retried within the deadline: a stall told as one, a
    broken transport as unreachable."""
    import http.client

    import urllib3.exceptions

    from imgbuild.errors import RegistryUnavailable
    from imgbuild.registry.client import RegistryClient

    raised = {
        "read-timeout": urllib3.exceptions.ReadTimeoutError(None, "/v2/", "Read timed out."),
        "protocol": urllib3.exceptions.ProtocolError("Connection broken"),
        "incomplete-read": http.client.IncompleteRead(b"x", 10),
    }[error]

    class Session:
        def request(self, *args, **kwargs):
            raise raised

    client = RegistryClient("127.0.0.1:9", insecure=True, retries=0, session=Session(), command_seconds=5)
    said = "did not answer within" if error == "read-timeout" else "is unreachable"
    with pytest.raises(RegistryUnavailable, match=said):
        client.tags("x/y")


def test_a_target_missing_a_blob_is_asked_again_then_named(monkeypatch):
    """Two mirrors into one target: one exited 3 with `HTTP 400 for manifest`, which reads as
    "unreachable"; the target's own code now says what it refused, and the copy asks again before giving up."""
    from imgbuild.errors import RegistryError
    from imgbuild.registry.mirror import TagCopy, _Copier

    class Busy(_Target):
        host = "mirror.example"
        tries = 0

        def has_blob(self, repo, digest):
            return True

        def put_manifest(self, *args):
            Busy.tries += 1
            if Busy.tries < 3:
                raise RegistryError(
                    "registry mirror.example: refused manifest t in r (HTTP 400: MANIFEST_BLOB_UNKNOWN)"
                )

    monkeypatch.setattr("imgbuild.registry.mirror.time.sleep", lambda s: None)
    blobless = lambda r: (json.dumps({"config": {"digest": DIGEST, "size": 2}, "layers": []}).encode(), MANIFEST)  # noqa: E731
    _Copier(_Source(blobless), Busy(), "nvidia/pytorch", None, lambda s: None).manifest("t", TagCopy("t"), "t")
    assert Busy.tries == 3
    Busy.tries = -10
    with pytest.raises(RegistryError, match="is another mirror copying into mirror.example/nvidia/pytorch"):
        _Copier(_Source(blobless), Busy(), "nvidia/pytorch", None, lambda s: None).manifest("t", TagCopy("t"), "t")


def test_a_registry_that_refuses_says_its_code_and_is_not_called_unreachable():
    from imgbuild.errors import RegistryError, RegistryUnavailable
    from imgbuild.registry.client import RegistryClient
    from imgbuild.registry.transport import Reply

    client = RegistryClient("r.example", insecure=True)
    body = json.dumps({"errors": [{"code": "MANIFEST_BLOB_UNKNOWN", "message": "blob unknown"}]}).encode()
    with pytest.raises(RegistryError, match=r"refused manifest t in x \(HTTP 400: MANIFEST_BLOB_UNKNOWN\)") as info:
        client._check(Reply(400, {}, body, "http://r.example/v2/x/manifests/t"), "manifest t", "x")
    assert not isinstance(info.value, RegistryUnavailable)
    with pytest.raises(RegistryUnavailable):
        client._check(Reply(503, {}, b"", "http://r.example/v2/"), "manifest t", "x")


def test_a_mirror_takes_no_heads_word_that_a_tag_is_already_copied(tmp_path):
    """The source's HEAD announces the digest the mirror already holds while its GET serves the tag's new image:
    the tag was called "present" and the site stayed on the old image. What a tag holds is the hash of what it
    serves: a header that disagrees is refused, and an honest source's new image is copied."""
    from imgbuild.config.settings import load_settings
    from imgbuild.errors import RegistryError
    from imgbuild.registry.mirror import MirrorRequest, mirror
    from tests.fake_registry import ServedRegistry

    source, target = ServedRegistry(), ServedRegistry()
    repo, tag = "nvidia/pytorch", "24.05-py3"
    config = b'{"config":{}}'
    config_digest = "sha256:" + __import__("hashlib").sha256(config).hexdigest()
    source.blobs[config_digest] = config

    def image(n: int) -> bytes:
        body = {"schemaVersion": 2, "mediaType": MANIFEST, "config": {"digest": config_digest, "size": len(config)},
                "layers": [], "annotations": {"n": str(n)}}  # fmt: skip
        return json.dumps(body).encode()

    old = target.put(repo, tag, image(1), MANIFEST)  # mirrored before
    new = source.put(repo, tag, image(2), MANIFEST)  # the source has moved on
    source.announce[(repo, tag)] = old
    settings = load_settings({"ngc_registry": source.host, "cache_dir": str(tmp_path / "cache")}, environ={})
    request = MirrorRequest(to=target.host, tags=(tag,))
    try:
        with pytest.raises(RegistryError, match=f"announced as {old} but serves {new}"):
            mirror(settings, request)
        assert target.tags[(repo, tag)] == old
        del source.announce[(repo, tag)]
        copied = mirror(settings, request)
    finally:
        source.close()
        target.close()
    assert [(c.status, c.digest) for c in copied] == [("copied", new)]
    assert target.tags[(repo, tag)] == new


@pytest.mark.parametrize("reference", ["sha256:" + "A" * 64, "sha512:" + "a" * 128, "../../lab/y/manifests/v1", "v1?x"])
def test_a_read_by_what_is_neither_a_tag_nor_a_sha256_digest_is_refused_before_any_request(reference):
    """A reference whose answer nothing could be checked against (another digest algorithm, a digest in capitals,
    a path) is never sent: the one door every manifest and blob read passes refuses it."""
    from imgbuild.errors import RegistryError
    from imgbuild.registry.client import RegistryClient

    client = RegistryClient("127.0.0.1:9", insecure=True, retries=0, timeout=1, command_seconds=2)
    for read in (client.manifest, client.manifest_raw, client.blob_json, client.blob_bytes, client.content_digest):
        with pytest.raises(RegistryError, match="neither a tag nor a sha256 digest"):
            read("lab/x", reference)
    assert client.requests_made == 0
