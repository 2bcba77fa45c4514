"""GPU truth without a GPU: the kernel and driver rules, the smoke script's decisions on recorded device
profiles, and the pipeline's use of them (fleet refusal, GPU hosts that must use their GPUs).

Each smoke-review bug has a case here named after it; the device profiles and their
sources are in tests/data/gpu-profiles.json.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import types
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgbuild.config.settings import load_settings
from imgbuild.errors import ImgbuildError, UsageError
from imgbuild.gpu.fleet import GpuFacts, driver_verdict, host_target, judge, judge_tag, parse_target, parse_targets
from imgbuild.gpu.matrix import NGC_RELEASES_FACTS, NgcRelease
from imgbuild.gpu.support import SUPPORT
from imgbuild.payload.probes import SMOKE, Probe
from imgbuild.payload.smoke import amp as smoke_amp
from imgbuild.payload.smoke import arch as smoke_arch
from imgbuild.payload.smoke import budget as smoke_budget
from imgbuild.payload.smoke import collectives as smoke_collectives
from imgbuild.payload.smoke import compiling as smoke_compiling
from imgbuild.payload.smoke import cuda as smoke_cuda
from imgbuild.payload.smoke import cudnn as smoke_cudnn
from imgbuild.payload.smoke import fp8 as smoke_fp8
from imgbuild.payload.smoke import libraries as smoke_libraries
from imgbuild.payload.smoke import main as smoke_main
from imgbuild.payload.smoke import pipcheck as smoke_pipcheck
from imgbuild.payload.smoke import report as smoke_report
from imgbuild.payload.smoke import runners as smoke_runners
from imgbuild.payload.smoke import throughput as smoke_throughput
from imgbuild.payload.smoke import versions as smoke_versions
from tests.support import fake_inspect

PRINT = Probe("test", "print()", "TEST ")

DATA = Path(__file__).parent / "data"
PROFILES = json.loads((DATA / "gpu-profiles.json").read_text())["profiles"]
NGC_2405 = "5.2 6.0 6.1 7.0 7.2 7.5 8.0 8.6 8.7 9.0+PTX"
NGC_2510 = "8.0 8.6 9.0 10.0 11.0 12.0+PTX"
NGC_2607 = "7.5 8.0 8.6 9.0 10.0 12.0+PTX"
TORCH_CU130 = "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120"  # torch 2.13.0+cu130's own arch flags


def _recorded_lists() -> dict[tuple[int, int], set[int]]:
    """Each recorded NVIDIA_REQUIRE_CUDA string's release and its brand=tesla branches."""
    lists = {}
    for text in (DATA / "nvidia_require_cuda.txt").read_text().splitlines():
        found = re.match(r"NVIDIA_REQUIRE_CUDA=cuda>=([0-9]+)\.([0-9]+) ", text)
        if found:
            tesla = {int(b) for b in re.findall(r"brand=tesla,driver>=([0-9]+),driver<[0-9]+", text)}
            lists[(int(found.group(1)), int(found.group(2)))] = tesla
    return lists


RECORDED = _recorded_lists()


# --- the kernel rule (bug 3.3) -------------------------------------------------------------------------

KERNELS = [
    # (archs, capability, how) -- how: sass (native), ptx (JIT), none
    # PyTorch's iGPU/dGPU exclusions (5.3, 6.2, 7.2, 8.7, 10.1)
    ("sm_70", (7, 2), "none"),
    ("sm_72", (7, 5), "none"),
    ("sm_80 sm_86", (8, 7), "none"),
    ("sm_87", (8, 9), "none"),
    ("sm_100", (10, 1), "none"),
    ("sm_50 sm_52", (5, 3), "none"),
    ("sm_60 sm_61", (6, 2), "none"),
    ("sm_101", (11, 0), "sass"),
    ("sm_72 sm_87", (8, 7), "sass"),  # Orin's own
    ("7.2 8.7", (7, 5), "none"),  # a Jetson-targeted list on a T4
    ("7.2 8.7", (8, 9), "none"),  # ... and on an L40S
    (NGC_2405, (8, 9), "sass"),  # L4 / L40S / RTX 4090: sm_86 SASS runs on 8.9 (bug 3.3: was a fail)
    (NGC_2405, (8, 0), "sass"),
    (NGC_2405, (7, 0), "sass"),
    (NGC_2405, (10, 0), "ptx"),  # B200 on 24.05: only compute_90 PTX
    (NGC_2607, (10, 3), "sass"),  # B300: sm_100 SASS runs on 10.3 (bug 3.3: was a fail)
    (NGC_2607, (7, 0), "none"),  # V100 on a CUDA 13 image: no kernels
    (NGC_2510, (7, 5), "none"),  # T4 on 25.10
    (NGC_2510, (12, 1), "sass"),  # GB10: sm_120 on 12.1
    (TORCH_CU130, (8, 9), "sass"),
    (TORCH_CU130, (7, 0), "none"),
    ("sm_80 sm_90a compute_120f", (9, 0), "sass"),  # suffixed entries parse (bug 3.3: was a crash)
    ("sm_80 sm_90a compute_120f", (10, 0), "none"),  # sm_90a runs on 9.0 only; no PTX at or below 10.0
    ("sm_80 sm_90a compute_120f", (12, 1), "ptx"),  # family PTX: 12.x from 12.0
    ("sm_80 compute_90a", (10, 0), "none"),  # arch-specific PTX is not forward compatible
    ("sm_80 compute_80", (9, 0), "ptx"),
    ("7.5;8.0;9.0a;10.0f", (10, 3), "sass"),  # semicolons, suffixes in TORCH_CUDA_ARCH_LIST form
    ("Ampere sm_xx 8.0", (8, 6), "sass"),  # unknown words are left out, not crashed on
    ("", (9, 0), "none"),
]


@pytest.mark.parametrize(("archs", "capability", "how"), KERNELS)
def test_which_kernels_run_on_which_gpu(archs, capability, how):
    assert smoke_arch.kernels_for(archs, capability)[0] == how


class FakeCuda:
    """The slice of torch the arch check reads, for one visible GPU."""

    def __init__(self, archs: str, capability: tuple[int, int]):
        self.archs, self.capability = archs.split(), capability

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def get_device_capability(self, i: int = 0) -> tuple[int, int]:
        return self.capability

    def get_device_name(self, i: int = 0) -> str:
        return f"a GPU of sm_{self.capability[0]}{self.capability[1]}"

    def get_arch_list(self) -> list[str]:
        return self.archs


def fake_torch(archs: str, capability: tuple[int, int], **extra) -> types.SimpleNamespace:
    return types.SimpleNamespace(cuda=FakeCuda(archs, capability), _C=types.SimpleNamespace(), **extra)


@pytest.mark.parametrize(
    ("archs", "capability", "status"),
    [
        ("sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90 compute_90", (8, 9), "pass"),  # was: fail (L40S)
        ("sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120", (10, 3), "pass"),  # was: fail (B300)
        ("sm_80 sm_90a sm_100 compute_120f", (9, 0), "pass"),  # was: ValueError on compute_120f
        ("sm_80 sm_86 sm_90 compute_90", (10, 0), "warn"),  # PTX only: runs, slowly at first
        ("sm_80 sm_86 sm_90 sm_100 sm_120", (7, 0), "fail"),  # V100 on a CUDA 13 build
    ],
)
def test_the_in_image_arch_check_follows_the_rule(archs, capability, status):
    report = smoke_report.Report()
    report.run("cuda arch", smoke_cuda.torch_arch, fake_torch(archs, capability))
    assert report.checks[-1]["status"] == status, report.checks[-1]


# --- the driver rule -----------------------------------------------------------------------------------

DRIVERS = [
    # (cuda, driver, datacenter, ok, words in the reason)
    ((13, 0), "580.95.05", True, True, "580.65.06"),
    ((13, 1), "580.95.05", True, True, "minor-version compatibility"),
    # CUDA 13 on the data-center branches NVIDIA's own images declare (tests/data/nvidia_require_cuda.txt)
    ((13, 0), "570.124.06", True, True, "forward compatibility"),
    ((13, 0), "535.104.05", True, True, "forward compatibility"),
    ((13, 0), "575.57.08", True, True, "forward compatibility"),
    ((13, 0), "570.124.06", False, False, "data-center GPUs only"),  # a GeForce on R570: no forward compatibility
    ((13, 0), "560.35.03", True, False, "older than 580.65.06"),  # R560 is not among the declared branches
    ((13, 0), "545.29.06", True, False, "older than 580.65.06"),
    ((13, 0), "530.30.02", True, False, "older than 580.65.06"),
    ((12, 4), "535.104.05", None, True, "minor-version compatibility"),
    ((12, 4), "470.57.02", True, True, "forward compatibility"),  # NGC 24.05 notes: R470.57+ on data center
    ((12, 4), "470.57.02", None, True, "if this is a data-center GPU"),
    ((12, 4), "470.57.02", False, False, "data-center GPUs only"),  # a GeForce has no forward compatibility
    ((12, 4), "470.42.01", True, False, "older than 525.60.13"),
    ((12, 8), "545.23.08", None, True, "minor-version compatibility"),
    ((12, 8), "470.57.02", True, True, "forward compatibility"),
    ((11, 8), "450.80.02", None, True, "minor-version compatibility"),
    ((11, 0), "450.51.06", None, True, ">= 450.51.05"),  # CUDA 11.0.3 on its own driver
    ((11, 1), "450.51.06", None, False, "older than 450.80.02"),  # below the 11.x minor-version floor
    # each release's own forward-compatibility list: branches NVIDIA dropped run nothing newer
    ((12, 9), "470.256.02", True, False, "older than 525.60.13"),
    ((13, 1), "565.57.01", True, False, "older than 580.65.06"),
    ((13, 2), "550.127.05", True, False, "older than 580.65.06"),
    ((13, 2), "575.57.08", True, False, "older than 580.65.06"),
    ((13, 2), "570.124.06", True, True, "forward compatibility"),
    ((13, 1), "575.57.08", True, True, "forward compatibility"),
]


@pytest.mark.parametrize(("cuda", "driver", "datacenter", "ok", "words"), DRIVERS)
def test_driver_against_the_image_cuda(cuda, driver, datacenter, ok, words):
    verdict, reason = driver_verdict(cuda, driver, datacenter)
    assert verdict is ok and words in reason, reason


def test_forward_compatible_branches_are_the_ones_nvidias_own_images_declare():
    """NVIDIA_REQUIRE_CUDA of each recorded nvidia/cuda image (12.8.1, 13.0.2) lists, per brand, the driver
    branches a container of that CUDA release runs on besides its own (the forward-compatible ones).
    imgbuild's support table must say exactly those for that release."""
    assert len(RECORDED) >= 5
    for cuda, tesla in RECORDED.items():
        assert sorted(tesla) == [int(v.split(".")[0]) for v in SUPPORT.forward_branches(cuda)], cuda


def test_a_fleet_is_judged_per_gpu_from_the_image_facts():
    facts = GpuFacts("25.10", "13.0", TORCH_CU130, "test")
    verdicts = {v.target: v for v in judge(facts, parse_targets("v100,t4,l40s,b300,sm_121"), "580.95.05")}
    assert not verdicts["v100"].runs and "no kernels" in verdicts["v100"].reason
    assert all(verdicts[k].runs for k in ("t4", "l40s", "b300", "sm_121"))
    forward = judge(facts, parse_targets("h100"), "570.124.06")[0]  # a DGX H100 on R570: forward compatibility
    assert forward.runs and "forward compatibility" in forward.reason
    old_driver = judge(facts, parse_targets("h100"), "560.35.03")[0]
    assert not old_driver.runs and "older than 580.65.06" in old_driver.reason
    cpu = judge(GpuFacts("cpu", "", "", "test"), parse_targets("h100"), None)[0]
    assert not cpu.runs and "no CUDA build" in cpu.reason


HOSTILE_TARGETS = ["", " ", "sm_", "sm_8", "8.9.1", "h100; rm -rf /", "h100\nFROM x", "x" * 5000, "sm_899", "9", "-1.0"]


def test_a_jetson_on_its_own_jetpack_driver_runs_what_that_jetpack_ships_and_no_newer_major():
    cuda13 = GpuFacts("25.10", "13.0", "8.7 11.0", "test")
    thor = judge(cuda13, parse_targets("thor"), "580.00")[0]
    assert thor.runs and "JetPack's for CUDA 13.0" in thor.reason
    orin = judge(GpuFacts("24.10", "12.6", "8.7", "test"), parse_targets("orin"), "540.3.0")[0]
    assert orin.runs and "minor-version compatibility" in orin.reason  # JetPack 6.0 (12.2) runs 12.6's SASS
    assert not judge(cuda13, parse_targets("orin"), "540.4.0")[0].runs
    desktop = judge(cuda13, parse_targets("h100"), "580.00")[0]  # no Jetson: 580.00 is a desktop number there
    assert not desktop.runs and "older than 580.65.06" in desktop.reason


