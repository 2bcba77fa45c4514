"""Stage 5: run the in-image smoke test (payload/smoke, a package) through the engine, read its report, and judge the
image against the fleet it is meant for.

Where the engine's host has GPUs, the smoke test uses them or fails saying why: skipping the GPU half there
takes an explicit `skip_gpu`. The GPUs tested are picked by `imgbuild run`'s own selection (free ones,
by UUID), and the test runs as the image's user with the IPC / shm setting `imgbuild run` gives.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imgbuild import limits
from imgbuild.config.settings import Settings
from imgbuild.config.site import RunRules
from imgbuild.engine import ImageEngine
from imgbuild.errors import EnvironmentProblem, ImgbuildError
from imgbuild.facts import Label
from imgbuild.gpu.allocate import Claim, Selection
from imgbuild.gpu.engine_read import EngineGpus
from imgbuild.gpu.fleet import GpuFacts, Target, Verdict, blockers, judge_per_platform
from imgbuild.gpu.read import Gpu
from imgbuild.hostio.acting import container_user
from imgbuild.payload.probes import ENGINE_GPUS, SMOKE, Probe
from imgbuild.payload.smoke.report import PROGRESS
from imgbuild.platforms import arch_of_machine, platform_of_machine


@dataclass
class SmokeReport:
    image: str
    ok: bool
    checks: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def failures(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c["status"] == "fail"]

    def fail(self, name: str, reason: str, details: dict[str, Any] | None = None) -> None:
        self.checks.append({"name": name, "status": "fail", "reason": reason, "details": details or {}, "seconds": 0})
        self.ok = False

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "ok": self.ok, "note": self.note, "meta": self.meta, "checks": self.checks}

    def summary(self) -> str:
        failed = self.failures()
        if not failed:
            counts = {s: sum(c["status"] == s for c in self.checks) for s in ("pass", "skip", "warn")}
            return f"smoke test passed ({counts['pass']} passed, {counts['skip']} skipped, {counts['warn']} warned)"
        return "smoke test failed: " + "; ".join(f"{c['name']}: {c['reason']}" for c in failed)

    def gpu_facts(self) -> GpuFacts:
        """The image's CUDA and arch list as the framework inside it reports them."""
        archs = self.meta.get("arch_list") or []
        machine = arch_of_machine(str(self.meta.get("machine") or ""))
        return GpuFacts(
            self.image,
            str(self.meta.get("cuda") or ""),
            " ".join(archs),
            "the framework in the image",
            (machine,) if machine else (),  # the image the smoke test ran: one platform, the engine's
        )


#: Beside the script in /tmp (the payload's KNOWN_GOOD_FILE): what imported in the last promoted image.
KNOWN_GOOD_NAME = "imgbuild-smoke-known.txt"


def smoke_probe(known_good: tuple[str, ...] = ()) -> Probe:
    """The smoke test as the engine runs it: the smoke package beside its launcher, answering after its marker,
    with the file of what it may spare beside it (always written, empty when nothing is spared: an image's own
    never counts)."""
    known = "".join(f"{line}\n" for line in known_good).encode()
    return SMOKE.probe(files=((KNOWN_GOOD_NAME, known),))


def parse_output(image: str, code: int, output: str, note: str = "") -> SmokeReport:
    data = SMOKE.answer(output)
    if data is not None:
        try:
            ok = bool(data["ok"]) and code == 0
            meta = data.get("meta", {})
            return SmokeReport(image, ok, list(data["checks"]), meta if isinstance(meta, dict) else {}, note)
        except (KeyError, TypeError):
            pass
    tail = " | ".join(ln for ln in output.strip().splitlines()[-5:])
    report = SmokeReport(image, False, [], {}, note)
    report.fail("smoke script", f"exited {code} without a report: {tail[:400]}")
    return report


