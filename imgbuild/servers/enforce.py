"""Enforced mode: the house rules hold because users are not in the docker group.

An admin installs the sudoers drop-in `imgbuild admin sudoers` prints: every user may run imgbuild's user-facing
commands as root, and nothing else. Under sudo imgbuild acts for the caller (SUDO_UID) and gives them nothing
they would not have without it:

- containers run as the caller's UID:GID, with no new privileges and no capabilities; no `--user`, no `--force`;
- only the images the site allows (`run.allowed_images`, fnmatch patterns with {user});
- no variables that steer the host's NVIDIA hook or loader (NVIDIA_*, LD_*), published ports only on 127.0.0.1
  and above 1023;
- mounts only under the site's allowed roots (`run.allowed_mounts`, {user} and {home}), each source resolved and
  checked *as the caller* (a path they cannot reach is refused, a hard link to a file they cannot read too),
  never created, and handed to the engine through a root-owned staging bind of the very object checked, so a
  symbolic link swapped in afterwards changes nothing;
- containers of other users are not theirs to see into or stop (`check_owner`), whatever --force says;
- builds read every file the recipe names, and write the context, with the caller's permissions (`as_user`);
  the engine builds from root's private copy of the caller's own files (`private_copy`), and the image goes only
  into the caller's namespace (`check_build`); bases and smoke-tested images only from `run.allowed_images`;
- every decision goes to an audit log in root's folder (`<state_dir>/.reap/audit.log`), which users cannot write.

Members of the host's admin groups (sudo, wheel, admin: root through sudo anyway) are not restricted.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import pwd
import re
import secrets
import select
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imgbuild.errors import EnvironmentProblem, UsageError
from imgbuild.hostio.acting import Acting, acting_for_user, check_image
from imgbuild.hostio.host import Caller, expand

if TYPE_CHECKING:
    from imgbuild.config.settings import Settings
    from imgbuild.config.site import RunRules
    from imgbuild.servers.runwords import RunRequest

#: What a user may run through sudo (the sudoers drop-in lists exactly these).
USER_COMMANDS = ("run", "ps", "logs", "attach", "exec", "shell", "stop", "extend", "gpus", "queue", "build", "smoke")
#: Variables the host's NVIDIA hook, the dynamic loader or the engine read: the site's and imgbuild's to set.
_HOST_ENV = re.compile(r"(NVIDIA_|LD_|DOCKER_|CUDA_VISIBLE_DEVICES).*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_PORT = re.compile(r"(?:(?P<ip>[0-9.]{7,15}):)?(?:(?P<host>[0-9]{1,5}):)?(?P<container>[0-9]{1,5})(?:/(?:tcp|udp))?")
STAGING = Path("/run/imgbuild/mounts")
AUDIT_FILE = "audit.log"
CHECK_SECONDS = 10  # resolving a mount source as the caller


def sudoers(binary: str) -> str:
    """The sudoers drop-in for `binary` (an absolute path): the user-facing commands as root, nothing else."""
    if not binary.startswith("/") or not re.fullmatch(r"[A-Za-z0-9_./+-]{1,512}", binary):
        raise UsageError(f"--binary {binary[:80]!r}: imgbuild's absolute path, plain characters only")
    commands = ", \\\n    ".join(f"{binary} {verb}, {binary} {verb} *" for verb in USER_COMMANDS)
    alias = sudoers_alias(binary)
    return (
        "# /etc/sudoers.d/imgbuild, from `imgbuild admin sudoers`; check it with `visudo -cf FILE` first.\n"
        "# Every user may run imgbuild's user-facing commands as root, and nothing else; imgbuild then acts for\n"
        "# them under the site's rules (/etc/imgbuild/config.yaml). Take users out of the docker group.\n"
        f"Cmnd_Alias {alias} = \\\n    {commands}\n"
        f'Defaults!{alias} env_reset, !setenv, secure_path="/usr/local/sbin:/usr/local/bin:/usr/sbin:'
        '/usr/bin:/sbin:/bin"\n'
        f"ALL ALL=(root) NOPASSWD: {alias}\n"
    )


def sudoers_alias(binary: str) -> str:
    """The drop-in's alias, unique per installed binary: sudo refuses a second definition of one alias across
    all its files, and then grants neither file's commands (two installs, or a test's drop-in beside a site's)."""
    import hashlib

    return "IMGBUILD_USER_" + hashlib.sha256(binary.encode()).hexdigest()[:12].upper()


