"""Messages that name the right cause: who holds the version a package cannot have (the
base, the recipe's lock or its constraints), and one cure that fits. Real pip under imgbuild's install.sh
and guard; the plan-time checks with the recipe's FILE:LINE.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from imgbuild.payload.pip_versions import canon
from tests.pipstep import INSTALLERS, PipStep, wheel

ORIGIN = "a freeze of the base's packages"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wheels")
    for version in ("0.36.0", "1.0.0", "2.4.0"):
        wheel(folder, "hub-lib", version, {f"hub_lib_{version.replace('.', '_')}/__init__.py": b""})
    for version in ("1.26.4", "2.1.0"):
        wheel(folder, "numlib", version, {"numlib/__init__.py": version.encode()})
    wheel(folder, "app", "1.0", {"app/__init__.py": b""}, ("numlib>=2",))
    wheel(folder, "oldapp", "0.9", {"oldapp/__init__.py": b""}, ("numlib<2",))
    wheel(folder, "tools", "3.0", {"tools/__init__.py": b""}, ("hub-lib<1",))
    return folder


@pytest.fixture(params=INSTALLERS)
def step(tmp_path, pip_bases, wheels, request):
    return PipStep(pip_bases, tmp_path, wheels, ["numlib==2.1.0"], installer=request.param)


def test_each_pip_step_installs_into_an_environment_of_its_own(tmp_path, pip_bases, wheels):
    """Steps over the same base share how it was made, never what a step installs: each copy's pip and python
    are its own, and what one step installs is absent from the next."""
    one = PipStep(pip_bases, tmp_path / "one", wheels, ["numlib==2.1.0"], installer="pip")
    done = one.run(["app"])
    assert done.returncode == 0, done.stdout + done.stderr
    two = PipStep(pip_bases, tmp_path / "two", wheels, ["numlib==2.1.0"], installer="pip")
    assert (two.venv / "bin" / "pip").read_text().startswith(f"#!{two.venv / 'bin' / 'python'}")
    where = two.pip("--version").stdout
    assert str(two.venv / "lib") in where, where
    listed = two.pip("list", "--format=freeze").stdout
    assert "numlib==2.1.0" in listed and "app==" not in listed, listed
    assert "app==1.0" in one.pip("list", "--format=freeze").stdout


def test_a_recipe_constraint_against_its_own_lock_names_the_lock_not_the_base(step):
    """The issue's case: `huggingface-hub<1` in the recipe, `==2.4.0` in its lock: pip folds both into one
    "(constraint)" line, which had been called the base's."""
    said = step.failure(step.run(["hub-lib"], constraints="hub-lib<1\n", resolved="hub-lib==2.4.0\n"))
    assert said == (
        "the recipe asks for hub-lib, but the recipe's pip.constraints hold hub-lib<1 and the recipe's lock holds "
        "hub-lib==2.4.0: the recipe changed since its lock was written: run imgbuild lock (it re-resolves hub-lib)"
    )
    assert "the base" not in said


def as_pip_says(said: str, package: str, version: str) -> str:
    """uv names the package that asked as "every version of it" where pip names the version it tried."""
    return said.replace(f"every version of {package} ", f"{package} {version} ", 1)


def test_a_dependency_against_the_lock_names_the_package_that_asked_and_the_lock(step):
    said = as_pip_says(step.failure(step.run(["tools"], resolved="hub-lib==2.4.0\n")), "tools", "3.0")
    assert said == (
        "tools 3.0 needs hub-lib<1, but the recipe's lock holds hub-lib==2.4.0: the recipe changed since its lock "
        "was written: run imgbuild lock (it re-resolves hub-lib)"
    )


def test_a_dependency_against_the_base_names_the_base_and_where_its_pins_came_from(step):
    said = as_pip_says(step.failure(step.run(["oldapp"])), "oldapp", "0.9")
    assert said == (
        f"oldapp 0.9 needs numlib<2, but the base holds numlib==2.1.0 (from {ORIGIN}): let pip move numlib: "
        "pip.unpin: [numlib], or drop oldapp (no release of oldapp resolves with the base as it is)"
    )


def test_a_narrow_terminal_leaves_each_installers_sentences_whole(step, monkeypatch):
    """A build environment whose COLUMNS is narrow (uv wraps its explanation to it) gives the same line: install.sh
    has the installer write one sentence a line."""
    monkeypatch.setenv("COLUMNS", "40")
    said = as_pip_says(step.failure(step.run(["oldapp"])), "oldapp", "0.9")
    assert said == (
        f"oldapp 0.9 needs numlib<2, but the base holds numlib==2.1.0 (from {ORIGIN}): let pip move numlib: "
        "pip.unpin: [numlib], or drop oldapp (no release of oldapp resolves with the base as it is)"
    )


def test_of_two_holders_only_the_one_that_excludes_what_was_asked_is_named(step):
    """The base's numlib==2.1.0 meets app's numlib>=2; the recipe's numlib<2 does not: it alone is the cause."""
    said = step.failure(step.run(["app"], constraints="numlib<2\n"))
    assert said.endswith(  # (uv folds the base's pin into app's range first: "every version of app needs numlib==2.1.0")
        "needs numlib>=2, but the recipe's pip.constraints hold numlib<2: loosen the recipe's constraint on numlib, or "
        "drop app"
        if step.installer == "pip"
        else ", but the recipe's pip.constraints hold numlib<2: loosen the recipe's constraint on numlib, or drop app"
    )


def test_a_dependency_against_a_recipe_constraint_says_loosen_it(step):
    step.pip("uninstall", "-y", "-q", "numlib", check=True)  # a base without numlib: only the recipe holds it
    said = as_pip_says(step.failure(step.run(["app"], constraints="numlib<2\n")), "app", "1.0")
    assert said == (
        "app 1.0 needs numlib>=2, but the recipe's pip.constraints hold numlib<2: loosen the recipe's constraint "
        "on numlib, or drop app"
    )