@dataclass(frozen=True)
class SmokeRequest:
    """What to smoke-test, and how."""

    image: str
    require_gpu: bool = False  # fail when no GPU is usable (implied where the engine's host has GPUs)
    skip_gpu: bool = False  # run no GPU check even where the host has GPUs (explicit)
    gpus: str = "1"  # which GPUs, as `imgbuild run --gpus` picks them
    min_speedup: float | None = None
    libraries_only: bool = False  # what needs no GPU: framework, CUDA libraries, arch list
    timeout: int = limits.SMOKE_SECONDS
    imports: tuple[str, ...] = ()  # modules to import besides the added packages' own
    skip_imports: tuple[str, ...] = ()  # distributions whose imports are not checked
    commands: tuple[str, ...] = ()  # the recipe's smoke.run: must succeed in the image
    accept_pip_check: tuple[str, ...] = ()  # distributions whose new `pip check` lines the recipe accepts
    #: `name==version fingerprint` of what imported in the last promoted image, with the same installed files
    #: (its RECORD's hash), on the same base and system layers (build.spared): not re-imported
    known_good: tuple[str, ...] = ()
    user: str = ""  # whose test it is (GPUs held by this user are theirs to test on); the caller's when empty
    import_seconds: int = 0  # one distribution's import budget on a quiet machine (setting smoke_import_timeout)
    gpu_seconds: int = 0  # the GPU checks' budget beyond one device's arithmetic (setting smoke_gpu_seconds)
    #: a foreign platform's image (linux/arm64 on an amd64 runner), run under qemu: no GPU check, and the report
    #: says what emulation cannot prove (EMULATION_UNPROVEN)
    emulated: str = ""
    #: the index the image's packages came from: a cure naming another CUDA build is checked there ("": not named)
    index_url: str = ""


#: What a smoke test under qemu leaves unproven, in the report's `emulation` check. No GPU is reachable from an
#: emulated process (the driver's libraries are the host's architecture), and qemu's speed is nobody's.
EMULATION_UNPROVEN = (
    "not proven under emulation: that the image sees a GPU, CUDA and cuDNN work, NCCL, tensor-core AMP and "
    "its speed (run `imgbuild smoke` on a {platform} GPU node for those; `smoke --for gh200,gb10` judges its "
    "CUDA and kernels against those GPUs from the registry)"
)


#: Who else holds which GPU on the engine's host, given the GPUs read there: UUID -> claims (the servers' ledger and
#: their containers). Its caller, which knows the host's rules, passes one (servers.run.gpu_claims); with none,
#: only the GPUs' own processes count. Stage 5 reads no ledger itself.
ClaimsOf = Callable[[ImageEngine, list[Gpu]], dict[str, list[Claim]]]
#: The site's GPU quota for whose test it is, given the GPUs chosen and who holds what: raises when the choice would
#: take them past it (servers.holds.quota_check). A smoke test for a user through sudo is a run of theirs.
QuotaCheck = Callable[[Selection, dict[str, list[Claim]]], None]


def host_gpus(engine: ImageEngine, image: str, settings: Settings | None = None) -> EngineGpus:
    """Whether the engine's host has GPUs, and from where to read them (settings `gpu_source`): this machine
    where the engine shares it; else through the engine, in a short-lived container of `image` given every
    GPU (a remote engine, or imgbuild in a container with the socket mounted: issue 28, review item 16)."""
    from imgbuild.gpu.engine_read import engine_read_env, judge_engine_read

    source = settings.gpu_source if settings is not None else "auto"
    if source == "auto":
        local = engine.shares_host() or bool(settings is not None and settings.gpu_snapshot)
        source = "local" if local else "engine"
    if source == "local":
        return EngineGpus(engine.host_has_gpus())
    code, output, note = engine.containers.run_script(
        image,
        ENGINE_GPUS.probe(),
        [],
        engine_read_env(),
        gpus=[],
        timeout=limits.GPU_READ_SECONDS,
        ipc=None,
        as_user=container_user(settings),
    )
    cdi = any("nvidia.com/gpu" in str(d) for d in engine.host_info().get("cdi_devices") or [])
    return judge_engine_read(code, output, note, cdi)


