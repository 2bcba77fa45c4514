"""imgbuild as users install it: a built wheel, in a fresh virtual environment, not this checkout.

Every other test imports the copy installed in the suite's own environment (tests/conftest.py makes sure the
checkout never shadows it); the README's test command installs that copy from a built wheel. These tests build
the wheel here, check what it carries, and drive the installed command from a folder that holds no source.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import imgbuild
from imgbuild.payload import PAYLOAD_DIR, SMOKE_MODULES
from imgbuild.pipeline.plan import IMAGE_TEMPLATES, OTHER_TEMPLATES, TEMPLATES_DIR, templates_digest
from tests.conftest import IMGBUILD, ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    (found,) = out.glob("imgbuild-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed as `pip install imgbuild-*.whl` installs it (byte-compiled): the suite's
    own pip installs into it (`--python`), so the venv needs no pip of its own (ensurepip: seconds)."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    subprocess.run(
        [*pip, "--disable-pip-version-check", str(wheel)], check=True, capture_output=True, text=True, timeout=900
    )
    return venv


def test_the_wheel_carries_the_templates_and_in_image_scripts_and_no_tests_or_bytecode(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for template in (*IMAGE_TEMPLATES, *OTHER_TEMPLATES):
        assert f"imgbuild/templates/{template}" in names, template
    assert {f"imgbuild/payload/smoke/{name}" for name in SMOKE_MODULES} <= set(names)
    assert "imgbuild/py.typed" in names
    assert not [n for n in names if n.startswith("tests/")], "tests are not part of the package"
    assert not [n for n in names if n.endswith((".pyc", ".pyo")) or "__pycache__" in n]


def test_the_declared_templates_are_exactly_the_package_data_that_shapes_an_image():
    """IMAGE_TEMPLATES is the list the digest hashes: every template file but those that shape no Docker image."""
    on_disk = {p.name for p in TEMPLATES_DIR.iterdir() if p.is_file() and not p.name.endswith((".pyc", ".pyo"))}
    assert set(IMAGE_TEMPLATES) == on_disk - set(OTHER_TEMPLATES) and set(OTHER_TEMPLATES) <= on_disk


def test_a_byte_compiled_templates_folder_changes_nothing(tmp_path, monkeypatch):
    """What a regular install holds beside the templates (pip's __pycache__) neither breaks nor moves the digest."""
    import imgbuild.pipeline.plan as plan

    copy = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, copy)
    before = templates_digest()
    (copy / "__pycache__").mkdir(exist_ok=True)
    (copy / "__pycache__" / "Dockerfile.cpython-311.pyc").write_bytes(b"\0" * 16)
    monkeypatch.setattr(plan, "TEMPLATES_DIR", copy)
    plan.templates_digest.cache_clear()
    try:
        assert plan.templates_digest() == before
    finally:
        plan.templates_digest.cache_clear()


def test_the_suite_imports_the_installed_copy():
    """Under the README's test command the package under test is the wheel's, not this checkout."""
    package = Path(imgbuild.__file__).resolve().parent
    if os.environ.get("IMGBUILD_TEST_INSTALLED") != "wheel":  # a developer's editable install: the checkout
        assert package == ROOT / "imgbuild" or "site-packages" in package.parts
        return
    assert "site-packages" in package.parts and package != ROOT / "imgbuild"


