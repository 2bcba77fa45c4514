"""pip.no_build_isolation: packages whose build imports the base's framework (flash-attn, apex, torch-scatter)
are built against the base's own packages. Real pip under imgbuild's install.sh and guard, real source
distributions with a build backend of their own (tests/pipstep.py), and the recipe field and its rendering.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.pipstep import INSTALLERS, PipStep, sdist, wheel

TORCH = "2.13.0a0+07cecf4"

BACKEND = """
import base64, hashlib, os, subprocess, zipfile

NAME, VERSION = "srcpkg", "1.0"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    import torch  # what a package that compiles against the framework does while it builds

    COMPILE
    dist = f"{NAME}-{VERSION}.dist-info"
    files = {
        f"{NAME}/__init__.py": f"BUILT_AGAINST = {torch.__version__!r}\\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    def line(path, data):
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        return f"{path},sha256={digest},{len(data)}\\n"
    record = "".join(line(p, d) for p, d in files.items()) + f"{dist}/RECORD,,\\n"
    filename = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{dist}/RECORD", record)
    return filename
"""


def _index(folder, compile_step: str = "pass"):
    folder.mkdir()
    wheel(folder, "torch", TORCH, {"torch/__init__.py": f"__version__ = {TORCH!r}\n".encode()})
    sdist(folder, "srcpkg", "1.0", BACKEND.replace("COMPILE", compile_step))
    return folder


#: The one line's start where srcpkg and srcpkg-two both import the framework to build.
BOTH_NEED_THE_FRAMEWORK = (
    "building srcpkg and srcpkg-two import the base's framework, which the isolated build environment lacks: add "
    "srcpkg, srcpkg-two to pip.no_build_isolation,"
)


def _index_with_cpkg(folder):
    """The index of _index, with cpkg (its build needs a compiler the base lacks, not the framework) and srcpkg-two
    (its build imports the framework, as srcpkg's does)."""
    _index(folder)
    no_compiler = 'subprocess.run(["/bin/sh", "-c", "c++ --version"], env={"PATH": "/nonexistent"}, check=True)'
    compiles = BACKEND.replace("import torch", "pass").replace("torch.__version__", "'none'")
    sdist(folder, "cpkg", "1.0", compiles.replace("COMPILE", no_compiler).replace('"srcpkg"', '"cpkg"'))
    sdist(folder, "srcpkg-two", "1.0", BACKEND.replace("COMPILE", "pass").replace('"srcpkg"', '"srcpkg_two"'))
    return folder


@pytest.fixture(params=INSTALLERS)
def step(tmp_path, pip_bases, request):
    return PipStep(pip_bases, tmp_path, _index(tmp_path / "index"), ["torch"], installer=request.param)


def test_a_package_that_builds_against_the_framework_fails_isolated_and_names_the_field_that_cures_it(step):
    said = step.failure(step.run(["srcpkg"]))
    said = said.removesuffix("; it needs a C/C++ compiler too, which the base lacks: add apt: [g++, python3-dev]")
    assert said == (  # (the compiler is named too where this machine has none)
        "building srcpkg imports the base's framework, which the isolated build environment lacks: add srcpkg to "
        "pip.no_build_isolation, so that it builds against the base's own framework"
    )


def test_the_cure_builds_it_against_the_bases_own_framework(step, monkeypatch):
    import shutil

    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # as in an image: Python writes its caches
    caches = list(step.venv.glob("lib/python*/site-packages/torch/__pycache__"))
    for cache in caches:  # a base whose files carry no bytecode cache (the stand-ins' setuptools)
        shutil.rmtree(cache)
    done = step.run(["srcpkg"], **{"no-build-isolation": "srcpkg\n"})
    # the build imported the base's torch and wrote nothing into the base's folders (no change of its stack)
    assert caches and not list(step.venv.glob("lib/python*/site-packages/torch/__pycache__"))
    assert done.returncode == 0, done.stdout + done.stderr
    if step.installer == "pip":  # pip builds them first, alone; uv per package (--no-build-isolation-package)
        assert "imgbuild: building srcpkg against the base's own packages (pip.no_build_isolation)" in done.stdout
    built = subprocess.run([str(step.python), "-c", "import srcpkg; print(srcpkg.BUILT_AGAINST)"], capture_output=True)
    assert built.stdout.decode().strip() == TORCH  # the base's torch, not one an isolated build fetched
    assert step.pip("show", "torch").stdout.splitlines()[1] == f"Version: {TORCH}"


@pytest.mark.parametrize(
    "compile_step",
    [
        'subprocess.run(["/bin/sh", "-c", "c++ --version"], env={"PATH": "/nonexistent"}, check=True)',
        # setuptools and torch's BuildExtension call the compiler themselves (torchsort on the stand-in)
        'subprocess.run(["x86_64-linux-gnu-g++", "--version"], env={"PATH": "/nonexistent"}, check=True)',
    ],
)
@pytest.mark.parametrize("installer", INSTALLERS)
def test_a_source_build_without_a_compiler_names_the_apt_package_that_cures_it(
    tmp_path, pip_bases, compile_step, installer
):
    step = PipStep(pip_bases, tmp_path, _index(tmp_path / "index", compile_step), ["torch"], installer=installer)
    said = step.failure(step.run(["srcpkg"], **{"no-build-isolation": "srcpkg\n"}))
    assert (
        said
        == "building srcpkg needs a C/C++ compiler, which the base lacks: add apt: [g++, python3-dev] to the recipe"
    )


@pytest.mark.parametrize("installer", INSTALLERS)
def test_a_source_build_without_pythons_headers_names_the_apt_package_that_cures_it(tmp_path, pip_bases, installer):
    """A compiler but no Python.h (a slim base; the stand-in after apt: [g++]): gcc fails, and the cure is the
    headers, not the compiler again."""
    compile_step = (
        'subprocess.run(["/bin/sh", "-c", "echo \'fatal error: Python.h: No such file or directory\'; '
        'echo "error: command \'/usr/bin/x86_64-linux-gnu-gcc\' failed"; exit 1"], check=True)'
    )
    step = PipStep(pip_bases, tmp_path, _index(tmp_path / "index", compile_step), ["torch"], installer=installer)
    said = step.failure(step.run(["srcpkg"], **{"no-build-isolation": "srcpkg\n"}))
    assert said == (
        "building srcpkg needs Python's C headers (Python.h), which the base lacks: add apt: [python3-dev] to the recipe"
    )


@pytest.mark.parametrize("installer", INSTALLERS)
def test_a_source_build_without_nvcc_names_the_base_that_has_it(tmp_path, pip_bases, installer):
    compile_step = 'subprocess.run(["/bin/sh", "-c", "nvcc --version"], env={"PATH": "/nonexistent"}, check=True)'
    step = PipStep(pip_bases, tmp_path, _index(tmp_path / "index", compile_step), ["torch"], installer=installer)
    said = step.failure(step.run(["srcpkg"], **{"no-build-isolation": "srcpkg\n"}))
    assert said.startswith("building srcpkg needs CUDA's compiler (nvcc), which the base lacks: use a base that")


@pytest.mark.parametrize("installer", INSTALLERS)
def test_every_package_that_needs_the_same_build_cure_is_named_in_one_round(tmp_path, pip_bases, installer):
    """TorchDrug and PyG in miniature: two source builds import the framework, and the one line names both. uv is
    asked again, per package, until the set resolves; pip, which has one switch for all builds, resolves once with
    it and then asks each other package it built from source alone, isolated."""
    folder = _index(tmp_path / "index")
    sdist(folder, "srcpkg-two", "1.0", BACKEND.replace("COMPILE", "pass").replace('"srcpkg"', '"srcpkg_two"'))
    sdist(
        folder,
        "plainsrc",
        "1.0",
        BACKEND.replace("import torch", "pass")
        .replace("torch.__version__", "'none'")
        .replace("COMPILE", "pass")
        .replace('"srcpkg"', '"plainsrc"'),
    )
    step = PipStep(pip_bases, tmp_path, folder, ["torch"], installer=installer)
    said = step.failure(step.run(["srcpkg", "plainsrc", "srcpkg-two"]))
    said = said.replace("; it needs a C/C++ compiler too, which the base lacks: add apt: [g++, python3-dev]", "")
    assert said == (
        "building srcpkg and srcpkg-two import the base's framework, which the isolated build environment "
        "lacks: add srcpkg, srcpkg-two to pip.no_build_isolation, so that they build against the base's own "
        "framework"
    )
    done = step.run(["srcpkg", "srcpkg-two"], **{"no-build-isolation": "srcpkg\nsrcpkg-two\n"})
    assert done.returncode == 0, done.stdout + done.stderr  # the cure named is the cure that works


@pytest.mark.parametrize("installer", INSTALLERS)
@pytest.mark.parametrize(
    "layout",
    ["relative find-links", "nested requirement file", "local path", "extras and a version range, spelled otherwise"],
)
def test_a_package_however_the_recipe_asks_for_it_is_named_with_the_others(tmp_path, pip_bases, installer, layout):
    """srcpkg-two lies in a folder of its own, which the recipe's requirement file reaches by a path relative to
    itself, through another requirement file, or by the file's own path; or it is asked with extras and a range,
    spelled otherwise: asked alone, it is still found as the recipe asks for it, and named with srcpkg."""
    folder = _index(tmp_path / "index")
    extra = tmp_path / "pip" / "extra"
    extra.mkdir(parents=True)
    sdist(extra, "srcpkg-two", "1.0", BACKEND.replace("COMPILE", "pass").replace('"srcpkg"', '"srcpkg_two"'))
    step = PipStep(pip_bases, tmp_path, folder, ["torch"], installer=installer)
    if layout == "nested requirement file":
        (tmp_path / "pip" / "more.txt").write_text("-f extra\nsrcpkg-two\n")
        asked = ["srcpkg", "-r more.txt"]
    elif layout == "local path":
        asked = [str(folder / "srcpkg-1.0.tar.gz"), str(extra / "srcpkg-two-1.0.tar.gz")]
    elif layout == "extras and a version range, spelled otherwise":
        asked = ["--find-links=extra", "srcpkg", "Srcpkg_Two[fast]>=1.0"]
    else:
        asked = ["--find-links=extra", "srcpkg", "srcpkg-two"]
    said = step.failure(step.run(asked))
    said = said.replace("; it needs a C/C++ compiler too, which the base lacks: add apt: [g++, python3-dev]", "")
    assert said == (
        "building srcpkg and srcpkg-two import the base's framework, which the isolated build environment "
        "lacks: add srcpkg, srcpkg-two to pip.no_build_isolation, so that they build against the base's own "
        "framework"
    )


@pytest.mark.parametrize("installer", INSTALLERS)
def test_eight_packages_that_need_the_same_build_cure_are_all_named_in_one_round(tmp_path, pip_bases, installer):
    """A recipe of many extensions (PyG's family and more): every one whose build imports the framework is named,
    however many, and the plain source builds among them are not."""
    folder = _index(tmp_path / "index")
    needing = ["srcpkg", *(f"ext{n}" for n in range(1, 8))]
    for name in needing[1:]:
        sdist(folder, name, "1.0", BACKEND.replace("COMPILE", "pass").replace('"srcpkg"', f'"{name}"'))
    plain = BACKEND.replace("import torch", "pass").replace("torch.__version__", "'none'").replace("COMPILE", "pass")
    for name in ("plain1", "plain2"):
        sdist(folder, name, "1.0", plain.replace('"srcpkg"', f'"{name}"'))
    step = PipStep(pip_bases, tmp_path, folder, ["torch"], installer=installer)
    said = step.failure(step.run(["srcpkg", "plain1", *needing[1:4], "plain2", *needing[4:]]))
    said = said.replace("; it needs a C/C++ compiler too, which the base lacks: add apt: [g++, python3-dev]", "")
    assert said.startswith("building ext1, ext2, ext3, ext4, ext5, ext6, ext7 and srcpkg import the base's framework")
    assert f"add {', '.join(sorted(needing))} to pip.no_build_isolation," in said


@pytest.mark.parametrize("installer", INSTALLERS)
@pytest.mark.parametrize("asked", [["srcpkg", "cpkg", "srcpkg-two"], ["cpkg", "srcpkg", "srcpkg-two"]])
def test_a_package_that_fails_its_build_for_another_reason_hides_none_that_need_the_framework(
    tmp_path, pip_bases, installer, asked
):
    """cpkg's build needs a compiler the base lacks, not the framework; between srcpkg and srcpkg-two or before
    both, whose builds import it. The installer's resolve stops at cpkg's failed build, yet the one line names both
    cures: the field with both packages (never cpkg), then the compiler."""
    folder = _index_with_cpkg(tmp_path / "index")
    step = PipStep(pip_bases, tmp_path, folder, ["torch"], installer=installer)
    said = step.failure(step.run(asked))
    assert said.startswith(BOTH_NEED_THE_FRAMEWORK), said
    assert said.endswith(
        "; then building cpkg needs a C/C++ compiler, which the base lacks: add apt: [g++, python3-dev] to the recipe"
    ), said


@pytest.mark.parametrize("installer", INSTALLERS)
@pytest.mark.parametrize("cpkg_asked_by", ["the recipe", "a wheel the recipe asks for", "a wheel's extra"])
def test_a_dependency_that_needs_the_framework_behind_a_build_that_fails_otherwise_is_named(
    tmp_path, pip_bases, installer, cpkg_asked_by
):
    """srcpkg-two is no line of the recipe: parent, a wheel the recipe asks for after cpkg (whose build needs a
    compiler the base lacks), depends on it; cpkg is a line of the recipe, or the dependency of another wheel's extra
    (the recipe spelling the wheel as the installer does, or otherwise). The resolve that stops at cpkg never reached
    srcpkg-two; the cure names it with srcpkg all the same, and never cpkg."""
    folder = _index_with_cpkg(tmp_path / "index")
    wheel(folder, "parent", "1.0", {"parent/__init__.py": b""}, ("srcpkg-two",))
    asked = ["srcpkg", "cpkg", "parent"]
    if cpkg_asked_by != "the recipe":
        wheel(folder, "needs-c", "1.0", {"needs_c/__init__.py": b""}, ("cpkg; extra == 'c'",), extras=("c",))
        asked = ["srcpkg", "Needs_C[c]" if cpkg_asked_by == "a wheel's extra" else "needs-c[c]", "parent"]
    step = PipStep(pip_bases, tmp_path, folder, ["torch"], installer=installer)
    said = step.failure(step.run(asked))
    assert said.startswith(BOTH_NEED_THE_FRAMEWORK), said
    assert "; then building cpkg needs a C/C++ compiler, which the base lacks" in said, said


@pytest.mark.parametrize("installer", INSTALLERS)
def test_two_builds_failing_for_two_other_reasons_name_both_tools_with_those_that_need_the_framework(
    tmp_path, pip_bases, installer
):
    """cpkg needs a compiler and nvpkg CUDA's compiler, both lacking in the base, between srcpkg and srcpkg-two,
    which import the framework: one line names the field with both, and both tools, each once."""
    folder = _index(tmp_path / "index")
    compiles = BACKEND.replace("import torch", "pass").replace("torch.__version__", "'none'")
    for name, tool in (("cpkg", "c++ --version"), ("nvpkg", "nvcc --version"), ("cpkg2", "c++ --version")):
        missing = f'subprocess.run(["/bin/sh", "-c", "{tool}"], env={{"PATH": "/nonexistent"}}, check=True)'
        sdist(folder, name, "1.0", compiles.replace("COMPILE", missing).replace('"srcpkg"', f'"{name}"'))
    sdist(folder, "srcpkg-two", "1.0", BACKEND.replace("COMPILE", "pass").replace('"srcpkg"', '"srcpkg_two"'))
    step = PipStep(pip_bases, tmp_path, folder, ["torch"], installer=installer)
    said = step.failure(step.run(["srcpkg", "cpkg", "nvpkg", "cpkg2", "srcpkg-two"]))
    assert said.startswith(BOTH_NEED_THE_FRAMEWORK), said
    assert said.count("; then building") == 2, said
    assert "; then building cpkg needs a C/C++ compiler, which the base lacks" in said, said
    assert "; then building nvpkg needs CUDA's compiler (nvcc), which the base lacks" in said, said


@pytest.mark.parametrize("installer", INSTALLERS)
def test_the_build_tool_a_package_needs_once_built_against_the_base_is_named_in_the_same_round(
    tmp_path, pip_bases, installer
):
    """Mamba in miniature: causal-conv1d imports torch in its setup.py, then runs nvcc as apex's helper does
    (Python's FileNotFoundError): the field and the missing nvcc in one line, not two rounds."""
    nvcc = 'subprocess.check_output(["/opt/no-cuda/bin/nvcc", "-V"])'
    step = PipStep(pip_bases, tmp_path, _index(tmp_path / "index", nvcc), ["torch"], installer=installer)
    said = step.failure(step.run(["srcpkg"]))
    assert said.startswith("building srcpkg imports the base's framework") and "add srcpkg to pip.no_build_isolation"
    assert said.endswith(
        "; then building srcpkg needs CUDA's compiler (nvcc), which the base lacks: use a base that carries the CUDA "
        "toolkit: NGC's framework images have /usr/local/cuda/bin/nvcc; a runtime or CPU-only base does not"
    )


@pytest.mark.parametrize("installer", INSTALLERS)
def test_a_build_tool_missing_for_the_first_package_hides_none_after_it(tmp_path, pip_bases, installer):
    """Mamba as its README installs it: causal-conv1d and mamba-ssm both import torch to build, and the first then
    needs nvcc, which the base lacks. Once the first is built against the base its resolve fails at nvcc; the second,
    never reached, is still asked for and named in the same line as the tool."""
    nvcc = 'subprocess.check_output(["/opt/no-cuda/bin/nvcc", "-V"])'
    folder = _index(tmp_path / "index", nvcc)
    sdist(folder, "srcpkg-two", "1.0", BACKEND.replace("COMPILE", "pass").replace('"srcpkg"', '"srcpkg_two"'))
    step = PipStep(pip_bases, tmp_path, folder, ["torch"], installer=installer)
    said = step.failure(step.run(["srcpkg", "srcpkg-two"]))
    assert "add srcpkg, srcpkg-two to pip.no_build_isolation" in said, said
    assert "building srcpkg needs CUDA's compiler (nvcc), which the base lacks" in said, said


@pytest.mark.parametrize(
    "names, message",
    [
        (["torch"], "is the base's framework or CUDA stack: never unpinned or rebuilt"),
        (["tensorflow-cpu"], "is the base's framework or CUDA stack"),
        (["nvidia-cudnn-cu12"], "is the base's framework or CUDA stack"),
        (["flash attn"], "not a package name"),
        (["flash-attn; rm -rf /"], "not a package name"),
        (["flash-attn>=2"], "not a package name"),
        (["--no-index"], "not a package name"),
        (["x"] * 65, "at most 64"),
    ],
)
def test_no_build_isolation_takes_package_names_only_and_never_the_framework(tmp_path, names, message):
    import json

    from imgbuild.errors import RecipeError
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    pip = {"packages": ["flash-attn"], "no_build_isolation": names}
    recipe.write_text(f'name: r\nbase: {{framework: pytorch, tag: "24.05"}}\npip: {json.dumps(pip)}\n')
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe, environ={})
    assert any(message in p.message and "no_build_isolation" in p.field for p in caught.value.problems), caught.value


def test_render_builds_the_recipes_own_requirement_for_each_named_package(tmp_path):
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.pipeline.render import render
    from imgbuild.recipe import load_recipe
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        'name: r\nbase: {framework: pytorch, tag: "24.05"}\n'
        "pip: {packages: [einops, 'Flash_Attn>=2.6,<2.8'], index_url: 'https://idx.example/simple',"
        " no_build_isolation: [flash-attn, causal-conv1d]}\n"
    )
    context = render(make_plan(load_recipe(recipe, environ={}), settings(), fake_inspect))
    lines = context.text("imgbuild/pip/no-build-isolation.txt").splitlines()
    assert lines[-2:] == ["Flash_Attn>=2.6,<2.8", "causal-conv1d"]  # a dependency's: the bare name
    assert "--index-url https://idx.example/simple" in lines  # built from the recipe's index


