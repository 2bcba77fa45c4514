"""Run inside images (stdlib only): the base's framework and CUDA stack, checked by its bytes.

`record SPEC MANIFEST` runs in a stage of its own on the bare base: it writes what the stack is (every protected
file's stat and sha256, the protected folders, where the loader and Python find each protected name, the base's
loader and import variables). `check SPEC MANIFEST STEP` runs after each kind of recipe step (apt, pip, user,
run, files, env) on the image being built: a protected file modified, removed or added to, a name now found
elsewhere first (shadowed), or a variable the base's stack depends on moved, fails the build naming the file
and the step. The check stats first and hashes only a file whose stat changed. The plan imports `judge_env`,
the one rule for the loader and import variables, so that a recipe's `env:` is judged the same before the
build as in the image after it.

SPEC (imgbuild.pipeline.stack renders it): {"distributions": framework names, "cuda_wheels": the CUDA library
wheels' name pattern, "unpinned_prefixes": name prefixes a pin of the base does not hold, "unpinned": names the
recipe frees, "trees": folder globs, "files": single paths, "own": imgbuild's own files under a tree, written by
the build after the record}.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys

#: The CUDA stack's shared libraries, by family (CUDA runtime and driver, cuDNN, NCCL, the math libraries,
#: the compilers' runtimes, TensorRT, the driver's user-space libraries).
LIBRARY_RE = re.compile(
    r"lib(?:cuda|cudart|cudadevrt|cudnn(?:_[a-z_]+)?|nccl(?:-net)?|cublas(?:Lt)?|cublasmp|cufft(?:w)?|cufile(?:_rdma)?"
    r"|curand|cusolver(?:Mg)?|cusparse(?:Lt)?|nvrtc(?:-builtins)?|nvJitLink|nvjpeg|npp[a-z]*|nvToolsExt|cupti"
    r"|nvperf_[a-z]+|nvshmem(?:_[a-z]+)?|nvblas|nvinfer(?:_[a-z_]+)?|nvonnxparser|nvparsers|nvptxcompiler_static"
    r"|nvidia-[a-z0-9-]+)(?:\.so(?:\.[0-9][0-9.]*)?|\.[0-9][0-9.]*\.so)"
)
#: Variables that hold search paths: the base's entries stay first, in their order; what a recipe adds comes after
#: them and is an absolute folder (an empty or relative entry is the process's own working folder).
SEARCH_VARS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
#: Variables whose value is the base's: where its CUDA is, which Python runs, what every process preloads.
FIXED_VARS = ("CUDA_HOME", "CUDA_PATH", "LD_PRELOAD", "LD_AUDIT", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
              "BASH_ENV", "ENV")  # fmt: skip
#: Variables naming a script a shell runs before any other: bash before every script (NGC's entrypoint is one),
#: sh before every interactive session. The files the base's name are its stack, like its entrypoint.
STARTUP_SCRIPT_VARS = ("BASH_ENV", "ENV")
#: The dynamic linker's cache (what ldconfig wrote: the linker reads it, not the configuration).
LD_CACHE = "/etc/ld.so.cache"
_CACHE_MAGIC = b"glibc-ld.so.cache1.1"
#: Where CUDA_HOME and CUDA_PATH may point when the base sets neither.
CUDA_HOME = "/usr/local/cuda"
#: Modules Python imports at every start from the first folder on sys.path that has them (a .pth file runs at
#: start too, but ordinary packages ship them: where one moves a protected name, the import check finds it).
STARTUP_RE = re.compile(r"(?:site|user)customize(?:\.py|\.pyc|(?:\.[A-Za-z0-9_-]+)?\.so)?")
HASH_CHUNK = 1 << 20
MAX_SHOWN = 20


def judge_env(base: dict[str, str], final: dict[str, str]) -> list[tuple[str, str]]:
    """(variable, what is wrong) for each of `final`'s loader and import variables that moved from the base's."""
    found = []
    for name in SEARCH_VARS:
        if name not in final:
            continue
        have = [e for e in base.get(name, "").split(":") if e]
        now = final[name].split(":")
        if now[: len(have)] != have:
            found.append(
                (
                    name,
                    f"the base's entries must stay first, in their order: add folders after them "
                    f"({name}=${name}:/your/folder)",
                )
            )
            continue
        odd = next((e for e in now[len(have) :] if not e.startswith("/")), None)
        if odd is not None and (have or final[name]):
            found.append((name, f"{odd!r} is not an absolute folder (an empty or relative entry is the working one)"))
    for name in FIXED_VARS:
        if name not in final or final[name] == base.get(name):
            continue
        if name in ("CUDA_HOME", "CUDA_PATH") and name not in base and final[name] == CUDA_HOME:
            continue
        was = repr(base[name]) if name in base else "unset"
        found.append((name, f"the base's stack depends on it ({was} in the base): it may not be changed"))
    return found


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stat(path: str) -> list | None:
    """[kind, size, mtime_ns, ctime_ns, mode, uid, gid] of `path` itself (a link is not followed), or None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    kind = "l" if stat.S_ISLNK(st.st_mode) else "d" if stat.S_ISDIR(st.st_mode) else "f"
    if kind == "d":  # a folder's size and times change as files come and go: those are judged as files
        return [kind, 0, 0, 0, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
    return [kind, st.st_size, st.st_mtime_ns, st.st_ctime_ns, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]


def _content(path: str, kind: str) -> str:
    if kind == "l":  # a link is what it says and where it finally leads (a link further on may be repointed)
        return f"{os.readlink(path)} -> {os.path.realpath(path)}"
    if kind == "f" and os.path.isfile(path):
        return _sha256(path)
    return ""


def _walk(root: str) -> list[str]:
    """Every path under `root` (not following links, `root` itself neither), `root` first."""
    found = [root]
    if os.path.islink(root):
        return found
    for folder, dirs, names in os.walk(root):
        found += [os.path.join(folder, n) for n in dirs + names]
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pinned_names() -> set[str] | None:
    """The names in the base's own constraint file (PIP_CONSTRAINT), or None: then every distribution is held
    (the pip step holds a freeze of the base)."""
    path = os.environ.get("PIP_CONSTRAINT", "")
    if not (path and os.path.isfile(path)):
        return None
    with open(path, errors="replace") as handle:
        lines = handle.read(1 << 20).splitlines()
    return {_canonical(m.group(0)) for m in (re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", ln.strip()) for ln in lines) if m}


def _distributions(spec: dict) -> tuple[list[str], list[str], list[str]]:
    """(trees, files, import names) of the distributions the base holds: its framework, what it pins, its CUDA
    wheels."""
    import importlib.metadata as md

    pinned = _pinned_names()
    framework = set(spec["distributions"])
    cuda = re.compile(spec["cuda_wheels"])
    freed = set(spec["unpinned"]) | {"pip"}
    trees: set[str] = set()
    files: set[str] = set()
    tops: set[str] = set()
    seen: set[str] = set()
    regular: dict[str, bool] = {}
    for dist in md.distributions():
        name = _canonical(dist.metadata["Name"] or "")
        if not name or name in seen:
            continue
        seen.add(name)
        # as the pip step holds them: the framework, the CUDA libraries, and each pin of the base but those the
        # CUDA libraries' prefixes name (nvidia-dali, nvidia-modelopt may move) and those the recipe unpins
        pin = (pinned is None or name in pinned) and not name.startswith(tuple(spec["unpinned_prefixes"]))
        if not (name in framework or cuda.fullmatch(name) or (pin and name not in freed)):
            continue
        record = getattr(dist, "_path", None)
        if record is not None:
            trees.add(os.path.normpath(str(record)))
        for entry in dist.files or ():
            path = os.path.normpath(str(dist.locate_file(entry)))
            top = entry.parts[0] if entry.parts else ""
            name = top[:-3] if top.endswith(".py") else top
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and (len(entry.parts) > 1 or top.endswith(".py")):
                tops.add(name)
            site = os.path.normpath(str(dist.locate_file("")))
            package = os.path.join(site, top)
            if package not in regular:
                regular[package] = os.path.isfile(os.path.join(package, "__init__.py"))
            if len(entry.parts) > 1 and top != ".." and regular[package]:
                trees.add(package)  # a regular package: a file added to it is found too
            else:
                files.add(path)
    return sorted(trees), sorted(files), sorted(tops)


def _ld_conf_dirs(path: str = "/etc/ld.so.conf", depth: int = 0) -> list[str]:
    """The folders ldconfig reads, in order (its `include` globs followed)."""
    found: list[str] = []
    try:
        with open(path, errors="replace") as handle:
            lines = handle.read(1 << 20).splitlines()
    except OSError:
        return found
    for line in lines:
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] == "include" and depth < 4:
            for pattern in words[1:]:
                pattern = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(path), pattern)
                for included in sorted(glob.glob(pattern)):
                    found += _ld_conf_dirs(included, depth + 1)
        else:
            found += words
    return found


def ld_cache(path: str = LD_CACHE) -> dict[str, list[str]]:
    """The dynamic linker's cache: each library name with the files it maps it to, in the cache's order (glibc's
    format since 2.32, alone or after the old one; string offsets count from its header)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(64 << 20)
    except OSError:
        return {}
    start = data.find(_CACHE_MAGIC)
    if start < 0 or len(data) < start + 48:
        return {}
    count = struct.unpack_from("<I", data, start + 20)[0]

    def text(offset: int) -> str:
        at = start + offset
        end = data.find(b"\0", at)
        return data[at:end].decode("utf-8", "replace") if 0 <= at < len(data) and end > 0 else ""

    found: dict[str, list[str]] = {}
    for i in range(min(count, (len(data) - start - 48) // 24)):
        _, key, value, _, _ = struct.unpack_from("<iIIIQ", data, start + 48 + 24 * i)
        found.setdefault(text(key), []).append(os.path.normpath(text(value)))
    return found


def _with_hwcaps(dirs: list[str]) -> list[str]:
    """`dirs` as the linker searches them: each folder's glibc-hwcaps subfolders (x86-64-v3, ...) before it."""
    found: list[str] = []
    for folder in dirs:
        found += sorted(glob.glob(os.path.join(glob.escape(folder), "glibc-hwcaps", "*"))) + [folder]
    return [os.path.normpath(d) for d in dict.fromkeys(found)]


def _loader_dirs(env: dict[str, str], cache: dict[str, list[str]] | None = None) -> list[str]:
    """Every folder the dynamic linker may take a library from: LD_LIBRARY_PATH's, its cache's (whatever
    configuration wrote it), the configured and the default ones, each with its glibc-hwcaps subfolders."""
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    cached = [os.path.dirname(p) for paths in (ld_cache() if cache is None else cache).values() for p in paths]
    dirs += _ld_conf_dirs() + cached + ["/lib", "/usr/lib", "/lib64", "/usr/lib64"]
    return _with_hwcaps([os.path.normpath(d) for d in dict.fromkeys(dirs)])


def _resolve(name: str, env: dict[str, str], cache: dict[str, list[str]], listing: dict[str, set[str]]) -> str:
    """Where the dynamic linker takes `name` from, as a real path ("" when nowhere): LD_LIBRARY_PATH's folders,
    then its cache, then the default folders, glibc-hwcaps subfolders first."""
    first = _first(name, _with_hwcaps([d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]), listing)
    first = first or next(iter(cache.get(name, ())), "")
    first = first or _first(name, _with_hwcaps(["/lib", "/usr/lib", "/lib64", "/usr/lib64"]), listing)
    return os.path.realpath(first) if first else ""


def _listing(folder: str, listing: dict[str, set[str]]) -> set[str]:
    if folder not in listing:
        try:
            listing[folder] = set(os.listdir(folder))
        except OSError:
            listing[folder] = set()
    return listing[folder]


def _first(name: str, dirs: list[str], listing: dict[str, set[str]]) -> str:
    """Where the first of `dirs` holding `name` has it ("" when none does)."""
    return next((os.path.join(d, name) for d in dirs if name in _listing(d, listing)), "")


_PYTHON_PROBE = (
    "import importlib.util, json, sys\n"
    "names = json.loads(sys.argv[1])\n"
    "def origin(n):\n"
    "    try:\n"
    "        s = importlib.util.find_spec(n)\n"
    "    except Exception:\n"
    "        return ''\n"
    "    if s is None: return ''\n"
    "    return s.origin if s.origin not in (None, 'namespace') else list(s.submodule_search_locations or [''])[0]\n"
    "print(json.dumps({'path': [p for p in sys.path if p], 'found': {n: origin(n) for n in names}}))\n"
)


def _python_view(python: str, names: list[str]) -> dict:
    """What the image's Python sees with the environment as it is: sys.path and where each name is found."""
    try:
        done = subprocess.run(
            [python, "-c", _PYTHON_PROBE, json.dumps(names)], capture_output=True, text=True, timeout=120, cwd="/"
        )
        return json.loads(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return {"path": [], "found": {}}


def _startup_files(path: list[str]) -> dict[str, str]:
    found = {}
    for folder in path:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            full = os.path.join(folder, name)
            if STARTUP_RE.fullmatch(name):
                found[full] = _sha256(full) if os.path.isfile(full) else "folder"
    return found


def _library_files(dirs: list[str]) -> list[str]:
    found = []
    for folder in dirs:
        try:
            found += [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if LIBRARY_RE.fullmatch(n)]
        except OSError:
            continue
    return found


def record(spec: dict, hashing: bool = True) -> dict:
    """The base's stack as it is; `hashing` False: files by their stat alone (the check compares a file whose stat
    changed with the base's own copy, mounted beside it)."""
    env = {k: v for k, v in os.environ.items() if k in SEARCH_VARS + FIXED_VARS}
    trees = sorted({os.path.normpath(p) for pattern in spec["trees"] for p in glob.glob(pattern)})
    dist_trees, dist_files, tops = _distributions(spec)
    cache = ld_cache()
    loader = _loader_dirs(env, cache)
    constraint = os.environ.get("PIP_CONSTRAINT", "")
    startup = [env_script for name in STARTUP_SCRIPT_VARS if (env_script := os.environ.get(name, "")).startswith("/")]
    singles = [*spec["files"], *dist_files, *_library_files(loader), *([constraint] if constraint else []), *startup]
    entries: dict[str, list] = {}
    for path in [p for tree in [*trees, *dist_trees] for p in _walk(tree)] + singles:
        st = _stat(path)
        entries[path] = st + [_content(path, st[0]) if hashing or st[0] == "l" else ""] if st else ["-"]
    listing: dict[str, set[str]] = {}
    protected = {os.path.realpath(p) for p, st in entries.items() if st[0] in "fl" and ".so" in p}
    libs = {}
    for folder in loader:
        for name in sorted(_listing(folder, listing)):
            if ".so" in name and name not in libs and os.path.realpath(os.path.join(folder, name)) in protected:
                libs[name] = _resolve(name, env, cache, listing)
    python = os.path.realpath(sys.executable)
    view = _python_view(python, tops)
    base_path = [d for d in env.get("PATH", "").split(":") if d]
    commands = {os.path.basename(p) for p, st in entries.items() if st[0] == "f" and os.path.dirname(p) in base_path}
    commands |= {"python3", "python", "pip", "pip3"}
    return {
        "python": python,
        "entries": entries,
        "trees": trees + dist_trees,
        "loader": loader,
        "libs": libs,
        "imports": view["found"],
        "startup": _startup_files(view["path"]),
        "pypath": view["path"],
        "commands": {c: shutil.which(c, path=env.get("PATH")) or "" for c in sorted(commands)},
        "env": env,
    }


def _changed(path: str, was: list, base_root: str = "") -> str:
    """How `path` differs from what was recorded of it ("" when it does not): by its stat, then by its bytes (its
    recorded sha256, or the base's own copy under `base_root`)."""
    now = _stat(path)
    if was[0] == "-":
        return "" if now is None else "added"
    if now is None:
        return "removed"
    if now[0] != was[0]:
        return "replaced by another kind of file"
    if now[4:7] != was[4:7]:
        return f"mode or owner changed ({was[4]:o} {was[5]}:{was[6]} -> {now[4]:o} {now[5]}:{now[6]})"
    if now[0] == "l":  # a link further on may be repointed while this one's stat stays
        return "" if _content(path, "l") == was[7] else "repointed (where it leads changed)"
    if now[0] == "d" or now[1:4] == was[1:4]:
        return ""
    if now[1] != was[1]:
        return "modified (its size changed)"
    if now[0] == "f" and not was[7]:
        original = os.path.join(base_root, path.lstrip("/")) if base_root else ""
        return "" if original and _same_bytes(path, original) else "modified (its bytes changed)"
    return "" if _content(path, now[0]) == was[7] else "modified (its bytes changed)"


def _same_bytes(path: str, original: str) -> bool:
    try:
        with open(path, "rb") as one, open(original, "rb") as other:
            while True:
                a, b = one.read(HASH_CHUNK), other.read(HASH_CHUNK)
                if a != b:
                    return False
                if not a:
                    return True
    except OSError:
        return False


def check(spec: dict, manifest: dict, base_root: str = "") -> list[str]:
    """What changed in the base's stack since `record`, one line each (path: how); `base_root`: where the base's
    own files are mounted (a record made without hashes compares with them)."""
    env = {k: v for k, v in os.environ.items() if k in SEARCH_VARS + FIXED_VARS}
    own = set(spec["own"])  # rewritten by imgbuild itself (a base built by imgbuild has its own records there)
    entries = manifest["entries"].items()
    found = [f"{path}: {how}" for path, was in entries if path not in own and (how := _changed(path, was, base_root))]
    found += _added(spec, manifest, env)
    found += _shadowed(manifest, env)
    return found + [f"{name}: {why}" for name, why in judge_env(manifest["env"], env)]


def _added(spec: dict, manifest: dict, env: dict[str, str]) -> list[str]:
    """Files added in a protected folder (one the globs find now too), and CUDA libraries where the loader looks."""
    own = set(spec["own"])
    own |= {os.path.dirname(path) for path in own}  # imgbuild's folder itself, where the base has none
    known = manifest["entries"]
    trees = sorted({os.path.normpath(p) for pattern in spec["trees"] for p in glob.glob(pattern)})
    found = []
    for tree in dict.fromkeys(manifest["trees"] + trees):
        for path in _walk(tree) if os.path.lexists(tree) else ():
            if path not in known and path not in own and not fnmatch.fnmatch(path, "*/__pycache__/*.pyc"):
                found.append(f"{path}: added")
    return found + [f"{p}: added" for p in _library_files(_loader_dirs(env)) if p not in known]


def _shadowed(manifest: dict, env: dict[str, str]) -> list[str]:
    """Protected names that the dynamic linker, the shell or Python now find somewhere else first."""
    found = []
    cache, listing = ld_cache(), {}  # type: ignore[var-annotated]
    for name, where in manifest["libs"].items():
        if (now := _resolve(name, env, cache, listing)) != where:
            found.append(_moved(where, now, "the dynamic linker"))
    for command, where in manifest["commands"].items():  # a command the base lacks may be added
        if where and (now := shutil.which(command, path=env.get("PATH")) or "") != where:
            found.append(_moved(where, now, f"`{command}` on PATH"))
    python = shutil.which("python3", path=env.get("PATH")) or ""
    if python and os.path.realpath(python) != manifest["python"]:
        found.append(f"{manifest['python']}: python3 on PATH is now {python}")
    view = _python_view(manifest["python"], sorted(manifest["imports"]))
    for name, where in manifest["imports"].items():
        if where and (now := view["found"].get(name, "")) != where:
            found.append(_moved(where, now, f"`import {name}`"))
    for path, digest in _startup_files(list(dict.fromkeys(manifest["pypath"] + view["path"]))).items():
        if manifest["startup"].get(path) != digest:
            how = "modified" if path in manifest["startup"] else "added"
            found.append(f"{path}: {how} (it runs at every Python start)")
    return found


def _moved(where: str, now: str, finder: str) -> str:
    return f"{where}: shadowed for {finder} by {now}" if now else f"{where}: no longer found by {finder}"


def main(argv: list[str]) -> int:
    """`record SPEC MANIFEST [--stat-only]` | `check SPEC MANIFEST STEP [--base-root DIR]`."""
    base_root = argv[argv.index("--base-root") + 1] if "--base-root" in argv[:-1] else ""
    if len(argv) < 3 or argv[0] not in ("record", "check") or (argv[0] == "check" and len(argv) < 4):
        print(main.__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as handle:
        spec = json.load(handle)
    if argv[0] == "record":
        os.makedirs(os.path.dirname(argv[2]) or ".", exist_ok=True)
        with open(argv[2], "w") as handle:
            json.dump(record(spec, hashing="--stat-only" not in argv), handle, sort_keys=True)
        with open(os.path.join(os.path.dirname(argv[2]), "python"), "w") as handle:
            handle.write(os.path.realpath(sys.executable))  # the check runs the base's own, whatever PATH says
        return 0
    with open(argv[2]) as handle:
        manifest = json.load(handle)
    found = check(spec, manifest, base_root)
    step = argv[3]
    for line in found[:MAX_SHOWN]:
        print(f"imgbuild: the {step} step changed the base's stack: {line}", flush=True)
    if len(found) > MAX_SHOWN:
        print(f"imgbuild: ... and {len(found) - MAX_SHOWN} more changes by the {step} step", flush=True)
    if found:
        print(
            f"imgbuild: the base's framework and CUDA stack stay as the base has them: the {step} step may add "
            "beside them, never change, remove or shadow them",
            flush=True,
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
