"""The smoke test's import check (payload/smoke/imports.py) on a machine others use: at most as many imports at
once as CPUs, a budget that grows with the machine's load, a timed-out import tried once more alone, and a
timeout said apart from a failure. A good package is never failed for time; a broken one still fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from imgbuild.payload import SMOKE_MODULES, SMOKE_PACKAGE
from imgbuild.payload.smoke import dists as smoke_dists
from imgbuild.payload.smoke import importing as smoke_importing
from imgbuild.payload.smoke import imports as smoke_imports
from imgbuild.payload.smoke import report as smoke_report
from imgbuild.pipeline.smoke import SCRIPT_VARIABLES, SmokeRequest, _script_env


def _spin(seconds: float) -> str:
    """Module source that burns `seconds` of CPU at import (a heavy but good package)."""
    return f"import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end:\n    pass\n"


@pytest.fixture
def modules(tmp_path, monkeypatch):
    (tmp_path / "fakeframework.py").write_text(_spin(0.4))  # the base's framework: what every import sits on
    (tmp_path / "heavy_ok.py").write_text("import fakeframework\n" + _spin(1.0))
    (tmp_path / "light_ok.py").write_text("import fakeframework\n")
    (tmp_path / "broken.py").write_text("import fakeframework\nraise ImportError('libfoo.so.1: cannot open')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


@pytest.fixture
def busy_machine():
    """Every CPU of this machine busy with another process, for the test's length (bounded: 120 s)."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 120\nwhile time.time() < end: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    time.sleep(0.5)
    yield
    for burner in burners:
        burner.kill()
        burner.wait()


def test_a_good_package_is_never_failed_for_time_on_a_busy_machine_and_a_broken_one_still_fails(modules, busy_machine):
    """A budget the setting gives for a quiet machine (1 s here, below what heavy_ok takes under load) grows with
    what the framework takes to import now; with every CPU busy, heavy_ok passes and broken still fails."""
    configured = 1.0
    budget = smoke_importing.import_budget(configured, smoke_importing.framework_seconds(60, module="fakeframework"))
    work = [("heavy-ok", "1.0", ["heavy_ok"]), ("light-ok", "1.0", ["light_ok"]), ("broken", "1.0", ["broken"])]
    results = smoke_importing.import_all(work, budget, smoke_importing.import_workers())
    assert results[0] == {} and results[1] == {}, (budget, results)
    assert "libfoo.so.1" in results[2]["broken"]
    failures, _, _, _ = smoke_imports._classify(work, results)
    assert len(failures) == 1 and "broken 1.0: import broken" in failures[0]


def test_an_import_that_runs_past_its_budget_is_tried_again_alone_then_said_to_have_timed_out():
    calls = []

    def run(modules, budget):
        calls.append((modules[0], budget))
        return {modules[0]: f"{smoke_importing.TIMED_OUT} after {budget:.0f} s"} if modules[0] == "hangs" else {}

    work = [("hangs", "1", ["hangs"]), ("fine", "1", ["fine"])]
    results = smoke_importing.import_all(work, 10, 2, run=run)
    assert sorted(calls) == [("fine", 10), ("hangs", 10), ("hangs", 20)]
    failures, _, _, _ = smoke_imports._classify(work, results)
    assert failures == [
        "hangs 1: import hangs: timed out after 20 s, twice (not an import error: the machine may be busy; run the "
        "smoke test again, or raise smoke_import_timeout)"
    ]


def test_a_module_that_never_returns_is_ended_by_its_budget(tmp_path, monkeypatch):
    (tmp_path / "forever.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    started = time.monotonic()
    assert smoke_importing._import_one(["forever"], 1) == {"forever": f"{smoke_importing.TIMED_OUT} after 1 s"}
    assert time.monotonic() - started < 10


def test_no_more_imports_at_once_than_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert smoke_importing.import_workers() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert smoke_importing.import_workers() == 4
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert smoke_importing.import_workers() == 1


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("300", 300.0), ("", 120.0), ("0", 120.0), ("-5", 120.0), ("1e9", 120.0), ("١٢٠", 120.0), ("nan", 120.0),
     ("86401", 120.0), (" 30 ", 30.0), ("30s", 120.0)],
)  # fmt: skip
def test_the_import_budget_setting_is_read_as_ascii_digits_only(text, seconds):
    assert smoke_importing.configured_import_seconds(text) == seconds


