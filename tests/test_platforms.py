"""Building for several platforms (linux/amd64, linux/arm64): the closed set of names, the emulator this machine
registers, the engine's refusal where it cannot, each platform's own promotion and smoke report, and the manifest
list a push makes of them. The real builds under qemu (Podman, the bed's arm64 NGC stand-in) are in
test_engines.py; these run on the in-memory engine and registry fakes."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from imgbuild.config.settings import load_settings
from imgbuild.engine.emulation import emulator
from imgbuild.engine.fake import FakeEngine
from imgbuild.engine.podman import build_argv
from imgbuild.engine.types import BuildRequest, ImageInfo
from imgbuild.errors import EXIT_ENVIRONMENT, EXIT_USAGE, BuildFailed, EnvironmentProblem, UsageError
from imgbuild.pipeline import build as pipeline
from imgbuild.pipeline.build import BuildJob, build_platforms
from imgbuild.pipeline.plan import make_plan
from imgbuild.pipeline.publish import PublishRequest, publish_platforms
from imgbuild.platforms import parse_platforms, platform_of_machine
from imgbuild.recipe import load_recipe
from imgbuild.registry.manifest import DOCKER_MANIFEST_TYPE, LIST_TYPE, OCI_INDEX_TYPE, PlatformImage, manifest_list
from tests.support import demo_recipe, fake_inspect

BOTH = ("linux/amd64", "linux/arm64")

# --- the names: a closed set, matched whole -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("linux/amd64", ("linux/amd64",)),
        ("linux/arm64", ("linux/arm64",)),
        ("linux/arm64/v8", ("linux/arm64",)),  # OCI's variant spelling of the same platform
        ("linux/arm64,linux/amd64", ("linux/arm64", "linux/amd64")),  # the order given
    ],
)
def test_the_platforms_imgbuild_builds_are_read_in_the_order_given(text, want):
    assert parse_platforms(text) == want


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("linux/riscv64", "a platform imgbuild does not build"),
        ("linux/arm", "32-bit arm"),
        ("windows/amd64", "another OS"),
        ("arm64", "an architecture without its OS"),
        ("Linux/ARM64", "capitals"),
        ("linux/arm64 ", "a trailing space"),
        (" linux/arm64", "a leading space"),
        ("linux/arm64\n", "a newline"),
        ("linux/arm64\x00", "a NUL"),
        ("linux/\u0430rm64", "a Cyrillic a"),
        ("linux/arm\uff16\uff14", "fullwidth digits"),
        ("linux/arm64,linux/arm64", "twice"),
        ("linux/arm64,linux/arm64/v8", "twice, spelled two ways"),
        ("linux/arm64,", "an empty entry"),
        (",linux/arm64", "an empty first entry"),
        ("linux/arm64;id", "a shell word"),
        ("../../etc/passwd", "a path"),
        ("linux/amd64," * 4 + "linux/arm64", "too many"),
        ("l" * 100_000, "100,000 characters"),
    ],
)
def test_any_other_platform_text_is_refused_in_one_line(text, why):
    with pytest.raises(UsageError) as info:
        parse_platforms(text)
    message = str(info.value)
    assert info.value.exit_code == EXIT_USAGE, why
    assert message.startswith("--platform: ") and "\n" not in message and len(message) < 200, why
    assert message.isprintable() and message.isascii(), why


@pytest.mark.parametrize(
    ("machine", "want"),
    [("x86_64", "linux/amd64"), ("amd64", "linux/amd64"), ("aarch64", "linux/arm64"), ("arm64", "linux/arm64"),
     ("ppc64le", ""), ("", "")],
)  # fmt: skip
def test_a_machine_name_maps_to_its_platform(machine, want):
    assert platform_of_machine(machine) == want


def test_an_unknown_platform_exits_2_before_any_engine_is_asked(tmp_path):
    """No engine is reachable here (DOCKER_HOST points nowhere): the flag is still judged first."""
    from tests.conftest import run_cli

    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\ntag: "1"\nbase: {framework: pytorch, tag: "24.05"}\n')
    result = run_cli("build", str(recipe), "--platform", "linux/s390x", env={"DOCKER_HOST": f"unix://{tmp_path}/no"})
    assert result.code == EXIT_USAGE
    assert result.err.strip().splitlines()[-1].endswith("linux/s390x is not a platform imgbuild builds "
                                                         "(linux/amd64, linux/arm64)")  # fmt: skip
    assert "Traceback" not in result.err and len(result.err.strip().splitlines()) == 1


# --- the emulator this machine registers -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POF\noffset 0\n",
         "/usr/libexec/qemu-binfmt/aarch64-binfmt-P"),
        ("disabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: OCF\n", ""),  # switched off
        ("enabled\ninterpreter /usr/bin/qemu-aarch64\nflags: P\n", ""),  # no F: no use in a container
        ("enabled\n", ""),
        ("", ""),
        ("\xff\xfe garbage", ""),
    ],
)  # fmt: skip
def test_an_emulator_counts_only_when_enabled_with_the_fix_binary_flag(tmp_path, text, want):
    (tmp_path / "qemu-aarch64").write_bytes(text.encode("latin-1"))
    assert emulator("linux/arm64", tmp_path) == want


def test_no_binfmt_entry_means_no_emulator(tmp_path):
    assert emulator("linux/arm64", tmp_path) == ""
    assert emulator("linux/amd64", tmp_path / "missing") == ""


# --- the engines -------------------------------------------------------------------------------------------


def test_podman_builds_a_foreign_platform_pulling_its_bases_for_it(tmp_path):
    req = BuildRequest(context=tmp_path, tag="lab/x:1", platform="linux/arm64")
    argv = build_argv("podman", req, tmp_path / "iid")
    assert argv[argv.index("--platform") + 1] == "linux/arm64" and "--pull=always" in argv
    # the engine's own platform by name (of two local images of a base, the right one), never pulled again
    own = build_argv("podman", BuildRequest(context=tmp_path, tag="lab/x:1"), tmp_path / "iid", platform="linux/amd64")
    assert own[own.index("--platform") + 1] == "linux/amd64" and not any(a.startswith("--pull") for a in own)


class _Info:
    def __init__(self, arch: str):
        self.arch = arch

    def info(self) -> dict:
        return {"ServerVersion": "20.10.24", "Architecture": self.arch}


@pytest.mark.parametrize(("arch", "host"), [("x86_64", "linux/amd64"), ("aarch64", "linux/arm64")])
def test_docker_builds_its_hosts_platform_only_and_says_what_to_use_instead(arch, host):
    from imgbuild.engine.docker import Engine

    engine = Engine(_Info(arch))
    assert engine.host_platform() == host and engine.platform_refusal(host) == ""
    other = "linux/arm64" if host == "linux/amd64" else "linux/amd64"
    refusal = engine.platform_refusal(other)
    assert "Podman" in refusal and "buildx" in refusal and "\n" not in refusal


# --- the pipeline, each platform its own pass ------------------------------------------------------------------


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    return demo_recipe(tmp_path)


def _settings():
    return load_settings({"user": "alice", "ngc_registry": "registry.test:5000"})


def _request(made, smoke: dict, settings, engine: FakeEngine, signer) -> PublishRequest:
    """The publication of `made` (a PlatformBuilds) as build_job makes it: its own platform's plan, quietly."""
    return PublishRequest(made.own().plan, smoke, settings, engine, settings.backend, signer, lambda s: None)


