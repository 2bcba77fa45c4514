"""The base's files are safe at install time: a distribution of another name that writes
over a file a base distribution owns (jax[cuda12]'s nvidia-cudnn-cu12 over a CUDA 13 base's
nvidia-cudnn-cu13, both in nvidia/cudnn/) fails the pip step, naming the package, who asked for it, whose
files, and the cure.

Real pip installs real wheels (made here) into a throwaway environment, under the real guard script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipstep import INSTALLERS, guard_folder
from tests.pipstep import wheel as _wheel
from tests.support import real_base


@pytest.fixture
def env(tmp_path, pip_bases):
    """A Python environment holding a 'base' (nvidia-cudnn-cu13 and a package with its own namespace file),
    and a folder of wheels to install on it: pip runs from this interpreter with --python."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "nvidia-cudnn-cu13", "9.20.0.48", {"nvidia/cudnn/lib/libcudnn.so.9": b"cudnn 9.20 for CUDA 13"})
    _wheel(wheels, "nvidia-cudnn-cu12", "9.10.2.21", {"nvidia/cudnn/lib/libcudnn.so.9": b"cudnn 9.10 for CUDA 12"})
    _wheel(wheels, "jax-cuda12-plugin", "0.7.2", {"jax_plugins/cuda12/__init__.py": b""}, ("nvidia-cudnn-cu12",))
    _wheel(wheels, "jax-cuda13-plugin", "0.7.2", {"jax_plugins/cuda13/__init__.py": b""}, ("nvidia-cudnn-cu13",))
    _wheel(wheels, "basetool", "1.0", {"basetool/__init__.py": b"VERSION = 1\n", "gns/__init__.py": b""})
    _wheel(wheels, "basetool", "1.1", {"basetool/__init__.py": b"VERSION = 2\n", "gns/__init__.py": b""})
    _wheel(wheels, "friend", "2.0", {"friend/__init__.py": b"", "gns/__init__.py": b""})
    _wheel(wheels, "squatter", "0.1", {"basetool/__init__.py": b"import os\n"})
    _wheel(wheels, "needs-squatter", "3.0", {"needs_squatter/__init__.py": b""}, ("squatter",))
    _wheel(wheels, "wraps-squatter", "1.0", {"wraps_squatter/__init__.py": b""})
    _wheel(wheels, "wraps-squatter", "2.0", {"wraps_squatter/__init__.py": b""}, ("squatter",))
    venv, guard = tmp_path / "venv", guard_folder(tmp_path / "pip")
    pip_bases.copy(venv, wheels, ["nvidia-cudnn-cu13", "basetool==1.0"], with_pip=False)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", "--find-links"]

    def install(*names: str, dry: bool = False) -> subprocess.CompletedProcess[str]:
        command = [*pip, str(wheels), *(["--dry-run"] if dry else []), *names]
        environ = dict(os.environ, CUDA_VERSION="13.0.2.006", PIP_DISABLE_PIP_VERSION_CHECK="1")
        return subprocess.run(
            [str(python), str(guard), "the base's pins", *command], capture_output=True, text=True, env=environ
        )

    install.site = next((venv / "lib").glob("python3*/site-packages"))  # type: ignore[attr-defined]
    return install


def test_a_dependency_for_another_cuda_that_writes_over_the_bases_cudnn_fails_the_step_naming_the_cure(env):
    proc = env("jax-cuda12-plugin")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        "imgbuild: pip step failed: nvidia-cudnn-cu12 9.10.2.21 (needed by jax-cuda12-plugin 0.7.2) would overwrite "
        "1 file(s) of the base's nvidia-cudnn-cu13 9.20.0.48 (nvidia/cudnn/lib/libcudnn.so.9); the base's files "
        "are protected, so this layer is not kept: nvidia-cudnn-cu12 is built for CUDA 12 and the base has CUDA 13: "
        "ask for the CUDA 13 build of jax-cuda12-plugin, or drop it, or use a base with CUDA 12 (the index could not "
        "be asked whether it has jax-cuda13-plugin)"  # --no-index: no index to ask
    )


def test_a_package_of_another_name_over_a_base_module_names_who_asked_and_the_cure(env):
    proc = env("needs-squatter")
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1] == (
        "imgbuild: pip step failed: squatter 0.1 (needed by needs-squatter 3.0) would overwrite 1 file(s) of the "
        "base's basetool 1.0 (basetool/__init__.py); the base's files are protected, so this layer is not kept: "
        "drop needs-squatter: no release of it resolves without squatter"  # its one release needs it
    )