@pytest.mark.parametrize(
    "name, capability, model, datacenter",
    [
        ("NVIDIA GeForce RTX 4090", (8, 9), "rtx4090", False),
        ("NVIDIA H100 80GB HBM3", (9, 0), "h100", True),
        ("Tesla V100-SXM2-16GB", (7, 0), "v100", True),
        ("NVIDIA L40S", (8, 9), "l40s", True),
        ("NVIDIA A100-SXM4-80GB", (8, 0), "a100", True),
        ("NVIDIA Thor", (11, 0), "thor", True),
        ("NVIDIA H100 80GB HBM3", (8, 0), "", None),  # a name at another capability is no match
        ("Some Future GPU", (13, 0), "", None),
        ("NVIDIA GeForce RTX 9090", (13, 0), "", False),  # a consumer card the table does not know yet
    ],
)
def test_the_hosts_gpus_carry_their_models_facts(name, capability, model, datacenter):
    target = host_target(name, f"{capability[0]}.{capability[1]}")
    assert target is not None
    assert (target.model, target.datacenter) == (model, datacenter)
    assert target.label == f"this host's {name}"


def test_a_geforce_host_on_r570_is_not_promised_cuda_13():
    facts = GpuFacts("25.10", "13.0", "8.9", "test")
    target = host_target("NVIDIA GeForce RTX 4090", "8.9")
    assert target is not None
    verdict = judge(facts, [target], "570.124.06")[0]
    assert not verdict.runs and "data-center GPUs only" in verdict.reason


@pytest.mark.parametrize("word", HOSTILE_TARGETS)
def test_hostile_gpu_names_are_usage_errors(word):
    with pytest.raises(UsageError) as err:
        parse_targets(word) if not word.strip() else parse_target(word)
    assert len(str(err.value)) < 400 and "\n" not in str(err.value)


def test_model_names_are_forgiving_about_case_and_dashes():
    assert parse_target("RTX-4090").capability == (8, 9) and parse_target("GH200").capability == (9, 0)
    assert parse_target("sm_103").capability == (10, 3) and parse_target("12.1").capability == (12, 1)
    assert [t.label for t in parse_targets(["v100,a100", "v100"])] == ["v100", "a100"]


# --- decisions on recorded device profiles (bugs 3.5, 3.6) ---------------------------------------------


@pytest.mark.parametrize("profile", PROFILES, ids=[p["name"] for p in PROFILES])
def test_smoke_decisions_on_recorded_device_profiles(profile):
    capability = tuple(profile["capability"])
    status, ratio, floor = smoke_throughput.speed_verdict(capability, profile["fp32"], profile["half"])
    assert status == profile["verdict"], (ratio, floor)
    assert smoke_arch.bf16_usable(capability) is profile["bf16"]  # bug 3.5: never on V100/T4 (emulated)
    archs = profile["image"].split(": ", 1)[1]
    assert smoke_arch.kernels_for(archs, capability)[0] == profile.get("kernels", "sass")


def test_speed_fails_only_where_no_tensor_core_can_be_in_use():
    """Bug 3.6: between the non-tensor-core ratio (4x) and the architecture's floor is a warning."""
    assert smoke_throughput.speed_verdict((9, 0), 52, 330)[0] == "warn"  # 6.3x on a shared H100: was a fail
    assert smoke_throughput.speed_verdict((9, 0), 52, 150)[0] == "fail"  # 2.9x: no tensor core gives that
    assert smoke_throughput.speed_verdict((9, 0), 404, 790)[0] == "fail"  # TF32 measured as fp32 (bug 3.7's symptom)
    assert smoke_throughput.speed_verdict((6, 0), 9, 18)[0] == "pass"  # Pascal: no tensor cores, no floor
    assert smoke_throughput.speed_verdict((9, 0), 52, 784, override="100")[0] == "fail"  # an explicit floor is hard
    assert smoke_throughput.speed_floor((10, 3)) == 8.0 and smoke_throughput.speed_floor((12, 1)) == 2.5
    assert (
        smoke_throughput.speed_floor((11, 0)) == 2.5 and smoke_throughput.speed_floor((13, 0)) == 2.5
    )  # an unknown newer GPU


def test_amp_uses_the_scaler_this_torch_has():
    """Bug 3.4: torch 2.2 (NGC 24.01 and older) has no torch.amp.GradScaler."""
    made = []
    old = types.SimpleNamespace(
        amp=types.SimpleNamespace(),
        cuda=types.SimpleNamespace(amp=types.SimpleNamespace(GradScaler=lambda: made.append("cuda.amp") or "old")),
    )
    assert smoke_amp.grad_scaler(old) == "old" and made == ["cuda.amp"]
    new = types.SimpleNamespace(amp=types.SimpleNamespace(GradScaler=lambda device: f"amp:{device}"))
    assert smoke_amp.grad_scaler(new) == "amp:cuda"


@pytest.mark.parametrize(
    ("have", "want", "same"),
    [
        ("2.4.0a0+07cecf4168", "2.4.0a0+07cecf4168", True),
        ("1.10.2", "v1.10.2", True),  # bug 3.8: a leading v is not part of the version
        ("2.12.1", "2.12.*", True),  # bug 3.8: a wildcard is a prefix
        ("2.13.0+cu130", "2.13.0", True),  # no local part wanted: the public version decides
        ("2.13.0", "2.13", False),
        ("2.5.1", "2.4.0a0+07cecf4168", False),  # pip replaced NGC's torch (the vLLM case)
        # The env's local part is not the module's (NGC 25.10: 2.9.0a0+145a3a7 against
        # 2.9.0a0+145a3a7bda.nv25.10): it proves nothing either way; the image's record of the base does.
        ("2.9.0a0+145a3a7bda.nv25.10", "2.9.0a0+145a3a7", True),
        ("2.4.0a0+other", "2.4.0a0+07cecf4168", True),
        ("2.11.0", "2.1*", True),
    ],
)
def test_framework_versions_compare_as_versions(have, want, same):
    assert smoke_versions.same_version(have, want) is same


def test_pip_check_fails_only_on_what_the_recipe_added(tmp_path, monkeypatch):
    """Bug 3.9: a problem the base already had is reported, not failed on."""
    base_line = "ngc-thing 1.0 has requirement numpy<2, but you have numpy 2.1."
    new_line = "mylib 0.1 requires torch, which is not installed."
    baseline = tmp_path / "pip-check.base"
    monkeypatch.setattr(smoke_pipcheck, "PIP_CHECK_BASELINE", str(baseline))

    def pip_check(lines):
        out = "\n".join(lines) + "\n" if lines else "No broken requirements found.\n"
        fake = types.SimpleNamespace(returncode=1 if lines else 0, stdout=out, stderr="")
        monkeypatch.setattr(subprocess, "run", lambda *a, **k: fake)
        report = smoke_report.Report()
        report.run("pip check", smoke_pipcheck.check_pip)
        return report.checks[-1]

    baseline.write_text(base_line + "\n")
    assert pip_check([base_line])["status"] == "pass"
    added = pip_check([base_line, new_line])
    assert added["status"] == "fail" and new_line in added["reason"] and base_line not in added["reason"]
    baseline.unlink()  # an image imgbuild did not build: nothing says which layer broke it
    assert pip_check([base_line])["status"] == "warn"
    assert pip_check([])["status"] == "pass"


def test_tf32_is_turned_off_even_where_the_image_turns_it_on(monkeypatch):
    """Bug 3.7: NGC sets TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1; a default would leave it on."""
    seen = {}
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "1")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "")  # recorded: main() sets it for the process it is
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
    monkeypatch.setitem(smoke_runners.RUNNERS, "pytorch", lambda report, libraries_only: seen.update(dict(os.environ)))
    smoke_main.main(["--framework", "pytorch", "--format", "table"])
    assert seen["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "0" and seen["NVIDIA_TF32_OVERRIDE"] == "0"


def test_tf_conv_tolerance_is_relative():
    """Bug 3.7 (TensorFlow): outputs of about +-50 in fp32 differ by more than an absolute 1e-3 allows."""
    assert smoke_cudnn.conv_within_tolerance(4e-4, 50.0)
    assert not smoke_cudnn.conv_within_tolerance(5e-2, 50.0)  # TF32's error on such outputs
    # 1e-4, room for Winograd/FFT convs TF's autotuner may pick; TF32 still refused
    assert smoke_cudnn.conv_within_tolerance(2e-5, 1.0) and smoke_cudnn.conv_within_tolerance(9e-5, 1.0)
    assert not smoke_cudnn.conv_within_tolerance(1e-3, 1.0)  # TF32's error on unit outputs


@pytest.mark.parametrize(
    "message, shown",
    [
        (
            "CUDA initialization: The NVIDIA driver on your system is too old (found version 12020). Please update",
            "driver on your system is too old (found version 12020)",
        ),
        (
            "CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 804: forward compatibility "
            "was attempted on non supported HW",
            "Error 804: forward compatibility was attempted on non supported HW",
        ),
        ("CUDA initialization: Error 802: system not yet initialized", "Error 802: system not yet initialized"),
        (None, None),
    ],
)
def test_why_cuda_failed_is_kept(message, shown):
    """Is_available() False became "no GPU visible"; torch's reason, in a warning,
    was lost, so "the driver is too old" and error 804 on a GeForce read as "no GPU"."""
    import warnings

    def is_available():
        if message:
            warnings.warn(message, UserWarning, stacklevel=1)
        return False

    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=is_available))
    report = smoke_report.Report()
    report.run("cuda", smoke_cuda.torch_cuda, torch)
    (entry,) = report.checks
    assert entry["status"] == "skip" and entry["reason"].startswith("no GPU visible")
    assert (shown in entry["reason"]) if shown else entry["reason"] == "no GPU visible"


# --- settings and recipes: a declared fleet -------------------------------------------------------------


def test_a_fleet_in_the_config_and_in_a_recipe(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text('fleet:\n  gpus: [v100, h100]\n  driver: "535.104.05"\n')
    settings = load_settings(environ={"IMGBUILD_CONFIG": str(config)})
    assert settings.fleet_gpus == ("v100", "h100") and settings.fleet_driver == "535.104.05"
    config.write_text("fleet:\n  gpus: [v100, quantum9000]\n")
    with pytest.raises(UsageError, match=r"config.yaml:2:16: fleet.gpus\[1\]: 'quantum9000' is not a GPU"):
        load_settings(environ={"IMGBUILD_CONFIG": str(config)})
    config.write_text("fleet:\n  driver: latest\n")
    with pytest.raises(UsageError, match=r"config.yaml:2:11: fleet.driver: 'latest' is not an NVIDIA driver version"):
        load_settings(environ={"IMGBUILD_CONFIG": str(config)})
    config.write_text("fleet: [v100]\n")
    with pytest.raises(UsageError, match=r"config.yaml:1:8: fleet: must be a mapping"):
        load_settings(environ={"IMGBUILD_CONFIG": str(config)})


def test_a_recipe_with_an_unknown_gpu_target_names_its_line(tmp_path):
    from tests.conftest import run_cli

    (tmp_path / ".git").mkdir()
    recipe = tmp_path / "r.yaml"
    recipe.write_text('name: r\nbase: {framework: pytorch, tag: "24.05"}\nsmoke:\n  targets: [h100, h1000]\n')
    result = run_cli("validate", str(recipe))
    assert result.code == 2 and "r.yaml:4" in result.err and "smoke.targets" in result.err
    assert "Traceback" not in result.err


# --- the pipeline on the in-memory engine: GPU hosts and fleets -----------------------------------------

from imgbuild.engine.fake import FakeEngine  # noqa: E402
from imgbuild.errors import SmokeFailed  # noqa: E402
from imgbuild.pipeline import build as pipeline  # noqa: E402
from imgbuild.pipeline.build import BuildJob  # noqa: E402
from imgbuild.pipeline.plan import make_plan  # noqa: E402
from imgbuild.pipeline.smoke import ClaimsOf, QuotaCheck  # noqa: E402
from imgbuild.recipe import load_recipe  # noqa: E402

TARGET = "alice/demo:v1"
CUDA13 = {"cuda": "13.0", "arch_list": TORCH_CU130.split()}
CUDA124 = {"cuda": "12.4", "arch_list": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "compute_90"]}


