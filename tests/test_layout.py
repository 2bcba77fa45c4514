"""The house by domain. The packages a newcomer reads like a map, and the rules that keep it one:
no import runs back up the levels, no module imports itself round a cycle, no module passes 500 lines, and the
fake engine knows nothing of the pipeline.

Every import counts: at the top of a module and inside a function alike (a late import is a dependency all the
same); only those under `if TYPE_CHECKING:` (annotations) do not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "imgbuild"

#: The levels, bottom up: a unit may import its own level's shared facts (level 0) and anything lower; at any
#: other level, only its own unit and lower levels. A unit is a package (a folder) or a top-level module.
LEVELS: list[set[str]] = [
    {
        "errors",
        "facts",
        "limits",
        "ngc",
        "imageref",
        "fields",
        "text",
        "escape",
        "ui",
        "annotation",
        "yamlpos",
        "payload",
        "boundedjson",
        "credentials",
        "shellwords",
        "platforms",
        "registry_identity",
        "reserved",
    },
    {"hostio"},  # what acts on the host: identity, files, the process's own start
    {"gpu"},  # GPUs without Docker
    {"config", "recipe", "engine", "registry"},  # settings, stage 1, stage 4, HTTP
    {"supply"},  # attestations and their verification
    {"pipeline"},  # stages 2, 3, 5 and the build that runs them
    {"ci", "servers"},  # CI over many recipes; the shared GPU server
    {"clusters"},  # Slurm, Apptainer, Kubernetes, dev containers
    {"cli"},
    {"__main__"},
]
LEVEL = {unit: i for i, units in enumerate(LEVELS) for unit in units}
#: No module passes MAX_LINES: the in-image smoke test is a package by check.
MAX_LINES = 500
LONG_ALLOWED: set[str] = set()


def _modules() -> dict[str, Path]:
    """imgbuild's modules by name; the templates folder holds files for images, not modules."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[1] == "templates":
            continue
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path] | None = None) -> set[str]:
    """The modules `path` imports (`from PKG import MOD` counts as MOD), anywhere but under `if TYPE_CHECKING:`;
    with `modules`, only those of imgbuild. An import by string counts as well: in program text a string holds (a
    child interpreter's `-c` code), and a string that names one of imgbuild's modules whole (`import_module`'s)."""
    return _imported(ast.parse(path.read_text()), modules)


def _imported(tree: ast.AST, modules: dict[str, Path] | None) -> set[str]:
    typing_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for node in ast.walk(branch)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                names.add(sub if modules is not None and sub in modules else node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "imgbuild" in node.value:
            names |= _imported_by_string(node.value, modules)
    return {n for n in names if modules is None or n in modules}


def _imported_by_string(text: str, modules: dict[str, Path] | None) -> set[str]:
    """The modules a string imports: as program text it holds, or as a module's whole name."""
    if modules is not None and text in modules:
        return {text}
    if "import" not in text:
        return set()
    try:
        program = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    return _imported(program, modules)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name, "imgbuild"} for name, path in modules.items()}


