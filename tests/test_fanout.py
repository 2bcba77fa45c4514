"""`rebuild --plan` and `merge-reports`: the rebuild a CI system fans out across runners, wave by wave, and the
runners' reports joined into one. The reports are input like any other (a runner's file, an artefact)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from imgbuild.ci.fanout import merge, plan_document, read_report, waves
from imgbuild.ci.rebuild import BUILT, FAILED, FRESH, STALE, Item
from imgbuild.errors import UsageError
from tests.conftest import run_cli
from tests.cosign_keys import write_key_pair
from tests.support import imgbuild_here


def _item(name: str, status: str, deps: tuple[str, ...] = (), reasons: tuple[str, ...] = ()) -> Item:
    return Item(Path(f"recipes/{name}.yaml"), target=f"lab/{name}:1", deps=list(deps), status=status,
                reasons=list(reasons))  # fmt: skip


def test_the_plan_puts_each_image_after_the_rebuilt_images_it_builds_on():
    """Five recipes, three waves: a stale base, a child whose own inputs did not change (its base moves), a
    grandchild, an independent stale image; a fresh one is not planned."""
    items = [
        _item("grandchild", FRESH, ("lab/child:1",)),
        _item("child", FRESH, ("lab/base:1",)),
        _item("base", STALE, reasons=("recipe or its files changed",)),
        _item("alone", STALE, reasons=("never built here",)),
        _item("quiet", FRESH),
        _item("on-quiet", STALE, ("lab/quiet:1",), ("base moved",)),
    ]
    planned = waves(items)
    assert [[p.item.name for p in wave] for wave in planned] == [
        ["recipes/base.yaml", "recipes/alone.yaml", "recipes/on-quiet.yaml"],
        ["recipes/child.yaml"],
        ["recipes/grandchild.yaml"],
    ]
    assert planned[1][0].reasons == ("builds on lab/base:1, rebuilt in wave 1",)
    plan = plan_document(items)
    assert plan["images"] == 5 and plan["invalid"] == []
    assert plan["matrix"][1] == {"include": [{"recipe": "recipes/child.yaml"}]}  # GitHub's fromJSON takes it as is
    assert plan["waves"][0][0] == {
        "recipe": "recipes/base.yaml", "image": "lab/base:1", "wave": 1, "reasons": ["recipe or its files changed"],
        "after": [],
    }  # fmt: skip
    assert plan["waves"][2][0]["after"] == ["recipes/child.yaml"]  # the planned images it builds on: a CI's DAG


def test_a_plan_of_a_long_chain_is_linear_and_a_failed_judgement_is_named():
    chain = [_item("r0", STALE)] + [_item(f"r{n}", FRESH, (f"lab/r{n - 1}:1",)) for n in range(1, 3000)]
    assert len(waves(list(reversed(chain)))) == 3000
    broken = _item("broken", FAILED)
    broken.error = "recipes/broken.yaml:3:5: pip.packages[0]: not a requirement"
    assert plan_document([broken])["invalid"] == [{"recipe": "recipes/broken.yaml", "error": broken.error}]


def _report(tmp_path: Path, name: str, images: object) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"seconds": 1.0, "mode": "build", "images": images}))
    return path


def _row(recipe: str, status: str, **extra: object) -> dict:
    return {"recipe": recipe, "image": "lab/x:1", "status": status, "reasons": [], "error": "", "seconds": 1.5, **extra}


def test_merged_reports_keep_each_recipe_once_with_the_outcome_that_says_most(tmp_path):
    first = read_report(_report(tmp_path, "a.json", [_row("recipes/a.yaml", BUILT), _row("recipes/b.yaml", FRESH)]))
    second = read_report(_report(tmp_path, "b.json", [_row("recipes/b.yaml", FAILED, error="pip step failed")]))
    merged = merge([first, second])
    assert [(i.name, i.status) for i in merged] == [("recipes/a.yaml", BUILT), ("recipes/b.yaml", FAILED)]


def test_merge_reports_writes_one_report_and_one_junit_and_fails_on_a_failure(tmp_path):
    a = _report(tmp_path, "a.json", [_row("recipes/a.yaml", BUILT)])
    b = _report(tmp_path, "b.json", [_row("recipes/b.yaml", FAILED, error="build failed at the pip step")])
    done = run_cli("merge-reports", str(a), str(b), "--report-json", str(tmp_path / "all.json"),
                   "--junit-xml", str(tmp_path / "all.xml"), cwd=tmp_path)  # fmt: skip
    assert done.code == 1, done.err
    junit = (tmp_path / "all.xml").read_text()
    assert 'tests="2" failures="1"' in junit and "build failed at the pip step" in junit
    assert [i["status"] for i in json.loads((tmp_path / "all.json").read_text())["images"]] == [BUILT, FAILED]
    assert run_cli("merge-reports", str(a), cwd=tmp_path).code == 0


@pytest.mark.parametrize(
    "content, words",
    [
        (b"{not json", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
        (json.dumps({"images": {"a": 1}}).encode(), "not a report of imgbuild rebuild"),
        (json.dumps({"images": [_row("r", "x")] * 5001}).encode(), "not a report of imgbuild rebuild"),
        (json.dumps({"images": ["recipes/a.yaml"]}).encode(), "images[0]: not an object"),
        (json.dumps({"images": [_row("r", "pwned")]}).encode(), "images[0].status: 'pwned' is not one of"),
        (json.dumps({"images": [_row("r", BUILT, reasons="x")]}).encode(), "images[0].reasons: not a list"),
        (json.dumps({"images": [_row("r", BUILT, seconds=True)]}).encode(), "images[0].seconds"),
        (json.dumps({"images": [_row("r", BUILT, seconds=-1)]}).encode(), "images[0].seconds"),
        (json.dumps({"images": [_row("r", BUILT, seconds=1e300)]}).encode(), "images[0].seconds"),
        (json.dumps({"images": [_row("r\nFAKE", BUILT)]}).encode(), "images[0].recipe"),
        (json.dumps({"images": [_row("r", BUILT, image="lab/x\x1b[2J")]}).encode(), "images[0].image: not a line"),
        (json.dumps({"images": [_row("", BUILT)]}).encode(), "images[0].recipe"),
        (json.dumps({"images": [_row("r", BUILT, image="lab/x\x9b2J")]}).encode(), "images[0].image"),  # C1 CSI
        (json.dumps({"images": [_row("r", BUILT, image="lab/\u202ex")]}).encode(), "images[0].image"),  # bidi
        (json.dumps({"images": [_row("r", BUILT, reasons=["ok\x1b[2J"])]}).encode(), "images[0].reasons"),
        (json.dumps({"images": [_row("r", FAILED, error="a\nb\x1b]0;x")]}).encode(), "images[0].error"),
    ],
)
def test_a_hostile_report_is_one_line_naming_the_file_and_field(tmp_path, content, words):
    path = tmp_path / "runner.json"
    path.write_bytes(content)
    with pytest.raises(UsageError) as caught:
        read_report(path)
    assert words in str(caught.value) and str(path) in str(caught.value) and "\n" not in str(caught.value)
    # merged, it is a failed row of a JUnit file that is still written, and still XML
    done = run_cli("merge-reports", str(path), "--junit-xml", "m.xml", cwd=tmp_path)
    assert done.code == 1 and "Traceback" not in done.err
    failure = ET.parse(tmp_path / "m.xml").getroot().find("testcase/failure")
    assert failure is not None and words in failure.get("message", "")


def test_a_report_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        read_report(fifo)
    with pytest.raises(UsageError, match="No such file"):
        read_report(tmp_path / "absent.json")


def test_the_gitlab_child_pipeline_is_a_stage_per_wave_and_a_job_per_image_that_needs_its_parents():
    from imgbuild.ci.fanout import gitlab_child, plan_document

    items = [
        _item("parent", STALE, reasons=("inputs changed",)),
        _item("child", FRESH, deps=("lab/parent:1",)),
        _item("$(touch x) 'q'", STALE, reasons=("not in the registry",)),
    ]
    child = yaml.safe_load(gitlab_child(plan_document(items), ".gitlab/imgbuild-runner.yml"))
    assert child["include"] == [{"local": ".gitlab/imgbuild-runner.yml"}]
    assert child["stages"] == ["wave-1", "wave-2", "report"]
    jobs = {k: v for k, v in child.items() if k not in ("include", "stages")}
    parent, odd, kid = (k for k in jobs if k != "report")
    assert jobs[kid]["stage"] == "wave-2" and jobs[kid]["needs"] == [parent] and jobs[parent]["needs"] == []
    assert all(jobs[k]["extends"] == ".imgbuild-runner" for k in jobs)
    words = shlex.split(jobs[odd]["script"][0])
    assert words[:3] == ["imgbuild", "rebuild", "recipes/$(touch x) 'q'.yaml"]  # one word for the shell, never code
    assert jobs["report"]["stage"] == "report" and jobs["report"]["when"] == "always"
    write_plan, merge_line = jobs["report"]["script"]
    assert merge_line == (
        "imgbuild merge-reports report-1.json report-2.json report-3.json --plan plan.json --key cosign.pub "
        "--junit-xml rebuild.xml --report-json rebuild.json"
    )


def test_the_gitlab_child_pipelines_report_job_merges_against_the_plan_it_was_made_from(tmp_path):
    """The child's last job writes the plan into plan.json (as a shell runs its script line) and merges against it:
    the same rows, the waves read back by merge-reports' own reader."""
    import subprocess

    from imgbuild.ci.evidence import read_plan
    from imgbuild.ci.fanout import gitlab_child, plan_document
    from imgbuild.config.settings import load_settings

    items = [_item("parent", STALE), _item("child", FRESH, deps=("lab/parent:1",)), _item("other", STALE)]
    plan = plan_document(items)
    child = yaml.safe_load(gitlab_child(plan, ".gitlab/imgbuild-runner.yml", "keys/site.pub"))
    write_plan, merge_line = child["report"]["script"]
    subprocess.run(["bash", "-c", write_plan], cwd=tmp_path, check=True, timeout=10)
    read = read_plan(tmp_path / "plan.json", load_settings({"user": "alice"}, environ={}))
    assert [(r.recipe, r.image, r.wave, r.after) for r in read.rows] == [
        (row["recipe"], row["image"], row["wave"], tuple(row["after"])) for wave in plan["waves"] for row in wave
    ]
    assert "--plan plan.json --key keys/site.pub" in merge_line
    with pytest.raises(UsageError, match="--gitlab-key"):
        gitlab_child(plan, ".gitlab/imgbuild-runner.yml", "../outside.pub")