def _build(recipe: Path, engine: FakeEngine, tmp_path: Path, platforms: tuple[str, ...]):
    settings = _settings()
    plan = make_plan(load_recipe(recipe), settings, fake_inspect)
    return build_platforms(BuildJob(plan.loaded, platforms, out=tmp_path / "ctx", planned=plan), settings, engine)


def test_both_platforms_are_built_smoke_tested_and_promoted_each_to_its_own_tag(recipe, tmp_path):
    engine = FakeEngine(platforms=BOTH)
    made = _build(recipe, engine, tmp_path, ("linux/arm64", "linux/amd64"))
    own, arm = made.results  # the engine's own platform first
    assert (own.platform, arm.platform) == ("", "linux/arm64") and made.emulated
    assert engine.images.image_id("alice/demo:v1") == own.image_id
    assert engine.images.image_id("alice/demo:v1-arm64") == arm.image_id != own.image_id
    assert engine.images.image("alice/demo:v1-arm64").architecture == "arm64"
    assert f"build {pipeline.candidate_ref('alice/demo')} for linux/arm64" in engine.calls
    # the arm64 smoke test: no GPU asked for, and the report says what emulation could not prove
    assert engine.containers.runs[1]["gpus"] is None
    checks = {c["name"]: c for c in arm.smoke.checks}
    assert checks["emulation"]["status"] == "skip" and "not proven under emulation" in checks["emulation"]["reason"]
    assert arm.smoke.meta["platform"] == "linux/arm64" and "emulation" not in {c["name"] for c in own.smoke.checks}
    # each platform's report beside the context, neither overwriting the other
    assert json.loads((tmp_path / "ctx" / "smoke.arm64.json").read_text())["promoted"] == arm.image_id
    assert json.loads((tmp_path / "ctx" / "smoke.json").read_text())["promoted"] == own.image_id
    assert arm.to_json()["image"] == "alice/demo:v1-arm64" and arm.to_json()["platform"] == "linux/arm64"


