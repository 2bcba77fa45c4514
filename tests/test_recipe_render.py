"""Recipes, plans and rendering without an engine: the pure stages of the pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgbuild.config.settings import load_settings
from imgbuild.errors import RecipeError, UsageError
from imgbuild.pipeline.context import write_context
from imgbuild.pipeline.plan import make_plan
from imgbuild.pipeline.render import render
from imgbuild.recipe import load_recipe
from tests.support import DIGEST, fake_inspect, plan_for, render_context, settings

ROOT = Path(__file__).resolve().parent.parent


# --- recipe features -------------------------------------------------------------------------------


def test_extends_merges_lists_by_key_and_child_wins(write):
    write("files/a.txt", "a")
    write(
        "house.yaml",
        """
        name: house
        base: {framework: pytorch, tag: "24.05"}
        apt: [git, vim]
        pip: ["einops>=0.7", "rich"]
        env: {A: "1", B: "2"}
        files: [{src: files/a.txt, dest: /opt/a.txt}]
        """,
    )
    team = write(
        "team.yaml",
        """
        extends: house.yaml
        name: team
        apt: [vim, tmux]
        pip:
          packages: ["einops==0.8.0", "timm"]
        env: {B: "3", C: "4"}
        """,
    )
    recipe = load_recipe(team).recipe
    assert recipe.name == "team"
    assert recipe.apt == ["git", "vim", "tmux"]
    assert recipe.pip.packages == ["einops==0.8.0", "rich", "timm"]
    assert recipe.env == {"A": "1", "B": "3", "C": "4"}
    assert [f.dest for f in recipe.files] == ["/opt/a.txt"]


def test_parent_files_resolve_relative_to_the_parent(write, tmp_path):
    (tmp_path / ".git").mkdir()  # one repository holds both folders
    write("house/files/motd", "hello")
    write(
        "house/house.yaml",
        """
        name: house
        base: {framework: pytorch, tag: "24.05"}
        files: [{src: files/motd, dest: /etc/motd}]
        """,
    )
    child = write("teams/vision.yaml", "extends: ../house/house.yaml\nname: vision\n")
    loaded = load_recipe(child)
    assert loaded.file_sources["/etc/motd"] == (tmp_path / "house/files/motd").resolve()


def test_env_interpolation_with_defaults(write):
    path = write(
        "r.yaml",
        """
        name: demo-${TEAM}
        tag: ${TAG:-dev}
        base: {framework: pytorch, tag: "${NGC:-24.05}"}
        env: {LITERAL: "$$HOME", RUNTIME: "$PATH:/opt/bin"}
        """,
    )
    recipe = load_recipe(path, environ={"TEAM": "nlp"}).recipe
    assert recipe.name == "demo-nlp" and recipe.tag == "dev" and recipe.base.tag == "24.05"
    assert recipe.env == {"LITERAL": "$HOME", "RUNTIME": "$PATH:/opt/bin"}


def test_shorthands_and_yaml_version_floats(write):
    path = write(
        "r.yaml",
        """
        name: demo
        base: {framework: pytorch, tag: 24.10}
        pip: [einops]
        user: true
        env: {OMP_NUM_THREADS: 8}
        files: [{src: r.yaml, dest: /opt/r.yaml, mode: 0755}]
        """,
    )
    recipe = load_recipe(path).recipe
    assert recipe.base.tag == "24.10"  # not 24.1
    assert recipe.pip.packages == ["einops"]
    assert recipe.user is not None and recipe.user.name == "user"
    assert recipe.env["OMP_NUM_THREADS"] == "8"
    assert recipe.files[0].mode == "0755"


def test_schema_is_generated_from_the_model():
    from imgbuild.recipe import json_schema

    schema = json_schema()
    assert {"name", "base", "pip", "apt", "user", "files", "extends"} <= set(schema["properties"])
    committed = json.loads((ROOT / "docs" / "recipe.schema.json").read_text())
    assert committed == schema, "docs/recipe.schema.json is stale: imgbuild schema > docs/recipe.schema.json"


# --- settings ----------------------------------------------------------------------------------------


def test_settings_precedence_flag_env_file_default(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("user: fromfile\nngc_registry: mirror.file\nbackend: sdk\n")
    env = {"IMGBUILD_CONFIG": str(cfg), "IMGBUILD_NGC_REGISTRY": "mirror.env"}
    s = load_settings({"user": "fromflag"}, environ=env)
    assert (s.user, s.ngc_registry, s.backend, s.tag_cache_ttl) == ("fromflag", "mirror.env", "sdk", 6 * 3600)
    assert s.sources["user"] == "flag" and s.sources["ngc_registry"].startswith("env")
    assert s.sources["backend"].startswith("user config")


def test_bad_config_is_a_usage_error_naming_the_file(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("backend: turbo\n")
    with pytest.raises(UsageError, match="backend: must be one of"):
        load_settings(environ={"IMGBUILD_CONFIG": str(cfg)})
    cfg.write_text("colour: blue\n")
    with pytest.raises(UsageError, match=r"config\.yaml:1:1: colour: unknown setting"):
        load_settings(environ={"IMGBUILD_CONFIG": str(cfg)})


def test_secrets_are_masked_in_the_settings_view():
    s = load_settings(
        environ={"NGC_API_KEY": "nvapi-secret-value", "IMGBUILD_PIP_INDEX_URL": "https://bob:pa55word@pypi.corp/simple"}
    )
    view = json.dumps(s.public_view())
    assert "nvapi-secret-value" not in view and "pa55word" not in view
    assert {"nvapi-secret-value", "pa55word"} <= set(s.secrets())


# --- planning ----------------------------------------------------------------------------------------


def test_plan_pins_base_by_digest_and_protects_the_framework(write):
    plan = plan_for(write("r.yaml", 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\npip: [einops]\n'))
    assert plan.base.ref == "registry.test:5000/nvidia/pytorch:24.05-py3"
    assert plan.base.pinned.endswith("@" + DIGEST)
    # The release without the local label: NGC's env says 2.4.0a0+07cecf4, torch's metadata
    # 2.4.0a0+07cecf4168.nv24.5; `==2.4.0a0` admits it (and PyPI's 2.13.0 for 2.13.0+cu130), an exact local
    # pin would not. The base's own pins hold the exact build.
    assert plan.protected == ("torch==2.4.0a0",)
    assert plan.target == "alice/demo:latest"


def test_recipe_asking_for_another_torch_fails_naming_the_conflict(write):
    path = write("r.yaml", 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\npip:\n  - einops\n  - torch==2.3.0\n')
    with pytest.raises(RecipeError) as info:
        plan_for(path)
    text = str(info.value)
    assert "r.yaml:5:5: pip.packages[1]: torch==2.3.0 conflicts with the base's torch 2.4.0a0+07cecf4" in text
    assert info.value.exit_code == 2


def test_compatible_torch_spec_and_cuda_pins(write):
    ok = write("ok.yaml", 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\npip: ["torch>=2.0"]\n')
    assert plan_for(ok).protected == ("torch==2.4.0a0",)
    bad = write("bad.yaml", 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\npip: ["nvidia-cudnn-cu12==8.9"]\n')
    with pytest.raises(RecipeError, match="would replace a CUDA library of the base"):
        plan_for(bad)


def test_content_hash_follows_inputs(write):
    write("files/a.txt", "one")
    path = write(
        "r.yaml",
        """
        name: demo
        base: {framework: pytorch, tag: "24.05"}
        files: [{src: files/a.txt, dest: /opt/a.txt}]
        """,
    )
    first = plan_for(path)
    assert plan_for(path).content_hash == first.content_hash
    write("files/a.txt", "two")
    assert plan_for(path).content_hash != first.content_hash


def test_uid_resolution_prefers_recipe_then_setting(write):
    path = write("r.yaml", 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\nuser: {uid: 4242, gid: 4243}\n')
    assert (plan_for(path).uid, plan_for(path).gid) == (4242, 4243)
    path = write("s.yaml", 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\nuser: true\n')
    assert plan_for(path, uid=1500, gid=1501).uid == 1500


# --- rendering ---------------------------------------------------------------------------------------


def test_rendering_is_deterministic_and_ordered_for_caching(write, tmp_path):
    write("files/train.py", "print('hi')\n")
    path = write(
        "recipes/r.yaml",
        """
        name: demo
        base: {framework: pytorch, tag: "24.05"}
        apt: [git]
        pip: [einops]
        user: {name: dev}
        files: [{src: ../files/train.py, dest: /workspace/train.py, mode: "0755"}]
        env: {A: "x y", B: 'quote"d'}
        labels: {team: vision}
        cmd: [python3, /workspace/train.py]
        """,
    )
    plan = plan_for(path)
    one = render_context(plan, tmp_path / "out1")
    two = render_context(plan, tmp_path / "out2")
    files_one = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files_one == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    for rel in files_one:
        assert (one / rel).read_bytes() == (two / rel).read_bytes(), rel
    assert oct((one / "files/workspace/train.py").stat().st_mode & 0o777) == "0o755"
    dockerfile = (one / "Dockerfile").read_text()
    order = [
        dockerfile.index(s)
        for s in (
            "FROM ",
            "apt-get",
            "install.sh",  # the pip layer before the user's: the same whichever uid builds it
            "add-user.sh",
            "COPY --from=imgbuild-base-record",
            "COPY imgbuild/smoke/ /opt/imgbuild/smoke/",
            "COPY --chown",  # a copied file last of the layers: editing it rebuilds nothing else
            "ENV ",
            "LABEL ",
            "USER dev",
        )
    ]
    assert order == sorted(order), dockerfile
    assert 'B="quote\\"d"' in dockerfile
    assert "--mount=type=cache" in dockerfile and "--mount=type=secret" in dockerfile
    assert str(tmp_path) not in dockerfile, "host paths must not leak into the context"
    lock = json.loads((one / "imgbuild.lock.json").read_text())
    assert lock["base"]["digest"] == DIGEST and lock["recipe"] == "recipes/r.yaml"


def test_sdk_backend_renders_without_buildkit_syntax(write, tmp_path):
    path = write(
        "r.yaml", 'name: demo\nbase: {framework: pytorch, tag: "24.05"}\napt: [git]\npip: [einops]\nuser: true\n'
    )
    dockerfile = (render_context(plan_for(path), tmp_path / "ctx", "sdk") / "Dockerfile").read_text()
    assert "--mount" not in dockerfile
    assert "rm -rf /var/lib/apt/lists/*" in dockerfile and "PIP_NO_CACHE_DIR=1" in dockerfile


def test_committed_example_contexts_are_current():
    """images/ holds what `imgbuild render` writes for recipes/ (pinned to the bases recorded there)."""
    import dataclasses

    from imgbuild.ci.rebuild import FRESH, check_contexts

    settings = dataclasses.replace(load_settings(environ={}), images_dir=str(ROOT / "images"), uid=1000, gid=1000)
    items = check_contexts([str(ROOT / "recipes")], settings)
    assert len(items) >= 3
    stale = {item.name: item.reasons or item.error for item in items if item.status != FRESH}
    assert not stale, f"run imgbuild render for: {stale}"


def test_render_is_pure_and_its_readers_use_no_temporary_folders(write, tmp_path, monkeypatch):
    """render() computes a context in memory; `render --stdout` and `rebuild --check` write nothing."""
    import builtins
    import io
    import tempfile

    from imgbuild.pipeline.context import diff_context
    from imgbuild.pipeline.render import render

    write("files/a.txt", "a")
    path = write(
        "r.yaml",
        'name: pure\nbase: {framework: pytorch, tag: "24.05"}\npip: [einops]\n'
        "files: [{src: files/a.txt, dest: /opt/a.txt}]\n",
    )
    plan = plan_for(path)
    written = write_context(render(plan), tmp_path / "ctx")

    def no_temporary_folder(*args, **kwargs):
        raise AssertionError("a temporary folder was made")

    def read_only(real):
        def opener(file, mode="r", *args, **kwargs):
            assert not set(mode) & set("wax+"), f"{file} was opened for writing"
            return real(file, mode, *args, **kwargs)

        return opener

    monkeypatch.setattr(tempfile, "mkdtemp", no_temporary_folder)
    loaded = load_recipe(path)

    def no_file(file, *args, **kwargs):
        raise AssertionError(f"planning opened {file}")

    with monkeypatch.context() as m:  # planning reads no file at all: the loader read each one once
        m.setattr(builtins, "open", no_file)
        m.setattr(io, "open", no_file)
        again = make_plan(loaded, settings(), fake_inspect, host_ids=(1000, 1000))
    assert again.content_hash == plan.content_hash
    monkeypatch.setattr(builtins, "open", read_only(builtins.open))
    monkeypatch.setattr(io, "open", read_only(io.open))
    context = render(plan)
    assert {"Dockerfile", "imgbuild/pip/requirements.txt", "imgbuild.lock.json"} <= set(context.rendered)
    assert context.copies["files/opt/a.txt"][0] == (tmp_path / "files/a.txt").resolve()
    assert diff_context(context, written) == []
    (written / "Dockerfile").chmod(0o644)
    monkeypatch.undo()
    (written / "files/opt/a.txt").write_text("changed")
    (written / "extra").write_text("x")
    assert diff_context(render(plan), written) == ["extra", "files/opt/a.txt"]


def test_uv_is_installed_in_a_stage_of_its_own_and_mounted_into_the_pip_step(write):
    """uv (the default installer): a build stage installs the pinned uv; the pip step mounts it (never a layer of the
    image) with a cache of its own; the Engine API builder has no mounts, so it keeps pip."""
    from imgbuild.facts import UV_VERSION
    from imgbuild.pipeline.render import render

    plan = plan_for(
        write("r.yaml", 'name: d\nbase: {framework: pytorch, tag: "24.05"}\npip: {packages: [six], installer: uv}\n')
    )
    dockerfile = render(plan, "buildkit").text("Dockerfile")
    stack, record, stage, main = dockerfile.split("\nFROM ", 4)[1:]
    assert "AS imgbuild-stack" in stack
    assert "AS imgbuild-base-record" in record and "pip check" in record  # beside apt and pip, not before them
    assert stage.endswith(f"uv=={UV_VERSION}\n") and "AS imgbuild-uv" in stage
    assert "--mount=type=bind,from=imgbuild-uv,source=/opt/imgbuild-uv,target=/tmp/imgbuild-uv" in main
    assert "COPY --from=imgbuild-uv" not in dockerfile
    assert "imgbuild-uv" not in render(plan, "sdk").text("Dockerfile")
    pip_only = plan_for(
        write("p.yaml", 'name: p\nbase: {framework: pytorch, tag: "24.05"}\npip: {packages: [six], installer: pip}\n')
    )
    assert "imgbuild-uv" not in render(pip_only, "buildkit").text("Dockerfile")


def _pip_lines(dockerfile: str) -> list[str]:
    """Each RUN instruction of `dockerfile` that runs install.sh, its continuation lines joined."""
    joined = dockerfile.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.startswith("RUN ") and "imgbuild-pip/install.sh" in line]


PIP_LAYER_RECIPE = """
name: d
base: {framework: pytorch, tag: "24.05"}
apt: [git]
user: {name: dev}
pip: {packages: [einops==0.8.1], installer: INSTALLER}
"""


@pytest.mark.parametrize("installer", ["uv", "pip"])
@pytest.mark.parametrize(
    ("change", "settings_extra", "pip_step_changes"),
    [
        ("", {"uid": 2000, "gid": 2000}, False),  # another user's build shares the pip layer
        ("", {"pip_resolve_timeout": 5, "pip_download_limit": 1000}, False),  # bounds limit, they shape nothing
        ("einops==0.8.1/einops==0.8.0", {}, True),  # another version: another layer, on Buildah too
        ("installer: INSTALLER/installer: INSTALLER, constraints: [six<2]", {}, True),
        ("apt: [git]/apt: [git, tmux]", {}, True),  # a layer below changed (the line is the same)
    ],
)
def test_the_pip_steps_line_changes_exactly_when_its_mounted_inputs_do(
    write, installer, change, settings_extra, pip_step_changes
):
    """Buildah keys a step by its line alone, never by the files it bind-mounts (containers/buildah#5400): the line
    carries their digest. Nothing else of the build (the uid, the bounds) reaches the pip layer's key, and no
    ARG comes before it in the final stage (Buildah < 1.29 restores no step after an ARG from a registry cache)."""
    text = PIP_LAYER_RECIPE.replace("INSTALLER", installer)
    before = render(plan_for(write("r.yaml", text)), "buildkit").text("Dockerfile")
    old, _, new = change.partition("/")
    after = render(
        plan_for(
            write("r.yaml", text.replace(old.replace("INSTALLER", installer), new.replace("INSTALLER", installer))),
            **settings_extra,
        ),
        "buildkit",
    ).text("Dockerfile")
    assert (_pip_lines(before) != _pip_lines(after)) == (pip_step_changes and "apt" not in change)
    final = before.rsplit("\nFROM ", 1)[1]
    assert "\nARG " not in final[: final.index("imgbuild-pip/install.sh")]
    assert "IMGBUILD_PIP_RESOLVE_SECONDS" not in before and "SOURCE_DATE_EPOCH" not in before
    if not pip_step_changes:  # every layer the same (the labels name the build's inputs, uid included)
        assert before.split("\nLABEL ")[0] == after.split("\nLABEL ")[0]


def test_a_mount_digest_covers_every_name_mode_and_byte_of_its_folder_and_nothing_else():
    from imgbuild.pipeline.render import mount_digest

    folder = {"imgbuild/pip/a.txt": (b"x", 0o644), "imgbuild/pip/install.sh": (b"sh", 0o755)}
    one = mount_digest({**folder, "imgbuild/pipe/z": (b"?", 0o644), "Dockerfile": (b"FROM", 0o644)}, "imgbuild/pip")
    assert one == mount_digest(folder, "imgbuild/pip") and one.startswith("sha256:") and len(one) == 71
    for changed in (
        {**folder, "imgbuild/pip/a.txt": (b"y", 0o644)},
        {**folder, "imgbuild/pip/a.txt": (b"x", 0o755)},
        {"imgbuild/pip/b.txt": (b"x", 0o644), "imgbuild/pip/install.sh": (b"sh", 0o755)},
        {**folder, "imgbuild/pip/uv.txt": (b"uv==0.0.1\n", 0o644)},
        {"imgbuild/pip/a.txtx": (b"", 0o644), "imgbuild/pip/install.sh": (b"sh", 0o755)},  # names and bytes apart
    ):
        assert mount_digest(changed, "imgbuild/pip") != one, changed


# --- compiled templates kept between runs ----------------------------------------------------------------


def test_compiled_templates_are_kept_privately_and_render_the_same(tmp_path):
    from imgbuild.pipeline.render import template_cache

    plan = plan_for(ROOT / "recipes" / "pytorch-research.yaml")
    plain = render(plan)
    cache_dir = tmp_path / "cache"
    for _ in range(2):  # the first render writes the compiled templates, the second loads them
        cached = render(plan, cache=template_cache(cache_dir))
        assert cached.rendered == plain.rendered
    folder = cache_dir / "templates"
    kept = list(folder.iterdir())
    assert kept and (folder.stat().st_mode & 0o777) == 0o700
    assert all((f.stat().st_mode & 0o077) == 0 for f in kept)


@pytest.mark.root("a template cache another user owns (chown)")
@pytest.mark.parametrize("setup", ["group-writable", "world-writable-parent", "foreign-owner", "symlink", "a-file"])
def test_no_template_cache_where_someone_else_could_write_code(tmp_path, setup):
    """A compiled template is code: a folder another user could write gets no cache (render compiles)."""
    import os

    from imgbuild.pipeline.render import template_cache

    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    folder = cache_dir / "templates"
    if setup == "group-writable":
        folder.mkdir(mode=0o770)
        folder.chmod(0o770)
    elif setup == "world-writable-parent":
        cache_dir.chmod(0o777)
    elif setup == "foreign-owner":
        folder.mkdir(mode=0o700)
        os.chown(folder, 65534, 65534)
    elif setup == "symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        folder.symlink_to(elsewhere)
    else:
        folder.write_text("not a folder")
    assert template_cache(cache_dir) is None
    plan = plan_for(ROOT / "recipes" / "pytorch-research.yaml")
    assert render(plan, cache=template_cache(cache_dir)).rendered == render(plan).rendered


def test_a_users_build_caches_are_theirs_alone(write):
    """Built for a user through sudo, every cache mount of the pip, uv and apt steps is keyed by that user too:
    one user's sdist that rewrites a cached wheel never reaches another user's image (a shared server)."""
    import re

    path = write("recipes/r.yaml", 'name: r\nbase: {framework: pytorch, tag: "24.05"}\napt: [jq]\npip: [einops]\n')
    plan = plan_for(path)
    shared = render(plan).text("Dockerfile")
    alice = render(plan, cache_scope="u1001").text("Dockerfile")
    bob = render(plan, cache_scope="u1002").text("Dockerfile")
    ids = {text: re.findall(r"type=cache,id=([^,]+)", text) for text in (shared, alice, bob)}
    assert len(ids[shared]) >= 4 and all(not i.endswith(("-u1001", "-u1002")) for i in ids[shared])
    assert all(i.endswith("-u1001") for i in ids[alice]) and all(i.endswith("-u1002") for i in ids[bob])
    assert not set(ids[alice]) & set(ids[bob])


@pytest.mark.parametrize(
    ("registry", "target"),
    [
        (None, "alice/r:24.05"),
        ("registry.example.org", "registry.example.org/alice/r:24.05"),
        ("localhost:5000/lab", "localhost:5000/lab/alice/r:24.05"),
        ("127.0.0.1:5000", "127.0.0.1:5000/alice/r:24.05"),
    ],
)
def test_images_live_in_the_image_registry_when_one_is_set(write, registry, target):
    """CI pushes to, and verifies at, the registry it logs in to: `image_registry` names it for every recipe
    without `image:` (IMGBUILD_USER alone cannot: it is a namespace, and a push of `lab/x` goes to Docker Hub)."""
    path = write("recipes/r.yaml", 'name: r\ntag: "24.05"\nbase: {framework: pytorch, tag: "24.05"}\n')
    extra = {"image_registry": registry} if registry else {}
    assert plan_for(path, **extra).target == target


@pytest.mark.parametrize(
    "bad",
    ["alice", "Registry.example.org", "evil host", "registry.example.org/", "registry.example.org//x",
     "https://registry.example.org", "registry.example.org:99999999", "régistry.example.org", "a" * 300 + ".org",
     "registry.example.org/UPPER", "registry.example.org\n", "registry.example.org/../x"],
)  # fmt: skip
def test_an_image_registry_that_is_not_a_registry_is_refused_naming_the_setting(bad):
    with pytest.raises(UsageError, match=r"image_registry: .* is not a registry host") as caught:
        settings(image_registry=bad)
    assert "\n" not in str(caught.value)


def test_planning_in_a_fresh_process_opens_no_file_and_starts_nothing(tmp_path):
    """Stage 2 is pure: in a process of its own (no cache another test filled), importing it reads none of
    imgbuild's templates, and once the recipe is loaded and imgbuild's own package data hashed (once per process),
    make_plan opens no file, starts no process and opens no socket (Python's audit events)."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(Path(__file__).parent.parent / "recipes", tmp_path / "recipes")
    (tmp_path / ".git").mkdir()
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
from pathlib import Path
from imgbuild.pipeline.plan import make_plan, templates_digest
from imgbuild.recipe import load_recipe
from tests.support import fake_inspect, settings
read_at_import = templates_digest.cache_info().currsize
loaded = load_recipe(Path({str(tmp_path / "recipes" / "pytorch-research.yaml")!r}))
chosen = settings()
templates_digest()
seen = []
sys.addaudithook(lambda event, args: seen.append(event) if event in ("open", "subprocess.Popen", "socket.connect", "os.listdir", "os.scandir") else None)
plan = make_plan(loaded, chosen, fake_inspect)
print(read_at_import, plan.input_hash, sorted(set(seen)))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    read_at_import, digest, events = done.stdout.strip().split(" ", 2)
    assert read_at_import == "0" and digest.startswith("sha256:") and events == "[]", done.stdout
