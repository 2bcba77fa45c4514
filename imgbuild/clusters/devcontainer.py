"""VS Code dev containers: a `devcontainer.json` for a recipe's image, with `imgbuild run`'s house rules.

Pure: the plan, the site's `run:` rules and (on a shared server) what `imgbuild run` would choose in, the
JSON document out. On a laptop or a workstation of one's own, `hostRequirements.gpu: optional` (the Dev
Containers tooling passes GPUs where there are some); on a shared server, the GPUs, CPUs, name and labels
`imgbuild run` gives, so quotas, `ps`, `gpus` and the reaper see the container. The user is the recipe's,
with its UID moved to the person's own (`updateRemoteUserUID`), else the person's UID:GID; only a built image
is exported (the CLI would pull a name it does not find). IPC or shm, ulimits, capped logs, the site's
data mounts and env come from the same settings `imgbuild run` uses.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.config.site import RunRules
from imgbuild.engine.runargs import GPUS_HIDDEN, container_env, house_flags, resource_flags
from imgbuild.errors import EnvironmentProblem, UsageError
from imgbuild.facts import Label
from imgbuild.pipeline.plan import Plan
from imgbuild.servers.spec import THREAD_VARS, RunSpec

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.engine.types import ImageEngine

#: What a container the Dev Containers CLI starts cannot have of `imgbuild run`'s house rules, said to the user.
NOT_HONOURED = (
    "the GPUs and CPUs are chosen now, and the Dev Containers CLI starts the container later: imgbuild holds "
    "them only until then (start it soon, or export again if someone took them)",
    "no deadline (run.default_time, --time): the container's start is not known here; the reaper's idle rules "
    "apply to it as to any container named and labelled as yours",
)

#: `run.mounts` placeholders, as the Dev Containers spec spells them (resolved on the user's machine).
_PLACEHOLDERS = {"{user}": "${localEnv:USER}", "{home}": "${localEnv:HOME}"}


def _mount(spec: str, uid: int) -> str:
    """`/work/{user}:/work/{user}:ro` (docker -v form) as a devcontainer mount string."""
    source, _, rest = spec.partition(":")
    target, _, options = rest.partition(":")
    if not source or not target.startswith("/") or "," in spec:
        raise UsageError(f"config run.mounts: {spec[:80]!r} is not SOURCE:/TARGET[:ro]")

    def local(text: str) -> str:
        for placeholder, variable in _PLACEHOLDERS.items():
            text = text.replace(placeholder, variable)
        return text.replace("{uid}", str(uid))

    mount = f"source={local(source)},target={local(target)},type=bind"
    return mount + (",readonly" if "ro" in options.split(",") else "")


def run_args(house: RunRules) -> list[str]:
    """`docker run` flags of the house rules that the Dev Containers spec has no key for (the same flags
    `imgbuild run` passes, as single `--flag=value` words)."""
    options = RunSpec("", "", "", 0, 0, house=house).options()
    return [f"{flag}={value}" for flag, value in house_flags(options)]


def chosen_args(spec: RunSpec) -> tuple[list[str], dict[str, str]]:
    """(runArgs, containerEnv) for what `imgbuild run` chose on this shared server: its name, the caller's
    label, exactly the chosen GPUs (by UUID) with their labels, the CPU share and pinning, the threads."""
    options = spec.options()
    words = [("--name", spec.name), ("--label", f"{Label.USER}={spec.user}"), *resource_flags(options)]
    chosen = {name for name, _ in GPUS_HIDDEN} | {"NVIDIA_VISIBLE_DEVICES", *THREAD_VARS}
    return [f"{flag}={value}" for flag, value in words], {k: v for k, v in container_env(options) if k in chosen}


#: HOME for a host user the image has no account for (the container runs as their UID:GID): somewhere they can
#: write (VS Code's server and the shell keep their files there), inside the container only.
NO_ACCOUNT_HOME = "/tmp/home"


def user_keys(recipe_user: str | None, host_user: tuple[int, int] | None) -> dict[str, Any]:
    """Who the container and VS Code's processes run as, in the Dev Containers spec's keys. The recipe's user,
    its UID moved to the person's own by the CLI (`updateRemoteUserUID`: it rewrites named users only); else the
    host user's own UID:GID (what `imgbuild run` passes as `--user`), so files written into the mounted project
    are theirs, never root's; a root host user (nothing to map) keeps the image's user."""
    if recipe_user:
        return {"remoteUser": recipe_user, "containerUser": recipe_user, "updateRemoteUserUID": True}
    if host_user is None or host_user[0] == 0:
        return {}
    ids = f"{host_user[0]}:{host_user[1]}"
    return {"remoteUser": ids, "containerUser": ids, "updateRemoteUserUID": False}


def devcontainer(
    plan: Plan,
    house: RunRules,
    image: str | None = None,
    spec: RunSpec | None = None,
    host_user: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The devcontainer.json document for `plan`'s image (`image` overrides the built tag, e.g. a digest).

    `spec`: on a shared server, what `imgbuild run` chose (GPUs, CPUs, name): the container gets exactly
    that. Without it (a laptop, a workstation of one's own), `hostRequirements.gpu: optional`, which the Dev
    Containers CLI turns into `--gpus all` wherever there are GPUs. `host_user`: the person's (UID, GID), who
    the container runs as when the recipe names no user."""
    recipe = plan.loaded.recipe
    workspace = house.workspace
    chosen, chosen_env = chosen_args(spec) if spec else ([], {})
    doc: dict[str, Any] = {
        "name": recipe.name,
        "image": image or plan.target,
        **({} if spec else {"hostRequirements": {"gpu": "optional"}}),
        "runArgs": [*run_args(house), *chosen],
        "workspaceMount": f"source=${{localWorkspaceFolder}},target={workspace},type=bind",
        "workspaceFolder": workspace,
    }
    users = user_keys(recipe.user.name if recipe.user else None, host_user)
    doc.update(users)
    mounts = [_mount(spec, plan.uid) for spec in house.mounts]
    if mounts:
        doc["mounts"] = mounts
    no_account = {"HOME": NO_ACCOUNT_HOME} if users and not recipe.user else {}
    env = {**no_account, **house.env, **chosen_env}
    if env:
        doc["containerEnv"] = dict(sorted(env.items()))
    doc["customizations"] = {"vscode": {"extensions": ["ms-python.python", "ms-toolsai.jupyter"]}}
    return doc


