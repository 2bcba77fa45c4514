"""`imgbuild rebuild` and `bump` on the test bed: exactly the stale images, dependency order, push, reports."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import requests

from imgbuild.ci.bump import bump
from tests.conftest import run_cli
from tests.fake_nvcr import FakeNvcr, push_many_tags


def statuses(report_path: Path) -> dict[str, str]:
    data = json.loads(report_path.read_text())
    return {Path(i["recipe"]).stem: i["status"] for i in data["images"]}


def reasons(report_path: Path) -> dict[str, str]:
    data = json.loads(report_path.read_text())
    return {Path(i["recipe"]).stem: "; ".join(i["reasons"]) for i in data["images"]}


@pytest.fixture
def project(tmp_path: Path, testbed, unique, docker_client):
    """A project folder with recipes/ on a base of its own in the test bed's registry."""
    registry = testbed["IMGBUILD_TESTBED_REGISTRY"]
    base_repo = f"imgbuildtest/base-{unique}"
    push_many_tags(registry, base_repo, "nvidia/pytorch", "24.05-py3", ["1"])
    (tmp_path / "recipes").mkdir()
    created: list[str] = []

    def recipe(name: str, text: str) -> Path:
        path = tmp_path / "recipes" / f"{name}.yaml"
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    yield {
        "dir": tmp_path,
        "registry": registry,
        "base": f"{registry}/{base_repo}:1",
        "base_repo": base_repo,
        "u": unique,
        "recipe": recipe,
        "created": created,
    }
    for image in docker_client.images.list(name=f"{registry}/imgbuildtest/*"):
        for tag in image.tags:
            if unique in tag:
                docker_client.images.remove(tag, noprune=True)


def rebuild(project: dict, *args: str):
    report = project["dir"] / "report.json"
    res = run_cli("rebuild", "--report-json", str(report), *args, cwd=project["dir"])
    return res, report


@pytest.mark.engine
def test_rebuild_builds_exactly_what_changed_and_its_dependents(project):
    reg, u = project["registry"], project["u"]
    project["recipe"](
        "house",
        f"""
        name: house
        image: {reg}/imgbuildtest/house-{u}:v1
        base: {project["base"]}
        env: {{LAYER: house}}
        """,
    )
    project["recipe"](
        "team",
        f"""
        name: team
        image: {reg}/imgbuildtest/team-{u}:v1
        base: {reg}/imgbuildtest/house-{u}:v1
        env: {{TEAM: one}}
        """,
    )
    project["recipe"](
        "solo",
        f"""
        name: solo
        image: {reg}/imgbuildtest/solo-{u}:v1
        base: {{framework: pytorch, tag: "24.05"}}
        env: {{SOLO: "1"}}
        """,
    )
    res, report = rebuild(project)
    assert res.code == 0, res.err
    assert statuses(report) == {"house": "built", "team": "built", "solo": "built"}
    order = [Path(i["recipe"]).stem for i in json.loads(report.read_text())["images"]]
    assert order.index("house") < order.index("team")
    assert (project["dir"] / "images" / "team" / "Dockerfile").is_file()

    res, report = rebuild(project)
    assert res.code == 0 and statuses(report) == {"house": "fresh", "team": "fresh", "solo": "fresh"}, res.err
    assert "building" not in res.err

    project["recipe"](
        "team",
        f"""
        name: team
        image: {reg}/imgbuildtest/team-{u}:v1
        base: {reg}/imgbuildtest/house-{u}:v1
        env: {{TEAM: two}}
        """,
    )
    res, report = rebuild(project)
    assert statuses(report) == {"house": "fresh", "team": "built", "solo": "fresh"}, res.err
    assert reasons(report)["team"] == "recipe or its files changed"

    project["recipe"](
        "house",
        f"""
        name: house
        image: {reg}/imgbuildtest/house-{u}:v1
        base: {project["base"]}
        env: {{LAYER: house2}}
        """,
    )
    res, report = rebuild(project)
    assert statuses(report) == {"house": "built", "team": "built", "solo": "fresh"}, res.err
    assert "moved" in reasons(report)["team"]

    # NGC publishes a new image under the followed tag: the recipes on it rebuild, the others do not.
    push_many_tags(reg, project["base_repo"], "nvidia/pytorch", "23.10-py3", ["1"])
    res, report = rebuild(project, "--dry-run")
    assert res.code == 0 and statuses(report) == {"house": "stale", "team": "fresh", "solo": "fresh"}
    assert f"base {project['base']} moved" in reasons(report)["house"]
    res, report = rebuild(project, "--jobs", "2")
    assert statuses(report) == {"house": "built", "team": "built", "solo": "fresh"}, res.err
    assert "imgbuild rebuild" in res.out and "BUILT" in res.out and "FRESH" in res.out