def test_the_engines_own_platform_named_alone_is_an_ordinary_build(recipe, tmp_path):
    engine = FakeEngine(platforms=BOTH)
    made = _build(recipe, engine, tmp_path, ("linux/amd64",))
    assert not made.emulated and [r.target for r in made.results] == ["alice/demo:v1"]
    assert not any(" for " in call for call in engine.calls if call.startswith("build "))


def test_an_engine_that_cannot_run_the_platform_refuses_before_building(recipe, tmp_path):
    engine = FakeEngine()  # linux/amd64 only: no emulator
    with pytest.raises(EnvironmentProblem) as info:
        _build(recipe, engine, tmp_path, ("linux/arm64",))
    assert info.value.exit_code == EXIT_ENVIRONMENT
    assert not any(call.startswith("build ") for call in engine.calls)
    assert engine.images.tags_of("alice/demo") == []


def test_a_failing_arm64_smoke_test_leaves_its_tag_and_pushes_nothing(recipe, tmp_path):
    from imgbuild.errors import SmokeFailed

    engine = FakeEngine(platforms=BOTH)
    first = _build(recipe, engine, tmp_path, BOTH)
    recipe.write_text(recipe.read_text().replace('A: "1"', 'A: "2"'))
    engine.containers.smoke = lambda image: len(engine.containers.runs) % 2 == 1  # the second (arm64) run fails
    with pytest.raises(SmokeFailed, match="alice/demo:v1-arm64 was left as it was"):
        _build(recipe, engine, tmp_path, BOTH)
    assert engine.images.image_id("alice/demo:v1-arm64") == first.results[1].image_id
    assert not [t for t in engine.images.tags_of("alice/demo") if t.startswith(pipeline.CANDIDATE_PREFIX)]


def test_an_image_of_another_platform_than_asked_fails_the_build_unpromoted(recipe, tmp_path):
    """Podman takes a local base of another platform where the one asked for is not pulled: caught at once."""
    engine = FakeEngine(platforms=BOTH)
    real_add = engine.images.add

    def wrong_arch(image_id: str, info: ImageInfo, ref: str) -> str:
        return real_add(image_id, ImageInfo(info.id, info.labels, info.config, architecture="amd64"), ref)

    engine.images.add = wrong_arch  # type: ignore[method-assign]
    with pytest.raises(BuildFailed, match="built a linux/amd64 image for linux/arm64"):
        _build(recipe, engine, tmp_path, ("linux/arm64",))
    assert engine.images.image_id("alice/demo:v1-arm64") is None and engine.containers.runs == []


