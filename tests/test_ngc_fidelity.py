"""imgbuild against the strings real NGC images carry (tests/ngc_facts.py, from ../shared/docs/ngc-real-facts.md),
at unit level: every place that reads an NGC env value, label or version is fed the real one, release by release.
The stand-ins carry the same shapes (tests/test_testbed.py checks that they do)."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from imgbuild import ngc
from imgbuild.gpu import fleet
from imgbuild.payload.smoke import cudnn as smoke_cudnn
from imgbuild.payload.smoke import framework as smoke_framework
from imgbuild.payload.smoke import report as smoke_report
from imgbuild.payload.smoke import versions as smoke_versions
from imgbuild.pipeline import baserules, plan
from tests import ngc_facts
from tests.ngc_facts import REAL

PYTORCH = [r for r in REAL.values() if r.framework == "pytorch"]
TENSORFLOW = [r for r in REAL.values() if r.framework == "tensorflow"]
ALL = list(REAL.values())


def _config(release: ngc_facts.Release, platform: str = "amd64") -> dict:
    env = release.config_env(platform)
    return {"config": {"Env": [f"{k}={v}" for k, v in env.items()], "Labels": release.labels(platform)}}


def _fake_dist(site: Path, name: str, version: str, module: str, module_version: str) -> types.ModuleType:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(module + "\n")
    (site / module).mkdir()
    (site / module / "__init__.py").write_text(f"__version__ = {module_version!r}\n")
    spec = importlib.util.spec_from_file_location(module, site / module / "__init__.py")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


@pytest.fixture
def framework_site(tmp_path, monkeypatch):
    """An empty site folder first on the path: the fake framework made in it is the only owner of its module."""
    import importlib.metadata as md

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(md, "distributions", lambda: md.Distribution.discover(path=[str(site)]))
    return site


@pytest.mark.parametrize("release", ALL, ids=lambda r: r.key)
def test_the_base_s_own_framework_passes_the_framework_check_on_every_real_release(
    release, framework_site, tmp_path, monkeypatch
):
    """Since 24.03 PYTORCH_VERSION (2.9.0a0+145a3a7) and torch.__version__
    (2.9.0a0+145a3a7bda.nv25.10) differ; the check failed every real base."""
    module = _fake_dist(framework_site, release.dist_name, release.dist_version, "ngcfw", release.module_version)
    monkeypatch.setenv(release.version_env, release.config_env()[release.version_env])
    monkeypatch.delenv("IMGBUILD_EXPECT_FRAMEWORK_VERSION", raising=False)
    # a stock image (no record of the base): the declared public version decides
    details = smoke_framework.check_framework_version(
        module, release.module_version, release.version_env, str(tmp_path / "x")
    )
    assert details["reason"].endswith("the base's own")
    # an image imgbuild built: the record of the base, written by pip (normal form), decides
    record = tmp_path / "dists.base"
    record.write_text(f"numpy==2.1.0\n{release.dist_name}=={release.dist_version}\n")
    details = smoke_framework.check_framework_version(module, release.module_version, release.version_env, str(record))
    assert details["distribution"] == f"{release.dist_name} {release.dist_version}"


@pytest.mark.parametrize("release", PYTORCH, ids=lambda r: r.key)
def test_a_replaced_framework_fails_the_check_on_every_real_release(release, framework_site, tmp_path, monkeypatch):
    """pip replacing NGC's torch with PyPI's (the vLLM case): caught by the record and by the env alike."""
    module = _fake_dist(framework_site, "torch", "2.10.0", "ngcfw", "2.10.0+cu130")
    monkeypatch.setenv("PYTORCH_VERSION", release.env["PYTORCH_VERSION"])
    record = tmp_path / "dists.base"
    record.write_text(f"torch=={release.dist_version}\n")
    with pytest.raises(smoke_report.Fail, match=r"torch is 2\.10\.0 but the base carries torch .*something replaced"):
        smoke_framework.check_framework_version(module, "2.10.0+cu130", "PYTORCH_VERSION", str(record))
    with pytest.raises(smoke_report.Fail, match="something replaced the base's framework"):
        smoke_framework.check_framework_version(module, "2.10.0+cu130", "PYTORCH_VERSION", str(tmp_path / "none"))


def test_the_framework_under_a_name_the_base_did_not_have_fails(framework_site, tmp_path):
    module = _fake_dist(framework_site, "tensorflow-cpu", "2.17.0", "ngcfw", "2.17.0")
    record = tmp_path / "dists.base"
    record.write_text("tensorflow==2.17.0+nv25.2\n")
    with pytest.raises(smoke_report.Fail, match="provided by tensorflow-cpu 2.17.0, which the base did not have"):
        smoke_framework.check_framework_version(module, "2.17.0", "TENSORFLOW_VERSION", str(record))


@pytest.mark.parametrize(
    ("metadata", "pip"),
    [
        ("2.6.0a0+ecf3bae40a.nv25.01", "2.6.0a0+ecf3bae40a.nv25.1"),  # [PIPNORM]
        ("2.10.0a0+a36e1d39eb.nv26.01.42222806", "2.10.0a0+a36e1d39eb.nv26.1.42222806"),  # [T26.01b]
        ("2.17.0+nv25.2", "2.17.0+nv25.2"),
        ("V1.0", "1.0"),
    ],
)
def test_versions_compare_in_pip_s_normal_form(metadata, pip):
    assert smoke_versions.normal_version(metadata) == smoke_versions.normal_version(pip) == str(Version(pip))


@pytest.mark.parametrize("release", ALL, ids=lambda r: r.key)
def test_the_facts_read_from_a_real_config(release):
    """CUDA from CUDA_VERSION (never the label com.nvidia.cuda.version, which is 9.0 in every release),
    Python from the paths, the framework version as the env writes it."""
    facts = ngc.describe_config(_config(release))
    assert facts["cuda"] == release.env["CUDA_VERSION"]
    assert facts["python"] == release.python.rsplit(".", 1)[0]
    assert facts["framework"] == release.framework
    assert facts["framework_version"] == release.env[release.version_env]
    assert (
        facts["release"]
        == release.config_env()[
            "NVIDIA_PYTORCH_VERSION" if release.framework == "pytorch" else "NVIDIA_TENSORFLOW_VERSION"
        ]
    )
    assert facts["cudnn"] == release.env.get("CUDNN_VERSION", "")


def test_a_config_without_cuda_version_is_not_read_as_cuda_9():
    config = {"config": {"Env": ["PYTORCH_VERSION=2.9.0a0+145a3a7"], "Labels": ngc_facts.COMMON_LABELS}}
    assert ngc.describe_config(config)["cuda"] == ""


@pytest.mark.parametrize("release", PYTORCH, ids=lambda r: r.key)
def test_the_protected_pin_admits_the_real_torch(release):
    """The plan's pin (public version) admits the installed torch in pip's form, local part and all."""
    base = plan.BaseImage(ref=f"nvcr.io/{release.repo}:{release.tag}", facts=ngc.describe_config(_config(release)))
    (pin,) = baserules.protected_pins(base)
    assert Requirement(pin).specifier.contains(Version(release.dist_version), prereleases=True)


@pytest.mark.parametrize(
    "release", [r for r in PYTORCH if Version(r.module_version).is_prerelease], ids=lambda r: r.key
)
def test_a_requirement_written_for_the_release_is_explained_as_the_pre_release_trap(release):
    """`torch>=2.9` on 25.10 (torch 2.9.0a0): PEP 440 excludes it, and the message says why and what to write."""
    base = plan.BaseImage(ref=f"nvcr.io/{release.repo}:{release.tag}", facts=ngc.describe_config(_config(release)))
    release_version = Version(release.module_version).base_version
    short = ".".join(release_version.split(".")[:2])
    message, hint = baserules.framework_conflict(Requirement(f"torch>={short}"), base)
    assert f"torch>={short} is not met by the base's torch {release.env['PYTORCH_VERSION']}" in message
    assert "pre-release" in message and "PEP 440" in message
    assert f"torch>={Version(release.module_version).public}" in hint
    # a requirement past the release is a plain conflict; one below it is met
    nxt = f"{int(short.split('.')[0])}.{int(short.split('.')[1]) + 1}"
    assert "pre-release" not in baserules.framework_conflict(Requirement(f"torch>={nxt}"), base)[0]
    assert baserules.framework_conflict(Requirement("torch>=2.0"), base) is None


def _guard():
    path = plan.PAYLOAD_DIR / "pip_guard.py"
    spec = importlib.util.spec_from_file_location("pip_guard", path)
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    return guard


@pytest.mark.parametrize(
    "release", [r for r in PYTORCH if Version(r.module_version).is_prerelease], ids=lambda r: r.key
)
def test_a_dependency_written_for_the_release_names_the_package_and_the_trap(release):
    """pip's own conflict lines, with the constraint as NGC's file writes it (pip form)."""
    guard = _guard()
    watch = guard.Watch()
    short = ".".join(Version(release.module_version).base_version.split(".")[:2])
    for line in (
        "ERROR: Cannot install fancylib==1.4 because these package versions have conflicting dependencies.",
        "The conflict is caused by:",
        f"    The user requested (constraint) torch=={release.dist_version}",
        f"    fancylib 1.4 depends on torch>={short}",
        "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/",
    ):
        watch.see(line.strip())
    why = watch.failure("the base's /etc/pip/constraint.txt")
    assert why.startswith(f"fancylib 1.4 needs torch>={short}, which the base's torch=={release.dist_version}")
    assert "pre-release" in why and "pin fancylib to an older release" in why


@pytest.mark.parametrize("release", [r for r in ALL if r.arch_lists], ids=lambda r: r.key)
def test_fleet_checks_read_the_real_cuda_version_and_arch_lists(release):
    """CUDA_VERSION in NGC's four-field form (13.0.2.006) and each platform's TORCH_CUDA_ARCH_LIST."""
    for platform, archs in release.arch_lists.items():
        facts = ngc.describe_config(_config(release, platform))
        assert facts["arch_list"] == archs
        verdicts = fleet.judge_tag(release.tag, facts["cuda"], facts["arch_list"], fleet.parse_targets("h100"), None)
        assert [v.runs for v in verdicts] == [True], verdicts
    assert fleet.cuda_of(release.env["CUDA_VERSION"]) == tuple(
        int(p) for p in release.env["CUDA_VERSION"].split(".")[:2]
    )


@pytest.mark.parametrize(
    ("loaded", "declared"),
    [(8905, "8.9.5.29"), (8907, "8.9.7.29+cuda12.2"), (90100, "9.1.0.70"), (91400, "9.14.0.64")],
)
def test_cudnn_as_torch_reports_it_matches_the_env_as_ngc_writes_it(loaded, declared):
    assert smoke_versions.version_prefix_agrees(smoke_cudnn.cudnn_text(loaded), declared, 3)


@pytest.mark.parametrize("release", ALL, ids=lambda r: r.key)
def test_the_framework_is_detected_from_the_real_env(release, monkeypatch):
    for name in ("PYTORCH_VERSION", "NVIDIA_PYTORCH_VERSION", "TENSORFLOW_VERSION", "NVIDIA_TENSORFLOW_VERSION"):
        monkeypatch.delenv(name, raising=False)
    for key, value in release.config_env().items():
        if key.endswith("_VERSION"):
            monkeypatch.setenv(key, value)
    assert smoke_framework.detect_framework() == release.framework


def test_the_stand_ins_keep_every_ngc_shape_but_the_public_version():
    """What the bed builds: the real strings with only the public version replaced (README's table)."""
    s = ngc_facts.standin("pytorch:24.05-py3", "2.13.0a0")
    assert s["env"]["amd64"]["PYTORCH_VERSION"] == "2.13.0a0+07cecf4"
    assert s["module_version"] == "2.13.0a0+07cecf4168.nv24.05"
    assert s["dist_version"] == "2.13.0a0+07cecf4168.nv24.5"
    assert s["labels"]["amd64"]["com.nvidia.cuda.version"] == "9.0"
    assert s["env"]["amd64"]["NVIDIA_REQUIRE_CUDA"] == "cuda>=9.0"
    assert "PIP_CONSTRAINT" not in s["env"]["amd64"] and not s["constraint_file"]
    s = ngc_facts.standin("pytorch:26.01-py3", "2.13.0a0")
    assert s["dist_version"] == "2.13.0a0+a36e1d39eb.nv26.1.42222806" and s["constraint_file"]
    assert s["env"]["amd64"]["TORCH_CUDA_ARCH_LIST"] != s["env"]["arm64"]["TORCH_CUDA_ARCH_LIST"]
    s = ngc_facts.standin("tensorflow:25.02-tf2-py3", "2.21.0")
    assert s["dist_name"] == "tensorflow" and s["dist_version"] == "2.21.0+nv25.2"
    assert s["env"]["amd64"]["TENSORFLOW_VERSION"] == "2.21.0"
    assert s["env"]["amd64"]["NVIDIA_TENSORFLOW_VERSION"] == "25.02-tf2"


def test_uv_s_folded_conflict_names_the_package_and_the_trap():
    """uv may fold the base's pin into another package's requirement before it explains (the timm set): the pin is
    the base's, as the base's constraint file (the guard's first -c file) says."""
    watch = _guard().Watch({"torch": [("torch==2.13.0a0+07cecf4168.nv24.5", "the base's /etc/pip/constraint.txt")]})
    for line in (
        "error: No solution found when resolving dependencies",
        "  cause: Because torchvision==0.28.0 depends on torch==2.13.0 and timm>=1.0.31 depends on torch==2.13.0a0, "
        "we can conclude that timm>=1.0.31 and torchvision==0.28.0 are incompatible.",
    ):
        watch.see(line.strip())
    why = watch.failure("the base's /etc/pip/constraint.txt")
    assert why.startswith("torchvision 0.28.0 needs torch==2.13.0, which the base's torch==2.13.0a0"), why
    assert "pre-release" in why


@pytest.mark.parametrize(
    ("line", "framework"),
    [
        ("Because tensorflow<0 was requested and keras-hub depends on tensorflow, we can conclude", "tensorflow"),
        ("Because torchvision<0.28.0 depends on torch==2.12.0 and torch==2.13.0a0, we can conclude", ""),
        ("torch<0.4 is not available", ""),
    ],
)
def test_only_the_refused_other_name_reads_as_another_framework(line, framework):
    """`NAME<0` is imgbuild's refusal of another name of the framework; `torchvision<0.28.0` is a version range."""
    watch = _guard().Watch()
    watch.see(line)
    assert watch.other_framework == framework


@pytest.mark.parametrize(
    ("ipam", "gateway"),
    [
        ({"Subnet": "172.17.0.0/16"}, "172.17.0.1"),  # a dockerd 20.10 just started reports no Gateway
        ({"Subnet": "172.18.0.0/16", "Gateway": "172.18.0.9"}, "172.18.0.9"),
    ],
)
def test_the_bridge_gateway_is_found_on_a_fresh_engine_too(ipam, gateway):
    """A test read IPAM Gateway, which a fresh engine does not report: CI passed, a new machine failed."""
    from tests.conftest import bridge_gateway

    network = types.SimpleNamespace(attrs={"IPAM": {"Config": [ipam]}})
    client = types.SimpleNamespace(networks=types.SimpleNamespace(get=lambda name: network))
    assert bridge_gateway(client) == gateway


TESTBED = Path(__file__).parent / "testbed"


def _bundled_module():
    spec = importlib.util.spec_from_file_location("bundled", TESTBED / "bundled.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key", sorted(ngc_facts.BUNDLED))
def test_ngcs_bundled_distributions_are_written_as_metadata_that_python_reads_by_name_and_version(key, tmp_path):
    import importlib.metadata as md

    bundled = _bundled_module()
    for name, version, _ in ngc_facts.BUNDLED[key]:
        assert bundled.write_metadata_only(str(tmp_path), name, version)
    found = {(d.metadata["Name"], d.version) for d in md.distributions(path=[str(tmp_path)])}
    assert found == {(name, version) for name, version, _ in ngc_facts.BUNDLED[key]}
    assert all(
        not d.files or all(".dist-info/" in str(f) for f in d.files) for d in md.distributions(path=[str(tmp_path)])
    )


def test_pip_and_uv_see_the_bundled_distributions_and_resolve_against_them_offline(tmp_path):
    """What the stand-in carries for 25.10 is installed as far as both installers can tell: listed, and a recipe's
    `torchvision` is met by the base's own with no index asked."""
    import json
    import subprocess
    import sys

    import uv

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    python = tmp_path / "v" / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    pins = [f"{n}=={v}" for n, v, _ in ngc_facts.BUNDLED["pytorch:25.10-py3"]]
    assert subprocess.run([sys.executable, str(TESTBED / "bundled.py"), site, *pins]).returncode == 0
    environ = {"PATH": "/usr/bin:/bin", "UV_CACHE_DIR": str(tmp_path / "cache"), "UV_NO_CONFIG": "1"}
    listed = subprocess.run(
        [uv.find_uv_bin(), "pip", "list", "--python", str(python), "--format", "json"],
        capture_output=True,
        text=True,
        env=environ,
        check=True,
    ).stdout
    assert {f"{d['name']}=={d['version']}" for d in json.loads(listed)} == set(pins)
    pip_listed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "list", "--format=json"],
        capture_output=True,
        text=True,
        env={**environ, "PIP_CONFIG_FILE": "/dev/null"},
        check=True,
    ).stdout
    assert {f"{d['name']}=={d['version']}" for d in json.loads(pip_listed)} >= set(pins)
    met = subprocess.run(
        [uv.find_uv_bin(), "pip", "install", "--python", str(python), "--no-index", "--dry-run", "torchvision"],
        capture_output=True,
        text=True,
        env=environ,
    )
    assert met.returncode == 0 and "Would install" not in met.stderr + met.stdout, met.stderr