def test_the_budget_scales_with_the_framework_import_time():
    assert smoke_importing.import_budget(120, 2.0) == 120  # a quiet machine: the setting
    assert smoke_importing.import_budget(120, 40.0) == 40 * smoke_importing.IMPORT_SCALE  # a busy one: more


def test_every_variable_the_script_reads_is_set_by_imgbuild(tmp_path):
    """An image's own ENV never steers the smoke test: each IMGBUILD_* the script reads is set, empty if unused."""
    import re

    text = "".join((SMOKE_PACKAGE / name).read_text() for name in SMOKE_MODULES)
    read = set(re.findall(r'environ\.get\("(IMGBUILD_[A-Z_]+)"', text))
    assert read == set(SCRIPT_VARIABLES)
    env = _script_env({}, SmokeRequest("img"))
    assert {k: env[k] for k in SCRIPT_VARIABLES} == dict.fromkeys(SCRIPT_VARIABLES, "")
    env = _script_env({}, SmokeRequest("img", import_seconds=300, known_good=("a==1 " + "0" * 64,)))
    assert env["IMGBUILD_SMOKE_IMPORT_SECONDS"] == "300" and "IMGBUILD_SMOKE_KNOWN_GOOD" not in env
    # what may be spared travels as a file beside the script, always written (an image's own is overwritten)
    from imgbuild.payload.smoke.dists import KNOWN_GOOD_FILE
    from imgbuild.pipeline.smoke import KNOWN_GOOD_NAME, smoke_probe

    assert KNOWN_GOOD_FILE == "/tmp/" + KNOWN_GOOD_NAME
    assert dict(smoke_probe().files)[KNOWN_GOOD_NAME] == b""
    assert dict(smoke_probe(("a==1 " + "0" * 64,)).files)[KNOWN_GOOD_NAME] == ("a==1 " + "0" * 64 + "\n").encode()


def test_the_import_timeout_setting_is_refused_naming_it_when_it_is_not_seconds(tmp_path):
    from imgbuild.config.settings import load_settings
    from imgbuild.errors import UsageError

    for bad in ("0", "-1", "nan", "inf", "soon", "99999999"):
        with pytest.raises(UsageError, match="smoke_import_timeout"):
            load_settings({}, environ={"IMGBUILD_SMOKE_IMPORT_TIMEOUT": bad})
    assert load_settings({}, environ={"IMGBUILD_SMOKE_IMPORT_TIMEOUT": "300"}).smoke_import_timeout == 300


def test_the_import_check_still_imports_on_its_own(tmp_path):
    """The payload depends on nothing but the stdlib: copied anywhere as a folder, its import helpers import bare."""
    import shutil

    shutil.copytree(SMOKE_PACKAGE, tmp_path / "copied", ignore=shutil.ignore_patterns("__pycache__"))
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import copied.importing as m; print(m.import_workers() >= 1)"
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stderr


def test_the_import_failure_line_counts_failures_and_timeouts_apart(monkeypatch):
    """One line: how many do not import, how many timed out, each said once."""
    work = [("broken", "1", ["broken"]), ("slow", "1", ["slow"])]
    results = [{"broken": "ImportError: no"}, {"slow": f"{smoke_importing.TIMED_OUT} after 240 s"}]
    monkeypatch.setattr(smoke_imports, "read_baseline", lambda path: set())
    monkeypatch.setattr(smoke_imports, "_distributions", lambda: [])
    monkeypatch.setattr(smoke_imports, "_added", lambda baseline, every=None: [])
    monkeypatch.setenv("IMGBUILD_SMOKE_IMPORTS", "x")
    monkeypatch.setattr(smoke_imports, "import_all", lambda w, budget, workers: results[: len(w)])
    monkeypatch.setattr(smoke_imports, "framework_seconds", lambda limit, module="": 0.1)
    monkeypatch.setattr(smoke_imports, "missing_tools", lambda names: [])
    monkeypatch.setattr(smoke_imports, "shared_modules", lambda dists, added: [])
    failures, _, _, _ = smoke_imports._classify(work, results)
    line = "; ".join(failures)
    assert "broken 1: import broken: ImportError: no" in line and "timed out after 240 s, twice" in line
    with pytest.raises(smoke_report.Fail) as caught:
        smoke_imports.check_imports()
    assert str(caught.value).startswith("1 of 1 module(s) do not import: smoke.imports")  # no stray "; "


# --- the import server: the base's framework imported once, each distribution in a forked child ----