def export_devcontainer(
    plan: Plan,
    recipe: Path,
    settings: Settings,
    out: Path | None,
    gpus: str | None,
    engine_of: Callable[[], ImageEngine],
) -> tuple[Path, list[str]]:
    """Write `OUT/devcontainer.json` (default `.devcontainer/`) for `plan`'s image; (its path, notes for the user).

    On a shared server (the config has `run:` house rules, or `--gpus` was given) the container gets what
    `imgbuild run RECIPE --gpus N` would: chosen now under the host's ledger, by the same rules
    (`engine_of()`: the engine, asked for only then); elsewhere, any GPUs the machine has."""
    import json

    from imgbuild.servers import run as runmod

    house = settings.run
    shared = gpus is not None or any(key.startswith("run.") for key in settings.sources)
    folder = out or Path(".devcontainer")
    if out is None and folder.is_symlink():  # committed as a link: it would carry the write anywhere
        raise UsageError(f"{folder} is a symbolic link; imgbuild writes devcontainer.json only into a real folder")
    path = folder / "devcontainer.json"
    engine = engine_of()
    if engine.images.image(plan.target) is None:  # the Dev Containers CLI would pull the name from Docker Hub
        raise UsageError(f"{plan.target} is not built here: build it first (imgbuild build {recipe})")
    host_user = (settings.caller.uid, settings.caller.gid)
    notes: list[str] = []
    if shared:
        request = runmod.RunRequest(image=str(recipe), gpu_request=gpus or "none")
        with runmod.reserved(request, settings, engine) as spec:
            document = devcontainer(plan, house, spec=spec, host_user=host_user)
        chosen = ",".join(str(g.index) for g in spec.gpus.gpus) or "none (--gpus N to ask)"
        notes = [f"GPUs {chosen}, container {spec.name}", *NOT_HONOURED]
    else:
        document = devcontainer(plan, house, host_user=host_user)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        from imgbuild.hostio.regular import write_atomic

        write_atomic(path, json.dumps(document, indent=2) + "\n")  # never through a link committed in the repository
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write {path}: {exc.strerror}") from None
    return path, notes