@pytest.mark.engine
def test_on_the_bed_a_source_build_fails_isolated_then_builds_against_the_bases_torch_and_stays_cached(
    testbed, tmp_path, cleanup_images, docker_client
):
    """The loop a user follows, with uv (the default installer) in the stand-in PyTorch base: the build names the
    field; with it the package builds against the base's own torch, imports, and an unrelated edit later does not
    fetch or build it again (uv's cache mount keeps the wheel)."""
    import uuid

    from tests.conftest import bridge_gateway, in_image, run_cli
    from tests.fake_index import FakeIndex, Release
    from tests.pipstep import sdist_bytes

    gateway = bridge_gateway(docker_client)
    index = FakeIndex(
        gateway,
        {"tinydep": [Release("1.0")]},
        sources={"srcpkg-1.0.tar.gz": sdist_bytes("srcpkg", "1.0", BACKEND.replace("COMPILE", "pass"))},
    )
    (tmp_path / ".git").mkdir()
    name = f"srcbuild-{uuid.uuid4().hex[:8]}"
    recipe = tmp_path / "r.yaml"
    head = f'name: {name}\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\n'
    where = f'index_url: "{index.url}", trusted_hosts: ["{gateway}"]'
    try:
        recipe.write_text(head + f"pip: {{packages: [srcpkg], {where}}}\n")
        isolated = run_cli("build", str(recipe), cwd=tmp_path)
        assert isolated.code == 1, isolated.err[-3000:]
        assert "add srcpkg to pip.no_build_isolation" in isolated.err, isolated.err[-3000:]
        recipe.write_text(head + f"pip: {{packages: [srcpkg], no_build_isolation: [srcpkg], {where}}}\n")
        built = run_cli("build", str(recipe), cwd=tmp_path)
        assert built.code == 0, built.err[-3000:]
        image = built.out.strip().splitlines()[-1].split(" -> ")[0]
        cleanup_images.append(image)
        torch = in_image(docker_client, image, "import torch; print(torch.__version__)").strip()
        assert in_image(docker_client, image, "import srcpkg; print(srcpkg.BUILT_AGAINST)").strip() == torch
        index.served.clear()
        recipe.write_text(
            head.replace("v1", "v2") + f"pip: {{packages: [srcpkg, tinydep], no_build_isolation: [srcpkg], {where}}}\n"
        )
        again = run_cli("build", str(recipe), cwd=tmp_path)
        assert again.code == 0, again.err[-3000:]
        cleanup_images.append(again.out.strip().splitlines()[-1].split(" -> ")[0])
        assert "srcpkg-1.0.tar.gz" not in index.served  # built once: the wheel came from the build's cache
    finally:
        index.close()