# --- the manifest list -----------------------------------------------------------------------------------------


def test_a_manifest_list_names_each_platform_as_oci_and_docker_spell_it():
    images = [
        PlatformImage("linux/amd64", "sha256:" + "a" * 64, DOCKER_MANIFEST_TYPE, 1200),
        PlatformImage("linux/arm64", "sha256:" + "b" * 64, DOCKER_MANIFEST_TYPE, 1300),
    ]
    body, kind = manifest_list(images)
    listing = json.loads(body)
    assert kind == listing["mediaType"] == LIST_TYPE and listing["schemaVersion"] == 2
    assert [m["platform"] for m in listing["manifests"]] == [
        {"architecture": "amd64", "os": "linux"},
        {"architecture": "arm64", "os": "linux", "variant": "v8"},
    ]
    assert [(m["digest"], m["size"]) for m in listing["manifests"]] == [("sha256:" + "a" * 64, 1200),
                                                                          ("sha256:" + "b" * 64, 1300)]  # fmt: skip
    oci = PlatformImage("linux/arm64", "sha256:" + "c" * 64, "application/vnd.oci.image.manifest.v1+json", 9)
    assert manifest_list([images[0], oci])[1] == OCI_INDEX_TYPE  # one OCI image: an OCI index


class _Registry(BaseHTTPRequestHandler):
    """Serves the manifests pushed (by digest) and answers a manifest list as `refuse` says."""

    manifests: dict[str, bytes] = {}
    refuse = 400

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        digest = self.path.rsplit("/", 1)[-1]
        body = self.manifests.get(digest)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", DOCKER_MANIFEST_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.send_response(404)
        self.end_headers()

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(self.refuse)
        body = b'{"errors":[{"code":"MANIFEST_INVALID","message":"manifest invalid"}]}'
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("status", [400, 415])
def test_a_registry_that_refuses_manifest_lists_is_an_environment_problem_in_one_line(recipe, tmp_path, status):
    import hashlib

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host = f"127.0.0.1:{server.server_address[1]}"
        recipe.write_text(recipe.read_text() + f"image: {host}/lab/demo\n")
        engine = FakeEngine(platforms=BOTH)
        made = _build(recipe, engine, tmp_path, BOTH)
        manifests = {}
        for result in made.results:  # what the fake engine's push answers, as the registry would serve it
            body = json.dumps({"schemaVersion": 2, "config": {"digest": result.image_id}}).encode()
            manifests["sha256:" + hashlib.sha256(body).hexdigest()] = body
        _Registry.manifests, _Registry.refuse = manifests, status
        digests = iter(manifests)
        engine.images.push = lambda ref, auth, progress, *quiet: next(digests)  # type: ignore[method-assign]
        settings = load_settings({"user": "alice", "insecure_registries": [host]})
        builds = [(made.platform_of(r), r.image_id) for r in made.results]
        with pytest.raises(EnvironmentProblem) as info:
            publish_platforms(_request(made, {}, settings, engine, None), builds)
    finally:
        server.shutdown()
    message = str(info.value)
    assert info.value.exit_code == EXIT_ENVIRONMENT and "\n" not in message
    assert "refused the manifest list of 2 platforms" in message and "v1-amd64, v1-arm64" in message
    assert engine.leases.held == {}