def _recipe(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / ".git").mkdir(exist_ok=True)
    path = tmp_path / "demo.yaml"
    path.write_text('name: demo\ntag: v1\nbase: {framework: pytorch, tag: "24.05"}\nenv: {A: "1"}\n' + extra)
    return path


def _build(
    tmp_path: Path,
    engine: FakeEngine,
    extra: str = "",
    skip_gpu: bool = False,
    claims: ClaimsOf | None = None,
    quota: QuotaCheck | None = None,
    **flags,
):
    settings = load_settings({"user": "alice", "ngc_registry": "registry.test:5000", **flags})
    recipe = _recipe(tmp_path, extra)
    plan = make_plan(load_recipe(recipe), settings, fake_inspect)
    job = BuildJob(plan.loaded, skip_gpu=skip_gpu, out=tmp_path / "ctx", claims=claims, quota=quota, planned=plan)
    return pipeline.build_platforms(job, settings, engine).own()


def _snapshot(tmp_path: Path, driver: str = "") -> str:
    from tests.support import server

    path = tmp_path / "snap.json"
    gpus = [g.to_json() for g in server("dgx-a100")]
    for gpu in gpus if driver else []:
        gpu["driver"] = driver
    path.write_text(json.dumps({"gpus": gpus}))
    return str(path)


def test_a_gpu_host_whose_engine_cannot_pass_gpus_never_promotes(tmp_path):
    """Bug 3.1: no toolkit / old driver / error 804 skipped every GPU check and promoted the image."""
    engine = FakeEngine(gpus=True)
    engine.containers.meta = CUDA124
    engine.containers.gpu_note = "the host has GPUs but the engine cannot pass them (could not select device driver)"
    with pytest.raises(SmokeFailed, match="gpu access: the host has GPUs but the engine cannot pass them"):
        _build(tmp_path, engine, gpu_snapshot=_snapshot(tmp_path))
    assert engine.images.image_id(TARGET) is None and engine.images.image_id(f"{TARGET}-candidate") is None
    assert "--require-gpu" in engine.containers.runs[-1]["args"]  # a GPU host requires its GPUs
    # Skipping the GPU half on a GPU host takes an explicit flag.
    result = _build(tmp_path, engine, skip_gpu=True, gpu_snapshot=_snapshot(tmp_path))
    assert result.promoted and engine.containers.runs[-1]["gpus"] is None


def _cuda13() -> FakeEngine:
    engine = FakeEngine(gpus=True)
    engine.containers.meta = CUDA13
    return engine


def test_a_gpu_host_is_part_of_the_fleet_by_default(tmp_path):
    """The host's own GPUs and driver are judged with the declared fleet. The DGX's A100s on R535 run a CUDA 13
    image through forward compatibility (a branch NVIDIA's CUDA 13 images declare): the image whose smoke test
    passed on that very GPU is promoted. On R560, a branch they do not declare, it is not."""
    engine = FakeEngine(gpus=True)
    engine.containers.meta = CUDA13
    result = _build(tmp_path, engine, gpu_snapshot=_snapshot(tmp_path))
    assert result.promoted
    with pytest.raises(SmokeFailed, match="this host's NVIDIA A100-SXM4-40GB: .*older than 580.65.06"):
        _build(tmp_path, _cuda13(), gpu_snapshot=_snapshot(tmp_path, "560.35.03"))


def test_the_smoke_test_gets_the_gpus_run_would_pick_by_uuid_and_the_run_settings(tmp_path, monkeypatch):
    """Bug 3.6: count=-1 gave every GPU and tested cuda:0, maybe another user's. Bug 3.10: root, 1 GB shm."""
    engine = FakeEngine(gpus=True)
    engine.containers.meta = CUDA124
    _build(tmp_path, engine, gpu_snapshot=_snapshot(tmp_path))
    run = engine.containers.runs[-1]
    # the DGX snapshot: GPUs 0 and 1 are other users', 2 is idle -> the first free one, by UUID
    assert run["gpus"] == ["GPU-1f3e5d7c-9b8a-4c6d-2e1f-0a9b8c7d6e5f"]
    assert run["ipc"] == "host" and run["shm_size"] is None  # what `imgbuild run` gives by default
    config = tmp_path / "config.yaml"
    config.write_text("run:\n  shm_size: 16g\n")
    monkeypatch.setenv("IMGBUILD_CONFIG", str(config))
    _build(tmp_path, engine, gpu_snapshot=_snapshot(tmp_path))
    assert engine.containers.runs[-1]["shm_size"] == "16g" and engine.containers.runs[-1]["ipc"] is None


def test_a_build_is_not_promoted_when_the_declared_fleet_cannot_run_it(tmp_path):
    engine = FakeEngine()
    engine.containers.meta = CUDA13
    with pytest.raises(SmokeFailed, match="fleet: cannot run on v100: sm_70: no kernels"):
        _build(tmp_path, engine, "smoke: {targets: [v100, h100]}\n")
    assert engine.images.image_id(TARGET) is None
    # the site's fleet and driver count too: R560 cannot run CUDA 13 (R570 can, by forward compatibility; a
    # GeForce on R570 cannot)
    with pytest.raises(SmokeFailed, match="driver 560.35.03 is older than 580.65.06"):
        _build(tmp_path, engine, fleet_gpus="h100", fleet_driver="560.35.03")
    with pytest.raises(SmokeFailed, match="forward compatibility .*works on data-center GPUs only"):
        _build(tmp_path, engine, fleet_gpus="rtx4090", fleet_driver="570.124.06")
    assert _build(tmp_path, engine, fleet_gpus="h100", fleet_driver="570.124.06").promoted
    result = _build(tmp_path, engine, "smoke: {targets: [t4, l40s, b300]}\n", fleet_driver="580.95.05")
    assert result.promoted and result.smoke and result.smoke.checks[-1]["status"] == "pass"


def test_bump_never_moves_to_a_tag_the_fleet_cannot_run(tmp_path):
    from imgbuild.ci.bump import bump

    path = tmp_path / "r.yaml"
    path.write_text('name: lab\nbase: {framework: pytorch, tag: "25.02", follow: latest}\nsmoke: {targets: [v100]}\n')
    tags = ["25.02-py3", "25.06-py3", "25.10-py3", "25.12-py3"]
    cuda13 = {"25.10-py3", "25.12-py3"}

    def fits(framework, tag, targets):
        assert targets == ["v100"]
        return (tag not in cuda13, "v100: sm_70: no kernels for this GPU")

    moved = bump([path], tags_for=lambda fw: tags, fits=fits)[0]
    assert moved.newest == "25.06-py3" and moved.changed and 'tag: "25.06"' in path.read_text()
    assert moved.held_back == [
        "25.12-py3: v100: sm_70: no kernels for this GPU",
        "25.10-py3: v100: sm_70: no kernels for this GPU",
    ]
    stuck = bump([path], tags_for=lambda fw: tags, fits=fits)[0]
    assert not stuck.changed and stuck.newest == "25.06-py3" and len(stuck.held_back) == 2


# --- the Docker container runner, against a client that fails the way moby does (bug 3.2) --------------


class _Container:
    message = 'could not select device driver "" with capabilities: [[gpu]]'

    def __init__(self, log: list, fail_start: bool):
        self.log, self.fail_start = log, fail_start

    def put_archive(self, path, data):
        self.log.append("copy")

    def start(self):
        from docker.errors import APIError

        self.log.append("start")
        if self.fail_start:
            raise APIError("500", explanation=self.message)

    def wait(self, timeout):
        return {"StatusCode": 0}

    def logs(self, stdout, stderr):
        return SMOKE.says({}).encode() if stdout else b""

    def remove(self, force):
        self.log.append("remove")

    def kill(self):
        self.log.append("kill")


class _Client:
    """Moby applies device requests when the container starts, not when it is created."""

    def __init__(self):
        self.log: list = []
        self.created: list = []
        self.images = types.SimpleNamespace(get=lambda ref: types.SimpleNamespace(id="sha256:x", attrs={"Config": {}}))
        self.containers = types.SimpleNamespace(create=self._create, list=lambda **kw: [])

    def _create(self, image, command, device_requests=None, **kwargs):
        self.created.append({"device_requests": device_requests, **kwargs})
        return _Container(self.log, fail_start=bool(device_requests))