def _unit(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_every_unit_has_a_level():
    units = {_unit(m) for m in _modules() if m != "imgbuild"}
    assert units <= set(LEVEL), f"a new package or top-level module needs a place in LEVELS: {units - set(LEVEL)}"


def test_no_import_runs_back_up_the_levels():
    wrong = []
    for module, imported in _graph().items():
        if module == "imgbuild":
            continue
        mine = _unit(module)
        for other in imported:
            theirs = _unit(other)
            if theirs == mine or LEVEL[theirs] == 0 or LEVEL[theirs] < LEVEL[mine]:
                continue
            wrong.append(f"{module} (level {LEVEL[mine]}) imports {other} (level {LEVEL[theirs]})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_imports_itself_round_a_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle.extend([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
                return True
            if nxt not in state and visit(nxt, [*path, nxt]):
                return True
        state[node] = 2
        return False

    for start in sorted(graph):
        if start not in state and visit(start, [start]):
            break
    assert not cycle, " -> ".join(cycle)


def test_no_module_passes_500_lines():
    long = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
        if len(path.read_text().splitlines()) > MAX_LINES
    }
    assert set(long) <= LONG_ALLOWED, {k: v for k, v in long.items() if k not in LONG_ALLOWED}


def test_the_map_in_the_development_guide_names_each_levels_units():
    """docs/development.md's table of levels is the map a newcomer reads first: it names exactly the units of each
    level here (it listed 15 of level 0's 21)."""
    import re

    text = (PACKAGE.parent / "docs" / "development.md").read_text(encoding="utf-8")
    mapped = {
        int(m["level"]): {name.rstrip("/") for name in re.findall(r"`([a-z_]+/?)`", m["units"])}
        for m in re.finditer(r"^\| (?P<level>[0-9]+) \| (?P<units>[^|]+) \|", text, re.MULTILINE)
    }
    assert mapped == {n: units for n, units in enumerate(LEVELS) if units != {"__main__"}}


#: What pure code never does: start or signal a process, change or look up who it runs as, or change the file
#: system's structure. Level 0 holds types and rules; what does any of this lives in hostio/ and above.
HOST_ACTIONS = re.compile(
    r"\b(?:subprocess|pwd|grp|socket|tempfile|shutil|fcntl|ctypes|signal)\b"
    r"|\bos\.(?!environ\b|path\.(?:join|basename|dirname|splitext)\b|fspath\b|sep\b|PathLike\b)[a-z_]+"
)


@pytest.mark.parametrize("unit", sorted(LEVELS[0] - {"payload"}))
def test_level_0_is_pure_types_and_rules(unit):
    path = PACKAGE / f"{unit}.py"
    if not path.is_file():
        path = PACKAGE / unit / "__init__.py"
    code = "\n".join(line.split("#", 1)[0] for line in path.read_text(encoding="utf-8").splitlines())
    code = re.sub(r'"""[\s\S]*?"""', "", code)  # docstrings say what others do
    assert not HOST_ACTIONS.findall(code), f"{unit} acts on the host: move it to hostio/ or lower what it does"


def test_the_fake_engine_imports_nothing_from_the_pipeline():
    imported = _imports(PACKAGE / "engine" / "fake.py", _modules())
    assert {_unit(m) for m in imported} <= {"engine", *LEVELS[0], *LEVELS[1]}, imported


#: The payload's modules that run on the host: where the payload is (its __init__) and the probes' declarations.
PAYLOAD_HOST_SIDE = {"__init__.py", "probes.py"}
#: What the smoke test's modules may import besides the stdlib and their siblings: the frameworks it checks.
FRAMEWORK_MODULES = {"torch", "tensorflow", "numpy"}


@pytest.mark.parametrize(
    "script",
    sorted(f"payload/{p.name}" for p in (PACKAGE / "payload").glob("*.py") if p.name not in PAYLOAD_HOST_SIDE)
    + sorted(f"payload/smoke/{p.name}" for p in (PACKAGE / "payload" / "smoke").glob("*.py")),
)
def test_what_runs_inside_images_imports_only_the_stdlib(script):
    """The in-image scripts are copied into images alone: an import of imgbuild, or of anything but the standard
    library (and the framework the smoke test checks; and the guard's own owners.py, beside it), would fail
    there. The smoke test's modules import each other only relatively, so the folder runs under any name."""
    import sys

    imported = {name.split(".")[0] for name in _imports(PACKAGE / script)}
    if script.startswith("payload/smoke/"):
        imported -= FRAMEWORK_MODULES
        tree = ast.parse((PACKAGE / script).read_text())
        siblings = {p.stem for p in (PACKAGE / "payload" / "smoke").glob("*.py")}
        relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
        named = {n.module or a.name for n in relative for a in n.names}
        assert all(n.level == 1 for n in relative) and named <= siblings, named - siblings
    beside = {
        "payload/pip_guard.py": {
            *("owners", "pip_versions", "pip_index", "pip_pages", "pip_words", "pip_bounds", "pip_alike"),
            "pip_cures",
        },
        "payload/pip_pages.py": {"pip_versions", "pip_index", "pip_words"},
        "payload/pip_alike.py": {"pip_versions", "pip_index", "pip_words", "pip_bounds"},
        "payload/pip_cures.py": {"pip_versions", "pip_index", "pip_bounds"},
        "payload/pip_owners.py": {"pip_versions"},
        "payload/pip_index.py": {"pip_versions"},
        "payload/lock_resolve.py": {"pip_versions", "pip_words"},  # the pip step's own, written beside install.sh
    }
    allowed = set(sys.stdlib_module_names) | beside.get(script, set())
    assert imported <= allowed, imported - allowed


def test_every_probe_runs_a_script_from_the_payload_folder():
    """What runs inside images has one home: no Probe is made from program text written in a module (a string or
    an f-string literal); each reads its script from imgbuild/payload/ (or answers a fake with no script)."""
    import ast

    inline = []
    for path in PACKAGE.rglob("*.py"):
        if "payload" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Probe":
                script = node.args[1] if len(node.args) > 1 else None
                literal = isinstance(script, ast.JoinedStr) or (
                    isinstance(script, ast.Constant) and isinstance(script.value, str) and script.value
                )
                if literal:
                    inline.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert inline == [], inline


#: The patterns of GitHub's standard Python `.gitignore` (github/gitignore `Python.gitignore` at dcc0fc7, May 2026)
#: that a project commonly copies whole: a tracked file one of them ignores would be skipped by `git add -A` in
#: such a checkout, by pytest's collection and by code-map tools (a package called `build/` was one).
PYTHON_GITIGNORE = [
    "__pycache__/",
    "*.py[codz]",
    "*$py.class",
    "*.so",
    ".Python",
    "build/",
    "develop-eggs/",
    "dist/",
    "downloads/",
    "eggs/",
    ".eggs/",
    "lib/",
    "lib64/",
    "parts/",
    "sdist/",
    "var/",
    "wheels/",
    "share/python-wheels/",
    "*.egg-info/",
    ".installed.cfg",
    "*.egg",
    "MANIFEST",
    "*.manifest",
    "*.spec",
    "pip-log.txt",
    "pip-delete-this-directory.txt",
    "htmlcov/",
    ".tox/",
    ".nox/",
    ".coverage",
    ".coverage.*",
    ".cache",
    "nosetests.xml",
    "coverage.xml",
    "*.cover",
    "*.py.cover",
    "*.lcov",
    ".hypothesis/",
    ".pytest_cache/",
    "cover/",
    "*.mo",
    "*.pot",
    "*.log",
    "local_settings.py",
    "db.sqlite3",
    "db.sqlite3-journal",
    "instance/",
    ".webassets-cache",
    ".scrapy",
    "docs/_build/",
    ".pybuilder/",
    "target/",
    ".ipynb_checkpoints",
    "profile_default/",
    "ipython_config.py",
    ".pdm-python",
    ".pdm-build/",
    "__pypackages__/",
    "celerybeat-schedule*",
    "celerybeat.pid",
    "*.rdb",
    "*.aof",
    "*.pid",
    "mnesia/",
    "rabbitmq/",
    "rabbitmq-data/",
    "activemq-data/",
    "*.sage.py",
    ".env",
    ".envrc",
    ".venv",
    "env/",
    "venv/",
    "ENV/",
    "env.bak/",
    "venv.bak/",
    ".spyderproject",
    ".spyproject",
    ".ropeproject",
    "/site",
    ".mypy_cache/",
    ".dmypy.json",
    "dmypy.json",
    ".pyre/",
    ".pytype/",
    "cython_debug/",
    ".abstra/",
    "tempCodeRunnerFile.py",
    ".ruff_cache/",
    ".pypirc",
]


def test_no_tracked_file_is_one_that_the_standard_python_gitignore_ignores(tmp_path):
    import shutil
    import subprocess

    git = shutil.which("git")
    assert git, "git is needed to list the tracked files"
    root = PACKAGE.parent
    tracked = subprocess.run([git, "-C", str(root), "ls-files", "-z"], capture_output=True, check=True).stdout
    assert tracked, "not a git checkout: the tests run from a clone"
    excludes = tmp_path / "python.gitignore"
    excludes.write_text("\n".join(PYTHON_GITIGNORE) + "\n")
    ignored = subprocess.run(
        [git, "-C", str(root), "-c", f"core.excludesFile={excludes}", "check-ignore", "--no-index", "-z", "--stdin"],
        input=tracked,
        capture_output=True,
    )
    assert ignored.returncode in (0, 1), ignored.stderr  # 1: nothing ignored
    assert ignored.stdout.split(b"\0") == [b""], ignored.stdout.decode().replace("\0", "\n")


def test_the_gitignore_check_sees_a_file_in_a_build_folder(tmp_path):
    """The check above can fail: the same patterns ignore a package file under a `build/` folder."""
    import subprocess

    repo = tmp_path / "repo"
    (repo / "pkg" / "build").mkdir(parents=True)
    (repo / "pkg" / "build" / "plan.py").write_text("")
    (repo / ".gitignore").write_text("\n".join(PYTHON_GITIGNORE) + "\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    found = subprocess.run(["git", "-C", str(repo), "check-ignore", "pkg/build/plan.py"], capture_output=True)
    assert found.returncode == 0 and found.stdout.strip() == b"pkg/build/plan.py"


def test_no_test_module_imports_another():
    """Helpers several test modules share live in tests/support.py (fixtures in conftest.py): a test module that
    imports another runs that module's import-time work and ties two files' fates together."""
    found = {
        path.name: sorted(n for n in _imports(path) if n.startswith("tests.test_"))
        for path in sorted((PACKAGE.parent / "tests").glob("test_*.py"))
    }
    assert not {name: mods for name, mods in found.items() if mods}


def test_an_import_by_string_is_an_import_of_its_level(tmp_path):
    """Code a module hands another interpreter as text, and a module it names for `import_module`, are imports all
    the same: the levels hold for them (the queue's child once imported the command line this way)."""
    module = tmp_path / "child.py"
    module.write_text(
        'CHILD = "import sys;from imgbuild.cli import main;main()"\n'
        'HOME = "imgbuild.pipeline.build"\n'
        'SAID = "imgbuild: nothing to import here"\n'
    )
    assert _imports(module, _modules()) == {"imgbuild.cli", "imgbuild.pipeline.build"}


def test_every_import_a_test_makes_at_any_depth_names_something_that_exists():
    """An import inside an engine test's body runs only on the bed, in CI's last tier: a name moved or renamed in
    imgbuild (or tests' helpers) is found here, in the unit tier, by resolving every `from X import Y` the suite
    writes, at any depth."""
    import importlib

    missing = []
    root = PACKAGE.parent
    for path in sorted((root / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] not in ("imgbuild", "tests"):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if alias.name == "*" or hasattr(module, alias.name):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    missing.append(f"{path.relative_to(root)}:{node.lineno}: {node.module}.{alias.name}")
    assert missing == []