def test_the_bundled_writer_refuses_what_is_not_a_pin_and_keeps_a_real_build(tmp_path):
    bundled = _bundled_module()
    assert bundled.main(["bundled.py", str(tmp_path), "torchvision==0.24.0a0+094e7af5; rm -rf /"]) == 2
    assert bundled.write_metadata_only(str(tmp_path), "pytorch-triton", "3.4.0+gitc817b9b6")
    assert bundled.write_metadata_only(str(tmp_path), "pytorch_triton", "9.9") == ""  # one of that name is there


def _shape_module(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTBED))  # ngc_shape imports bundled from beside itself
    spec = importlib.util.spec_from_file_location("ngc_shape", TESTBED / "ngc_shape.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_pytorch_standin_carries_torchvision_beside_its_torch_and_its_release_s_recorded_stack():
    for key in (*ngc_facts.STANDIN_KEYS, ngc_facts.CUDA_STANDIN_KEY):
        pins = ngc_facts.standin(key, ngc_facts.BED_TORCH_PUBLIC)["bundled"]
        if ngc_facts.REAL[key].framework != "pytorch":
            assert pins == [], key
            continue
        assert pins[0].startswith(f"torchvision=={ngc_facts.BED_TORCHVISION_PUBLIC}"), key
    # 25.10's own string kept but for the public version; the rest as NGC names and versions them
    assert ngc_facts.standin(ngc_facts.CUDA_STANDIN_KEY, "2.13.0a0")["bundled"] == [
        "torchvision==0.28.0a0+094e7af5",
        "flash-attn==2.7.4.post1+25.10",
        "pytorch-triton==3.4.0+gitc817b9b6",
    ]
    assert ngc_facts.standin("pytorch:24.05-py3", "2.13.0a0")["bundled"] == ["torchvision==0.28.0a0"]


def test_the_shaping_gives_a_real_bundled_wheel_ngc_s_version_and_writes_the_others_as_metadata(tmp_path, monkeypatch):
    import importlib.metadata as md

    shape = _shape_module(monkeypatch)
    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    (site / "torchvision" / "version.py").write_text("__version__ = '0.28.0+cu130'\ncuda = '13.0'\n")
    info = site / "torchvision-0.28.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\nRequires-Dist: numpy\n"
        "Requires-Dist: torch (==2.13.0)\nRequires-Dist: torch==2.13.0; extra == 'x'\nRequires-Dist: scipy; extra == 'scipy'\n"
    )
    (info / "RECORD").write_text("torchvision-0.28.0.dist-info/METADATA,,\ntorchvision/version.py,,\n")
    monkeypatch.syspath_prepend(str(site))
    shape.write_bundled(str(site), ["torchvision==0.28.0a0+094e7af5", "flash-attn==2.7.4.post1+25.10"], "torch")
    found = {d.metadata["Name"]: d for d in md.distributions(path=[str(site)])}
    assert {name: d.version for name, d in found.items()} == {
        "torchvision": "0.28.0a0+094e7af5",
        "flash-attn": "2.7.4.post1+25.10",
    }
    assert found["torchvision"].requires == ["numpy", "torch", "torch; extra == 'x'", "scipy; extra == 'scipy'"]
    assert "__version__ = '0.28.0a0+094e7af5'\ncuda = '13.0'" in (site / "torchvision" / "version.py").read_text()
    assert not found["flash-attn"].files or all(".dist-info/" in str(f) for f in found["flash-attn"].files)


