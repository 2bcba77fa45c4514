"""The CI files a CI engineer copies (docs/ci/ and what `imgbuild init --ci` writes) run as written and safely: each
is played here as GitHub Actions or GitLab CI would run it (tests/ciplay.py), against stub commands, with recipe
file names that are shell code; each passes zizmor (GitHub) and the CI system's own schema (check-jsonschema)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from imgbuild.pipeline.starter import ci_text
from tests.ciplay import Bed, Run, play_github, play_gitlab

ROOT = Path(__file__).resolve().parent.parent
CI = ROOT / "docs" / "ci"
GITHUB = [CI / "github-actions.yml", CI / "github-actions-fanout.yml"]
GITLAB = [CI / "gitlab-ci.yml", CI / "gitlab-fanout.yml"]
BIN = Path(sys.executable).parent

#: Recipe file names that are code to a shell that reads them as text (each a legal file name).
HOSTILE = [
    "recipes/x$(touch pwned).yaml",
    "recipes/a;touch pwned;.yaml",
    "recipes/q'\"`touch pwned`\"'.yaml",
    "recipes/b${IFS}$(touch${IFS}pwned).yaml",
]
#: What GitHub's context holds that anyone opening a pull request writes.
GITHUB_CONTEXT = {
    "event_name": "push",
    "ref": "refs/heads/main",
    "repository": "lab/images",
    "head_ref": "$(touch pwned)",
    "event": {"schedule": "17 3 * * *", "pull_request": {"title": "`touch pwned`", "body": "$(touch pwned)"}},
}
#: A GitLab project's CI/CD variables (COSIGN_KEY: a variable of type File, a path) and predefined ones.
GITLAB_PROJECT = {
    "IMGBUILD_PACKAGE": "https://files.example.org/imgbuild-0.1.0-py3-none-any.whl",
    "REGISTRY_USER": "bot",
    "REGISTRY_PASSWORD": "pw",
    "COSIGN_KEY": "/run/cosign.key",
    "COSIGN_PASSWORD": "pw",
    "CI_REGISTRY": "registry.example.org",
    "CI_REGISTRY_IMAGE": "registry.example.org/lab/images",
    "CI_REGISTRY_USER": "gitlab-ci-token",
    "CI_REGISTRY_PASSWORD": "token",
    "CI_PIPELINE_SOURCE": "push",
}


def _plan(waves: list[list[tuple[str, list[str]]]]) -> dict:
    """A plan in `rebuild --plan --json`'s shape: per wave, (recipe, the planned recipes it builds on)."""
    rows = [
        [
            {"recipe": r, "image": f"registry.example.org/lab/i{n}-{m}:1", "wave": n + 1, "reasons": [], "after": a}
            for m, (r, a) in enumerate(wave)
        ]
        for n, wave in enumerate(waves)
    ]
    return {
        "waves": rows,
        "matrix": [{"include": [{"recipe": row["recipe"]} for row in wave]} for wave in rows],
        "images": sum(map(len, rows)),
        "invalid": [],
    }


