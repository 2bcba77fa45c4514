"""`pip.provides`: tf-keras on a `tensorflow-cpu` base. tf-keras asks for `tensorflow`,
which the pip step refuses (another distribution of the base's framework would overwrite it); the recipe
says the base's tensorflow-cpu provides it, and a file-less stub of that name, pinned at the base's version,
meets the dependency while the protection holds.

The real install script and guard run real pip on real wheels (made here) in a throwaway environment.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from imgbuild.ngc import FRAMEWORKS
from tests.pipstep import INSTALLERS, PipStep
from tests.pipstep import wheel as _wheel

TEMPLATES = Path(__file__).parent.parent / "imgbuild" / "templates"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wheels")
    _wheel(folder, "tensorflow-cpu", "2.20.0", {"tensorflow/__init__.py": b"__version__ = '2.20.0'\n"})
    _wheel(folder, "tensorflow", "2.20.0", {"tensorflow/__init__.py": b"__version__ = 'PyPI'\n"})
    _wheel(folder, "tf-keras", "2.20.1", {"tf_keras/__init__.py": b""}, ("tensorflow<2.21,>=2.20",))
    _wheel(folder, "old-addon", "0.1", {"old_addon/__init__.py": b""}, ("tensorflow==2.19.0",))
    _wheel(folder, "opencv-python-headless", "4.10.0", {"cv2/__init__.py": b""})
    return folder


@pytest.fixture(params=INSTALLERS)
def step(tmp_path, pip_bases, wheels, request):
    """The pip step over a base that holds tensorflow-cpu (and an OpenCV), with each installer."""
    pip = PipStep(
        pip_bases,
        tmp_path,
        wheels,
        ["tensorflow-cpu", "opencv-python-headless"],
        FRAMEWORKS["tensorflow"].packages,
        installer=request.param,
    )

    def run(packages: list[str], provides: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return pip.run(packages, provides="".join(f"{k} {v}\n" for k, v in provides.items()))

    run.python = pip.python  # type: ignore[attr-defined]
    run.installer = pip.installer  # type: ignore[attr-defined]
    return run


def _pip(step, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([step.python, "-m", "pip", *args], capture_output=True, text=True)


def test_tf_keras_on_a_tensorflow_cpu_base_is_refused_without_provides(step):
    proc = step(["tf-keras"], {})
    assert proc.returncode == 1
    assert "tf-keras 2.20.1 needs tensorflow, another distribution of the base's framework" in proc.stdout, proc.stdout


def test_provides_meets_the_dependency_with_a_stub_and_pip_check_passes(step):
    proc = step(["tf-keras"], {"tensorflow": "tensorflow-cpu"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "imgbuild: tensorflow is provided by the base's tensorflow-cpu 2.20.0 (pip.provides)" in proc.stderr
    listed = _pip(step, "list", "--format=freeze").stdout.split()
    assert {"tensorflow==2.20.0", "tensorflow-cpu==2.20.0", "tf-keras==2.20.1"} <= set(listed), listed
    assert _pip(step, "check").returncode == 0
    # the stub owns no files: the module is still the base's, and one distribution provides it
    shown = _pip(step, "show", "-f", "tensorflow").stdout
    assert "tensorflow/__init__.py" not in shown and "installs no files" in shown
    code = "import tensorflow; print(tensorflow.__version__)"
    assert subprocess.run([step.python, "-c", code], capture_output=True, text=True).stdout.strip() == "2.20.0"
    again = step(["tf-keras"], {"tensorflow": "tensorflow-cpu"})  # a second layer (the lock layer's next) reuses it
    assert again.returncode == 0, again.stdout + again.stderr


def test_the_stub_is_pinned_so_a_package_needing_another_tensorflow_still_conflicts(step):
    proc = step(["old-addon"], {"tensorflow": "tensorflow-cpu"})
    assert proc.returncode == 1
    last = proc.stdout.strip().splitlines()[-1]
    who = "old-addon 0.1" if step.installer == "pip" else "every version of old-addon"  # uv names no version it tried
    assert last.startswith(f"imgbuild: pip step failed: {who} needs tensorflow==2.19.0, but the base holds "), last
    assert "tensorflow==2.20.0" in last


@pytest.mark.parametrize(
    ("provides", "said"),
    [
        (
            {"tensorflow": "tensorflow-gpu"},
            "tensorflow is to be provided by the base's tensorflow-gpu, which the base does not have",
        ),
        (
            {"opencv-python-headless": "tensorflow-cpu"},
            "the base has opencv-python-headless 4.10.0 itself (drop pip.provides.opencv-python-headless)",
        ),
    ],
)
def test_a_provides_line_the_base_cannot_honour_fails_the_step_saying_why(step, provides, said):
    proc = step(["tf-keras"], provides)
    assert proc.returncode != 0
    assert f"imgbuild: pip step failed: pip.provides: {said}" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("provides", "message"),
    [
        ("{tensorflow: tensorflow}", "a package cannot provide itself"),
        ("{tensorflow: keras}", "only another distribution of tensorflow"),
        ("{torch: tensorflow-cpu}", "only another distribution of pytorch"),
        ("{nvidia-cudnn-cu12: nvidia-cudnn-cu13}", "is a CUDA library"),
        ("{'ten sor': tensorflow-cpu}", "not a package name"),
        ("{tensorflow: 'x;rm -rf /'}", "not a package name"),
        ("{tensorflow: [tensorflow-cpu]}", "must be"),
        ("[tensorflow]", "must be a mapping"),
    ],
)
def test_hostile_provides_values_are_refused_at_their_line(tmp_path, provides, message):
    from imgbuild.errors import RecipeError
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f'name: r\nbase: {{framework: tensorflow, tag: "24.05"}}\npip:\n  packages: [tf-keras]\n  provides: {provides}\n'
    )
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    (line,) = err.value.lines()
    assert line.startswith(f"{recipe}:") and message in line and "pip" in line, line


def test_provides_is_rendered_into_both_pip_layers(tmp_path):
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.pipeline.render import render
    from imgbuild.recipe import load_recipe
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        'name: r\nbase: {framework: tensorflow, tag: "24.05"}\npip: {packages: [tf-keras], provides: {tensorflow: tensorflow-cpu}}\n'
    )
    (tmp_path / "r.lock.txt").write_text("tf-keras==2.20.1\n")
    context = render(make_plan(load_recipe(recipe), settings(), fake_inspect), "buildkit")
    assert context.text("imgbuild/pip/provides.txt") == "tensorflow tensorflow-cpu\n"
    assert context.text("imgbuild/pip-lock/provides.txt") == "tensorflow tensorflow-cpu\n"