def _pick_gpus(
    req: SmokeRequest,
    settings: Settings | None,
    engine: ImageEngine,
    host: EngineGpus,
    claims: ClaimsOf | None,
    quota: QuotaCheck | None = None,
) -> tuple[list[str], list[str]]:
    """(UUIDs, MIG profiles) of the GPUs `imgbuild run --gpus REQUEST` would give, by its rules: none another user's
    process, container or starting run holds (`claims`). GPUs that cannot be read give [] (all) only to
    `--gpus all`; otherwise the smoke test stops, saying why."""
    from imgbuild.gpu.allocate import GpusBusy, select_gpus
    from imgbuild.gpu.read import NoGpus, read_gpus

    request = req.gpus

    try:
        if host.source == "engine" and host.readings is None:
            raise NoGpus(host.why or "the engine's GPUs could not be read")
        readings = (
            host.readings
            if host.readings is not None
            else read_gpus(settings.gpu_snapshot if settings is not None else None)
        )
    except NoGpus as exc:
        if request.strip().lower() == "all":  # asked for every GPU by name: no reading needed
            return [], []
        # a GPU host whose GPUs cannot be read: taking every GPU (other users' too) is not the way round it
        where, fix = ("this host", "fix nvidia-smi/NVML (imgbuild doctor)")
        if host.source == "engine":
            where, fix = ("the engine's host", "give its engine the NVIDIA Container Toolkit (or CDI specs)")
        raise ImgbuildError(
            f"{where} has GPUs but they cannot be read ({exc}), so none can be chosen for the smoke test: "
            f"{fix}, or say --gpus all, or skip the GPU half (--skip-gpu)"
        ) from None
    held = claims(engine, readings) if claims else {}
    try:
        user = req.user or (settings.caller.name if settings is not None else "")  # whose GPUs count as theirs
        chosen = select_gpus(request, readings, user, claims=held)
        if quota is not None:
            quota(chosen, held)
    except GpusBusy as busy:
        raise ImgbuildError(
            f"{busy}; the smoke test needs a free GPU: wait, or skip its GPU half explicitly (--skip-gpu)"
        ) from None
    return chosen.uuids, [g.mig_profile for g in chosen.gpus if g.mig_profile]


#: The variables of imgbuild's that the in-image smoke script reads (a test keeps this equal to what it reads).
SCRIPT_VARIABLES = (
    "IMGBUILD_EXPECT_FRAMEWORK_VERSION",
    "IMGBUILD_SMOKE_ACCEPT_PIP_CHECK",
    "IMGBUILD_SMOKE_IMPORTS",
    "IMGBUILD_SMOKE_GPU_SECONDS",
    "IMGBUILD_SMOKE_IMPORT_SECONDS",
    "IMGBUILD_SMOKE_MIN_SPEEDUP",
    "IMGBUILD_SMOKE_RUN",
    "IMGBUILD_SMOKE_SKIP_IMPORTS",
)


def _script_env(labels: dict[str, str], req: SmokeRequest) -> dict[str, str]:
    """What the in-image script is told: real fp32, the base framework's version, the recipe's smoke settings."""
    env = {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "0", "NVIDIA_TF32_OVERRIDE": "0"}
    # Every variable the script reads of imgbuild's is set here, empty where unused: an image's own ENV
    # (IMGBUILD_SMOKE_SKIP_IMPORTS, ...) never tells the smoke test what to spare; what imported before is a file.
    env.update(dict.fromkeys(SCRIPT_VARIABLES, ""))
    if req.import_seconds:
        env["IMGBUILD_SMOKE_IMPORT_SECONDS"] = str(req.import_seconds)
    if req.gpu_seconds:
        env["IMGBUILD_SMOKE_GPU_SECONDS"] = str(req.gpu_seconds)
    if labels.get(Label.BASE_FRAMEWORK_VERSION):
        env["IMGBUILD_EXPECT_FRAMEWORK_VERSION"] = labels[Label.BASE_FRAMEWORK_VERSION]
    if req.min_speedup:
        env["IMGBUILD_SMOKE_MIN_SPEEDUP"] = str(req.min_speedup)
    if req.imports:
        env["IMGBUILD_SMOKE_IMPORTS"] = " ".join(req.imports)
    if req.skip_imports:
        env["IMGBUILD_SMOKE_SKIP_IMPORTS"] = " ".join(req.skip_imports)
    if req.commands:
        env["IMGBUILD_SMOKE_RUN"] = json.dumps(list(req.commands))
    if req.accept_pip_check:
        env["IMGBUILD_SMOKE_ACCEPT_PIP_CHECK"] = " ".join(req.accept_pip_check)
    return env


