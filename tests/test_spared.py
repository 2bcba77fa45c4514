"""What a smoke test may spare (imgbuild.pipeline.spared): only what imported before with the same installed files,
in the same system scope, from a report of the image promoted now or a registry record signed by a trusted key.

The attacks (a wheel swapped at the same version; an apt package dropped under unchanged Python packages; a
co-user rewriting the unsigned `.smoke` record; a deep record; a record of 20,000 entries; the image's own ENV) are
rows here; the payload's half is in test_packages.py.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from imgbuild.config.settings import load_settings
from imgbuild.engine.fake import FakeEngine
from imgbuild.pipeline import build as pipeline
from imgbuild.pipeline import spared
from imgbuild.pipeline.build import BuildJob
from imgbuild.pipeline.plan import make_plan
from imgbuild.recipe import load_recipe
from imgbuild.supply import attest
from tests.fake_registry import MemoryRegistry
from tests.support import demo_recipe, fake_inspect

TARGET = "alice/demo:v1"
FP = "a" * 64
FP2 = "b" * 64
DIGEST = "sha256:" + "1" * 64


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    return demo_recipe(tmp_path, "apt: [libmagic1]\n")


def _plan(recipe: Path):
    settings = load_settings({"user": "alice", "ngc_registry": "registry.test:5000"})
    return settings, make_plan(load_recipe(recipe), settings, fake_inspect)


def _build(recipe: Path, engine: FakeEngine, tmp_path: Path):
    settings, plan = _plan(recipe)
    return pipeline.build_platforms(BuildJob(plan.loaded, out=tmp_path / "ctx", planned=plan), settings, engine).own()


def _known(engine: FakeEngine) -> str:
    return engine.containers.runs[-1]["files"]["imgbuild-smoke-known.txt"].decode()


def test_the_next_build_spares_what_imported_with_the_same_files_in_the_same_scope(recipe, tmp_path):
    engine = FakeEngine()
    engine.containers.meta = {"added": [["einops", "0.8.0", "MIT", FP], ["rich", "13.0", "MIT", FP2]]}
    _build(recipe, engine, tmp_path)
    assert _known(engine) == ""  # nothing before the first (the file is written all the same)
    recipe.write_text(recipe.read_text() + 'pip: ["einops==0.8.0"]\n')  # a Python change: the scope holds
    _build(recipe, engine, tmp_path)
    assert _known(engine) == f"einops==0.8.0 {FP}\nrich==13.0 {FP2}\n"
    recipe.write_text(recipe.read_text().replace("apt: [libmagic1]", "apt: []"))  # libmagic1 dropped
    _build(recipe, engine, tmp_path)
    assert _known(engine) == ""  # another system scope: everything is imported again
    _build(recipe, engine, tmp_path)
    assert _known(engine) != ""
    engine.images.untag(TARGET)  # the image the report vouches for is gone: nothing is taken on trust
    _build(recipe, engine, tmp_path)
    assert _known(engine) == ""


@pytest.mark.parametrize(
    "change, same",
    [
        ("apt: [libmagic1, ffmpeg]", False),
        ('env: {A: "1"}', False),
        ('run: ["true"]', False),
        ('args: {X: "1"}', False),
        ("user: {name: dev, uid: 2000, gid: 2000}", False),
        ('pip: ["einops==0.8.0"]', True),
        ("description: another", True),
        ("smoke: {imports: [json]}", True),
        ("labels: {org.example.team: vision}", True),
    ],
)
def test_the_system_scope_is_everything_but_the_python_requirements(recipe, change, same):
    _, before = _plan(recipe)
    recipe.write_text(recipe.read_text().replace("apt: [libmagic1]\n", "apt: [libmagic1]\n" + change + "\n", 1))
    if change.startswith("apt:"):
        recipe.write_text(recipe.read_text().replace("apt: [libmagic1]\n", "", 1))
    _, after = _plan(recipe)
    assert (spared.smoke_scope(before) == spared.smoke_scope(after)) is same, change


@pytest.mark.parametrize(
    "dest, env, counts",
    [
        ("/workspace/yaml.py", "", True),  # the working folder: `python -c` imports it before PyYAML
        ("/usr/lib/python3/dist-packages/mymodule.py", "", True),  # (a startup file is refused at the door)
        ("/usr/local/lib/libmagic.so.1", "", True),
        ("/etc/ld.so.conf.d/extra.conf", "", True),
        ("/opt/conda/lib/python3.11/site-packages/x.py", "", True),
        ("/srv/pkgs/site-packages/numpy/__init__.py", "", True),
        ("/opt/app/numpy.py", 'env: {PYTHONPATH: "/opt/app:/x"}', True),
        ("/opt/libs/libfoo.so", 'env: {LD_LIBRARY_PATH: "$LD_LIBRARY_PATH:/opt/libs"}', True),
        ("/opt/app/train.py", "", False),  # the training script: edited often, imported by no package
        ("/opt/app/config.yaml", "", False),
        ("/opt/application/x.py", 'env: {PYTHONPATH: "/opt/app"}', False),  # a prefix of a name is not a folder
    ],
)
def test_a_copied_files_content_is_in_the_scope_where_an_import_can_read_it(recipe, dest, env, counts):
    (recipe.parent / "f").write_text("one\n")
    recipe.write_text(recipe.read_text() + f"files: [{{src: f, dest: {dest}}}]\n{env}\n")
    _, before = _plan(recipe)
    (recipe.parent / "f").write_text("two\n")
    _, after = _plan(recipe)
    assert (spared.smoke_scope(before) != spared.smoke_scope(after)) is counts, dest
    recipe.write_text(recipe.read_text().replace(dest, dest + ".moved"))  # where it lands always counts
    _, moved = _plan(recipe)
    assert spared.smoke_scope(moved) != spared.smoke_scope(after)


GOOD = {"ok": True, "base": "sha256:b", "scope": "sha256:s", "digest": DIGEST}


@pytest.mark.parametrize(
    "why, record, expected",
    [
        ("a passed record, same base, scope and image", GOOD, ("a==1 " + FP, "e==2.0+cu130 " + FP)),
        ("another base", {**GOOD, "base": "sha256:other"}, ()),
        ("another system scope (an apt package dropped)", {**GOOD, "scope": "sha256:other"}, ()),
        ("no scope (an older record)", {k: v for k, v in GOOD.items() if k != "scope"}, ()),
        ("another image's record copied here", {**GOOD, "digest": "sha256:" + "2" * 64}, ()),
        ("a failed record", {**GOOD, "ok": False}, ()),
        ("ok, but not the boolean", {**GOOD, "ok": "true"}, ()),
        ("not an object", ["a==1"], ()),
    ],
)
def test_a_record_vouches_only_for_its_base_scope_and_image_and_well_formed_rows(why, record, expected):
    added = [
        ["a", "1", FP],
        ["bad name", "1", FP],
        ["b", "1; rm -rf /", FP],
        "c==1",
        ["d"],
        ["\u0661x", "1", FP],
        ["e", "2.0+cu130", FP],
        ["f", "1"],  # no fingerprint (an older record): never spared
        ["g", "1", "A" * 64],  # not lower-case hex
        ["h", "1", FP + "\n"],  # a line break would smuggle a second line into the file
        ["i", 1, FP],  # not text
    ]
    if isinstance(record, dict):
        record = {**record, "meta": {"added": added}}
    assert spared.vouched(record, "sha256:b", "sha256:s", DIGEST) == expected, why


def test_a_record_over_its_bound_vouches_for_nothing():
    """20,000 entries (440 KB) made every fresh runner's smoke test fail ('argument list too long')."""
    added = [[f"p{i}", "1.0", FP] for i in range(spared.MAX_VOUCHED + 1)]
    assert spared.vouched({**GOOD, "meta": {"added": added}}, "sha256:b", "sha256:s", DIGEST) == ()
    assert len(spared.vouched({**GOOD, "meta": {"added": added[:-1]}}, "sha256:b", "sha256:s", DIGEST)) == 5000