def test_a_start_error_for_gpus_falls_back_without_them_and_says_why():
    from imgbuild.engine.containers import DockerContainers
    from imgbuild.engine.images import DockerImages

    client = _Client()
    runner = DockerContainers(client, DockerImages(client))
    code, output, note = runner.run_script("img", PRINT, [], {}, gpus=["GPU-1"], ipc="host", as_user=None)
    assert code == 0 and "cannot pass them" in note and "could not select device driver" in note
    # three tries: the legacy request, then the same GPU by CDI name, then none; each container removed after
    first, cdi, second = client.created
    assert client.log.count("start") == client.log.count("remove") == len(client.created)
    assert first["device_requests"][0]["DeviceIDs"] == ["GPU-1"] and second["device_requests"] is None
    assert cdi["device_requests"][0]["Driver"] == "cdi" and cdi["device_requests"][0]["DeviceIDs"] == [
        "nvidia.com/gpu=GPU-1"
    ]
    assert "nvidia-ctk cdi generate" in note
    assert "user" not in first and first["ipc_mode"] == "host"  # bug 3.10: the image's user, run's IPC
    assert "org.imgbuild.started-by" in first["labels"]  # a killed run's container is swept by the next
    # the GPUs asked for are named; where the default runtime is nvidia, no device request still meant NGC's
    # NVIDIA_VISIBLE_DEVICES=all, hidden in the fallback without GPUs
    assert first["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
    assert second["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_a_script_without_gpus_sees_none_even_where_the_default_runtime_is_nvidia():
    """`--skip-gpu` (gpus=None) created the container without a device request, but an NGC image's
    own NVIDIA_VISIBLE_DEVICES=all gave it every GPU of a host whose default runtime is nvidia."""
    from imgbuild.engine.containers import DockerContainers
    from imgbuild.engine.images import DockerImages

    client = _Client()
    runner = DockerContainers(client, DockerImages(client))
    runner.run_script("img", PRINT, [], {"A": "1"}, gpus=None, ipc="host", as_user=None)
    (created,) = client.created
    assert created["device_requests"] is None
    hidden = {"A": "1", "NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}
    assert created["environment"] == {**hidden, "IMGBUILD_PROBE_MARKER": PRINT.marker}  # the script's marker too
    runner.run_script("img", PRINT, [], {}, gpus=[], ipc="host", as_user=None)  # all GPUs asked for: nothing hidden
    asked, _cdi, fallback = client.created[1:]  # (this fake's engine cannot pass GPUs: the run falls back to none)
    assert asked["device_requests"][0]["Count"] == -1 and "NVIDIA_VISIBLE_DEVICES" not in asked["environment"]
    assert fallback["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_a_remote_engine_is_asked_whether_its_host_has_gpus(monkeypatch):
    """A DOCKER_HOST elsewhere: this machine's /dev says nothing about the engine's host."""
    from imgbuild.engine import Engine

    class Client:
        def __init__(self, info):
            self._info = info

        def info(self):
            return self._info

    monkeypatch.setenv("DOCKER_HOST", "tcp://gpu-server:2376")
    assert Engine(Client({"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}})).host_has_gpus()
    assert Engine(Client({"DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=all"}]})).host_has_gpus()
    assert not Engine(Client({"Runtimes": {"runc": {}}})).host_has_gpus()


def test_rebuild_does_not_promote_what_the_fleet_cannot_run(tmp_path):
    from imgbuild.ci import rebuild
    from tests.fake_nvcr import FakeNvcr

    folder = tmp_path / "recipes"
    folder.mkdir()
    (tmp_path / ".git").mkdir()
    (folder / "lab.yaml").write_text('name: lab\nimage: lab/lab:v1\nbase: {framework: pytorch, tag: "24.05"}\n')
    engine = FakeEngine()
    engine.containers.meta = CUDA13
    with FakeNvcr({"nvidia/pytorch": ["24.05-py3"]}) as nvcr:
        settings = load_settings(
            {"ngc_registry": nvcr.host, "images_dir": str(tmp_path / "images"), "fleet_gpus": "v100,h100"}
        )
        (item,) = rebuild.run([str(folder)], settings, rebuild.RebuildOptions(), log=lambda line: None, engine=engine)
    assert item.status == "failed" and "fleet: cannot run on v100" in item.error
    assert engine.images.image_id("lab/lab:v1") is None


@pytest.mark.engine
def test_on_the_real_engine_a_script_without_gpus_is_told_void(testbed):
    """The stand-in, like NGC, says NVIDIA_VISIBLE_DEVICES=all in its config: a script run without GPUs sees void."""
    from imgbuild.engine import Engine

    engine = Engine.connect(testbed["IMGBUILD_DOCKER_CLI"])
    image = f"{testbed['IMGBUILD_TESTBED_REGISTRY']}/nvidia/pytorch:24.05-py3"
    assert "NVIDIA_VISIBLE_DEVICES=all" in engine.images.image(image).config["Env"]
    script = "import os; print('seen', os.environ.get('NVIDIA_VISIBLE_DEVICES'))"
    code, output, _ = engine.containers.run_script(
        image, Probe("env", script, ""), [], {}, gpus=None, timeout=120, as_user=None
    )
    assert code == 0 and "seen void" in output, output[-1000:]


def _clocked_torch(tflops: list[float], speedup: float = 1.0, capability=(8, 0)) -> types.SimpleNamespace:
    """A torch whose GPUs each run GEMMs at a set speed on a clock of their own; an event reads the clock of the
    device current when it records, as CUDA's events do (they record on the current device's stream)."""
    import contextlib

    state = {"current": 0, "clock": [0.0] * len(tflops)}

    class Event:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at = (state["current"], state["clock"][state["current"]])

        def elapsed_time(self, end):
            assert self.at[0] == end.at[0]
            return (end.at[1] - self.at[1]) * 1000

    @contextlib.contextmanager
    def device(index):
        before, state["current"] = state["current"], index
        try:
            yield
        finally:
            state["current"] = before

    def randn(n, _m, device, dtype):
        return types.SimpleNamespace(n=n, device=int(device.split(":")[1]), dtype=dtype)

    def mm(a, _b):  # half precision `speedup` times fp32's
        state["clock"][a.device] += 2 * a.n**3 / (tflops[a.device] * (1 if a.dtype == "fp32" else speedup) * 1e12)

    cuda = types.SimpleNamespace(
        Event=Event,
        device=device,
        synchronize=lambda _d: None,
        is_available=lambda: True,
        device_count=lambda: len(tflops),
        get_device_capability=lambda _i: capability,
        get_device_name=lambda _i: "NVIDIA A100-SXM4-80GB",
        mem_get_info=lambda _i: (40 * 2**30, 80 * 2**30),
    )
    matmul = types.SimpleNamespace(allow_tf32=True)
    return types.SimpleNamespace(
        cuda=cuda,
        randn=randn,
        mm=mm,
        float32="fp32",
        float16="fp16",
        bfloat16="bf16",
        backends=types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=matmul)),
        set_float32_matmul_precision=lambda _p: None,
        get_float32_matmul_precision=lambda: "highest",
    )


def test_every_gpu_is_timed_on_its_own_device():
    """The events recorded on device 0 while GPU i ran the GEMMs: nothing timed, the loop
    grew to its cap, a division by zero or a false fail on every GPU after the first."""
    torch = _clocked_torch([50.0, 400.0, 990.0])
    for device, speed in enumerate([50.0, 400.0, 990.0]):
        assert smoke_throughput._gemm_tflops(torch, torch.float32, 1024, device) == pytest.approx(speed, rel=1e-6)


def test_smoke_gpus_none_is_no_gpu_never_every_gpu(tmp_path):
    """`smoke --gpus none` on a GPU host picked [] (read as "all") and still required
    a GPU; it is now what --skip-gpu is."""
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.types import ImageInfo
    from imgbuild.pipeline.smoke import SmokeRequest, run_smoke

    engine = FakeEngine(gpus=True)
    engine.containers.meta = CUDA124
    engine.images.add("sha256:img", ImageInfo("sha256:img", {}, {}), "lab/x:1")
    settings = load_settings({"gpu_snapshot": _snapshot(tmp_path)})
    for request in ("none", "NONE", " none "):
        run_smoke(engine, SmokeRequest("lab/x:1", gpus=request), settings)
        run = engine.containers.runs[-1]
        assert run["gpus"] is None and "--require-gpu" not in run["args"], request
    run_smoke(engine, SmokeRequest("lab/x:1", gpus="1"), settings)
    assert engine.containers.runs[-1]["gpus"] and "--require-gpu" in engine.containers.runs[-1]["args"]


@pytest.mark.parametrize("speedup, status", [(1.5, "fail"), (7.0, "warn"), (14.0, "pass")])
def test_a_warned_or_failed_tensor_core_check_keeps_its_numbers(speedup, status):
    """Warn and Fail dropped the details, so the per-GPU TFLOP/s and floors vanished
    exactly when the check warned or failed."""
    report = smoke_report.Report()
    report.run("tensor cores", smoke_throughput.torch_tensor_cores, _clocked_torch([19.5, 19.5], speedup=speedup))
    (entry,) = report.checks
    assert entry["status"] == status, entry["reason"]
    gpus = entry["details"]["gpus"]
    assert [g["index"] for g in gpus] == [0, 1] and all(g["fp32_tflops"] == 19.5 for g in gpus)
    assert all(g["speedup"] == pytest.approx(speedup, abs=0.05) and g["floor"] for g in gpus)


#: Verdicts a probe found wrong, each as (image CUDA, its arch list,
#: --for, --driver, runs?, words in the reason).
REVIEW_FALSE_PASSES = [
    # item 4: the driver against the GPU itself
    ("12.4", "sm_70 sm_80 sm_90", "v100", "590.44.01", False, "R580 was its last branch"),
    ("12.4", "sm_70 sm_80 sm_90", "v100", "580.95.05", True, ">= 550.54.14"),
    ("12.4", "sm_80 sm_90 compute_90", "b200", "535.104.05", False, "needs R570 or later"),
    ("12.4", "sm_80 sm_90 compute_90", "rtx5090", "535.104.05", False, "needs R570 or later"),
    ("12.8", "sm_80 sm_90 sm_100 sm_120", "rtx5090", "560.35.03", False, "needs R570 or later"),
    ("12.9", "sm_80 sm_90 sm_100 sm_103", "b300", "570.124.06", False, "needs R575 or later"),
    ("12.4", "sm_80 sm_89 sm_90", "h100", "470.57.02", False, "predates sm_90"),
    ("12.4", "sm_80 sm_89 sm_90", "l40s", "470.57.02", False, "predates sm_89"),
    ("12.4", "sm_70 sm_75 sm_80", "a100", "470.57.02", True, "forward compatibility"),  # right before, still
    # item 13: PTX only, and the driver below the image's exact CUDA: minor-version compatibility cannot JIT it on a
    # GeForce; on a data-center GPU the image's forward-compatibility libraries do
    ("12.6", "sm_75 compute_75", "rtx4090", "550.54.15", False, "cannot JIT-compile"),
    ("12.6", "sm_80 sm_86 compute_86", "h100", "535.104.05", True, "JITs its PTX"),
    ("12.6", "sm_80 sm_86 compute_86", "h100", "560.35.03", True, ">= 560.28.03"),
    # item 14: no arch list, yet the CUDA major builds nothing that old
    ("13.0", "", "v100", "580.95.05", False, "CUDA 13 builds nothing below sm_75"),
    ("13.0", "", "t4", "580.95.05", True, "no arch list"),
    # item 18: the RTX PRO 6000 Workstation Edition has no forward compatibility; names people type
    ("12.8", "sm_80 sm_90 sm_100 sm_120", "rtxpro6000", "570.124.06", True, ">= 570.26"),
    ("12.8", "sm_80 sm_90 sm_100 sm_120", "rtxpro6000", "535.104.05", False, "needs R570 or later"),
    ("12.4", "sm_80 sm_90", "h100-pcie", "550.54.15", True, ">= 550.54.14"),
    ("12.4", "sm_80 sm_90", "H100 NVL", "550.54.15", True, ">= 550.54.14"),
    # CUDA 13.2 needs 595.45.04; its PTX on R580 cannot be JIT-compiled on a GeForce, and
    # a CUDA minor newer than the table is never taken as JIT-able
    ("13.2", "sm_80 sm_86 sm_90 compute_90", "rtx5090", "580.95.05", False, "needs 595.45.04"),
    ("13.2", "sm_80 sm_86 sm_90 sm_120", "rtx5090", "580.95.05", True, "minor-version compatibility"),
    ("13.3", "sm_90 sm_120", "h100", "610.43.02", True, ">= 610.43.02"),
    ("13.9", "sm_75 compute_75", "rtx4090", "580.95.05", False, "newer than imgbuild's table knows"),
    # item 4: PTX only on a data-center GPU under minor-version compatibility: forward compatibility JITs it
    ("13.2", "sm_75 compute_80", "h100", "580.95.05", True, "JITs its PTX"),
    # item 6: Kepler's last branch is R470
    ("11.4", "sm_35 sm_37 sm_50", "k80", "535.104.05", False, "R470 was its last branch"),
    ("11.4", "sm_35 sm_37 sm_50", "k80", "470.82.01", True, ">= 470.42.01"),
    # item 7: minimum full versions within a branch; the RTX PRO 6000 Server Edition is a data-center part
    ("12.8", "sm_90 sm_100", "b200", "570.124.06", False, "570.133.20, which NVIDIA requires for b200"),
    ("12.8", "sm_90 sm_100", "b200", "570.133.20", True, ">= 570.26"),
    ("12.8", "sm_90 sm_120", "rtxpro6000se", "570.124.06", False, "575.57.08"),
    ("13.0", "sm_90 sm_100 sm_120", "rtxpro6000se", "575.57.08", True, "forward compatibility"),
    ("13.0", "sm_90 sm_100 sm_120", "rtxpro6000", "575.57.08", False, "data-center GPUs only"),
    # the forward-compatible branches per CUDA minor, as NVIDIA's images declare them (12.8: 470 535 550 560 565)
    ("12.8", "sm_80 sm_90", "a100", "470.82.01", True, "forward compatibility"),
    ("12.8", "sm_80 sm_90", "a100", "460.32.03", False, "forward-compatible branch: 470, 535, 550, 560, 565"),
    ("12.8", "sm_80 sm_86", "a6000", "470.82.01", False, "data-center GPUs only"),
    ("13.0", "sm_80 sm_90", "h100", "570.148.08", True, "forward compatibility"),
]


@pytest.mark.parametrize(("cuda", "archs", "target", "driver", "runs", "words"), REVIEW_FALSE_PASSES)
def test_a_fleet_verdict_follows_the_cuda_minor_the_gpu_and_the_drivers_branch(
    cuda, archs, target, driver, runs, words
):
    (verdict,) = judge(GpuFacts("img", cuda, archs, "test"), parse_targets(target), driver)
    assert verdict.runs is runs and words in verdict.reason, verdict.reason


def test_forward_compatibility_is_for_data_center_parts_only():
    from imgbuild.gpu.support import GPU_MODELS

    assert (
        not GPU_MODELS["rtxpro6000"].datacenter
        and GPU_MODELS["rtxpro6000se"].datacenter
        and GPU_MODELS["orin"].datacenter
    )
    for name in ("h800", "a800", "l20", "a2", "a16", "orin", "thor"):
        assert parse_target(name).label == name


#: Measured ratios [S12]: (capability, half/fp32 ratio, verdict)
RATIOS = [
    ((9, 0), 3.99, "warn"),  # an H20 whose fp32 reaches 81% of peak: it failed under the one 4x threshold
    ((9, 0), 4.44, "warn"),  # the H20 as measured
    ((8, 9), 2.4, "warn"),  # an L20-class Ada part at 2:1 peak: failed, no warning zone on 8.x GeForce/Ada
    ((8, 9), 2.36, "warn"),  # a contended RTX 4090
    ((12, 0), 2.83, "pass"),  # an RTX 5050 laptop
    ((8, 0), 3.8, "fail"),  # A100 on CUDA cores: right before, right now
    ((9, 0), 2.1, "fail"),  # H100 on CUDA cores
    ((8, 6), 1.2, "fail"),  # GA10x on CUDA cores
    ((7, 5), 10.0, "pass"),  # T4 healthy
    ((10, 0), 25.6, "pass"),  # B200 healthy
    ((6, 1), 1.0, "pass"),  # P40: no tensor cores, no floor
]


@pytest.mark.parametrize(("capability", "ratio", "verdict"), RATIOS)
def test_the_tensor_core_threshold_is_per_architecture(capability, ratio, verdict):
    assert smoke_throughput.speed_verdict(capability, 10.0, 10.0 * ratio)[0] == verdict


def test_a_host_whose_engine_cannot_start_any_container_says_so_in_one_line():
    """With a default nvidia runtime whose hook fails, the fallback without GPUs failed
    the same way and ended in a bare `unexpected APIError`."""
    from imgbuild.engine.containers import DockerContainers
    from imgbuild.engine.images import DockerImages
    from imgbuild.errors import ImgbuildError

    client = _Client()
    client._create = lambda image, command, device_requests=None, **kw: (  # every start fails
        client.created.append({"device_requests": device_requests, **kw}) or _Container(client.log, fail_start=True)
    )
    client.containers.create = client._create
    runner = DockerContainers(client, DockerImages(client))
    with pytest.raises(ImgbuildError, match="cannot start it without GPUs either .*default runtime"):
        runner.run_script("img", PRINT, [], {}, gpus=["GPU-1"], ipc="host", as_user=None)
    assert client.log.count("remove") == client.log.count("copy") == 3  # nothing left behind


def test_an_arm64_only_gpu_cannot_run_an_amd64_only_image():
    """GH200, GB200, GB300, GB10 and Jetson hosts are arm64: an amd64-only image said
    "runs" (then `exec format error`). An image known to have an arm64 variant is judged on its kernels."""
    amd64 = GpuFacts("img", "13.0", TORCH_CU130, "test", ("amd64",))
    verdicts = {v.target: v for v in judge(amd64, parse_targets("gh200,gb200,gb300,gb10,h100"), "580.95.05")}
    for name in ("gh200", "gb200", "gb300", "gb10"):
        assert not verdicts[name].runs and "no arm64 variant (only amd64)" in verdicts[name].reason
    assert verdicts["h100"].runs  # a PCIe/SXM H100 sits in either kind of machine
    both = GpuFacts("img", "13.0", TORCH_CU130, "test", ("amd64", "arm64"))
    assert all(v.runs for v in judge(both, parse_targets("gh200,gb200"), "580.95.05"))
    unknown = GpuFacts("img", "13.0", TORCH_CU130, "test")  # platforms not known: kernels and driver decide
    assert judge(unknown, parse_targets("gh200"), "580.95.05")[0].runs


@pytest.mark.root("another user's hold in the ledger (root's file may name anyone)")
def test_the_smoke_test_respects_the_ledger_as_run_does(tmp_path):
    """The smoke's choice ignored the ledger's claims, so it could land on a GPU just
    handed to another user's starting run or idle container; with nothing free it said "use --force", which
    build does not have."""
    import dataclasses

    from imgbuild.config.site import RunRules, checked_section
    from imgbuild.servers.holds import gpu_claims
    from imgbuild.servers.ledger import Ledger
    from tests.support import server

    gpus = server("dgx-a100")
    free = [g.uuid for g in gpus if not g.processes]
    state = tmp_path / "state"
    # the host's claims, as the CLI hands them to the pipeline (Stage 5 reads no ledger or config of its own)
    rules = checked_section(RunRules, "run", {"state_dir": str(state)})
    claims = gpu_claims(dataclasses.replace(load_settings(environ={}), run=rules))
    with Ledger(str(state)).transaction() as book:  # another user's run, starting on the first free GPU
        book.add("bob_train_1", "bob", [free[0]], [])
    engine = FakeEngine(gpus=True)
    engine.containers.meta = CUDA124
    _build(tmp_path, engine, gpu_snapshot=_snapshot(tmp_path), claims=claims)
    assert engine.containers.runs[-1]["gpus"] == [free[1]]
    _build(tmp_path, engine, gpu_snapshot=_snapshot(tmp_path))  # no claims given: only the GPUs' processes count
    assert engine.containers.runs[-1]["gpus"] == [free[0]]
    with Ledger(str(state)).transaction() as book:  # every free GPU handed out
        book.add("bob_train_2", "bob", free[1:], [])
    with pytest.raises(ImgbuildError, match=r"the smoke test needs a free GPU: wait, or .*--skip-gpu"):
        _build(tmp_path, engine, gpu_snapshot=_snapshot(tmp_path), claims=claims)


@pytest.mark.root("a user's hold in the ledger (root's file may name anyone)")
def test_a_users_smoke_test_counts_against_their_gpu_quota(tmp_path):
    """A smoke test run for a user through sudo is a run of theirs: with `run.max_gpus_per_user: 1` and one GPU
    held already, `smoke --gpus all` (or a build's smoke test) took every free GPU; now it is refused."""
    import dataclasses

    from imgbuild.config.site import RunRules, checked_section
    from imgbuild.servers.holds import gpu_claims, quota_check
    from imgbuild.servers.ledger import Ledger
    from tests.support import server

    free = [g.uuid for g in server("dgx-a100") if not g.processes]
    state = tmp_path / "state"
    rules = checked_section(RunRules, "run", {"state_dir": str(state), "max_gpus_per_user": 1})
    site = dataclasses.replace(load_settings(environ={}), run=rules)
    with Ledger(str(state)).transaction() as book:  # alice's own run holds one GPU
        book.add("alice_train_1", "alice", [free[0]], [])
    engine = FakeEngine(gpus=True)
    engine.containers.meta = CUDA124
    with pytest.raises(ImgbuildError, match=r"quota: at most 1 GPUs at once \(run.max_gpus_per_user\)"):
        _build(tmp_path, engine, gpu_snapshot=_snapshot(tmp_path), claims=gpu_claims(site),
               quota=quota_check(site, "alice"))  # fmt: skip
    _build(tmp_path, engine, gpu_snapshot=_snapshot(tmp_path), claims=gpu_claims(site),
           quota=quota_check(site, "bob"))  # fmt: skip
    assert engine.containers.runs[-1]["gpus"] == [free[1]]  # bob holds none: his test gets a free GPU


def test_a_cdi_only_host_gets_its_gpus_by_cdi_name():
    """On a host whose engine knows GPUs only through CDI (the toolkit in cdi mode, the
    GPU Operator), the legacy request fails; the smoke said "install nvidia-container-toolkit" and ran without
    GPUs. Now the same GPUs by CDI name, and no note."""
    from imgbuild.engine.containers import DockerContainers
    from imgbuild.engine.images import DockerImages

    client = _Client()
    hook = (
        "invoking the NVIDIA Container Runtime Hook directly (e.g. specifying the docker --gpus flag) is not supported"
    )

    def create(image, command, device_requests=None, **kw):
        client.created.append({"device_requests": device_requests, **kw})
        legacy = bool(device_requests) and device_requests[0].get("Driver") != "cdi"
        container = _Container(client.log, fail_start=legacy)
        container.message = hook
        return container

    client.containers.create = create
    runner = DockerContainers(client, DockerImages(client))
    code, _output, note = runner.run_script("img", PRINT, [], {}, gpus=["GPU-1", "GPU-2"], ipc="host", as_user=None)
    assert code == 0 and note == ""
    legacy, cdi = client.created
    assert cdi["device_requests"][0]["DeviceIDs"] == ["nvidia.com/gpu=GPU-1", "nvidia.com/gpu=GPU-2"]
    assert cdi["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-1,GPU-2"  # a runtime in CDI mode reads it too


def test_a_registry_tag_is_judged_on_the_platform_of_each_target():
    """`tags --compatible` and `bump` read this host's (amd64) arch list for every
    target; NGC's arm64 25.10 list differs (11.0 for Thor, no 7.5). An arm64-only GPU is judged on the arm64
    variant, and cannot run a tag that has none."""
    amd64 = "7.5 8.0 8.6 9.0 10.0 12.0+PTX"
    arm64 = {"arm64": {"cuda": "13.0", "arch_list": "8.0 8.6 9.0 10.0 11.0 12.0+PTX"}}
    both = ("amd64", "arm64")
    (thor,) = judge_tag("25.10-py3", "13.0", amd64, parse_targets("thor"), "580.95.05", both, arm64)
    assert thor.runs and "sm_110: native kernels" in thor.reason
    (on_amd64_list,) = judge_tag("25.10-py3", "13.0", amd64, parse_targets("thor"), "580.95.05", both, {})
    assert not on_amd64_list.runs  # what the old code said from the amd64 list alone
    (none,) = judge_tag("24.05-py3", "13.0", amd64, parse_targets("gh200"), "580.95.05", ("amd64",), {})
    assert not none.runs and "no arm64 variant (only amd64)" in none.reason
    t4 = judge_tag("25.10-py3", "13.0", amd64, parse_targets("t4"), "580.95.05", both, arm64)[0]
    assert t4.runs  # an x86 GPU is judged on the tag's own (amd64) list


def pip_torch(version: str, cuda: str, cudnn: int) -> types.SimpleNamespace:
    """pip's torch as the libraries check sees it: its CUDA, cuDNN and NCCL versions, its arch list."""
    return types.SimpleNamespace(
        __version__=version,
        version=types.SimpleNamespace(cuda=cuda),
        backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(is_available=lambda: True, version=lambda: cudnn)),
        cuda=types.SimpleNamespace(
            nccl=types.SimpleNamespace(version=lambda: (2, 21, 5)), get_arch_list=lambda: ["sm_80"]
        ),
        distributed=types.SimpleNamespace(is_available=lambda: True, is_nccl_available=lambda: True),
        _C=types.SimpleNamespace(_cuda_getArchFlags=lambda: "sm_80 sm_90"),
    )


@pytest.mark.parametrize(
    "runtime, status",
    [
        ("/usr/local/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12", "pass"),
        ("/usr/local/cuda/lib64/libcudart.so.12", "fail"),
        ("", "fail"),
    ],
)
def test_pip_torch_on_a_cuda_base_is_not_held_to_the_system_cuda(runtime, status, monkeypatch):
    """pip's torch cu121 on nvidia/cuda:12.4 loads its own CUDA runtime wheel, so the
    base's CUDA_VERSION legitimately differs; it is reported, and still a failure where torch uses the system's."""
    monkeypatch.setenv("CUDA_VERSION", "12.4.1")
    monkeypatch.delenv("CUDNN_VERSION", raising=False)
    monkeypatch.setattr(smoke_libraries, "loaded_library", lambda name: runtime)
    torch = pip_torch("2.5.1+cu121", "12.1", 90100)
    report = smoke_report.Report()
    report.run("cuda libraries", smoke_libraries.torch_libraries, torch)
    (entry,) = report.checks
    assert entry["status"] == status, entry["reason"]
    if status == "pass":
        assert "its own CUDA 12.1 runtime" in entry["details"]["cuda_note"]


def test_loaded_library_reads_this_process_maps():
    path = smoke_libraries.loaded_library("libc.so")
    assert "/libc.so" in path and not smoke_libraries.is_wheel_path(path)
    assert smoke_libraries.loaded_library("libnothing-such.so") == ""
    assert smoke_libraries.is_wheel_path("/usr/lib/python3/dist-packages/nvidia/cudnn/lib/libcudnn.so.9")


def test_the_smoke_test_on_a_mig_host_gets_a_slice_and_says_which(tmp_path):
    """The smoke test is given a free MIG slice by its MIG- UUID (not the parent GPU's
    UUID, no device for CUDA), and the report records the slice's profile (its figures are a slice's)."""
    from imgbuild.config.settings import load_settings
    from imgbuild.engine.types import ImageInfo
    from imgbuild.gpu.read import Gpu, GpuProcess
    from imgbuild.pipeline.smoke import SmokeRequest, run_smoke

    busy = Gpu(0, "MIG-aaaa", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 9000, 20000, None, [GpuProcess(7, "python", 9000, "bob")],
               "8.0", "580.95.05", "", "GPU-0", "3g.20gb")  # fmt: skip
    free = Gpu(0, "MIG-bbbb", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 0, 20000, None, [], "8.0", "580.95.05", "",
               "GPU-0", "3g.20gb")  # fmt: skip
    snapshot = tmp_path / "gpus.json"
    snapshot.write_text(json.dumps({"gpus": [busy.to_json(), free.to_json()]}))
    engine = FakeEngine(gpus=True)
    engine.containers.meta = CUDA124
    engine.images.add("sha256:img", ImageInfo("sha256:img", {}, {}), "lab/x:1")
    report = run_smoke(engine, SmokeRequest("lab/x:1"), load_settings({"gpu_snapshot": str(snapshot)}))
    assert engine.containers.runs[-1]["gpus"] == ["MIG-bbbb"] and report.meta["mig"] == ["3g.20gb"]


def test_a_gpu_host_whose_gpus_cannot_be_read_gives_the_smoke_test_no_gpu_it_did_not_choose(monkeypatch):
    """GPUs that could not be read became [] (every GPU, other users' too)."""
    from imgbuild.engine.types import ImageInfo
    from imgbuild.gpu import read as gpumod
    from imgbuild.pipeline.smoke import SmokeRequest, run_smoke

    def unreadable(*_args, **_kw):
        raise gpumod.NoGpus("nvidia-smi not found; nvidia-ml-py is not installed")

    monkeypatch.setattr(gpumod, "read_gpus", unreadable)
    engine = FakeEngine(gpus=True)
    engine.containers.meta = CUDA124
    engine.images.add("sha256:img", ImageInfo("sha256:img", {}, {}), "lab/x:1")
    with pytest.raises(ImgbuildError, match=r"cannot be read .*--gpus all, or skip the GPU half \(--skip-gpu\)"):
        run_smoke(engine, SmokeRequest("lab/x:1"), load_settings({}))
    assert engine.containers.runs == []
    run_smoke(engine, SmokeRequest("lab/x:1", gpus="all"), load_settings({}))
    assert engine.containers.runs[-1]["gpus"] == []  # every GPU, because it was asked for by name


# --- GPUs read through the engine ----------------------------------------------

from imgbuild.gpu.engine_read import judge_engine_read  # noqa: E402
from imgbuild.gpu.read import SmiReader  # noqa: E402
from imgbuild.payload.probes import ENGINE_GPUS  # noqa: E402
from imgbuild.pipeline.smoke import declared_fleet, host_gpus  # noqa: E402

DATA = Path(__file__).parent / "data"
NO_DRIVER = 'could not select device driver "" with capabilities: [[gpu]]'


def _engine_read(pci: object = 0, smi: dict | None = None, code: int = 0, note: str = "") -> tuple[int, str, str]:
    """What the read container prints: the host's NVIDIA PCI devices and nvidia-smi's answer to each call."""
    return code, "noise\n" + ENGINE_GPUS.marker + json.dumps({"pci_nvidia": pci, "smi": smi or {}}) + "\n", note


def _smi(gpus_csv: str, apps_csv: str = "", listing: str = "") -> dict:
    """nvidia-smi's answers as the read script records them, keyed by the call's arguments."""
    apps, full, short, bus, lst, _mig = (" ".join(c) for c in SmiReader.CALLS)
    ok = lambda out: {"code": 0, "out": out, "err": ""}  # noqa: E731
    return {apps: ok(apps_csv), full: ok(gpus_csv), short: ok(""), bus: ok(""), lst: ok(listing)}


DGX_GPUS = (DATA / "smi-dgx-a100-gpus.csv").read_text()
DGX_APPS = (DATA / "smi-dgx-a100-apps.csv").read_text()
NONE_FOUND = {" ".join(c): {"code": 6, "out": "No devices were found\n", "err": ""} for c in SmiReader.CALLS}
NOT_IN_IMAGE = {
    " ".join(c): {"code": 127, "out": "", "err": "nvidia-smi not found in the container"} for c in SmiReader.CALLS
}


@pytest.mark.parametrize(
    "why, read, cdi, present, count",
    [
        ("a DGX read through the engine", _engine_read(8, _smi(DGX_GPUS, DGX_APPS)), False, True, 8),
        ("an nvidia runtime on a host without GPUs", _engine_read(0, NONE_FOUND), False, False, 0),
        ("no toolkit and no NVIDIA device on the bus", _engine_read(0, NOT_IN_IMAGE, note=NO_DRIVER), False, False, 0),
        (
            "no toolkit on a host with 4 NVIDIA GPUs on its bus",
            _engine_read(4, NOT_IN_IMAGE, note=NO_DRIVER),
            False,
            True,
            0,
        ),
        ("a CDI-only host whose specs the engine lists", _engine_read(0, NOT_IN_IMAGE, note=NO_DRIVER), True, True, 0),
        (
            "driver not loaded, said by the toolkit's hook",
            _engine_read(0, NOT_IN_IMAGE, note="nvml error: driver not loaded"),
            False,
            False,
            0,
        ),
        (
            "GPUs given, nvidia-smi fails otherwise (mismatch)",
            _engine_read(
                0,
                {
                    k: {"code": 18, "out": "", "err": "Failed to initialize NVML: Driver/library version mismatch"}
                    for k in NONE_FOUND
                },
            ),
            False,
            True,
            0,
        ),
        ("the script never ran (exit 1, no report)", (1, "python3: not found", ""), False, False, 0),
        ("the script never ran on a CDI host", (1, "python3: not found", ""), True, True, 0),
        # hostile or broken reports read as nothing, never as a crash
        ("not JSON", (0, ENGINE_GPUS.marker + "{nope", ""), False, False, 0),
        ("a list, not a mapping", (0, ENGINE_GPUS.marker + "[1, 2]", ""), False, False, 0),
        ("pci as text", _engine_read("8", NONE_FOUND), False, False, 0),
        ("pci as true", _engine_read(True, NONE_FOUND), False, False, 0),
        ("pci negative", _engine_read(-3, NONE_FOUND), False, False, 0),
        (
            # GPUs given (no note), then nothing readable: a GPU host whose GPUs cannot be read (fail closed)
            "smi answers not a mapping",
            (0, ENGINE_GPUS.marker + json.dumps({"pci_nvidia": 0, "smi": [1]}), ""),
            False,
            True,
            0,
        ),
        (
            "an answer whose output is a number",
            _engine_read(0, {k: {"code": 0, "out": 5} for k in NONE_FOUND}),
            False,
            True,
            0,
        ),
        ("garbage CSV", _engine_read(0, _smi("x, y, z\n")), False, False, 0),
        ("a marker with nothing after it", (0, ENGINE_GPUS.marker, ""), False, False, 0),
    ],
)
def test_the_engine_read_is_judged_from_what_the_host_has_not_what_the_engine_registers(why, read, cdi, present, count):
    found = judge_engine_read(*read, cdi)
    assert found.present is present, why
    assert len(found.readings or []) == count, why
    assert count or found.why, why  # nothing read: it says why


def test_gpus_read_through_the_engine_keep_their_numbers_but_no_host_paths():
    """The readings are the engine's host's: memory, processes (no owner: this machine's /proc is not theirs) and
    no NUMA CPUs from this machine's /sys."""
    found = judge_engine_read(*_engine_read(8, _smi(DGX_GPUS, DGX_APPS)), False)
    assert found.readings is not None
    first = found.readings[0]
    assert (first.name, first.compute_cap, first.driver, first.memory_used_mib) == (
        "NVIDIA A100-SXM4-40GB",
        "8.0",
        "535.104.05",
        38012,
    )
    assert [p.pid for p in first.processes] == [122956] and first.processes[0].user == ""
    assert all(g.cpu_affinity == "" for g in found.readings)


def _remote(read: tuple[int, str, str], gpus: bool = True, cdi: list[str] | None = None) -> FakeEngine:
    from imgbuild.engine.types import ImageInfo

    engine = FakeEngine(gpus=gpus, shares=False, cdi_gpus=cdi or [])  # gpus: what a guess from the runtime says
    engine.containers.meta = CUDA124
    engine.containers.engine_read = read
    engine.images.add("sha256:img", ImageInfo("sha256:img", {}, {}), "lab/x:1")
    return engine


def test_a_remote_gpu_host_gets_the_smoke_test_a_free_gpu_it_read_through_the_engine():
    """Before: a remote engine's GPUs were this machine's (none here, or another machine's); now they are read in
    a container of the image, given every GPU, and the smoke test gets a free one by UUID and requires it."""
    from imgbuild.pipeline.smoke import SmokeRequest, run_smoke

    engine = _remote(_engine_read(8, _smi(DGX_GPUS, DGX_APPS)))
    run_smoke(engine, SmokeRequest("lab/x:1"), load_settings({}))
    assert "read gpus lab/x:1 gpus=[]" in engine.calls
    run = engine.containers.runs[-1]
    assert run["gpus"] == ["GPU-1f3e5d7c-9b8a-4c6d-2e1f-0a9b8c7d6e5f"] and "--require-gpu" in run["args"]


def test_a_remote_engine_with_an_nvidia_runtime_but_no_gpu_is_no_gpu_host():
    """Review item 16: an `nvidia` runtime registered on a host without GPUs counted as a GPU host, and every
    smoke test there failed for want of a GPU."""
    from imgbuild.pipeline.smoke import SmokeRequest, run_smoke

    engine = _remote(_engine_read(0, NONE_FOUND), gpus=True)
    report = run_smoke(engine, SmokeRequest("lab/x:1"), load_settings({}))
    assert report.ok and engine.containers.runs[-1]["gpus"] is None
    assert "--require-gpu" not in engine.containers.runs[-1]["args"]


def test_imgbuild_in_a_container_on_a_gpu_host_whose_engine_cannot_pass_gpus_never_promotes(tmp_path):
    """Review item 16: in a container with the socket mounted, this machine's /dev has no GPU, and the GPU half
    was skipped (bug 1 again). The bus says the host has GPUs: the smoke test requires one and fails."""
    from imgbuild.pipeline.smoke import SmokeRequest, run_smoke

    engine = _remote(_engine_read(8, NOT_IN_IMAGE, note=NO_DRIVER), gpus=False)
    with pytest.raises(ImgbuildError, match="the engine's host has GPUs but they cannot be read .*could not select"):
        run_smoke(engine, SmokeRequest("lab/x:1"), load_settings({}))
    engine.containers.gpu_note = "the host has GPUs but the engine cannot pass them (could not select device driver)"
    report = run_smoke(engine, SmokeRequest("lab/x:1", gpus="all"), load_settings({}))
    assert not report.ok and [c["name"] for c in report.failures()] == ["gpu access"]
    with pytest.raises(ImgbuildError, match="the engine's host has GPUs but they cannot be read"):
        _build(tmp_path, engine)
    assert engine.images.image_id(TARGET) is None


def test_the_fleet_of_a_remote_gpu_host_is_its_own_gpus_and_driver(tmp_path):
    """The DGX behind DOCKER_HOST runs driver 535.104.05: a CUDA 13 image built there is judged from the GPUs and
    driver read through the engine (not this machine's, which has none): forward compatibility, promoted."""
    engine = _remote(_engine_read(8, _smi(DGX_GPUS, DGX_APPS)))
    engine.containers.meta = CUDA13
    result = _build(tmp_path, engine)
    assert result.promoted and "forward compatibility" in json.dumps(result.smoke.to_json() if result.smoke else {})
    assert sum(c.startswith("read gpus") for c in engine.calls) == 1  # read once for the smoke test and the fleet
    host = host_gpus(engine, "lab/x:1", load_settings({}))
    targets, driver = declared_fleet(load_settings({}), [], host)
    assert driver == "535.104.05" and [t.label for t in targets] == ["this host's NVIDIA A100-SXM4-40GB"]


def test_gpu_source_says_where_the_gpus_are_read(monkeypatch):
    engine = _remote(_engine_read(8, _smi(DGX_GPUS)), gpus=False)
    assert host_gpus(engine, "lab/x:1", load_settings({"gpu_source": "local"})).present is False  # this machine's
    assert not any(c.startswith("read gpus") for c in engine.calls)
    local = FakeEngine(gpus=False)  # an engine on this machine's kernel ...
    local.containers.engine_read = _engine_read(8, _smi(DGX_GPUS))
    monkeypatch.setenv("IMGBUILD_GPU_SOURCE", "engine")  # ... read through the engine when the site says so
    found = host_gpus(local, "lab/x:1", load_settings())
    assert found.present and found.source == "engine" and len(found.readings or []) == 8
    monkeypatch.setenv("IMGBUILD_GPU_SOURCE", "remote")
    with pytest.raises(UsageError, match=r"env IMGBUILD_GPU_SOURCE: gpu_source: must be one of auto, local, engine"):
        load_settings()


def test_a_mig_gpu_without_instances_is_never_handed_out_whole():
    """A GPU in MIG mode with no instance was listed, and given, as a whole GPU; the
    smoke test then got the parent UUID and failed 'none usable'. It is named, never given."""
    from imgbuild.gpu.allocate import select_gpus
    from imgbuild.gpu.read import SmiReader

    gpus_csv = (
        "0, GPU-aaaa, NVIDIA A100-SXM4-40GB, 0, 40960, 0, 8.0, 580.95.05\n"
        "1, GPU-bbbb, NVIDIA A100-SXM4-40GB, 0, 40960, 0, 8.0, 580.95.05\n"
    )
    answers = {
        " ".join(SmiReader.CALLS[0]): "",
        " ".join(SmiReader.CALLS[1]): gpus_csv,
        " ".join(SmiReader.CALLS[3]): "",
        " ".join(SmiReader.CALLS[4]): "GPU 0: NVIDIA A100 (UUID: GPU-aaaa)\nGPU 1: NVIDIA A100 (UUID: GPU-bbbb)\n",
        " ".join(SmiReader.CALLS[5]): "GPU-aaaa, Enabled\nGPU-bbbb, Disabled\n",
    }
    gpus = SmiReader(run=lambda args: answers[" ".join(args)], binary="nvidia-smi", numa=False).read()
    assert [(g.uuid, g.mig_unsliced) for g in gpus] == [("GPU-aaaa", True), ("GPU-bbbb", False)]
    assert [g.uuid for g in select_gpus("1", gpus, "alice").gpus] == ["GPU-bbbb"]
    assert [g.uuid for g in select_gpus("all", gpus, "alice").gpus] == ["GPU-bbbb"]
    with pytest.raises(UsageError, match="GPU 0 has MIG mode on but no MIG instance"):
        select_gpus("0,", gpus, "alice", force=True)
    with pytest.raises(UsageError, match="no MIG instance"):
        select_gpus("1", gpus[:1], "alice")
    # an nvidia-smi that knows no MIG field: as before
    del answers[" ".join(SmiReader.CALLS[5])]

    def older(args):
        if " ".join(args) not in answers:
            from imgbuild.gpu.read import NoGpus

            raise NoGpus('nvidia-smi failed: Field "mig.mode.current" is not a valid field to query.')
        return answers[" ".join(args)]

    assert not any(g.mig_unsliced for g in SmiReader(run=older, binary="nvidia-smi", numa=False).read())


@pytest.mark.parametrize(
    "capability, name, ratio, verdict",
    [
        ((9, 0), "NVIDIA H20", 4.4, "pass"),  # a healthy H20 always warned against Hopper's 8x
        ((9, 0), "NVIDIA H20", 3.5, "warn"),
        ((9, 0), "NVIDIA H200", 4.4, "warn"),  # the H200 is no H20
        ((8, 9), "NVIDIA L20", 2.2, "pass"),
        ((8, 9), "NVIDIA L40S", 2.2, "warn"),
        ((7, 5), "NVIDIA GeForce GTX 1660 SUPER", 1.0, "pass"),  # no tensor cores: nothing to blame the image for
        ((7, 5), "NVIDIA GeForce GTX 1650", 2.0, "pass"),
        ((7, 5), "Tesla T4", 1.0, "fail"),
    ],
)
def test_the_tensor_core_floor_knows_the_models_below_their_architecture(capability, name, ratio, verdict):
    assert smoke_throughput.speed_verdict(capability, 10.0, 10.0 * ratio, None, name)[0] == verdict
    if verdict == "pass" and "GTX" in name:
        assert smoke_throughput.speed_floor(capability, None, name) == 0.0


@pytest.mark.parametrize(
    "cudnn_path, status",
    [
        ("/usr/local/lib/python3.12/dist-packages/nvidia/cudnn/lib/libcudnn.so.9", "pass"),  # the wheel's own
        ("/usr/lib/x86_64-linux-gnu/libcudnn.so.9", "fail"),  # the system's, not the one declared
    ],
)
def test_pip_torch_with_its_own_cudnn_wheel_is_not_held_to_the_bases_cudnn(cudnn_path, status, monkeypatch):
    """pip torch 2.7.1+cu126 loads its wheel's cuDNN 9.5.1
    on a base declaring CUDNN_VERSION=9.1.0.70; that is reported, not failed. The system's copy still fails."""
    monkeypatch.setenv("CUDA_VERSION", "12.6.3")
    monkeypatch.setenv("CUDNN_VERSION", "9.1.0.70")
    where = {"libcudart.so": "/usr/local/lib/python3.12/dist-packages/nvidia/cuda_runtime/lib/libcudart.so.12"}
    monkeypatch.setattr(smoke_libraries, "loaded_library", lambda name: where.get(name, cudnn_path))
    torch = pip_torch("2.7.1+cu126", "12.6", 90501)
    report = smoke_report.Report()
    report.run("cuda libraries", smoke_libraries.torch_libraries, torch)
    (entry,) = report.checks
    assert entry["status"] == status, entry["reason"]
    if status == "pass":
        assert "its own cuDNN 9.5.1" in entry["details"]["cudnn_note"]
    else:
        assert "CUDNN_VERSION=9.1.0.70" in entry["reason"]


@pytest.mark.parametrize(
    "archs, capability, status",
    [
        (["sm_70", "sm_80", "compute_90"], (8, 0), "pass"),
        (["sm_70", "sm_80", "compute_90"], (9, 0), "warn"),  # PTX only: JIT
        (["sm_70", "sm_80"], (12, 0), "fail"),  # no kernels for Blackwell
        ("sm_70,sm_80,sm_86", (8, 9), "pass"),  # TensorFlow's build info as one string
    ],
)
def test_tensorflow_gets_the_in_image_arch_check_torch_has(archs, capability, status):
    """TensorFlow had no in-image arch check (`run_tensorflow`); its build info's
    `cuda_compute_capabilities` is judged by the rule torch's check uses."""
    gpu = object()
    tf = types.SimpleNamespace(
        sysconfig=types.SimpleNamespace(get_build_info=lambda: {"cuda_compute_capabilities": archs}),
        config=types.SimpleNamespace(
            list_physical_devices=lambda kind: [gpu],
            experimental=types.SimpleNamespace(get_device_details=lambda _g: {"compute_capability": capability}),
        ),
    )
    report = smoke_report.Report()
    report.run("cuda arch", smoke_cuda.tf_arch, tf)
    (entry,) = report.checks
    assert entry["status"] == status, entry["reason"]


@pytest.mark.parametrize(
    "value", [["sm_70", "sm_80", "compute_90"], "sm_70,sm_80,compute_90", "sm_70 sm_80 compute_90"]
)
def test_tensorflows_arch_list_reads_the_same_from_a_list_or_a_string(value):
    """TensorFlow's build info gives `cuda_compute_capabilities` as a list in some releases and a string in others;
    the libraries check recorded a list as "['sm_70'" words. One reading serves both checks."""
    assert smoke_arch.tf_arch_list({"cuda_compute_capabilities": value}) == ["sm_70", "sm_80", "compute_90"]


def test_the_engine_gpu_script_runs_on_the_stdlib_alone_and_answers_on_one_line(tmp_path):
    """imgbuild/payload/engine_gpus.py, the probe the engine runs in an image: run here by a bare python3 (-I -S:
    no site-packages, no imgbuild) where there is no nvidia-smi, it still answers, and the answer is one the judge
    reads as this machine's (no NVIDIA GPU on the bus)."""
    import subprocess
    import sys

    from imgbuild.gpu.engine_read import engine_read_env

    script = tmp_path / "probe.py"
    script.write_text(ENGINE_GPUS.probe().script)
    env = ENGINE_GPUS.probe().environment({"PATH": str(tmp_path), **engine_read_env()})  # no nvidia-smi here
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith(ENGINE_GPUS.marker)]
    answer = json.loads(line.removeprefix(ENGINE_GPUS.marker))
    assert set(answer) == {"pci_nvidia", "smi"} and all(a["code"] == 127 for a in answer["smi"].values())
    assert judge_engine_read(0, done.stdout, "", False).present is False


def test_a_gpu_far_under_its_datasheet_warns_though_its_ratio_passes():
    """Half clocks or a low power cap halve every dtype alike: the ratio passes, the absolute figure does not."""
    report = smoke_report.Report()
    report.run("tensor cores", smoke_throughput.torch_tensor_cores, _clocked_torch([5.0], speedup=14.0))
    (entry,) = report.checks
    assert entry["status"] == "warn" and "under half of NVIDIA A100-SXM4-80GB's datasheet 312" in entry["reason"]
    assert entry["details"]["gpus"][0]["datasheet_tflops"] == 312.0


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H20", 148.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L40", 181.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA GeForce RTX 4090", 165.2),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA GB200", 2500.0),
        ("Tesla V100-SXM2-16GB", 112.0),
        ("NVIDIA A10G", None),  # no datasheet figure recorded: no absolute check
        ("Some Future GPU", None),
    ],
)
def test_each_models_datasheet_figure_is_found_by_its_name(name, peak):
    assert smoke_throughput.datasheet_tflops(name) == peak