def test_backtracking_through_a_package_pinned_on_purpose_does_not_say_pin_it():
    """pip went through releases of numpy, which the recipe's lock pins: "pin numpy" is not the cure."""
    from tests.support import guard_module

    guard = guard_module()
    watch = guard.Watch({"numpy": [("numpy==1.26.4", "the recipe's lock")]})
    for n in range(5):
        watch.see(f"Downloading numpy-1.26.{n}-cp311-cp311-manylinux_2_17_x86_64.whl (18.2 MB)")
    note = watch.backtrack_note(ORIGIN)
    assert "pin numpy" not in note
    assert note == (
        "; pip backtracked through 5 versions of numpy, which the recipe's lock holds numpy==1.26.4: something the "
        "recipe asks for needs another numpy; see the conflict above"
    )
    free = guard.Watch({})
    for n in range(5):
        free.see(f"Downloading vllm-0.1{n}.0-cp38-abi3-manylinux1_x86_64.whl (300 MB)")
    assert "pin vllm to a version made for the base" in free.backtrack_note(ORIGIN)
    # a pin in the recipe's own requirements file is on purpose too
    asked = guard.Watch({}, {"numpy": ["==1.26.4"]})
    for n in range(5):
        asked.see(f"Downloading numpy-1.26.{n}-cp311-cp311-manylinux_2_17_x86_64.whl (18.2 MB)")
    assert asked.backtrack_note(ORIGIN) == (
        "; pip backtracked through 5 versions of numpy, which the recipe pins: something else the recipe asks for "
        "needs another numpy; see the conflict above"
    )


@pytest.mark.parametrize("installer", INSTALLERS)
def test_the_bases_framework_is_never_offered_to_pip_unpin(tmp_path, pip_bases, wheels, installer):
    """A base pin may be let go (pip.unpin), but not the framework's (framework.txt, as render writes it)."""
    step = PipStep(pip_bases, tmp_path, wheels, ["numlib==2.1.0"], frameworks=("numlib",), installer=installer)
    said = step.failure(step.run(["oldapp"]))
    assert "pip.unpin" not in said, said
    assert said.endswith(
        "drop oldapp: no release of oldapp resolves with the base's numlib==2.1.0; what would be "
        "needed is a base whose packages admit one"
    ), said


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("numpy==1.26.4\n", {"numpy": [("numpy==1.26.4", "the recipe's lock")]}),
        (
            "# a comment\n\n--index-url http://x\nhub-lib<1,>=0.30  # why\n",
            {"hub-lib": [("hub-lib<1,>=0.30", "the recipe's lock")]},
        ),
        ("Bad Name==1\nx" * 3, {}),
        ("torch<0\n", {}),  # imgbuild's refusal of another framework name: not a pin
        ("a" * 200_000 + "==1\n", {}),  # a name past what the pattern admits is no pin
    ],
)
def test_pin_files_are_read_as_data(tmp_path, text, expected):
    """Hostile pin files: options, comments, junk, the framework refusal and a 200 KB name are not pins."""
    from tests.support import guard_module

    (tmp_path / "resolved.txt").write_text(text)
    (tmp_path / "base.txt").write_text("")
    got = guard_module().pin_sources(["-c", str(tmp_path / "base.txt"), "-c", str(tmp_path / "resolved.txt")], ORIGIN)
    assert got == expected


# --- plan time: the recipe against its own lock, at the recipe's line -------------------------------------


def _plan_lines(tmp_path, pip: str, lock: str) -> list[str]:
    from imgbuild.errors import RecipeError
    from imgbuild.pipeline.plan import make_plan
    from imgbuild.recipe import load_recipe
    from tests.support import fake_inspect, settings

    (tmp_path / ".git").mkdir(exist_ok=True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f'name: r\nbase: {{framework: pytorch, tag: "24.05"}}\npip:\n{pip}')
    (tmp_path / "r.lock.txt").write_text(lock)
    try:
        make_plan(load_recipe(recipe), settings(), fake_inspect)
    except RecipeError as exc:
        return [line.replace(f"{tmp_path}/", "") for line in exc.lines()]
    return []


def test_a_recipe_line_its_lock_excludes_is_named_at_both_lines_before_building(tmp_path):
    lines = _plan_lines(
        tmp_path,
        '  packages: [einops, "huggingface-hub<1"]\n  constraints: ["numpy>=2"]\n',
        "einops==0.8.0\nhuggingface-hub==2.4.0\nnumpy==1.26.4\n",
    )
    assert lines == [
        "r.yaml:4:22: pip.packages[1]: huggingface-hub<1 excludes huggingface-hub==2.4.0, which the recipe's lock "
        "holds (r.lock.txt:2) (the recipe changed since its lock was written: run imgbuild lock r.yaml (it "
        "re-resolves huggingface-hub))",
        "r.yaml:5:17: pip.constraints[0]: numpy>=2 excludes numpy==1.26.4, which the recipe's lock holds "
        "(r.lock.txt:3) (the recipe changed since its lock was written: run imgbuild lock r.yaml (it re-resolves "
        "numpy))",
    ]


def test_what_the_lock_admits_or_a_marker_guards_is_no_conflict(tmp_path):
    pip = "  packages: [einops>=0.8, \"numpy<2; python_version < '3.0'\"]\n"
    assert _plan_lines(tmp_path, pip, "einops==0.8.0\nnumpy==1.26.4\n") == []


def test_lock_re_resolves_what_the_recipe_now_excludes_and_keeps_the_rest(tmp_path):
    from imgbuild.pipeline.pins import _outgrown
    from imgbuild.recipe import load_recipe

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\npip: [einops, "huggingface-hub<1"]\n')
    (tmp_path / "r.lock.txt").write_text("einops==0.8.0\nhuggingface-hub==2.4.0\n")
    assert _outgrown(load_recipe(recipe)) == ["huggingface-hub"]


@pytest.mark.parametrize(
    ("version", "wanted", "meets"),
    [
        ((2, 1), ">=2", True),
        ((2, 1), "<2", False),
        ((2, 1), ">=2,<3", True),
        ((1, 26, 4), ">=1.26,!=1.26.4", False),
        ((2, 1), "==2.1.0", True),
        ((2, 1), "==2.*", None),  # wildcards, pre-releases, local parts, ~=: not judged, so never wrongly cleared
        ((2, 1), ">=2.1rc1", None),
        ((2, 1), "~=2.0", None),
        ((2, 1), ">=２", None),  # fullwidth digits are not digits here
        ((2, 1), "", None),
    ],
)
def test_the_guards_small_version_reading_says_unknown_when_unsure(version, wanted, meets):
    from tests.support import guard_module

    assert guard_module().meets(version, wanted) is meets


def test_a_file_that_is_not_the_locked_one_is_named_a_hash_mismatch_not_a_pip_failure(step):
    """A hashed lock's layer installs each pin with its hashes: another file at the same version (a release the
    index replaced, an edited lock) fails the step, and says which cure fits."""
    said = step.failure(step.run([f"hub-lib==1.0.0 --hash=sha256:{'0' * 64}"]))
    assert said.startswith("a file the index served does not match the sha256 the recipe's lock holds for it")