def test_the_release_that_does_without_the_squatter_is_named_only_as_the_resolver_finds_it_and_installs(env):
    proc = env("wraps-squatter")
    assert proc.returncode == 1
    assert (
        proc.stdout.strip()
        .splitlines()[-1]
        .endswith(
            "this layer is not kept: pin wraps-squatter==1.0 (the newest release that resolves without squatter), or "
            "drop it"
        )
    ), proc.stdout
    followed = env("wraps-squatter==1.0")
    assert followed.returncode == 0, followed.stdout + followed.stderr


def test_a_package_the_recipe_names_over_a_base_module_is_named_as_the_recipes(env):
    direct = env("squatter")
    assert direct.returncode == 1 and direct.stdout.strip().splitlines()[-1].endswith(
        "(asked for by the recipe) would overwrite 1 file(s) of the base's basetool 1.0 (basetool/__init__.py); "
        "the base's files are protected, so this layer is not kept: drop squatter: the base's basetool provides "
        "these files"
    )


@pytest.mark.parametrize(
    "names",
    [
        ("jax-cuda13-plugin",),  # the build for the base's CUDA: its cuDNN is the base's own
        ("friend",),  # a namespace package's empty __init__.py, shared with a base package
        ("basetool==1.1",),  # the base's own package, moved on purpose (pip.unpin): its files are its own
    ],
)
def test_what_does_not_touch_another_distributions_files_installs(env, names):
    proc = env(*names)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "imgbuild:" not in proc.stdout


def test_a_resolve_only_run_installs_nothing_and_checks_nothing(env):
    proc = env("jax-cuda12-plugin", dry=True)
    assert proc.returncode == 0 and "imgbuild:" not in proc.stdout
    assert (env.site / "nvidia" / "cudnn" / "lib" / "libcudnn.so.9").read_bytes() == b"cudnn 9.20 for CUDA 13"


# --- before anything is fetched: a requirement that names another CUDA's build (plan time) ---------------


@pytest.mark.parametrize(
    ("spec", "on_cuda13", "cure"),
    [
        ("jax[cuda12]", "jax[cuda12] is built for CUDA 12", "jax[cuda13]"),
        ("jax[cuda12_pip]>=0.4", "jax[cuda12_pip] is built for CUDA 12", "jax[cuda13_pip]"),
        ("numba-cuda[cu12]", "numba-cuda[cu12] is built for CUDA 12", "numba-cuda[cu13]"),
        ("cupy-cuda12x", "cupy-cuda12x is built for CUDA 12", "cupy-cuda13x"),
        ("cupy-cuda117", "cupy-cuda117 is built for CUDA 11", "cupy-cuda13"),
        ("cudf-cu12==25.8.0", "cudf-cu12 is built for CUDA 12", "cudf-cu13"),
        ("nvidia-cudnn-cu12", "nvidia-cudnn-cu12 is built for CUDA 12", "nvidia-cudnn-cu13"),
        ("jax-cuda12-plugin", "jax-cuda12-plugin is built for CUDA 12", "jax-cuda13-plugin"),
        ("jax[cuda13]", None, None),
        ("cupy-cuda13x", None, None),
        ("cuda-python", None, None),  # names with "cuda" in them that are not a CUDA build
        ("pycuda", None, None),
        ("tensorflow-io[and-cuda]", None, None),  # no major in it: the pip step's file check judges it
    ],
)
def test_a_requirement_for_another_cuda_major_is_refused_at_plan_time_on_a_real_base(spec, on_cuda13, cure):
    """On the real 25.10 config (CUDA 13.0.2.006) and the real 24.05 one (CUDA 12.4.1.003)."""
    from packaging.requirements import Requirement

    from imgbuild.pipeline import baserules

    cuda13, cuda12 = real_base("pytorch:25.10-py3"), real_base("pytorch:24.05-py3")
    found = baserules.framework_conflict(Requirement(spec), cuda13)
    if on_cuda13 is None:
        assert found is None
    else:
        assert found is not None and found[0].startswith(f"{on_cuda13}, but the base has CUDA 13 ({cuda13.ref})")
        assert found[1] == f"ask for the CUDA 13 build ({cure}), or drop it"
    other = baserules.framework_conflict(Requirement(spec), cuda12)
    refused_on_12 = spec.startswith(("jax[cuda13]", "cupy-cuda13x", "cupy-cuda117"))
    assert (other is not None) == refused_on_12, other


