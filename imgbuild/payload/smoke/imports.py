"""The imports check: every module the recipe's distributions added imports, each failure said with its cause."""

from __future__ import annotations

import os

from . import dists
from .dists import (
    _added,
    _canonical,
    _distributions,
    _modules,
    read_baseline,
    read_known_good,
    record_fingerprint,
    requirement_names,
    shared_modules,
    unchanged_since_last,
)
from .framework import detect_framework
from .hints import (
    DRIVER_LIBRARIES,
    EXTENSION_ERROR,
    MISSING_NAME,
    apt_packages,
    drift,
    import_hint,
    missing_library,
    missing_tools,
    optional_dependency,
    other_cuda,
)
from .importing import (
    TIMED_OUT,
    configured_import_seconds,
    framework_seconds,
    import_all,
    import_budget,
    import_served,
    import_workers,
)
from .report import Fail, Skip, say


def _classify(work: list, results: list, owners: dict | None = None, needs: dict | None = None) -> tuple:
    """Import errors as (failures, needing the driver, needing an optional package, the apt packages that cure
    the failures: one list for all of them). `owners`: top-level module -> (distribution, version), for naming
    the other package of a name one imports from another; `needs`: each added distribution's requirement names,
    for naming what brought in a distribution the cure is to drop."""
    failures, driver_only, optional, apt = [], [], [], []
    added = {n for n, _, _ in work}
    framework = {"pytorch": "PyTorch", "tensorflow": "TensorFlow"}.get(detect_framework() or "", "framework build")
    for (name, version, _), errors in zip(work, results):  # noqa: B905 - runs on Python 3.8 images too
        for module, error in sorted(errors.items()):
            library = missing_library(error)
            absent = optional_dependency(module, error)
            if absent and name != "smoke.imports":
                optional.append(f"{name}: import {module} needs {absent}, which it does not require")
            elif library.startswith(DRIVER_LIBRARIES):
                driver_only.append(f"{name}: import {module} needs the NVIDIA driver ({library})")
            elif library:
                hint = import_hint(library, name)
                apt += [p for p in apt_packages(library, name) if p not in apt]
                failures.append(f"{name} {version}: import {module}: {library} is missing ({hint})")
            elif error.startswith(EXTENSION_ERROR):
                # a binary wheel: pip.no_build_isolation changes source builds only, and the installer would take
                # the same wheel again; what works is doing without it, or a source build against the base's own
                users = sorted(n for n, wants in (needs or {}).items() if name in wants and n != name)
                drop = (  # a dependency is dropped with what requires it: the recipe does not name it
                    f"drop {', '.join(users)}, which require{'s' if len(users) == 1 else ''} it"
                    if users
                    else f"drop {name} (what uses it optionally runs without it)"
                )
                failures.append(
                    f"{name} {version}: import {module}: it imports, but its compiled extension did not load "
                    f"({error[len(EXTENSION_ERROR) :]}): its wheel was built for another {framework} than the "
                    f"base's, and no recipe field changes a binary wheel: {drop}, or build it from source against "
                    f"the base's: a requirements file "
                    f"(pip.requirements) with the lines `--no-binary {name}` and `{name}`, and pip.no_build_isolation: "
                    f"[{name}] (it compiles: a base with a C++ compiler and, for CUDA code, nvcc)"
                )
            elif error.startswith(TIMED_OUT):
                failures.append(
                    f"{name} {version}: import {module}: {error}, twice (not an import error: the machine may be "
                    "busy; run the smoke test again, or raise smoke_import_timeout)"
                )
            else:
                said = drift(name, error, owners or {}, added)
                failures.append(f"{name} {version}: import {module}: {error}" + (f": {said}" if said else ""))
    return failures, driver_only, optional, apt


def other_cuda_builds(work: list, results: list) -> list:
    """[name, version, the CUDA major it was built for, the base's] of each added distribution whose import failed
    on another CUDA major's library."""
    builds = []
    for (name, version, _), errors in zip(work, results):  # noqa: B905 - runs on Python 3.8 images too
        for majors in {other_cuda(missing_library(e)) for e in errors.values()}:
            builds += [[name, version, *majors]] if majors else []
    return builds


