"""Who is calling: the one answer, used for image user IDs, container names and ownership.

Under sudo the caller is the person who typed sudo (SUDO_USER / SUDO_UID / SUDO_GID), not root; plain
root is root. The `--user` flag and IMGBUILD_USER name an image namespace, never an identity: ownership
of containers is judged by the caller alone.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import re
from dataclasses import dataclass
from pathlib import Path

_NAME_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")


@dataclass(frozen=True)
class Caller:
    name: str
    uid: int
    gid: int
    via_sudo: bool = False

    @property
    def is_admin(self) -> bool:
        """Root, or a member of an admin group acting through sudo (root through sudo anyway): may act on other
        users' containers with --force. A user whom the sudoers drop-in lets run imgbuild is not."""
        return os.geteuid() == 0 and (not self.via_sudo or self.uid == 0 or in_admin_group(self))

    @property
    def prefix(self) -> str:
        """Container names of this caller start with this."""
        return f"{self.name}_"


#: Groups whose members hold root through sudo already (Debian's sudo, RHEL's wheel, old Ubuntu's admin).
ADMIN_GROUPS = ("sudo", "wheel", "admin")


def in_admin_group(who: Caller) -> bool:
    import grp

    names: set[str] = set()
    with contextlib.suppress(KeyError, OSError):
        names |= {g.gr_name for g in grp.getgrall() if who.name in g.gr_mem}
    with contextlib.suppress(KeyError, OSError):  # a primary group this host does not name
        names.add(grp.getgrgid(who.gid).gr_name)
    return bool(names & set(ADMIN_GROUPS))


def caller(environ: dict[str, str] | None = None) -> Caller:
    env = os.environ if environ is None else environ
    uid = os.getuid()
    if uid == 0 and env.get("SUDO_UID", "").isdigit():
        sudo_uid = int(env["SUDO_UID"])
        sudo_gid = int(env["SUDO_GID"]) if env.get("SUDO_GID", "").isdigit() else sudo_uid
        name = env.get("SUDO_USER") or _name_of(sudo_uid)
        return Caller(_safe(name, sudo_uid), sudo_uid, sudo_gid, via_sudo=True)
    return Caller(_safe(_name_of(uid), uid), uid, os.getgid())


def _name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def _safe(name: str, uid: int) -> str:
    """A name usable in a container name and an image namespace."""
    lowered = name.lower()
    return lowered if _NAME_RE.fullmatch(lowered) else f"uid{uid}"


# --- CPUs -------------------------------------------------------------------------------------------

_CPULIST_RE = re.compile(r"[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?)*")


def parse_cpulist(text: str) -> list[int]:
    """`0-3,8-11` (the kernel's and Docker's CPU list) -> [0, 1, 2, 3, 8, 9, 10, 11]; "" -> []."""
    text = text.strip()
    if not text:
        return []
    if not _CPULIST_RE.fullmatch(text):
        raise ValueError(f"{text[:40]!r} is not a CPU list like 0-3,8-11")
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return sorted(cpus)


def format_cpulist(cpus: list[int] | set[int]) -> str:
    """[0, 1, 2, 3, 8] -> `0-3,8`."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            runs.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = cpu
    return ",".join(runs)


def host_memory() -> int | None:
    """This host's memory in bytes (None where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: a cgroup or taskset narrows the host's)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def expand(template: str, **values: object) -> str:
    """`{user}`, `{home}`, `{uid}` in a mount or pattern replaced by their values, and nothing else: a user's `-v`
    text is never a format string (`{0}` or `{user.__class__}` stay as they are, and are then refused as paths)."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", str(value))
    return template


# --- processes: who started what -------------------------------------------------------------------


def process_start(pid: int, proc: Path = Path("/proc")) -> str:
    """A PID's start time in clock ticks since boot ("" when the process is gone)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: count from its closing one.
    fields = text[text.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def process_token(sep: str = ":") -> str:
    """This process as `PID<sep>START`: what a container label or a file name records of who made it."""
    return f"{os.getpid()}{sep}{process_start(os.getpid())}"


@functools.cache
def namespace_id(proc: Path = Path("/proc")) -> str:
    """This process's PID namespace and boot as `<inode>x<boot id's first 8>`, tag- and label-safe: a PID and
    start time name a process only to a reader with the same one (CI runners in containers sharing the host's
    engine each have their own, and see each other's PIDs as gone). Read once per process: a sweep judges every
    container's token against it."""
    try:
        inode = "".join(c for c in os.readlink(proc / "self" / "ns" / "pid") if c.isascii() and c.isdigit())
    except OSError:
        inode = ""
    try:
        boot = (proc / "sys" / "kernel" / "random" / "boot_id").read_text(encoding="ascii", errors="replace")[:8]
    except OSError:
        boot = ""
    boot = boot if re.fullmatch(r"[0-9a-f]{8}", boot) else ""
    return f"{inode[:20]}x{boot}"


def engine_token(sep: str = ":") -> str:
    """This process as `PID<sep>START<sep>NAMESPACE`, for what it leaves on a shared engine (labels, tags)."""
    return f"{process_token(sep)}{sep}{namespace_id()}"


def token_state(token: str, sep: str = ":") -> str:
    """ "alive", "gone", "elsewhere" (a process of another PID namespace or boot: not this process's to judge) or
    "unknown" (no token: `imgbuild run` sets the label empty) for an `engine_token` (or a `process_token`)."""
    pid, start, space = [*token.split(sep), "", ""][:3]
    if not (re.fullmatch(r"[0-9]{1,10}", pid) and re.fullmatch(r"[0-9]{1,20}", start)) or token.count(sep) > 2:
        return "unknown"
    if space and space != namespace_id():
        return "elsewhere"
    return "alive" if token_alive(f"{pid}{sep}{start}", sep) else "gone"


def token_alive(token: str, sep: str = ":") -> bool:
    """Does the process a `process_token` names still run (the same one, not a later one with its PID)?"""
    pid, _, start = token.partition(sep)
    return pid.isdigit() and pid.isascii() and process_start(int(pid)) == start