def test_the_plan_names_the_line_of_a_requirement_for_another_cuda(tmp_path):
    """Through the whole plan: recipe line, field and cure, exit 2 before anything is fetched."""
    from imgbuild.errors import RecipeError
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.recipe import load_recipe
    from tests.support import settings

    base = real_base("pytorch:25.10-py3")
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "25.10"}\npip:\n  packages: [einops, "jax[cuda12]"]\n')
    config = {"config": {"Env": [f"{k}={v}" for k, v in base.env.items()]}}
    with pytest.raises(RecipeError) as err:
        make_plan(load_recipe(recipe), settings(), lambda ref: ("sha256:" + "a" * 64, config))
    (line,) = [ln.replace(f"{tmp_path}/", "") for ln in err.value.lines()]
    assert line.startswith("r.yaml:4:22: pip.packages[1]: jax[cuda12] is built for CUDA 12, but the base has CUDA 13")
    assert "ask for the CUDA 13 build (jax[cuda13]), or drop it" in line


@pytest.mark.parametrize("reachable", [True, False])
def test_a_cure_that_names_a_package_or_an_extra_is_printed_only_where_the_recipes_index_has_it(tmp_path, reachable):
    """faiss-gpu-cu12 on a CUDA 13 base was refused with the cure faiss-gpu-cu13, which is not on
    PyPI. The recipe's index is asked first: cupy-cuda13x is there and named; faiss-gpu-cu13 is not, and the
    other cure is given; an index that cannot be asked leaves the cure marked unchecked."""
    from imgbuild.errors import RecipeError
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.pipeline.resolve import cures_checked
    from imgbuild.recipe import load_recipe
    from tests.fake_index import FakeIndex, Release
    from tests.support import settings

    spacy = Release("3.8.18", extras={"cuda11x": ["cupy-cuda11x<12"], "cuda12x": ["cupy-cuda12x<13"], "lookups": []})
    jax = Release("0.8.1", extras={"cuda12": ["jax-cuda12-plugin"], "cuda13": ["jax-cuda13-plugin"]})
    index = FakeIndex("127.0.0.1", {"cupy-cuda13x": [Release("13.6.0")], "spacy": [spacy], "jax": [jax]})
    url = index.url if reachable else "http://127.0.0.1:9/simple"
    base = real_base("pytorch:25.10-py3")
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        'name: r\nbase: {framework: pytorch, tag: "25.10"}\n'
        f"pip: {{packages: [faiss-gpu-cu12, cupy-cuda12x, 'jax[cuda12]', 'spacy[cuda12x]'], index_url: '{url}'}}\n"
    )
    config = {"config": {"Env": [f"{k}={v}" for k, v in base.env.items()]}}
    loaded = load_recipe(recipe)
    try:
        with pytest.raises(RecipeError) as err, cures_checked(loaded, settings()):
            make_plan(loaded, settings(), lambda ref: ("sha256:" + "a" * 64, config))
    finally:
        index.close()
    faiss, cupy, jax, spacy_line = (ln.split(": ", 2)[2] for ln in err.value.lines())
    if reachable:
        assert faiss.endswith(
            "(the index has no CUDA 13 build of faiss-gpu-cu12 (faiss-gpu-cu13 is not there): drop it, or use a "
            "base with CUDA 12)"
        ), faiss
        assert cupy.endswith("(ask for the CUDA 13 build (cupy-cuda13x), or drop it)")
        assert jax.endswith("(ask for the CUDA 13 build (jax[cuda13]), or drop it)")  # an extra the project declares
        assert spacy_line.endswith(  # an extra it does not: what its CUDA 12 extra brings, for CUDA 13
            "(spacy declares no [cuda13x] extra: ask for spacy and cupy-cuda13x (the CUDA 13 build of what its "
            "[cuda12x] extra brings), or drop it)"
        ), spacy_line
    else:
        assert faiss.endswith("or drop it; the index could not be asked whether it has faiss-gpu-cu13)"), faiss
        assert spacy_line.endswith("; the index could not be asked whether it has spacy[cuda13x])"), spacy_line


