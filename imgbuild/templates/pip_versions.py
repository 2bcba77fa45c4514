"""Versions read without `packaging` (the pip step runs in the base, stdlib only): release tuples, whether a
version meets a requirement's clauses as far as this small reading of PEP 440 can say, and NGC's pre-release
framework trap. Imported by guard.py, beside it.
"""

import re

PRERELEASE = re.compile(r"==\s*v?([0-9]+(?:\.[0-9]+)*)(?:a|b|rc)[0-9]+")
LOWER_BOUND = re.compile(r"(>=|==|~=)\s*([0-9]+(?:\.[0-9]+)*)(?![0-9.]*(?:a|b|rc|dev))")


def release_tuple(text):
    parts = [int(p) for p in text.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def prerelease_trap(held, wanted):
    """Why `wanted` (torch>=2.13) excludes `held` (torch==2.13.0a0+07cecf4168.nv24.5), when the reason is
    NGC's pre-release framework; else "". Under PEP 440 2.13.0a0 sorts before 2.13, so a requirement written
    for this very release does not admit it."""
    pre = PRERELEASE.search(held)
    if not pre:
        return ""
    release = release_tuple(pre.group(1))
    for _, bound in LOWER_BOUND.findall(wanted):
        if release_tuple(bound) == release:
            version = held.split("==", 1)[1].split("+")[0]
            return (
                f"NGC's framework is a pre-release of {pre.group(1)}, and under PEP 440 {version} sorts before {bound}"
            )
    return ""


CLAUSE = re.compile(r"\s*(===|==|!=|<=|>=|~=|<|>)\s*v?([0-9]+(?:\.[0-9]+)*)(\.\*)?([A-Za-z0-9.+!-]*)\s*")


def exact_pin(spec):
    """`numpy==1.26.4` -> (1, 26, 4); None for anything but one exact pin of a final release."""
    found = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*==([0-9]+(?:\.[0-9]+)*)", spec)
    return release_tuple(found.group(1)) if found else None


def meets(version, wanted):
    """Whether the release `version` (a tuple) meets `wanted` (">=2,<3"): True, False, or None when this
    small reading of PEP 440 cannot say (pre-releases, local parts, `~=`, an unknown clause)."""
    if version is None or not wanted:
        return None
    for clause in wanted.split(","):
        found = CLAUSE.fullmatch(clause)
        if not found or found.group(3) or found.group(4) or found.group(1) in ("~=", "==="):
            return None
        bound = release_tuple(found.group(2))
        ops = {"==": version == bound, "!=": version != bound, "<=": version <= bound, ">=": version >= bound}
        ok = ops.get(found.group(1), version < bound if found.group(1) == "<" else version > bound)
        if ok is not True:
            return ok
    return True
