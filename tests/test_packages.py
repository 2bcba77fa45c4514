"""Packages that work: every package a recipe adds is import-checked in the image, the base's framework
cannot be replaced under another distribution name, and the recipe's own checks run.

The unit cases build real distributions in a temporary site folder and run the smoke script's checks on
them; the engine cases build real recipes on the test bed's stand-in bases.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from imgbuild.payload.smoke import commands as smoke_commands
from imgbuild.payload.smoke import dists as smoke_dists
from imgbuild.payload.smoke import framework as smoke_framework
from imgbuild.payload.smoke import hints as smoke_hints
from imgbuild.payload.smoke import imports as smoke_imports
from imgbuild.payload.smoke import pipcheck as smoke_pipcheck
from imgbuild.payload.smoke import report as smoke_report
from imgbuild.payload.smoke import sbom as smoke_sbom
from tests.conftest import bridge_gateway, run_cli
from tests.pipstep import guard_folder
from tests.support import guard_module


def _dist(site: Path, name: str, version: str, module: str, body: str = "", top_level: bool = True) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{module}/__init__.py,,\n{info.name}/METADATA,,\n")
    if top_level:
        (info / "top_level.txt").write_text(module + "\n")
    (site / module).mkdir()
    (site / module / "__init__.py").write_text(body)


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site folder on sys.path (and the import subprocesses' PYTHONPATH), and a baseline of what was
    installed before it: the distributions made in it are what a recipe 'added'."""
    folder = tmp_path / "site"
    folder.mkdir()
    baseline = tmp_path / "dists.base"
    baseline.write_text("".join(f"{d.metadata['Name']}=={d.version}\n" for d in md.distributions()))
    monkeypatch.setattr(smoke_dists, "DISTS_BASELINE", str(baseline))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    monkeypatch.delenv("IMGBUILD_SMOKE_SKIP_IMPORTS", raising=False)
    monkeypatch.delenv("IMGBUILD_SMOKE_IMPORTS", raising=False)
    md.distributions.cache_clear() if hasattr(md.distributions, "cache_clear") else None
    return folder


def _imports() -> dict:
    report = smoke_report.Report()
    report.run("imports", smoke_imports.check_imports)
    return report.checks[-1]


def test_every_added_package_is_imported_and_a_missing_library_is_named(site, monkeypatch):
    _dist(site, "goodpkg", "1.0", "goodpkg")
    _dist(site, "recordonly", "2.0", "recordonly", top_level=False)  # modules found from RECORD
    missing = "libxcb.so.1: cannot open shared object file: No such file or directory"
    _dist(site, "opencv-fake", "4.10", "cv2fake", f"raise ImportError({missing!r})")
    _dist(site, "abi-fake", "2.11", "abifake", "raise OSError('undefined symbol: _ZN3c104cuda9SetDevice')")
    driver = "libcuda.so.1: cannot open shared object file: No such file or directory"
    _dist(site, "driverpkg", "1.0", "driverpkg", f"raise ImportError({driver!r})")
    _dist(site, "inline-fake", "0.2", "inlinefake", "import not_installed_optional_dep")  # matplotlib-inline
    check = _imports()
    assert check["status"] == "fail", check
    assert "opencv-fake 4.10: import cv2fake: libxcb.so.1 is missing (add apt: [libxcb1])" in check["reason"]
    assert "abi-fake 2.11: import abifake: OSError: undefined symbol" in check["reason"]
    assert "driverpkg" not in check["reason"]  # libcuda comes with the driver at run time
    assert "2 of 6 module(s) do not import" in check["reason"] and "inline" not in check["reason"]
    monkeypatch.setenv("IMGBUILD_SMOKE_SKIP_IMPORTS", "opencv_fake abi-fake")  # names are canonicalised
    check = _imports()
    assert check["status"] == "pass" and "4 module(s)" in check["reason"] and "need the driver" in check["reason"]
    assert "inline-fake: import inlinefake needs not_installed_optional_dep" in check["reason"]
    assert set(check["details"]["distributions"]) == {
        "goodpkg==1.0",
        "recordonly==2.0",
        "driverpkg==1.0",
        "inline-fake==0.2",
    }


def test_the_recipes_own_imports_and_commands(site, monkeypatch):
    monkeypatch.setenv("IMGBUILD_SMOKE_IMPORTS", "json os.path no_such_module_here")
    check = _imports()
    assert check["status"] == "fail" and "import no_such_module_here: ModuleNotFoundError" in check["reason"]
    monkeypatch.setenv("IMGBUILD_SMOKE_RUN", json.dumps(["true", f"{sys.executable} -c 'import sys; sys.exit(3)'"]))
    report = smoke_report.Report()
    report.run("recipe checks", smoke_commands.check_commands)
    assert report.checks[-1]["status"] == "fail" and "exited 3" in report.checks[-1]["reason"]


def test_an_image_without_a_baseline_skips_the_import_check(site, monkeypatch):
    monkeypatch.setattr(smoke_dists, "DISTS_BASELINE", str(site / "nothing-here"))
    assert _imports()["status"] == "skip"


def test_a_framework_installed_twice_under_two_names_is_caught(site):
    """PyPI's tensorflow over the base's tensorflow-cpu passed as 'the base's own'."""
    _dist(site, "tensorflow-cpu-fake", "2.21.0", "tffake", "__version__ = '2.21.0'")
    other = site / "tensorflow_fake-2.22.0.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow-fake\nVersion: 2.22.0\n")
    (other / "top_level.txt").write_text("tffake\n")
    import tffake  # type: ignore[import-not-found]

    report = smoke_report.Report()
    report.run("framework", smoke_framework.check_framework_version, tffake, "2.21.0", "NO_SUCH_ENV_SET")
    assert report.checks[-1]["status"] == "fail"  # no version declared: two owners are wrong all the same
    import os

    os.environ["IMGBUILD_TEST_FW_VERSION"] = "2.21.0"
    try:
        report.run("framework", smoke_framework.check_framework_version, tffake, "2.21.0", "IMGBUILD_TEST_FW_VERSION")
    finally:
        del os.environ["IMGBUILD_TEST_FW_VERSION"]
    check = report.checks[-1]
    assert check["status"] == "fail" and "installed by 2 distributions" in check["reason"], check


@pytest.mark.parametrize(
    ("files", "top", "modules"),
    [
        (["six.py", "six-1.16.dist-info/RECORD"], None, ["six"]),
        (["yaml/__init__.py", "_yaml/__init__.py", "PyYAML.dist-info/RECORD"], None, ["yaml"]),
        (["cv2/__init__.py", "opencv_python.libs/libxcb.so"], None, ["cv2"]),
        (["fast.cpython-311-x86_64-linux-gnu.so"], None, ["fast"]),
        (["tests/__init__.py", "pkg/__init__.py", "../../bin/tool", "pkg.pth"], None, ["pkg"]),
        ([], "google\ngoogle/protobuf\n", ["google"]),
        # lmdb 1.4.1's top_level.txt names `cpython`, which it installs nothing for
        (["lmdb/__init__.py", "lmdb/cpython.cpython-311-x86_64-linux-gnu.so"], "cpython\nlmdb\n", ["lmdb"]),
        (["yaml/__init__.py", "_yaml.cpython-311-x86_64-linux-gnu.so"], "_yaml\nyaml\n", ["yaml"]),
        (["six.py"], "six\n", ["six"]),
    ],
)
def test_top_level_modules_from_metadata(files, top, modules):
    assert smoke_dists.top_level_modules(files, top) == modules


def test_missing_libraries_map_to_apt_packages():
    assert smoke_hints.missing_library("libGL.so.1: cannot open shared object file: No such file") == "libGL.so.1"
    assert smoke_hints.import_hint("libGL.so.1") == "add apt: [libgl1]"
    assert smoke_hints.import_hint("libgthread-2.0.so.0") == "add apt: [libglib2.0-0]"
    # a well-known wheel gets its whole line, not one library per failed build
    assert smoke_hints.import_hint("libGL.so.1", "opencv-python") == "add apt: [libgl1, libglib2.0-0, libxcb1]"
    assert smoke_hints.missing_library("No module named 'x'") == ""


@pytest.mark.parametrize(
    "library, cuda, cure",
    [
        ("libcudart.so.12", "13.0.2", "it is CUDA 12's, and the base has CUDA 13: vllm was built for CUDA 12"),
        ("libcublasLt.so.11", "12.4.1", "it is CUDA 11's, and the base has CUDA 12: vllm was built for CUDA 11"),
        ("libcudart.so.13", "13.0.2", "install the system package that provides it (apt:)"),  # the base's own
        ("libcudart.so.12", "", "install the system package that provides it (apt:)"),  # a base without CUDA
        ("libcudnn.so.8", "13.0.2", "install the system package that provides it (apt:)"),  # cuDNN's own major
    ],
)
def test_a_library_of_another_cuda_major_is_named_the_wrong_build_not_an_apt_package(library, cuda, cure):
    """VLLM 0.2.5 on a CUDA 13 base failed with 'libcudart.so.12 is missing (install the system
    package that provides it (apt:))'; no apt package cures a wheel built for another CUDA. Which build would is the
    index's to say: the image names none."""
    hint = smoke_hints.import_hint(library, "vllm", cuda)
    assert hint.startswith(cure) and "build (" not in hint and "ask for" not in hint


RECORDED_PAGES = Path(__file__).parent / "data" / "index-pages"
#: A per-CUDA wheel index in PEP 503's HTML (the shape of PyTorch's and vLLM's own): releases marked +cu130 and +cu129.
CUDA_INDEX_PAGE = (
    b'<html><body><a href="/whl/vllm-0.11.0%2Bcu130-cp38-abi3-manylinux1_x86_64.whl#sha256=00">'
    b"vllm-0.11.0+cu130-cp38-abi3-manylinux1_x86_64.whl</a><br>\n"
    b'<a href="/whl/vllm-0.11.0%2Bcu129-cp38-abi3-manylinux1_x86_64.whl">vllm-0.11.0+cu129-cp38-abi3-manylinux1_x86_64.whl'
    b"</a><br>\n</body></html>\n"
)


