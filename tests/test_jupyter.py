"""`run --jupyter` says where the notebook is only once it answers there; otherwise why not, and nothing is left."""

from __future__ import annotations

import pytest

from imgbuild.engine.fake import FakeEngine
from imgbuild.engine.types import ContainerInfo
from imgbuild.errors import ImgbuildError, UsageError
from imgbuild.servers import jupyter
from tests.conftest import run_cli

NAME = "alice_nb_1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _engine(status: str = "running", exit_code: int | None = None, tail: str = "") -> FakeEngine:
    engine = FakeEngine()
    engine.containers.listed = [ContainerInfo(NAME, status=status, exit_code=exit_code)]
    engine.containers.tails[NAME] = tail
    return engine


def test_the_address_is_given_once_jupyter_answers():
    engine, clock = _engine(), Clock()
    asked = iter([False, False, True])
    jupyter.wait_until_serving(engine, NAME, 8888, ask=lambda port: next(asked), clock=clock, sleep=clock.sleep)
    assert f"remove {NAME}" not in engine.containers.calls


@pytest.mark.parametrize(
    ("why", "status", "code", "tail", "said"),
    [
        ("not installed", "exited", 127, "exec: \"jupyter\": executable file not found in $PATH",
         "its container exited 127; it said: exec: \"jupyter\": executable file not found"),
        ("refuses root", "exited", 1, "[C 10:00] Running as root is not recommended. Use --allow-root to bypass.",
         "its container exited 1; it said: [C 10:00] Running as root is not recommended"),
        ("removed by someone", "gone", None, "", "its container is gone; it said: (nothing)"),
    ],
)  # fmt: skip
def test_a_notebook_that_exits_is_said_with_its_exit_code_and_last_lines_and_removed(why, status, code, tail, said):
    engine, clock = _engine(status, code, tail), Clock()
    if status == "gone":
        engine.containers.listed = []
    with pytest.raises(ImgbuildError, match="Jupyter did not start") as caught:
        jupyter.wait_until_serving(engine, NAME, 8888, ask=lambda port: False, clock=clock, sleep=clock.sleep)
    assert said in str(caught.value) and "the container was removed" in str(caught.value), why
    assert f"remove {NAME}" in engine.containers.calls


def test_a_notebook_that_never_answers_is_stopped_after_the_wait():
    engine, clock = _engine(tail="still importing"), Clock()
    told: list[str] = []
    with pytest.raises(ImgbuildError, match="it did not answer in 120 s; it said: still importing"):
        jupyter.wait_until_serving(
            engine, NAME, 8888, ask=lambda port: False, clock=clock, sleep=clock.sleep, progress=told.append
        )
    assert f"remove {NAME}" in engine.containers.calls
    assert told and all(line.startswith("waiting for Jupyter") for line in told)  # never silent while it waits


def test_an_image_without_jupyter_is_named_before_anything_starts():
    engine = FakeEngine()
    engine.containers.answers["jupyter"] = lambda run: (0, {"jupyter": ""}, "")
    with pytest.raises(UsageError, match="has no `jupyter` on its PATH"):
        jupyter.check_present(engine, "team/img:1", None)
    engine.containers.answers["jupyter"] = lambda run: (0, {"jupyter": "/usr/local/bin/jupyter"}, "")
    jupyter.check_present(engine, "team/img:1", None)


def test_nothing_answers_on_a_closed_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert not jupyter.answers(port, timeout=0.5)


def _image_with(docker_client, base: str, tag: str, script: str) -> str:
    """`base` with /usr/local/bin/jupyter replaced by `script` (Python), built on the bed's engine."""
    import base64
    import io

    encoded = base64.b64encode(script.encode()).decode()
    dockerfile = (
        f"FROM {base}\nRUN echo {encoded} | base64 -d > /usr/local/bin/jupyter && chmod 755 /usr/local/bin/jupyter\n"
    )
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    return tag


REFUSES_ROOT = "#!/usr/bin/env python3\nimport sys\nprint('[C] Running as root is not recommended.', file=sys.stderr)\nsys.exit(1)\n"
SERVES = (
    "#!/usr/bin/env python3\nimport http.server\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    '        self.send_response(200); self.end_headers(); self.wfile.write(b\'{"version": "2.14.0"}\')\n'
    "http.server.HTTPServer(('0.0.0.0', 8888), H).serve_forever()\n"
)


@pytest.mark.alone
@pytest.mark.engine
def test_run_jupyter_on_the_bed_names_a_missing_jupyter_reports_one_that_exits_and_waits_for_one_that_serves(
    testbed, docker_client, tmp_path, unique
):
    base = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    config = tmp_path / "config.yaml"
    config.write_text("run:\n  ulimits: {memlock: 8388608}\n")
    env = {"IMGBUILD_CONFIG": str(config)}
    before = {c.id for c in docker_client.containers.list(all=True)}
    refusing = _image_with(docker_client, base, f"imgbuildtest/nb-refuses-{unique}:1", REFUSES_ROOT)
    serving = _image_with(docker_client, base, f"imgbuildtest/nb-serves-{unique}:1", SERVES)
    try:
        missing = run_cli("run", "--jupyter", "--no-workspace", base, cwd=tmp_path, env=env)
        assert missing.code == 2 and "has no `jupyter` on its PATH" in missing.err, missing.err
        assert missing.err.count("\n") == 1 and "http://" not in missing.out + missing.err
        exits = run_cli("run", "--jupyter", "--no-workspace", refusing, cwd=tmp_path, env=env)
        assert exits.code == 1 and "its container exited 1" in exits.err, exits.err
        assert "Running as root is not recommended" in exits.err and "http://" not in exits.out + exits.err
        assert {c.id for c in docker_client.containers.list(all=True)} == before, "nothing left behind"
        served = run_cli("run", "--jupyter", "--no-workspace", "--name", f"nb{unique}", serving, cwd=tmp_path,
                         env=env)  # fmt: skip
        assert served.code == 0 and "http://127.0.0.1:" in served.out + served.err, served.err
    finally:
        for container in docker_client.containers.list(all=True):
            if container.id not in before:
                container.remove(force=True)
        for tag in (refusing, serving):
            docker_client.images.remove(tag, force=True)
