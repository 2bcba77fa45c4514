"""The base's stack checked by its bytes: what the plan protects, how the recipe's env: is judged before the
build, and the in-image script (payload/stack_check.py) run with python on a folder tree of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from imgbuild.errors import RecipeError
from imgbuild.payload import STACK_SCRIPT
from imgbuild.payload.stack_check import LIBRARY_RE, judge_env
from imgbuild.pipeline.plan import check_offline, make_plan
from imgbuild.pipeline.render import render
from imgbuild.recipe import load_recipe
from tests.support import RECIPE_HEAD, fake_inspect, settings


def _recipe(tmp_path: Path, text: str) -> Path:
    (tmp_path / ".git").mkdir(exist_ok=True)
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE_HEAD + text)
    return path


def _one_refusal(tmp_path: Path, text: str, offline: bool, field: str) -> bool:
    """Whether the recipe is refused with one line at `field`: by validate (offline) or by the plan with the base."""
    loaded = load_recipe(_recipe(tmp_path, text))
    with pytest.raises(RecipeError) as info:
        check_offline(loaded) if offline else make_plan(loaded, settings(), fake_inspect)
    lines = info.value.lines()
    assert len(lines) == 1 and f" {field}: " in lines[0], lines
    return True


# --- the protected set and where the check runs ---------------------------------------------------------------


def test_the_plan_protects_every_framework_the_stack_folders_and_frees_only_what_the_recipe_unpins(tmp_path):
    plan = make_plan(
        load_recipe(_recipe(tmp_path, "pip: {packages: [einops], unpin: [NumPy]}\n")), settings(), fake_inspect
    )
    spec = json.loads(render(plan).text("imgbuild/stack/protected.json"))
    assert {"torch", "tensorflow", "tensorflow-cpu"} <= set(spec["distributions"])
    assert spec["unpinned"] == ["numpy"]
    assert {"/usr/local/cuda", "/usr/local/cuda-*", "/opt/nvidia", "/opt/imgbuild"} <= set(spec["trees"])
    assert "/etc/ld.so.preload" in spec["files"] and "/opt/imgbuild/smoke/__main__.py" in spec["own"]


@pytest.mark.parametrize("backend", ["buildkit", "sdk"])
def test_the_build_records_the_stack_first_and_checks_it_after_each_kind_of_step_it_has(backend, tmp_path):
    (tmp_path / "f.txt").write_text("x")
    text = "apt: [jq]\npip: [einops]\nrun: ['true']\nfiles: [{src: f.txt, dest: /opt/f.txt}]\nenv: {A: b}\n"
    dockerfile = render(make_plan(load_recipe(_recipe(tmp_path, text)), settings(), fake_inspect), backend).text(
        "Dockerfile"
    )
    import re

    stage = "FROM registry.test:5000/nvidia/pytorch:24.05-py3@" + "sha256:" + "ab" * 32 + " AS imgbuild-stack\n"
    assert dockerfile.index(stage) < dockerfile.index("apt-get")
    kinds = r"manifest\.json[ \\\n]+(apt|pip|user|run|files|env)\b"
    found = [(m.group(1), m.start()) for m in re.finditer(kinds, dockerfile)]
    assert [kind for kind, _ in found] == ["apt", "pip", "run", "files", "env"]
    at = dict(found)  # each check follows its own step and comes before the next kind's
    assert at["apt"] < dockerfile.index("install.sh") < at["pip"]
    assert at["pip"] < dockerfile.index('["/bin/sh", "-c", "true"]') < at["run"]
    assert at["run"] < dockerfile.index("/opt/f.txt") < at["files"] < dockerfile.index("\nENV ") < at["env"]


def test_a_recipe_with_no_step_has_no_stack_stage(tmp_path):
    context = render(make_plan(load_recipe(_recipe(tmp_path, "labels: {a: b}\n")), settings(), fake_inspect))
    assert "imgbuild-stack" not in context.text("Dockerfile")
    assert not [p for p in context.paths() if p.startswith("imgbuild/stack/")]


@pytest.mark.parametrize(
    "name",
    [
        "libcudart.so.12",
        "libcudart.so.12.4.127",
        "libcudnn.so.9",
        "libcudnn_ops.so.9",
        "libnccl.so.2.21.5",
        "libcublasLt.so.12",
        "libcuda.so.1",
        "libnvidia-ml.so.1",
        "libnvinfer.so.10",
        "libcupti.so",
    ],  # fmt: skip
)
def test_the_cuda_stacks_libraries_are_known_by_family(name):
    assert LIBRARY_RE.fullmatch(name)


@pytest.mark.parametrize("name", ["libcurl.so.4", "libcups.so.2", "libnvpair.so.3", "libc.so.6", "libcudart.txt"])
def test_other_libraries_are_not_the_cuda_stack(name):
    assert not LIBRARY_RE.fullmatch(name)


# --- the env judgement, before the build -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ("{LD_LIBRARY_PATH: '/opt/x:$LD_LIBRARY_PATH'}", "LD_LIBRARY_PATH"),
        ("{LD_LIBRARY_PATH: '$${LD_LIBRARY_PATH}:'}", "LD_LIBRARY_PATH"),
        ("{LD_LIBRARY_PATH: '$LD_LIBRARY_PATH:.'}", "LD_LIBRARY_PATH"),
        ("{PATH: '/home/me/bin:$PATH'}", "PATH"),
        ("{PATH: /usr/bin}", "PATH"),
        ("{CUDA_HOME: /opt/cuda-11}", "CUDA_HOME"),
        ("{CUDA_PATH: /opt/cuda-11}", "CUDA_PATH"),
        ("{PYTHONHOME: /opt/py}", "PYTHONHOME"),
    ],
)
@pytest.mark.parametrize("offline", [False, True], ids=["with-base", "offline"])
def test_an_env_that_moves_the_loader_or_import_path_before_the_bases_is_refused(env, field, offline, tmp_path):
    assert _one_refusal(tmp_path, f"env: {env}\n", offline, f"env.{field}")


@pytest.mark.parametrize(
    "env",
    [
        "{LD_LIBRARY_PATH: '$LD_LIBRARY_PATH:/opt/x/lib'}",
        "{PATH: '$${PATH}:/opt/tools/bin'}",
        "{PYTHONPATH: /opt/lib}",
        "{CUDA_HOME: /usr/local/cuda}",
        "{OTHER: '/x:$LD_LIBRARY_PATH'}",
    ],
)
@pytest.mark.parametrize("offline", [False, True], ids=["with-base", "offline"])
def test_an_env_that_adds_after_the_bases_entries_is_accepted(env, offline, tmp_path):
    loaded = load_recipe(_recipe(tmp_path, f"env: {env}\n"))
    check_offline(loaded) if offline else make_plan(loaded, settings(), fake_inspect)


def test_an_env_that_replaces_the_bases_search_path_is_refused_once_the_base_is_read(tmp_path):
    """Offline the base's LD_LIBRARY_PATH is not known (render judges it with the base's config)."""
    loaded = load_recipe(_recipe(tmp_path, "env: {LD_LIBRARY_PATH: /opt/x}\n"))
    check_offline(loaded)
    with pytest.raises(RecipeError) as info:
        make_plan(loaded, settings(), fake_inspect)
    assert [" env.LD_LIBRARY_PATH: " in line for line in info.value.lines()] == [True]


def test_the_images_env_is_judged_by_the_same_rule():
    base = {"PATH": "/usr/local/cuda/bin:/usr/bin", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}
    assert judge_env(base, {**base, "PATH": "/usr/local/cuda/bin:/usr/bin:/opt/bin"}) == []
    assert [n for n, _ in judge_env(base, {**base, "PATH": "/opt/bin:/usr/local/cuda/bin:/usr/bin"})] == ["PATH"]
    assert [n for n, _ in judge_env(base, {**base, "LD_PRELOAD": "/x.so"})] == ["LD_PRELOAD"]


# --- the in-image script, on a folder tree of its own ---------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A base of folders (a CUDA toolkit, NGC's entrypoint, a site folder holding a framework `torch`), recorded
    once: each test works on a copy of it, with the manifest's paths moved to the copy."""
    top = tmp_path_factory.mktemp("stack")
    root = top / "base"
    lib = root / "cuda" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.12").write_bytes(b"cudart-12")
    (root / "nvidia").mkdir()
    (root / "nvidia" / "nvidia_entrypoint.sh").write_text('#!/bin/sh\nexec "$@"\n')
    site = root / "site"
    (site / "torch").mkdir(parents=True)
    (root / "early").mkdir()
    (site / "torch" / "__init__.py").write_text("version = '2.4'\n")
    info = site / "torch-2.4.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.4.0\n")
    (info / "RECORD").write_text(
        "torch/__init__.py,,\ntorch-2.4.0.dist-info/METADATA,,\ntorch-2.4.0.dist-info/RECORD,,\n"
    )
    (root / "constraint.txt").write_text("")
    (root / "bashrc").write_text("# the base's own\n")  # BASH_ENV's script: bash runs it before NGC's entrypoint
    (root / "alt").mkdir()  # a link in the stack leading through one outside it (as /etc/alternatives)
    (root / "alt" / "libnvrtc.so.12").symlink_to("real-a")
    (lib / "libnvrtc.so.12").symlink_to("../../alt/libnvrtc.so.12")
    spec = {"distributions": ["torch"], "unpinned": [], "trees": [f"{root}/cuda*", f"{root}/nvidia"],
            "files": [f"{root}/preload"], "own": [], "cuda_wheels": "nvidia-cudnn-cu[0-9]+",
            "unpinned_prefixes": ["nvidia-"]}  # fmt: skip
    (top / "protected.json").write_text(json.dumps(spec))
    for manifest, more in (("manifest.json", ()), ("manifest-stat.json", ("--stat-only",))):
        done = _runner(top, manifest)("record", "-S", more=more)  # -S: only PYTHONPATH's distributions to read
        assert done.returncode == 0, done.stderr
    return top