THREE_WAVES = _plan([[(HOSTILE[0], []), (HOSTILE[1], [])], [(HOSTILE[2], [HOSTILE[0]])], [(HOSTILE[3], [HOSTILE[2]])]])


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository as a checkout brings it: recipes under hostile names, the public key, the runner's set-up."""
    root = tmp_path / "repo"
    for name in [*HOSTILE, "recipes/demo.yaml"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("name: demo\n")
    (root / "cosign.pub").write_text("key\n")
    return root


def _init_output(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"init-{kind}.yml"
    path.write_text(ci_text(kind, Path("recipes/demo.yaml"), "demo"))
    return path


def _assert_names_stayed_words(run: Run) -> None:
    """Nothing named pwned was made, and each hostile name reached imgbuild as one argument, whole."""
    assert run.made("pwned") == [], "\n".join(run.output)
    for call in run.calls():
        for arg in call:
            assert not any(h in arg for h in HOSTILE) or arg in HOSTILE, (call, arg)
            assert "pwned" not in arg or arg in HOSTILE, (call, arg)


def _github(tmp_path: Path, repo: Path, workflow: Path, plan: dict = THREE_WAVES, fail: tuple[str, ...] = ()) -> Run:
    return play_github(workflow, Bed(tmp_path / "play", repo, plan, fail), GITHUB_CONTEXT)


def _gitlab(tmp_path: Path, repo: Path, pipeline: Path, plan: dict = THREE_WAVES) -> Run:
    local = {".gitlab/imgbuild-runner.yml": CI / "gitlab-imgbuild-runner.yml"}
    return play_gitlab(pipeline, Bed(tmp_path / "play", repo, plan), GITLAB_PROJECT, local)


CASES = [
    *[("github", p.name) for p in GITHUB],
    ("github", "init --ci github"),
    *[("gitlab", p.name) for p in GITLAB],
    ("gitlab", "init --ci gitlab"),
]


@pytest.mark.parametrize(("system", "which"), CASES)
def test_every_ci_file_runs_with_hostile_recipe_names_as_words_never_as_code(tmp_path, repo, system, which):
    """Played as its CI system runs it: nothing named pwned is made, each hostile name reaches imgbuild whole,
    every job succeeds, imgbuild goes into a venv, every push signs and a verify step checks."""
    path = _init_output(tmp_path, system) if which.startswith("init") else CI / which
    run = _github(tmp_path, repo, path) if system == "github" else _gitlab(tmp_path, repo, path)
    _assert_names_stayed_words(run)
    assert set(run.jobs.values()) == {"success"}, (run.jobs, "\n".join(run.output[-5:]))
    calls = run.calls()
    pip = run.calls("pip")
    assert pip and all(c[0] == "install" for c in pip)  # into the job's venv: PEP 668 refuses the system's
    pushing = [c for c in calls if "--push" in c]
    assert pushing and all("--sign-key" in c for c in pushing), pushing
    assert any(c[0] == "verify" for c in calls)
    if "fanout" in which:  # every planned recipe built by a runner (a child job) of its own, and verified
        assert sorted(c[1] for c in pushing if c[0] == "rebuild") == sorted(HOSTILE)
        assert sorted(c[c.index("--recipe") + 1] for c in calls if c[0] == "verify") == sorted(HOSTILE)
        merges = [c for c in calls if c[0] == "merge-reports"]  # every report checked against the plan and the key
        assert merges and all("--plan" in c and "--key" in c for c in merges), merges


@pytest.mark.parametrize("which", [*[p.name for p in GITHUB], "init --ci github"])
def test_no_github_script_holds_an_expression(tmp_path, which):
    """Every value, a secret's too, reaches a `run:` through `env:`: GitHub splices an expression into the script's
    text before the shell reads it."""
    import yaml

    path = _init_output(tmp_path, "github") if which.startswith("init") else CI / which
    jobs = yaml.safe_load(path.read_text())["jobs"]
    scripts = [step["run"] for job in jobs.values() for step in job["steps"] if "run" in step]
    assert scripts and not [s for s in scripts if "${{" in s]


def test_the_play_would_catch_a_name_spliced_into_a_script(tmp_path, repo):
    """The harness runs what the CI system would: a matrix value pasted into `run:` (GitHub splices it into the
    script's text) or a name written into a GitLab script unquoted makes `pwned`."""
    spliced = tmp_path / "spliced.yml"
    text = (CI / "github-actions-fanout.yml").read_text()
    spliced.write_text(text.replace('imgbuild rebuild "$RECIPE"', 'imgbuild rebuild "${{ matrix.recipe }}"'))
    assert _github(tmp_path / "gh", repo, spliced).made("pwned")
    written = tmp_path / "written.yml"  # a child pipeline that wrote the name into its script unquoted
    written.write_text("job: {script: ['imgbuild rebuild recipes/a;touch pwned;.yaml --push']}\n")
    assert _gitlab(tmp_path / "gl", repo, written).made("pwned")


def test_the_gitlab_runner_set_up_names_the_image_namespace_and_registry():
    import yaml

    runner = yaml.safe_load((CI / "gitlab-imgbuild-runner.yml").read_text())[".imgbuild-runner"]
    assert runner["variables"]["IMGBUILD_USER"] and runner["variables"]["IMGBUILD_IMAGE_REGISTRY"]


def test_the_github_fanout_fails_the_plan_when_it_has_more_waves_than_wave_jobs(tmp_path, repo):
    deep = _plan([[(f"recipes/r{n}.yaml", [f"recipes/r{n - 1}.yaml"] if n else [])] for n in range(4)])
    run = _github(tmp_path, repo, CI / "github-actions-fanout.yml", deep)
    assert run.jobs["plan"] == "failure"
    assert "::error::the plan has 4 waves; this workflow builds 3" in "\n".join(run.output)
    assert not any(c[:1] == ["rebuild"] and "--push" in c for c in run.calls())


@pytest.mark.parametrize("which", ["github-actions.yml", "github-actions-fanout.yml", "init --ci github"])
def test_an_unset_image_namespace_stops_a_github_workflow_before_any_push(tmp_path, repo, which):
    path = _init_output(tmp_path, "github") if which.startswith("init") else CI / which
    variables = {"IMGBUILD_PACKAGE": "https://files.example.org/imgbuild.whl", "IMAGE_REGISTRY": "r.example.org"}
    run = play_github(path, Bed(tmp_path / "play", repo, THREE_WAVES), GITHUB_CONTEXT, variables)
    assert "::error::set the repository variable" in "\n".join(run.output)
    assert not [c for c in run.calls() if "--push" in c or "--plan" in c]


def test_a_failed_github_fanout_recipe_stops_only_what_builds_on_it_and_fails_the_report(tmp_path, repo):
    plan = _plan(
        [
            [("recipes/parent.yaml", []), ("recipes/other.yaml", [])],
            [("recipes/child.yaml", ["recipes/parent.yaml"]), ("recipes/second.yaml", ["recipes/other.yaml"])],
        ]
    )
    run = _github(tmp_path, repo, CI / "github-actions-fanout.yml", plan, fail=("recipes/parent.yaml",))
    built = [c[1] for c in run.calls() if c[:1] == ["rebuild"] and "--push" in c]
    assert "recipes/second.yaml" in built and "recipes/child.yaml" not in built  # unrelated work goes on
    log = "\n".join(run.output)
    assert "recipes/child.yaml: not built: its base did not build: recipes/parent.yaml" in log
    assert run.jobs["report"] == "failure"  # the runner that died wrote no report: a failed row of the one JUnit file
    assert any(c[0] == "merge-reports" and "--junit-xml" in c and "--plan" in c for c in run.calls())


def test_a_failed_gitlab_child_job_stops_only_the_images_built_on_it_and_the_report_still_runs(tmp_path, repo):
    plan = _plan(
        [
            [("recipes/parent.yaml", []), ("recipes/other.yaml", [])],
            [("recipes/child.yaml", ["recipes/parent.yaml"]), ("recipes/second.yaml", ["recipes/other.yaml"])],
        ]
    )
    local = {".gitlab/imgbuild-runner.yml": CI / "gitlab-imgbuild-runner.yml"}
    bed = Bed(tmp_path / "play", repo, plan, fail=("recipes/parent.yaml",))
    run = play_gitlab(CI / "gitlab-fanout.yml", bed, GITLAB_PROJECT, local)
    built = [c[1] for c in run.calls() if c[:1] == ["rebuild"] and "--push" in c]
    assert sorted(built) == ["recipes/other.yaml", "recipes/parent.yaml", "recipes/second.yaml"]
    # the report still runs, and fails: the planned recipes no runner reported are failed rows of its JUnit file
    assert run.jobs["report"] == "failure" and any(c[0] == "merge-reports" and "--plan" in c for c in run.calls())
    assert run.jobs["build"] == "failure" and run.jobs["verify"] == "skipped"


def _zizmor(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "zizmor"), "--offline", "--no-progress", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_zizmor_finds_nothing_in_any_github_workflow(tmp_path):
    done = _zizmor(*GITHUB, _init_output(tmp_path, "github"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_zizmor_would_find_a_matrix_value_pasted_into_a_script(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(
        (CI / "github-actions-fanout.yml")
        .read_text()
        .replace('imgbuild verify "$IMAGE"', 'imgbuild verify "${{ matrix.image }}"')
    )
    done = _zizmor(bad)
    assert done.returncode != 0 and "template-injection" in done.stdout + done.stderr


def _scripts(path: Path, system: str) -> list[str]:
    """Every script text the CI system hands a shell: GitHub's `run:` steps, GitLab's `before_script:` and
    `script:` lines."""
    import yaml

    data = yaml.safe_load(path.read_text())
    if system == "github":
        return [step["run"] for job in data["jobs"].values() for step in job["steps"] if "run" in step]
    jobs = [job for job in data.values() if isinstance(job, dict)]
    return [line for job in jobs for key in ("before_script", "script") for line in job.get(key) or []]


def _shellcheck(scripts: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    """shellcheck itself (every severity, bash as the runners run it) over `scripts`, one file each; but SC2016
    (a `$` left as it is in single quotes), which is what quoting a hostile file name for the shell is meant to do."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for n, script in enumerate(scripts):
        files.append(folder / f"script-{n}.sh")
        files[-1].write_text(script + "\n")
    return subprocess.run(
        [str(BIN / "shellcheck"), "--shell=bash", "--format=gcc", "--exclude=SC2016", *map(str, files)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_shellcheck_finds_nothing_in_any_script_of_any_ci_file(tmp_path):
    """Every script of docs/ci/, of both `init --ci` files and of the GitLab child pipeline of a plan."""
    from imgbuild.ci.fanout import gitlab_child

    child = tmp_path / "child.yml"
    child.write_text(gitlab_child(THREE_WAVES, ".gitlab/imgbuild-runner.yml"))
    files = [*((p, "github") for p in GITHUB), (_init_output(tmp_path, "github"), "github")]
    files += [(p, "gitlab") for p in (*GITLAB, CI / "gitlab-imgbuild-runner.yml", _init_output(tmp_path, "gitlab"))]
    scripts = [script for path, system in [*files, (child, "gitlab")] for script in _scripts(path, system)]
    assert len(scripts) > 40
    done = _shellcheck(scripts, tmp_path / "scripts")
    assert done.returncode == 0, done.stdout + done.stderr


def test_shellcheck_would_find_a_variable_left_unquoted(tmp_path):
    done = _shellcheck(["imgbuild rebuild $RECIPE --push"], tmp_path)
    assert done.returncode != 0 and "SC2086" in done.stdout


def _schema(schema: str, *paths: Path) -> tuple[int, str]:
    """check-jsonschema's own command (in this process: its start is most of its time) on `paths`."""
    from check_jsonschema import main
    from click.testing import CliRunner

    done = CliRunner().invoke(main, ["--builtin-schema", schema, *map(str, paths)])
    return done.exit_code, done.output


def test_every_ci_file_is_valid_for_its_ci_systems_schema(tmp_path):
    code, said = _schema("vendor.github-workflows", *GITHUB, _init_output(tmp_path, "github"))
    assert code == 0, said
    runner = CI / "gitlab-imgbuild-runner.yml"
    code, said = _schema("vendor.gitlab-ci", *GITLAB, runner, _init_output(tmp_path, "gitlab"))
    assert code == 0, said


def test_the_schema_check_would_refuse_a_misspelt_key(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text((CI / "github-actions.yml").read_text().replace("runs-on:", "run-on:", 1))
    code, said = _schema("vendor.github-workflows", bad)
    assert code == 1 and "run-on" in said, said


def test_the_gitlab_child_pipeline_of_a_plan_is_valid_gitlab_ci(tmp_path):
    from imgbuild.ci.fanout import gitlab_child

    child = tmp_path / "child.yml"
    child.write_text(gitlab_child(THREE_WAVES, ".gitlab/imgbuild-runner.yml"))
    code, said = _schema("vendor.gitlab-ci", child)
    assert code == 0, said
