"""OCI bundles of a recipe's image, for Slurm's own container support (`srun --container`, Slurm 21.08+).

The engine saves the built image (`docker save`); skopeo turns the archive into an OCI image layout and umoci
unpacks it into a runtime bundle (`config.json` + `rootfs/`), as the caller (`--rootless` for a user, so the
files are theirs and the runtime can run it without privileges). The bundle's config is then made what a
cluster job needs, as Apptainer does: the node's network, hostname, PID and IPC namespaces (torchrun,
NCCL and a shared /dev/shm), only the mount (and, rootless, the user) namespace of its own.

Slurm runs a bundle as it is (its `rootfs/` in place, its mounts fixed), so the folders jobs need are bound
when the bundle is written: the site's `slurm.binds`, `--bind`s, and `/tmp`, as Apptainer binds them; the
job then works in its own folder at the same path inside.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.clusters.slurm import OCI_KEPT_ENV, OCI_KEPT_PREFIX
from imgbuild.errors import EnvironmentProblem, JobFailed, UsageError

if TYPE_CHECKING:
    from imgbuild.engine.types import ImageEngine

TOOLS = ("skopeo", "umoci")
#: Namespaces a cluster job keeps of its own; the others are the node's (as Apptainer has it).
KEPT_NAMESPACES = ("mount", "user")


def bind_mount(bind: str) -> dict[str, Any]:
    """`/scratch`, `/data:/d` or `/data:/d:ro` (checked as slurm.binds are) as an OCI bind mount."""
    parts = bind.split(":")
    read_only = len(parts) > 1 and parts[-1] == "ro"
    source, inside = parts[0], (parts[1] if len(parts) > 1 and parts[1] != "ro" else parts[0])
    return {"destination": inside, "type": "bind", "source": source, "options": ["rbind", "ro" if read_only else "rw"]}


#: Folders of the image a job may write, as a tmpfs of its own, where the image holds nothing in them: the
#: WORKDIR recipes use (a recipe's TORCH_HOME=/workspace/.cache/torch), and nothing else of the read-only root.
SCRATCH_DIRS = ("/workspace",)


def scratch_tmpfs(folder: str) -> dict[str, Any]:
    return {
        "destination": folder,
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", "mode=1777", "size=50%"],
    }


def cluster_config(config: dict[str, Any], binds: list[str], scratch: tuple[str, ...] = ()) -> dict[str, Any]:
    """umoci's runtime config made a cluster job's (pure): the node's namespaces but mount (and user), the
    node's /dev/shm, /tmp, hosts and resolv.conf, the binds (each destination once, the last given wins), no
    hostname of its own, no terminal. The root is read-only: a bundle on shared storage is run by every job on
    every node, and none of them may change it; `scratch` (empty image folders) are each job's own tmpfs."""
    out = json.loads(json.dumps(config))
    out.setdefault("root", {})["readonly"] = True
    linux = out.setdefault("linux", {})
    linux["namespaces"] = [ns for ns in linux.get("namespaces", []) if ns.get("type") in KEPT_NAMESPACES]
    out.pop("hostname", None)
    process = out.setdefault("process", {})
    process["terminal"] = False
    # Slurm puts the job's environment over the image's: the image's search paths are kept aside for the
    # step to restore (cluster.OCI_KEPT_ENV), else the host's PATH hides /usr/local/cuda/bin and the like.
    env = [item for item in process.get("env", []) if not item.startswith(OCI_KEPT_PREFIX)]
    image = dict(item.split("=", 1) for item in env if "=" in item)
    process["env"] = env + [f"{OCI_KEPT_PREFIX}{name}={image.get(name, '')}" for name in OCI_KEPT_ENV]
    # the node's name resolution too (torchrun's rendezvous finds the head node by name), as Apptainer has it
    wanted = ("/dev/shm", "/tmp", "/etc/hosts:/etc/hosts:ro", "/etc/resolv.conf:/etc/resolv.conf:ro", *binds)
    by_destination = {m["destination"]: m for m in [*(scratch_tmpfs(d) for d in scratch), *map(bind_mount, wanted)]}
    mounts = list(by_destination.values())  # a folder bound twice (site and --bind) is mounted once
    taken = set(by_destination)
    out["mounts"] = [m for m in out.get("mounts", []) if m.get("destination") not in taken] + mounts
    return out


