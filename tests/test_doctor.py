"""`imgbuild doctor`, the host as a lab admin needs to see it. Its decisions run on recorded host
snapshots (a DGX with a vulnerable toolkit, a lab server with the nvidia default runtime and MIG, a V100 box on
a too-new driver, a CDI-only host); its reading runs on this machine, which has no GPU."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from imgbuild.servers.doctor import HostFacts, judge
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


@pytest.mark.alone
@pytest.mark.engine
def test_doctor_on_this_machine(testbed):
    """This machine: no GPU (the GPU lines say so), the test bed's dockerd, its 8 MiB memlock, cgroup v1 hybrid.
    Where the Python running this suite lies under a folder other users cannot enter (a venv made from root's own
    pyenv), doctor fails that one line, and only it."""
    res = run_cli("doctor", "--json")
    found = {line["check"]: line for line in json.loads(res.out)["lines"]}
    ways = (Path(sys.executable), Path(os.path.realpath(sys.executable)))
    closed = [folder for way in ways for folder in reversed(way.parents) if not os.stat(folder).st_mode & 0o001]
    failed = sorted(check for check, line in found.items() if line["status"] == "fail")
    assert failed == (["python"] if closed else []), res.out + res.err
    assert res.code == (1 if closed else 0), res.out + res.err
    if closed:
        assert str(closed[0]) in found["python"]["detail"], found["python"]
    assert found["driver"]["status"] == "info" and "no NVIDIA driver" in found["driver"]["detail"]
    assert found["engine"]["status"] == "ok" and "runc" in found["engine"]["detail"]
    assert found["memlock"]["status"] == "warn"  # the machine facts: no memlock raise here
    assert found["cgroups"]["detail"].startswith("cgroup hybrid") or found["cgroups"]["status"] == "ok"
    table = run_cli("doctor")
    assert table.code == res.code and table.out.splitlines()[1].split()[:4] == ["check", "status", "detail", "fix"]


@pytest.mark.parametrize(
    "env, toolkit, gpu_host, verdict",
    [
        (["PATH=/usr/bin"], "1.17.3", True, None),
        (["LD_PRELOAD=/usr/lib/libx.so"], "1.17.7", True, "fail"),
        (["LD_PRELOAD=/usr/lib/libx.so"], None, True, "fail"),  # a GPU host whose toolkit says nothing: refused
        (["LD_AUDIT=/x.so"], "1.17.3", True, "fail"),
        (["LD_PRELOAD=/usr/lib/libx.so"], "1.17.8", True, "warn"),
        (["LD_PRELOAD=/usr/lib/libx.so"], None, False, "warn"),  # no GPU host: no hook runs
    ],
)
def test_an_image_that_sets_ld_preload_is_refused_where_the_toolkit_would_run_it(env, toolkit, gpu_host, verdict):
    """NVIDIAScape (CVE-2025-23266): `run` and `smoke` refuse such an image on a vulnerable host."""
    from imgbuild.gpu.toolkit import preload_verdict

    found = preload_verdict(env, toolkit, gpu_host)
    assert (found[0] if found else None) == verdict
    if verdict == "fail":
        assert "CVE-2025-23266" in found[1] and "1.17.8" in found[1]


@pytest.mark.alone
@pytest.mark.engine
def test_run_and_smoke_of_an_image_that_sets_ld_preload(testbed, tmp_path, unique, cleanup_images, monkeypatch):
    """On the bed (no GPU, no toolkit): the image starts, with a note. On a GPU host with toolkit 1.17.7 (a
    stand-in nvidia-ctk on PATH; the engine told it has GPUs, as this machine has none) run and smoke refuse it."""
    import subprocess

    from imgbuild.config.settings import load_settings
    from imgbuild.engine import Engine
    from imgbuild.errors import ImgbuildError, UsageError
    from imgbuild.pipeline.smoke import SmokeRequest, run_smoke
    from imgbuild.servers.admission import check_preload

    base = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    image = f"imgbuildtest/preload-{unique}:1"
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {base}\nENV LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libm.so.6\n")
    built = subprocess.run(["docker", "build", "-q", "-t", image, str(context)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    cleanup_images.append(image)
    config = tmp_path / "config.yaml"  # this engine cannot raise memlock: the site lowers it, as README says
    config.write_text("run:\n  ulimits: {memlock: 8388608, stack: 67108864}\n")
    res = run_cli("run", image, "--", "true", env={"IMGBUILD_CONFIG": str(config)}, cwd=tmp_path)
    assert res.code == 0 and "sets LD_PRELOAD: it runs in every process" in res.err, res.err
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-ctk").write_text("#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.17.7'\n")
    (tools / "nvidia-ctk").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/local/bin:/usr/bin:/bin")
    engine = Engine.connect(testbed["IMGBUILD_DOCKER_CLI"])
    monkeypatch.setattr(engine, "host_has_gpus", lambda: True)
    with pytest.raises(UsageError, match=r"CVE-2025-23266.*1\.17\.8"):
        check_preload(image, engine)
    with pytest.raises(ImgbuildError, match="CVE-2025-23266"):
        run_smoke(engine, SmokeRequest(image, skip_gpu=True), load_settings({}))
    (tools / "nvidia-ctk").write_text("#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version 1.17.8'\n")
    assert "runs in every process" in check_preload(image, engine)  # patched toolkit: a note, not a refusal


def test_collect_reads_a_gpu_host_from_its_snapshot(tmp_path, monkeypatch):
    """collect() on a GPU host (the driver's version file and the GPUs faked: this machine has none): a MIG GPU's
    slices make one GPU line, and a V100 on R590 fails."""
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.fake import FakeEngine
    from imgbuild.gpu.read import Gpu
    from imgbuild.servers import doctor

    slices = [
        Gpu(0, f"MIG-{j}", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 0, 5120, None, [], "8.0", "590.44.01", "",
            "GPU-a", "1g.5gb")
        for j in range(2)
    ]  # fmt: skip
    volta = Gpu(1, "GPU-v", "Tesla V100-SXM2-32GB", 0, 32768, 0, [], "7.0", "590.44.01")
    snapshot = tmp_path / "gpus.json"
    snapshot.write_text(json.dumps({"gpus": [g.to_json() for g in [*slices, volta]]}))
    monkeypatch.setattr(doctor, "_driver_version", lambda: "590.44.01")
    facts = doctor.collect(load_settings({"gpu_snapshot": str(snapshot)}), FakeEngine().host_info())
    assert [g["index"] for g in facts.gpus] == [0, 1] and facts.gpus[0]["mig"] and not facts.gpus[1]["mig"]
    assert facts.gpus[0]["name"] == "NVIDIA A100-SXM4-40GB"
    found = lines(facts)
    assert found["mig"][0] == "warn" and found["gpus"][0] == "fail" and "R580 at the latest" in found["gpus"][1]


def _bus(root: Path, devices: list[tuple[str, str, str, str, str]]) -> Path:
    """A fake /sys/bus/pci/devices: (address, vendor, class, device id, bound driver or "")."""
    bus = root / "devices"
    drivers = root / "drivers"
    for address, vendor, kind, ident, driver in devices:
        (bus / address).mkdir(parents=True)
        (bus / address / "vendor").write_text(vendor + "\n")
        (bus / address / "class").write_text(kind + "\n")
        (bus / address / "device").write_text(ident + "\n")
        if driver:
            (drivers / driver).mkdir(parents=True, exist_ok=True)
            (bus / address / "driver").symlink_to(drivers / driver)
    return bus


def _lab(pci, gpus=1) -> HostFacts:
    listed = ({"index": 0, "name": "NVIDIA A100-SXM4-80GB", "capability": "8.0", "mig": False},) * gpus
    return HostFacts(
        driver="590.44.01", gpus=listed, toolkit="1.18.0", engine=ENGINE, memlock=None, cgroup="v2", pci_gpus=pci
    )


def test_doctor_names_the_gpus_a_driver_branch_dropped_by_address_and_device_id(tmp_path):
    """A lab that upgrades to R590 gets `gpus ok` for its A100s while its V100s vanish
    (R590 does not bind them, so nvidia-smi lists none). The PCI bus still has them."""
    from imgbuild.gpu.read import nvidia_pci_devices
    from imgbuild.servers.doctor import judge

    bus = _bus(
        tmp_path,
        [
            ("0000:07:00.0", "0x10de", "0x030200", "0x20b2", "nvidia"),  # an A100, driven
            ("0000:0f:00.0", "0x10de", "0x030200", "0x1db5", ""),  # a V100, not driven by R590
            ("0000:10:00.0", "0x10de", "0x040300", "0x10f1", "snd_hda_intel"),  # its audio function: not a GPU
            ("0000:11:00.0", "0x8086", "0x030000", "0x0bd5", "i915"),  # another vendor's display
        ],
    )
    pci = nvidia_pci_devices(str(bus))
    assert [(g.address, g.device, g.driver) for g in pci] == [
        ("0000:07:00.0", "0x20b2", "nvidia"),
        ("0000:0f:00.0", "0x1db5", ""),
    ]
    said = [line for line in judge(_lab(pci)) if line.check == "gpus" and line.status == "fail"]
    assert len(said) == 1 and "on the PCI bus: 0000:0f:00.0 (10de:1db5), that no driver binds" in said[0].detail
    assert "sm_70" in said[0].detail and "R580" in said[0].detail and said[0].fix
    assert not [line for line in judge(_lab(pci[:1])) if line.check == "gpus" and line.status == "fail"]


def test_a_gpu_passed_to_vms_or_fallen_off_the_bus_is_named_as_such_not_blamed_on_the_branch(tmp_path):
    from imgbuild.gpu.read import nvidia_pci_devices
    from imgbuild.servers.doctor import judge

    bus = _bus(
        tmp_path,
        [
            ("0000:07:00.0", "0x10de", "0x030200", "0x2330", "nvidia"),
            ("0000:08:00.0", "0x10de", "0x030200", "0x2330", "nvidia"),  # bound, but the driver lost it
            ("0000:09:00.0", "0x10de", "0x030200", "0x2330", "vfio-pci"),  # given to a VM
            ("0000:0a:00.0", "0x10de", "0x030000", "0x2684", "nouveau"),
        ],
    )
    lines = [line for line in judge(_lab(nvidia_pci_devices(str(bus)))) if line.check == "gpus"]
    text = "\n".join(f"{line.status} {line.detail} | {line.fix}" for line in lines)
    assert "info 1 GPU(s) passed to virtual machines (vfio-pci): 0000:09:00.0 (10de:2330)" in text
    assert "fail GPU 0000:0a:00.0 (10de:2684) is bound to nouveau" in text and "blacklist nouveau" in text
    assert "1 fell off the bus or failed to start" in text and "Xid 79" in text
    assert "no longer drives" not in text and "no driver binds" not in text


def test_a_sysfs_without_bindings_still_counts_gpus_the_driver_does_not_list(tmp_path):
    from imgbuild.gpu.read import PciGpu
    from imgbuild.servers.doctor import judge

    pci = (PciGpu("0000:07:00.0", "0x20b2", ""), PciGpu("0000:0f:00.0", "0x1db5", ""))
    said = [line for line in judge(_lab(pci)) if line.check == "gpus" and line.status == "fail"]
    assert len(said) == 1 and said[0].detail.startswith("1 NVIDIA GPU(s) on the PCI bus that no driver binds")


@pytest.mark.parametrize(
    "local, toolkit, config, status",
    [
        (True, "1.17.8", "", "warn"),  # a fixed toolkit here: said, not refused
        (True, "1.17.3", "", "fail"),
        (True, "1.17.3", "[features]\ndisable-cuda-compat-lib-hook = true\n", "warn"),  # NVIDIA's mitigation
        (True, "1.17.3", "[features]\ndisable-cuda-compat-lib-hook = false\n", "fail"),
        (True, "1.17.3", "[nvidia-container-cli]\ndisable-cuda-compat-lib-hook = true\n", "fail"),  # another table
        (False, "1.17.8", "", "fail"),  # a remote engine: this machine's toolkit says nothing of its host
    ],
)
def test_the_nvidiascape_check_reads_the_engines_host_not_this_machine(
    tmp_path, monkeypatch, local, toolkit, config, status
):
    """The check read this machine's toolkit for a remote engine's host (a patched
    local toolkit passed an image for a vulnerable remote host), and knew no mitigation."""
    from imgbuild.gpu import toolkit as module

    path = tmp_path / "config.toml"
    path.write_text(config)
    monkeypatch.setattr(module, "TOOLKIT_CONFIG", str(path))
    monkeypatch.setattr(module, "toolkit_version", lambda: toolkit)
    verdict = module.image_preload_verdict(["LD_PRELOAD=/opt/x.so"], lambda: True, local=local)
    assert verdict is not None and verdict[0] == status, verdict