def _env(top: Path) -> dict[str, str]:
    root = top / "base"
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PIP_CONSTRAINT": str(root / "constraint.txt"),
        "LD_LIBRARY_PATH": str(root / "cuda" / "lib64"),
        "PYTHONPATH": f"{root / 'early'}:{root / 'site'}",
        "BASH_ENV": str(root / "bashrc"),
    }


def _runner(top: Path, manifest: str = "manifest.json"):
    def run(
        mode: str, *flags: str, step: str = "", more: tuple[str, ...] = (), **env: str
    ) -> subprocess.CompletedProcess[str]:
        args = [str(top / "protected.json"), str(top / manifest), *([step] if step else []), *more]
        return subprocess.run(
            [sys.executable, *flags, str(STACK_SCRIPT), mode, *args],
            env={**_env(top), **env},
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


@pytest.fixture(params=["hashed", "stat-only"])
def stand(recorded, tmp_path, request):
    """A copy of the recorded base and its check: by the recorded sha256s, or (as on BuildKit) by the stat alone
    with the base's own files mounted beside it (here: a pristine copy at the same paths under a root)."""
    import shutil

    top = tmp_path / "copy"
    shutil.copytree(recorded, top, symlinks=True)
    for name in ("protected.json", "manifest.json", "manifest-stat.json"):
        (top / name).write_text((top / name).read_text().replace(str(recorded), str(top)))
    more: tuple[str, ...] = ()
    manifest = "manifest.json"
    if request.param == "stat-only":
        root = tmp_path / "root"
        shutil.copytree(recorded / "base", root / str(top / "base").lstrip("/"), symlinks=True)
        more, manifest = ("--base-root", str(root)), "manifest-stat.json"
    run = _runner(top, manifest)
    return top / "base", lambda step, **env: run("check", "-I", "-S", step=step, more=more, **env)


def test_an_untouched_base_passes_and_a_touch_that_keeps_the_bytes_is_no_change(stand):
    root, run = stand
    os.utime(root / "cuda" / "lib64" / "libcudart.so.12", ns=(1, 1))  # stat differs: hashed, same bytes
    done = run("apt")
    assert done.returncode == 0 and done.stdout == "", done.stdout


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: (r / "cuda/lib64/libcudart.so.12").write_bytes(b"cudart-11"), "libcudart.so.12: modified"),
        (lambda r: (r / "cuda/lib64/libcudart.so.12").unlink(), "libcudart.so.12: removed"),
        (lambda r: (r / "nvidia/nvidia_entrypoint.sh").write_text("#!/bin/sh\n"), "nvidia_entrypoint.sh: modified"),
        (lambda r: (r / "cuda/lib64/libcudnn.so.8").write_bytes(b"x"), "libcudnn.so.8: added"),
        (lambda r: (r / "cuda-11.8").mkdir(), "cuda-11.8: added"),
        (lambda r: (r / "site/torch/evil.py").write_text(""), "torch/evil.py: added"),
        (lambda r: (r / "site/torch/__init__.py").write_text("version = '2.0'\n"), "torch/__init__.py: modified"),
        (lambda r: (r / "preload").write_text("/x.so\n"), "preload: added"),
        (lambda r: (r / "cuda/lib64/libcudart.so.12").chmod(0o777), "mode or owner changed"),
        (
            lambda r: (r / "early/torch").mkdir() or (r / "early/torch/__init__.py").write_text(""),
            "shadowed for `import torch`",
        ),
        (
            lambda r: (r / "site/sitecustomize.py").write_text(""),
            "sitecustomize.py: added (it runs at every Python start)",
        ),
        (lambda r: (r / "bashrc").write_text("export LD_PRELOAD=/x.so\n"), "bashrc: modified"),
        (
            lambda r: (r / "alt/libnvrtc.so.12").unlink() or (r / "alt/libnvrtc.so.12").symlink_to("real-b"),
            "libnvrtc.so.12: repointed",
        ),
        (
            lambda r: (
                (r / "cuda/lib64/glibc-hwcaps/x86-64-v3").mkdir(parents=True)
                or (r / "cuda/lib64/glibc-hwcaps/x86-64-v3/libcudart.so.12").write_bytes(b"mine")
            ),
            "libcudart.so.12: shadowed for the dynamic linker",
        ),
    ],
    ids=[
        "modified",
        "removed",
        "entrypoint",
        "another-cudnn",
        "another-toolkit",
        "added-module",
        "framework-file",
        "preload",
        "mode",
        "import-shadow",
        "sitecustomize",
        "bash-startup",
        "link-repointed",
        "hwcaps-shadow",
    ],  # fmt: skip
)
def test_a_change_to_the_stack_fails_naming_the_file_and_the_step(stand, change, says):
    root, run = stand
    change(root)
    done = run("run")
    assert done.returncode == 1, done.stdout
    assert any(line.startswith("imgbuild: the run step changed the base's stack: ") and says in line
               for line in done.stdout.splitlines()), done.stdout  # fmt: skip


