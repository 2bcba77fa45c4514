"""How the added distributions' modules are imported: in worker processes of their own (a server that preloads the
framework and forks, else one interpreter per distribution), each within its budget."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

from .framework import detect_framework
from .hints import EXTENSION_NOT_LOADED, extension_not_loaded

IMPORT_SECONDS = 120  # one distribution's imports on a quiet machine (IMGBUILD_SMOKE_IMPORT_SECONDS: the setting)
IMPORT_SCALE = 6  # on a busy machine, at least this many times what the base's framework takes to import now
TIMED_OUT = "timed out"  # an import that ran past its budget: said apart from one that fails
_IMPORT_SNIPPET = """
import importlib, json, sys
errors = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:  # a module may raise anything at import, SystemExit included
        errors[name] = (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]
print(json.dumps(errors))
"""


def _import_one(modules: list, budget: float = IMPORT_SECONDS) -> dict:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _IMPORT_SNIPPET, *modules], capture_output=True, text=True, timeout=budget
        )
    except subprocess.TimeoutExpired:
        return {modules[0]: f"{TIMED_OUT} after {budget:.0f} s"}
    try:
        errors = json.loads(proc.stdout.strip().splitlines()[-1])
        said = extension_not_loaded(proc.stderr + "\n" + "\n".join(proc.stdout.splitlines()[:-1]))
        return errors if errors or not said else {modules[0]: said}
    except (ValueError, IndexError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return {modules[0]: f"the interpreter died importing it: {tail[0][:200]}"}


def import_workers() -> int:
    """How many imports run at once: never more than the CPUs this container may use (a 2-core runner ran 4 at
    once, and good packages timed out), at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def configured_import_seconds(text: str) -> float:
    """The setting's budget (IMGBUILD_SMOKE_IMPORT_SECONDS, set by imgbuild): ASCII digits, 1 to 86400; else the
    default."""
    text = text.strip()
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 86400:
        return float(text)
    return float(IMPORT_SECONDS)


def import_budget(configured: float, framework_seconds: float) -> float:
    """One distribution's budget: the setting, or more where the machine is busy now. A package's import runs on
    top of the base's framework, so a machine on which that alone takes long gets a budget that many times over."""
    return max(configured, IMPORT_SCALE * framework_seconds)


def framework_seconds(limit: float, module: str = "") -> float:
    """How long a fresh interpreter takes to import the base's framework now (the machine's load included)."""
    if not module:
        found = [m for m in ("torch", "tensorflow", "jax") if importlib.util.find_spec(m) is not None]
        module = found[0] if found else "json"
    started = time.monotonic()
    try:
        subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return limit
    return time.monotonic() - started