@pytest.fixture
def recorded_index():
    """A local index serving recorded pages: PyPI's vllm and faiss-gpu-cu12 pages (no release marked for a CUDA
    major), a per-CUDA index's (`/cuda/vllm/`), and a 404 for every other project (faiss-gpu-cu13 is not on PyPI)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pages = {
        "/pypi/vllm/": ((RECORDED_PAGES / "pypi-vllm.json").read_bytes(), "application/vnd.pypi.simple.v1+json"),
        "/cuda/vllm/": (CUDA_INDEX_PAGE, "text/html"),
        "/pypi/faiss-gpu-cu12/": (
            (RECORDED_PAGES / "pypi-faiss-gpu-cu12.json").read_bytes(),
            "application/vnd.pypi.simple.v1+json",
        ),
    }
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            asked.append(self.path)
            body, kind = pages.get(self.path, (b"", ""))
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", kind or "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", asked
    server.shutdown()
    server.server_close()


def _failed_imports(*rows: list[str]):
    from imgbuild.pipeline.smoke import SmokeReport

    report = SmokeReport("img", False, [], {})
    report.fail("imports", "1 of 1 module(s) do not import: vllm 0.2.5: import vllm: ...", {"other_cuda": list(rows)})
    return report


def test_a_cuda_build_the_index_does_not_have_is_never_offered_and_what_would_be_needed_is_said(recorded_index):
    """vllm 0.2.5 (CUDA 12) on a CUDA 13 base: PyPI has no release of vllm marked for CUDA 13."""
    from imgbuild.pipeline.smoke import name_cuda_cures
    from imgbuild.registry import pypi

    pypi.cuda_builds.cache_clear()
    index, asked = recorded_index
    report = _failed_imports(["vllm", "0.2.5", "12", "13"])
    name_cuda_cures(report, f"{index}/pypi")
    reason = report.checks[0]["reason"]
    assert "vllm 0.2.5: the index has no CUDA 13 build of vllm (no release of vllm is marked +cu13)" in reason
    assert "what would be needed is vllm built for CUDA 13" in reason and "or use a base with CUDA 12" in reason
    assert "ask for its CUDA 13 build" not in reason
    assert asked == ["/pypi/vllm/"]


def test_a_cuda_build_the_index_has_is_named_by_its_exact_release(recorded_index):
    from imgbuild.pipeline.smoke import name_cuda_cures
    from imgbuild.registry import pypi

    pypi.cuda_builds.cache_clear()
    index, _ = recorded_index
    report = _failed_imports(["vllm", "0.2.5", "12", "13"])
    name_cuda_cures(report, f"{index}/cuda")
    assert "ask for its CUDA 13 build, vllm==0.11.0+cu130 (on the index)" in report.checks[0]["reason"]


@pytest.mark.parametrize("where", ["body", "headers"])
def test_an_index_page_that_trickles_is_no_answer_within_its_time(where):
    """imgbuild's own reader of index pages (the cures it checks before printing them) ends at its time however a
    server trickles a page: a byte at a time restarts each read's timeout, so only a clock outside the read holds."""
    import socket
    import threading
    import time

    from imgbuild.registry import pypi

    listener = socket.create_server(("127.0.0.1", 0))

    def drip() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            conn.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n"
            if where == "body":
                conn.sendall(head)
            for byte in head if where == "headers" else b"<" * 100:
                conn.sendall(bytes([byte]))
                time.sleep(0.1)
            conn.close()

    threading.Thread(target=drip, daemon=True).start()
    index = f"http://127.0.0.1:{listener.getsockname()[1]}/simple"
    pypi.cuda_builds.cache_clear()
    start = time.monotonic()
    try:
        if where == "body":
            assert pypi.cuda_builds(index, "vllm", "13", timeout=0.5) is None
        else:
            assert pypi.has_project(index, "vllm", timeout=0.5) is None
    finally:
        listener.close()
    assert time.monotonic() - start < 1.5


def test_a_renamed_cuda_build_is_offered_only_where_the_index_has_that_project(recorded_index):
    """A dependency named for CUDA 12 (faiss-gpu-cu12, brought by another package): faiss-gpu-cu13 is not on the
    index, so it is not offered."""
    from imgbuild.pipeline.smoke import name_cuda_cures
    from imgbuild.registry import pypi

    pypi.cuda_builds.cache_clear()
    index, asked = recorded_index
    report = _failed_imports(["faiss-gpu-cu12", "1.9.0", "12", "13"])
    name_cuda_cures(report, f"{index}/pypi")
    reason = report.checks[0]["reason"]
    assert "the index has no CUDA 13 build of faiss-gpu-cu12" in reason and "faiss-gpu-cu13 is not there" in reason
    assert "/pypi/faiss-gpu-cu13/" in asked