class StepHeartbeat:
    """The smoke script's progress lines (`smoke.report.PROGRESS`) handed to `on_step` as they come, and the step
    under way said again every HEARTBEAT_SECONDS while nothing new comes (an import that takes 30 s). Used as
    `with StepHeartbeat(on_step) as heard: ...run_script(on_line=heard)`; nothing at all without `on_step`."""

    HEARTBEAT_SECONDS = 5.0

    def __init__(self, on_step: Callable[[str], None] | None):
        import threading

        self.on_step = on_step
        self.step = "starting the smoke test"
        self.since = self.started = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self) -> Callable[[str], None] | None:
        if self.on_step is None:
            return None
        self.on_step(self.step)
        self.thread.start()
        return self.heard

    def heard(self, line: str) -> None:
        """A check's start (`... `) is said only if it runs long (by the heartbeat); its end, and any other line
        of the script's, at once."""
        if not line.startswith(PROGRESS) or self.on_step is None:
            return
        text = "smoke " + " ".join(line[len(PROGRESS) :].split())[:200]
        self.step, self.since = text.removesuffix(" ..."), time.monotonic()
        if not text.endswith(" ..."):
            self.on_step(self.step)

    def _beat(self) -> None:
        while not self.stop.wait(self.HEARTBEAT_SECONDS):
            quiet = time.monotonic() - self.since
            if quiet >= self.HEARTBEAT_SECONDS and self.on_step is not None:
                self.on_step(f"{self.step}: still running ({time.monotonic() - self.started:.0f} s into the test)")

    def __exit__(self, *exc: object) -> None:
        self.stop.set()