@pytest.fixture(params=INSTALLERS)
def prerelease_step(tmp_path, pip_bases, request):
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "numlib", "2.1.0", {"numlib/__init__.py": b""})
    wheel(folder, "oldtf", "2.1.0.dev2", {"oldtf/__init__.py": b""})  # nothing final: the resolver falls back
    wheel(folder, "semconv", "0.66b2", {"semconv/__init__.py": b""})
    wheel(folder, "otel", "1.0", {"otel/__init__.py": b""}, ("semconv==0.66b2",))
    return PipStep(pip_bases, tmp_path, folder, ["numlib==2.1.0"], installer=request.param)


def test_a_pre_release_the_recipe_did_not_ask_for_fails_and_names_the_pin(prerelease_step):
    """uv and pip fall back to a dev release when no final release fits (tf-models-official 2.1.0.dev2 was promoted
    this way): the step fails, naming the package and the two cures."""
    said = prerelease_step.failure(prerelease_step.run(["oldtf"]))
    assert said == (
        "the resolver fell back to oldtf 2.1.0.dev2, a pre-release the recipe did not ask for: no final release of "
        "oldtf fits the base's pins and the recipe's other packages, so none is there to pin: ask for this one by its "
        "version (oldtf==2.1.0.dev2) if it is what you want; else drop oldtf, or use a base whose pins admit a final "
        "release of oldtf"
    )


@pytest.mark.parametrize("installer", INSTALLERS)
def test_a_pre_release_fallback_names_what_holds_the_newest_release_back(tmp_path, pip_bases, installer):
    """Every tf-models-official release pins another TensorFlow than the base's, so the resolver took a 2020 dev
    release: the line names the newest release and the base's pin it needs otherwise, by either installer."""
    from tests.fake_index import FakeIndex, Release

    index = FakeIndex(
        "127.0.0.1",
        {
            "numlib": [Release("1.26.4"), Release("2.1.0")],
            "oldtf": [Release("2.1.0.dev2"), Release("2.20.0", ["numlib==1.26.4"])],
        },
    )
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "numlib", "2.1.0", {"numlib/__init__.py": b""})
    try:
        step = PipStep(pip_bases, tmp_path, folder, ["numlib==2.1.0"], installer=installer)
        said = step.failure(step.run(["oldtf"], index=index.url))
    finally:
        index.close()
    held = "numlib==1.26.4, but the base holds numlib==2.1.0 (from a freeze of the base's packages)"
    if installer == "pip":  # pip takes no pre-release while a final release exists: it names the conflict itself
        assert said.startswith(f"oldtf 2.20.0 needs {held}: let pip move numlib: pip.unpin: [numlib], or drop oldtf"), (
            said
        )
        return
    assert said == (  # uv names the range it ruled out
        "the resolver fell back to oldtf 2.1.0.dev2, a pre-release the recipe did not ask for: no final release of "
        "oldtf fits the base's pins and the recipe's other packages, so none is there to pin; the newest, oldtf "
        f"2.20.0, is held back: oldtf >=2.20.0 needs {held}; pip.unpin: [numlib] lets the resolver take oldtf 2.20.0 "
        "(asked of it): ask for this one by its version (oldtf==2.1.0.dev2) if it is what you want; else drop oldtf, "
        "or use a base whose pins admit a final release of oldtf"
    )


@pytest.mark.parametrize("packages", [["oldtf==2.1.0.dev2"], ["otel"], ["oldtf>=2.1.0.dev2"]])
def test_a_pre_release_asked_for_by_version_or_by_a_dependency_installs(prerelease_step, packages):
    done = prerelease_step.run(packages)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(params=INSTALLERS)
def old_index(tmp_path, pip_bases, request):
    """An index (PEP 691 JSON with upload times) where the newest `serve` needs another numlib than the base's:
    the resolver quietly falls back to a release two years older (uv's vllm 0.2.5 beside 0.11)."""
    from tests.fake_index import FakeIndex, Release

    index = FakeIndex(
        "127.0.0.1",
        {
            "numlib": [
                Release("1.26.4", uploaded="2023-09-01T00:00:00Z"),
                Release("2.1.0", uploaded="2025-01-01T00:00:00Z"),
            ],
            "serve": [
                Release("0.2.5", ["numlib>=1"], uploaded="2023-12-13T10:00:00.123456Z"),
                Release("0.9.0", ["numlib==1.26.4"], uploaded="2025-06-01T00:00:00Z"),
                Release("0.11.2", ["numlib==1.26.4"], uploaded="2025-11-20T00:00:00Z"),
            ],
            "near": [
                Release("1.0", uploaded="2025-05-01T00:00:00Z"),
                Release("1.1", ["numlib<2"], uploaded="2025-09-01T00:00:00Z"),
            ],
            "undated": [Release("1.0"), Release("2.0", ["numlib<2"])],
        },
    )
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "numlib", "2.1.0", {"numlib/__init__.py": b""})
    yield PipStep(pip_bases, tmp_path, folder, ["numlib==2.1.0"], installer=request.param), index.url
    index.close()


def test_a_fallback_to_a_release_years_older_than_the_newest_fails_and_names_what_forced_it(old_index):
    step, url = old_index
    said = step.failure(step.run(["serve"], index=url))
    asked = "serve >=0.11.2" if step.installer == "uv" else "serve 0.11.2"  # uv names the range it ruled out
    assert said == (
        "the resolver fell back to serve 0.2.5 (2023-12), 1.9 years older than serve 0.11.2 (2025-11), the newest the "
        f"recipe admits, because {asked} needs numlib==1.26.4, but the base holds numlib==2.1.0 (from a freeze of "
        "the base's packages): if serve 0.2.5 is what you want, ask for it by its version (serve==0.2.5); else change "
        "what holds serve back (a base made for serve 0.11.2, or a pin)"
    )