def test_an_extra_the_project_lacks_is_cured_by_what_its_extra_brings_only_where_the_index_has_that():
    """spacy[cuda13x] does not exist, and its cure is spacy beside cupy-cuda13x: named only where the index has
    cupy-cuda13x; where it does not, what would be needed is said and no package is invented."""
    from imgbuild.pipeline.baserules import extra_cure

    extras = {"cuda11x": ("cupy-cuda11x",), "cuda12x": ("cupy-cuda12x",), "lookups": ()}
    asked: list[str] = []

    def index(answer: bool | None):
        return lambda name: asked.append(name) or answer

    there = extra_cure("spacy[cuda13x]", extras, index(True))
    assert asked == ["cupy-cuda13x"]
    assert there.startswith("spacy declares no [cuda13x] extra: ask for spacy and cupy-cuda13x"), there
    missing = extra_cure("spacy[cuda13x]", extras, index(False))
    assert "ask for" not in missing, missing
    assert missing == (
        "spacy declares no [cuda13x] extra, and the index has no cupy-cuda13x (the CUDA 13 build of what its "
        "[cuda12x] extra brings): what would be needed is a CUDA 13 build of cupy-cuda12x; drop it, or use a base "
        "with CUDA 12"
    )
    unsure = extra_cure("spacy[cuda13x]", extras, index(None))
    assert unsure.endswith("or drop it; the index could not be asked whether it has cupy-cuda13x"), unsure


# --- the real pip step on the CUDA 13 stand-in, whose cuDNN is NVIDIA's nvidia-cudnn-cu13 wheel ------------


@pytest.mark.engine
def test_a_dependency_writing_over_the_stand_ins_cudnn_fails_the_pip_step_and_tags_nothing(
    testbed, tmp_path, docker_client
):
    """`jaxish-plugin` (no CUDA in its name: the plan cannot know) needs `nvidia-cudnn-cu12`, whose wheel
    writes nvidia/cudnn/lib/libcudnn.so.9 as jax[cuda12]'s does: the step fails with the package, who asked,
    whose file and the cure (its CUDA 13 build, asked of the index first), and no image is tagged."""
    import uuid

    from tests.conftest import bridge_gateway, run_cli
    from tests.fake_index import FakeIndex, Release

    gateway = bridge_gateway(docker_client)
    cudnn12 = {"nvidia/cudnn/lib/libcudnn.so.9": b"\x7fELF cudnn 9.10 for CUDA 12"}
    index = FakeIndex(
        gateway,
        {
            "jaxish-plugin": [Release("0.7.2", ["nvidia-cudnn-cu12"])],
            "jaxish-plugin-cu13": [Release("0.7.2")],  # its CUDA 13 build, which the cure names once the index has it
            "nvidia-cudnn-cu12": [Release("9.10.2.21", files=cudnn12)],
        },
    )
    (tmp_path / ".git").mkdir()
    name = f"cuda12-{uuid.uuid4().hex[:8]}"
    recipe = tmp_path / "r.yaml"
    pip = f'{{packages: [jaxish-plugin], index_url: "{index.url}", trusted_hosts: ["{gateway}"]}}'
    recipe.write_text(f'name: {name}\nbase: {{framework: pytorch, tag: "25.10"}}\npip: {pip}\n')
    try:
        res = run_cli("build", str(recipe), cwd=tmp_path)
    finally:
        index.close()
    assert res.code == 1, res.err[-3000:]
    assert "build failed at the pip step" in res.err, res.err[-3000:]
    assert (
        "nvidia-cudnn-cu12 9.10.2.21 (needed by jaxish-plugin 0.7.2) would overwrite 1 file(s) of the base's "
        "nvidia-cudnn-cu13 9.20.0.48 (nvidia/cudnn/lib/libcudnn.so.9)"
    ) in res.err, res.err[-3000:]
    assert "ask for its CUDA 13 build, jaxish-plugin-cu13 (on the index), or use a base with CUDA 12" in res.err
    assert not [i for i in docker_client.images.list() if any(name in t for t in i.tags)]


def test_the_pip_steps_reading_of_a_cuda_build_is_the_plans():
    """owners.py runs in the base without imgbuild, so it carries its own copy of ngc.cuda_build: the two agree."""
    import importlib.util

    from imgbuild import ngc

    spec = importlib.util.spec_from_file_location(
        "owners", Path(__file__).parent.parent / "imgbuild/payload/pip_owners.py"
    )
    assert spec and spec.loader
    owners = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(owners)
    assert owners.CUDA_BUILD_RE.pattern == ngc.CUDA_BUILD_RE.pattern
    names = ["nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "cupy-cuda12x", "cupy-cuda117", "cupy-cuda102", "cudf-cu12",
             "jax-cuda12-plugin", "nvidia-cuda-runtime-cu13", "cuda-python", "pycuda", "numba-cuda", "cu12", "torch"]  # fmt: skip
    assert [owners.cuda_build(n) for n in names] == [ngc.cuda_build(n) for n in names]