def test_the_linkers_cache_is_read_as_the_linker_reads_it(tmp_path):
    """glibc's cache (its format since 2.32, alone or after the old one) gives each name's files; the linker takes
    LD_LIBRARY_PATH's (glibc-hwcaps subfolders first), then the cache's, whatever configuration wrote it."""
    import struct

    from imgbuild.payload.stack_check import _resolve, ld_cache

    def cache(entries: list[tuple[str, str]], old: bool) -> bytes:
        strings, offsets = b"", []
        table = 48 + 24 * len(entries)
        for key, value in entries:
            offsets.append((table + len(strings), table + len(strings) + len(key) + 1))
            strings += key.encode() + b"\0" + value.encode() + b"\0"
        head = b"glibc-ld.so.cache1.1" + struct.pack("<IIB3xI12x", len(entries), len(strings), 2, 0)
        body = b"".join(struct.pack("<iIIIQ", 771, k, v, 0, 0) for k, v in offsets)
        return (b"ld.so-1.7.0\0" + struct.pack("<I", 0) if old else b"") + head + body + strings

    evil, real = tmp_path / "evil", tmp_path / "real"
    for folder in (evil, real, tmp_path / "env" / "glibc-hwcaps" / "x86-64-v3"):
        folder.mkdir(parents=True)
    (evil / "libcudnn.so.9").write_bytes(b"evil")
    (real / "libcudnn.so.9").write_bytes(b"real")
    (tmp_path / "env" / "glibc-hwcaps" / "x86-64-v3" / "libcudart.so.12").write_bytes(b"hw")
    for old in (False, True):
        (tmp_path / "ld.so.cache").write_bytes(cache([("libcudnn.so.9", f"{evil}/libcudnn.so.9")], old))
        table = ld_cache(str(tmp_path / "ld.so.cache"))
        assert table == {"libcudnn.so.9": [f"{evil}/libcudnn.so.9"]}
    env = {"LD_LIBRARY_PATH": str(tmp_path / "env")}
    assert _resolve("libcudnn.so.9", env, table, {}) == str(evil / "libcudnn.so.9")
    assert _resolve("libcudnn.so.9", {"LD_LIBRARY_PATH": str(real)}, table, {}) == str(real / "libcudnn.so.9")
    assert _resolve("libcudart.so.12", env, {}, {}).endswith("glibc-hwcaps/x86-64-v3/libcudart.so.12")