WORK_PREFIX = ".imgbuild-oci-"


def _run(args: list[str], timeout: float) -> None:
    """`args`, killed when imgbuild dies (util-linux setpriv --pdeathsig, where there is one): a SIGKILLed export
    leaves no umoci finishing a bundle on its own."""
    setpriv = shutil.which("setpriv")
    argv = [setpriv, "--pdeathsig", "KILL", "--", *args] if setpriv else args
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise JobFailed(f"{args[0]} took longer than {timeout:g} s") from None
    if done.returncode != 0:
        raise JobFailed(f"{' '.join(args[:2])} failed: {(done.stderr or done.stdout).strip()[-400:]}")


def export_bundle(
    target: str,
    out: Path,
    binds: list[str],
    engine: ImageEngine,
    timeout: float,
    say: Callable[[str], None] = lambda _line: None,
) -> Path:
    """Write `target` (a built image) as an OCI runtime bundle at `out` (a new folder) with `binds`."""
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if missing:
        raise EnvironmentProblem(f"--oci needs {' and '.join(missing)} (Debian/Ubuntu: apt install skopeo umoci)")
    if engine.images.image(target) is None:
        raise UsageError(f"{target} is not built: run imgbuild build on its recipe first")
    out = out.absolute()
    if out.exists() or out.is_symlink():  # a dangling link too: never written through
        raise UsageError(f"{out}: already there; remove it or name a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_orphans(out.parent)
    # Everything is made inside a work folder beside `out` and renamed into place whole, the cluster's config
    # already in it: a kill at any point leaves no bundle (never umoci's own config), only a work folder that
    # the next export beside it removes.
    work = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=out.parent))
    try:
        archive = work / "image.tar"
        say(f"saving {target}")
        engine.images.save(target, archive)
        say("converting to an OCI image layout (skopeo)")
        _run(["skopeo", "copy", "--quiet", f"docker-archive:{archive}", f"oci:{work / 'layout'}:image"], timeout)
        archive.unlink()
        say(f"unpacking the bundle into {out} (umoci)")
        rootless = ["--rootless"] if os.geteuid() != 0 else []
        bundle = work / "bundle"
        _run(["umoci", "unpack", *rootless, "--image", f"{work / 'layout'}:image", str(bundle)], timeout)
        scratch = tuple(d for d in SCRATCH_DIRS if _empty_dir(bundle / "rootfs" / d.lstrip("/")))
        config = cluster_config(json.loads((bundle / "config.json").read_text()), binds, scratch)
        (bundle / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if out.exists() or out.is_symlink():
            raise UsageError(f"{out}: appeared while the bundle was made; remove it or name a new folder")
        bundle.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _empty_dir(path: Path) -> bool:
    """A real folder (no link) with nothing in it."""
    try:
        return path.is_dir() and not path.is_symlink() and not any(path.iterdir())
    except OSError:
        return False


def sweep_orphans(folder: Path) -> None:
    """Remove the work folders of exports beside `folder` whose process is gone (a SIGKILL), this user's only."""
    for entry in folder.glob(f"{WORK_PREFIX}*"):
        pid = entry.name.removeprefix(WORK_PREFIX).split("-", 1)[0]
        try:
            info = entry.lstat()
        except OSError:
            continue
        if not pid.isascii() or not pid.isdigit() or info.st_uid != os.geteuid() or not entry.is_dir():
            continue
        if int(pid) != os.getpid() and not Path(f"/proc/{int(pid)}").exists():
            shutil.rmtree(entry, ignore_errors=True)


# --- enroot's squashfs (pyxis) ---------------------------------------------------------------------------


def enroot_files(config: dict[str, Any]) -> dict[str, str]:
    """The files enroot reads in an image (its documented image format: doc/image-format.md), from the image
    config's Config block: `/etc/environment` (the image's env), `/etc/fstab` (its volumes, bound from the
    container's own root as enroot's import does), `/etc/rc` (into the WORKDIR, then the entrypoint with the
    start command, else with the image's CMD) and an empty `/etc/rc.local` that rc sources."""
    import shlex

    env = [item for item in config.get("Env") or [] if "=" in item and "\n" not in item]
    volumes = sorted(config.get("Volumes") or {})
    workdir = config.get("WorkingDir") or "/"
    entrypoint = [shlex.quote(word) for word in config.get("Entrypoint") or []]
    cmd = [shlex.quote(word) for word in config.get("Cmd") or []]
    if not entrypoint and not cmd:
        cmd = ["/bin/sh"]
    labels = [f"# {key} {value}" for key, value in sorted((config.get("Labels") or {}).items()) if "\n" not in value]
    rc = [
        *labels,
        *([""] if labels else []),
        f"mkdir -p {shlex.quote(workdir)} 2> /dev/null",
        f"cd {shlex.quote(workdir)} && unset OLDPWD || exit 1",
        "",
        "if [ -s /etc/rc.local ]; then",
        "    . /etc/rc.local",
        "fi",
        "",
        "if [ $# -gt 0 ]; then",
        f'    exec {" ".join(entrypoint)} "$@"'.replace("exec  ", "exec "),
        "else",
        f"    exec {' '.join([*entrypoint, *cmd])}",
        "fi",
    ]
    return {
        "etc/environment": "".join(f"{item}\n" for item in env),
        "etc/fstab": "".join(f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n" for v in volumes),
        "etc/rc": "\n".join(rc) + "\n",
        "etc/rc.local": "# Sourced by /etc/rc when the container starts (written by imgbuild).\n",
    }


def _write_inside(rootfs: Path, name: str, text: str) -> None:
    """Write `rootfs/name`, never through a link the image planted (`etc -> /etc` would reach the host's)."""
    path = rootfs / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.parent.resolve().is_relative_to(rootfs.resolve()):
        raise UsageError(f"the image's /{Path(name).parent} is a link out of the image: refusing to write /{name}")
    if path.is_symlink():
        path.unlink()
    path.write_text(text)


def export_sqsh(
    target: str, out: Path, engine: ImageEngine, timeout: float, say: Callable[[str], None] = lambda _line: None
) -> Path:
    """Write `target` as an enroot squashfs image at `out` (for pyxis: --container-image=FILE.sqsh)."""
    if not shutil.which("mksquashfs"):
        raise EnvironmentProblem("--sqsh needs mksquashfs (Debian/Ubuntu: apt install squashfs-tools)")
    out = out.absolute()
    if out.exists() or out.is_symlink():  # a dangling link too: mksquashfs would write where it points
        raise UsageError(f"{out}: already there; remove it or name a new file")
    info = engine.images.image(target)
    if info is None:
        raise UsageError(f"{target} is not built: run imgbuild build on its recipe first")
    work = Path(tempfile.mkdtemp(prefix=".imgbuild-sqsh-", dir=out.parent if out.parent.exists() else None))
    try:
        bundle = export_bundle(target, work / "bundle", [], engine, timeout, say)
        rootfs = bundle / "rootfs"
        for name, text in enroot_files(info.config).items():
            _write_inside(rootfs, name, text)
        say(f"writing the squashfs image {out} (mksquashfs)")
        _run(["mksquashfs", str(rootfs), str(out), "-all-root", "-noappend", "-no-progress", "-quiet"], timeout)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out