@pytest.mark.engine
def test_push_failures_and_reports(project, docker_client):
    reg, u = project["registry"], project["u"]
    for name in ("alpha", "beta"):
        project["recipe"](
            name,
            f"""
            name: {name}
            image: {reg}/imgbuildtest/{name}-{u}:v1
            base: {project["base"]}
            env: {{NAME: {name}}}
            """,
        )
    project["recipe"](
        "broken",
        f"""
        name: broken
        image: {reg}/imgbuildtest/broken-{u}:v1
        base: {project["base"]}
        run: ["echo about to fail && false"]
        """,
    )
    project["recipe"](
        "child",
        f"""
        name: child
        image: {reg}/imgbuildtest/child-{u}:v1
        base: {reg}/imgbuildtest/broken-{u}:v1
        """,
    )
    junit = project["dir"] / "junit.xml"
    res, report = rebuild(project, "--push", "--jobs", "2", "--junit-xml", str(junit))
    assert res.code == 1, res.err
    assert statuses(report) == {"alpha": "built", "beta": "built", "broken": "failed", "child": "skipped"}
    data = {Path(i["recipe"]).stem: i for i in json.loads(report.read_text())["images"]}
    assert "build failed at" in data["broken"]["error"] and "about to fail" in data["broken"]["error"]
    for name in ("alpha", "beta"):
        resp = requests.get(
            f"http://{reg}/v2/imgbuildtest/{name}-{u}/manifests/v1",
            timeout=10,
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        )
        assert resp.status_code == 200
        assert resp.headers["Docker-Content-Digest"] == data[name]["pushed_digest"]
    suite = ET.parse(junit).getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")
    failed = [case.get("name") for case in suite if case.find("failure") is not None]
    assert len(failed) == 1 and "broken.yaml" in failed[0]

    # Everything pushed and current: a second --push run builds and pushes nothing.
    (project["dir"] / "recipes" / "broken.yaml").unlink()
    (project["dir"] / "recipes" / "child.yaml").unlink()
    res, report = rebuild(project, "--push")
    assert res.code == 0 and statuses(report) == {"alpha": "fresh", "beta": "fresh"}, res.err


@pytest.mark.engine
def test_push_errors_reported_in_the_stream_fail_the_run(project):
    # Port 9 has no registry: the engine reports the failed push inside a 200 stream.
    project["recipe"](
        "lost",
        f"""
        name: lost
        image: 127.0.0.1:9/imgbuildtest/lost-{project["u"]}:v1
        base: {project["base"]}
        """,
    )
    res, report = rebuild(project, "--push")
    assert res.code == 1
    data = json.loads(report.read_text())["images"][0]
    assert data["status"] == "failed" and "push of 127.0.0.1:9/imgbuildtest/lost" in data["error"]