@pytest.mark.engine
def test_on_the_bed_a_source_build_without_a_compiler_is_cured_by_the_apt_line_it_names(
    testbed, tmp_path, cleanup_images, docker_client
):
    """The stand-in base has no C++ compiler (a slim base): the build says which apt package cures it, and the
    recipe with that line builds, the package compiled in the image against the base's torch."""
    import uuid

    from tests.conftest import bridge_gateway, in_image, run_cli
    from tests.fake_index import FakeIndex
    from tests.pipstep import sdist_bytes

    compile_step = (
        'subprocess.run(["/bin/sh", "-c", "echo \'int f(void) { return 1; }\' | c++ -x c++ -c -o /dev/null -"], '
        "check=True)"
    )
    index = FakeIndex(
        bridge_gateway(docker_client),
        {},
        sources={"srcpkg-1.0.tar.gz": sdist_bytes("srcpkg", "1.0", BACKEND.replace("COMPILE", compile_step))},
    )
    (tmp_path / ".git").mkdir()
    name = f"compiler-{uuid.uuid4().hex[:8]}"
    recipe = tmp_path / "r.yaml"
    head = f'name: {name}\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\n'
    host = index.url.split("/")[2].split(":")[0]
    pip = f'pip: {{packages: [srcpkg], no_build_isolation: [srcpkg], index_url: "{index.url}", trusted_hosts: ["{host}"]}}\n'
    try:
        recipe.write_text(head + pip)
        bare = run_cli("build", str(recipe), cwd=tmp_path)
        assert bare.code == 1, bare.err[-3000:]
        assert (
            "building srcpkg needs a C/C++ compiler, which the base lacks: add apt: [g++, python3-dev] to the recipe"
            in bare.err
        )
        recipe.write_text(head + "apt: [g++, python3-dev]\n" + pip)  # the line it named, literally
        cured = run_cli("build", str(recipe), cwd=tmp_path)
        assert cured.code == 0, cured.err[-3000:]
        image = cured.out.strip().splitlines()[-1].split(" -> ")[0]
        cleanup_images.append(image)
        assert in_image(docker_client, image, "import srcpkg; print(srcpkg.BUILT_AGAINST)").strip()
    finally:
        index.close()


