"""The pipeline's logic on the in-memory engine: promotion, cleanup on every way out, rebuild ordering.

The same paths run against the real dockerd in test_build.py, test_rebuild.py and test_hostile_faults.py;
these take milliseconds each, so every branch gets a case.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from imgbuild.ci import rebuild
from imgbuild.config.settings import load_settings
from imgbuild.engine.fake import FakeEngine, failing_build
from imgbuild.engine.lease import lease_name
from imgbuild.errors import BuildFailed, SmokeFailed
from imgbuild.hostio.host import namespace_id
from imgbuild.pipeline import build as pipeline
from imgbuild.pipeline.build import BuildJob, PublishTo
from imgbuild.pipeline.plan import make_plan
from imgbuild.recipe import load_recipe
from tests.fake_nvcr import FakeNvcr
from tests.support import demo_recipe, fake_inspect

TARGET = "alice/demo:v1"
IMAGE = "alice/demo"
CANDIDATE = pipeline.candidate_ref(IMAGE)  # this process's own


def _candidates(engine: FakeEngine) -> list[str]:
    return [t for t in engine.images.tags_of(IMAGE) if t.startswith(pipeline.CANDIDATE_PREFIX)]


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    return demo_recipe(tmp_path)


def _build(recipe: Path, engine: FakeEngine, tmp_path: Path):
    settings = load_settings({"user": "alice", "ngc_registry": "registry.test:5000"})
    plan = make_plan(load_recipe(recipe), settings, fake_inspect)
    return pipeline.build_platforms(BuildJob(plan.loaded, out=tmp_path / "ctx", planned=plan), settings, engine).own()


def test_a_first_build_is_promoted_and_leaves_no_candidate(recipe, tmp_path):
    engine = FakeEngine()
    result = _build(recipe, engine, tmp_path)
    assert engine.images.image_id(TARGET) == result.image_id and result.smoke and result.smoke.ok
    assert _candidates(engine) == [] and engine.containers.alive == []
    lock = lease_name(TARGET)  # promoted under the target's engine-wide lease, then the candidate goes
    assert engine.calls[-4:] == [f"lease {lock}", f"tag {TARGET}", f"release {lock}", f"untag {CANDIDATE}"]
    assert engine.leases.held == {}


def test_a_changed_build_keeps_the_replaced_image_as_previous(recipe, tmp_path):
    engine = FakeEngine()
    first = _build(recipe, engine, tmp_path).image_id
    recipe.write_text(recipe.read_text().replace('A: "1"', 'A: "2"'))
    second = _build(recipe, engine, tmp_path)
    assert second.promoted and engine.images.image_id(TARGET) == second.image_id != first
    assert engine.images.image_id(f"{TARGET}-previous") == first


def test_a_failing_smoke_test_never_replaces_the_working_tag(recipe, tmp_path):
    engine = FakeEngine()
    working = _build(recipe, engine, tmp_path).image_id
    recipe.write_text(recipe.read_text().replace('A: "1"', 'A: "broken"'))
    engine.containers.smoke = lambda image: False
    with pytest.raises(SmokeFailed, match=f"{TARGET} was left as it was"):
        _build(recipe, engine, tmp_path)
    assert engine.images.image_id(TARGET) == working
    assert _candidates(engine) == [] and engine.images.image_id(f"{TARGET}-previous") is None


def test_a_failed_build_changes_no_tag(recipe, tmp_path):
    engine = FakeEngine()
    working = _build(recipe, engine, tmp_path).image_id
    engine.builds = failing_build()
    before = dict(engine.images.tags)
    with pytest.raises(BuildFailed):
        _build(recipe, engine, tmp_path)
    assert engine.images.tags == before and engine.images.image_id(TARGET) == working


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_during_the_smoke_test_removes_the_candidate_at_once(interrupt, recipe, tmp_path):
    engine = FakeEngine()

    def interrupted(image: str) -> bool:
        raise interrupt()

    engine.containers.smoke = interrupted
    with pytest.raises(interrupt):
        _build(recipe, engine, tmp_path)
    assert _candidates(engine) == [] and engine.leases.held == {}
    assert engine.images.image_id(TARGET) is None


def test_what_a_killed_run_left_is_removed_before_the_next_build_and_no_other_runs_candidate_is(recipe, tmp_path):
    """Candidates are each run's own (runners sharing an engine never untag each other's): a killed run of this PID
    namespace left one, which goes; a run elsewhere (another CI runner's container) keeps its own."""
    engine = FakeEngine()
    killed = f"{IMAGE}:{pipeline.CANDIDATE_PREFIX}4000000.1.{namespace_id()}"  # no such PID: gone
    elsewhere = f"{IMAGE}:{pipeline.CANDIDATE_PREFIX}1.2.5x00000000"  # another namespace's: not ours to judge
    for ref in (killed, elsewhere):
        engine.add_image(ref)
        engine.containers.alive.append(ref)  # a SIGKILL left its smoke container
    _build(recipe, engine, tmp_path)
    assert [c for c in engine.calls if not c.startswith("pull ")][0] == f"untag {killed}"
    assert engine.containers.alive == [elsewhere] and _candidates(engine) == [elsewhere.split(":")[1]]


# --- rebuild ---------------------------------------------------------------------------------------


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    folder = tmp_path / "recipes"
    folder.mkdir()
    (tmp_path / ".git").mkdir()
    (folder / "house.yaml").write_text('name: house\nimage: lab/house:v1\nbase: {framework: pytorch, tag: "24.05"}\n')
    (folder / "team.yaml").write_text("name: team\nimage: lab/team:v1\nbase: lab/house:v1\nenv: {T: '1'}\n")
    (folder / "solo.yaml").write_text('name: solo\nimage: lab/solo:v1\nbase: {framework: pytorch, tag: "24.05"}\n')
    return folder


def _rebuild(recipes: Path, engine: FakeEngine, nvcr: FakeNvcr, jobs: int = 1) -> dict[str, rebuild.Item]:
    settings = load_settings({"ngc_registry": nvcr.host, "images_dir": str(recipes.parent / "images")})
    items = rebuild.run(
        [str(recipes)], settings, rebuild.RebuildOptions(jobs=jobs), log=lambda line: None, engine=engine
    )
    return {Path(i.path).stem: i for i in items}


@pytest.mark.parametrize("jobs", [1, 3])
def test_rebuild_builds_bases_first_then_is_fresh(jobs, recipes):
    engine = FakeEngine()
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        first = _rebuild(recipes, engine, nvcr, jobs)
        assert {k: v.status for k, v in first.items()} == {"house": "built", "team": "built", "solo": "built"}
        builds = [c for c in engine.calls if c.startswith("build")]
        assert builds.index(f"build {pipeline.candidate_ref('lab/house')}") < builds.index(
            f"build {pipeline.candidate_ref('lab/team')}"
        )
        again = _rebuild(recipes, engine, nvcr, jobs)
    assert {k: v.status for k, v in again.items()} == {"house": "fresh", "team": "fresh", "solo": "fresh"}


def test_a_failed_base_skips_its_dependents_but_not_the_others(recipes):
    engine = FakeEngine()

    def house_fails(req) -> None:
        if "house" in req.tag:
            raise BuildFailed("house broke")

    engine.builds = house_fails
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        items = _rebuild(recipes, engine, nvcr)
    assert {k: v.status for k, v in items.items()} == {"house": "failed", "team": "skipped", "solo": "built"}
    assert "lab/house:v1 did not build" in items["team"].error


def test_a_changed_recipe_rebuilds_it_and_its_dependents_only(recipes):
    engine = FakeEngine()
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        _rebuild(recipes, engine, nvcr)
        (recipes / "house.yaml").write_text((recipes / "house.yaml").read_text() + "env: {H: '2'}\n")
        items = _rebuild(recipes, engine, nvcr)
    assert {k: v.status for k, v in items.items()} == {"house": "built", "team": "built", "solo": "fresh"}
    assert "recipe or its files changed" in items["house"].reasons


def test_a_base_is_asked_of_the_registry_once_per_ttl_and_always_by_rebuild(tmp_path):
    """The edit-render-build loop asks about the same base many times a minute: the answer is kept
    `base_cache_ttl` seconds; rebuild (`fresh`) always asks; a TTL of 0 never keeps it."""
    from imgbuild.pipeline.resolve import registry_inspector

    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        ref = f"{nvcr.host}/nvidia/pytorch:24.05-py3"

        def asked(fresh: bool = False, **extra: object) -> int:
            settings = load_settings({"cache_dir": str(tmp_path / "cache"), **extra}, environ={})
            asking = []
            for _ in range(3):
                before = len(nvcr.log)
                digest, _ = registry_inspector(settings, fresh=fresh)(ref)
                assert digest.startswith("sha256:")
                asking.append(any("/manifests/" in line for line in nvcr.log[before:]))
            return sum(asking)

        assert asked() == 1  # the first look-up asks, the next two are the kept answer
        assert asked() == 0
        assert asked(fresh=True) == 3
        assert asked(base_cache_ttl=0) == 3


# --- the registry cache ---------------------------------------------------------------


@pytest.mark.parametrize(
    "setting, builder, seed, backend, expected",
    [
        ("inline", None, False, "buildkit", {"inline_cache": True}),
        ("inline", None, True, "buildkit", {"inline_cache": True, "cache_from": ("alice/demo:v1",)}),
        (
            "registry",
            "ci",
            True,
            "buildkit",
            {"inline_cache": True, "cache_from": ("alice/demo:v1",), "cache_to": "alice/demo:imgbuild-cache"},
        ),
        ("off", None, True, "buildkit", {}),
        ("inline", None, True, "sdk", {}),  # the Engine API's builder has no inline cache
    ],
)
def test_the_cache_a_build_carries_and_is_seeded_from(setting, builder, seed, backend, expected, recipe):
    settings = load_settings({"user": "alice", "registry_cache": setting, "builder": builder})
    plan = make_plan(load_recipe(recipe), settings, fake_inspect)
    assert pipeline.registry_cache(plan, settings, backend, seed) == expected


@pytest.mark.parametrize(
    ("setting", "seed", "expected"),
    [
        ("inline", True, {"cache_from": ("alice/demo-imgbuild-cache",), "cache_to": "alice/demo-imgbuild-cache"}),
        ("registry", True, {"cache_from": ("alice/demo-imgbuild-cache",), "cache_to": "alice/demo-imgbuild-cache"}),
        ("inline", False, {}),  # a local build has its own layers
        ("off", True, {}),
    ],
)
def test_buildahs_registry_cache_is_a_repository_beside_the_image_with_the_pushs_credentials(
    setting, seed, expected, recipe, tmp_path, monkeypatch
):
    import base64

    config = tmp_path / "docker-config"
    config.mkdir()
    token = base64.b64encode(b"ci:hunter2").decode()
    (config / "config.json").write_text(json.dumps({"auths": {"https://reg.example:5000": {"auth": token}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    recipe.write_text(recipe.read_text() + "image: reg.example:5000/alice/demo\n")
    settings = load_settings({"user": "alice", "registry_cache": setting, "builder": "ci"})
    plan = make_plan(load_recipe(recipe), settings, fake_inspect)
    fields = pipeline.registry_cache(plan, settings, "buildkit", seed, "podman")
    auth = fields.pop("cache_auth", None)
    assert fields == {k: tuple(f"reg.example:5000/{r}" for r in v) if k == "cache_from" else f"reg.example:5000/{v}"
                      for k, v in expected.items()}  # fmt: skip
    assert auth == ({"username": "ci", "password": "hunter2"} if expected else None)


def test_the_cache_flags_on_the_cli_and_on_buildx():
    from imgbuild.engine.buildkit import cache_args
    from imgbuild.engine.types import BuildRequest

    req = BuildRequest(Path("."), "t", inline_cache=True, cache_from=("reg/a/b:v1",), cache_to="reg/a/b:imgbuild-cache")
    assert cache_args(req, buildx=False) == ["--build-arg", "BUILDKIT_INLINE_CACHE=1", "--cache-from", "reg/a/b:v1"]
    with_builder = BuildRequest(**{**req.__dict__, "builder": "ci"})
    assert cache_args(with_builder, buildx=True) == [
        "--build-arg", "BUILDKIT_INLINE_CACHE=1",
        "--cache-from", "type=registry,ref=reg/a/b:v1",
        "--cache-from", "type=registry,ref=reg/a/b:imgbuild-cache",
        "--cache-to", "type=registry,ref=reg/a/b:imgbuild-cache,mode=max",
    ]  # fmt: skip
    assert "--cache-to" not in cache_args(req, buildx=True)  # buildx's docker driver exports no cache
    assert cache_args(BuildRequest(Path("."), "t"), buildx=True) == []


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"registry_cache": "max"}, "registry_cache: must be one of inline, registry, off"),
        ({"registry_cache": "registry"}, "registry is a buildx builder's cache export: set builder"),
    ],
)
def test_a_bad_registry_cache_setting_is_one_line(flags, message):
    from imgbuild.errors import UsageError

    with pytest.raises(UsageError, match=message):
        load_settings(flags)


def test_a_pushed_build_is_seeded_from_the_registry_copy_of_its_target(recipe, tmp_path):
    seen = []
    engine = FakeEngine(builds=seen.append)
    settings = load_settings({"user": "alice", "ngc_registry": "registry.test:5000"})
    plan = make_plan(load_recipe(recipe), settings, fake_inspect)
    pushed = BuildJob(plan.loaded, out=tmp_path / "ctx", publish=PublishTo(), planned=plan)
    pipeline.build_platforms(pushed, settings, engine)  # the build half of a job that pushes
    pipeline.build_platforms(dataclasses.replace(pushed, publish=None), settings, engine)
    assert [(r.inline_cache, r.cache_from) for r in seen] == [(True, (TARGET,)), (True, ())]
    # a fresh runner (no local image) pulls the registry's copy first (moby/buildkit#1981); a warm one does not
    assert engine.calls.count(f"pull {TARGET}") == 1 and engine.calls.index(f"pull {TARGET}") < engine.calls.index(
        f"build {CANDIDATE}"
    )
    pipeline.build_platforms(pushed, settings, engine)
    assert engine.calls.count(f"pull {TARGET}") == 1


def test_a_missing_registry_cache_is_not_the_step_that_failed():
    """CI: on a first push the cache import says `#11 ERROR: ...: not found` before the real step fails; it was
    taken for the failed step ("build failed:" without "at", and the wrong lines). It is a note now."""
    import io
    import types

    from imgbuild.engine.buildkit import _follow
    from imgbuild.engine.types import StepTracker

    log = [
        "#11 importing cache manifest from 127.0.0.1:5000/lab/x:v1",
        "#11 ERROR: 127.0.0.1:5000/lab/x:v1: not found",
        '#5 [stage-1 2/5] RUN ["/bin/sh", "-c", "echo about to fail && false"]',
        "#5 0.301 about to fail",
        "#5 ERROR: executor failed running [/bin/sh -c echo about to fail && false]: exit code: 1",
    ]
    proc = types.SimpleNamespace(stdout=[line + "\n" for line in log])
    tracker, errors, said = StepTracker(), [], []
    _follow(proc, said.append, lambda s: s, io.StringIO(), tracker, errors)  # type: ignore[arg-type]
    assert tracker.failed == "5" and errors == [
        "executor failed running [/bin/sh -c echo about to fail && false]: exit code: 1"
    ]
    assert any(s.startswith("no registry cache to start from") for s in said)


def test_a_build_job_takes_only_the_options_it_names(recipe):
    """A misspelt option is refused where the job is made, never carried along unread."""
    with pytest.raises(TypeError, match="reproducable"):
        BuildJob(load_recipe(recipe), reproducable=True)  # type: ignore[call-arg]


def test_rebuild_push_publishes_through_the_build_job(recipes):
    """CI's push is the build job's own last stage, as `build --push`'s is: the image pushed once, to its target,
    and the digest the registry holds reported."""
    from tests.fake_registry import ServedRegistry

    engine = FakeEngine()
    registry = ServedRegistry()
    engine.images.push = registry.engine_push(engine)  # type: ignore[method-assign]
    for other in ("team.yaml", "house.yaml"):
        (recipes / other).unlink()
    (recipes / "solo.yaml").write_text(
        f'name: solo\nimage: {registry.host}/lab/solo:v1\nbase: {{framework: pytorch, tag: "24.05"}}\n'
    )
    try:
        with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
            settings = load_settings(
                {"ngc_registry": nvcr.host, "images_dir": str(recipes.parent / "images"),
                 "insecure_registries": [registry.host]}
            )  # fmt: skip
            options = rebuild.RebuildOptions(push=True)
            (item,) = rebuild.run([str(recipes)], settings, options, lambda line: None, engine)
    finally:
        registry.close()
    assert item.status == "built", item.error
    assert item.pushed == registry.tags[("lab/solo", "v1")]
    assert [tag for repo, tag in registry.tags if repo == "lab/solo" and not tag.startswith("sha256-")] == ["v1"]
