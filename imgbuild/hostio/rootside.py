"""What a process running as root believes of its own start: its import path and its environment.

imgbuild runs as root in three ways: root typing it, root's timers (`reap`, the queue), and a user through the
sudoers drop-in (enforced mode). In none of them may a user-writable place decide what code runs or what root's
child processes see:

- `import_path`: the entries of `sys.path` root may import from: absolute, and every folder on the way root's
  and writable by root alone (a sticky world-writable folder such as /tmp is not). The working folder is never
  one of them (`python -m` and `-c` put it first; imgbuild's commands import lazily, long after start).
- `environment`: the whole environment of a root process acting for a user, and of every child root starts: a
  fixed PATH, root's own HOME, the locale; never a user's HOME, PATH, XDG_*, proxies or PYTHON*.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys

#: The PATH of every root process acting for a user and of root's children (sudo's secure_path, Debian's).
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Variables a root child keeps from root's own environment: the locale and the terminal, nothing that steers code.
_KEPT = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "TZ")
#: Root's own settings, kept: a user cannot bring them through sudo (the drop-in's env_reset and !setenv), so they
#: are root's (its timer, its shell) or the admin's own env_keep.
_ROOT_OWN_PREFIXES = ("IMGBUILD_", "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "CONTAINER_HOST")


def trusted_folder(path: str) -> bool:
    """Is `path` a folder that only root can change, and can only root replace it or any folder above it? Each
    folder on the way is root's; one above it may be writable by others only when sticky (/tmp): there only
    an entry's owner may rename or remove it, and the entry on the way is root's."""
    if not os.path.isabs(path):
        return False
    current = os.path.realpath(path)
    try:
        info = os.stat(current)
    except OSError:
        return False
    if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    while current != "/":
        parent = os.path.dirname(current)
        try:
            above = os.stat(parent)
        except OSError:
            return False
        writable_by_others = above.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if above.st_uid != 0 or (writable_by_others and not above.st_mode & stat.S_ISVTX):
            return False
        current = parent
    return True


def import_path(path: list[str], own: str = "") -> list[str]:
    """The entries of `path` (sys.path) a root process may import from; zip files are judged by their folder.
    `own`: the folder imgbuild itself was imported from, always kept (whoever can change it has changed imgbuild
    already; dropping it would only break the command)."""
    kept = []
    for entry in path:
        if own and entry and os.path.realpath(entry) == own:
            kept.append(entry)
            continue
        if entry.startswith("__editable__.") and entry.endswith(".__path_hook__"):
            kept.append(entry)  # setuptools' editable-install hook: a name in sys.path_hooks, not a folder
            continue
        if not entry or not os.path.isabs(entry):
            continue  # '' and relative entries are the working folder
        folder = entry if os.path.isdir(entry) else os.path.dirname(entry)
        while not os.path.exists(folder) and folder != "/":  # absent now: whoever may create it decides
            folder = os.path.dirname(folder)
        if not trusted_folder(folder):
            continue
        if os.path.isfile(entry) and os.stat(entry).st_uid != 0:
            continue
        kept.append(entry)
    return kept


def root_home() -> str:
    try:
        return pwd.getpwuid(0).pw_dir or "/root"
    except KeyError:
        return "/root"


def environment(source: dict[str, str], sudo: bool = True) -> dict[str, str]:
    """The environment of a root process and of the children it starts, built from `source` (root's own): a
    fixed PATH and HOME, the locale, root's own IMGBUILD_*/DOCKER_* settings, and (`sudo`) the caller's SUDO_*,
    which sudo sets and a user cannot."""
    env = {"PATH": SECURE_PATH, "HOME": root_home()}
    env.update({k: v for k, v in source.items() if k in _KEPT or k.startswith("LC_")})
    env.update({k: v for k, v in source.items() if k.startswith(_ROOT_OWN_PREFIXES)})
    if sudo:
        env.update({k: v for k, v in source.items() if k in ("SUDO_UID", "SUDO_GID", "SUDO_USER")})
    return env


def harden() -> None:
    """At the start of every imgbuild process: as root, never the working folder on the import path; through sudo,
    nothing imported from a folder a user could change, and no environment but the fixed one."""
    if os.geteuid() != 0:
        return
    if os.environ.get("SUDO_UID", "").isdigit() and os.getuid() == 0:  # through sudo: trust nothing of the caller's
        own = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # the folder holding imgbuild/
        sys.path[:] = import_path(sys.path, own)
        fixed = environment(dict(os.environ))
        os.environ.clear()
        os.environ.update(fixed)
    else:  # root's own shell or timer: its installation is the admin's; the working folder is never on the path
        sys.path[:] = [e for e in sys.path if os.path.isabs(e) or e.startswith("__editable__.")]
