"""Docker's own conventions: the engine is the one the docker CLI would use (DOCKER_HOST, DOCKER_CONTEXT, the
config's currentContext), never the local socket instead of a context that cannot be read; registry logins are
found where `docker login` keeps them, Docker Hub's included."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
from pathlib import Path

import pytest

from imgbuild.engine import dockerctx
from imgbuild.errors import EngineUnavailable
from imgbuild.registry.auth import DOCKER_HUB_KEY, docker_config_credentials
from tests.conftest import run_cli


def _context(config: Path, name: str, host: str, tls: bool = False, skip_verify: bool = False) -> None:
    digest = hashlib.sha256(name.encode()).hexdigest()
    meta = config / "contexts" / "meta" / digest
    meta.mkdir(parents=True)
    endpoint = {"Host": host, "SkipTLSVerify": skip_verify}
    (meta / "meta.json").write_text(json.dumps({"Name": name, "Endpoints": {"docker": endpoint}}))
    if tls:
        (config / "contexts" / "tls" / digest / "docker").mkdir(parents=True)


def test_docker_host_wins_then_docker_context_then_the_configs_current_context(tmp_path):
    _context(tmp_path, "gpu-box", "ssh://lab@gpu-box")
    _context(tmp_path, "other", "tcp://10.0.0.9:2376")
    (tmp_path / "config.json").write_text(json.dumps({"currentContext": "other"}))
    assert dockerctx.endpoint({"DOCKER_HOST": "unix:///x.sock", "DOCKER_CONTEXT": "gpu-box"}, tmp_path).host == (
        "unix:///x.sock"
    )
    chosen = dockerctx.endpoint({"DOCKER_CONTEXT": "gpu-box"}, tmp_path)
    assert chosen.host == "ssh://lab@gpu-box" and chosen.source == "docker context gpu-box (DOCKER_CONTEXT)"
    assert dockerctx.endpoint({}, tmp_path).host == "tcp://10.0.0.9:2376"
    assert dockerctx.endpoint({"DOCKER_CONTEXT": "default"}, tmp_path).host == ""
    (tmp_path / "config.json").write_text("{}")
    assert dockerctx.endpoint({}, tmp_path).host == ""


@pytest.mark.parametrize(
    ("why", "name", "meta", "said"),
    [
        ("no such context", "gone", None, "docker context gone (DOCKER_CONTEXT) does not exist"),
        ("a path for a name", "../../etc", None, "is not a context name"),
        ("a space", "a b", None, "is not a context name"),
        ("a newline", "a\nb", None, "is not a context name"),
        ("no docker endpoint", "k8s", {"Endpoints": {"kubernetes": {}}}, "names no Docker endpoint"),
        ("an endpoint that is not text", "odd", {"Endpoints": {"docker": {"Host": 5}}}, "names no Docker endpoint"),
        ("not JSON", "bad", "{", "names no Docker endpoint"),
        ("deep JSON", "deep", "[" * 100_000, "names no Docker endpoint"),
        ("a list, not an object", "list", [1, 2], "names no Docker endpoint"),
        ("larger than a context's metadata", "big", {"pad": "x" * 70_000}, "names no Docker endpoint"),
    ],
)
def test_a_context_that_cannot_be_read_is_refused_in_one_line_never_replaced_by_the_local_engine(
    tmp_path, why, name, meta, said
):
    if meta is not None:
        folder = tmp_path / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    with pytest.raises(EngineUnavailable, match=re.escape(said)) as caught:
        dockerctx.endpoint({"DOCKER_CONTEXT": name}, tmp_path)
    assert "\n" not in str(caught.value), why


def test_a_context_with_tls_material_points_the_sdk_and_the_clis_at_it(tmp_path):
    _context(tmp_path, "secure", "tcp://gpu-box:2376", tls=True)
    env = {"DOCKER_CONTEXT": "secure"}
    dockerctx.apply(dockerctx.endpoint(env, tmp_path), env)
    assert env == {
        "DOCKER_HOST": "tcp://gpu-box:2376",
        "DOCKER_CERT_PATH": str(tmp_path / "contexts" / "tls" / hashlib.sha256(b"secure").hexdigest() / "docker"),
        "DOCKER_TLS_VERIFY": "1",
    }


def test_a_context_naming_a_dead_engine_fails_the_command_naming_the_context(tmp_path):
    """A context pointing at a dead socket silently built with the local engine and promoted there."""
    _context(tmp_path, "dead", f"unix://{tmp_path}/dead.sock")
    done = run_cli("ps", env={"DOCKER_CONTEXT": "dead", "DOCKER_CONFIG": str(tmp_path), "DOCKER_HOST": ""})
    assert done.code == 3, done.err
    assert "docker context dead (DOCKER_CONTEXT)" in done.err and done.err.count("\n") == 1


@pytest.mark.alone
@pytest.mark.engine
def test_a_context_naming_the_bed_engine_is_used(tmp_path, testbed):
    _context(tmp_path, "bed", "unix:///var/run/docker.sock")
    done = run_cli("ps", env={"DOCKER_CONTEXT": "bed", "DOCKER_CONFIG": str(tmp_path), "DOCKER_HOST": ""})
    assert done.code == 0, done.err


def test_a_context_over_ssh_reaches_the_engine_through_the_ssh_client(tmp_path, monkeypatch):
    """`docker context create gpu-server --docker host=ssh://you@gpu-server` on a laptop: the SDK goes through
    the `ssh` client (the user's keys, agent and known hosts), as the docker CLI does."""
    import docker

    from imgbuild.engine.docker import Engine

    _context(tmp_path, "gpu-server", "ssh://you@gpu-server")
    for name in ("DOCKER_HOST", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY"):
        monkeypatch.setenv(name, "")  # recorded, so what connect() writes there is undone after the test
        monkeypatch.delenv(name)
    monkeypatch.setenv("DOCKER_CONTEXT", "gpu-server")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    asked: list[tuple[str, dict]] = []

    class Client:
        def ping(self) -> bool:
            return True

    def from_env(**kwargs):
        asked.append((os.environ["DOCKER_HOST"], kwargs))
        return Client()

    monkeypatch.setattr(docker, "from_env", from_env)
    Engine.connect()
    assert asked == [("ssh://you@gpu-server", {"timeout": 600, "use_ssh_client": True})]


# --- registry logins ------------------------------------------------------------------------------------------


def _config(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.mark.parametrize("host", ["docker.io", "registry-1.docker.io", "index.docker.io"])
def test_a_docker_hub_login_is_found_under_the_clis_own_key(tmp_path, host):
    token = base64.b64encode(b"lab:hub-secret").decode()
    path = _config(tmp_path, {"auths": {DOCKER_HUB_KEY: {"auth": token}}})
    creds = docker_config_credentials(host, path)
    assert creds is not None and (creds.username, creds.password) == ("lab", "hub-secret")


def test_a_credential_helper_is_asked_for_docker_hub_by_the_clis_key(tmp_path, monkeypatch):
    helper = tmp_path / "bin" / "docker-credential-lab"
    helper.parent.mkdir()
    helper.write_text(f'#!/bin/sh\ncat > {tmp_path}/asked\necho \'{{"Username": "u", "Secret": "s"}}\'\n')
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{helper.parent}:{os.environ['PATH']}")
    path = _config(tmp_path, {"credsStore": "lab"})
    creds = docker_config_credentials("docker.io", path)
    assert creds is not None and creds.password == "s"
    assert (tmp_path / "asked").read_text() == DOCKER_HUB_KEY


@pytest.mark.parametrize(
    ("why", "config"),
    [
        ("auth that is not base64", {"auths": {"r.example.org": {"auth": "%%%"}}}),
        ("auth that is not text", {"auths": {"r.example.org": {"auth": base64.b64encode(b"\xff\xfe").decode()}}}),
        ("an entry that is not an object", {"auths": {"r.example.org": "x"}}),
        ("auths that is a list", {"auths": ["r.example.org"]}),
        ("a helper name with a path", {"credsStore": "../../tmp/evil"}),
        ("a helper name with a space", {"credHelpers": {"r.example.org": "a b"}}),
        ("deep JSON", "[" * 100_000),
        ("not JSON", "{"),
        ("larger than a config", json.dumps({"pad": "x" * (1024 * 1024 + 1)})),
    ],
)
def test_a_hostile_docker_config_gives_no_credentials_and_no_error(tmp_path, why, config):
    assert docker_config_credentials("r.example.org", _config(tmp_path, config)) is None, why