def test_only_a_release_with_wheels_gets_them_mounted_for_its_shaping(tmp_path):
    import json
    import shlex

    spec = importlib.util.spec_from_file_location("release", TESTBED / "release.py")
    assert spec and spec.loader
    release = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(release)
    plain, cuda = tmp_path / "plain", tmp_path / "cuda"
    release.context("pytorch:24.05-py3", "2.13.0a0", "frozen", plain, {})
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    release.context(ngc_facts.CUDA_STANDIN_KEY, "2.13.0a0", "frozen", cuda, {}, wheels=wheels)

    def shaping(folder):
        run = next(ln for ln in (folder / "Dockerfile").read_text().splitlines() if "python3 /tmp/shape/" in ln)
        words = shlex.split(run)
        return json.loads(words[words.index("/tmp/shape/ngc_shape.py") + 1])

    assert "--mount" not in (plain / "Dockerfile").read_text() and not (plain / "wheels").exists()
    assert shaping(plain)["nvcc"] == "" and shaping(plain)["bundled"] == ["torchvision==0.28.0a0"]
    assert shaping(plain)["wheel_folder"] == ""
    assert "--mount=type=bind,source=wheels,target=/tmp/wheels" in (cuda / "Dockerfile").read_text()
    assert shaping(cuda)["nvcc"] == "13" and shaping(cuda)["wheel_folder"] == "/tmp/wheels"
    assert (cuda / "wheels" / wheels.iterdir().__next__().name).is_file() and (cuda / "bundled.py").is_file()
    assert ngc_facts.standin(ngc_facts.CUDA_STANDIN_KEY, "0")["wheels"][0] == "torchvision==0.28.0"