def test_a_library_earlier_on_the_loader_path_shadows_the_bases(stand, tmp_path):
    root, run = stand
    other = tmp_path / "mine"
    other.mkdir()
    (other / "libcudart.so.12").write_bytes(b"mine")
    done = run("env", LD_LIBRARY_PATH=f"{other}:{root / 'cuda' / 'lib64'}")
    assert done.returncode == 1
    assert f"libcudart.so.12: shadowed for the dynamic linker by {other}/libcudart.so.12" in done.stdout
    assert "LD_LIBRARY_PATH: the base's entries must stay first" in done.stdout


# --- the doors' own refusals, before the build ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("apt: [cuda-toolkit-12-6]\n", "apt[0]"),
        ("apt: [libcudnn8=8.9.7.29-1+cuda12.2]\n", "apt[0]"),
        ("apt: [git, libnccl2]\n", "apt[1]"),
        ("apt: [nvidia-driver-550]\n", "apt[0]"),
        ("apt: [libnvidia-compute-550]\n", "apt[0]"),
        ("apt: [python3-torch]\n", "apt[0]"),
        ("files: [{src: f.txt, dest: /usr/local/lib/python3.10/dist-packages/torch/__init__.py}]\n", "files[0].dest"),
        ("files: [{src: f.txt, dest: /usr/local/cuda/lib64/libcudart.so.12}]\n", "files[0].dest"),
        ("files: [{src: f.txt, dest: /usr/lib/x86_64-linux-gnu/libcudnn.so.9}]\n", "files[0].dest"),
        ("files: [{src: f.txt, dest: /opt/nvidia/nvidia_entrypoint.sh}]\n", "files[0].dest"),
        ("files: [{src: f.txt, dest: /opt/nvidia/entrypoint.d/99-mine.sh}]\n", "files[0].dest"),
        ("files: [{src: f.txt, dest: /etc/ld.so.preload}]\n", "files[0].dest"),
        ("workdir: /opt/nvidia/work\n", "workdir"),
    ],
)
def test_a_step_naming_the_bases_stack_is_refused_before_the_build(text, field, tmp_path):
    (tmp_path / "f.txt").write_text("x")
    assert _one_refusal(tmp_path, text, True, field)