def run_smoke(
    engine: ImageEngine,
    req: SmokeRequest,
    settings: Settings | None = None,
    host: EngineGpus | None = None,
    claims: ClaimsOf | None = None,
    quota: QuotaCheck | None = None,
    on_step: Callable[[str], None] | None = None,
) -> SmokeReport:
    """The smoke test of `req.image`; `host`: its engine's GPUs, when the caller has read them (host_gpus);
    `claims`: who else holds which GPU there (ClaimsOf); `on_step`: told each check as the script starts and ends
    it, and every few seconds of a check that takes long."""
    img = engine.images.image(req.image)
    if img is None:
        raise ImgbuildError(f"no image {req.image} in the engine (build or pull it first)")
    req = dataclasses.replace(req, emulated=req.emulated or _foreign(engine, img.architecture))
    from imgbuild.gpu.toolkit import image_preload_verdict

    read: list[EngineGpus] = [host] if host is not None else []

    def engine_host() -> EngineGpus:  # read once, and only where something depends on it
        if not read:
            read.append(host_gpus(engine, req.image, settings))
        return read[0]

    verdict = image_preload_verdict(
        list(img.config.get("Env") or []), lambda: engine_host().present, local=engine.shares_host()
    )
    if verdict and verdict[0] == "fail":  # NVIDIAScape: never started on a vulnerable GPU host
        raise ImgbuildError(f"{req.image}: {verdict[1]}")
    env = _script_env(img.labels, req)
    # `--gpus none` is a choice of no GPU, like --skip-gpu: never "every GPU" (issue 28, review item 10)
    no_gpu = req.skip_gpu or req.emulated != "" or req.gpus.strip().lower() in ("none", "")
    use_gpus = not no_gpu and not req.libraries_only and engine_host().present
    require_gpu = (req.require_gpu or use_gpus) and not req.libraries_only and not req.emulated
    args = ["--libraries-only"] if req.libraries_only else []
    args += ["--require-gpu"] if require_gpu else []
    house = settings.run if settings is not None else RunRules()  # the smoke container's IPC rule
    chosen, mig_profiles = _pick_gpus(req, settings, engine, engine_host(), claims, quota) if use_gpus else (None, [])
    with StepHeartbeat(on_step) as heard:
        code, output, note = engine.containers.run_script(
            req.image,
            smoke_probe(req.known_good),
            args,
            env,
            gpus=chosen,
            timeout=req.timeout,
            ipc=house.ipc_mode,
            shm_size=house.shm_size,
            as_user=container_user(settings),
            on_line=heard,
        )
    report = parse_output(req.image, code, output, note)
    if req.index_url:
        name_cuda_cures(report, req.index_url, (settings.pip_ca_bundle or True) if settings is not None else True)
    if req.emulated:
        report.meta["platform"], report.meta["emulated"] = req.emulated, True
        reason = f"{req.emulated} ran under qemu on this machine; " + EMULATION_UNPROVEN.format(platform=req.emulated)
        report.checks.append({"name": "emulation", "status": "skip", "reason": reason, "details": {}, "seconds": 0})
    if mig_profiles:  # the slice the GPU checks ran on: its figures are a slice's, not the whole GPU's
        report.meta["mig"] = mig_profiles
    if note and require_gpu:
        report.fail("gpu access", note + " (or skip the GPU checks explicitly: --skip-gpu)")
    return report


def name_cuda_cures(report: SmokeReport, index_url: str, verify: bool | str = True) -> None:
    """Each package whose import failed on another CUDA major's library (the imports check's `other_cuda`) gets its
    cure, checked against the index the recipe installs from: the build for the base's CUDA where the index has one,
    what would be needed where it has none. Each project asked once, each question bounded."""
    from imgbuild.pipeline.baserules import CudaBuildAnswer, other_cuda_cure, renamed_for
    from imgbuild.registry.pypi import cuda_builds, has_project

    for check in report.checks:
        rows = check.get("details", {}).get("other_cuda") if check.get("name") == "imports" else None
        if not isinstance(rows, list):
            continue
        cures = []
        for row in rows:
            if not (isinstance(row, list) and len(row) == 4 and all(isinstance(x, str) for x in row)):
                continue
            name, version, theirs, have = row
            releases = cuda_builds(index_url, name, have, verify=verify)
            renamed = renamed_for(name, have)
            there = has_project(index_url, renamed, verify=verify) if renamed and releases is not None else None
            answer = None if releases is None else CudaBuildAnswer(releases, renamed, there)
            cures.append(f"{name} {version}: {other_cuda_cure(name, theirs, have, answer)}")
        if cures:
            check["reason"] = f"{check.get('reason', '')}; " + "; ".join(cures)
            check["details"]["cures"] = cures


def _foreign(engine: ImageEngine, arch: str) -> str:
    """The platform of an image of another architecture than the engine's host (an arm64 image on an amd64 runner),
    which runs there only under emulation; "" for the host's own or an unknown one. Where the engine cannot run it,
    the one line that says what to install (exit 3), not an `exec format error` from inside."""
    platform = platform_of_machine(arch)
    if not platform or platform == engine.host_platform():
        return ""
    if refusal := engine.platform_refusal(platform):
        raise EnvironmentProblem(refusal)
    return platform


