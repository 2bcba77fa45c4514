"""Probes: a script imgbuild runs inside an image and the marker its answer line starts with are one object, used
by both sides. The script learns its marker from its environment, the host reads the answer through the same
object, and no marker is written anywhere else; the smoke test runs as a package copied in as a folder."""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from imgbuild.payload import SMOKE_MODULES, SMOKE_PACKAGE
from imgbuild.payload.probes import HAS_JUPYTER, PROBES, SCRIPT_NAME, SMOKE, Probe
from imgbuild.payload.smoke import collectives, compiling
from imgbuild.payload.smoke.report import MARKER_VARIABLE

ROOT = Path(__file__).resolve().parent.parent
#: Every marker, with the one module allowed to write it: the host's probes and the smoke test's children. Homes are
#: named in the source tree (by module name), never by `__file__`: CI imports the installed wheel, not this tree.
HOMES = {
    **{probe.marker: ROOT / "imgbuild/payload/probes.py" for probe in PROBES},
    collectives.NCCL_RANK.marker: ROOT / (collectives.__name__.replace(".", "/") + ".py"),
    compiling.COMPILED.marker: ROOT / (compiling.__name__.replace(".", "/") + ".py"),
}
#: What a marker looks like: how a new one that is not declared is caught too.
MARKER_SHAPE = re.compile(r"IMGBUILD-[A-Z][A-Z0-9-]*[A-Z0-9] ")


def _marker_literals(path: Path) -> list[tuple[str, int]]:
    """(marker, line) of each string literal in `path` that holds a marker's text, docstrings included."""
    found: list[tuple[str, int]] = []
    text = path.read_text()
    if "IMGBUILD-" not in text:  # every marker starts so: a file without it holds none (and is not parsed)
        return found
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for marker in {*HOMES, *MARKER_SHAPE.findall(node.value)}:
                if marker.strip() in node.value:
                    found.append((marker.strip(), node.lineno))
    return found


def test_a_marker_is_written_only_in_its_probe_object():
    outside, at_home = [], {}
    for path in sorted([*(ROOT / "imgbuild").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        for text, line in _marker_literals(path):
            home = HOMES.get(text + " ")
            if home is not None and path == home:
                at_home[text] = at_home.get(text, 0) + 1
            else:
                outside.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert outside == [], "a marker belongs to its probe object: " + "; ".join(outside)
    assert at_home == {marker.strip(): 1 for marker in HOMES}, at_home


def test_the_scan_finds_a_marker_written_twice(tmp_path):
    """The scan itself: a payload printing its marker as a literal is found, as is a marker of a new shape."""
    stray = tmp_path / "stray.py"
    new = "IMGBUILD-" + "SOMETHING-NEW"  # built here, so that this file holds no marker itself
    stray.write_text(f'print({SMOKE.marker!r} + "{{}}")\nMARK = "{new} "\n')
    assert sorted(_marker_literals(stray)) == [(SMOKE.marker.strip(), 1), (new, 2)]


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_every_probe_script_answers_after_the_marker_it_is_given(probe):
    sources = [probe.path.read_text()] if not probe.modules else [(probe.path / m).read_text() for m in probe.modules]
    assert any(MARKER_VARIABLE in text for text in sources), f"{probe.name} must print the marker it is given"


def _run_in(folder: Path, probe: Probe, args: list[str]) -> subprocess.CompletedProcess[str]:
    """`probe` as the engine runs it: its tar unpacked into `folder`, its script run with its environment."""
    with tarfile.open(fileobj=io.BytesIO(probe.tar())) as tar:
        tar.extractall(folder, filter="data")
    env = probe.environment({"PATH": "/usr/bin:/bin"})
    return subprocess.run(
        [sys.executable, "-I", str(folder / SCRIPT_NAME), *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_smoke_probe_runs_its_package_beside_the_launcher_and_answers_after_its_marker(tmp_path):
    """The launcher runs the package folder copied beside it (a framework-free interpreter: the report says so)."""
    probe = SMOKE.probe()
    assert {name for name, _ in probe.files} == {f"imgbuild_smoke/{name}" for name in SMOKE_MODULES}
    done = _run_in(tmp_path, probe, ["--framework", "pytorch", "--libraries-only"])
    answer = SMOKE.answer(done.stdout)
    assert answer is not None, done.stdout + done.stderr
    assert [(c["name"], c["status"]) for c in answer["checks"]] == [("framework", "fail")]
    assert "import torch failed" in answer["checks"][0]["reason"]


def test_a_file_probe_answers_its_host_object(tmp_path):
    done = _run_in(tmp_path, HAS_JUPYTER.probe(), [])
    assert HAS_JUPYTER.answer(done.stdout) == {"jupyter": ""}, done.stdout + done.stderr


def test_a_probes_tar_makes_each_folder_before_its_files():
    probe = Probe("p", "print()", "M ", (("pkg/a.py", b"a"), ("pkg/b.py", b"b"), ("top.txt", b"t")))
    with tarfile.open(fileobj=io.BytesIO(probe.tar())) as tar:
        members = [(m.name, m.isdir(), oct(m.mode)) for m in tar.getmembers()]
    assert members == [
        ("pkg", True, "0o755"),
        (SCRIPT_NAME, False, "0o755"),
        ("pkg/a.py", False, "0o644"),
        ("pkg/b.py", False, "0o644"),
        ("top.txt", False, "0o644"),
    ]


def test_the_smoke_package_runs_as_a_folder_under_any_name(tmp_path):
    """As the image runs it (`python3 /opt/imgbuild/smoke`): by the folder, whatever its name; without a marker
    (by hand) the report is a bare JSON line."""
    import shutil

    folder = tmp_path / "anything"
    shutil.copytree(SMOKE_PACKAGE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-I", str(folder), "--framework", "tensorflow", "--libraries-only"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 1 and report["checks"][0]["name"] == "framework", done.stderr


def test_the_smoke_modules_listed_are_the_packages_files():
    assert sorted(SMOKE_MODULES) == sorted(p.name for p in SMOKE_PACKAGE.glob("*.py"))