def test_the_gpu_budget_is_the_settings_and_a_spent_one_skips_naming_it():
    assert smoke_budget.configured_gpu_seconds("90") == 90.0
    for bad in ("", "0", "-5", "1e9", "٩٠", "99999999"):
        assert smoke_budget.configured_gpu_seconds(bad) == float(smoke_budget.GPU_SECONDS), bad
    now = [100.0]
    budget = smoke_budget.Budget(30, clock=lambda: now[0])
    assert budget.left("the NCCL all-reduce") == pytest.approx(30)
    now[0] = 129.5
    with pytest.raises(
        smoke_report.Skip, match=r"budget \(30 s, setting smoke_gpu_seconds\) is spent before torch.compile"
    ):
        budget.left("torch.compile")


def test_the_gpu_budget_default_is_the_one_limit():
    from imgbuild import limits

    assert smoke_budget.GPU_SECONDS == limits.SMOKE_GPU_SECONDS


def _gpu_torch(capabilities, names=None, nccl=True, **extra):
    names = names or ["NVIDIA H100 80GB HBM3"] * len(capabilities)
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: len(capabilities),
        get_device_capability=lambda i: capabilities[i],
        get_device_name=lambda i: names[i],
    )
    distributed = types.SimpleNamespace(is_available=lambda: nccl, is_nccl_available=lambda: nccl)
    return types.SimpleNamespace(cuda=cuda, distributed=distributed, __version__="2.9.0", **extra)