@pytest.mark.parametrize(
    "packages",
    [
        ["serve==0.2.5"],  # the cure it names: asked for by version
        ["serve<0.3"],  # the recipe excludes the newer ones itself
        ["near"],  # an older release, but not by a year
        ["undated"],  # the index gives no dates: nothing can be said
        ["numlib"],  # the base's own
    ],
)
def test_an_old_release_the_recipe_asked_for_or_that_is_not_far_behind_installs(old_index, packages):
    step, url = old_index
    done = step.run(packages, index=url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "asking the resolver why not" not in done.stdout


LOGS = Path(__file__).parent / "data" / "installer-logs"  # real pip's and uv's output, recorded by record.sh there
#: the output modes each installer was recorded in: as install.sh runs it (no terminal, no colour), colour forced on
#: (FORCE_COLOR, CLICOLOR_FORCE), on a terminal (progress bars redrawn with carriage returns, CRLF ends), and -v
MODES = ("plain", "color", "tty", "verbose")


def recorded(installer: str, mode: str = "plain") -> list[tuple[str, list[str], int]]:
    """(command, its output lines as the installer printed them, exit status) of each command in the log. Each line
    is kept as the guard's pump reads it: split at "\\n" only, its escapes, carriage returns and line end kept."""
    blocks: list[tuple[str, list[str], int]] = []
    command, lines = "", []
    name = f"{installer}-output.txt" if mode == "plain" else f"{installer}-output.{mode}.txt"
    for raw in (LOGS / name).read_bytes().split(b"\n"):
        line = raw.decode(errors="replace")
        if line.startswith("$ "):
            command, lines = line[2:], []
        elif line.startswith("[exit ") and command:
            blocks.append((command, lines, int(line[6:-1])))
            command = ""
        elif command:
            lines.append(line + "\n")
    return blocks


#: what the guard must read from each recorded command, the same for both installers: what was installed (or would
#: be), or the failure's one line
INSTALLED = [
    {("python-dateutil", "2.8.2"), ("six", "1.16.0"), ("typing-extensions", "4.12.2")},  # a fresh install
    {("python-dateutil", "2.9.0.post0"), ("six", "1.17.0")},  # an upgrade
    {("typing-extensions", "4.11.0")},  # a downgrade
    {("six", "1.17.0")},  # a reinstall
    {("idna", "3.10"), ("six", "1.16.0")},  # a dry run
    {("typing-extensions", "4.13.0rc1")},  # a pre-release
    {("idna", "3.9")},  # a local wheel, from a folder named with a space and a non-ASCII letter
    set(),  # an uninstall
]
MISSING = (
    ": no such package or version on the index for this Python and platform (a typo in the recipe or its requirements "
    "file? the name as the index spells it); see above"
)
NVCC = (
    "building cudaext needs CUDA's compiler (nvcc), which the base lacks: use a base that carries the CUDA toolkit "
    "(CUDA 13.0's, as this base's CUDA): NGC's framework images have /usr/local/cuda/bin/nvcc; a runtime or CPU-only "
    "base does not"
)
#: the failure's one line for each command recorded after those, in order: one for both installers, or each one's
#: (the guard has only the installer's words here, not the pins files that name who holds what); None where
#: install.sh never runs that installer so (pip gets no --build-constraint)
FAILED: list[str | dict[str, str | None]] = [
    "python-dateutil 2.9.0.post0 needs six>=1.5, but the base holds six==1.4.1 (from the base's pins): pin "
    "python-dateutil to a version made for the base, or drop it",
    "einopz" + MISSING,
    "six==9.9" + MISSING,
    NVCC,
    {  # the recipe's constraint against what it asks for: pip names both sides, uv's sentence names no holder
        "pip": "the recipe asks for six==1.16.0, but the base holds six<1.5 (from the base's pins): pin six to a "
        "version made for the base, or drop it",
        "uv": "the recipe's packages conflict with each other or with the pins (from the base's pins); see the conflict "
        "above",
    },
    "python-dateutil 2.9.0.post0 needs six, another distribution of the base's framework: it would overwrite the "
    "base's own; see the conflict above (drop python-dateutil, or pin a release of it that needs no six)",
    {  # several releases refused for one reason: pip counts those it tried, uv names their range
        "pip": "5 versions of python-dateutil need six>=1.5 (or similar), but the base holds six==1.4.1 (from the "
        "base's pins): pin python-dateutil to a version made for the base, or drop it",
        "uv": "python-dateutil >=2.8.0,<=2.9.0.post0 needs six>=1.5, but the base holds six==1.4.1 (from the base's "
        "pins): pin python-dateutil to a version made for the base, or drop it",
    },
    {
        "pip": None,
        "uv": "building cudaext asks for setuptools in its isolated build environment, which would build it against "
        "another setuptools than the base's: add cudaext to pip.no_build_isolation, so that it builds against the "
        "base's own",
    },
    NVCC,  # a dependency's build
    "einopz" + MISSING,  # no index, a folder of links
    "network failure reaching the find-links page http://127.0.0.1:9/whl/links.html (a --find-links line of the "
    "requirements): the build could not read it (offline? a proxy? a network that reaches only the package index?), "
    "and what only that page serves cannot be installed without it",
    "TLS failure reaching the package index (a proxy's CA? set pip_ca_bundle)",
    {  # a plain-http page on a host other than loopback: pip ignores it unread, uv reads it (nothing listens there)
        "pip": "cudaext==1.0: pip read nothing from the plain-http index or find-links page at 192.0.2.2, a host it "
        "does not trust (uv reads it): use its https:// address, or add 192.0.2.2 to pip.trusted_hosts; see above",
        "uv": "network failure reaching the find-links page http://192.0.2.2:9/whl/links.html (a --find-links line of "
        "the requirements): the build could not read it (offline? a proxy? a network that reaches only the package "
        "index?), and what only that page serves cannot be installed without it",
    },
    "a file the index served does not match the sha256 the recipe's lock holds for it (the index changed a release, "
    "or the lock was edited); see above, and run imgbuild lock if the new file is right",
    "building needstorch imports the base's framework, which the isolated build environment lacks: add needstorch to "
    "pip.no_build_isolation, so that it builds against the base's own framework",
    "building noninja needs the ninja build program, which the base lacks: add ninja to pip.packages",
    "building nocompiler needs a C/C++ compiler, which the base lacks: add apt: [g++, python3-dev] to the recipe",
    "building noheaders needs Python's C headers (Python.h), which the base lacks: add apt: [python3-dev] to the "
    "recipe",
    # two of the recipe's packages need two versions of one dependency: neither is the base's
    "the recipe's packages conflict with each other or with the pins (from the base's pins); see the conflict above",
]


def watched(command: str, lines: list[str]):
    """The guard's reading of one command's output, fed as its pump feeds it: each line as printed. The find-links
    pages are the command's, as the guard reads them from it."""
    from tests.support import guard_module

    guard = guard_module()
    watch = guard.Watch(pages=guard.find_links_pages(command.split()))
    for line in lines:
        watch.see(line)
    return watch


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("installer", INSTALLERS)
def test_what_a_real_install_installed_is_read_from_each_installers_own_output(installer, mode):
    blocks = recorded(installer, mode)
    assert len(blocks) == len(INSTALLED) + len(FAILED)
    for (command, lines, code), expected in zip(blocks, INSTALLED, strict=False):
        assert code == 0, command
        got = {(name.lower(), version) for name, version in watched(command, lines).installed}
        assert got == expected, command
        assert got or "uninstall" in command, f"nothing read from a real install: {command}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("installer", INSTALLERS)
def test_each_installers_own_failure_output_is_one_line_naming_the_cause(installer, mode, monkeypatch):
    monkeypatch.setenv("CUDA_VERSION", "13.0.2.006")
    for (command, lines, code), expected in zip(recorded(installer, mode)[len(INSTALLED) :], FAILED, strict=True):
        assert code != 0, command
        said = expected if isinstance(expected, str) else expected[installer]
        watch = watched(command, lines)
        if said is not None:
            assert watch.failure("the base's pins") == said, command
        assert not watch.installed, command


#: what a Watch is given by its caller or works out when asked for its failure, never read from a line
WATCH_INPUTS = frozenset({"sources", "named", "pages", "trusted", "last_line", "cures", "blocked"})
#: the facts only one installer prints: which one, and why the other never does
ONE_INSTALLER = {
    "versions": ("pip", "uv names no file it fetches (pip's Downloading lines, counted when it backtracks)"),
    "looking_at": ("pip", "uv never says it is looking at multiple versions of a package"),
    "from_source": ("pip", "uv says nothing of a source distribution's metadata step"),
    "retried": ("pip", "uv names a page it could not read by its URL (page_unread)"),
    "page_unread": ("uv", "pip names only the path it retried (retried)"),
    "ignored_host": ("pip", "uv reads a plain-http page from any host"),
    "build_framework": ("uv", "install.sh gives only uv the base's framework as a build constraint"),
    "build_requires": ("uv", "pip does not say when it resolves a source build's requirements"),
}


def facts(watch) -> set[str]:
    """The names of the facts `watch` read (its attributes that are set), each kind of failure on its own."""
    read = {name for name, value in vars(watch).items() if name not in WATCH_INPUTS and value}
    return (read - {"kinds"}) | {f"kinds:{kind}" for kind in watch.kinds}


@pytest.mark.parametrize("installer", INSTALLERS)
def test_every_fact_the_guard_reads_is_read_from_real_output_of_each_installer_that_prints_it(installer):
    """Each fact the guard reads from a line (each of Watch's attributes, each kind of failure) is read from at least
    one real log of each installer, in some output mode: a parser that reads only one installer's spelling fails
    here, unless ONE_INSTALLER says why the other never prints it (and then that other never yields it)."""
    from tests.support import guard_module

    guard = guard_module()
    every = {name for name in vars(guard.Watch()) if name not in WATCH_INPUTS and name != "kinds"}
    every |= {f"kinds:{kind}" for kind, _ in guard.KINDS}
    others = {fact for fact, (who, _) in ONE_INSTALLER.items() if who != installer}
    read: set[str] = set()
    for mode in MODES:
        for command, lines, _ in recorded(installer, mode):
            read |= facts(watched(command, lines))
    assert sorted(every - others - read) == [], "never read from this installer's real output"
    assert sorted(read & others) == [], "read from an installer that ONE_INSTALLER says never prints it"


def test_every_pattern_for_installer_output_matches_a_real_line_of_it():
    """Each pattern of pip_words (the installers' words) and uv's install line find something in the recorded logs:
    a pattern written for a spelling no installer prints is caught. The escapes pattern is matched on lines as
    printed, the rest on their plain text, as the guard reads them."""
    from imgbuild.payload import pip_versions
    from imgbuild.payload import pip_words as words

    patterns = {name: value for name, value in vars(words).items() if isinstance(value, re.Pattern)}
    patterns["UV_ADDED"] = pip_versions.UV_ADDED
    printed = [
        line
        for installer in INSTALLERS
        for mode in MODES
        for _, lines, _ in recorded(installer, mode)
        for line in lines
    ]
    plain = [words.plain(line).strip() for line in printed]
    unmatched = [
        name
        for name, pattern in patterns.items()
        if not any(pattern.search(line) for line in (printed if name == "ESCAPE" else plain))
    ]
    assert unmatched == []


@pytest.fixture(params=INSTALLERS)
def framework_step(tmp_path, pip_bases, request):
    """A base whose framework (fwk) needs numlib>=2 through a dependency of its own (TensorFlow's numpy>=2 through
    ml-dtypes), and a package that needs numlib<2."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "numlib", "1.26.4", {"numlib/__init__.py": b""})
    wheel(folder, "numlib", "2.1.0", {"numlib/__init__.py": b""})
    wheel(folder, "mid", "0.6.0", {"mid/__init__.py": b""}, ("numlib>=2",))
    wheel(folder, "fwk", "2.21.0", {"fwk/__init__.py": b""}, ("mid>=0.5",))
    wheel(folder, "oldapp", "0.9", {"oldapp/__init__.py": b""}, ("numlib<2",))
    wheel(folder, "plugin", "0.8", {"plugin/__init__.py": b""}, ("numlib<2", "fwk"))  # tfmot: numpy<2 and tensorflow
    return PipStep(pip_bases, tmp_path, folder, ["fwk"], frameworks=("fwk",), installer=request.param)


def test_unpinning_what_the_bases_framework_needs_is_not_offered_and_the_need_is_named(framework_step):
    said = framework_step.failure(framework_step.run(["oldapp"]))
    assert "pip.unpin: [numlib] cannot help: the base's fwk needs numlib>=2 via mid" in said, said
    assert "oldapp" in said.split(" needs ")[0] and "let pip move" not in said


def test_unpinning_what_the_framework_needs_anyway_fails_the_step_without_a_false_holder(framework_step):
    said = framework_step.failure(framework_step.run(["plugin"], unpin="numlib\n"))
    assert "the base holds numlib<" not in said and "the base holds numlib>" not in said, said


def test_a_range_in_uvs_conflict_sentence_is_never_named_as_what_the_base_holds():
    """uv folds two packages' ranges into one sentence once the base's pin is gone (pip.unpin): the second range is
    another package's requirement, not the base's pin."""
    from tests.support import guard_module

    watch = guard_module().Watch()
    for line in (
        "  x No solution found when resolving dependencies:",
        "  Because tensorflow-model-optimization==0.8.1 depends on numpy>=1.23,<2.dev0 and numpy>=1.14,<2.dev0, we "
        "can conclude that tensorflow-model-optimization==0.8.1 cannot be used.",
    ):
        watch.see(line)
    assert "holds numpy>=1.14" not in watch.failure("a freeze of the base's packages")


@pytest.mark.parametrize("installer", INSTALLERS)
def test_a_find_links_web_page_is_read_as_a_page_of_links_by_either_installer(tmp_path, pip_bases, installer):
    """JAX's and PyG's pages are PEP 503 pages of wheel links: what reqfile passes on as `--find-links URL` installs
    a package that no index has (pyg-lib from data.pyg.org), with uv and with pip."""
    from tests.fake_index import FakeIndex, Release

    index = FakeIndex("127.0.0.1", {"pagelib": [Release("0.4.0")]})
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "numlib", "2.1.0", {"numlib/__init__.py": b""})
    try:
        step = PipStep(pip_bases, tmp_path, folder, ["numlib==2.1.0"], installer=installer)
        done = step.run([f"--find-links {index.url}/pagelib/", "pagelib"])
    finally:
        index.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert step.pip("show", "pagelib").stdout.splitlines()[1] == "Version: 0.4.0"


@pytest.mark.parametrize("kind", ["nvcc", "ninja", "headers", "compiler", "isolated"])
def test_every_apt_package_a_build_failure_names_passes_imgbuilds_own_apt_door(kind, monkeypatch):
    """A cure the recipe's apt door would refuse (the CUDA toolkit's Debian packages are the base's stack) cannot be
    followed: no build-tool line names one, on a base with its CUDA release said or not."""
    import re

    from imgbuild.pipeline.stack import STACK_DEB_RE
    from tests.support import guard_module

    guard = guard_module()
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setenv("CUDA_VERSION", "13.0.2.006")
    watch = guard.Watch()
    watch.building, watch.kinds = "srcpkg", {kind}
    said = watch.installing_failure()
    assert "srcpkg" in said and "see its output above" not in said, said
    named = [p.strip() for found in re.findall(r"apt: \[([^\]]+)\]", said) for p in found.split(",")]
    assert named or kind in ("nvcc", "ninja"), said
    assert not [p for p in named if STACK_DEB_RE.fullmatch(p)], said


PAGE = "https://data.pyg.org/whl/torch-2.4.0+cu124.html"
#: each installer's own output when the find-links page cannot be reached (recorded here, where only the index is)
UNREAD_PAGE = {
    "uv": [
        f"error: Failed to read `--find-links` URL: {PAGE}",
        "  cause: Request failed after 3 retries in 11.7s",
        f"  cause: Failed to fetch: {PAGE}",
        f"  cause: error sending request for url ({PAGE})",
        "  cause: client error (Connect)",
        "  cause: dns error",
        "  cause: error resolving DNS",
        "  cause: failed to lookup address information: Name or service not known",
    ],
    "pip": [
        f"Looking in links: {PAGE}",
        "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection "
        "broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7fe49a9d0850>: "
        "Failed to establish a new connection: [Errno -2] Name or service not known')': /whl/torch-2.4.0+cu124.html",
        "ERROR: Could not find a version that satisfies the requirement pyg_lib (from versions: none)",
        "ERROR: No matching distribution found for pyg_lib",
    ],
}


@pytest.mark.parametrize("installer", INSTALLERS)
def test_a_find_links_page_the_build_cannot_reach_is_named_not_the_index_nor_a_typo(installer, tmp_path):
    """PyG's and JAX's own install lines read a page of links beside the index: where the build cannot reach it,
    the line names that page, by either installer's words (uv's URL, pip's path of the page it retried)."""
    from tests.support import guard_module

    guard = guard_module()
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"torch_geometric\n--find-links {PAGE}\npyg_lib\n")
    watch = guard.Watch(pages=guard.find_links_pages(["uv", "pip", "install", "-r", str(requirements)]))
    for line in UNREAD_PAGE[installer]:
        watch.see(line + "\n")
    said = watch.failure("the base's pins")
    assert said.startswith(f"network failure reaching the find-links page {PAGE} "), said
    assert "typo" not in said and "package index (" not in said