def test_an_index_that_does_not_answer_is_asked_once_however_many_cures_name_a_package(tmp_path, monkeypatch):
    """Ten refusals whose cures name a package, and an index that does not answer: one question, bounded by its
    deadline, not ten; each line still says the index could not be asked."""
    from imgbuild.errors import RecipeError
    from imgbuild.pipeline import resolve
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.recipe import load_recipe
    from imgbuild.registry import pypi
    from tests.support import settings

    asked = []
    monkeypatch.setattr(pypi, "has_project", lambda index, name, **kw: asked.append(name))  # None: no answer
    base = real_base("pytorch:25.10-py3")
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    names = [f"lib{c}-cu12" for c in "abcdefghij"]  # each refused, each cure a -cu13 project
    recipe.write_text(f'name: r\nbase: {{framework: pytorch, tag: "25.10"}}\npip: {{packages: {names}}}\n')
    config = {"config": {"Env": [f"{k}={v}" for k, v in base.env.items()]}}
    loaded = load_recipe(recipe)
    with pytest.raises(RecipeError) as err, resolve.cures_checked(loaded, settings()):
        make_plan(loaded, settings(), lambda ref: ("sha256:" + "a" * 64, config))
    assert len(asked) == 1 and len(err.value.lines()) == 10
    assert all("the index could not be asked whether it has" in line for line in err.value.lines())


@pytest.mark.parametrize("installer", INSTALLERS)
@pytest.mark.parametrize("package", ["vecsearch", "vecsearch-cu12"])
def test_a_package_bringing_another_cuda_is_judged_by_what_it_brings_not_its_name(
    tmp_path, pip_bases, monkeypatch, installer, package
):
    """faiss-gpu (no CUDA in its name) brought the 1.9 GB CUDA 12 runtime onto a CUDA 13 base unsaid, while
    faiss-gpu-cu12 (the same wheels) was refused: the pip step judges both by the libraries they bring."""
    from tests.pipstep import PipStep, wheel

    monkeypatch.setenv("CUDA_VERSION", "13.0.2.006")
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "nvidia-cublas-cu12", "12.9.1.4", {"nvidia/cublas/lib/libcublas.so.12": b"cublas 12"})
    wheel(folder, "nvidia-cublas", "13.1.0.3", {"nvidia/cu13/lib/libcublas.so.13": b"cublas 13"})
    wheel(folder, package, "1.13.2", {f"{package.replace('-', '_')}/__init__.py": b""}, ("nvidia-cublas-cu12",))
    step = PipStep(pip_bases, tmp_path, folder, ["nvidia-cublas"], installer=installer)
    said = step.failure(step.run([package]))
    assert said == (
        f"{package} brought CUDA 12 libraries (nvidia-cublas-cu12) beside the base's CUDA 13: its code is built for "
        "them, as a package named for CUDA 12 is (refused before the build): ask for the CUDA 13 build of "
        f"{package}, or drop it, or use a base with CUDA 12 (the index could not be asked whether it has "
        "vecsearch-cu13)"
    )


@pytest.mark.parametrize(
    "package, there, cure",
    [
        ("vecsearch", True, "ask for its CUDA 13 build, vecsearch-cu13 (on the index), or use a base with CUDA 12"),
        ("vecsearch-cu12", True, "ask for its CUDA 13 build, vecsearch-cu13 (on the index)"),
        ("vecsearch", False, "the index has no CUDA 13 build of vecsearch (vecsearch-cu13 is not there): drop it"),
        ("vecsearch", None, "the index could not be asked whether it has vecsearch-cu13"),
    ],
)
def test_the_cuda_build_a_pip_step_cure_names_is_one_the_index_has(package, there, cure):
    """faiss-gpu's cure named "the CUDA 13 build of faiss-gpu", which PyPI does not have: the build is asked of the
    index first, and named only where it is there."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "owners", Path(__file__).parent.parent / "imgbuild/payload/pip_owners.py"
    )
    assert spec and spec.loader
    owners = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(owners)
    asked = []
    said = owners.cuda_build_cure(package, "12", "13", lambda name: asked.append(name) or there)
    assert cure in said and asked == ["vecsearch-cu13"], said
