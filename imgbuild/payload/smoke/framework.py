"""The framework check: the image's framework is the base's own (its version, and the files it owns), and which
framework an image has."""

from __future__ import annotations

import importlib.util
import os

from . import dists
from .dists import _canonical, read_baseline
from .pipcheck import module_owners
from .report import Fail, Report
from .versions import normal_version, same_version


def expected_version(env_name: str) -> str:
    return os.environ.get("IMGBUILD_EXPECT_FRAMEWORK_VERSION") or os.environ.get(env_name, "")


def check_framework_version(module, version: str, env_name: str, baseline_path: str = "") -> dict:
    """The framework is the base's own. In an image imgbuild built, the distribution that provides the
    framework's module is exactly the one the base recorded before the recipe's layers (`dists.base`); in
    any other image, the module's version has the base's declared public version (NGC's env and torch's
    own string differ in their local part). Either way one distribution only may provide the module."""
    where = os.path.dirname(getattr(module, "__file__", "") or "")
    owners = module_owners(module.__name__)
    if len(owners) > 1:
        raise Fail(
            f"{module.__name__} is installed by {len(owners)} distributions ({', '.join(owners)}): one "
            "overwrote the other's files; the base's framework is no longer what it shipped"
        )
    baseline = read_baseline(baseline_path or dists.DISTS_BASELINE)
    if baseline is not None and owners:
        name, have = owners[0].rsplit(" ", 1)
        recorded = dict(baseline)
        if _canonical(name) not in recorded:
            raise Fail(
                f"{module.__name__} {version} is now provided by {name} {have}, which the base did not have: "
                f"something replaced the base's framework ({where})"
            )
        if recorded[_canonical(name)] != normal_version(have):
            raise Fail(
                f"{name} is {have} but the base carries {name} {recorded[_canonical(name)]}: something "
                f"replaced the base's framework ({where})"
            )
        return {
            "version": version,
            "distribution": f"{name} {have}",
            "location": where,
            "owners": owners,
            "reason": f"{version} ({name} {have}), the base's own",
        }
    want = expected_version(env_name)
    if not want:
        return {"version": version, "location": where, "reason": f"{version} (the base declares no version)"}
    if not same_version(version, want):
        raise Fail(
            f"{module.__name__} is {version} but the base carries {want}: "
            f"something replaced the base's framework ({where})"
        )
    return {"version": version, "location": where, "owners": owners, "reason": f"{version}, the base's own"}


def import_framework(report: Report, module: str, framework: str):
    """The framework module, or None with a failed `framework` check saying why it did not import."""
    import importlib

    try:
        loaded = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything, not only ImportError
        report.fail("framework", f"import {module} failed: {type(exc).__name__}: {exc}")
        return None
    report.meta["framework"] = framework
    return loaded


def detect_framework() -> str | None:
    if os.environ.get("PYTORCH_VERSION") or os.environ.get("NVIDIA_PYTORCH_VERSION"):
        return "pytorch"
    if os.environ.get("TENSORFLOW_VERSION") or os.environ.get("NVIDIA_TENSORFLOW_VERSION"):
        return "tensorflow"

    for name, module in (("pytorch", "torch"), ("tensorflow", "tensorflow")):
        if importlib.util.find_spec(module):
            return name
    return None