def gate(args: list[str]) -> None:
    """Before any command of a user acting through sudo (`acting_for_user`): only USER_COMMANDS, named first (no
    global flag before it: the sudoers patterns match the command word first, and so does this). The refusal is
    audited with every other outcome, by the caller."""
    verb = args[0] if args else ""
    if verb not in USER_COMMANDS:
        raise UsageError(
            f"through sudo, imgbuild runs only {', '.join(USER_COMMANDS)} (this server's enforced mode); "
            f"{verb or 'that'} is for the admin"
        )


COMMANDS_DIR = "commands"  # in root's folder of the state folder: one lock file per user and place


def command_place(who: Caller, house: RunRules) -> int:
    """One of the site's `max_commands_per_user` places for a command `who` runs through sudo: a descriptor holding
    a lock in root's folder for as long as the process lives, the docker CLI it may become included. Each such
    command is a root process the user's own limits do not count; a loop or a crowd of them (a thousand
    `run --wait` waiters, each polling the ledger under its lock) is refused past the site's number, at once."""
    import fcntl

    from imgbuild.hostio.regular import open_regular
    from imgbuild.servers.ledger import reaper_dir

    folder = reaper_dir(house.ledger_dir) / COMMANDS_DIR
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    for place in range(house.max_commands_per_user):
        try:
            fd = open_regular(folder / f"{who.uid}-{place}", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise EnvironmentProblem(f"cannot use {folder}: {exc.strerror}") from None
        if fd is None:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.set_inheritable(fd, True)  # kept by the docker CLI imgbuild becomes (`logs -f`, `attach`, `exec`)
        return fd
    raise UsageError(
        f"you have {house.max_commands_per_user} imgbuild commands running through sudo already "
        "(run.max_commands_per_user); wait for one to end"
    )


# --- run: flags, image, env, ports -------------------------------------------------------------------------


def check_run(req: RunRequest, who: Caller, house: RunRules, image_ref: str) -> None:
    """The flags of `imgbuild run` a user acting through sudo may not give (one line for the first)."""
    if req.as_user:
        raise UsageError(f"--user: under this server's rules containers run as you ({who.uid}:{who.gid})")
    if req.force:
        raise UsageError("--force: only root may take GPUs other users hold")
    check_image(who, house.allowed_images, image_ref)
    for item in req.env:
        name = item.split("=", 1)[0]
        if not _ENV_NAME.fullmatch(name):
            raise UsageError(f"-e {name[:60]!r}: not a variable name")
        if _HOST_ENV.fullmatch(name):
            raise UsageError(f"-e {name}: set by imgbuild and the site (the GPUs you were given), not by a run")
    for spec in req.ports:
        check_port(spec)


def check_port(spec: str) -> None:
    match = _PORT.fullmatch(spec)
    if not match:
        raise UsageError(f"-p {spec[:60]!r}: not 127.0.0.1:HOSTPORT:CONTAINERPORT")
    if match.group("ip") != "127.0.0.1" or match.group("host") is None:  # docker's default is every interface
        raise UsageError(f"-p {spec}: publish on this host only, as 127.0.0.1:HOSTPORT:PORT (reach it by ssh -L)")
    if not 1024 <= int(match.group("host")) <= 65535:
        raise UsageError(f"-p {spec}: host ports below 1024 are the system's")


# --- build and smoke: the caller's files, the caller's namespace --------------------------------------------


def acting(settings: Settings) -> Acting | None:
    """`Acting` when imgbuild runs as root through sudo for a user who is not an admin, else None."""
    who = settings.caller
    if not acting_for_user(who):
        return None
    return Acting(who, tuple(settings.run.allowed_images))


def check_build(acting: Acting | None, *, push: bool, builder: str | None, sign_key: Path | None) -> None:
    """The flags of `imgbuild build` a user acting through sudo may not give: what reaches past this host's
    engine uses root's credentials (a registry login, a remote builder, a key)."""
    if acting is None:
        return
    for given, flag in ((push, "--push"), (builder, "--builder"), (sign_key, "--sign-key")):
        if given:
            raise UsageError(f"{flag}: under this server's rules builds stay on this host (ask an admin to publish)")


# --- mounts, checked as the caller ------------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    source: str  # resolved as the caller: no link left in it
    target: str
    read_only: bool
    dev: int
    ino: int
    is_dir: bool


def _split(spec: str) -> tuple[str, str, bool]:
    parts = spec.split(":")
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        return parts[0], parts[1], parts[2] == "ro"
    if len(parts) == 2:
        return parts[0], parts[1], False
    raise UsageError(f"-v {spec[:80]!r}: HOSTPATH:CONTAINERPATH[:ro]")


def home_of(who: Caller) -> str:
    try:
        return pwd.getpwuid(who.uid).pw_dir
    except KeyError:
        return "/nonexistent"


def check_mounts(
    specs: list[str], who: Caller, house: RunRules, probe: Callable[..., Any] | None = None
) -> list[Mount]:
    """Each `-v HOST:CONTAINER[:ro]` as the caller may have it: an absolute host path that exists, that the caller
    can reach and read (resolved with the caller's own permissions), under one of the site's allowed roots."""
    home = home_of(who)
    roots = [os.path.realpath(expand(r, user=who.name, home=home)) for r in house.allowed_mounts]
    mounts = []
    for spec in specs:
        source, target, read_only = _split(expand(spec, user=who.name, home=home, uid=who.uid))
        if not source.startswith("/"):
            raise UsageError(f"-v {source[:80]}: a host path (named volumes may be other users')")
        if not target.startswith("/"):
            raise UsageError(f"-v ...:{target[:80]}: not a place in the container a mount may go")
        target = posixpath.normpath("/" + target.lstrip("/"))  # `//proc/x`, `/a/../proc` are /proc's
        if target == "/" or target.split("/")[1] in ("proc", "sys", "dev"):
            raise UsageError(f"-v ...:{target[:80]}: not a place in the container a mount may go")
        seen = (probe or resolve_as)(who, source)
        if "error" in seen:
            raise UsageError(f"-v {source}: {seen['error']} (checked as {who.name})")
        real = seen["path"]
        if not any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots):
            raise UsageError(
                f"-v {source}: {real} is outside what this server lets runs mount "
                f"(run.allowed_mounts: {', '.join(roots) or 'nothing'})"
            )
        mounts.append(Mount(real, target, read_only, seen["dev"], seen["ino"], seen["dir"]))
    return mounts