@pytest.mark.frontdoor
@pytest.mark.engine
def test_check_flags_recipes_whose_context_is_stale(project):
    project["recipe"]("one", f"name: one\nbase: {project['base']}\nenv: {{A: '1'}}\n")
    res = run_cli("render", "recipes/one.yaml", cwd=project["dir"])
    assert res.code == 0, res.err
    ok = run_cli("rebuild", "--check", cwd=project["dir"])
    assert ok.code == 0 and "FRESH" in ok.out, ok.err
    project["recipe"]("one", f"name: one\nbase: {project['base']}\nenv: {{A: '2'}}\n")
    project["recipe"]("two", f"name: two\nbase: {project['base']}\n")
    stale = run_cli("rebuild", "--check", "--json", cwd=project["dir"])
    assert stale.code == 1
    by_name = {Path(i["recipe"]).stem: i for i in json.loads(stale.out)["images"]}
    assert by_name["one"]["status"] == "stale" and "Dockerfile" in by_name["one"]["reasons"][0]
    assert by_name["two"]["status"] == "stale" and "never rendered" in by_name["two"]["reasons"][0]
    assert by_name["two"]["reasons"][-1] == "cure: imgbuild render recipes/two.yaml, then commit images/two"


def test_bump_moves_following_recipes_and_keeps_the_file_as_written(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        '# our lab image\nname: lab\nbase:\n  framework: pytorch\n  tag: "24.05"   # keep me\n'
        '  follow: "24.*"\npip: [einops]\n'
    )
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text('name: pinned\nbase: {framework: pytorch, tag: "24.05"}\n')
    tags = ["24.05-py3", "24.10-py3", "24.12-py3-igpu", "25.01-py3", "24.11-tf2-py3"]
    result = bump([path, pinned], tags_for=lambda fw: tags)
    assert [(r.current, r.newest, r.changed) for r in result] == [("24.05", "24.10-py3", True)]
    assert path.read_text() == (
        '# our lab image\nname: lab\nbase:\n  framework: pytorch\n  tag: "24.10"   # keep me\n'
        '  follow: "24.*"\npip: [einops]\n'
    )
    again = bump([path], tags_for=lambda fw: tags)
    assert again[0].changed is False


def test_bump_cli_against_fake_nvcr(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "lab.yaml"
    recipe.write_text("name: lab\nbase: {framework: pytorch, tag: 24.01-py3, follow: latest}\n")
    with FakeNvcr({"nvidia/pytorch": ["24.01-py3", "25.02-py3", "26.01-py3-igpu"]}) as fake:
        monkeypatch.setenv("IMGBUILD_NGC_REGISTRY", fake.host)
        dry = run_cli("bump", "--dry-run", "--json", cwd=tmp_path)
        assert dry.code == 0, dry.err
        assert json.loads(dry.out)[0]["newest"] == "25.02-py3" and "24.01-py3" in recipe.read_text()
        res = run_cli("bump", cwd=tmp_path)
        assert res.code == 0, res.err
    assert "tag: 25.02-py3, follow: latest" in recipe.read_text()


def test_ci_examples_parse_and_use_real_flags():
    import re

    import yaml

    root = Path(__file__).resolve().parent.parent / "docs" / "ci"
    for name in (
        "github-actions.yml",
        "gitlab-ci.yml",
        "github-actions-fanout.yml",
        "gitlab-fanout.yml",
        "gitlab-imgbuild-runner.yml",
    ):
        text = (root / name).read_text()
        yaml.safe_load(text)
        for command, flags in re.findall(r"imgbuild (rebuild|bump|validate|merge-reports)([^\n#]*)", text):
            helptext = run_cli(command, "--help").out
            for flag in re.findall(r"(--[a-z-]+)", flags):
                assert flag in helptext, f"{name}: imgbuild {command} has no {flag}"


def test_order_puts_each_recipe_after_what_it_builds_on_for_any_depth_and_names_a_cycle():
    """The rebuild order of a chain 5,000 recipes deep (one building on the next) is found without recursion, and
    a cycle is named by its recipes."""
    from imgbuild.ci.rebuild import Item, _topological
    from imgbuild.errors import UsageError

    def item(n: int, deps: list[str]) -> Item:
        return Item(Path(f"r{n}"), target=f"t{n}", deps=deps)

    chain = [item(n, [f"t{n + 1}"] if n < 4999 else []) for n in range(5000)]
    ordered = _topological(chain)
    assert [i.name for i in ordered] == [f"r{n}" for n in reversed(range(5000))]
    diamond = [item(0, ["t1", "t2"]), item(1, ["t3"]), item(2, ["t3"]), item(3, [])]
    assert [i.name for i in _topological(diamond)] == ["r3", "r1", "r2", "r0"]
    with pytest.raises(UsageError) as cycle:
        _topological([item(0, ["t1"]), item(1, ["t2"]), item(2, ["t0"])])
    assert str(cycle.value) == "recipes build on each other in a cycle: r0 -> r1 -> r2 -> r0"


@pytest.mark.parametrize(
    "name",
    [
        "x$(touch pwned).yaml",
        "a;touch pwned;.yaml",
        "two words.yaml",
        "-rf.yaml",
        "q'\"`id`.yaml",
        "é.yaml",
        "n\nl.yaml",
    ],
)
def test_every_command_that_lists_recipes_for_ci_refuses_a_path_a_script_could_split_or_run(
    tmp_path, monkeypatch, name
):
    """`rebuild` (and --plan, --check), `bump` and `reproduce` list recipes through one door: a name outside
    [A-Za-z0-9._/-] (or a part that starts with -) is one line naming it, never a plan's matrix entry."""
    from imgbuild.ci.rebuild import discover
    from imgbuild.errors import UsageError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "fine-1_2.v3.yaml").write_text("name: fine\n")
    assert [p.name for p in discover(["recipes"])] == ["fine-1_2.v3.yaml"]
    (tmp_path / "recipes" / name).write_text("name: x\n")
    for given in (["recipes"], [f"recipes/{name}"]):
        with pytest.raises(UsageError) as refused:
            discover(given)
        assert str(refused.value).startswith(repr(f"recipes/{name}") + ": a recipe's path CI passes on")
        assert "\n" not in str(refused.value)