def test_merge_reports_with_a_plan_and_no_report_at_all_fails_every_planned_recipe_in_a_junit(
    tmp_path, capsys, monkeypatch
):
    plan = _plan_file(
        tmp_path, [[_planned("recipes/a.yaml", "lab/a:1", 1)], [_planned("recipes/b.yaml", "lab/b:1", 2)]]
    )
    monkeypatch.chdir(tmp_path)
    code, _, _ = imgbuild_here(capsys, "merge-reports", "--plan", str(plan), "--junit-xml", "m.xml")
    cases = ET.parse(tmp_path / "m.xml").getroot().findall("testcase")
    assert code == 1 and len(cases) == 2 and all(case.find("failure") is not None for case in cases)
    code, _, err = imgbuild_here(capsys, "merge-reports", "--junit-xml", "m.xml")
    assert code == 2 and "--plan" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("include", ["/etc/passwd", "../x.yml", "a/../../b.yml", "a b.yml", "", "x\n- remote: y"])
def test_the_child_pipelines_include_is_a_relative_file_of_the_repository(include):
    from imgbuild.ci.fanout import gitlab_child, plan_document
    from imgbuild.errors import UsageError

    with pytest.raises(UsageError, match="--gitlab-include"):
        gitlab_child(plan_document([]), include)