@pytest.mark.parametrize(
    ("held", "dest"),
    [
        ("torch/__init__.py", "/usr/local/lib/python3.10/dist-packages"),
        ("lib/libcudart.so.12", "/usr/local"),
        ("x86_64-linux-gnu/libcudnn.so.9", "/usr/lib"),
        ("nvidia/nvidia_entrypoint.sh", "/opt"),
        ("python3.10/dist-packages/sitecustomize.py", "/usr/local/lib"),
        ("dist-packages/zz-hook.pth", "/usr/lib/python3"),
        ("sitecustomize.py", "/etc/python3.10"),
    ],
)
def test_a_copied_folder_holding_the_bases_stack_is_refused_by_the_file_it_holds(held, dest, tmp_path):
    """The door judges each file a copied folder holds at the path it lands on, not only the folder's own."""
    (tmp_path / "tree" / held).parent.mkdir(parents=True)
    (tmp_path / "tree" / held).write_text("x")
    assert _one_refusal(tmp_path, f"files: [{{src: tree, dest: {dest}}}]\n", True, "files[0].dest")


@pytest.mark.parametrize(
    "text",
    [
        "apt: [git, libcurl4, cups, nvtop]\n",
        "files: [{src: f.txt, dest: /usr/local/lib/python3.10/dist-packages/torchmetrics_extra.py}]\n",
        "files: [{src: f.txt, dest: /opt/app/cudnn_notes.txt}]\n",
        "files: [{src: f.txt, dest: /opt/app/site-packages/notes.pth.txt}]\n",
        "files: [{src: f.txt, dest: /workspace/mypkg/customize.py}]\n",
    ],
)
def test_steps_beside_the_stack_pass_the_door(text, tmp_path):
    (tmp_path / "f.txt").write_text("x")
    check_offline(load_recipe(_recipe(tmp_path, text)))


