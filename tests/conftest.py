"""Shared fixtures. Engine tests use the real test bed (tests/testbed/up): a Docker engine, a registry on
127.0.0.1 and stand-in NGC bases. If the shell did not bring it up, the first engine test does; if it
cannot come up, those tests fail (they are never skipped)."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTBED_UP = ROOT / "tests" / "testbed" / "up"


def _import_the_installed_copy() -> None:
    """Import imgbuild as users get it: from the environment's site-packages, never from this checkout because
    pytest put the checkout first on sys.path (it does, for the `tests` package). With the README's test command
    that is the built wheel, so the suite fails what an installed copy fails; with an editable install it is the
    checkout, through the install's own path entry."""
    checkout = {str(ROOT), ""}
    saved = sys.path[:]
    sys.path[:] = [entry for entry in sys.path if str(Path(entry or ".").resolve()) not in checkout]
    try:
        import imgbuild  # noqa: F401
    finally:
        sys.path[:] = saved


_import_the_installed_copy()

#: The command a user types: the installed console script (never `python -m imgbuild`, which imports from the
#: working folder: run from the checkout, that is the source tree, not what is installed).
IMGBUILD = [str(Path(sys.executable).parent / "imgbuild")]


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: int = 1800) -> Result:
    """Run imgbuild as a user would: a separate process, real exit code, real stderr."""
    proc = subprocess.run(
        [*IMGBUILD, *args],
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(autouse=True)
def environment_left_as_found():
    """A test that leaves the process environment changed (code under test writing os.environ where the test did
    not record the name with monkeypatch) changes every later test on its worker: one leaked DOCKER_HOST sent
    another test's engine to ssh://. The environment is compared after monkeypatch's undo, put back, and the
    leaking test fails naming the variables."""
    own = "PYTEST_CURRENT_TEST"  # pytest's own, set per phase
    before = {k: v for k, v in os.environ.items() if k != own}
    yield
    after = {k: v for k, v in os.environ.items() if k != own}
    if after != before:
        changed = sorted({name for name, _ in set(before.items()) ^ set(after.items())})
        for name in changed:
            if name in before:
                os.environ[name] = before[name]
            else:
                os.environ.pop(name, None)
        pytest.fail(f"the test left the environment changed: {changed}")


@pytest.fixture(autouse=True)
def isolated_settings(
    environment_left_as_found: None, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test reads the developer's config or writes the real cache."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("IMGBUILD_CONFIG", str(home / "config.yaml"))
    use_site_config(monkeypatch, home / "site-config.yaml")  # never the machine's /etc one
    monkeypatch.setenv("IMGBUILD_CACHE_DIR", str(home / "cache"))
    monkeypatch.setenv("IMGBUILD_USER", "imgbuildtest")
    monkeypatch.setenv("IMGBUILD_REGISTRY_BACKOFF", "0.02")  # retries stay real, the waits short
    for ci in ("GITHUB_ACTIONS", "GITLAB_CI"):  # output as a terminal-less run prints it, even where CI runs the suite
        monkeypatch.delenv(ci, raising=False)


@pytest.fixture
def write(tmp_path: Path):
    """write("name.yaml", text) -> path, dedented."""

    def _write(name: str, text: str = "") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    return _write


_TESTBED: dict[str, str] = {}


def testbed_settings() -> dict[str, str]:
    _require_marker("engine", "the test bed (engine, registry, stand-ins)")
    if _TESTBED:
        return _TESTBED
    if os.environ.get("IMGBUILD_TESTBED_REGISTRY"):
        keys = (
            "IMGBUILD_NGC_REGISTRY",
            "IMGBUILD_INSECURE_REGISTRIES",
            "IMGBUILD_TESTBED_REGISTRY",
            "IMGBUILD_DOCKER_CLI",
            "IMGBUILD_PIP_CA_BUNDLE",
            "IMGBUILD_TESTBED_CACHE",
            "IMGBUILD_TESTBED_DEVCONTAINER",
            "IMGBUILD_TESTBED_PODMAN",
        )
        _TESTBED.update({k: os.environ[k] for k in keys if os.environ.get(k)})
        return _TESTBED
    proc = subprocess.run([str(TESTBED_UP), "--all"], capture_output=True, text=True, timeout=3000)
    if proc.returncode != 0:
        pytest.fail(f"the test bed did not come up:\n{proc.stderr[-3000:]}", pytrace=False)
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("export"):
            _TESTBED[key] = value
    return _TESTBED


@pytest.fixture
def testbed(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    settings = testbed_settings()
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    return settings


@pytest.fixture(scope="session")
def docker_client():
    import docker

    testbed_settings()
    client = docker.from_env(timeout=600)
    yield client
    client.close()


@dataclass(frozen=True)
class BuiltRecipe:
    """A recipe imgbuild built on the bed (its project folder holds a `.git`) and the image it made."""

    recipe: Path
    image: str


def _built_once(tmp_path_factory: pytest.TempPathFactory, name: str, text: str) -> BuiltRecipe:
    """The recipe `text` in a project folder of its own, built (and smoke-tested) by imgbuild on the bed."""
    bed = testbed_settings()
    folder = tmp_path_factory.mktemp(name)
    (folder / ".git").mkdir()
    recipe = folder / f"{name}.yaml"
    recipe.write_text(text)
    # a session's fixture is made before each test's own environment (`isolated_settings`): the same user namespace, and
    # a config and cache of its own, are given here, so that the tests find the image under the name they derive
    isolated = {"IMGBUILD_USER": "imgbuildtest", "IMGBUILD_CONFIG": str(folder / "config.yaml"),
                "IMGBUILD_CACHE_DIR": str(folder / "cache")}  # fmt: skip
    built = run_cli("build", str(recipe), cwd=folder, env={**bed, **isolated})
    assert built.code == 0, built.err
    return BuiltRecipe(recipe, built.out.strip().splitlines()[-1].split(" -> ")[0])


@pytest.fixture(scope="session")
def launchers_image(tmp_path_factory: pytest.TempPathFactory) -> BuiltRecipe:
    """The 24.05 stand-in with PyPI's accelerate and deepspeed (`LAUNCHERS_RECIPE`), built and smoke-tested by
    imgbuild once a session: the tests that run the launchers' own code in an image share it."""
    from tests.support import LAUNCHERS_RECIPE

    return _built_once(tmp_path_factory, "launchers", LAUNCHERS_RECIPE)


@pytest.fixture(scope="session")
def plain_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltRecipe]:
    """A recipe of the 24.05 stand-in and nothing else, built and smoke-tested by imgbuild once a session, for the
    tests that need only an image imgbuild built (exports to other runtimes); its image is removed at the end."""
    name = f"plain-{uuid.uuid4().hex[:8]}"
    built = _built_once(tmp_path_factory, name, f'name: {name}\ntag: v1\nbase: {{framework: pytorch, tag: "24.05"}}\n')
    yield built
    docker = testbed_settings().get("IMGBUILD_DOCKER_CLI", "docker")
    subprocess.run([docker, "rmi", "--no-prune", built.image], capture_output=True)


@pytest.fixture(scope="session")
def pip_bases(tmp_path_factory: pytest.TempPathFactory):
    """The pip-step tests' base environments, each made once per session (per xdist worker) and copied per test."""
    from tests.pipstep import BaseEnvironments

    return BaseEnvironments(tmp_path_factory.mktemp("pip-bases"))


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def cleanup_images(docker_client) -> Iterator[list[str]]:
    """Tests append image refs; they are removed afterwards (layers stay cached)."""
    refs: list[str] = []
    yield refs
    for ref in refs:
        for suffix in ("", "-previous"):
            with contextlib.suppress(Exception):
                docker_client.images.remove(ref + suffix, noprune=True)


def in_image(client, image: str, script: str, user: str | None = None) -> str:
    """Run a Python snippet in the image and return its stdout (raises with the output on failure)."""
    container = client.containers.run(
        image, ["python3", "-c", textwrap.dedent(script)], detach=True, user=user, entrypoint=[]
    )
    try:
        code = container.wait(timeout=600)["StatusCode"]
        out = container.logs(stdout=True, stderr=True).decode()
        assert code == 0, out
        return container.logs(stdout=True, stderr=False).decode()
    finally:
        container.remove(force=True)


def bridge_gateway(client) -> str:
    """The host's address on Docker's default bridge, as containers reach it. A dockerd that was just
    started (20.10) reports only the subnet, no Gateway: the engine then takes the subnet's first address."""
    import ipaddress

    config = client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


def run_words(spec) -> list[str]:
    """A RunSpec's `docker run` words as `run --dry-run` shows them (variables with their values)."""
    import shlex

    from imgbuild.engine.runargs import run_command_line

    return shlex.split(run_command_line(spec.options()))[1:]


def use_site_config(monkeypatch: pytest.MonkeyPatch, path: str | Path) -> None:
    """`path` as the site config: for this process (the module's SITE_CONFIG, whoever runs the tests) and for the
    imgbuild processes it starts as root (IMGBUILD_SITE_CONFIG, which imgbuild honours for plain root alone)."""
    from imgbuild.config import settings as config_settings

    monkeypatch.setattr(config_settings, "SITE_CONFIG", Path(path))
    monkeypatch.setenv("IMGBUILD_SITE_CONFIG", str(path))


#: The fixtures that reach the test bed or a real Slurm, and the marker a test using one must carry, so that
#: `-m "not engine"` (the fast tier) never starts an engine by surprise.
_NEEDS_MARKER = {
    "testbed": "engine",
    "docker_client": "engine",
    "cleanup_images": "engine",
    "launchers_image": "engine",
    "launchers_judge": "engine",
    "slurm_time_str2mins": "slurm",
    "plain_image": "engine",
    "slurm": "slurm",
}

#: The test being set up or run now (one at a time in a process, xdist workers included).
_RUNNING: list[pytest.Item] = []


def _require_marker(name: str, what: str) -> None:
    """Fail the running test when it reaches `what` without its marker: the runtime half of the guard below, for
    a test (or a helper it calls) that reaches the bed without a fixture."""
    item = _RUNNING[0] if _RUNNING else None
    if item is not None and item.get_closest_marker(name) is None:
        pytest.fail(f"{item.nodeid} uses {what} but is not marked `{name}`", pytrace=False)


#: The suite's tiers, by marker expression, as README's test command (the first two) and tests/rest-tier (the
#: others: the tests that need the Docker engine alone beside Podman's line, then the Docker, fidelity and Slurm
#: lines side by side) select them; every test is in exactly one (`heavy` in none: `pytest -m heavy`).
TIERS = {
    "unit": "not engine and not slurm and not heavy",
    "front door": "frontdoor and not heavy",
    "rest, Docker": "engine and not slurm and not podman and not alone and not fidelity and not frontdoor and not heavy",
    "rest, fidelity": "fidelity and not slurm and not podman and not alone and not frontdoor and not heavy",
    "rest, Slurm": "slurm and not podman and not alone and not frontdoor and not heavy",
    "rest, Podman": "podman and not alone and not frontdoor and not heavy",
    "rest, alone": "alone and not frontdoor and not heavy",
}


@functools.cache
def _tier_expressions() -> tuple[tuple[str, Any], ...]:
    """TIERS compiled once per session, not once per test and tier."""
    from _pytest.mark.expression import Expression

    return tuple((tier, Expression.compile(text)) for tier, text in TIERS.items())


def _tiers_of(item: pytest.Item) -> list[str]:
    names = {mark.name for mark in item.iter_markers()}
    return [tier for tier, expression in _tier_expressions() if expression.evaluate(lambda name: name in names)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that asks for a bed or Slurm fixture without its marker is an error at collection, not a slow
    surprise in the fast tier; a test that no tier runs, or two do, is an error too. The front door's engine tests
    come first, so that README's test command (one run, three xdist workers) starts them at once, on the first
    worker's first batch, while the others run the unit tier beside them."""
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("frontdoor") is None)  # stable: else as found
    unmarked = [
        f"{item.nodeid} uses the fixture `{fixture}` but is not marked `{marker}`"
        for item in items
        for fixture, marker in _NEEDS_MARKER.items()
        if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None
    ]
    unmarked += [
        f"{item.nodeid} is run by {len(tiers)} of the suite's tiers ({', '.join(tiers) or 'none'}): check its markers"
        for item in items
        if item.get_closest_marker("heavy") is None and len(tiers := _tiers_of(item)) != 1
    ]
    if unmarked:
        raise pytest.UsageError("\n".join(unmarked))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """The front door's engine tests run one at a time on this machine, whichever worker has them: each holds a
    lock for its set-up, run and teardown (dockerd 20.10's BuildKit is not safe under unrelated concurrent builds)."""
    if item.get_closest_marker("frontdoor") is None:
        return (yield)
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / f"imgbuild-frontdoor-{os.getuid()}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return (yield)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked `root` need root by nature; for anyone else they are skipped with their reason."""
    _RUNNING[:] = [item]
    marker = item.get_closest_marker("root")
    if marker is not None and os.geteuid() != 0:
        pytest.skip(f"needs root: {marker.args[0] if marker.args else 'by nature'}")


# --- a real Slurm (tests/testbed/slurm-up), for the modules that submit jobs -------------------------------


@pytest.fixture(scope="module")
def slurm():
    proc = subprocess.run([str(ROOT / "tests/testbed/slurm-up")], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"slurm did not come up:\n{proc.stderr[-2000:]}", pytrace=False)
    conf = next(line.split("=", 1)[1] for line in proc.stdout.splitlines() if line.startswith("SLURM_CONF="))
    return conf