@pytest.mark.parametrize(
    "why, report, expected",
    [
        ("the promoted image, same base and scope", {"promoted": "sha256:cur"}, ("a==1 " + FP,)),
        ("another image", {"promoted": "sha256:old"}, ()),
        ("another scope", {"promoted": "sha256:cur", "scope": "sha256:x"}, ()),
        ("not promoted", {}, ()),
    ],
)
def test_a_local_report_vouches_only_for_the_image_it_names(why, report, expected, tmp_path):
    path = tmp_path / "smoke.json"
    data = {"base": "sha256:b", "scope": "sha256:s", "ok": True, **report, "meta": {"added": [["a", "1", "MIT", FP]]}}
    path.write_text(json.dumps(data))
    assert spared.local_known_good(path, "sha256:cur", "sha256:b", "sha256:s") == expected, why
    path.write_text("[" * 100_000)  # deep: read as nothing, no RecursionError
    assert spared.local_known_good(path, "sha256:cur", "sha256:b", "sha256:s") == ()


# --- the registry's record on a fresh runner ------------------------------------------------------------------


class Registry(MemoryRegistry):
    """The registry's copy of the target and its attachments: the tag serves DIGEST."""

    def content_digest(self, repo: str, reference: str) -> str | None:
        return DIGEST

    def attach(self, record: bytes, signature: str | None, digest: str = DIGEST) -> None:
        """`signature`: the annotation's text as stored (base64 of the signature), None for none."""
        notes = {attest.SIGNATURE_ANNOTATION: signature} if signature is not None else {}
        config, manifest, blobs = attest.artifact([(attest.SMOKE_RECORD, record, notes)])
        for blob in (config, *blobs):
            self.blobs[attest.sha256(blob)] = blob
        self.manifests[attest.attachment_tag(digest, "smoke")] = manifest


