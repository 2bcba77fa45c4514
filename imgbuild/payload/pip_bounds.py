"""The pip step's bounds, for guard.py beside it: the time until the installer starts installing and the bytes the
whole step downloads, as imgbuild set them (a secret's `NAME=digits` lines, else the environment), what this
network namespace received so far, and the installer run under them (`run`), its output passed on as it comes and
a status line when it has been quiet for a while. Stdlib only: it runs in the base.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

QUIET_SECONDS = 20


def received_bytes():
    """Bytes received on this network namespace's interfaces but loopback (a build step has its own)."""
    try:
        with open("/proc/net/dev") as handle:
            rows = handle.read().splitlines()[2:]
    except OSError:
        return 0
    total = 0
    for row in rows:
        name, _, counters = row.partition(":")
        fields = counters.split()
        if name.strip() != "lo" and fields and fields[0].isdigit():
            total += int(fields[0])
    return total


def size(count):  # in the settings' units ("16G": 16 GiB): a limit reads as it was written
    for unit, bytes_ in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= bytes_:
            return f"{count / bytes_:.1f} {unit}"
    return f"{count} B"


BOUNDS_SECRET = "/run/secrets/imgbuild-pip-bounds"


def bound(name, kind, secret=BOUNDS_SECRET):
    """A bound set by imgbuild from its settings: a `NAME=digits` line of the step's secret (BuildKit, Buildah),
    else the environment (the sdk backend's ARG, `imgbuild lock`); 0: none."""
    text = os.environ.get(name) or ""
    try:
        with open(secret, encoding="ascii") as handle:
            lines = handle.read(4096).splitlines()
    except (OSError, ValueError):
        lines = []
    for line in lines:
        key, _, value = line.partition("=")
        if key == name and re.fullmatch(r"[0-9]{1,20}", value):
            text = value
    return max(kind(text), 0) if re.fullmatch(r"[0-9]{1,20}(\.[0-9]{1,9})?", text) else 0


def over(watch, elapsed, got):
    """Why pip must stop now, or ""."""
    limit_s, limit_b = bound("IMGBUILD_PIP_RESOLVE_SECONDS", float), bound("IMGBUILD_PIP_DOWNLOAD_LIMIT", int)
    if limit_b and got > limit_b:
        return f"the step downloaded more than the limit of {size(limit_b)} (pip_download_limit)"
    if limit_s and not watch.installing and elapsed > limit_s:
        return f"still resolving after {elapsed:.0f} s, the limit (pip_resolve_timeout)"
    return ""


def stop(proc):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=5)
            return
        except (OSError, subprocess.TimeoutExpired):
            continue


def run(command, watch, limit_s=0.0):
    """pip's exit status, or (text) the reason a bound stopped it; `limit_s`: a bound of the caller's own on the
    whole run (a check's resolve), beside the step's."""
    start, start_rx = time.monotonic(), received_bytes()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    def pump():
        for raw in proc.stdout:
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            watch.see(raw.decode(errors="replace"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    while proc.poll() is None:
        time.sleep(0.2)
        elapsed, got = time.monotonic() - start, received_bytes() - start_rx
        reason = over(watch, elapsed, got) or (f"past {limit_s:.0f} s" if limit_s and elapsed > limit_s else "")
        if reason:
            stop(proc)
            reader.join(timeout=5)
            return reason
        if time.monotonic() - watch.last_line > QUIET_SECONDS:
            doing = "installing" if watch.installing else "resolving"
            busy = f", backtracking through {watch.backtracking()}" if watch.backtracking() else ""
            print(f"imgbuild: pip still {doing}: {elapsed:.0f} s, {size(got)} downloaded{busy}", flush=True)
            watch.last_line = time.monotonic()
    reader.join(timeout=30)
    return proc.returncode