def test_an_index_that_cannot_be_asked_leaves_no_build_named():
    from imgbuild.pipeline.smoke import name_cuda_cures
    from imgbuild.registry import pypi

    pypi.cuda_builds.cache_clear()
    report = _failed_imports(["vllm", "0.2.5", "12", "13"])
    name_cuda_cures(report, "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    reason = report.checks[0]["reason"]
    assert "the index could not be asked whether it has a CUDA 13 build of vllm: or use a base with CUDA 12" in reason


def test_the_image_reports_which_added_package_failed_on_another_cuda_s_library(monkeypatch):
    monkeypatch.setenv("CUDA_VERSION", "13.0.2.006")
    work = [("vllm", "0.2.5", ["vllm"]), ("six", "1.17.0", ["six"])]
    results = [{"vllm": "ImportError: libcudart.so.12: cannot open shared object file: No such file"}, {}]
    assert smoke_imports.other_cuda_builds(work, results) == [["vllm", "0.2.5", "12", "13"]]


# --- on the test bed ------------------------------------------------------------------------------------


def _project(tmp_path: Path, text: str) -> Path:
    """A repository with one recipe; its name gets this run's suffix (images/<name>/ is _context(tmp_path))."""
    (tmp_path / ".git").mkdir(exist_ok=True)
    (tmp_path / "recipes").mkdir(exist_ok=True)
    path = tmp_path / "recipes" / "pkgs.yaml"
    path.write_text(text.replace("name: pkgs\n", f"name: pkgs-{uuid.uuid4().hex[:8]}\n"))
    return path


def _smoke_json(tmp_path: Path) -> dict:
    (context,) = (tmp_path / "images").iterdir()
    return json.loads((context / "smoke.json").read_text())


@pytest.mark.engine
def test_a_package_that_cannot_import_is_not_promoted_and_the_apt_line_fixes_it(testbed, tmp_path, cleanup_images):
    """opencv-python needs libGL and glib from the system: pip installs it, `import cv2` fails."""
    base = 'name: pkgs\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\npip: [opencv-python]\n'
    recipe = _project(tmp_path, base)
    res = run_cli("build", str(recipe), cwd=tmp_path)
    assert res.code == 1 and "imports: " in res.err, res.err
    assert "opencv-python" in res.err and "import cv2" in res.err and "is missing (add apt: [" in res.err
    recipe.write_text(
        recipe.read_text()
        + "apt: [libgl1, libglib2.0-0, libxcb1]\nsmoke: {imports: [cv2.dnn], run: ['python3 -c \"import cv2\"']}\n"
    )
    ok = run_cli("build", str(recipe), cwd=tmp_path)
    assert ok.code == 0, ok.err
    cleanup_images.append(ok.out.strip().splitlines()[-1].split(" -> ")[0])
    report = _smoke_json(tmp_path)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["imports"]["status"] == "pass" and "opencv-python==" in str(checks["imports"]["details"])
    assert checks["recipe checks"]["status"] == "pass"


@pytest.mark.engine
def test_a_dependency_built_for_another_tensorflow_is_a_named_pip_conflict(testbed, tmp_path):
    """tensorflow-text 2.18 needs tensorflow<2.19; NGC's TensorFlow is the `tensorflow` distribution at its own
    `+nvYY.M` version: pip must refuse, naming the package and the base's pin, not install a second TensorFlow
    (2.18 GB added). A base whose TensorFlow is `tensorflow-cpu` gets the other-name refusal
    instead (test_each_pip_failure_names_its_kind, with pip's own lines)."""
    recipe = _project(
        tmp_path, 'name: pkgs\nbase: {framework: tensorflow, tag: "24.05"}\npip: [tensorflow-text==2.18.0]\n'
    )
    res = run_cli("build", str(recipe), cwd=tmp_path)
    assert res.code == 1, res.err
    assert re.search(
        r"pip step failed: tensorflow-text 2\.18\.0 needs tensorflow>=2\.18\.0,<2\.19, but the base holds "
        r"tensorflow==2\.\d+\.\d+\+nv24\.5 \(from a freeze of the base's packages\)",
        res.err,
    ), res.err[-2000:]


@pytest.mark.engine
def test_a_package_built_for_another_framework_version_fails_its_import_check(testbed, tmp_path):
    """The torchaudio case: a package that declares no framework requirement installs cleanly, pip check
    passes, and it cannot be imported next to the base's framework (tf-keras 2.15 on TensorFlow 2.21)."""
    recipe = _project(tmp_path, 'name: pkgs\nbase: {framework: tensorflow, tag: "24.05"}\npip: [tf-keras==2.15.0]\n')
    res = run_cli("build", str(recipe), cwd=tmp_path)
    assert res.code == 1, res.err
    assert "imports: 1 of 1 module(s) do not import: tf-keras 2.15.0: import tf_keras: AttributeError" in res.err
    assert "was left as it was" in res.err


def test_a_failed_step_is_named_not_spelled_out_in_mount_flags():
    from imgbuild.engine.types import step_name

    long = "[stage-0 4/6] RUN --mount=type=bind,source=imgbuild/pip,target=/tmp/imgbuild-pip --mount=type=cache,id=x"
    assert step_name(long) == "the pip step [stage-0 4/6]"
    assert step_name("[2/3] RUN apt-get update") == "the apt step [2/3]"
    assert step_name("[3/3] RUN make") == "[3/3] RUN make"
    assert len(step_name("[1/1] RUN " + "x" * 500)) == 120
    # any other step: what it runs, without the instruction's flags or the variables set for its command alone
    assert step_name("[stage-1 2/4] COPY --chown=1000:1000 --link files/ /") == "[stage-1 2/4] COPY files/ /"
    assert step_name("[2/5] RUN --mount=type=cache,id=c,target=/c IMGBUILD_INPUTS=sha256:ab \\\n  make -j8") == (
        "[2/5] RUN \\ make -j8"
    )


# --- requirements files as projects write them ----------------------------------------


def _load(tmp_path: Path, files: dict[str, str]):
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir(exist_ok=True)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: {requirements: requirements.txt}\n')
    return load_recipe(recipe)


def test_real_requirements_files_nest_continue_and_carry_options(tmp_path):
    loaded = _load(
        tmp_path,
        {
            "requirements.txt": (
                "# the project's file\n-r requirements/common.txt\n-c constraints.txt\n"
                "--extra-index-url https://download.example.org/whl\n--pre\n"
                "transformers>=4.40 \\\n    ; python_version >= '3.9'  # a continued line\n"
                "mylib @ git+https://github.com/example/mylib.git@v1.2\n"
                "requests==2.32.3 --hash=sha256:" + "ab" * 32 + "\n"
            ),
            "requirements/common.txt": "einops\n-r ../more.txt\n-r ../more.txt\n",  # twice: counted once
            "more.txt": "tqdm\n",
            "constraints.txt": "numpy<3\n",
        },
    )
    assert [(Path(r.file).name, r.line, r.spec) for r in loaded.requirements] == [
        ("common.txt", 1, "einops"),
        ("more.txt", 1, "tqdm"),
        ("requirements.txt", 6, "transformers>=4.40      ; python_version >= '3.9'"),
        ("requirements.txt", 8, "mylib @ git+https://github.com/example/mylib.git@v1.2"),
        ("requirements.txt", 9, "requests==2.32.3"),
    ]
    assert loaded.requirements[-1].hashes == ("--hash=sha256:" + "ab" * 32,)
    assert [c.spec for c in loaded.requirement_constraints] == ["numpy<3"]
    assert loaded.requirement_options == ("--extra-index-url https://download.example.org/whl", "--pre")


@pytest.mark.parametrize(
    "line",
    [
        "--find-links https://storage.googleapis.com/jax-releases/jax_releases.html",
        "-f https://data.pyg.org/whl/torch-2.4.0+cu124.html",
        "--find-links=https://data.pyg.org/whl/torch-2.4.0+cu124.html",
        "-f HTTPS://data.pyg.org/whl/torch-2.4.0+cu124.html",
    ],
)
def test_a_find_links_web_page_is_passed_to_the_installer_as_a_page_of_links(tmp_path, line):
    """JAX's and PyG's own install lines point at a web page of wheel links: it goes to the installer as it is, its
    scheme in the lower case the pip step's readers look for."""
    loaded = _load(tmp_path, {"requirements.txt": f"{line}\npyg-lib\n"})
    url = line.replace("=", " ", 1).split()[-1] if line.startswith("--find-links=") else line.split()[-1]
    assert loaded.requirement_options == (f"--find-links {url.replace('HTTPS:', 'https:')}",)
    assert [r.spec for r in loaded.requirements] == ["pyg-lib"]


#: a find-links line as projects write it; those marked True are read alike by pip and uv, or by pip and made so
FIND_LINKS_SPELLINGS = {
    "-f {url}": True,
    "-f{url}": True,  # pip's attached short option (uv refuses it: imgbuild writes it again as --find-links URL)
    "-f\t{url}": True,
    "--find-links {url}": True,
    "--find-links={url}": True,
    "--find-links\t{url}": True,
    '--find-links "{url}"': False,
    "--find-link {url}": False,  # optparse's abbreviation: pip's alone
    "-f {url} -f {url}.2": False,
    "--find-links = {url}": False,  # pip reads a page named "="
}


@pytest.mark.parametrize("spelling", FIND_LINKS_SPELLINGS)
def test_a_find_links_line_is_passed_on_as_pips_own_parser_reads_it_or_refused_at_its_line(tmp_path, spelling):
    """pip's requirements-file parser is the oracle: a spelling both installers read as one page goes on as that
    page, in the one form both read; any other is passed on as pip reads it, or refused at FILE:LINE without the
    line."""
    import optparse
    import shlex

    from pip._internal.req.req_file import break_args_options, build_parser

    from imgbuild.errors import RecipeError

    url = "https://data.pyg.org/whl/torch-2.4.0+cu124.html"
    line = spelling.format(url=url)
    read, _ = build_parser().parse_args(shlex.split(break_args_options(line)[1]), optparse.Values())
    pages = [page for page in read.find_links if page.startswith("https://")]
    try:
        passed = list(_load(tmp_path, {"requirements.txt": f"{line}\npyg-lib\n"}).requirement_options)
    except RecipeError as err:
        assert not FIND_LINKS_SPELLINGS[spelling], str(err)
        assert "requirements.txt:1:1: pip.requirements" in str(err) and url not in str(err), str(err)
        return
    assert passed == [f"--find-links {page}" for page in pages] == [f"--find-links {url}"], passed


BAD_REQUIREMENT_LINES = [
    ("-e .", "an editable install needs its source in the image"),
    ("./local/pkg", "a local path is not in the build context"),
    ("git+https://github.com/x/y.git", "a bare URL names no package"),
    ("-r ../../etc/passwd", "is outside the recipe's repository"),
    ("-r missing.txt", "no such file"),
    ("--extra-index-url https://user:s3cret@pypi.example.org/simple", "credentials in an index URL"),
    ("x @ https://user:s3cret@files.example.org/x.whl", "credentials in a requirement URL"),
    ("--find-links /opt/wheels", "a folder of wheels is not in the image"),
    ("-f file:///opt/wheels", "a folder of wheels is not in the image"),
    ("-f https://user:s3cret@data.example.org/whl/torch.html", "credentials in a find-links page's URL"),
    ("-fhttps://user:s3cret@data.example.org/whl/torch.html", "credentials in a find-links page's URL"),
    ("-ihttps://user:s3cret@pypi.example.org/simple", "credentials in an index URL"),
    ("--find-links https://s3cret@data.example.org/whl/torch.html", "credentials in a find-links page's URL"),
    ("--find-links https://data.example.org/whl/torch.html?X-Amz-Signature=s3cret", "a query (?...)"),
    ("--extra-index-url https://pypi.example.org/simple?s=s3cret", "a query (?...)"),
    ("--find-links https://[::1/whl/torch.html", "must be http:// or https:// with a host"),
    ("--find-links https://data.example.org:99999/whl/torch.html", "must be http:// or https:// with a host"),
    ("--extra-index-url https://pypi.example.org:port/simple", "must be http:// or https:// with a host"),
    ("--find-links https://data.example.org/${PIP_INDEX_URL}/torch.html", "pip and uv replace ${NAME}"),
    ("-Zhttps://user:s3cret@data.example.org/whl/torch.html", "pip option -Z is not supported"),
    ("--global-option=build_ext", "is not supported"),
    ("torch>=<2", "not a valid requirement"),
    ("-r requirements.txt", "the file includes itself"),
]


@pytest.mark.parametrize(("line", "message"), BAD_REQUIREMENT_LINES)
def test_requirement_lines_that_cannot_work_in_an_image_are_named(tmp_path, line, message):
    from imgbuild.errors import RecipeError

    with pytest.raises(RecipeError) as err:
        _load(tmp_path, {"requirements.txt": f"einops\n{line}\n"})
    text = str(err.value)
    assert "requirements.txt:2:1: pip.requirements" in text and message in text, text
    assert "s3cret" not in text and "passwd" not in text.replace("../../etc/passwd", "")  # never echoed


def test_a_framework_pin_in_a_nested_file_is_reported_at_its_line(tmp_path):
    from imgbuild.errors import RecipeError
    from imgbuild.pipeline.plan import make_plan
    from tests.support import fake_inspect, settings

    loaded = _load(tmp_path, {"requirements.txt": "einops\n-r deep.txt\n", "deep.txt": "tqdm\ntorch==2.1.1\n"})
    with pytest.raises(RecipeError) as err:
        make_plan(loaded, settings(), fake_inspect)
    assert "deep.txt:2:1: pip.requirements: torch==2.1.1 conflicts with the base's torch" in str(err.value)


# --- pip.unpin -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["torch", "tensorflow-cpu", "TensorFlow_GPU", "nvidia-cudnn-cu12", "tf.nightly"])
def test_the_framework_and_cuda_stack_can_never_be_unpinned(tmp_path, name):
    from imgbuild.errors import RecipeError
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f'name: r\nbase: {{framework: pytorch, tag: "24.05"}}\npip: {{packages: [x], unpin: ["{name}"]}}\n'
    )
    with pytest.raises(RecipeError, match=r"r.yaml:3:\d+: pip.unpin\[0\]: .* never unpinned"):
        load_recipe(recipe)


@pytest.mark.engine
def test_unpin_lets_pip_move_a_base_package_on_purpose(testbed, tmp_path, cleanup_images):
    """`numpy<2.4` against the base's numpy 2.4.6 is a conflict; `unpin: [numpy]` lets pip move it, and the
    import checks then prove torch still works with it."""
    base = 'name: pkgs\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\npip:\n  packages: ["numpy<2.4"]\n'
    recipe = _project(tmp_path, base)
    pinned = run_cli("build", str(recipe), cwd=tmp_path)  # refused before the build: the base pins numpy
    assert pinned.code == 2 and "numpy<2.4 conflicts with the base's numpy==2.4" in pinned.err, pinned.err[-1500:]
    assert "pip.unpin: [numpy]" in pinned.err
    recipe.write_text(recipe.read_text() + "  unpin: [numpy]\n")
    moved = run_cli("build", str(recipe), cwd=tmp_path)
    assert moved.code == 0, moved.err[-2000:]
    cleanup_images.append(moved.out.strip().splitlines()[-1].split(" -> ")[0])
    report = _smoke_json(tmp_path)
    checks = {c["name"]: c for c in report["checks"]}
    assert any(d.startswith("numpy==2.3") for d in checks["imports"]["details"]["distributions"])
    assert checks["framework"]["status"] == "pass" and checks["cpu compute"]["status"] == "pass"


# --- the lock: the file, the resolution and the hashes are in test_lock.py; these build
# what it writes in the bed


@pytest.mark.engine
def test_lock_resolves_in_the_base_and_builds_install_exactly_that(testbed, tmp_path, cleanup_images, docker_client):
    from tests.conftest import in_image

    recipe = _project(tmp_path, 'name: pkgs\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\npip: ["einops>=0.7"]\n')
    locked = run_cli("lock", str(recipe), "--json", cwd=tmp_path)
    assert locked.code == 0, locked.err
    result = json.loads(locked.out)
    (pin,) = result["pins"]
    assert pin.startswith("einops==") and result["added"] == [pin]
    lock_file = recipe.with_name("pkgs.lock.txt")
    # uv (the recipe's installer) resolved, and wrote the sha256 of each of the version's files on the index
    assert result["resolver"] == "uv" and result["hashed"]
    assert lock_file.read_text().splitlines()[-1].startswith(pin + " --hash=sha256:")
    # a file that is not the one locked fails the build: the lock layer checks every file against the hashes
    lock_file.write_text(f"{pin} --hash=sha256:{'0' * 64}\n")
    tampered = run_cli("build", str(recipe), cwd=tmp_path)
    assert tampered.code == 1 and "hash" in tampered.err.lower(), tampered.err[-2000:]
    # an older version, on purpose: the build installs what the lock says, not the newest
    lock_file.write_text("einops==0.7.0\n")
    built = run_cli("build", str(recipe), cwd=tmp_path)
    assert built.code == 0, built.err
    image = built.out.strip().splitlines()[-1].split(" -> ")[0]
    cleanup_images.append(image)
    assert in_image(docker_client, image, "import einops; print(einops.__version__)").strip() == "0.7.0"
    assert run_cli("rebuild", "--check", str(tmp_path / "recipes"), cwd=tmp_path).code == 0
    lock_file.write_text("einops==0.8.0\n")
    stale = run_cli("rebuild", "--check", str(tmp_path / "recipes"), cwd=tmp_path)
    assert stale.code == 1  # a changed lock makes the image due, nothing else does
    # refreshing on purpose: the locked version is kept unless it is freed
    kept = json.loads(run_cli("lock", str(recipe), "--json", cwd=tmp_path).out)
    assert kept["pins"] == ["einops==0.8.0"] and kept["changed"] == []
    freed = json.loads(run_cli("lock", str(recipe), "--upgrade-package", "einops", "--json", cwd=tmp_path).out)
    assert freed["pins"] == [pin] and freed["changed"] == [f"einops 0.8.0 -> {pin.split('==')[1]}"]