def test_a_single_platform_push_never_drops_a_manifest_lists_other_platforms(recipe, tmp_path, monkeypatch):
    """`build --push` or `rebuild --push` of this machine's platform alone, over a tag that is a list of both: it
    refuses, naming the build that keeps both, and pushes nothing."""
    from imgbuild.pipeline import publish as publishing

    engine = FakeEngine(platforms=BOTH)
    made = _build(recipe, engine, tmp_path, ("linux/amd64",))
    there = publishing.RemoteBuild("sha256:" + "e" * 64, "sha256:other", False, ("amd64", "arm64"))
    monkeypatch.setattr(publishing, "remote_build", lambda *a, **k: there)
    with pytest.raises(UsageError, match="--platform linux/amd64,linux/arm64 --push"):
        publishing.publish(_request(made, {}, _settings(), engine, None), made.own().image_id)
    assert engine.images.pushed == {} and engine.leases.held == {}


def test_smoking_an_image_of_another_platform_runs_it_under_emulation_or_says_what_to_install():
    """`imgbuild smoke lab/x:1-arm64` on an amd64 machine: emulated where the engine can (no GPU asked for, the
    report's `emulation` line); else one line, exit 3, never an `exec format error` from inside the container."""
    from imgbuild.pipeline.smoke import SmokeRequest, run_smoke

    for engine in (FakeEngine(platforms=BOTH), FakeEngine()):
        image_id = engine.images.add("sha256:" + "a" * 64, ImageInfo("sha256:" + "a" * 64, architecture="arm64"), "x:1")
        if len(engine.platforms) == 1:
            with pytest.raises(EnvironmentProblem) as info:
                run_smoke(engine, SmokeRequest("x:1"))
            assert info.value.exit_code == EXIT_ENVIRONMENT and engine.containers.runs == []
            continue
        report = run_smoke(engine, SmokeRequest(image_id))
        assert engine.containers.runs[0]["gpus"] is None and report.meta["platform"] == "linux/arm64"
        assert [c["status"] for c in report.checks if c["name"] == "emulation"] == ["skip"]


