"""VS Code dev containers: a `devcontainer.json` for a recipe's image, with `imgbuild run`'s house rules.

Pure: the plan and the site's `run:` rules in, the JSON document out. The same image runs on a laptop with
no GPU and on the GPU server (`hostRequirements.gpu: optional`: the Dev Containers tooling passes GPUs
where there are some); the user is the recipe's, with its UID moved to the person's own
(`updateRemoteUserUID`); IPC or shm, ulimits, capped logs, the site's data mounts and env come from the
same settings `imgbuild run` uses.
"""

from __future__ import annotations

from typing import Any

from imgbuild.errors import UsageError
from imgbuild.plan import Plan
from imgbuild.run import limit_flags, log_flags

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


def run_args(house: dict[str, Any]) -> list[str]:
    """`docker run` flags of the house rules that the Dev Containers spec has no key for (the same flags
    `imgbuild run` passes, as single `--flag=value` words)."""
    return [f"{flag}={value}" for flag, value in (*limit_flags(house), *log_flags(house))]


def devcontainer(plan: Plan, house: dict[str, Any], image: str | None = None) -> dict[str, Any]:
    """The devcontainer.json document for `plan`'s image (`image` overrides the built tag, e.g. a digest)."""
    recipe = plan.loaded.recipe
    workspace = str(house.get("workspace") or recipe.workdir)
    doc: dict[str, Any] = {
        "name": recipe.name,
        "image": image or plan.target,
        "hostRequirements": {"gpu": "optional"},
        "runArgs": run_args(house),
        "workspaceMount": f"source=${{localWorkspaceFolder}},target={workspace},type=bind",
        "workspaceFolder": workspace,
    }
    if recipe.user:
        doc["remoteUser"] = recipe.user.name
        doc["containerUser"] = recipe.user.name
        doc["updateRemoteUserUID"] = True
    mounts = [_mount(spec, plan.uid) for spec in house.get("mounts") or []]
    if mounts:
        doc["mounts"] = mounts
    if house.get("env"):
        doc["containerEnv"] = {str(k): str(v) for k, v in sorted(house["env"].items())}
    doc["customizations"] = {"vscode": {"extensions": ["ms-python.python", "ms-toolsai.jupyter"]}}
    return doc
