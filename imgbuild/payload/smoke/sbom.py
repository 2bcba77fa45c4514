"""What the recipe added, for the image's SBOM: distributions with their licenses, Debian packages with versions,
and the files its run steps wrote with their sha256."""

from __future__ import annotations

import re
import subprocess

from .dists import _added, record_fingerprint

DEBS_BASELINE = "/opt/imgbuild/debs.base"  # the base's Debian packages (name<TAB>version), likewise
RUN_FILES = "/opt/imgbuild/run-files.sha256"  # `sha256sum` of each file the recipe's run steps wrote (Dockerfile)
RUN_FILES_MAX = 10000  # the template's `head -n`: more are not listed


def license_of(metadata) -> str:
    """A distribution's license as its metadata states it: the SPDX expression, else a one-line License field,
    else the last part of its license classifiers; "" when it says nothing."""
    expression = (metadata.get("License-Expression") or "").strip()
    if expression:
        return expression[:200]
    text = (metadata.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= 100 and text.upper() != "UNKNOWN":
        return text
    classified = [c.split("::")[-1].strip() for c in metadata.get_all("Classifier") or [] if c.startswith("License ::")]
    return ", ".join(sorted(set(classified)))[:200]


DEB_LINE = re.compile(r"([a-z0-9][a-z0-9+.-]{0,127})(?::[a-z0-9]+)?\t([A-Za-z0-9.+:~-]{1,128})")


def debs(text: str) -> dict:
    """`dpkg-query -W -f '${Package}\t${Version}\n'` as {package: version}; a line of any other shape is skipped."""
    found = {}
    for line in text.splitlines()[:100000]:
        match = DEB_LINE.fullmatch(line)
        if match and match.group(2):
            found[match.group(1)] = match.group(2)
    return found


def added_debs(base_text: str, now_text: str) -> list:
    """[package, version] of every Debian package the recipe's layers installed or changed (its apt packages and
    what apt pulled in with them): the SBOM's apt part."""
    base = debs(base_text)
    return [[name, version] for name, version in sorted(debs(now_text).items()) if base.get(name) != version]


RUN_FILE_HASH = re.compile(r"[0-9a-f]{64}")  # sha256sum's hex
RUN_FILE_PATH = re.compile(r"/[^\x00-\x1f\x7f\\]{1,4095}")  # absolute; no control character, no backslash
RUN_FILE_LINE = re.compile(r"(" + RUN_FILE_HASH.pattern + r")  (" + RUN_FILE_PATH.pattern + ")")


def run_file_row(path: str, sha256: str) -> bool:
    """One rule for a file the run steps wrote, in the image and in the SBOM that reads its report: sha256sum's
    hex, an absolute path of printable characters without a backslash, no `..` step."""
    return bool(RUN_FILE_HASH.fullmatch(sha256) and RUN_FILE_PATH.fullmatch(path)) and "/../" not in path + "/"


def run_files(text: str) -> list:
    """[path, sha256] of each file the run steps wrote, from `sha256sum`'s lines; a line of any other shape (a name
    sha256sum escaped, with a backslash or a newline in it) is dropped."""
    found = []
    for line in text.splitlines()[:RUN_FILES_MAX]:
        match = RUN_FILE_LINE.fullmatch(line)
        if match and run_file_row(match.group(2), match.group(1)):
            found.append([match.group(2), match.group(1)])
    return found


def written_by_run() -> list | None:
    """`run_files` of this image's record; None where the recipe has no run step (no record)."""
    try:
        with open(RUN_FILES, encoding="utf-8", errors="replace") as handle:
            return run_files(handle.read(1 << 24))
    except OSError:
        return None


def installed_debs() -> list | None:
    """`added_debs` of this image against the base's record; None where there is no record or no dpkg."""
    try:
        with open(DEBS_BASELINE) as handle:
            base = handle.read(1 << 24)
        now = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\n"], capture_output=True,
                             text=True, timeout=60).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return added_debs(base, now) if base.strip() else None


def added_with_licenses(baseline: set) -> list:
    """[name, version, license, RECORD fingerprint] of every distribution the recipe added or changed (the SBOM's
    Python part; the fingerprint is what a later smoke test may spare it by)."""
    return [
        [name, dist.version, license_of(dist.metadata), record_fingerprint(dist)] for name, dist in _added(baseline)
    ]