#: Real packages users build against the base's torch (NGC's own advice for extensions: `pip install
#: --no-build-isolation`), from PyPI, each with a check of its own that runs its compiled code: torchsort's C++
#: isotonic regression, fast-transformers' CPU causal product (OpenMP C++), DeepSpeed's own environment report
#: (its setup imports torch to decide which ops to build; ops JIT later).
REAL_SOURCE_BUILDS = """\
name: {name}
tag: v1
base: {{framework: pytorch, tag: "24.05"}}
apt: [g++, python3-dev]
pip:
  packages: [torchsort==0.1.10, pytorch-fast-transformers==0.4.0, deepspeed==0.19.8]
  no_build_isolation: [torchsort, pytorch-fast-transformers, deepspeed]
smoke:
  run:
    - python3 -c "import torch, torchsort; r = torchsort.soft_rank(torch.tensor([[3.0, 1.0, 2.0]])); assert r.tolist() == [[3.0, 1.0, 2.0]], r"
    - python3 -c "import torch; from fast_transformers.causal_product import causal_dot_product as c; q = torch.ones(1, 1, 3, 2); assert c(q, q, q)[0, 0, :, 0].tolist() == [2.0, 4.0, 6.0]"
    - ds_report
"""


@pytest.mark.engine
def test_on_the_bed_real_packages_build_against_the_bases_torch_and_run_their_own_checks(
    testbed, tmp_path, cleanup_images, docker_client
):
    """Three real source builds from PyPI (torchsort, pytorch-fast-transformers, DeepSpeed) in the
    stand-in PyTorch base, with uv, built against the base's own torch: the image keeps the base's torch, and each
    package's compiled code runs in the image's smoke test."""
    import uuid

    from tests.conftest import in_image, run_cli

    (tmp_path / ".git").mkdir()
    name = f"realsrc-{uuid.uuid4().hex[:8]}"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(REAL_SOURCE_BUILDS.format(name=name))
    built = run_cli("build", str(recipe), cwd=tmp_path, timeout=1500)
    assert built.code == 0, built.err[-4000:]
    image = built.out.strip().splitlines()[-1].split(" -> ")[0]
    cleanup_images.append(image)
    base = f"{os.environ['IMGBUILD_NGC_REGISTRY']}/nvidia/pytorch:24.05-py3"
    base_torch = in_image(docker_client, base, "import torch; print(torch.__version__)").split()[-1]
    said = in_image(
        docker_client,
        image,
        "import torch, torchsort.isotonic_cpu as a, fast_transformers.causal_product.causal_product_cpu as b\n"
        "print(a.__file__, b.__file__, torch.__version__)",
    ).split()
    assert said[0].endswith(".so") and said[1].endswith(".so"), said  # compiled in the image
    assert said[2] == base_torch  # against the base's torch, which is still the one imported
