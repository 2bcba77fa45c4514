"""Issue 28: `imgbuild doctor`, the host as a lab admin needs to see it. Its decisions run on recorded host
snapshots (a DGX with a vulnerable toolkit, a lab server with the nvidia default runtime and MIG, a V100 box on
a too-new driver, a CDI-only host); its reading runs on this machine, which has no GPU."""

from __future__ import annotations

import json

import pytest

from imgbuild.doctor import HostFacts, judge
from tests.conftest import run_cli

ENGINE = {"version": "27.5.1", "default_runtime": "runc", "runtimes": ["nvidia", "runc"], "cgroup_version": "2"}
DGX_H100 = HostFacts(
    driver="550.127.08",
    gpus=tuple({"index": i, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "mig": False} for i in range(8)),
    toolkit="1.17.3",
    engine=ENGINE,
    cdi_specs=("/etc/cdi/nvidia.yaml",),
    memlock=None,
    cgroup="v2",
    docker_group=("alice", "bob"),
)


def lines(facts: HostFacts) -> dict[str, tuple[str, str, str]]:
    """check -> (status, detail, fix) of the first line of each check (the ones with a fix, for the rest)."""
    out: dict[str, tuple[str, str, str]] = {}
    for line in judge(facts):
        if line.check not in out or line.status == "fail":
            out[line.check] = (line.status, line.detail, line.fix)
    return out


@pytest.mark.parametrize(
    "change, check, status, words",
    [
        ({}, "toolkit", "fail", "1.17.3 is vulnerable to CVE-2025-23266"),
        ({"toolkit": "1.17.7"}, "toolkit", "fail", "CVE-2025-23266"),
        ({"toolkit": "1.16.1"}, "toolkit", "fail", "CVE-2025-23266"),  # and CVE-2024-0132: the newest fix is named
        ({"toolkit": "1.17.8"}, "toolkit", "ok", "no known container escape"),
        ({"toolkit": "1.18.0"}, "toolkit", "ok", "1.18.0"),
        ({"toolkit": None}, "toolkit", "fail", "not installed: containers get no GPU"),
        ({}, "docker group", "warn", "2 user(s) in the docker group, each root on this host"),
        ({"docker_group": ()}, "docker group", "ok", "no user"),
        ({"engine": {**ENGINE, "default_runtime": "nvidia"}}, "default runtime", "warn", "sees every GPU"),
        ({"memlock": 8 * 2**20}, "memlock", "warn", "may lock 8 MiB"),
        ({}, "memlock", "ok", "without limit"),
        ({"cgroup": "v1"}, "cgroups", "warn", "cgroup v1"),
        ({}, "cgroups", "ok", "cgroup v2"),
        ({}, "driver", "ok", "550.127.08 (R550)"),
        ({}, "cdi", "ok", "/etc/cdi/nvidia.yaml"),
        ({"cdi_specs": ()}, "cdi", "info", "no CDI specs"),
        ({"engine": {"error": "Cannot connect to the Docker daemon"}}, "engine", "fail", "does not answer"),
        (
            {"driver": "590.44.01", "gpus": ({"index": 0, "name": "Tesla V100-SXM2-32GB", "capability": "7.0"},)},
            "gpus",
            "fail",
            "needs R580 at the latest; this is R590",
        ),
        (
            {"driver": "470.256.02", "gpus": ({"index": 0, "name": "NVIDIA L40S", "capability": "8.9"},)},
            "gpus",
            "fail",
            "needs R520 or later; this is R470",
        ),
        (
            {"gpus": ({"index": 0, "name": "NVIDIA A100", "capability": "8.0", "mig": True},)},
            "mig",
            "warn",
            "MIG is enabled on GPU 0",
        ),
        ({"gpu_error": "NVML: Unknown Error"}, "gpus", "fail", "cannot be read"),
        ({"driver": None, "toolkit": None, "gpus": ()}, "driver", "info", "no NVIDIA driver"),
        ({"driver": None, "toolkit": None, "gpus": ()}, "toolkit", "info", "no GPU here"),
    ],
)
def test_each_line_from_a_recorded_host(change, check, status, words):
    facts = HostFacts(**{**DGX_H100.__dict__, **change})
    found = lines(facts)
    assert check in found, found
    assert found[check][0] == status and words in found[check][1], found[check]
    if status in ("warn", "fail"):
        assert found[check][2], f"{check}: a {status} line says how to fix it"


@pytest.mark.engine
def test_doctor_on_this_machine(testbed):
    """This machine: no GPU (the GPU lines say so), the test bed's dockerd, its 8 MiB memlock, cgroup v1 hybrid."""
    res = run_cli("doctor", "--json")
    assert res.code == 0, res.out + res.err
    found = {line["check"]: line for line in json.loads(res.out)["lines"]}
    assert found["driver"]["status"] == "info" and "no NVIDIA driver" in found["driver"]["detail"]
    assert found["engine"]["status"] == "ok" and "runc" in found["engine"]["detail"]
    assert found["memlock"]["status"] == "warn"  # the machine facts: no memlock raise here
    assert found["cgroups"]["detail"].startswith("cgroup hybrid") or found["cgroups"]["status"] == "ok"
    table = run_cli("doctor")
    assert table.code == 0 and table.out.splitlines()[1].split()[:4] == ["check", "status", "detail", "fix"]