@pytest.mark.engine
def test_the_cure_for_jax_cuda12_on_a_cuda13_base_locks_and_builds_in_one_round(
    testbed, tmp_path, cleanup_images, docker_client
):
    """The loop a user follows on the CUDA 13 stand-in: `jax[cuda12]` is refused with the cure
    `jax[cuda13]`; `imgbuild lock` on that writes the CUDA libraries the plugin pulls in (nvidia-cuda-nvcc,
    nvidia-nvvm, the pjrt) as comments, never pins; the next build accepts its own lock and installs them as the
    plugin asks. jax's shape, served from an index on the bridge (real jax is GBs of CUDA wheels)."""
    from tests.conftest import bridge_gateway, in_image
    from tests.fake_index import FakeIndex, Release

    gateway = bridge_gateway(docker_client)
    index = FakeIndex(
        gateway,
        {
            "jax": [
                Release(
                    "0.7.2",
                    [
                        "jaxlib==0.7.2",
                        'jax-cuda12-plugin==0.7.2; extra == "cuda12"',
                        'jax-cuda13-plugin==0.7.2; extra == "cuda13"',
                    ],
                )
            ],
            "jaxlib": [Release("0.7.2")],
            "jax-cuda13-plugin": [
                Release("0.7.2", ["jax-cuda13-pjrt==0.7.2", "nvidia-cuda-nvcc==13.0.88", "nvidia-nvvm==13.0.88"])
            ],
            "jax-cuda13-pjrt": [Release("0.7.2")],
            "nvidia-cuda-nvcc": [Release("13.0.88", files={"nvidia/cu13/bin/ptxas-jaxtest": b"ptxas"})],
            "nvidia-nvvm": [Release("13.0.88", files={"nvidia/cu13/nvvm/libdevice-jaxtest.bc": b"bc"})],
        },
    )
    where = f'index_url: "{index.url}", trusted_hosts: ["{gateway}"]'
    head = 'name: pkgs\ntag: v1\nbase: {framework: pytorch, tag: "25.10"}\n'
    try:
        recipe = _project(tmp_path, head + f'pip: {{packages: ["jax[cuda12]"], {where}}}\n')
        refused = run_cli("build", str(recipe), cwd=tmp_path)
        assert refused.code == 2 and "ask for the CUDA 13 build (jax[cuda13])" in refused.err, refused.err[-2000:]
        recipe.write_text(recipe.read_text().replace("jax[cuda12]", "jax[cuda13]"))  # the cure, literally
        locked = run_cli("lock", str(recipe), "--json", cwd=tmp_path)
        assert locked.code == 0, locked.err[-2000:]
        assert sorted(json.loads(locked.out)["pins"]) == ["jax==0.7.2", "jaxlib==0.7.2"]
        lock_text = recipe.with_name(recipe.stem + ".lock.txt").read_text()
        assert "# nvidia-cuda-nvcc==13.0.88: a CUDA library" in lock_text
        assert run_cli("validate", str(recipe), cwd=tmp_path).code == 0  # what lock wrote, validate accepts
        built = run_cli("build", str(recipe), cwd=tmp_path)
        assert built.code == 0, built.err[-3000:]
        image = built.out.strip().splitlines()[-1].split(" -> ")[0]
        cleanup_images.append(image)
        said = in_image(docker_client, image, "import importlib.metadata as m; print(m.version('nvidia-cuda-nvcc'))")
        assert said.split()[-1] == "13.0.88"  # installed as the plugin asks
    finally:
        index.close()


@pytest.mark.engine
def test_a_stale_lock_is_cured_by_the_command_the_refusal_names(testbed, tmp_path, cleanup_images):
    """The loop on the bed: the recipe is edited past its lock; validate and build name both lines
    and say `run imgbuild lock RECIPE`; that command, run literally, re-resolves, and the next build works."""
    import re

    recipe = _project(tmp_path, 'name: pkgs\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\npip: ["einops>=0.7"]\n')
    lock_file = recipe.with_name("pkgs.lock.txt")
    lock_file.write_text("einops==0.7.0\n")  # locked when the recipe admitted it
    recipe.write_text(recipe.read_text().replace("einops>=0.7", "einops>=0.8"))
    refused = run_cli("build", str(recipe), cwd=tmp_path)
    assert refused.code == 2, refused.err[-2000:]
    said = re.search(r"run (imgbuild lock \S+)", refused.err)
    assert said and "pkgs.lock.txt:1" in refused.err, refused.err[-2000:]
    cure = said.group(1).split()
    assert run_cli(*cure[1:], cwd=tmp_path).code == 0  # the words, as a user would type them
    assert not lock_file.read_text().splitlines()[-1].startswith("einops==0.7.")
    built = run_cli("build", str(recipe), cwd=tmp_path)
    assert built.code == 0, built.err[-3000:]
    cleanup_images.append(built.out.strip().splitlines()[-1].split(" -> ")[0])


@pytest.mark.engine
def test_a_just_in_time_extension_without_a_compiler_is_cured_by_the_apt_line_it_names(
    testbed, tmp_path, cleanup_images
):
    """DeepSpeed's op, compiled at first use, failed in smoke.run with `c++: not found` and no cure.
    The same with torch's own just-in-time build (torch.utils.cpp_extension.load_inline) on the slim stand-in: the
    smoke test names the apt line, and the recipe with it builds, the extension compiled and run in the image."""
    import re

    check = (
        'python3 -c \\"from torch.utils.cpp_extension import load_inline; '
        "m = load_inline('jit_one', 'int one() { return 1; }', functions=['one']); assert m.one() == 1\\\""
    )
    head = 'name: pkgs\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\npip: [ninja]\n'
    recipe = _project(tmp_path, head + f'smoke:\n  run: ["{check}"]\n')
    bare = run_cli("build", str(recipe), cwd=tmp_path)
    assert bare.code == 1, bare.err[-3000:]
    said = re.search(r"add apt: \[([^\]]+)\]", bare.err)
    assert said and said.group(1) == "g++, python3-dev", bare.err[-3000:]
    recipe.write_text(recipe.read_text() + f"apt: [{said.group(1)}]\n")  # the line it named, literally
    cured = run_cli("build", str(recipe), cwd=tmp_path)
    assert cured.code == 0, cured.err[-3000:]
    cleanup_images.append(cured.out.strip().splitlines()[-1].split(" -> ")[0])