def add_fleet_check(
    report: SmokeReport,
    targets: list[Target],
    driver: str | None,
    platforms: tuple[str, ...] = (),
    variants: dict[str, dict[str, str]] | None = None,
) -> list[Verdict]:
    """Judge the fleet from what the image's framework reported; a target it cannot serve fails the report.
    `platforms`/`variants`: what the registry says of the image's other platforms (an arm64-only GPU is judged
    on the arm64 image's own arch list)."""
    if not targets:
        return []
    facts = report.gpu_facts()
    if platforms:
        facts = dataclasses.replace(facts, platforms=platforms)
    verdicts = judge_per_platform(facts, targets, driver, variants)
    blocked = blockers(verdicts)
    names = ", ".join(v.target for v in verdicts)
    details = {"verdicts": [v.to_json() for v in verdicts], "driver": driver or ""}
    if blocked:
        report.fail("fleet", "cannot run on " + "; ".join(blocked), details)
    else:
        jit = [v.target for v in verdicts if v.kernels == "ptx"]
        status = "warn" if jit else "pass"
        reason = f"runs on {names}" + (f" (driver {driver})" if driver else " (driver not checked)")
        if jit:
            reason += f"; {', '.join(jit)} only through PTX JIT (slow first start)"
        report.checks.append({"name": "fleet", "status": status, "reason": reason, "details": details, "seconds": 0})
    return verdicts


def declared_fleet(
    settings: Settings, recipe_targets: list[str], host: EngineGpus | bool
) -> tuple[list[Target], str | None]:
    """The fleet an image must serve: the site's (`fleet:`), the recipe's (`smoke.targets`), and the engine's host's
    GPUs when it has any (`host`: as host_gpus read them; True: this machine's); the driver is the site's, else
    the host's."""
    from imgbuild.gpu.fleet import check_driver, host_target, parse_targets

    targets = parse_targets([*settings.fleet_gpus, *recipe_targets]) if (settings.fleet_gpus or recipe_targets) else []
    driver = check_driver(settings.fleet_driver)
    host = host if isinstance(host, EngineGpus) else EngineGpus(host)
    if host.present:
        from imgbuild.gpu.read import NoGpus, read_devices

        readings = host.readings
        if readings is None and host.source == "local":
            try:
                readings, _ = read_devices(settings.gpu_snapshot)
            except NoGpus:
                readings = []
        for gpu in readings or []:
            target = host_target(gpu.name, gpu.compute_cap or "")
            if target is not None and all(t.capability != target.capability for t in targets):
                targets.append(target)
        driver = driver or next((g.driver for g in readings or [] if g.driver), None)
    return targets, driver


def fleet_report(
    engine: ImageEngine, image: str, targets: list[Target], driver: str | None, settings: Settings
) -> SmokeReport:
    """`imgbuild smoke IMAGE --for ...`: the GPU-free checks in the image, and a verdict per target. For a GPU
    that comes only in arm64 machines, a registry image's arm64 variant is read from the registry."""
    report = run_smoke(engine, SmokeRequest(image, libraries_only=True), settings)
    platforms, variants = _registry_platforms(image, settings) if any(t.cpu != "any" for t in targets) else ((), {})
    add_fleet_check(report, targets, driver, platforms, variants)
    return report


def _registry_platforms(image: str, settings: Settings) -> tuple[tuple[str, ...], dict[str, dict[str, str]]]:
    """(the platforms a registry image exists for, the other platforms' cuda and arch list); nothing for a local
    image or a registry that does not answer (then the image the engine holds is what is judged)."""

    from imgbuild import imageref
    from imgbuild.registry import tags as tagmod
    from imgbuild.registry.client import RegistryClient

    try:
        ref = imageref.parse(image)
    except imageref.BadReference:
        return (), {}
    if not ref.host or ref.digest:
        return (), {}
    info = tagmod.TagInfo(ref.tag or "latest", ref.tag or "latest", None)
    cache = tagmod.TagCache(Path(settings.cache_dir) / "registry", settings.tag_cache_ttl)
    try:
        tagmod.add_details(RegistryClient.for_host(ref.host, settings), ref.repository, [info], cache, workers=1)
    except ImgbuildError:
        return (), {}
    return info.platforms, info.variants