def test_an_ordinary_pth_file_is_no_change(stand):
    """pytest-cov and namespace packages ship .pth files: only a protected name one moves is a change (the import
    check runs the image's own Python, site and all)."""
    root, run = stand
    (root / "site" / "pytest-cov.pth").write_text("import os\n")
    assert run("pip").returncode == 0


def test_the_record_holds_the_distributions_the_pip_step_holds(tmp_path):
    """The framework, the CUDA library wheels and the base's pins, but not a pinned nvidia-* that is no CUDA library
    (the pip step lets it move) nor what the recipe unpins; an unpinned distribution is the recipe's to change."""
    site = tmp_path / "site"
    for name in ("torch", "numpy", "scipy", "nvidia_cudnn_cu12", "nvidia_dali_cuda120", "einops"):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text("")
        info = site / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    (tmp_path / "constraint.txt").write_text("numpy==1.0\nscipy==1.0\nnvidia-dali-cuda120==1.0\n")
    spec = _spec_of(unpinned=["scipy"])
    (tmp_path / "protected.json").write_text(spec)
    env = {"PATH": "/usr/bin:/bin", "PIP_CONSTRAINT": str(tmp_path / "constraint.txt"), "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-S", str(STACK_SCRIPT), "record", str(tmp_path / "protected.json"), str(tmp_path / "m.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    held = {Path(tree).name for tree in json.loads((tmp_path / "m.json").read_text())["trees"]} & {
        "torch", "numpy", "scipy", "nvidia_cudnn_cu12", "nvidia_dali_cuda120", "einops"
    }  # fmt: skip
    assert held == {"torch", "numpy", "nvidia_cudnn_cu12"}


def _spec_of(unpinned: list[str]) -> str:
    from dataclasses import replace

    from imgbuild.pipeline.stack import ProtectedStack

    stack = replace(ProtectedStack(("torch",), tuple(unpinned)), trees=(), files=())
    return stack.spec_text()


def test_imgbuilds_own_records_and_their_folder_are_no_change(recorded, tmp_path):
    """The build itself writes its records (and their folder, where the base has none) after the record."""
    import shutil

    top = tmp_path / "copy"
    shutil.copytree(recorded, top, symlinks=True)
    mine = top / "base" / "mine"
    spec = json.loads((top / "protected.json").read_text().replace(str(recorded), str(top)))
    spec["trees"].append(str(mine))
    spec["own"] = [str(mine / "smoke.py")]
    (top / "protected.json").write_text(json.dumps(spec))
    (top / "manifest.json").write_text((top / "manifest.json").read_text().replace(str(recorded), str(top)))
    mine.mkdir()
    (mine / "smoke.py").write_text("")
    run = _runner(top)
    assert run("check", "-I", "-S", step="run").stdout == ""
    (mine / "other.txt").write_text("")
    assert f"{mine}/other.txt: added" in run("check", "-I", "-S", step="run").stdout
