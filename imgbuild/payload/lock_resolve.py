"""`imgbuild lock`'s resolver, run inside the recipe's base (stdlib only). It writes the pip step's files, runs the
step's install.sh with a report (pip) or a dry run (uv, then `uv pip compile --no-deps --generate-hashes` for each
file's sha256), and prints one line after its marker (in IMGBUILD_PROBE_MARKER). imgbuild appends
`main(FILES, CACHE, UV)` to it (pipeline.pins): the step's files as base64 JSON, the cache volume's mount, and
uv's requirement ("" for pip).
"""

import base64
import collections
import json
import os
import re
import shutil
import subprocess
import sys

HERE = "/tmp/imgbuild-pip"
REPORT = "/tmp/imgbuild-report.json"
SECRET = "/run/imgbuild/pip.conf"


def main(files_b64: str, cache: str, uv_requirement: str) -> None:
    os.makedirs(HERE, exist_ok=True)
    for name, text in json.loads(base64.b64decode(files_b64)).items():
        with open(os.path.join(HERE, name), "w") as handle:
            handle.write(text)
    env = dict(os.environ, IMGBUILD_PIP_REPORT=REPORT)
    # The caller's cache volume (pip's and uv's caches, and uv itself), kept between locks; without it, no cache.
    cached = os.path.isdir(cache) and os.access(cache, os.W_OK)
    if cached:
        env.update(PIP_CACHE_DIR=cache + "/pip", IMGBUILD_LOCK_UV_CACHE=cache + "/uv")
    else:
        env["PIP_NO_CACHE_DIR"] = "1"
    if os.path.exists(os.path.join(HERE, "ca.crt")):
        env["PIP_CERT"] = os.path.join(HERE, "ca.crt")
    secret = _credentials(env)
    tail: collections.deque = collections.deque(maxlen=12)
    resolver, uv, note = "pip", "", ""
    if uv_requirement:  # the recipe installs with uv: uv resolves, as the build will
        uv = _uv(uv_requirement, cache if cached else "/tmp", env)
        if uv:
            resolver = "uv"
            env["IMGBUILD_LOCK_UV"] = uv
        else:
            note = uv_requirement + " could not be installed in the base: pip resolved instead"
    would: list = []
    code = _run(env, tail, {}, (lambda line: _would_install(line, would)) if uv else None)
    result = {"ok": code == 0, "tail": list(tail), "install": [], "resolver": resolver, "note": note}
    if code == 0 and not uv:
        result["install"] = _reported()
    elif code == 0 and would:
        _hash(would, env, tail)
        result["install"] = would
    if secret:
        os.remove(SECRET)  # gone before the answer is printed
    print(os.environ["IMGBUILD_PROBE_MARKER"] + json.dumps(result))


def _credentials(env: dict) -> bytes:
    """The index credentials come on standard input (never a file of the image or the container's config) and
    are kept on a tmpfs only while the resolver runs."""
    size = sys.stdin.buffer.readline().strip()
    secret = sys.stdin.buffer.read(int(size)) if size.isdigit() else b""
    if secret:
        fd = os.open(SECRET, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, secret)
        os.close(fd)
        env["PIP_CONFIG_FILE"] = SECRET
    return secret


def _run(env: dict, tail: collections.deque, extra: dict, watch=None) -> int:
    proc = subprocess.Popen(["sh", HERE + "/install.sh"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", env=dict(env, **extra))  # fmt: skip
    _beside()
    from pip_words import plain  # the pip step's own reading of a line

    for line in proc.stdout or ():
        print(line, end="", flush=True)  # live: the caller shows it as progress
        tail.append(plain(line)[:500])
        if watch is not None:
            watch(plain(line))
    return proc.wait()


def _beside() -> None:
    """The pip step's scripts, written to HERE with the rest of its files, importable."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)


def _uv(requirement: str, folder: str, env: dict) -> str:
    """uv's binary, installed once into `folder` (whole or not at all: a lock killed here leaves no half uv); ""
    where it cannot be installed."""
    target = os.path.join(folder, "uv-" + requirement.split("==")[1])
    if not os.access(target + "/bin/uv", os.X_OK):
        print("imgbuild: lock: installing " + requirement + " to resolve with", flush=True)
        staging = f"{target}.part-{os.getpid()}"
        got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                              "--target", staging, requirement], env=env, capture_output=True, text=True)  # fmt: skip
        if got.returncode == 0 and not os.path.exists(target):
            os.rename(staging, target)
        shutil.rmtree(staging, ignore_errors=True)
    return target + "/bin/uv" if os.access(target + "/bin/uv", os.X_OK) else ""


def _would_install(line: str, would: list) -> None:
    """What uv's dry run says it would install (`line`: plain, as `_run` reads each), read as the pip step's guard
    reads every install line (the step's pip_versions.py, written to HERE with the rest of its files)."""
    _beside()
    from pip_versions import installed_from

    would += [[name, version, []] for name, version in installed_from(line)]


def _reported() -> list:
    """[name, version, [sha256]] of what pip's report says it would install."""
    with open(REPORT) as handle:
        report = json.load(handle)
    rows = []
    for item in report.get("install", []):
        info = (item.get("download_info") or {}).get("archive_info") or {}
        digest = (info.get("hashes") or {}).get("sha256")
        rows.append([item["metadata"]["name"], item["metadata"]["version"], [digest] if digest else []])
    return rows


def _canon(name: str) -> str:
    return re.sub("[-_.]+", "-", name).lower()


def _hash(would: list, env: dict, tail: collections.deque) -> None:
    """The second pass: the sha256 of every file of each version on the index (uv pip compile --no-deps), with the
    recipe's own index options, into each row of `would`."""
    with open(HERE + "/requirements.txt") as handle:
        options = [line for line in handle.read().splitlines()
                   if line.startswith(("--index-url", "--extra-index-url", "--find-links", "-i ", "-f "))]  # fmt: skip
    with open(HERE + "/lock-pins.txt", "w") as handle:
        handle.write("".join(line + "\n" for line in options + [f"{n}=={v}" for n, v, _ in would]))
    if _run(env, tail, {"IMGBUILD_LOCK_HASHES": HERE + "/lock-pins.txt"}) != 0:
        return
    with open(HERE + "/lock-pins.txt.out") as handle:
        text = handle.read().replace("\\\n", " ")
    hashes = {}
    for line in text.splitlines():
        words = line.split()
        if words and "==" in words[0]:
            hashes[_canon(words[0].split("==")[0])] = [
                w.split(":", 1)[1] for w in words[1:] if w.startswith("--hash=sha256:")
            ]
    for row in would:
        row[2] = hashes.get(_canon(row[0]), [])