def _resolve(path: str) -> dict[str, Any]:
    """In the caller's process: the path with its links resolved, the object's identity, and whether the
    caller may read it (and, for a folder, enter it)."""
    try:
        real = os.path.realpath(path, strict=True)
        info = os.stat(real)
    except OSError as exc:
        return {"error": exc.strerror or "cannot be reached"}
    is_dir = stat.S_ISDIR(info.st_mode)
    if not (is_dir or stat.S_ISREG(info.st_mode)):
        return {"error": "not a folder or a regular file"}
    if not os.access(real, os.R_OK | (os.X_OK if is_dir else 0)):
        return {"error": "you cannot read it"}
    return {"path": real, "dev": info.st_dev, "ino": info.st_ino, "dir": is_dir}


def resolve_as(who: Caller, path: str) -> dict[str, Any]:
    """`_resolve(path)` in a child process with the caller's UID, GID and groups: what root can see is not the
    question. Bounded: a path that hangs (a dead NFS server) is refused after CHECK_SECONDS."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the caller, look, report, exit
        try:
            os.close(reader)
            os.setgroups(os.getgrouplist(who.name, who.gid) if who.name else [who.gid])
            os.setgid(who.gid)
            os.setuid(who.uid)
            os.write(writer, json.dumps(_resolve(path)).encode()[:65536])
        finally:
            os._exit(0)
    os.close(writer)
    data, deadline = b"", time.monotonic() + CHECK_SECONDS
    try:
        while len(data) <= 65536:  # to the child's end of the pipe, or the deadline
            ready, _, _ = select.select([reader], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(reader, 65536) if ready else b""
            if not chunk:
                break
            data += chunk
    finally:
        os.close(reader)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)  # done, or past the deadline (a hung NFS stat): it goes either way
        os.waitpid(pid, 0)
    try:
        found = json.loads(data)
    except ValueError:
        return {"error": f"could not be checked within {CHECK_SECONDS} s"}
    return found if isinstance(found, dict) else {"error": "could not be checked"}


def _open_no_links(path: str) -> int:
    """An O_PATH descriptor of `path`, walked one name at a time without following any link."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in [p for p in path.split("/") if p]:
            following = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = following
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise UsageError(f"-v {path}: it changed since it was checked (a link now); try again")
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def staged(mounts: list[Mount]) -> Iterator[list[str]]:
    """`-v` arguments for `mounts`, each a root-owned bind of the exact object checked (same device and inode),
    under STAGING: what the engine mounts cannot be swapped by the user between the check and the start.
    Unmounted when the block ends (the container keeps its own)."""
    if not mounts:
        yield []
        return
    base = STAGING / secrets.token_hex(8)
    made: list[Path] = []
    try:
        base.mkdir(parents=True, mode=0o700)
        specs = []
        for i, mount in enumerate(mounts):
            fd = _open_no_links(mount.source)
            try:
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) != (mount.dev, mount.ino):
                    raise UsageError(f"-v {mount.source}: it changed since it was checked; try again")
                point = base / str(i)
                point.mkdir(mode=0o700) if mount.is_dir else point.touch(mode=0o600)
                _mount(["--bind", f"/proc/self/fd/{fd}", str(point)], fd)
                made.append(point)
                if mount.read_only:
                    _mount(["-o", "remount,bind,ro", str(point)])
            finally:
                os.close(fd)
            specs.append(f"{point}:{mount.target}" + (":ro" if mount.read_only else ""))
        yield specs
    finally:
        for point in made:
            subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)
        with contextlib.suppress(OSError):
            for point in base.iterdir():
                point.rmdir() if point.is_dir() else point.unlink()
            base.rmdir()