def test_the_new_gpu_checks_skip_with_their_reason_where_they_cannot_apply():
    budget = smoke_budget.Budget(60)
    no_gpu = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    report = smoke_report.Report()
    for name, check in (
        ("nccl", smoke_collectives.torch_nccl),
        ("p2p", smoke_collectives.torch_p2p),
        ("compile", smoke_compiling.torch_compile),
    ):
        report.run(name, check, no_gpu, budget)
    report.run("fp8", smoke_fp8.torch_fp8, no_gpu, budget)
    report.run("nccl", smoke_collectives.torch_nccl, _gpu_torch([(9, 0)], nccl=False), budget)
    report.run(
        "nccl", smoke_collectives.torch_nccl, _gpu_torch([(9, 0)], names=["NVIDIA H100 80GB HBM3 MIG 1g.10gb"]), budget
    )
    report.run("p2p", smoke_collectives.torch_p2p, _gpu_torch([(9, 0)]), budget)
    report.run("fp8", smoke_fp8.torch_fp8, _gpu_torch([(8, 0), (8, 6)]), budget)
    report.run("fp8", smoke_fp8.torch_fp8, _gpu_torch([(9, 0)]), budget)  # a torch without float8
    reasons = [(c["status"], c["reason"]) for c in report.checks]
    assert [s for s, _ in reasons] == ["skip"] * 9
    said = " | ".join(r for _, r in reasons)
    for words in ("no GPU visible", "built without NCCL", "MIG instance", "one GPU: no peer", "sm_89 and later",
                  "has no FP8 matrix product"):  # fmt: skip
        assert words in said, words