@pytest.mark.engine
def test_adding_a_package_to_a_locked_recipe_reuses_the_lock_layer(testbed, tmp_path, cleanup_images, docker_client):
    """With a lock, the pip step is two layers: the lock exactly (cached while the lock stands),
    then the recipe's packages over it; a package added to the recipe installs alone on top."""
    from tests.conftest import in_image

    head = 'name: inc\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\n'
    recipe = _project(tmp_path, head + 'pip: {packages: ["einops>=0.7"], installer: uv}\n')
    assert run_cli("lock", str(recipe), cwd=tmp_path).code == 0
    recipe.with_name("pkgs.lock.txt").write_text("einops==0.7.0\n")
    first = run_cli("build", str(recipe), cwd=tmp_path)
    assert first.code == 0, first.err
    cleanup_images.append("imgbuildtest/inc:v1")
    recipe.write_text(head.replace("v1", "v2") + 'pip: {packages: ["einops>=0.7", "toolz"], installer: uv}\n')
    second = run_cli("build", str(recipe), cwd=tmp_path)
    assert second.code == 0, second.err
    cleanup_images.append("imgbuildtest/inc:v2")

    def layers(ref: str) -> list[str]:
        return docker_client.api.inspect_image(ref)["RootFS"]["Layers"]

    base = len(layers(f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"))
    v1, v2 = layers("imgbuildtest/inc:v1"), layers("imgbuildtest/inc:v2")
    shared = next(i for i, (a, b) in enumerate(zip(v1, v2, strict=False)) if a != b)
    # the base and the lock layer: the same; the recipe's layer onwards: new
    assert shared == base + 1, (base, v1, v2)
    versions = in_image(
        docker_client, "imgbuildtest/inc:v2", "import einops, toolz; print(einops.__version__, bool(toolz.__version__))"
    )
    assert versions.split() == ["0.7.0", "True"]


HOSTILE_SMOKE_FIELDS = [
    ("imports", '["os; rm -rf /"]', "smoke.imports[0]: not a module name"),
    ("imports", '["cv2\\nFROM x"]', "smoke.imports[0]"),
    ("skip_imports", '["../x"]', "smoke.skip_imports[0]: not a package name"),
    ("skip_imports", '["' + "a" * 300 + '"]', "smoke.skip_imports[0]: not a package name"),
    ("run", '["echo\\nFROM x"]', "smoke.run[0]"),
    ("targets", '["h100; rm"]', "smoke.targets[0]"),
    ("run", "[" + ", ".join(['"true"'] * 33) + "]", "smoke.run"),
]


@pytest.mark.parametrize(("field", "value", "message"), HOSTILE_SMOKE_FIELDS)
def test_hostile_smoke_fields_are_named_at_their_line(tmp_path, field, value, message):
    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: r\nbase: {{framework: pytorch, tag: "24.05"}}\nsmoke:\n  {field}: {value}\n')
    result = run_cli("validate", str(recipe))
    assert result.code == 2 and "r.yaml:4" in result.err and message in result.err, result.err
    assert "Traceback" not in result.err and len(result.err.splitlines()) <= 3


def test_a_lock_that_links_out_of_the_repository_is_not_read(tmp_path):
    from imgbuild.errors import RecipeError
    from imgbuild.recipe import load_recipe

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".git").mkdir()
    outside = tmp_path / "secret.txt"
    outside.write_text("hunter2==1\n")
    recipe = repo / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: [einops]\n')
    (repo / "r.lock.txt").symlink_to(outside)
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    assert "outside the recipe's repository" in str(err.value) and "hunter2" not in str(err.value)


# --- every base pin checked before the build ------------------------------------------

BASE_PINS = ("numpy==2.1.0", "torchvision==0.20.0", "pillow==10.4.0", "torch==2.13.0", "nvidia-cudnn-cu12==9.1.0.70")


def _conflicts(
    tmp_path: Path, pip: str, files: dict[str, str] | None = None, requires: dict[str, list[str]] | None = None
) -> list[str]:
    """The plan's conflicts for a recipe asking `pip`, on a base with BASE_PINS whose distributions require
    `requires` (as the pins probe reads them; none read by default)."""
    from imgbuild.errors import RecipeError
    from imgbuild.pipeline.plan import BasePins, make_plan
    from imgbuild.recipe import load_recipe
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir(exist_ok=True)
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: r\nbase: {{framework: pytorch, tag: "24.05"}}\npip: {pip}\n')
    read = BasePins("the base's /etc/pip/constraint.txt", BASE_PINS, {k: tuple(v) for k, v in (requires or {}).items()})
    pins = lambda base: read  # noqa: E731
    try:
        make_plan(load_recipe(recipe), settings(), fake_inspect, read_pins=pins)
    except RecipeError as exc:
        return [line.replace(f"{tmp_path}/", "") for line in exc.lines()]
    return []


def test_every_requirement_a_base_pin_excludes_is_reported_at_once_at_its_line(tmp_path):
    """The real install script: torch, numpy and torchvision pins, in a file and a nested one: one run."""
    files = {
        "requirements.txt": "-r nested.txt\neinops\nnumpy==1.26.2  # old\ntorch<2.2\n",
        "nested.txt": "torchvision==0.16.1\npillow>=10\n",
    }
    lines = _conflicts(tmp_path, "{requirements: requirements.txt}", files)
    assert len(lines) == 3, lines
    assert any(
        ln.startswith(
            "nested.txt:1:1: pip.requirements: torchvision==0.16.1 conflicts with the base's torchvision==0.20.0"
        )
        for ln in lines
    ), lines
    assert any(ln.startswith("requirements.txt:3:1: pip.requirements: numpy==1.26.2 conflicts") for ln in lines)
    assert any(ln.startswith("requirements.txt:4:1: pip.requirements: torch<2.2 conflicts") for ln in lines)
    numpy = next(ln for ln in lines if "numpy" in ln)
    assert "the base's /etc/pip/constraint.txt" in numpy and "pip.unpin: [numpy]" in numpy


def test_a_base_pin_that_is_a_pre_release_of_the_asked_release_is_named_as_ngc_s_trap_with_its_cure(
    tmp_path, monkeypatch
):
    """NGC builds torchvision from source beside its torch: `torchvision==0.28.0` excludes the base's own
    0.28.0a0, which is that release; the cure admits the pre-release rather than unpinning what pins torch."""
    monkeypatch.setattr(sys.modules[__name__], "BASE_PINS", (*BASE_PINS[:1], "torchvision==0.28.0a0+094e7af5"))
    (line,) = _conflicts(tmp_path, '["torchvision==0.28.0"]')
    assert "torchvision==0.28.0 is not met by the base's torchvision 0.28.0a0+094e7af5" in line, line
    assert "pre-release of 0.28.0" in line and "torchvision>=0.28.0a0" in line and "pip.unpin" not in line
    assert _conflicts(tmp_path, '["torchvision>=0.28.0a0", "torchvision"]') == []
    (other,) = _conflicts(tmp_path, '["torchvision==0.27.1"]')
    assert "conflicts with the base's torchvision==0.28.0a0+094e7af5" in other, other


@pytest.mark.parametrize(
    ("requires", "says"),
    [
        ({"torch": ["numpy>=2.0", "filelock"]}, "pip.unpin: [numpy] cannot help: the base's torch needs numpy>=2.0:"),
        (  # needed through another of the base's distributions
            {"torch": ["sympy>=1.13"], "sympy": ["mpmath<1.4", "numpy<1; extra == 'plot'", "numpy>=2.1"]},
            "pip.unpin: [numpy] cannot help: the base's torch needs numpy>=2.1 via sympy:",
        ),
        ({"torch": ["numpy>=1.22"]}, "let pip move it with pip.unpin: [numpy]"),  # numpy 1.26 meets both
        (  # another of the base's distributions, not the framework's chain: moving numpy breaks it all the same
            {"torch": ["filelock"], "scipy": ["numpy>=2.0; python_version >= '3'"]},
            "pip.unpin: [numpy] cannot help: the base's scipy needs numpy>=2.0:",
        ),
        ({"torch": ["numpy"]}, "let pip move it with pip.unpin: [numpy]"),  # no clause: any numpy
        ({}, "let pip move it with pip.unpin: [numpy]"),  # the base's requirements not read: pip's step judges
    ],
)
def test_the_unpin_cure_is_named_only_where_the_bases_framework_admits_what_the_recipe_asks(tmp_path, requires, says):
    """Moving a pinned package is a cure only if the base's framework can live with the version asked for: read
    from the base's own requirements, the plan says when it cannot, and what would be needed instead."""
    (line,) = _conflicts(tmp_path, '["numpy<2"]', requires=requires)
    assert "numpy<2 conflicts with the base's numpy==2.1.0" in line and says in line, line
    if "cannot help" in says:
        holder = says.split("the base's ")[1].split(" ")[0]
        assert line.endswith(f"drop the pin, or use a base whose {holder} admits numpy<2)"), line
    from benchmarks.follow import UNPIN  # the scripted user never follows a cure imgbuild says cannot help

    assert bool(UNPIN.search(line)) == ("cannot help" not in says)


@pytest.mark.parametrize(
    ("pip", "conflicts"),
    [
        ('["numpy<2"]', ["numpy<2"]),
        ('["numpy>=2,<3", "pillow~=10.0", "einops==0.8.0"]', []),  # what the pins allow is no conflict
        ('["Pillow==9.5.0"]', ["Pillow==9.5.0"]),  # names compare canonically
        ('["numpy @ https://example.org/numpy-1.0-py3-none-any.whl"]', ["numpy from a URL"]),
        ("[\"numpy<2; python_version < '3.0'\"]", []),  # a marker: pip judges it in the image
        ('{packages: ["numpy<2"], unpin: [numpy]}', []),  # unpinned on purpose
        ('{packages: [einops], constraints: ["torchvision<0.17"]}', ["torchvision<0.17"]),
        ('["nvidia-cudnn-cu12==8.9.0"]', ["would replace a CUDA library"]),  # the CUDA check, once
    ],
)
def test_base_pins_against_each_kind_of_requirement(tmp_path, pip, conflicts):
    lines = _conflicts(tmp_path, pip)
    assert len(lines) == len(conflicts), lines
    for line, expected in zip(lines, conflicts, strict=True):
        assert expected in line, lines


def test_a_build_reads_the_base_pins_once_and_stops_before_building(tmp_path):
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.engine.types import ImageInfo
    from imgbuild.errors import RecipeError
    from imgbuild.pipeline import build as pipeline
    from imgbuild.pipeline.build import BuildJob
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.recipe import load_recipe
    from tests.support import DIGEST, fake_inspect

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: ["numpy<2", einops]\n')
    settings = load_settings(
        {"user": "alice", "ngc_registry": "registry.test:5000", "cache_dir": str(tmp_path / "cache")}, environ={}
    )
    engine = FakeEngine()
    engine.containers.base_pins = list(BASE_PINS)
    base = f"registry.test:5000/nvidia/pytorch:24.05-py3@{DIGEST}"
    engine.images.add("sha256:" + "b" * 64, ImageInfo("sha256:" + "b" * 64), base)
    for _ in range(2):
        plan = make_plan(load_recipe(recipe), settings, fake_inspect)
        with pytest.raises(
            RecipeError,
            match=r"r.yaml:3:7: pip.packages\[0\]: numpy<2 conflicts with the base.s numpy==2.1.0 .* \(pinned by the base.s constraint file: drop the pin, or let pip move it with pip.unpin: \[numpy\]\)",
        ):
            pipeline.build_platforms(BuildJob(plan.loaded, out=tmp_path / "ctx", planned=plan), settings, engine)
    assert engine.calls.count(f"pins {base}") == 1, engine.calls  # the second build read the cache
    assert not any(c.startswith(("build", "smoke")) for c in engine.calls), engine.calls
    assert not (tmp_path / "ctx").exists()


@pytest.mark.engine
def test_the_base_pins_are_read_in_the_real_base_and_every_conflict_named_before_building(testbed, tmp_path):
    """The stand-in's /etc/pip/constraint.txt pins numpy: an old numpy and an old torch in one file are two
    lines of one exit 2, in seconds, with no build started."""
    (tmp_path / "recipes").mkdir(exist_ok=True)
    (tmp_path / "recipes" / "req.txt").write_text("einops\nnumpy==1.26.2\ntorch<2.6\n")
    recipe = _project(tmp_path, 'name: pkgs\nbase: {framework: pytorch, tag: "24.05"}\npip: {requirements: req.txt}\n')
    res = run_cli("build", str(recipe), cwd=tmp_path)
    assert res.code == 2, res.err
    lines = [ln for ln in res.err.splitlines() if ln.startswith("imgbuild: ")]
    assert len(lines) == 2, res.err
    assert "req.txt:2:1: pip.requirements: numpy==1.26.2 conflicts with the base's numpy==" in lines[0]
    # NGC 24.05 has no constraint file (it came with 25.03): the pins are a freeze of the base
    assert "pinned by a freeze of the base's packages" in lines[0] and "pip.unpin: [numpy]" in lines[0]
    assert "req.txt:3:1: pip.requirements: torch<2.6 conflicts with the base's torch 2.13.0" in lines[1]
    assert not (tmp_path / "images").exists()


# --- a bounded resolver ------------------------------------------------------------------

FAKE_PIP = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
print("Collecting hogpkg", flush=True)
for n in range(5):
    print(f"  Downloading hogpkg-1.0.{9 - n}-py3-none-any.whl (3.0 MB)", flush=True)
    if n == 1:
        print("INFO: pip is looking at multiple versions of hogpkg to determine which version is compatible", flush=True)
time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


def _guard(tmp_path: Path, seconds: str, sleep: float, code: int):
    import os
    import subprocess
    import time

    (tmp_path / "fakepip.py").write_text(FAKE_PIP)
    env = dict(os.environ, IMGBUILD_PIP_RESOLVE_SECONDS=seconds, IMGBUILD_PIP_DOWNLOAD_LIMIT="")
    guard = guard_folder(tmp_path / "pip")
    cmd = [sys.executable, str(guard), "the base's pins", sys.executable, str(tmp_path / "fakepip.py")]
    start = time.monotonic()
    proc = subprocess.run([*cmd, str(tmp_path / "pid"), str(sleep), str(code)], capture_output=True, text=True, env=env)
    return proc, time.monotonic() - start, int((tmp_path / "pid").read_text())


def test_the_guard_stops_a_resolver_past_its_time_and_names_the_package_it_backtracks_through(tmp_path):
    import os

    proc, took, pid = _guard(tmp_path, "2", 120, 0)
    assert proc.returncode == 1 and took < 15, (proc.stdout, took)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("imgbuild: pip step failed: stopped: still resolving after 2 s"), last
    assert "pip backtracked through 5 versions of hogpkg" in last and "pin hogpkg to a version made for" in last
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # pip itself is gone, not left running in the build step


def test_the_guard_passes_pip_through_when_it_stays_within_bounds(tmp_path):
    proc, _, _ = _guard(tmp_path, "30", 0.2, 0)
    assert proc.returncode == 0 and "imgbuild:" not in proc.stdout and proc.stdout.count("Downloading hogpkg") == 5
    failed, _, _ = _guard(tmp_path, "30", 0.2, 3)
    assert failed.returncode == 1 and failed.stdout.strip().splitlines()[-1] == (
        "imgbuild: pip step failed: pip failed; see its output above; pip backtracked through 5 versions of hogpkg: "
        "each likely needs another version of a package the base pins (its framework?); pin hogpkg to a version "
        "made for the base (not checked: the resolver did not say which release fits)"
    )


PIP_CONFLICT = """Collecting hogpkg
  Downloading http://172.17.0.1:43203/files/hogpkg-1.0.2-py3-none-any.whl (3.1 MB)
  Downloading http://172.17.0.1:43203/files/hogpkg-1.0.1-py3-none-any.whl (3.1 MB)
ERROR: Cannot install hogpkg because these package versions have conflicting dependencies.
The conflict is caused by:
    hogpkg 1.0.2 depends on torch==1.0.2
    hogpkg 1.0.1 depends on torch==1.0.1
    The user requested (constraint) torch==2.13.0+cpu
ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/..."""


@pytest.mark.parametrize(
    ("output", "why"),
    [
        (
            PIP_CONFLICT,
            "2 versions of hogpkg need torch==1.0.2 (or similar), but the base holds torch==2.13.0+cpu (from the "
            "base's /etc/pip/constraint.txt): pin hogpkg to a version made for the base, or drop it",
        ),
        (
            PIP_CONFLICT.replace("hogpkg 1.0.2 depends on torch==1.0.2\n", "").replace("torch==2", "numpy==2"),
            "the recipe's packages conflict with each other or with the pins (from the base's "
            "/etc/pip/constraint.txt); see the conflict above",
        ),
        (
            "ERROR: Could not install packages due to an OSError: HTTPSConnectionPool: Max retries exceeded "
            "(Caused by SSLError(SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED]')))",
            "TLS failure reaching the package index (a proxy's CA? set pip_ca_bundle)",
        ),
        (
            "WARNING: Retrying ... NewConnectionError: Failed to establish a new connection: [Errno -3] "
            "Temporary failure in name resolution",
            "network failure reaching the package index (offline? a proxy? set pip_index_url)",
        ),
        (
            "The conflict is caused by:\n    keras-hub 0.18 depends on tensorflow\n"
            "    The user requested (constraint) tensorflow<0",
            "keras-hub 0.18 needs tensorflow, another distribution of the base's framework: it would overwrite the "
            "base's own; see the conflict above (drop keras-hub, or pin a release of it that needs no tensorflow)",
        ),
        (
            "ERROR: Could not find a version that satisfies the requirement nosuch==9 (from versions: none)",
            "a package or version does not exist on the index for this Python and platform; see above",
        ),
        (
            "  error: subprocess-exited-with-error\n  x Getting requirements to build wheel did not run successfully.",
            "building a package from source failed; see the compiler or build output above",
        ),
        ("Traceback (most recent call last):", "pip failed; see its output above"),
        # uv says the same things its own way
        (
            "error: No solution found when resolving dependencies\n  cause: Because torchvision==0.18.0 depends on "
            "torch==2.3.0 and torch==2.13.0+cpu, we can conclude that torchvision==0.18.0 cannot be used.",
            "torchvision 0.18.0 needs torch==2.3.0, but the base holds torch==2.13.0+cpu (from the base's "
            "/etc/pip/constraint.txt): pin torchvision to a version made for the base, or drop it",
        ),
        (
            "  x No solution found when resolving dependencies:\n  Because all versions of hogpkg depend on "
            "torch==1.0.0 and torch==2.13.0+cpu, we can conclude that all versions of hogpkg cannot be used.",
            "every version of hogpkg needs torch==1.0.0, but the base holds torch==2.13.0+cpu (from the base's "
            "/etc/pip/constraint.txt): pin hogpkg to a version made for the base, or drop it",
        ),
        (
            "  Because keras-hub==0.18.1 depends on tensorflow and you require tensorflow<0, we can conclude that "
            "keras-hub==0.18.1 cannot be used.\nNo solution found when resolving dependencies",
            "keras-hub 0.18.1 needs tensorflow, another distribution of the base's framework: it would overwrite the "
            "base's own; see the conflict above (drop keras-hub, or pin a release of it that needs no tensorflow)",
        ),
        (  # "a package needs tensorflow" did not say which (tf-keras)
            "The conflict is caused by:\n    tf-keras 2.20.1 depends on tensorflow<2.21,>=2.20\n"
            "    tf-keras 2.20.0 depends on tensorflow<2.21,>=2.20\n    The user requested (constraint) tensorflow<0",
            "every version of tf-keras needs tensorflow, another distribution of the base's framework: it would "
            "overwrite the base's own; see the conflict above (drop tf-keras, or pin a release of it that needs no "
            "tensorflow)",
        ),
        (
            "error: Because nosuch was not found in the package registry and you require nosuch, we can conclude",
            "nosuch: no such package or version on the index for this Python and platform (a typo in the recipe or "
            "its requirements file? the name as the index spells it); see above",
        ),
        (  # uv's not-found ends in "No solution found" too: a typo is not a conflict with the base's pins
            "  × No solution found when resolving dependencies:\n  ╰─▶ Because einopz was not found in the package "
            "registry and you require einopz, we can conclude that your requirements are unsatisfiable.",
            "einopz: no such package or version on the index for this Python and platform (a typo in the recipe or "
            "its requirements file? the name as the index spells it); see above",
        ),
        (
            "ERROR: Could not find a version that satisfies the requirement einops==9.9 (from versions: 0.8.0)\n"
            "ERROR: No matching distribution found for einops==9.9",
            "einops==9.9: no such package or version on the index for this Python and platform (a typo in the "
            "recipe or its requirements file? the name as the index spells it); see above",
        ),
        (
            "  ╰─▶ Because there is no version of einops==9.9 and you require einops==9.9, we can conclude that your "
            "requirements are unsatisfiable.",
            "einops==9.9: no such package or version on the index for this Python and platform (a typo in the "
            "recipe or its requirements file? the name as the index spells it); see above",
        ),
        (
            "error: Request failed after 3 retries\n  Caused by: invalid peer certificate: UnknownIssuer",
            "TLS failure reaching the package index (a proxy's CA? set pip_ca_bundle)",
        ),
        (  # install.sh lets a source build's isolated environment have only the base's torch (torchsort's)
            "error: Failed to download and build `torchsort==0.1.10`\n"
            "  cause: Failed to resolve requirements from `build-system.requires`\n"
            "  cause: No solution found when resolving: `setuptools>=61.0`, `wheel`, `torch>=1.7.1`\n"
            "  cause: Because there is no version of torch==2.13.0a0+07cecf4168.nv24.5 and you require "
            "torch==2.13.0a0+07cecf4168.nv24.5, we can conclude that your requirements are unsatisfiable.",
            "building torchsort asks for torch in its isolated build environment, which would build it against "
            "another torch than the base's: add torchsort to pip.no_build_isolation, so that it builds against the "
            "base's own",
        ),
        (  # uv's range form ("X>=v depends on") was missed, and pip's pattern took "Because"
            "  x No solution found when resolving dependencies:\n  Because tf-models-official>=2.20.0 depends on "
            "tensorflow>=2.20.0,<2.21.dev0 and tensorflow==2.21.0+nv24.5, we can conclude that "
            "tf-models-official>=2.20.0 cannot be used.",
            "tf-models-official >=2.20.0 needs tensorflow>=2.20.0,<2.21.dev0, but the base holds "
            "tensorflow==2.21.0+nv24.5 (from the base's /etc/pip/constraint.txt): pin tf-models-official to a "
            "version made for the base, or drop it",
        ),
    ],
)
def test_a_pip_failure_is_one_line_saying_which_kind_and_which_package(output, why, monkeypatch):
    guard = guard_module()
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")  # a base with a compiler
    watch = guard.Watch()
    for line in output.splitlines():
        watch.see(line.strip())
    assert watch.failure("the base's /etc/pip/constraint.txt") == why


def test_a_source_build_to_be_built_against_the_base_names_the_compiler_the_base_lacks_in_the_same_line(monkeypatch):
    """torchsort on the slim stand-in took a round for pip.no_build_isolation and another for the compiler: the
    line that names the field names the compiler too, where the base has none."""
    guard = guard_module()
    monkeypatch.setattr("shutil.which", lambda name: None)
    watch = guard.Watch()
    for line in ("error: Failed to download and build `srcpkg==1.0`", "ModuleNotFoundError: No module named 'torch'"):
        watch.see(line)
    assert watch.failure("x").endswith(
        "add srcpkg to pip.no_build_isolation, so that it builds against the base's own framework; it needs a C/C++ "
        "compiler too, which the base lacks: add apt: [g++, python3-dev]"
    )


@pytest.mark.parametrize("line", ["imgbuild: pip still resolving: 40 s, 1.2 GB downloaded", "imgbuild: \x1b[2Jx\x07"])
def test_the_pip_status_lines_reach_the_progress_and_nothing_else_does(line):
    from imgbuild.engine.types import own_status

    shown = own_status(line)
    assert shown is not None and shown.isprintable() and shown.startswith("imgbuild: ")
    assert own_status("Collecting torch") is None and own_status("x imgbuild: y") is None


@pytest.mark.engine
@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_a_resolver_backtracking_through_every_release_stops_at_the_download_limit(
    installer, testbed, tmp_path, docker_client, monkeypatch
):
    """vLLM in miniature: every release of hogpkg pins another torch than the base's; pip downloads them one
    after another. The pip step stops at the limit and names the package, instead of 22 GB and a DNS error."""
    from tests.fake_index import FakeIndex, Release

    gateway = bridge_gateway(docker_client)
    releases = [Release(f"1.0.{n}", [f"torch==1.0.{n}"], padding=3 * 1024 * 1024) for n in range(12)]
    index = FakeIndex(gateway, {"hogpkg": releases}, delay=0.5)  # a real index is slower than the bridge
    try:
        monkeypatch.setenv("IMGBUILD_PIP_DOWNLOAD_LIMIT", "8M")
        pip = f'{{packages: [hogpkg], index_url: "{index.url}", trusted_hosts: ["{gateway}"], installer: {installer}}}'
        recipe = _project(tmp_path, f'name: pkgs\nbase: {{framework: pytorch, tag: "24.05"}}\npip: {pip}\n')
        res = run_cli("build", str(recipe), cwd=tmp_path)
    finally:
        index.close()
    assert res.code == 1, res.err
    assert "build failed at the pip step" in res.err, res.err[-3000:]
    assert (
        "stopped: the step downloaded" in res.err and "more than the limit of 8.0 MiB (pip_download_limit)" in res.err
    )
    if installer == "pip":  # pip says which wheel it fetches; uv fetches them silently
        assert "backtracked through" in res.err and "versions of hogpkg" in res.err, res.err[-3000:]
    assert f"with {installer} under" in res.err and 2 <= len(index.served) < 12, index.served


def test_every_import_failure_is_kept_and_the_apt_cure_is_one_line(site):
    """Failures were cut to the first four and smoke.json kept no more, so OpenCV's whole apt
    line hid behind a partial one and cost a rebuild. All are kept in the details; the reason names how many more
    and one apt line cures them all."""
    missing = "{}: cannot open shared object file: No such file or directory"
    for n, lib in enumerate(["libGL.so.1", "libxcb.so.1", "libSM.so.6", "libgthread-2.0.so.0", "libXext.so.6"]):
        _dist(site, f"native{n}", "1.0", f"native{n}", f"raise ImportError({missing.format(lib)!r})")
    _dist(site, "broken", "1.0", "brokenmod", "raise RuntimeError('boom')")
    check = _imports()
    assert check["status"] == "fail"
    assert "6 of 6 module(s) do not import" in check["reason"] and "and 2 more (all in smoke.json)" in check["reason"]
    assert (
        "for all of them, add to the recipe: apt: [libgl1, libglib2.0-0, libsm6, libxcb1, libxext6]" in check["reason"]
    )
    assert len(check["details"]["failures"]) == 6 and any("brokenmod" in f for f in check["details"]["failures"])
    assert check["details"]["apt"] == ["libgl1", "libglib2.0-0", "libsm6", "libxcb1", "libxext6"]


@pytest.mark.parametrize(
    "why, script_text, said, not_said",
    [
        (
            "a CUDA extension build without a compiler and Python headers (the cause is above ninja's last line)",
            "echo '[1/2] c++ -c ext.cpp'; echo 'sh: 1: c++: not found' >&2; "
            "echo 'ext.cpp:1:10: fatal error: Python.h: No such file or directory'; "
            "for i in $(seq 30); do echo compiling $i; done; echo 'ninja: build stopped: subcommand failed.' >&2; exit 1",
            ["c++: not found", "fatal error: Python.h: No such file or directory"],
            ["compiling 30"],
        ),
        ("no error words: the last line", "echo one; echo two; exit 4", ["exited 4: two"], ["one"]),
        ("no output at all", "exit 9", ["exited 9: (no output)"], []),
    ],
)
def test_a_failed_smoke_run_command_keeps_its_cause_and_its_output(site, monkeypatch, why, script_text, said, not_said):
    """A smoke.run failure kept only its last stderr line ("ninja: build stopped"); the cause two
    screens up was lost. The reason carries the lines that name an error; the details keep the output's tail."""
    monkeypatch.setenv("IMGBUILD_SMOKE_RUN", json.dumps([script_text]))
    report = smoke_report.Report()
    report.run("recipe checks", smoke_commands.check_commands)
    check = report.checks[-1]
    assert check["status"] == "fail", why
    for words in said:
        assert words in check["reason"], (why, check["reason"])
    causes = check["reason"].rsplit("' exited ", 1)[-1]  # the command itself is quoted before it
    for words in not_said:
        assert words not in causes, (why, check["reason"])
    assert (
        check["details"]["command"] == script_text and len(check["details"]["output"]) <= smoke_commands.RUN_TAIL_LINES
    )


def test_a_chatty_failing_command_is_kept_bounded(site, monkeypatch):
    monkeypatch.setenv(
        "IMGBUILD_SMOKE_RUN", json.dumps(["yes 'a long line of build output' | head -c 20000000; exit 2"])
    )
    report = smoke_report.Report()
    report.run("recipe checks", smoke_commands.check_commands)
    check = report.checks[-1]
    assert check["status"] == "fail" and len(check["details"]["output"]) == smoke_commands.RUN_TAIL_LINES
    assert len(json.dumps(check)) < 40_000


def _record(site: Path, name: str, version: str, lines: list[str]) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{line}\n" for line in lines) + f"{info.name}/METADATA,,\n")


def test_two_distributions_owning_one_module_fail_where_their_files_differ(site):
    """opencv-python and opencv-python-headless both own cv2/ at two versions; the one installed
    last overwrote the other's files and nothing said so. Identical files (namespace boilerplate) are fine."""
    (site / "cv2x").mkdir()
    (site / "cv2x" / "__init__.py").write_text("")
    _record(site, "opencv-python-x", "4.10.0", ["cv2x/__init__.py,sha256=AAAA,10"])
    _record(site, "opencv-python-headless-x", "4.9.0", ["cv2x/__init__.py,sha256=BBBB,12"])
    (site / "nsx").mkdir()
    (site / "nsx" / "__init__.py").write_text("")
    _record(site, "ns-one", "1.0", ["nsx/__init__.py,sha256=SAME,5"])
    _record(site, "ns-two", "1.0", ["nsx/__init__.py,sha256=SAME,5"])
    check = _imports()
    assert check["status"] == "fail", check
    found = [f for f in check["details"]["failures"] if "installed by" in f]
    assert found == [
        "cv2x is installed by opencv-python-headless-x 4.9.0 and opencv-python-x 4.10.0: the last one installed "
        "overwrote the other's files; keep one of them"
    ], found


@pytest.mark.parametrize(
    "names, on_path, expected",
    [
        (["openai-whisper"], set(), [("openai-whisper", "ffmpeg", "ffmpeg")]),
        (["openai-whisper"], {"ffmpeg"}, []),
        (
            ["pytesseract", "pdf2image"],
            set(),
            [("pdf2image", "pdftoppm", "poppler-utils"), ("pytesseract", "tesseract", "tesseract-ocr")],
        ),
        (["numpy"], set(), []),
    ],
)
def test_programs_a_package_runs_are_checked_like_libraries(names, on_path, expected):
    """openai-whisper was promoted with no ffmpeg and no hint."""
    assert (
        smoke_hints.missing_tools(names, which=lambda tool: f"/usr/bin/{tool}" if tool in on_path else None) == expected
    )


def test_a_missing_program_fails_the_import_check_with_its_apt_line(site, monkeypatch):
    monkeypatch.setitem(smoke_hints.RUNTIME_TOOLS, "whisperx-fake", {"no-such-program-here": "ffmpeg"})
    _dist(site, "whisperx-fake", "1.0", "whisperxfake")
    check = _imports()
    assert check["status"] == "fail"
    assert "whisperx-fake: runs `no-such-program-here`, which is not installed (add apt: [ffmpeg])" in check["reason"]
    assert check["details"]["apt"] == ["ffmpeg"]


def _dist_needing(site: Path, name: str, version: str, module: str, needs: list[str], body: str = "") -> None:
    _dist(site, name, version, module, body)
    meta = site / f"{name}-{version}.dist-info" / "METADATA"
    meta.write_text(meta.read_text() + "".join(f"Requires-Dist: {n}\n" for n in needs))


def _known(site: Path, monkeypatch, words: str) -> None:
    """The known-good file imgbuild writes beside the script: `name==version fingerprint` per word, the
    fingerprint of the RECORD now installed under that name (any version; a dummy one where there is none)."""
    import hashlib

    lines = []
    for word in words.split():
        name = word.split("==")[0]
        found = [
            p
            for p in site.glob("*.dist-info")
            if smoke_dists._canonical(p.name.removesuffix(".dist-info").rsplit("-", 1)[0])
            == smoke_dists._canonical(name)
        ]
        record = (found[0] / "RECORD").read_text() if found else "none"
        lines.append(f"{word} {hashlib.sha256(chr(10).join(sorted(record.splitlines())).encode()).hexdigest()}\n")
    known = site.parent / "known.txt"
    known.write_text("".join(lines))
    monkeypatch.setattr(smoke_dists, "KNOWN_GOOD_FILE", str(known))


def test_the_edit_loop_re_imports_only_what_changed_and_what_needs_it(site, monkeypatch):
    """Adding one package re-imported all 62 distributions (55 of 57 s). With the last promoted
    image's record, a distribution at the same version that needs nothing that changed is not imported again;
    one that needs a changed one is (a new numpy can break what imports it)."""
    _dist_needing(site, "top-fake", "1.0", "topfake", ["mid-fake>=1"])
    _dist_needing(site, "mid-fake", "2.0", "midfake", [])
    _dist_needing(site, "solo-fake", "1.0", "solofake", [], "raise ImportError('would fail if imported')")
    _dist_needing(site, "new-fake", "0.1", "newfake", [])
    _known(site, monkeypatch, "top-fake==1.0 mid_fake==1.0 Solo.Fake==1.0")
    check = _imports()
    assert check["status"] == "pass", check  # solo-fake is unchanged and needs nothing changed: not imported
    assert "1 unchanged since the last promoted image" in check["reason"]
    assert set(check["details"]["distributions"]) == {"top-fake==1.0", "mid-fake==2.0", "new-fake==0.1"}
    _known(site, monkeypatch, "top-fake==1.0 mid-fake==2.0 solo-fake==0.9")  # solo moved
    assert _imports()["status"] == "fail"
    # something solo-fake needed is gone since: solo-fake is imported again
    (site / "solo-fake-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: solo-fake\nVersion: 1.0\nRequires-Dist: dropped-fake\n"
    )
    _known(site, monkeypatch, "top-fake==1.0 mid-fake==2.0 solo-fake==1.0 dropped-fake==3")
    assert _imports()["status"] == "fail"
    _known(site, monkeypatch, "")  # no record: everything
    assert _imports()["status"] == "fail"
    # the same name and version, another wheel (its files differ): imported again
    _known(site, monkeypatch, "top-fake==1.0 mid-fake==2.0 solo-fake==1.0")
    assert _imports()["status"] == "pass"  # the same files: spared
    record = site / "solo-fake-1.0.dist-info" / "RECORD"
    record.write_text(record.read_text() + "solofake/extra.py,sha256=swapped,10\n")
    assert _imports()["status"] == "fail"


def test_an_images_own_environment_or_file_never_says_what_to_spare(site, monkeypatch, tmp_path):
    """`ENV IMGBUILD_SMOKE_KNOWN_GOOD` in an image was read as the record; now the script reads only
    the file imgbuild writes beside it (always written, empty when nothing is spared)."""
    _dist_needing(site, "broken-fake", "1.0", "brokenfake", [], "raise ImportError('broken')")
    monkeypatch.setenv("IMGBUILD_SMOKE_KNOWN_GOOD", "broken-fake==1.0")
    monkeypatch.setattr(smoke_dists, "KNOWN_GOOD_FILE", str(tmp_path / "absent.txt"))
    assert _imports()["status"] == "fail"
    big = tmp_path / "big.txt"  # over the bound: believed for nothing
    big.write_text("broken-fake==1.0 " + "0" * 64 + "\n" + "x" * (smoke_dists.KNOWN_GOOD_LINES * 400))
    monkeypatch.setattr(smoke_dists, "KNOWN_GOOD_FILE", str(big))
    assert _imports()["status"] == "fail"


def test_a_new_package_that_an_old_one_lists_only_for_an_extra_re_imports_nothing_else(site, monkeypatch):
    """The measured edit loop: adding tabulate re-imported pandas and the 10 that need it (8.5 of 12 s of the
    smoke test), because pandas lists tabulate for its `output-formatting` extra. An extra's requirement is not
    what a package imports; a marker of another kind still counts."""
    _dist_needing(site, "pandas-fake", "3.1", "pandasfake", ['tabulate-fake>=0.9; extra == "output-formatting"'])
    _dist_needing(site, "datasets-fake", "5.2", "datasetsfake", ["pandas-fake"], "raise ImportError('re-imported')")
    _dist_needing(site, "tabulate-fake", "0.10", "tabulatefake", [])
    _dist_needing(site, "marker-fake", "1.0", "markerfake", ['tabulate-fake; python_version >= "3"'])
    _known(site, monkeypatch, "pandas-fake==3.1 datasets-fake==5.2 marker-fake==1.0")
    check = _imports()
    assert check["status"] == "pass", check
    assert set(check["details"]["distributions"]) == {"tabulate-fake==0.10", "marker-fake==1.0"}
    assert "2 unchanged since the last promoted image" in check["reason"]


def test_a_distribution_skipped_by_the_recipe_is_not_taken_for_gone(site, monkeypatch):
    """smoke.skip_imports leaves a distribution out of the work, not out of the image: what needs it is not
    re-imported as if it had been removed."""
    _dist_needing(site, "lib-fake", "1.0", "libfake", [])
    _dist_needing(site, "app-fake", "2.0", "appfake", ["lib-fake"], "raise ImportError('re-imported')")
    monkeypatch.setenv("IMGBUILD_SMOKE_SKIP_IMPORTS", "lib-fake")
    _known(site, monkeypatch, "lib-fake==1.0 app-fake==2.0")
    check = _imports()
    assert check["status"] == "pass", check
    assert "1 unchanged since the last promoted image" in check["reason"]


@pytest.mark.parametrize(
    ("secret", "env", "seconds", "limit"),
    [
        ("IMGBUILD_PIP_RESOLVE_SECONDS=1800\nIMGBUILD_PIP_DOWNLOAD_LIMIT=17179869184\n", {}, 1800, 17179869184),
        (None, {"IMGBUILD_PIP_RESOLVE_SECONDS": "60", "IMGBUILD_PIP_DOWNLOAD_LIMIT": "100"}, 60, 100),  # lock, sdk
        ("IMGBUILD_PIP_RESOLVE_SECONDS=30\n", {"IMGBUILD_PIP_RESOLVE_SECONDS": "60"}, 30, 0),  # the secret wins
        ("IMGBUILD_PIP_RESOLVE_SECONDS=-5\n", {}, 0, 0),  # a sign
        ("IMGBUILD_PIP_RESOLVE_SECONDS=1e9\n", {}, 0, 0),  # an exponent
        ("IMGBUILD_PIP_RESOLVE_SECONDS=\u0661\u0662\n", {}, 0, 0),  # Arabic-Indic digits: not ASCII
        ("IMGBUILD_PIP_RESOLVE_SECONDS= 5\n", {}, 0, 0),  # a space
        ("IMGBUILD_PIP_RESOLVE_SECONDS=" + "9" * 21 + "\n", {}, 0, 0),  # past 20 digits
        (" IMGBUILD_PIP_RESOLVE_SECONDS=5\nimgbuild_pip_resolve_seconds=5\n", {}, 0, 0),  # not the name
        ("\x00\xff garbage", {"IMGBUILD_PIP_DOWNLOAD_LIMIT": "7"}, 0, 7),  # unreadable: the environment's
        (None, {"IMGBUILD_PIP_RESOLVE_SECONDS": "nan", "IMGBUILD_PIP_DOWNLOAD_LIMIT": "inf"}, 0, 0),
        (None, {"IMGBUILD_PIP_RESOLVE_SECONDS": "2.5"}, 2.5, 0),
    ],
)
def test_the_guard_reads_its_bounds_from_the_steps_secret_or_the_environment_as_ascii_digits(
    tmp_path, monkeypatch, secret, env, seconds, limit
):
    """The bounds arrive as a secret on BuildKit and Buildah (no layer's cache key holds them), in the environment
    for `imgbuild lock` and the sdk backend. Anything but ASCII digits is no bound, never an error."""
    guard_module()  # puts the step's scripts on the path, as the guard finds them beside it
    import pip_bounds

    path = tmp_path / "imgbuild-pip-bounds"
    if secret is not None:
        path.write_bytes(secret.encode("utf-8", "surrogateescape") if "\xff" not in secret else b"\x00\xff garbage")
    for name in ("IMGBUILD_PIP_RESOLVE_SECONDS", "IMGBUILD_PIP_DOWNLOAD_LIMIT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert pip_bounds.bound("IMGBUILD_PIP_RESOLVE_SECONDS", float, str(path)) == seconds
    assert pip_bounds.bound("IMGBUILD_PIP_DOWNLOAD_LIMIT", int, str(path)) == limit


def test_the_debian_packages_an_image_added_are_read_with_their_versions_and_nothing_else():
    """The SBOM's apt part: what dpkg has now against the base's record (the recipe's packages and what apt pulled
    in); a line of any other shape (the image's own output is not trusted) is not a package."""
    base = "libc6\t2.36-9+deb12u4\nbash\t5.2.15-2+b2\n"
    now = (
        "libc6\t2.36-9+deb12u9\nbash\t5.2.15-2+b2\njq\t1.6-2.1\nlibjq1:amd64\t1.6-2.1\n"
        "evil\t1.0; rm -rf /\nBad_Name\t1\n\t1.0\nnoversion\t\n" + "x" * 5000 + "\t1\n"
    )
    assert smoke_sbom.added_debs(base, now) == [["jq", "1.6-2.1"], ["libc6", "2.36-9+deb12u9"], ["libjq1", "1.6-2.1"]]


@pytest.mark.parametrize(
    "output, cure",
    [
        (
            ["Building extension module deepspeed_shm_comm...", "/bin/sh: 1: c++: not found"],
            "add apt: [g++, python3-dev]",
        ),
        (["csrc/shm.cpp:1:10: fatal error: Python.h: No such file or directory"], "(add apt: [python3-dev])"),
        (["RuntimeError: Ninja is required to load C++ extensions"], "(add ninja to pip.packages)"),
        (["/bin/sh: 1: nvcc: not found"], "use an NGC framework base"),
        (["AssertionError: wrong answer"], ""),
    ],
)
def test_a_smoke_run_command_whose_build_tool_is_missing_names_the_cure(output, cure):
    """DeepSpeed's just-in-time op build failed in smoke.run with `c++: not found` and no cure."""
    said = smoke_commands.run_cure(output)
    assert (cure in said) if cure else said == ""


MODEL_GARDEN = "tf-models-official 2.20.0 has requirement tensorflow~=2.20.0, but you have tensorflow 2.21.0+nv24.5."


def test_pip_check_lines_a_recipe_accepts_are_kept_in_the_report_and_the_rest_still_fail(tmp_path, monkeypatch):
    """Model Garden 2.20 on the base's TensorFlow 2.21 works (its own check passes), and `pip check`
    refused the image with no way to say it was reviewed. smoke.accept_pip_check names the distributions whose
    complaints are accepted: those lines stay in the report; any other still fails, naming the field."""
    import subprocess as sp

    baseline = tmp_path / "pip-check.base"
    baseline.write_text("No broken requirements found.\n")
    monkeypatch.setattr(smoke_pipcheck, "PIP_CHECK_BASELINE", str(baseline))
    other = "albumentations 1.4.10 has requirement albucore>=0.0.11, but you have albucore 0.0.9."
    said = MODEL_GARDEN + "\n" + other + "\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: sp.CompletedProcess(a, 1, said, ""))
    monkeypatch.setenv("IMGBUILD_SMOKE_ACCEPT_PIP_CHECK", "")
    with pytest.raises(smoke_report.Fail) as refused:
        smoke_pipcheck.check_pip()
    assert "smoke.accept_pip_check: [albumentations, tf-models-official]" in str(refused.value)
    monkeypatch.setenv("IMGBUILD_SMOKE_ACCEPT_PIP_CHECK", "tf_models_official")
    with pytest.raises(smoke_report.Fail) as still:
        smoke_pipcheck.check_pip()
    assert "albumentations" in str(still.value) and "tf-models-official 2.20.0" not in str(still.value)
    monkeypatch.setenv("IMGBUILD_SMOKE_ACCEPT_PIP_CHECK", "tf-models-official albumentations")
    passed = smoke_pipcheck.check_pip()
    assert passed["accepted"] == [MODEL_GARDEN, other] and "accepted by smoke.accept_pip_check" in passed["reason"]


@pytest.mark.parametrize("value", [["tensorflow>=2"], ["a b"], ["x;rm -rf /"], "tf-models-official", ["-x"]])
def test_accept_pip_check_takes_distribution_names_only(tmp_path, value):
    import json

    from imgbuild.errors import RecipeError
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir(exist_ok=True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f'name: r\nbase: {{framework: tensorflow, tag: "24.05"}}\nsmoke: {{accept_pip_check: {json.dumps(value)}}}\n'
    )
    with pytest.raises(RecipeError) as refused:
        load_recipe(recipe, environ={})
    assert "smoke.accept_pip_check" in str(refused.value) and "\n" not in str(refused.value).strip()


def test_the_accepted_distributions_reach_the_smoke_script_and_an_images_own_env_cannot_set_them():
    from imgbuild.pipeline.smoke import SmokeRequest, _script_env

    assert _script_env({}, SmokeRequest("x", accept_pip_check=("a", "b")))["IMGBUILD_SMOKE_ACCEPT_PIP_CHECK"] == "a b"
    assert _script_env({}, SmokeRequest("x"))["IMGBUILD_SMOKE_ACCEPT_PIP_CHECK"] == ""  # set, empty: never the image's