@pytest.mark.engine
@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_a_three_wave_plan_of_five_recipes_built_by_three_runners_merges_into_one_report(
    ci, testbed, tmp_path, cleanup_images, docker_client, unique
):
    """The plan a CI system fans out, on the bed: five recipes in three waves; each wave's recipes are built by
    different runners (each starting without the images it builds on, as a fresh runner does: it pulls them),
    and the three runners' reports merge into one; afterwards the plan is empty. GitHub: the plan's matrices, as
    docs/ci/github-actions-fanout.yml takes them; GitLab: the child pipeline `--gitlab-child` writes, its jobs
    played stage by stage, each job's script run as its runner's shell would split it."""
    registry = testbed["IMGBUILD_TESTBED_REGISTRY"]
    (tmp_path / ".git").mkdir()
    recipes = tmp_path / "recipes"
    recipes.mkdir()

    def recipe(name: str, base: str) -> None:
        (recipes / f"{name}.yaml").write_text(
            f"name: {name}\nimage: {registry}/fanout-{unique}/{name}\ntag: v1\nbase: {base}\nenv: {{WHO: {name}}}\n"
        )

    ngc = '{framework: pytorch, tag: "24.05"}'
    recipe("parent", ngc)
    recipe("other", ngc)
    recipe("child-a", f'{{image: "{registry}/fanout-{unique}/parent:v1"}}')
    recipe("child-b", f'{{image: "{registry}/fanout-{unique}/parent:v1"}}')
    recipe("grandchild", f'{{image: "{registry}/fanout-{unique}/child-a:v1"}}')
    targets = [f"{registry}/fanout-{unique}/{n}:v1" for n in ("parent", "other", "child-a", "child-b", "grandchild")]
    cleanup_images.extend(targets)
    planned = run_cli("rebuild", "--plan", "--json", cwd=tmp_path)
    assert planned.code == 0, planned.err
    plan = json.loads(planned.out)
    assert [sorted(r["recipe"] for r in wave) for wave in plan["waves"]] == [
        ["recipes/other.yaml", "recipes/parent.yaml"],
        ["recipes/child-a.yaml", "recipes/child-b.yaml"],
        ["recipes/grandchild.yaml"],
    ]

    def fresh_runner() -> None:  # nothing local
        for target in targets:
            docker_client.images.remove(target, force=True) if docker_client.images.list(target) else None

    if ci == "github":
        reports = []
        for wave in plan["matrix"]:
            for n, row in enumerate(wave["include"]):  # runner n builds the n-th recipe of each wave
                fresh_runner()
                report = tmp_path / f"runner{n}-{len(reports)}.json"
                built = run_cli("rebuild", row["recipe"], "--push", "--report-json", str(report), cwd=tmp_path)
                assert built.code == 0, built.err[-3000:]
                reports.append(str(report))
        merged = run_cli("merge-reports", *reports, "--json", "--junit-xml", str(tmp_path / "all.xml"), cwd=tmp_path)
    else:
        written = run_cli("rebuild", "--plan", "--gitlab-child", "child.yml", cwd=tmp_path)
        assert written.code == 0, written.err
        # the site's runner job (`.imgbuild-runner`) signs with the CI key; the report job checks by its pair
        private, _ = write_key_pair(tmp_path, b"child-pw")
        signing = {"IMGBUILD_SIGN_KEY": str(private), "IMGBUILD_SIGN_PASSWORD": "child-pw"}
        child = yaml.safe_load((tmp_path / "child.yml").read_text())
        jobs = {k: v for k, v in child.items() if k not in ("include", "stages")}
        assert child["stages"] == ["wave-1", "wave-2", "wave-3", "report"]
        done: list[str] = []
        for stage in child["stages"][:-1]:
            for name, job in jobs.items():
                if job["stage"] != stage:
                    continue
                assert set(job["needs"]) <= set(done), (name, job["needs"])  # its parents' jobs ran before it
                fresh_runner()
                (command,) = job["script"]
                words = shlex.split(command)
                assert words[0] == "imgbuild"
                built = run_cli(*words[1:], cwd=tmp_path, env=signing)
                assert built.code == 0, built.err[-3000:]
                done.append(name)
        *preparing, merge_command = jobs["report"]["script"]  # the plan it was made from, written first
        for line in preparing:
            subprocess.run(["bash", "-c", line], cwd=tmp_path, check=True, timeout=60)
        merged = run_cli(*shlex.split(merge_command)[1:], "--json", cwd=tmp_path)
        assert merged.code == 0, merged.err
        (tmp_path / "all.xml").write_text((tmp_path / "rebuild.xml").read_text())
    assert merged.code == 0, merged.err
    images = json.loads(merged.out)["images"]
    assert sorted(i["recipe"] for i in images if i["status"] == "built") == sorted(
        f"recipes/{n}.yaml" for n in ("parent", "other", "child-a", "child-b", "grandchild")
    )
    assert 'tests="5" failures="0"' in (tmp_path / "all.xml").read_text()
    again = json.loads(run_cli("rebuild", "--plan", "--json", cwd=tmp_path).out)
    assert again["images"] == 0 and again["invalid"] == []