class Key:
    def __init__(self) -> None:
        self.private = ec.generate_private_key(ec.SECP256R1())
        self.signer = attest.Signer(self.private)

    def sign(self, data: bytes) -> str:
        return base64.b64encode(self.signer.sign(data)).decode()


@pytest.fixture
def fresh_runner(recipe, monkeypatch):
    from imgbuild.registry import client as client_module

    settings, plan = _plan(recipe)
    registry = Registry()
    monkeypatch.setattr(client_module.RegistryClient, "for_host", classmethod(lambda cls, *a, **k: registry))
    return settings, plan, registry


def _record(plan, **change) -> bytes:
    smoke = {"ok": True, "meta": {"added": [["einops", "0.8.0", "MIT", FP]]}}
    record = spared.smoke_record(smoke, plan.base.identity, spared.smoke_scope(plan), DIGEST)["smoke"][2][0]
    return attest.canonical({**json.loads(record), **change})


def test_a_signed_record_of_this_image_is_believed(fresh_runner):
    settings, plan, registry = fresh_runner
    key = Key()
    smoke = {"ok": True, "meta": {"added": [["einops", "0.8.0", "MIT", FP]]}}
    record = spared.smoke_record(smoke, plan.base.identity, spared.smoke_scope(plan), DIGEST, key.signer)
    config, manifest, blobs = record["smoke"]
    for blob in (config, *blobs):
        registry.blobs[attest.sha256(blob)] = blob
    registry.manifests[attest.attachment_tag(DIGEST, "smoke")] = manifest
    said: list[str] = []
    assert spared.registry_known_good(
        plan, settings, key.signer.public_key(), spared.smoke_scope(plan), said.append
    ) == (f"einops==0.8.0 {FP}",)
    assert "signed: not re-imported" in said[-1]


@pytest.mark.parametrize(
    "why, attach, message",
    [
        ("unsigned (a co-user rewrote it: S2)", lambda plan, key, other: (_record(plan), None), "not signed"),
        ("signed by another key", lambda plan, key, other: (_record(plan), other.sign(_record(plan))), "not signed"),
        (
            "signed, then edited",
            lambda plan, key, other: (_record(plan, ok=True, extra=1), key.sign(_record(plan))),
            "not signed",
        ),
        (
            "signature not base64",
            lambda plan, key, other: (_record(plan), "%% not base64 %%"),
            "not signed",
        ),
        (
            "another image's signed record copied beside this one",
            lambda plan, key, other: (
                _record(plan, digest="sha256:" + "2" * 64),
                key.sign(_record(plan, digest="sha256:" + "2" * 64)),
            ),
            "not this image's",
        ),
        (
            "signed, but 50,000 levels deep (S3)",
            lambda plan, key, other: (b"[" * 50_000 + b"]" * 50_000, key.sign(b"[" * 50_000 + b"]" * 50_000)),
            "not signed",
        ),
        (
            "signed, but over the bound (S4)",
            lambda plan, key, other: (
                _record(plan, meta={"added": [[f"p{i}", "1", FP] for i in range(20_000)]}),
                key.sign(_record(plan, meta={"added": [[f"p{i}", "1", FP] for i in range(20_000)]})),
            ),
            "not signed",
        ),
    ],
)
def test_a_registry_record_that_is_not_signed_for_this_image_is_ignored_and_said(fresh_runner, why, attach, message):
    settings, plan, registry = fresh_runner
    key, other = Key(), Key()
    registry.attach(*attach(plan, key, other))
    said: list[str] = []
    assert (
        spared.registry_known_good(plan, settings, key.signer.public_key(), spared.smoke_scope(plan), said.append) == ()
    ), why
    assert said and "ignored" in said[-1] and message in said[-1], said


def test_without_a_trusted_key_the_registry_record_is_not_used_and_the_run_says_so(fresh_runner):
    settings, plan, registry = fresh_runner
    key = Key()
    registry.attach(_record(plan), key.sign(_record(plan)))
    said: list[str] = []
    assert spared.registry_known_good(plan, settings, None, spared.smoke_scope(plan), said.append) == ()
    assert "no key to check its signature by" in said[-1]
    assert spared.trusted_key(settings) is None  # no site key configured