def check_imports() -> dict:
    """Every package the recipe added imports: each distribution's top-level modules, in a fresh
    interpreter, plus the recipe's own `smoke.imports`; `smoke.skip_imports` names distributions to leave."""
    baseline = read_baseline(dists.DISTS_BASELINE)
    extra = [m for m in os.environ.get("IMGBUILD_SMOKE_IMPORTS", "").split() if m]
    skipped = {_canonical(n) for n in os.environ.get("IMGBUILD_SMOKE_SKIP_IMPORTS", "").split() if n}
    if baseline is None and not extra:
        raise Skip("no record of the base's packages (an image imgbuild did not build): nothing to compare")
    every = _distributions()
    added = _added(baseline or set(), every)
    work = [(n, d.version, m) for n, d in added if n not in skipped and (m := _modules(d))]
    needs = {n: requirement_names(d.requires) for n, d in added}
    present = {n: (d.version, record_fingerprint(d)) for n, d in added}
    unchanged = unchanged_since_last(work, read_known_good(), needs, present)
    work = [item for item in work if item[0] not in unchanged]
    if extra:
        work.append(("smoke.imports", "", extra))
    configured = configured_import_seconds(os.environ.get("IMGBUILD_SMOKE_IMPORT_SECONDS", ""))
    say(
        f"imports: {len(work) - bool(extra)} of {len(added)} added distribution(s) to import"
        + (" with smoke.imports" if extra else "")
        + f", {len(unchanged)} unchanged since the last promoted image"
    )
    results = import_served(work, configured, import_workers()) if work else []
    if results is None:  # no import server here: one interpreter per distribution, as before
        budget = import_budget(configured, framework_seconds(configured))
        results = import_all(work, budget, import_workers())
    drifted = any(MISSING_NAME.search(str(e)) for errors in results for e in errors.values())
    # who owns each top-level module (the first on the path wins), read only when an import needs it named
    owners = {m: (n, d.version) for n, d in reversed(every) for m in _modules(d)} if drifted else {}
    failures, driver_only, optional, apt = _classify(work, results, owners, needs)
    added_names = [n for n, _, _ in work]
    for name, tool, package in missing_tools(added_names):
        failures.append(f"{name}: runs `{tool}`, which is not installed (add apt: [{package}])")
        apt += [package] if package not in apt else []
    failures += shared_modules([(n, d.version, d.files) for n, d in every], added_names)
    checked = sum(len(m) for _, _, m in work)
    if failures:
        shown = "; ".join(failures[:4]) + (
            f"; and {len(failures) - 4} more (all in smoke.json)" if failures[4:] else ""
        )
        cure = f"; for all of them, add to the recipe: apt: [{', '.join(sorted(apt))}]" if apt else ""
        details = {"failures": failures[:2000], "apt": sorted(apt)}
        builds = other_cuda_builds(work, results)
        if builds:  # the build each needs: asked of the index by imgbuild (pipeline/smoke.py), not here
            details["other_cuda"] = builds[:50]
        slow = sum(f"{TIMED_OUT} after" in f for f in failures)
        said = [f"{len(failures) - slow} of {checked} module(s) do not import"] if len(failures) > slow else []
        said += [f"{slow} timed out (the machine busy?)"] if slow else []
        raise Fail(f"{'; '.join(said)}: {shown}{cure}", details)
    reason = f"{checked} module(s) of {len(work)} added distribution(s) import"
    if unchanged:
        reason += f"; {len(unchanged)} unchanged since the last promoted image, nor what they need: not re-imported"
    if optional:
        reason += f"; {len(optional)} need an optional package that is not installed: " + "; ".join(optional[:2])
    if driver_only:
        reason += f"; {len(driver_only)} need the driver, checked on a GPU host: " + "; ".join(driver_only[:2])
    return {"distributions": [f"{n}=={v}" for n, v, _ in work if v], "modules": checked, "reason": reason}