@pytest.fixture
def served(tmp_path, monkeypatch):
    """Modules that misbehave at import, on the import path of the server and its children."""
    (tmp_path / "patcher.py").write_text("import json\njson.dumps = None\n")  # monkeypatches another module
    (tmp_path / "uses_json.py").write_text("import json\nassert json.dumps is not None\n")
    (tmp_path / "exits.py").write_text("import os\nos._exit(3)\n")
    (tmp_path / "crashes.py").write_text("import ctypes\nctypes.string_at(0)\n")  # a segfault
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(1000)\n")
    pidfile = tmp_path / "daemon.pid"
    (tmp_path / "forks.py").write_text(
        "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(1000)\n    os._exit(0)\n"
        f"open({str(pidfile)!r}, 'w').write(str(pid))\n"
    )
    (tmp_path / "fine.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def _work(*names: str) -> list:
    return [(name, "1.0", [name]) for name in names]


def test_the_import_server_keeps_each_distribution_alone(served):
    """A monkeypatch, an os._exit, a segfault: each touches only its own child; the others import as alone."""
    results = smoke_importing.import_served(_work("patcher", "uses_json", "exits", "crashes", "fine"), 60, 2, "none")
    assert results is not None, "the import server refused on this machine"
    by_name = dict(zip(["patcher", "uses_json", "exits", "crashes", "fine"], results, strict=True))
    assert by_name["patcher"] == {} and by_name["uses_json"] == {} and by_name["fine"] == {}
    assert by_name["exits"] == {"exits": "the interpreter died importing it (exit 3)"}
    assert by_name["crashes"] == {"crashes": "the interpreter died importing it (signal 11)"}


def test_a_hanging_or_forking_import_is_bounded_and_leaves_no_process(served):
    started = time.monotonic()
    results = smoke_importing.import_served(_work("hangs", "forks", "fine"), 2, 2, "none")
    assert results is not None
    hangs, forks, fine = results
    assert hangs["hangs"].startswith(smoke_importing.TIMED_OUT) and forks == {} and fine == {}
    assert time.monotonic() - started < 30  # 2 s, then once more alone with 4 s
    daemon = int((served / "daemon.pid").read_text())
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{daemon}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{daemon}"), "the module's own child outlived the check"


def test_the_check_falls_back_where_the_server_cannot_serve(served, monkeypatch):
    """No fork, or threads after the preload: one interpreter per distribution, as before."""
    monkeypatch.setattr(smoke_importing, "_IMPORT_SERVER", "import json\nprint(json.dumps({'refused': 'threads'}))\n")
    assert smoke_importing.import_served(_work("fine"), 60, 1, "none") is None


class _Path(str):
    """A distribution's file as importlib.metadata lists it: its path, and its RECORD hash."""

    def __new__(cls, path, digest):
        from types import SimpleNamespace

        made = super().__new__(cls, path)
        made.hash = SimpleNamespace(value=digest)
        return made


@pytest.mark.parametrize(
    "first, second, flagged",
    [
        # opencv-python and -headless: the same cv2/__init__.py, different extension modules
        (
            {"cv2/__init__.py": "i", "cv2/cv2.abi3.so": "gui"},
            {"cv2/__init__.py": "i", "cv2/cv2.abi3.so": "headless"},
            True,
        ),
        ({"cv2/__init__.py": "a"}, {"cv2/__init__.py": "b"}, True),
        ({"top.cpython-311-x86_64-linux-gnu.so": "a"}, {"top.cpython-311-x86_64-linux-gnu.so": "b"}, True),
        ({"ns/__init__.py": "same"}, {"ns/__init__.py": "same"}, False),  # namespace boilerplate, byte for byte
        ({"a/__init__.py": "x"}, {"b/__init__.py": "y"}, False),
        ({"a.libs/libz.so": "x"}, {"a.libs/libz.so": "y"}, False),  # vendored libraries: auditwheel's folder
        ({"pkg/sub/deep.py": "x"}, {"pkg/sub/deep.py": "y"}, False),  # not a top-level module's own file
    ],
)
def test_two_distributions_installing_one_module_with_other_contents_fail(first, second, flagged):
    def files(table):
        return [_Path(path, digest) for path, digest in table.items()]

    dists = [("opencv-python", "4.10", files(first)), ("opencv-python-headless", "4.10", files(second))]
    found = smoke_dists.shared_modules(dists, {"opencv-python-headless"})
    assert bool(found) is flagged, found
    if flagged:
        assert "opencv-python 4.10 and opencv-python-headless 4.10" in found[0] and "keep one of them" in found[0]


XFORMERS = (
    "WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for:\n"
    "    PyTorch 2.5.1+cu121 with CUDA 1201 (you have 2.13.0a0+07cecf4)"
)


@pytest.fixture
def extensions(tmp_path, monkeypatch):
    """Packages that import but say their compiled extension did not load, and one that only warns of a deprecation."""
    (tmp_path / "xformersish.py").write_text(f"import sys\nprint({XFORMERS!r}, file=sys.stderr)\n")
    (tmp_path / "visionish.py").write_text(
        "import warnings\nwarnings.warn(\"Failed to load image Python extension: 'libc10_cuda.so: cannot open "
        "shared object file'\")\n"
    )
    (tmp_path / "chatty.py").write_text("import warnings\nwarnings.warn('old_name is deprecated', FutureWarning)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("way", ["server", "one interpreter each"])
def test_an_import_whose_compiled_extension_did_not_load_fails_and_a_deprecation_does_not(extensions, way):
    """xformers built for another torch imports with a warning and its features are gone: it was promoted when the
    recipe had no check of its own. Now it fails, by the import server and by the fallback alike."""
    work = _work("xformersish", "visionish", "chatty")
    if way == "server":
        results = smoke_importing.import_served(work, 60, 2, "none")
        assert results is not None
    else:
        results = smoke_importing.import_all(work, 60, 2)
    xformersish, visionish, chatty = results
    assert xformersish["xformersish"].startswith("ExtensionNotLoaded: WARNING[XFORMERS]: xFormers can't load C++")
    assert xformersish["xformersish"].endswith(
        "was built for: PyTorch 2.5.1+cu121 with CUDA 1201 (you have 2.13.0a0+07cecf4)"
    )
    assert "Failed to load image Python extension" in visionish["visionish"]
    assert chatty == {}
    failures, *_ = smoke_imports._classify(work, results)
    assert failures[0].startswith(
        "xformersish 1.0: import xformersish: it imports, but its compiled extension did not load (WARNING[XFORMERS]"
    )
    assert "no recipe field changes a binary wheel: drop xformersish" in failures[0]  # not the field that loops
    assert failures[0].endswith(
        "the lines `--no-binary xformersish` and `xformersish`, and pip.no_build_isolation: [xformersish] (it "
        "compiles: a base with a C++ compiler and, for CUDA code, nvcc)"
    )


@pytest.mark.parametrize(
    "owner, said",
    [
        (
            ("hub", "1.0.0"),  # added too: the pair drifted
            "it needs cached_download from hub 1.0.0, which hub 1.0.0 does not have (the two drifted apart): pin hub "
            "to the release diffusersish was made for (hub<1.0.0), or diffusersish to one made for hub 1.0.0",
        ),
        (
            ("basehub", "0.9"),  # the base's
            "it needs cached_download from the base's basehub 0.9, which does not have it: pin diffusersish to a "
            "release made for the base's basehub",
        ),
    ],
)
def test_a_name_one_added_package_imports_from_another_that_lacks_it_names_both_and_the_pin(owner, said):
    """A dependency drift: diffusers 0.25 imports cached_download from huggingface_hub, which hub 0.26 dropped."""
    work = [("diffusersish", "0.25.0", ["diffusersish"]), ("hub", "1.0.0", ["huggingface_hubish"])]
    error = (
        "ImportError: cannot import name 'cached_download' from 'huggingface_hubish' (/site/huggingface_hubish/x.py)"
    )
    results = [{"diffusersish": error}, {}]
    failures, *_ = smoke_imports._classify(work, results, {"huggingface_hubish": owner})
    assert failures == [f"diffusersish 0.25.0: import diffusersish: {error}: {said}"]


def test_a_dependency_whose_extension_did_not_load_is_cured_by_dropping_what_requires_it():
    """vLLM 0.2.5 brought xformers, which the recipe never named: "drop xformers" could not be done; the line names
    the package that requires it."""
    from imgbuild.payload.smoke.hints import EXTENSION_ERROR

    work = [("xformers", "0.0.35", ["xformers"])]
    results = [{"xformers": EXTENSION_ERROR + "xFormers can't load C++/CUDA extensions"}]
    failures, *_ = smoke_imports._classify(work, results, needs={"vllm": {"xformers", "torch"}, "xformers": set()})
    assert "no recipe field changes a binary wheel: drop vllm, which requires it, or build it" in failures[0]
    alone, *_ = smoke_imports._classify(work, results, needs={"xformers": {"torch"}})
    assert "drop xformers (what uses it optionally runs without it)" in alone[0]