# --- reports and plans as evidence: checked against the plan and the registry --------------------------------


@pytest.fixture
def served():
    from tests.fake_registry import ServedRegistry

    registry = ServedRegistry()
    yield registry
    registry.close()


def _pushed(registry, repo: str, tag: str, signer=None, content: str = "", base_ref: str = "", mark: str = "") -> str:
    """An image at `repo:tag` in `registry` (`mark` tells two apart) and, with `signer`, what imgbuild attaches to a
    build it signs: the signature, the provenance (the recipe's `content` hash; built on what `base_ref`, by default
    lab/base:1 of `registry`, holds now), the SBOM; its digest."""
    from imgbuild import imageref
    from imgbuild.registry.client import RegistryClient
    from imgbuild.supply import attest

    body = json.dumps({"schemaVersion": 2, "mediaType": attest.OCI_MANIFEST, "repo": repo, "mark": mark}).encode()
    digest = registry.put(repo, tag, body, attest.OCI_MANIFEST)
    if signer is not None:
        if not base_ref:
            base_ref = f"{registry.host}/lab/base:1"
            if ("lab/base", "1") not in registry.tags:
                registry.put("lab/base", "1", b'{"base": 1}', attest.OCI_MANIFEST)
        base = imageref.parse(base_ref)
        made = attest.Made(
            image=f"{registry.host}/{repo}", digest=digest, tag=tag, recipe_path=f"recipes/{repo}.yaml",
            recipe_sha256="sha256:" + "c" * 64, content_hash=content or "sha256:" + "7" * 64, git_commit=None,
            lock_path=None, lock_sha256=None, base_ref=base_ref, base_digest=registry.tags[(base.path, base.tag)],
            added=(), hashes={}, apt=(), files={}, builder={}, imgbuild_version="0", smoke={"ok": True}, fleet=(),
        )  # fmt: skip
        client = RegistryClient(registry.host, insecure=True, retries=0, timeout=3, command_seconds=10)
        attest.publish(client, repo, digest, attest.attachments(made, signer))
    return digest