# --- a recipe's own platforms: build and rebuild ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("[linux/riscv64]", "platforms[0]: must be 'linux/amd64' or 'linux/arm64'"),
        ("[linux/arm64/v8]", "platforms[0]: must be 'linux/amd64' or 'linux/arm64'"),  # the recipe takes one spelling
        ("[linux/arm64, linux/arm64]", "platforms[1]: is named twice"),
        ("[linux/amd64, linux/arm64, linux/amd64]", "platforms: must have at most 2 items"),
        ("linux/arm64", "platforms: must be a list"),
        ('["linux/arm64\\n"]', "platforms[0]: must be"),
        ("[{a: 1}]", "platforms[0]: must be"),
    ],
)
def test_a_recipes_platforms_are_the_closed_set_each_once_else_one_line_naming_the_field(tmp_path, value, said):
    from imgbuild.errors import RecipeError

    path = demo_recipe(tmp_path, f"platforms: {value}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    lines = [line for line in str(info.value).splitlines() if "platforms" in line]
    assert len(lines) == 1 and said in lines[0] and lines[0].startswith(f"{path}:4:"), str(info.value)


def test_a_recipe_that_names_both_platforms_builds_both_and_the_flag_overrides_it(tmp_path):
    path = demo_recipe(tmp_path, "platforms: [linux/amd64, linux/arm64]\n")
    engine = FakeEngine(platforms=BOTH)
    made = _build(path, engine, tmp_path, ())
    assert [r.target for r in made.results] == ["alice/demo:v1", "alice/demo:v1-arm64"]
    only = _build(path, FakeEngine(platforms=BOTH), tmp_path, ("linux/amd64",))
    assert [r.target for r in only.results] == ["alice/demo:v1"]


def test_rebuild_builds_a_recipes_every_platform_and_is_fresh_only_when_each_is_there(tmp_path, monkeypatch):
    from imgbuild.ci import rebuild
    from imgbuild.pipeline import publish as publishing
    from tests.fake_nvcr import FakeNvcr

    folder = tmp_path / "recipes"
    folder.mkdir()
    demo_recipe(folder, "platforms: [linux/amd64, linux/arm64]\n")
    (folder / ".git").rmdir()
    (tmp_path / ".git").mkdir()
    engine = FakeEngine(platforms=BOTH)
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        settings = load_settings({"ngc_registry": nvcr.host, "images_dir": str(tmp_path / "images"), "user": "alice"})

        def once(**options) -> rebuild.Item:
            (item,) = rebuild.run([str(folder)], settings, rebuild.RebuildOptions(**options), lambda s: None, engine)
            return item

        assert once().status == "built"
        assert {engine.images.image(r).architecture for r in ("alice/demo:v1", "alice/demo:v1-arm64")} == {
            "amd64",
            "arm64",
        }
        assert once().status == "fresh"
        engine.images.untag("alice/demo:v1-arm64")  # the arm64 image gone: stale, and said why
        dry = once(dry_run=True)
        assert dry.status == "stale" and dry.reasons == ["no linux/arm64 image of these inputs here"]
        assert once().status == "built" and engine.images.image("alice/demo:v1-arm64").architecture == "arm64"
        # with --push: a registry copy of this very build that is amd64 only is stale for its missing platform, on
        # this runner and on a fresh one; one of both platforms is current
        from imgbuild.pipeline.resolve import plan_recipe

        plan = plan_recipe(load_recipe(folder / "demo.yaml"), settings, engine, fresh=True)
        copy = publishing.RemoteBuild("sha256:" + "e" * 64, plan.input_hash, False, ())
        monkeypatch.setattr(rebuild, "remote_build", lambda *a, **k: copy)
        assert rebuild.staleness(plan, engine, settings, push=True) == ["the registry's copy has no linux/arm64 image"]
        assert rebuild.staleness(plan, FakeEngine(platforms=BOTH), settings, push=True) == ["never built here"]
        both = publishing.RemoteBuild("sha256:" + "e" * 64, plan.input_hash, False, ("amd64", "arm64"))
        monkeypatch.setattr(rebuild, "remote_build", lambda *a, **k: both)
        assert rebuild.staleness(plan, engine, settings, push=True) == []
        assert rebuild.staleness(plan, FakeEngine(platforms=BOTH), settings, push=True) == []


def test_naming_platforms_changes_no_image_hash(tmp_path):
    """Which platforms are built shapes no image: the content hash (and every image's labels) stay; a platform a
    recipe adds is found missing by rebuild, platform by platform."""
    from imgbuild.pipeline.plan import content_hash

    plain = content_hash(load_recipe(demo_recipe(tmp_path)))
    both = content_hash(load_recipe(demo_recipe(tmp_path, 'env: {A: "1"}\nplatforms: [linux/amd64, linux/arm64]\n')))
    assert plain == both


# --- two pushers on one tag: what is signed is what this run put ------------------------------------------------


def _list_published(registry, recipe: Path, tmp_path: Path, signer) -> str:
    """The demo recipe built for both platforms and published as a manifest list into `registry`: its digest."""
    recipe.write_text(recipe.read_text() + f"image: {registry.host}/lab/demo\n")
    engine = FakeEngine(platforms=BOTH)
    made = _build(recipe, engine, tmp_path, BOTH)
    engine.images.push = registry.engine_push(engine)  # type: ignore[method-assign]
    settings = load_settings({"user": "alice", "insecure_registries": [registry.host]})
    builds = [(made.platform_of(r), r.image_id) for r in made.results]
    return publish_platforms(_request(made, {"ok": True}, settings, engine, signer), builds)


def _signatures(registry) -> set[str]:
    return {tag for (_, tag) in registry.tags if tag.endswith(".sig")}


@pytest.mark.parametrize("multi", [False, True], ids=["one image", "manifest list"])
def test_a_push_whose_tag_another_pusher_moves_signs_nothing_and_names_both_digests(recipe, tmp_path, multi):
    from cryptography.hazmat.primitives.asymmetric import ec

    from imgbuild.errors import EXIT_FAILED, JobFailed
    from imgbuild.pipeline.publish import publish
    from imgbuild.supply import attest
    from tests.fake_registry import ServedRegistry

    registry = ServedRegistry()
    try:
        recipe.write_text(recipe.read_text() + f"image: {registry.host}/lab/demo\n")
        engine = FakeEngine(platforms=BOTH)
        made = _build(recipe, engine, tmp_path, BOTH if multi else ("linux/amd64",))
        theirs = registry.put("lab/their", "x", b'{"schemaVersion":2,"theirs":1}', DOCKER_MANIFEST_TYPE)

        def other_pusher(repo: str, tag: str) -> None:
            if tag == "v1":  # the moment after this run's manifest (or list) landed at the target's tag
                registry.tags[(repo, tag)] = theirs

        engine.images.push = registry.engine_push(engine, None if multi else other_pusher)  # type: ignore[method-assign]
        registry.after_put = other_pusher if multi else None
        settings = load_settings({"user": "alice", "insecure_registries": [registry.host]})
        signer = attest.Signer(ec.generate_private_key(ec.SECP256R1()))
        with pytest.raises(JobFailed) as info:
            if multi:
                builds = [(made.platform_of(r), r.image_id) for r in made.results]
                publish_platforms(_request(made, {}, settings, engine, signer), builds)
            else:
                publish(_request(made, {}, settings, engine, signer), made.own().image_id)
    finally:
        registry.close()
    message = str(info.value)
    ours = [d for d in registry.manifests if d != theirs and d in message]
    assert info.value.exit_code == EXIT_FAILED and "\n" not in message
    assert theirs in message and len(ours) == 1, message
    assert _signatures(registry) == set()  # neither theirs nor ours: the tag is not this run's


def test_a_manifest_list_is_signed_by_the_digest_of_the_bytes_put_not_by_what_the_tag_serves_later(
    recipe, tmp_path, monkeypatch
):
    from cryptography.hazmat.primitives.asymmetric import ec

    from imgbuild.pipeline import publish as publishing
    from imgbuild.registry.transport import digest_of
    from imgbuild.supply import attest
    from tests.fake_registry import ServedRegistry

    registry = ServedRegistry()
    signed: list[str] = []
    monkeypatch.setattr(publishing, "_sign", lambda request, signer, digest, client: signed.append(digest))
    try:
        digest = _list_published(registry, recipe, tmp_path, attest.Signer(ec.generate_private_key(ec.SECP256R1())))
    finally:
        registry.close()
    listed = registry.tags[("lab/demo", "v1")]
    assert signed == [digest] == [listed] == [digest_of(registry.manifests[listed][0])]


def test_a_signed_manifest_list_has_each_platforms_image_signed_by_the_same_key(recipe, tmp_path):
    """cosign's `sign --recursive`: a runtime that resolves the list to its own platform's entry (and
    `run.signed_only`, asked of that entry) finds it signed, not only the list."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from imgbuild.registry.client import RegistryClient
    from imgbuild.supply import attest
    from imgbuild.supply.verify import check_signature
    from tests.fake_registry import ServedRegistry

    registry = ServedRegistry()
    signer = attest.Signer(ec.generate_private_key(ec.SECP256R1()))
    try:
        listed = _list_published(registry, recipe, tmp_path, signer)
        client = RegistryClient(registry.host, insecure=True, retries=0, timeout=3, command_seconds=10)
        entries = [registry.tags[("lab/demo", f"v1-{arch}")] for arch in ("amd64", "arm64")]
        verdicts = [
            check_signature(client, "lab/demo", f"{registry.host}/lab/demo", d, signer.public_key())
            for d in (listed, *entries)
        ]
    finally:
        registry.close()
    assert [v.ok for v in verdicts] == [True, True, True], [v.detail for v in verdicts]