def _mount(args: list[str], fd: int | None = None) -> None:
    try:
        done = subprocess.run(
            ["mount", *args], capture_output=True, text=True, timeout=30, pass_fds=(fd,) if fd else ()
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentProblem(
            f"cannot stage a mount ({exc}); this server's enforced mode needs mount(8) as root"
        ) from None
    if done.returncode != 0:
        raise EnvironmentProblem(f"cannot stage a mount: {(done.stderr or done.stdout).strip()[:200]}")


# --- the audit log ---------------------------------------------------------------------------------------


def _summary(args: list[str]) -> list[str]:
    """The command line as the audit log keeps it: no variable's value (a token: run's words, also as `queue add`
    files them, read by run's own grammar), bounded."""
    from imgbuild.servers.runwords import hide_values

    verb = 2 if args[:2] == ["queue", "add"] else 1 if args[:1] == ["run"] else len(args)
    kept = [*args[:verb], *hide_values(args[verb:], mark="…")] if verb < len(args) else list(args)
    return [word[:200] for word in kept[:64]]


def audit(verb: str, args: list[str], decision: str, ledger_dir: Path, user: str, uid: int) -> None:
    """One JSON line per decision taken for a user acting through sudo: who (`user`, `uid`), what, when, the
    decision. In root's folder of the state folder; an audit log that cannot be written stops the command
    (exit 3)."""
    from imgbuild.servers.ledger import append_record, reaper_dir

    record = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "user": user,
        "uid": uid,
        "command": verb,
        "args": _summary(args),
        "decision": decision,
    }
    folder = reaper_dir(ledger_dir)
    append_record(folder / AUDIT_FILE, record, "the audit log")