def _plan_file(tmp_path: Path, waves_: list[list[dict]]) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"waves": waves_, "matrix": [], "images": 0, "invalid": []}))
    return path


def _planned(recipe: str, image: str, wave: int, after: tuple[str, ...] = ()) -> dict:
    return {"recipe": recipe, "image": image, "wave": wave, "reasons": [], "after": list(after)}


def test_merge_reports_with_a_plan_fails_forged_unplanned_missing_and_unsigned_rows_in_a_valid_junit(
    tmp_path, served, capsys, monkeypatch
):
    import xml.etree.ElementTree as ET

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from imgbuild.supply import attest

    key = ec.generate_private_key(ec.SECP256R1())
    signer = attest.Signer(key)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "cosign.pub").write_bytes(public)
    img = {n: f"{served.host}/lab/{n}:v1" for n in ("a", "b", "c", "d", "e")}
    good = _pushed(served, "lab/a", "v1", signer)
    unsigned = _pushed(served, "lab/d", "v1")
    plan = _plan_file(tmp_path, [
        [_planned("recipes/a.yaml", img["a"], 1), _planned("recipes/b.yaml", img["b"], 1),
         _planned("recipes/d.yaml", img["d"], 1), _planned("recipes/e.yaml", img["e"], 1)],
        [_planned("recipes/c.yaml", img["c"], 2, ("recipes/a.yaml",))],
    ])  # fmt: skip
    honest = _report(tmp_path, "honest.json", [
        _row("recipes/a.yaml", BUILT, image=img["a"], pushed_digest=good),
        _row("recipes/d.yaml", BUILT, image=img["d"], pushed_digest=unsigned),
        _row("recipes/e.yaml", FRESH, image=img["e"]),  # fresh, says the runner: nothing is there
    ])  # fmt: skip
    hostile = _report(tmp_path, "hostile.json", [
        _row("recipes/b.yaml", BUILT, image=img["b"], pushed_digest="sha256:" + "6" * 64),  # nobody pushed it
        _row('recipes/never-planned<x>&"]]>.yaml', BUILT, image=img["a"], pushed_digest=good),
        _row("::error file=README.md,line=1::forged", FRESH, image=img["a"]),
    ])  # fmt: skip
    # a noncharacter is no text at all: the report holding it is refused whole, as a failed row of its own
    unreadable = _report(tmp_path, "unreadable.json", [_row("recipes/x\uffff.yaml", BUILT, image=img["a"])])
    junit = tmp_path / "merged.xml"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    code, out, err = imgbuild_here(capsys, "merge-reports", str(honest), str(hostile), str(unreadable), str(tmp_path / "died.json"),
                               "--plan", str(plan), "--key", str(tmp_path / "cosign.pub"), "--junit-xml", str(junit))  # fmt: skip
    assert code == 1, err
    assert not any(line.lstrip().startswith("::") for line in out.splitlines())
    cases = {
        case.get("name", "").split(" (")[0]: case.find("failure") for case in ET.parse(junit).getroot().iter("testcase")
    }
    failed = {name: f.get("message") for name, f in cases.items() if f is not None}
    assert set(cases) - set(failed) == {"recipes/a.yaml"}  # the one row the plan and the registry bear out
    assert "holds" in failed["recipes/b.yaml"] and "6666" in failed["recipes/b.yaml"]
    assert "not signed" in failed["recipes/d.yaml"]
    assert "holds nothing" in failed["recipes/e.yaml"]
    assert "no report names it" in failed["recipes/c.yaml"]
    assert "a recipe nobody planned" in failed["::error file=README.md,line=1::forged"]
    assert any("nobody planned" in message and "never-planned" in name for name, message in failed.items())
    assert any("died.json" in name for name in failed)  # the report that never came is a failed row too
    assert any("unreadable.json" in name for name in failed)