def test_rebuild_plan_of_a_recipe_named_as_code_is_one_line_exit_2(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "x$(touch pwned).yaml").write_text("name: x\n")
    done = run_cli("rebuild", "--plan", "--json", cwd=tmp_path)
    assert done.code == 2 and done.out == "", done
    assert done.err.splitlines() == [
        "imgbuild: 'recipes/x$(touch pwned).yaml': a recipe's path CI passes on may hold only letters, digits and "
        ". _ / - (no part starting with -): rename the file or its folder"
    ]
    assert not (tmp_path / "pwned").exists()


def test_a_fresh_runner_never_judges_fresh_from_a_config_the_registry_served_falsely(tmp_path):
    """The tag holds the old image; read by its digest, the registry serves the new build's manifest (whose config
    carries the input hash this plan wants). The rebuild's registry check fails (exit 3, this image failed), never
    FRESH on bytes bound to nothing."""
    import hashlib

    from imgbuild.ci import rebuild as rb
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.errors import EXIT_ENVIRONMENT, RegistryCorrupt
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.recipe import load_recipe
    from tests.fake_registry import ServedRegistry
    from tests.support import demo_recipe, fake_inspect

    registry = ServedRegistry()
    try:
        recipe = demo_recipe(tmp_path)
        recipe.write_text(recipe.read_text() + f"image: {registry.host}/lab/demo\n")
        settings = load_settings({"user": "alice", "insecure_registries": [registry.host], "registry_deadline": 5})
        plan = make_plan(load_recipe(recipe), settings, fake_inspect)

        def image(input_hash: str) -> bytes:
            config = json.dumps({"config": {"Labels": {"org.imgbuild.input-hash": input_hash}}}).encode()
            config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
            registry.blobs[config_digest] = config
            return json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"digest": config_digest, "size": len(config)}, "layers": []}).encode()  # fmt: skip

        old = registry.put("lab/demo", "v1", image("sha256:old-inputs"), "application/vnd.oci.image.manifest.v1+json")
        registry.lies[old] = image(plan.input_hash)
        with pytest.raises(RegistryCorrupt) as info:
            rb.staleness(plan, FakeEngine(), settings, push=True)
        del registry.lies[old]
        assert rb.staleness(plan, FakeEngine(), settings, push=True) == ["never built here"]  # stale, honestly
    finally:
        registry.close()
    assert info.value.exit_code == EXIT_ENVIRONMENT and old in str(info.value)