#: The import server: one interpreter imports the base's heavy modules once (torch, numpy, ...), then forks a
#: child per distribution, which imports that distribution's modules on top of them and reports. Each child is a
#: fresh copy of the server: a module that monkeypatches another, breaks the interpreter or forks touches only its
#: own child (and the child's process group is killed when it ends). A server with Python threads after its
#: preload refuses (fork is not safe there) and the check falls back to one interpreter per distribution; native
#: BLAS pools are asked for one thread (they fork safely, as PyTorch's DataLoader workers do).
_IMPORT_SERVER = r"""
import importlib, json, os, re, select, signal, sys, tempfile, time
_import, _dumps, _write, _exit = importlib.import_module, json.dumps, os.write, os._exit
_read, _seek, _search = os.read, os.lseek, re.compile(json.loads(sys.argv[1])).search
req = json.loads(sys.stdin.read())
began = time.monotonic()
for name in req["preload"]:
    try:
        importlib.import_module(name)
    except BaseException:
        pass
framework = time.monotonic() - began
budget = max(req["budget"], req["scale"] * framework)
import threading
threads = threading.active_count()  # Python threads: a fork copies none of them, and a lock one held stays held
if threads != 1 or not hasattr(os, "fork"):
    print(json.dumps({"refused": "%d Python threads after the preload: fork is not safe here" % threads}))
    sys.exit(0)
work = req["work"]
results = [None] * len(work)
pending = list(range(len(work)))
running = {}

def start(i):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            os.close(r)
            null = os.open(os.devnull, os.O_RDWR)
            said = tempfile.TemporaryFile()  # what the imports print: searched for an extension that did not load
            os.dup2(null, 0)
            for fd in (1, 2):
                os.dup2(said.fileno(), fd)
            errors = {}
            for name in work[i]:
                try:
                    _import(name)
                except BaseException as exc:
                    errors[name] = (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]
            if not errors:
                sys.stdout.flush()
                sys.stderr.flush()
                _seek(said.fileno(), 0, 0)
                lines = _read(said.fileno(), 1 << 20).decode("utf-8", "replace").splitlines()
                for n, line in enumerate(lines):
                    if _search(line):  # with the lines it introduces, as hints.extension_not_loaded reads them
                        told = [line.strip()]
                        while told[-1].endswith(":") and n + len(told) < len(lines) and len(told) < 4:
                            told.append(lines[n + len(told)].strip())
                        errors[work[i][0]] = "ExtensionNotLoaded: " + " ".join(w for w in told if w)[:300]
                        break
            data = _dumps(errors).encode()  # the child's own references: an import may have replaced json.dumps
            while data:
                data = data[_write(w, data):]
        finally:
            _exit(0)
    os.close(w)
    os.set_blocking(r, False)
    running[pid] = [i, r, time.monotonic(), []]

def drain(entry):
    while True:
        try:
            chunk = os.read(entry[1], 65536)
        except BlockingIOError:
            return
        if not chunk:
            return
        entry[3].append(chunk)

def end(pid, why):
    i, r, _, chunks = running.pop(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if why is None:
        drain([i, r, 0, chunks])
    os.close(r)
    try:
        results[i] = json.loads(b"".join(chunks)) if why is None else None
    except ValueError:
        results[i] = None
    if results[i] is None:
        results[i] = {work[i][0]: why or "the interpreter died importing it"}

while pending or running:
    while pending and len(running) < req["workers"]:
        start(pending.pop(0))
    select.select([e[1] for e in running.values()], [], [], 0.1)
    for entry in list(running.values()):
        drain(entry)
    for pid in list(running):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            end(pid, None if code == 0 else "the interpreter died importing it (%s)" % (
                "signal %d" % -code if code < 0 else "exit %d" % code))
        elif time.monotonic() - running[pid][2] > budget:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            end(pid, "timed out after %.0f s" % budget)
print(json.dumps({"results": results, "framework_seconds": framework, "budget": budget}))
"""


#: What the import server imports once: the base's framework and what nearly every added package imports.
PRELOAD = {"pytorch": ["numpy", "torch"], "tensorflow": ["numpy", "tensorflow"]}


def import_served(work: list, configured: float, workers: int, framework: str = "") -> list | None:
    """Each item's import errors from the import server (`_IMPORT_SERVER`), or None where it cannot serve (no
    fork, threads after the preload, the server itself failing): the caller then imports one interpreter per
    distribution. Items that timed out are tried once more, alone, in a fresh interpreter with twice the budget."""
    request = {
        "preload": PRELOAD.get(framework or detect_framework() or "", ["numpy"]),
        "work": [list(modules) for _, _, modules in work],
        "budget": configured,
        "scale": IMPORT_SCALE,
        "workers": workers,
    }
    limit = IMPORT_SCALE * configured + 2 * configured * (len(work) + 1)  # the server's own bound, generous
    try:
        one = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.run(
            [sys.executable, "-c", _IMPORT_SERVER, json.dumps(EXTENSION_NOT_LOADED)], input=json.dumps(request),
            capture_output=True, text=True,
            timeout=limit, env={**os.environ, **one},
        )  # fmt: skip
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
        return None
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or len(results) != len(work) or not all(isinstance(r, dict) for r in results):
        return None
    budget = float(answer.get("budget") or configured)
    for i, errors in enumerate(results):
        if any(str(e).startswith(TIMED_OUT) for e in errors.values()):
            results[i] = _import_one(work[i][2], 2 * budget)
    return results


def import_all(work: list, budget: float, workers: int, run=_import_one) -> list:
    """Each item's import errors, at most `workers` at once; an item that ran past `budget` is tried once more,
    alone and with twice the budget (a busy machine, not a broken package), before it counts as timed out."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda item: run(item[2], budget), work))
    for i, errors in enumerate(results):
        if any(str(e).startswith(TIMED_OUT) for e in errors.values()):
            results[i] = run(work[i][2], 2 * budget)
    return results