def test_merge_reports_with_a_key_believes_only_this_plans_build_not_an_old_signed_image(
    tmp_path, served, capsys, monkeypatch
):
    """A runner that re-reports a stale image as "fresh", or its old digest as "built", and a child built on its
    parent's old image: each image is signed by the key, and each was merged green on that signature. The image a
    row stands for must carry a signed provenance of the recipe as it is here, built on what its planned parent
    holds now; the honest rows still merge."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from imgbuild.pipeline.plan import content_hash
    from imgbuild.recipe import load_recipe
    from imgbuild.supply import attest

    key = ec.generate_private_key(ec.SECP256R1())
    signer = attest.Signer(key)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "cosign.pub").write_bytes(public)
    img = {n: f"{served.host}/lab/{n}:v1" for n in ("edited", "parent", "child", "pinned")}
    (tmp_path / "recipes").mkdir()
    base = '{framework: pytorch, tag: "24.05"}'
    first_base = served.put("lab/base", "1", b'{"base": 1}', attest.OCI_MANIFEST)
    pin = f'{{image: "{served.host}/lab/base:1@{first_base}"}}'
    for name, from_ in (
        ("edited", base),
        ("parent", base),
        ("child", f'{{image: "{img["parent"]}"}}'),
        ("pinned", pin),
    ):
        (tmp_path / f"recipes/{name}.yaml").write_text(
            f"name: {name}\nimage: {served.host}/lab/{name}\ntag: v1\nbase: {from_}\n"
        )
    here = {n: content_hash(load_recipe(tmp_path / f"recipes/{n}.yaml")) for n in img}
    old_edited = _pushed(served, "lab/edited", "v1", signer, content="sha256:" + "0" * 64)  # the recipe changed since
    old_parent = _pushed(served, "lab/parent", "v1", signer, content=here["parent"], mark="old")
    on_old = _pushed(served, "lab/child", "v1", signer, content=here["child"], base_ref=img["parent"])
    new_parent = _pushed(served, "lab/parent", "v1", signer, content=here["parent"], mark="new")
    pinned = _pushed(served, "lab/pinned", "v1", signer, content=here["pinned"])  # on lab/base:1 as pinned
    plan = _plan_file(tmp_path, [
        [_planned("recipes/edited.yaml", img["edited"], 1), _planned("recipes/parent.yaml", img["parent"], 1),
         _planned("recipes/pinned.yaml", img["pinned"], 1)],
        [_planned("recipes/child.yaml", img["child"], 2, ("recipes/parent.yaml",))],
    ])  # fmt: skip
    monkeypatch.chdir(tmp_path)

    def merged(rows: list[dict]) -> dict[str, str | None]:
        report = _report(tmp_path, "r.json", rows)
        imgbuild_here(
            capsys, "merge-reports", str(report), "--plan", str(plan), "--key", "cosign.pub", "--junit-xml", "m.xml"
        )
        cases = ET.parse(tmp_path / "m.xml").getroot().iter("testcase")
        failures = {c.get("name", "").split(" (")[0]: c.find("failure") for c in cases}
        return {name: None if f is None else f.get("message") for name, f in failures.items()}

    parent_row = _row("recipes/parent.yaml", BUILT, image=img["parent"], pushed_digest=new_parent)
    pinned_row = _row("recipes/pinned.yaml", FRESH, image=img["pinned"], pushed_digest=pinned)
    said = merged([
        _row("recipes/edited.yaml", FRESH, image=img["edited"]), parent_row,
        _row("recipes/child.yaml", BUILT, image=img["child"], pushed_digest=on_old),
    ])  # fmt: skip
    assert said["recipes/parent.yaml"] is None  # the honest row
    assert "as it was then" in (said["recipes/edited.yaml"] or "")
    assert f"was built on {img['parent']}@{old_parent}" in (said["recipes/child.yaml"] or "")
    assert f"not on what it holds now ({new_parent})" in (said["recipes/child.yaml"] or "")
    as_built = merged([_row("recipes/edited.yaml", BUILT, image=img["edited"], pushed_digest=old_edited), parent_row])
    assert "as it was then" in (as_built["recipes/edited.yaml"] or "")
    on_new = _pushed(served, "lab/child", "v1", signer, content=here["child"], base_ref=img["parent"])
    edited = _pushed(served, "lab/edited", "v1", signer, content=here["edited"])
    honest = merged([
        _row("recipes/edited.yaml", BUILT, image=img["edited"], pushed_digest=edited), parent_row, pinned_row,
        _row("recipes/child.yaml", FRESH, image=img["child"], pushed_digest=on_new),
    ])  # fmt: skip
    assert honest == dict.fromkeys(["recipes/edited.yaml", "recipes/parent.yaml", "recipes/pinned.yaml",
                                    "recipes/child.yaml"])  # fmt: skip
    moved = served.put("lab/base", "1", b'{"base": 2}', attest.OCI_MANIFEST)  # the base the parent was built on moved
    after_move = merged([parent_row, pinned_row])
    stale = after_move["recipes/parent.yaml"] or ""
    assert f"was built on {served.host}/lab/base:1@" in stale and f"not on what it holds now ({moved})" in stale
    assert after_move["recipes/pinned.yaml"] is None  # built on the digest its recipe pins, wherever the tag went


def test_a_plan_whose_waves_are_out_of_dependency_order_is_refused_with_a_junit_still_written(
    tmp_path, served, monkeypatch, capsys
):
    from imgbuild.ci.evidence import read_plan
    from imgbuild.config.settings import load_settings

    settings = load_settings({"user": "alice"})
    parent, child = f"{served.host}/lab/parent:v1", f"{served.host}/lab/child:v1"
    swapped = _plan_file(tmp_path, [[_planned("recipes/child.yaml", child, 1, ("recipes/parent.yaml",))],
                                    [_planned("recipes/parent.yaml", parent, 2)]])  # fmt: skip
    with pytest.raises(UsageError, match="recipes/child.yaml is planned in wave 1 but builds on recipes/parent"):
        read_plan(swapped, settings)
    # the plan's own word removed too: the recipes, read where they are, say who builds on whom
    (tmp_path / "recipes").mkdir()
    base = '{framework: pytorch, tag: "24.05"}'
    (tmp_path / "recipes/parent.yaml").write_text(
        f"name: parent\nimage: {served.host}/lab/parent\ntag: v1\nbase: {base}\n"
    )
    (tmp_path / "recipes/child.yaml").write_text(f'name: child\nimage: {served.host}/lab/child\ntag: v1\nbase: {{image: "{parent}"}}\n')  # fmt: skip
    silent = _plan_file(tmp_path, [[_planned("recipes/child.yaml", child, 1)], [_planned("recipes/parent.yaml", parent, 2)]])  # fmt: skip
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="out of dependency order"):
        read_plan(Path("plan.json"), settings)
    report = _report(tmp_path, "r.json", [_row("recipes/parent.yaml", FRESH, image=parent)])
    code, _, err = imgbuild_here(capsys, "merge-reports", str(report), "--plan", str(silent), "--junit-xml", "m.xml")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "out of dependency order" in err
    assert 'failures="1"' in (tmp_path / "m.xml").read_text()


def test_a_report_with_a_lone_surrogate_or_a_noncharacter_still_merges_into_valid_xml_and_a_table(
    tmp_path, capsys, monkeypatch
):
    report = tmp_path / "r.json"  # written as a runner's JSON escapes would carry them
    report.write_text(
        '{"images": [{"recipe": "recipes/a\\uffff.yaml", "image": "lab/a:1", "status": "failed", '
        '"error": "lone \\ud800 surrogate", "reasons": [], "seconds": 1}]}'
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = imgbuild_here(capsys, "merge-reports", str(report), "--junit-xml", "m.xml")
    assert code == 1 and "unexpected" not in err, err
    failure = ET.parse(tmp_path / "m.xml").getroot().find("testcase/failure")  # XML 1.0, whatever the report held
    assert failure is not None
    for text in (out, err, (tmp_path / "m.xml").read_text()):  # merged as a failure, or refused as one: never raw
        assert "\ud800" not in text and "\uffff" not in text


def _under_github_actions(*argv: str) -> tuple[int, str, str]:
    """imgbuild's entry point in this process under GitHub Actions, its streams UTF-8 as a runner's are (a lone
    surrogate printed raises there): (exit code, stdout, stderr)."""
    import contextlib
    import io
    from unittest import mock

    from imgbuild.cli import main

    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))
    github = mock.patch.dict(os.environ, {"GITHUB_ACTIONS": "true"})
    with github, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ended:
        main(list(argv))
    return int(ended.value.code or 0), *(s.buffer.getvalue().decode() for s in (out, err))  # type: ignore[attr-defined]


#: What a hostile runner may write in any field: any text, and the pieces each sink reads as commands or markup.
_PIECES = ["::", "::error::", "::stop-commands::", "##[", "\n", "\r", "\r\n", "\x85", "\u2028", "\ud800", "\uffff",
           "\ufffe", "\x1b[31m", "\x00", "\x9b", "\u202e", "]]>", "<", "&", '"', "[bold]", "[/]", "%0A", " ", "/"]  # fmt: skip
_PLAIN = st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"))  # what a report may hold
_HOSTILE = st.builds(
    lambda lead, rest: lead + "".join(rest),
    st.sampled_from(["", *_PIECES]),
    st.lists(st.one_of(_PLAIN, _PLAIN, st.sampled_from(_PIECES), st.characters()), max_size=10),
)  # a piece at the start (where a sink reads a command), and in the middle; mostly text a report may hold


@settings(max_examples=30, derandomize=True, deadline=None, database=None)
@given(
    recipe=_HOSTILE, image=_HOSTILE, error=_HOSTILE, reason=_HOSTILE,
    status=st.one_of(st.sampled_from([BUILT, FRESH, FAILED, "skipped", STALE]), _HOSTILE),
)  # fmt: skip
def test_any_text_in_a_runners_report_is_escaped_for_every_sink(recipe, image, error, reason, status):
    """Whatever a runner writes in any field (surrogates, noncharacters, controls, `::` commands at a line's start,
    XML's own characters, markup), merge-reports ends 0 or 1 with a JUnit file the stdlib's XML parser reads, its
    table and lines encodable and terminal-safe, and no line of its output a GitHub workflow command."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        row = _row(recipe or "r", status, image=image, error=error, reasons=[reason])
        report = folder / "r.json"
        report.write_text(json.dumps({"images": [row, _row("recipes/ok.yaml", FRESH)]}))
        code, out, err = _under_github_actions("merge-reports", str(report), "--junit-xml", str(folder / "m.xml"))
        assert code in (0, 1), err
        cases = ET.parse(folder / "m.xml").getroot().findall("testcase")
    assert len(cases) in (1, 2)  # the two rows, or the refused report's one failed row
    for text in (out, err):
        text.encode("utf-8")
        for line in text.replace("\r", "\n").split("\n"):
            assert not line.lstrip().startswith("::") and "##[" not in line, line
            assert all(ch.isprintable() or ch == "\t" for ch in line), repr(line)


@settings(max_examples=40, derandomize=True, deadline=None, database=None)
@given(
    name=_HOSTILE, target=_HOSTILE, error=_HOSTILE, reason=_HOSTILE, status=st.sampled_from([BUILT, FAILED, "skipped"])
)
def test_any_text_of_a_rebuild_is_valid_xml_in_its_junit_file(name, target, error, reason, status):
    """The one JUnit writer, fed what a build's or a runner's text may hold (a lone surrogate, U+FFFF, controls,
    `]]>`): the stdlib's parser reads it, and every character it could keep is there as written."""
    from imgbuild.ci.outcome import junit_xml

    item = Item(Path("recipes") / (name.replace("\x00", "") or "r"), target=target, status=status, error=error)
    item.reasons = [reason]
    case = ET.fromstring(junit_xml([item], 1.0).encode("utf-8")).find("testcase")
    assert case is not None
    kept = "".join(ch if ch in "\t\n\r" or (ch >= " " and ch not in "\ufffe\uffff" and not "\ud800" <= ch <= "\udfff")
                   else "\ufffd" for ch in error)  # fmt: skip
    if status == FAILED and error:
        assert (case.findtext("failure") or "").replace("\r\n", "\n") == kept.replace("\r\n", "\n").replace("\r", "\n")


@pytest.mark.parametrize("recipe", ["recipes/x$(touch pwned).yaml", "recipes/-rf.yaml", "", "recipes/a b.yaml"])
def test_a_plan_naming_a_recipe_outside_what_ci_passes_on_is_refused_with_a_junit_still_written(
    tmp_path, capsys, monkeypatch, recipe
):
    """The plan is read by the rule it was written by (rebuild --plan refuses such names): one line, exit 2."""
    plan = _plan_file(tmp_path, [[_planned(recipe, "lab/a:1", 1)]])
    report = _report(tmp_path, "r.json", [_row("recipes/a.yaml", FRESH)])
    monkeypatch.chdir(tmp_path)
    code, _, err = imgbuild_here(capsys, "merge-reports", str(report), "--plan", str(plan), "--junit-xml", "m.xml")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "waves[0][0].recipe" in err, err
    assert 'failures="1"' in (tmp_path / "m.xml").read_text()