def test_the_all_reduce_ranks_are_one_process_per_gpu_bounded_and_each_failure_is_one_line(tmp_path):
    fine = tmp_path / "fine"
    fine.write_text(
        '#!/bin/sh\necho "${IMGBUILD_PROBE_MARKER}{\\"rank\\": $RANK, \\"ok\\": true, \\"seconds\\": 0.01}"\n'
    )
    hangs = tmp_path / "hangs"
    hangs.write_text("#!/bin/sh\nexec sleep 30\n")
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'NCCL WARN Cuda failure 804 forward compatibility was attempted'\nexit 1\n")
    for path in (fine, hangs, broken):
        path.chmod(0o755)
    reports = smoke_collectives.run_ranks(4, 30, 16, python=str(fine))
    assert [r["rank"] for r in reports] == [0, 1, 2, 3] and all(r["ok"] for r in reports)
    start = time.monotonic()
    with pytest.raises(smoke_report.Fail, match="did not finish in 1 s"):
        smoke_collectives.run_ranks(2, 1, 16, python=str(hangs))
    assert time.monotonic() - start < 10
    with pytest.raises(smoke_report.Fail, match="NCCL rank 0 of 2 failed: NCCL WARN Cuda failure 804"):
        smoke_collectives.run_ranks(2, 30, 16, python=str(broken))