def test_the_installed_command_validates_renders_and_exports_from_a_folder_without_source(installed, tmp_path):
    work = tmp_path / "project"
    shutil.copytree(ROOT / "recipes", work / "recipes")
    env = {
        "PATH": f"{installed / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "IMGBUILD_CACHE_DIR": str(tmp_path / "cache"),
        "IMGBUILD_CONFIG": str(tmp_path / "config.yaml"),
        "IMGBUILD_SITE_CONFIG": str(tmp_path / "site.yaml"),
    }
    command = str(installed / "bin" / "imgbuild")

    def imgbuild_(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([command, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300)

    compiled = list((installed / "lib").glob("python3*/site-packages/imgbuild/payload/__pycache__/pip_guard.*"))
    assert compiled, "pip byte-compiles the in-image scripts (payload/): the case this test is about"
    checked = imgbuild_("validate", "recipes/pytorch-research.yaml")
    assert checked.returncode == 0, checked.stderr
    rendered = imgbuild_("render", "recipes/pytorch-research.yaml", "--offline")
    assert rendered.returncode == 0, rendered.stderr
    context = work / "images" / "pytorch-research"
    assert (context / "Dockerfile").is_file() and (context / "imgbuild" / "smoke" / "__main__.py").is_file()
    assert (context / "imgbuild" / "pip" / "guard.py").read_bytes() == (PAYLOAD_DIR / "pip_guard.py").read_bytes()
    exported = imgbuild_("export", "recipes/pytorch-research.yaml", "--apptainer", "-o", str(work / "r.def"))
    assert exported.returncode == 0, exported.stderr
    assert "\nBootstrap: docker-daemon\n" in (work / "r.def").read_text()
    # an installed copy renders what the suite's own copy renders, byte for byte, with the same settings
    again = subprocess.run(
        [*IMGBUILD, "render", "recipes/pytorch-research.yaml", "--offline", "-o", str(tmp_path / "again")],
        cwd=work, env={**env, "PATH": f"{Path(IMGBUILD[0]).parent}:/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    for path in sorted(p for p in (tmp_path / "again").rglob("*") if p.is_file()):
        assert (context / path.relative_to(tmp_path / "again")).read_bytes() == path.read_bytes(), path


def _install_blocks() -> list[str]:
    """Every block marked `<!-- docs: install -->` in docs/install.md, then README's (each command once)."""
    import re

    fence = re.compile(r"(?ms)^<!-- docs: install -->\n```sh\n(?P<body>.*?)^```")
    found: list[str] = []
    for path in (ROOT / "docs" / "install.md", ROOT / "README.md"):
        found += [m["body"].strip() for m in fence.finditer(path.read_text()) if m["body"].strip() not in found]
    return found


def test_the_install_docs_name_no_version_and_never_the_bare_package_name():
    import re

    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs").rglob("*.yml"))]:
        for line in path.read_text().splitlines():
            if path.suffix == ".md" and re.search(r"imgbuild-[0-9][^ ]*\.whl", line):  # the next version breaks it
                raise AssertionError(f"{path.relative_to(ROOT)}: names one version's wheel: {line}")
            words = line.replace("`", " ").replace('"', " ").replace("'", " ").split()
            for i, word in enumerate(words[:-1]):
                direct = i + 2 < len(words) and words[i + 2] == "@"  # `imgbuild[sign] @ URL`: a named source
                warned = "never" in [w.lower() for w in words[max(0, i - 2) : i]]  # "never `pip install imgbuild`"
                installer = i > 0 and words[i - 1].rsplit("/", 1)[-1] in ("pip", "pip3", "pipx", "tool")
                bare = installer and words[i + 1].split("[")[0] == "imgbuild"
                if word == "install" and bare and not (direct or warned):
                    raise AssertionError(f"{path.relative_to(ROOT)}: installs imgbuild by its bare name: {line}")


def test_every_install_line_in_the_docs_works_as_written(tmp_path):
    """docs/install.md's commands, run in order as written (a wheel, pipx, uv, a venv of one's own, the admin's
    /opt): only the folders move into a sandbox. Each leaves an `imgbuild` that answers."""
    blocks = _install_blocks()
    assert len(blocks) == 5, blocks
    source = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    # pipx and uv as the docs expect them on PATH: the suite's own (test dependencies), not a venv fetched anew
    import uv

    tools = tmp_path / "tools" / "bin"
    tools.mkdir(parents=True)
    pipx = shutil.which("pipx", path=str(Path(sys.executable).parent))
    assert pipx, "pipx is a test dependency: pip install -e '.[test]'"
    (tools / "pipx").symlink_to(pipx)
    (tools / "uv").symlink_to(uv.find_uv_bin())
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": f"{tools}:{os.environ['PATH']}",
        "HOME": str(home),
        "PIPX_HOME": str(tmp_path / "pipx"),
        "PIPX_BIN_DIR": str(tmp_path / "pipx-bin"),
        "UV_TOOL_DIR": str(tmp_path / "uv"),
        "UV_TOOL_BIN_DIR": str(tmp_path / "uv-bin"),
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",  # uv, behind this machine's TLS proxy
        **{k: v for k, v in os.environ.items() if k.startswith(("PIP_", "UV_INDEX", "LANG"))},
    }
    moved = {"/opt/imgbuild": str(tmp_path / "opt" / "imgbuild"), "/usr/local/bin": str(tmp_path / "usr-local-bin")}
    (tmp_path / "usr-local-bin").mkdir()
    answered = []
    for block in blocks:
        command = block
        for old, new in moved.items():
            command = command.replace(old, new)
        done = subprocess.run(["bash", "-c", f"set -e\n{command}"], cwd=source, env=env, capture_output=True,
                              text=True, timeout=900)  # fmt: skip
        assert done.returncode == 0, (block, done.stdout[-2000:], done.stderr[-2000:])
        for place in ("pipx-bin", "uv-bin", "home/.local/bin", "usr-local-bin"):
            found = tmp_path / place / "imgbuild"
            if found.exists() and place not in answered:
                version = subprocess.run([str(found), "--version"], capture_output=True, text=True, env=env)
                assert version.returncode == 0 and imgbuild.__version__ in version.stdout, (place, version.stderr)
                answered.append(place)
    assert answered == ["pipx-bin", "uv-bin", "home/.local/bin", "usr-local-bin"]