def test_nvidia_s_compiler_wheels_become_a_system_toolkit_pip_never_lists(tmp_path, monkeypatch):
    """As in NGC, nvcc is /usr/local/cuda's, not a distribution: a recipe's jax[cuda13] still brings its own."""
    import importlib.metadata as md
    import os
    import zipfile

    shape = _shape_module(monkeypatch)
    folder, site, home = tmp_path / "wheels", tmp_path / "site", tmp_path / "cuda"
    folder.mkdir()
    with zipfile.ZipFile(folder / "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.whl", "w") as wheel:
        nvcc = zipfile.ZipInfo("nvidia/cu13/bin/nvcc")
        nvcc.external_attr = 0o755 << 16
        wheel.writestr(nvcc, "#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
        wheel.writestr("nvidia/cu13/bin/nvcc.profile", "TOP = $(_HERE_)/..\n")
        wheel.writestr("nvidia_cuda_nvcc-13.0.88.dist-info/METADATA", "Name: nvidia-cuda-nvcc\nVersion: 13.0.88\n")
    (site / "nvidia" / "cu13" / "include").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "include" / "cuda_runtime.h").write_text("/* the runtime's */\n")
    shape.install_wheels(str(folder), str(site), "13", cuda_home=str(home))
    assert os.access(home / "bin" / "nvcc", os.X_OK) and (home / "bin" / "nvcc.profile").is_file()
    assert (home / "include" / "cuda_runtime.h").read_text() == "/* the runtime's */\n"
    assert not list(md.distributions(path=[str(home), str(site)]))