def test_a_compile_failure_names_the_gpu_and_the_cure():
    """Without torch here, the compiling process fails as a broken Triton would: the check says which GPU and why,
    in one line; ptxas's failure on a GPU it does not know gets its cure."""
    report = smoke_report.Report()
    report.run(
        "torch.compile", smoke_compiling.torch_compile, _gpu_torch([(12, 1)], compile=object()), smoke_budget.Budget(60)
    )
    (entry,) = report.checks
    assert entry["status"] == "fail" and entry["reason"].startswith("torch.compile on GPU 0 (sm_121) failed: ")
    assert "\n" not in entry["reason"]
    cure = smoke_compiling.compile_cure("ptxas fatal   : Value 'sm_121a' is not defined for option 'gpu-name'")
    assert "TRITON_PTXAS_PATH" in cure


@pytest.mark.parametrize("name", ["mi250x", "MI300A", "gfx90a", "AMD MI250X"])
def test_an_amd_gpu_is_named_out_of_scope_not_unknown(name):
    with pytest.raises(UsageError, match="an AMD GPU; NGC images are CUDA builds"):
        parse_target(name)


def _clocked_tf(gpus: list, fp32: float = 19.5, speedup: float = 14.0) -> types.SimpleNamespace:
    """A TensorFlow whose GPUs (capability, name) run matmuls at `fp32` TFLOP/s in float32 and `speedup` times that
    in float16 and bfloat16, each advancing one clock (`tf.now`); what was timed is kept in `tf.timed`."""
    import contextlib

    state = {"device": None, "clock": 0.0, "tf32": True}
    timed: list = []

    class Tensor:
        def __init__(self, n, dtype, device):
            self.n, self.dtype, self.device = n, dtype, device

        def __getitem__(self, _index):
            return self

        def numpy(self):
            return 0.0

    @contextlib.contextmanager
    def device(name):
        before, state["device"] = state["device"], int(name.rsplit(":", 1)[1])
        try:
            yield
        finally:
            state["device"] = before

    def matmul(a, _b):
        state["clock"] += 2 * a.n**3 / (fp32 * (1 if a.dtype == "float32" else speedup) * 1e12)
        if (a.device, a.dtype) not in timed:
            timed.append((a.device, a.dtype))
        return a

    physical = [types.SimpleNamespace(index=i) for i in range(len(gpus))]
    experimental = types.SimpleNamespace(
        enable_tensor_float_32_execution=lambda on: state.update(tf32=on),
        get_device_details=lambda gpu: {"compute_capability": gpus[gpu.index][0], "device_name": gpus[gpu.index][1]},
    )
    return types.SimpleNamespace(
        config=types.SimpleNamespace(list_physical_devices=lambda kind: physical, experimental=experimental),
        device=device,
        random=types.SimpleNamespace(normal=lambda shape, seed: Tensor(shape[0], "float32", state["device"])),
        cast=lambda x, dtype: Tensor(x.n, dtype, state["device"]),
        linalg=types.SimpleNamespace(matmul=matmul),
        float32="float32",
        float16="float16",
        bfloat16="bfloat16",
        now=lambda: state["clock"],
        state=state,
        timed=timed,
    )


def _tf_speed(tf, seconds: float = 300.0) -> dict:
    report = smoke_report.Report()
    budget = smoke_budget.Budget(seconds, clock=tf.now)
    report.run("tensor cores", smoke_throughput.tf_tensor_cores, tf, budget, tf.now)
    (entry,) = report.checks
    return entry


@pytest.mark.parametrize("speedup, status", [(14.0, "pass"), (7.0, "warn"), (1.5, "fail")])
def test_tensorflows_mixed_precision_speed_is_judged_on_every_gpu_as_pytorchs_is(speedup, status):
    """A100 (floor 8x, no tensor core below 6x): fp32 with TF32 off against mixed_float16's and mixed_bfloat16's
    compute dtypes, on each GPU, with the same verdicts and numbers as the PyTorch check."""
    tf = _clocked_tf([((8, 0), "NVIDIA A100-SXM4-80GB")] * 2, speedup=speedup)
    entry = _tf_speed(tf)
    assert entry["status"] == status, entry["reason"]
    assert tf.state["tf32"] is False
    assert tf.timed == [(i, dtype) for i in (0, 1) for dtype in ("float32", "float16", "bfloat16")]
    gpus = entry["details"]["gpus"]
    assert [g["index"] for g in gpus] == [0, 1] and all(g["fp32_tflops"] == 19.5 for g in gpus)
    assert all(g["speedup"] == pytest.approx(speedup, abs=0.05) and g["floor"] == 8.0 for g in gpus)
    assert entry["details"]["policies"] == "mixed_float16 and mixed_bfloat16"


def test_tensorflows_speed_check_times_bf16_only_where_the_architecture_has_it_and_honours_the_override(monkeypatch):
    tf = _clocked_tf([((7, 0), "Tesla V100-SXM2-32GB")], fp32=15.7, speedup=8.0)
    entry = _tf_speed(tf)
    assert entry["status"] == "pass" and tf.timed == [(0, "float32"), (0, "float16")], entry["reason"]
    assert entry["details"]["gpus"][0]["bf16_tflops"] is None and entry["details"]["policies"] == "mixed_float16"
    monkeypatch.setenv("IMGBUILD_SMOKE_MIN_SPEEDUP", "100")
    entry = _tf_speed(_clocked_tf([((7, 0), "Tesla V100-SXM2-32GB")], fp32=15.7, speedup=8.0))
    assert entry["status"] == "fail" and "smoke.min_speedup" in entry["reason"]


def test_tensorflows_speed_check_warns_a_gpu_far_under_its_datasheet():
    entry = _tf_speed(_clocked_tf([((9, 0), "NVIDIA H200")], fp32=20.0, speedup=14.0))  # 280 of 989
    assert entry["status"] == "warn" and "under half of NVIDIA H200's datasheet 989" in entry["reason"]


def test_tensorflows_speed_check_skips_without_a_gpu_or_a_capability_and_keeps_to_its_budget():
    assert _tf_speed(_clocked_tf([]))["reason"] == "no GPU visible"
    assert "compute capability" in _tf_speed(_clocked_tf([((), "NVIDIA A100")]))["reason"]
    # one fp32 matmul of 8192 at 1 TFLOP/s takes 1.1 s on the clock: the first GPU spends a 5 s budget
    slow = [((8, 0), "a GPU no datasheet names")] * 3
    entry = _tf_speed(_clocked_tf(slow, fp32=1.0, speedup=14.0), seconds=5)
    assert entry["status"] == "pass" and [g["index"] for g in entry["details"]["gpus"]] == [0]
    assert "GPU 1 and after not measured" in entry["reason"] and "smoke_gpu_seconds" in entry["reason"]
    entry = _tf_speed(_clocked_tf(slow), seconds=0.5)
    assert entry["status"] == "skip" and "spent before TensorFlow's tensor-core speed on GPU 0" in entry["reason"]


def test_the_tensorflow_run_checks_tensor_core_speed_after_mixed_precision_within_the_gpu_budget(monkeypatch):
    ran = []
    tf = types.SimpleNamespace(
        __version__="2.17.0",
        config=types.SimpleNamespace(list_physical_devices=lambda kind: [], experimental=None),
    )
    monkeypatch.setattr(smoke_runners, "import_framework", lambda report, module, framework: tf)
    for name in dir(smoke_runners):
        if name.startswith(("tf_", "check_")):
            monkeypatch.setattr(smoke_runners, name, lambda *args, name=name: ran.append((name, args[1:])) or {})
    monkeypatch.setenv("IMGBUILD_SMOKE_GPU_SECONDS", "42")
    smoke_runners.run_tensorflow(smoke_report.Report())
    names = [name for name, _ in ran]
    assert names.index("tf_tensor_cores") == names.index("tf_mixed_precision") + 1
    (budget,) = [args[0] for name, args in ran if name == "tf_tensor_cores"]
    assert isinstance(budget, smoke_budget.Budget) and budget.seconds == 42


# --- properties of the verdict over every model, release and driver ------------------------------------------

PROPERTY = settings(derandomize=True, max_examples=80, deadline=None, database=None)
MODELS = st.sampled_from(sorted(SUPPORT.models))
RELEASES = st.sampled_from(NGC_RELEASES_FACTS)
BRANCH_NUMBERS = st.sampled_from([450, 470, 525, 535, 545, 550, 560, 565, 570, 575, 580, 590, 595, 610, 615])
PARTS = st.tuples(st.integers(0, 200), st.integers(0, 99))


def _runs(release, key: str, driver: str, datacenter: bool | None = None) -> bool:
    target = parse_target(key)
    if datacenter is not None:
        target = replace(target, datacenter=datacenter)
    return judge_tag(release.release, release.cuda, release.archs, [target], driver, (), release.variants)[0].runs


def _driver(branch: int, parts: tuple[int, int]) -> str:
    return f"{branch}.{parts[0]}.{parts[1]:02d}"


@PROPERTY
@given(RELEASES, MODELS, BRANCH_NUMBERS, PARTS, PARTS)
def test_a_newer_driver_of_the_same_branch_never_stops_what_an_older_one_runs(release, key, branch, one, two):
    older, newer = sorted((one, two))
    if _runs(release, key, _driver(branch, older)):
        assert _runs(release, key, _driver(branch, newer)), (release.release, key, older, newer)


@PROPERTY
@given(RELEASES, st.sampled_from([k for k, m in SUPPORT.models.items() if m.min_driver]), PARTS)
def test_no_driver_below_a_models_own_minimum_runs_anything(release, key, parts):
    minimum = SUPPORT.models[key].min_driver
    branch = int(minimum.split(".")[0])
    driver = _driver(branch, parts)
    if tuple(int(p) for p in driver.split(".")) < tuple(int(p) for p in minimum.split(".")):
        assert not _runs(release, key, driver), (release.release, key, driver)


@PROPERTY
@given(RELEASES, MODELS, BRANCH_NUMBERS, PARTS)
def test_no_driver_runs_a_gpu_on_a_branch_outside_its_architectures(release, key, branch, parts):
    model = SUPPORT.models[key]
    first, last = SUPPORT.arch_branches[model.capability]
    if key not in SUPPORT.tegra_drivers and (branch < first or (last is not None and branch > last)):
        assert not _runs(release, key, _driver(branch, parts))


@PROPERTY
@given(st.sampled_from(sorted(RECORDED)), MODELS, BRANCH_NUMBERS, PARTS, st.booleans())
def test_below_minor_version_compatibility_only_a_branch_nvidias_own_image_lists_runs(cuda, key, branch, parts, dc):
    """Where neither the release's own driver nor its major's minor-version floor is met, the only way left is
    forward compatibility: on a data-center GPU, on a branch the release's NVIDIA_REQUIRE_CUDA names."""
    release = next((r for r in NGC_RELEASES_FACTS if r.cuda == f"{cuda[0]}.{cuda[1]}"), None)
    release = release or NgcRelease("recorded", f"{cuda[0]}.{cuda[1]}", "")
    driver = _driver(branch, parts)
    floor = SUPPORT.minor_version_floor(cuda[0]) or ""
    below = tuple(int(p) for p in driver.split(".")) < tuple(int(p) for p in floor.split("."))
    if key not in SUPPORT.tegra_drivers and below and _runs(release, key, driver, dc):
        assert dc and branch in RECORDED[cuda], (cuda, key, driver, dc)


@PROPERTY
@given(RELEASES, MODELS, BRANCH_NUMBERS, PARTS)
def test_a_geforce_never_runs_what_the_same_gpu_as_a_data_center_part_does_not(release, key, branch, parts):
    driver = _driver(branch, parts)
    if _runs(release, key, driver, datacenter=False):
        assert _runs(release, key, driver, datacenter=True)


JETPACK = sorted((key, driver) for key, drivers in SUPPORT.tegra_drivers.items() for driver in drivers)


@PROPERTY
@given(RELEASES, st.sampled_from(JETPACK), PARTS)
def test_a_jetson_driver_newer_than_its_jetpacks_runs_at_least_what_that_jetpack_runs(release, jetpack, parts):
    key, driver = jetpack
    branch, *rest = (int(p) for p in driver.split("."))
    newer = f"{branch}.{rest[0] + parts[0] // 100}.{parts[1] + 1}"
    if _runs(release, key, driver):
        assert _runs(release, key, newer), (release.release, key, driver, newer)
