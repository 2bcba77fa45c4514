"""`imgbuild lock`: the resolver the recipe installs with, the caller's cache, live progress, and hashes that every
build checks; the lock file is input like any other (a merge request can edit it)."""

from __future__ import annotations

import base64
import collections
import json
import re

import pytest

from imgbuild.payload.probes import LOCK

H1, H2, H3 = "a" * 64, "b" * 64, "0123456789abcdef" * 4


def called(script: str) -> tuple[str, str, str]:
    """What the lock probe calls the resolver (payload/lock_resolve.py) with: its last line, `main(FILES, CACHE, UV)`."""
    import ast

    call = ast.parse(script.rstrip().splitlines()[-1]).body[0].value
    assert isinstance(call, ast.Call) and call.func.id == "main"
    files, cache, uv = (ast.literal_eval(arg) for arg in call.args)
    return files, cache, uv


def _recipe(tmp_path, lock: str, pip: str = "[einops]"):
    (tmp_path / ".git").mkdir(exist_ok=True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: r\nbase: {{framework: pytorch, tag: "24.05"}}\npip: {pip}\n')
    (tmp_path / "r.lock.txt").write_text(lock)
    return recipe


@pytest.mark.parametrize(
    "line, message",
    [
        (f"einops==0.8 --hash=sha256:{H1[:-1]}", "after name==version only --hash=sha256:<64 hex> may come"),
        (f"einops==0.8 --hash=sha256:{H1.upper()}", "after name==version only --hash=sha256:<64 hex> may come"),
        (f"einops==0.8 --hash=md5:{H1[:32]}", "after name==version only --hash=sha256:<64 hex> may come"),
        (f"einops==0.8 --hash=sha256:{H1}x", "after name==version only --hash=sha256:<64 hex> may come"),
        (f"einops==0.8 --index-url=http://evil/ --hash=sha256:{H1}", "after name==version only"),
        ("einops==0.8 -r /etc/shadow", "after name==version only"),
        ("einops==0.8 " + " ".join([f"--hash=sha256:{H1}"] * 257), "not a name==version line"),
        (f"--hash=sha256:{H1} einops==0.8", "not a name==version line"),
        (f"einops==0.8 --hash=sha256:{'٣' * 64}", "after name==version only"),  # digits of another script
    ],
)
def test_a_lock_line_takes_only_sha256_hashes_after_its_pin(tmp_path, line, message):
    from imgbuild.errors import RecipeError
    from imgbuild.recipe import load_recipe

    recipe = _recipe(tmp_path, f"# header\n{line}\n")
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    (problem,) = caught.value.problems
    assert (problem.line, problem.field) == (2, "lock") and message in problem.message


def test_hashes_on_some_lines_but_not_all_are_refused_at_the_bare_line(tmp_path):
    from imgbuild.errors import RecipeError
    from imgbuild.recipe import load_recipe

    recipe = _recipe(tmp_path, f"# header\neinops==0.8.1 --hash=sha256:{H1}\nrich==13.7.1\n", "[einops, rich]")
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    (problem,) = caught.value.problems
    assert problem.line == 3 and "has no --hash while other lines do" in problem.message


def test_a_hashed_lock_is_installed_with_its_hashes_in_the_lock_layer_only(tmp_path):
    """The lock layer's requirements carry the hashes (pip and uv check every file against them); the constraints
    the next layer gets do not (pip's hashes in constraints are not defined: pypa/pip#12956)."""
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.pipeline.render import render
    from imgbuild.recipe import load_recipe
    from tests.support import fake_inspect, settings

    recipe = _recipe(tmp_path, f"# header\neinops==0.8.1  --hash=sha256:{H2} --hash=sha256:{H1}  # two wheels\n")
    loaded = load_recipe(recipe)
    assert loaded.lock_pins == ("einops==0.8.1",)
    context = render(make_plan(loaded, settings(), fake_inspect))
    assert context.text("imgbuild/pip-lock/requirements.txt").splitlines()[-1] == (
        f"einops==0.8.1 --hash=sha256:{H2} --hash=sha256:{H1}"
    )
    assert context.text("imgbuild/pip/resolved.txt").splitlines()[-1] == "einops==0.8.1"
    bare = make_plan(load_recipe(_recipe(tmp_path, "# header\neinops==0.8.1\n")), settings(), fake_inspect)
    assert bare.content_hash != make_plan(loaded, settings(), fake_inspect).content_hash  # a new hash is due


def _answer(install, resolver="uv", note=""):
    return lambda run: (0, {"ok": True, "install": install, "tail": [], "resolver": resolver, "note": note}, "")


def test_lock_writes_each_pin_with_the_hashes_of_its_files(tmp_path):
    install = [["einops", "0.8.1", [H2, H1]], ["rich", "13.7.1", [H3]]]
    recipe, engine, result = _lock_on_fake(tmp_path, _answer(install))
    assert result.hashed and result.resolver == "uv" and result.pins == ["einops==0.8.1", "rich==13.7.1"]
    lines = (tmp_path / "r.lock.txt").read_text().splitlines()
    assert lines[0].startswith("# imgbuild lock: what uv resolved")
    assert lines[1:] == [f"einops==0.8.1 --hash=sha256:{H1} --hash=sha256:{H2}", f"rich==13.7.1 --hash=sha256:{H3}"]
    from imgbuild.recipe import load_recipe

    assert [line.hashes for line in load_recipe(recipe).lock_lines] == [
        (f"--hash=sha256:{H1}", f"--hash=sha256:{H2}"),
        (f"--hash=sha256:{H3}",),
    ]  # what lock writes, validate takes


@pytest.mark.parametrize(
    "install, why",
    [
        ([["einops", "0.8.1", [H1]], ["rich", "13.7.1", []]], "the index gave no sha256 for rich==13.7.1"),
        ([["einops", "0.8.1", [H1]], ["rich", "13.7.1", ["zz"]]], "the index gave no sha256 for rich==13.7.1"),
        ([["einops", "0.8.1", [H1]], ["rich", "13.7.1", [H1, 3]]], "the index gave no sha256 for rich==13.7.1"),
        ([["einops", "0.8.1", [H1]], ["rich", "13.7.1", [H1] * 300]], "the index gave no sha256 for rich==13.7.1"),
    ],
)
def test_a_pin_without_good_hashes_leaves_the_whole_lock_unhashed_and_says_so(tmp_path, install, why):
    _, _, result = _lock_on_fake(tmp_path, _answer(install))
    assert not result.hashed and any(why in note for note in result.notes)
    assert (tmp_path / "r.lock.txt").read_text().splitlines()[1:] == ["einops==0.8.1", "rich==13.7.1"]


def test_lock_resolves_with_the_recipes_installer_in_the_callers_cache(tmp_path):
    import os

    _, engine, result = _lock_on_fake(tmp_path, _answer([["einops", "0.8.1", [H1]]]))
    (run,) = [r for r in engine.containers.probed if r.probe.name == "lock"]
    assert run.cache == f"imgbuild-lock-cache-{os.getuid()}"  # one per user: no one reads another's cache
    _, cache, uv = called(run.probe.script)
    assert uv.startswith("uv==") and cache == "/var/cache/imgbuild"
    assert result.resolver == "uv"


def test_a_pip_recipe_is_locked_by_pip(tmp_path):
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.pipeline.pins import lock, lockable
    from tests.fake_nvcr import FakeNvcr

    recipe = _recipe(tmp_path, "# header\n", "{packages: [einops], installer: pip}")
    (tmp_path / "r.lock.txt").unlink()
    engine = FakeEngine()
    engine.images.pull = lambda ref: engine.add_image(ref)
    engine.containers.answers["lock"] = _answer([["einops", "0.8.1", [H1]]], resolver="pip")
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        settings = load_settings({"ngc_registry": nvcr.host, "cache_dir": str(tmp_path / "cache")}, environ={})
        result = lock(lockable(recipe, settings), settings, engine)
    (run,) = [r for r in engine.containers.probed if r.probe.name == "lock"]
    assert called(run.probe.script)[2] == "" and result.resolver == "pip" and result.hashed


def test_lock_shows_the_resolvers_progress_and_nothing_a_terminal_would_obey(tmp_path):
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.pipeline.pins import lock, lockable
    from tests.fake_nvcr import FakeNvcr

    recipe = _recipe(tmp_path, "# header\n", "[einops]")
    (tmp_path / "r.lock.txt").unlink()
    engine = FakeEngine()
    engine.images.pull = lambda ref: engine.add_image(ref)
    said = LOCK.says({"ok": True, "install": [["einops", "0.8.1", []]], "tail": []})
    output = "\n".join(
        [
            "imgbuild: lock: installing uv==0.13.9 to resolve with",
            "Resolved 12 packages in 1.2s",
            "Collecting einops\x1b]0;owned\x07",
            "some other chatter",
            "\x1b[2J",
            said,
        ]
    )
    engine.containers.answers["lock"] = lambda run: (0, output, "")
    shown: list[str] = []
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        settings = load_settings({"ngc_registry": nvcr.host, "cache_dir": str(tmp_path / "cache")}, environ={})
        lock(lockable(recipe, settings), settings, engine, on_line=shown.append)
    assert shown == [
        "imgbuild: lock: installing uv==0.13.9 to resolve with",
        "Resolved 12 packages in 1.2s",
        "Collecting einops]0;owned",
    ]


def test_lock_diff_names_what_moved():
    from imgbuild.pipeline.pins import diff

    added, removed, changed = diff(
        ["einops==0.8.1", "tqdm==4.66.0", "Old_Pkg==1"], ["einops==0.8.2", "tqdm==4.66.0", "rich==13"]
    )
    assert (added, removed, changed) == (["rich==13"], ["old-pkg==1"], ["einops 0.8.1 -> 0.8.2"])


@pytest.mark.parametrize("line", ["einops", "einops>=0.8", "-r other.txt", "==1", "--hash=sha256:" + "a" * 64])
def test_a_lock_holds_name_version_lines_only(tmp_path, line):
    from imgbuild.errors import RecipeError
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: [einops]\n')
    (tmp_path / "r.lock.txt").write_text(f"# comment\n{line}\n")
    with pytest.raises(RecipeError, match=r"r.lock.txt:2:1: lock: not a name==version line"):
        load_recipe(recipe)


def test_the_lock_is_part_of_the_recipe_and_rendered_for_the_build(tmp_path):
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.pipeline.render import render
    from imgbuild.recipe import load_recipe
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: [einops]\n')
    unlocked = make_plan(load_recipe(recipe), settings(), fake_inspect)
    (tmp_path / "r.lock.txt").write_text("einops==0.8.1\n")
    locked = make_plan(load_recipe(recipe), settings(), fake_inspect)
    assert locked.content_hash != unlocked.content_hash  # rebuild sees a changed lock
    context = render(locked)
    assert context.text("imgbuild/pip/resolved.txt").splitlines()[-1] == "einops==0.8.1"
    assert "imgbuild/pip/resolved.txt" not in render(unlocked).rendered
    # The lock layer: the lock's pins alone, in a folder of their own, installed before the recipe's
    # packages; editing the packages leaves it cached. Only BuildKit builds it (bind mounts per folder).
    assert context.text("imgbuild/pip-lock/requirements.txt").splitlines()[1:] == ["einops==0.8.1"]
    assert "imgbuild/pip-lock/lock-layer" in context.rendered
    dockerfile = context.text("Dockerfile")
    assert dockerfile.count("sh /tmp/imgbuild-pip/install.sh") == 2
    assert dockerfile.index("source=imgbuild/pip-lock,") < dockerfile.index("source=imgbuild/pip,")
    assert "imgbuild/pip-lock/lock-layer" not in render(unlocked).rendered
    assert render(unlocked).text("Dockerfile").count("install.sh") == 1
    sdk = render(locked, "sdk")
    assert "imgbuild/pip-lock/lock-layer" not in sdk.rendered and sdk.text("Dockerfile").count("install.sh") == 1


def _lock_on_fake(tmp_path, answer, pins: list[str] | None = None):
    """`imgbuild lock` on the fake engine, its base served by the fake registry: the lock probe answers `answer`."""
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.pipeline.pins import lock, lockable
    from tests.fake_nvcr import FakeNvcr

    (tmp_path / ".git").mkdir(exist_ok=True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: [einops, rich]\n')
    engine = FakeEngine()
    engine.images.pull = lambda ref: engine.add_image(ref)  # the fake registry has every base
    engine.containers.base_pins = pins or []
    engine.containers.answers["lock"] = answer
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        settings = load_settings({"ngc_registry": nvcr.host, "cache_dir": str(tmp_path / "cache")}, environ={})
        return recipe, engine, lock(lockable(recipe, settings), settings, engine)


def test_lock_runs_install_sh_in_the_pinned_base_and_writes_what_pip_chose(tmp_path):
    """`imgbuild lock` on the fake engine (the fake answers the lock probe by name)."""
    install = [["einops", "0.8.1"], ["rich", "13.7.1"], ["markdown-it-py", "3.0.0"]]
    recipe, engine, result = _lock_on_fake(tmp_path, lambda run: (0, {"ok": True, "install": install, "tail": []}, ""))
    (run,) = [r for r in engine.containers.probed if r.probe.name == "lock"]
    assert "@sha256:" in run.image and run.gpus is None  # the base, pinned; no GPU
    assert run.env["IMGBUILD_PIP_RESOLVE_SECONDS"] and run.stdin == b""  # no index credentials configured
    assert "install.sh" in json.loads(base64.b64decode(called(run.probe.script)[0]))
    assert result.pins == ["einops==0.8.1", "markdown-it-py==3.0.0", "rich==13.7.1"] == result.added
    lines = (tmp_path / "r.lock.txt").read_text().splitlines()
    assert lines[0].startswith("# imgbuild lock:") and lines[1:] == result.pins
    # locked again, with einops moved: the diff says so, and the file holds the new answer
    install[0][1] = "0.8.2"
    _, _, again = _lock_on_fake(tmp_path, lambda run: (0, {"ok": True, "install": install, "tail": []}, ""))
    assert again.changed == ["einops 0.8.1 -> 0.8.2"] and not again.added and not again.removed


@pytest.mark.parametrize(
    "install, kept",
    [
        ([["einops", "0.8.1"], ["x y", "1"], ["ok", "1 ; rm -rf /"], ["", "1"], ["a", ""]], ["einops==0.8.1"]),
        ([["einops"], "einops==1", None, 3, {"a": 1}, ["a", 1], ["a", "1", "2"]], []),
        ("einops==1", []),
        ({"einops": "1"}, []),
        ([["-e", "1"], ["x\n", "1"], ["ok", "1\nevil==2"]], []),
    ],
)
def test_a_hostile_lock_answer_gives_only_name_version_pins(tmp_path, install, kept):
    _, _, result = _lock_on_fake(tmp_path, lambda run: (0, {"ok": True, "install": install, "tail": []}, ""))
    assert result.pins == kept
    assert (tmp_path / "r.lock.txt").read_text().splitlines()[1:] == kept


@pytest.mark.parametrize(
    "answer, message",
    [
        ((1, {"ok": False, "tail": ["ResolutionImpossible: rich>=99"]}, ""), "ResolutionImpossible: rich>=99"),
        ((1, "Traceback: no marker line at all", ""), "no marker line at all"),
        ((0, LOCK.marker + "{not json", ""), "could not resolve"),
    ],
)
def test_a_lock_that_fails_in_the_base_writes_nothing(tmp_path, answer, message):
    from imgbuild.errors import BuildFailed

    with pytest.raises(BuildFailed, match=re.escape(message)):
        _lock_on_fake(tmp_path, lambda run: answer)
    assert not (tmp_path / "r.lock.txt").exists()


@pytest.mark.parametrize(
    "old_lock",
    [
        "einops==0.8.1\nrich==13.7.1\nnvidia-cudnn-cu12==9.1.0.70\n",  # a line validate refuses (a CUDA library)
        "einops==0.8.1\neinops==0.8.2\n",  # locked twice
        "einops==not-a-version\n",
        "",  # empty: a write cut short
        "torch==2.3.0\neinops==0.8.1\n",  # the framework, which the base refuses
    ],
)
def test_lock_cures_the_lock_validate_refuses(tmp_path, old_lock):
    """validate said 'run imgbuild lock RECIPE', and lock failed with the same refusal. The lock is
    what lock writes: its old lines are preferences where acceptable, never a reason to refuse."""
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir()
    (tmp_path / "r.lock.txt").write_text(old_lock)
    install = [["einops", "0.8.1"], ["rich", "13.7.1"], ["markdown-it-py", "3.0.0"]]
    _, engine, result = _lock_on_fake(tmp_path, lambda run: (0, {"ok": True, "install": install, "tail": []}, ""))
    assert result.pins == ["einops==0.8.1", "markdown-it-py==3.0.0", "rich==13.7.1"]
    load_recipe(tmp_path / "r.yaml", environ={})  # what lock wrote validates
    (run,) = [r for r in engine.containers.probed if r.probe.name == "lock"]
    assert "torch==2.3.0" not in run.probe.script and "nvidia-cudnn" not in run.probe.script


def test_a_cuda_library_a_requirement_pulls_in_is_never_written_as_a_pin(tmp_path):
    """lock on jax[cuda13] wrote nvidia-cuda-nvcc into the lock; the next build refused that lock at
    its lines. Lock writes nothing validate refuses: the library stays a comment, installed as jax asks."""
    from imgbuild.recipe import load_recipe

    install = [["einops", "0.8.1"], ["nvidia-cuda-nvcc", "13.0.88"], ["nvidia-nvvm", "13.0.88"], ["rich", "13.7.1"]]
    recipe, _, result = _lock_on_fake(tmp_path, lambda run: (0, {"ok": True, "install": install, "tail": []}, ""))
    assert result.pins == ["einops==0.8.1", "rich==13.7.1"]
    text = (tmp_path / "r.lock.txt").read_text()
    assert "# nvidia-cuda-nvcc==13.0.88: a CUDA library" in text and "\nnvidia-cuda-nvcc==" not in text
    assert load_recipe(recipe, environ={}).lock_pins == ("einops==0.8.1", "rich==13.7.1")


NAMES = [
    "einops",
    "rich",
    "torch",
    "tensorflow",
    "nvidia-cudnn-cu12",
    "nvidia-cuda-nvcc",
    "nvidia-nvvm",
    "jax-cuda13-pjrt",
    "jax-cuda13-plugin",
    "jaxlib",
    "numpy",
    "triton",
    "Flash_Attn",
    "nvidia-nccl-cu13",
]
VERSIONS = ["0.8.1", "2.3.0", "13.0.88", "2.13.0a0+07cecf4168.nv24.5", "1!2.0", "2.1.0.dev2", "1.0.post1"]


@pytest.mark.parametrize("seed", range(40))
def test_every_lock_imgbuild_writes_is_one_validate_and_the_build_accept(tmp_path, seed):
    """As a property: whatever the resolver answers (the framework, CUDA libraries of either major,
    jax's plugins, pre-releases, epochs, one name twice), the lock `imgbuild lock` writes is one that loading the
    recipe (validate) and the build's plan, against the base and its pins, accept; what it may not pin stays a
    comment, and an answer it cannot make a buildable lock of is refused with a reason, nothing written."""
    import random

    from imgbuild.config.settings import load_settings
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.errors import ImgbuildError
    from imgbuild.pipeline.pins import lock, lockable
    from imgbuild.pipeline.resolve import plan_recipe
    from imgbuild.recipe import load_recipe
    from tests.fake_nvcr import FakeNvcr

    rng = random.Random(seed)
    install = [[rng.choice(NAMES), rng.choice(VERSIONS)] for _ in range(rng.randrange(1, 9))]
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: [einops, rich]\n')
    engine = FakeEngine()
    engine.images.pull = lambda ref: engine.add_image(ref)
    engine.containers.base_pins = ["numpy==2.4.6", "triton==3.1.0"]
    engine.containers.answers["lock"] = lambda run: (0, {"ok": True, "install": install, "tail": []}, "")
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        settings = load_settings({"ngc_registry": nvcr.host, "cache_dir": str(tmp_path / "cache")}, environ={})
        try:
            result = lock(lockable(recipe, settings), settings, engine)
        except ImgbuildError as refused:  # then it says why, and wrote nothing
            assert not (tmp_path / "r.lock.txt").exists() and str(refused), install
            return
        loaded = load_recipe(recipe, environ={})
        assert set(loaded.lock_pins) == set(result.pins), install
        plan_recipe(loaded, settings, engine, with_pins=True)  # the build's own check of the lock


def test_lock_frees_the_pins_the_edited_recipe_excludes_and_keeps_the_rest(tmp_path):
    """Through `lock` itself (the bed's stale-lock loop found it): the recipe now asks for
    einops>=0.8 while its lock holds einops==0.7.0. The old pin must not reach the resolver, which takes the
    lock's pins as constraints; rich's pin stays a preference."""
    import base64
    import json as jsonlib

    (tmp_path / ".git").mkdir()
    (tmp_path / "r.lock.txt").write_text("einops==0.7.0\nrich==13.7.1\n")
    install = [["einops", "0.8.1"], ["rich", "13.7.1"]]
    recipe, engine, result = _lock_on_fake(tmp_path, lambda run: (0, {"ok": True, "install": install, "tail": []}, ""))
    recipe.write_text(recipe.read_text().replace("[einops, rich]", '["einops>=0.8", rich]'))
    (tmp_path / "r.lock.txt").write_text("einops==0.7.0\nrich==13.7.1\n")
    engine.containers.probed.clear()
    from imgbuild.config.settings import load_settings
    from imgbuild.pipeline.pins import lock, lockable
    from tests.fake_nvcr import FakeNvcr

    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        settings = load_settings({"ngc_registry": nvcr.host, "cache_dir": str(tmp_path / "cache")}, environ={})
        result = lock(lockable(recipe, settings), settings, engine)
    (run,) = [r for r in engine.containers.probed if r.probe.name == "lock"]
    files = jsonlib.loads(base64.b64decode(called(run.probe.script)[0]))
    assert "einops==0.7.0" not in files.get("resolved.txt", "") and "rich==13.7.1" in files["resolved.txt"]
    assert result.pins == ["einops==0.8.1", "rich==13.7.1"] and result.changed == ["einops 0.7.0 -> 0.8.1"]


@pytest.mark.parametrize("text", ["", "\n", "   \n\n"])
def test_an_empty_lock_is_refused_not_taken_for_no_pins(tmp_path, text):
    """A lock a kill left empty is refused: taken for a lock of no pins, the next build would install unlocked."""
    from imgbuild.errors import RecipeError
    from imgbuild.recipe import load_recipe
    from tests.support import RECIPE_HEAD

    (tmp_path / ".git").mkdir()
    (tmp_path / "demo.yaml").write_text(RECIPE_HEAD + "pip: [einops==0.8.0]\n")
    (tmp_path / "demo.lock.txt").write_text(text)
    with pytest.raises(RecipeError, match="lock: is empty"):
        load_recipe(tmp_path / "demo.yaml", environ={})
    (tmp_path / "demo.lock.txt").write_text("# imgbuild lock: what pip resolved\n")  # a lock of no pins is one
    load_recipe(tmp_path / "demo.yaml", environ={})


@pytest.mark.parametrize("log", ["uv-output.txt", "uv-output.color.txt", "uv-output.tty.txt", "uv-output.verbose.txt"])
def test_the_locks_reading_of_uvs_dry_run_is_the_pip_steps_on_uvs_real_output(tmp_path, monkeypatch, capsys, log):
    """The lock's resolver reads uv's "Would install" lines as the install step printed them (uv's real output in
    each of its modes: coloured, redrawn on a terminal, verbose) with the pip step's own reading of a line and its
    parser (pip_words, pip_versions, written beside it); a local wheel's `(from file://...)` line too."""
    import importlib.util
    import shutil
    import sys
    from pathlib import Path

    from imgbuild.payload import PAYLOAD_DIR

    for name in ("pip_versions.py", "pip_words.py"):
        shutil.copy(PAYLOAD_DIR / name, tmp_path / name)
    spec = importlib.util.spec_from_file_location("lock_resolve", LOCK.path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "HERE", str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("pip_versions", "pip_words"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    data = (Path(__file__).parent / "data" / "installer-logs" / log).read_bytes()
    dry_run = data.split(b"--dry-run idna==3.10 six==1.16.0\n", 1)[1].split(b"[exit", 1)[0]
    local = data.split(b"idna-3.9-py3-none-any.whl\n", 1)[1].split(b"[exit", 1)[0]
    (tmp_path / "install.out").write_bytes(dry_run + local)
    (tmp_path / "install.sh").write_text('cat "$(dirname "$0")/install.out"\n')
    would: list = []
    assert (
        module._run({"PATH": "/usr/bin:/bin"}, collections.deque(), {}, lambda line: module._would_install(line, would))
        == 0
    )
    capsys.readouterr()
    assert would == [["idna", "3.10", []], ["six", "1.16.0", []], ["idna", "3.9", []]]