def test_a_network_failure_elsewhere_still_names_the_index():
    from tests.support import guard_module

    guard = guard_module()
    watch = guard.Watch(pages=[PAGE])
    watch.see(
        "WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(Failed to establish a new "
        "connection)': /simple/einops/\n"
    )
    assert watch.failure("the base's pins").startswith("network failure reaching the package index")


@pytest.mark.parametrize("installer", INSTALLERS)
def test_either_installer_fills_in_a_dollar_brace_name_from_its_environment(tmp_path, installer):
    """Why imgbuild refuses `${NAME}` in every pip field and line: the real installer reads the line with the
    variable of the environment it runs in filled in (the pip step's holds the site's index URL), so the page it
    reads is not the one reviewed."""
    import os
    import subprocess
    import sys

    import uv

    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "pagelib", "0.4.0", {"pagelib/__init__.py": b""})
    (tmp_path / "req.txt").write_text("--no-index\n--find-links ${IMGBUILD_TEST_PAGE}\npagelib\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    environ.update(IMGBUILD_TEST_PAGE=str(folder), PIP_CONFIG_FILE=os.devnull, UV_NO_CONFIG="1")
    if installer == "uv":
        command = [uv.find_uv_bin(), "pip", "compile", "--no-header", "--no-cache", str(tmp_path / "req.txt")]
    else:
        download = ["download", "--no-deps", "--no-cache-dir", "-d", str(tmp_path / "got"), "-r"]
        command = [sys.executable, "-m", "pip", *download, str(tmp_path / "req.txt")]
    done = subprocess.run(command, capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and "pagelib" in done.stdout, done.stdout + done.stderr


#: find-links pages that serve nothing for the requirement, and the words the line says it with
EMPTY_PAGES = {
    "/gone/torch-2.4.0+cu124.html": "answers HTTP 404",
    "/other/torch-2.4.0+cu124.html": "lists 1 file(s) of pagelib, none for this Python",
}


@pytest.mark.parametrize("path", EMPTY_PAGES)
@pytest.mark.parametrize("installer", INSTALLERS)
def test_a_find_links_page_that_serves_nothing_is_named_with_what_it_said_never_a_typo(
    tmp_path, pip_bases, installer, path
):
    """PyG's page for another torch, or one that has moved: both installers say only that they found nothing (uv
    names the page it could not read); the line names the page and what it served, read as they read it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Page(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if not self.path.startswith("/other/"):
                self.send_error(404)
                return
            body = (
                b'<a href="/whl/pagelib-0.4.0-cp39-cp39-linux_x86_64.whl">pagelib-0.4.0-cp39-cp39-linux_x86_64.whl</a>'
            )
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "numlib", "2.1.0", {"numlib/__init__.py": b""})
    page = f"http://127.0.0.1:{server.server_address[1]}{path}"
    try:
        step = PipStep(pip_bases, tmp_path, folder, ["numlib==2.1.0"], installer=installer)
        done = step.run([f"--find-links {page}", "pagelib"])
        said = step.failure(done)
    finally:
        server.shutdown()
        server.server_close()
    assert f"the find-links page {page} " in said and EMPTY_PAGES[path] in said, done.stdout
    assert "typo" not in said.split(page)[0] and "conflict" not in said, said
    assert len(said.replace(page, PAGE)) <= 300, said  # a build's failure shows its first 300 characters


def test_a_plain_http_page_pip_will_not_read_is_named_with_its_cure():
    """pip reads no plain-http page or index on a host it does not trust (uv does): the line says so, not a typo."""
    from tests.support import guard_module

    watch = guard_module().Watch(pages=["http://192.0.2.2:8080/whl/torch-2.4.0+cu124.html"])
    for line in (
        "Looking in links: http://192.0.2.2:8080/whl/torch-2.4.0+cu124.html",
        "WARNING: The repository located at 192.0.2.2 is not a trusted or secure host and is being ignored. If this "
        "repository is available via HTTPS we recommend you use HTTPS instead, otherwise you may silence this warning "
        "and allow it anyway with '--trusted-host 192.0.2.2'.",
        "ERROR: Could not find a version that satisfies the requirement pyg_lib (from versions: none)",
        "ERROR: No matching distribution found for pyg_lib",
    ):
        watch.see(line + "\n")
    said = watch.failure("the base's pins")
    assert said.startswith("pyg_lib: pip read nothing from the plain-http index or find-links page at 192.0.2.2"), said
    assert "add 192.0.2.2 to pip.trusted_hosts" in said and "typo" not in said


@pytest.fixture(scope="module")
def cure_wheels(tmp_path_factory):
    """Releases whose cures can be followed: numlib and abslib as the base pins them and older, a base package
    (holder) that needs numlib>=2, packages that need the older ones, and app whose newer release needs numlib>=2."""
    folder = tmp_path_factory.mktemp("cure-wheels")
    for version in ("1.26.4", "2.1.0"):
        wheel(folder, "numlib", version, {"numlib/__init__.py": b""})
    for version in ("1.4.0", "2.0.0"):
        wheel(folder, "abslib", version, {"abslib/__init__.py": b""})
    wheel(folder, "holder", "1.0", {"holder/__init__.py": b""}, ("numlib>=2",))
    wheel(folder, "oldapp", "0.9", {"oldapp/__init__.py": b""}, ("numlib<2",))
    wheel(folder, "tfmot", "0.8", {"tfmot/__init__.py": b""}, ("numlib<2", "abslib<2"))
    wheel(folder, "app", "1.0", {"app_one/__init__.py": b""}, ("numlib<2",))
    wheel(folder, "app", "2.0", {"app_two/__init__.py": b""}, ("numlib>=2",))
    wheel(folder, "bapp", "1.0", {"bapp_one/__init__.py": b""}, ("numlib<2",))
    wheel(folder, "bapp", "2.0", {"bapp_two/__init__.py": b""}, ("numlib>=2",))
    return folder


@pytest.mark.parametrize("installer", INSTALLERS)
def test_an_unpin_that_would_break_a_base_package_is_not_offered_and_that_package_is_named(
    tmp_path, pip_bases, cure_wheels, installer
):
    """Unpinning numlib resolves (the installer never asks the base's holder again) but leaves holder, which needs
    numlib>=2, broken: no unpin is offered, nor a pin of oldapp, which has no release for the base; what would be
    needed is said."""
    from benchmarks.follow import PIN, UNPIN

    step = PipStep(pip_bases, tmp_path, cure_wheels, ["numlib==2.1.0", "holder==1.0"], installer=installer)
    said = step.failure(step.run(["oldapp"]))
    assert not UNPIN.search(said) and not PIN.search(said), said
    assert said.endswith(
        "drop oldapp: no release of oldapp resolves with the base's numlib==2.1.0, and pip.unpin: [numlib] cannot "
        "help (the base's holder 1.0 needs numlib>=2); what would be needed is a base whose numlib admits numlib<2"
    ), said


@pytest.mark.parametrize("installer", INSTALLERS)
def test_every_base_pin_in_the_way_is_unpinned_in_one_line_and_following_it_installs(
    tmp_path, pip_bases, cure_wheels, installer
):
    """tfmot needs older numlib and abslib than the base pins: one round names both, and the step with them
    unpinned installs (the cure is asked of the resolver before it is printed)."""
    from benchmarks.follow import UNPIN, imgbuilds_words

    base = ["numlib==2.1.0", "abslib==2.0.0"]
    step = PipStep(pip_bases, tmp_path / "one", cure_wheels, base, installer=installer)
    first = step.run(["tfmot"])
    said = step.failure(first)
    curing = [line for line in imgbuilds_words(first.stdout) if UNPIN.search(line)]
    assert len(curing) == 1 and curing[0].startswith("imgbuild: pip step failed: "), curing  # no check reads as one
    found = UNPIN.search(said)
    assert found and sorted(found.group(1).split(", ")) == ["abslib", "numlib"], said
    assert "pin tfmot" not in said, said  # its one release needs both: no pin is a cure
    again = PipStep(pip_bases, tmp_path / "two", cure_wheels, base, installer=installer)
    done = again.run(["tfmot"], unpin="\n".join(found.group(1).split(", ")) + "\n")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("installer", INSTALLERS)
def test_a_pin_cure_names_the_release_that_resolves_and_following_it_installs(
    tmp_path, pip_bases, cure_wheels, installer
):
    from benchmarks.follow import PIN

    step = PipStep(pip_bases, tmp_path / "one", cure_wheels, ["numlib==2.1.0"], installer=installer)
    said = step.failure(step.run(["app<2"]))
    found = PIN.search(said)
    assert found and found.group(1, 2) == ("app", "2.0"), said
    again = PipStep(pip_bases, tmp_path / "two", cure_wheels, ["numlib==2.1.0"], installer=installer)
    done = again.run([f"app=={found.group(2)}"])
    assert done.returncode == 0, done.stdout + done.stderr


BASES = (["numlib==2.1.0"], ["numlib==2.1.0", "abslib==2.0.0"], ["numlib==2.1.0", "holder==1.0"])
ASKS = ("oldapp", "tfmot", "app", "app<2", "app==1.0", "abslib<2", "numlib<2")


@given(base=st.sampled_from(BASES), asked=st.lists(st.sampled_from(ASKS), min_size=1, max_size=2, unique=True))
@hypothesis_settings(
    derandomize=True, max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_each_cure_the_guard_prints_installs_when_followed(tmp_path_factory, pip_bases, cure_wheels, base, asked):
    """Generated recipes and bases, uv the oracle: every pin and unpin a failure line names, applied as the
    scripted user applies them, gives a step that installs; none leads back to a failure."""
    from benchmarks.follow import PIN, UNPIN

    folder = tmp_path_factory.mktemp("follow")
    step = PipStep(pip_bases, folder / "one", cure_wheels, base, installer="uv")
    first = step.run(asked)
    if first.returncode == 0:
        return
    said = step.failure(first)
    pins = {canon(m.group(1)): f"{m.group(1)}=={m.group(2)}" for m in PIN.finditer(said)}
    unpin = [name for m in UNPIN.finditer(said) for name in m.group(1).split(", ")]
    if not pins and not unpin:
        return  # no cure to follow: the line says what would be needed
    followed = [pins.get(canon(re.split(r"[<>=]", line)[0]), line) for line in asked]
    again = PipStep(pip_bases, folder / "two", cure_wheels, base, installer="uv")
    done = again.run(followed, unpin="".join(f"{n}\n" for n in unpin))
    assert done.returncode == 0, f"{asked} on {base}: {said}\nfollowed: {followed} unpin {unpin}\n{done.stdout}"


@pytest.mark.parametrize("installer", INSTALLERS)
@pytest.mark.parametrize(
    ("releases", "cure"),
    [
        (("1.0", "2.0"), "pin plug==1.0 (the newest release that resolves with the base), or drop plug"),
        (("2.0",), "drop plug: no release of plug resolves with the base's fwk==2.9.0a0"),  # no older release exists
    ],
)
def test_ngcs_pre_release_trap_names_the_older_release_that_resolves_or_none(
    tmp_path, pip_bases, installer, releases, cure
):
    """plug 2.0 needs fwk>=2.9, which NGC's fwk 2.9.0a0 does not meet: the older release is named by its version
    where one resolves with the base (and following it installs), and none is invented where none exists."""
    from benchmarks.follow import PIN

    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "fwk", "2.9.0a0", {"fwk/__init__.py": b""})
    for version in releases:
        wheel(folder, "plug", version, {"plug/__init__.py": b""}, ("fwk>=2.9" if version == "2.0" else "fwk>=2.0",))
    step = PipStep(pip_bases, tmp_path / "one", folder, ["fwk==2.9.0a0"], frameworks=("fwk",), installer=installer)
    said = step.failure(step.run(["plug>=2"]))
    assert "NGC" in said or "pre-release" in said, said
    assert cure in said, said
    if found := PIN.search(said):
        again = PipStep(pip_bases, tmp_path / "two", folder, ["fwk==2.9.0a0"], frameworks=("fwk",), installer=installer)
        done = again.run([f"plug=={found.group(2)}"])
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_cure_the_resolver_could_not_be_asked_of_in_time_is_said_to_be_unchecked(tmp_path, monkeypatch):
    """The checks are bounded: a resolve past its time (or past the step's budget for them) answers nothing, and
    the cure is printed as the failure suggests it, marked as not checked, never as checked."""
    import sys

    from tests.support import guard_module

    guard = guard_module()
    asked: list[list[str]] = []

    def stopped(command, watch, limit_s=0.0):
        asked.append(command)
        assert 0 < limit_s <= sys.modules["pip_cures"].CHECK_SECONDS
        return f"past {limit_s:.0f} s"

    monkeypatch.setattr(sys.modules["pip_cures"], "run", stopped)
    (tmp_path / "requirements.txt").write_text("oldapp>=0.5\n")
    watch = guard.Watch({"numlib": [("numlib==2.1.0", ORIGIN)]})
    watch.cures = guard.Cures(["uv", "pip", "install", "-r", str(tmp_path / "requirements.txt")], ORIGIN, guard.Watch)
    said = watch.cure("numlib", "oldapp", "numlib<2")
    unchecked = " (not checked: the resolver did not answer it in time, or not for one line)"
    assert said == (
        f"pin oldapp to a version made for the base, drop it{unchecked}, or let pip move numlib: pip.unpin: [numlib]"
        f"{unchecked}"
    )
    assert len(asked) == 2 and all("--dry-run" in command for command in asked), asked
    monkeypatch.setattr(sys.modules["pip_cures"], "CHECK_BUDGET", 0.0)
    spent = guard.Cures(["uv", "pip", "install", "-r", str(tmp_path / "requirements.txt")], ORIGIN, guard.Watch)
    assert spent.pin("oldapp") is None and len(asked) == 2  # the budget spent: not even asked


@pytest.mark.parametrize("installer", INSTALLERS)
def test_two_lines_held_back_by_one_base_pin_never_call_a_release_missing_that_resolves(
    tmp_path, pip_bases, cure_wheels, installer
):
    """app<2 and bapp<2 both exclude the releases made for the base's numlib, which holder keeps: uv names both pins
    in one line (and following them installs); pip names only the last package it backtracked through, and the
    line says app 2.0 resolves with the base, never that no release of app does."""
    from benchmarks.follow import PIN

    base = ["numlib==2.1.0", "holder==1.0"]
    step = PipStep(pip_bases, tmp_path / "one", cure_wheels, base, installer=installer)
    said = step.failure(step.run(["app<2", "bapp<2"]))
    assert "no release of app" not in said and "no release of bapp" not in said, said
    if installer == "pip":
        assert "app==2.0 resolves with the base alone, but not beside the recipe's other lines" in said, said
        return
    pins = {m.group(1): m.group(2) for m in PIN.finditer(said)}
    assert pins == {"app": "2.0", "bapp": "2.0"}, said
    again = PipStep(pip_bases, tmp_path / "two", cure_wheels, base, installer=installer)
    done = again.run([f"{name}=={version}" for name, version in pins.items()])
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_check_that_fails_to_run_leaves_the_step_its_line_with_the_cure_marked_unchecked(tmp_path, monkeypatch):
    import sys

    from tests.support import guard_module

    guard = guard_module()

    def broken(command, watch, limit_s=0.0):
        raise OSError("no such installer")

    monkeypatch.setattr(sys.modules["pip_cures"], "run", broken)
    (tmp_path / "requirements.txt").write_text("oldapp>=0.5\n")
    watch = guard.Watch({"numlib": [("numlib==2.1.0", ORIGIN)]})
    watch.cures = guard.Cures(["uv", "pip", "install", "-r", str(tmp_path / "requirements.txt")], ORIGIN, guard.Watch)
    said = watch.cure("numlib", "oldapp", "numlib<2")
    assert said.count("(not checked: ") == 2 and "pip.unpin: [numlib]" in said, said
