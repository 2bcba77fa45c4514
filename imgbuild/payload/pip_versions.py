"""Versions read without `packaging` (the pip step runs in the base, stdlib only): release tuples, whether a
version meets a requirement's clauses as far as this small reading of PEP 440 can say, and NGC's pre-release
framework trap. Imported by guard.py, beside it.
"""

import contextlib
import os
import re


def canon(name):
    """A distribution's name as PEP 503 compares names: `Flash_Attn` and `flash-attn` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


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


def _edges(wanted):
    """Release tuples at and around each bound of `wanted` (">=2,<3"): where two ranges can first meet."""
    found = []
    for clause in wanted.split(","):
        matched = CLAUSE.fullmatch(clause)
        if matched:
            bound = [int(p) for p in matched.group(2).split(".")]
            found += [tuple(bound), (*bound, 1), (*bound[:-1], bound[-1] - 1, 999) if bound[-1] else (*bound, 0)]
    return [release_tuple(".".join(str(max(p, 0)) for p in edge)) for edge in found]


def admit_together(first, second):
    """Whether some release meets both clause lists ("<2.dev0" and ">=2"): True, False, or None when this small
    reading cannot say (a clause it does not read). A range either meets the other's bounds or lies inside it,
    so the bounds of both and their neighbours are enough to ask."""
    first, second = first.replace(".dev0", ""), second.replace(".dev0", "")  # "<2.dev0": below every 2 release
    answers = [(meets(edge, first), meets(edge, second)) for edge in _edges(first) + _edges(second) + [(0,)]]
    if any(a is True and b is True for a, b in answers):
        return True
    if any(a is None or b is None for a, b in answers) or not answers:
        return None
    return False


PRE_RELEASE = re.compile(
    r"(?:[0-9.](?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?[0-9]*(?:\.?post[0-9]*)?)?(?:\.?dev[0-9]*)?\Z"
)
#: uv's lines for what it installed (`+`) or reinstalled (`~`), with or without their indent, and the source of a
#: local or direct-URL one: " + vllm==0.2.5", "~ six==1.17.0", " + idna==3.9 (from file:///wheels/idna-3.9-...whl)"
UV_ADDED = re.compile(r"\s*[+~] ([A-Za-z0-9][A-Za-z0-9_.-]*)==(\S+)(?: \(from \S+\))?\s*")


def is_prerelease(version):
    """A pre-release or development release under PEP 440 (2.1.0.dev2, 2.13.0a0, 1.0rc1), its local part aside."""
    found = PRE_RELEASE.search(version.split("+")[0].lower())
    return bool(found and found.group(0))


def installed_from(line):
    """(name, version) of what one line of pip's or uv's output says is (or would be) installed."""
    if found := UV_ADDED.fullmatch(line):
        return [(found.group(1), found.group(2))]
    for lead in ("Successfully installed ", "Would install "):
        if line.lstrip().startswith(lead):
            return [tuple(word.rsplit("-", 1)) for word in line.lstrip()[len(lead) :].split() if "-" in word]
    return []


NAMED = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9_.-]*)\s*(?:\[[^\]]*\])?\s*([^;#]*)")


def named_specs(asked):
    """{canonical name: [its clauses as written, ">=0.1,<2" or ""]} of the recipe's requirement lines."""
    named = {}
    for line in asked:
        found = NAMED.match(line)
        if found:
            clauses = found.group(2).split(" --")[0].replace(" ", "")
            named.setdefault(canon(found.group(1)), []).append(clauses)
    return named


def fallback(installed, named):
    """The first (name, version) installed that the recipe asked for by name (`named`: `named_specs` of its
    requirements and constraints) and got as a pre-release it did not name: what a resolver falls back to when no
    final release fits (uv's tf-models-official 2.1.0.dev2); None when there is none. A dependency's pre-release
    is not one (opentelemetry-sdk pins its semantic conventions at 0.66b2: asked for, by that package)."""
    for name, version in installed:
        clauses = named.get(canon(name))
        if clauses is not None and is_prerelease(version) and not any(version in clause for clause in clauses):
            return name, version
    return None


def read_lines(path):
    """The lines of a requirement or constraint file, read bounded (4 MiB); none when it cannot be read."""
    with contextlib.suppress(OSError), open(path, errors="replace") as handle:
        return handle.read(1 << 22).splitlines()
    return []


def files_in(command, flags):
    """(path, lines) of each file in `command` that follows one of `flags` ("-r", "-c"), read bounded; a file that
    cannot be read gives no lines."""
    return [(path, read_lines(path)) for flag, path in zip(command, command[1:], strict=False) if flag in flags]


def find_links_pages(command):
    """The web pages of links (`--find-links URL`) the install reads, on its command line or in its requirements
    files (render writes a requirements file's `--find-links` there)."""
    words = list(command) + [w for _, lines in files_in(command, ("-r",)) for line in lines for w in line.split()]
    pages = [words[i + 1] for i in range(len(words) - 1) if words[i] in ("-f", "--find-links")]
    return [url for url in pages if url.startswith(("http://", "https://"))]


def asked_lines(command):
    """The lines of the recipe's own requirement and constraint files in `command` (never the lock's or the
    base's pins): what the recipe asked for by name."""
    own = ("requirements.txt", "constraints.txt")
    return [line for path, lines in files_in(command, ("-r", "-c")) if os.path.basename(path) in own for line in lines]


def fallback_line(installed, named, held_back=""):
    """The failure line for a pre-release the resolver fell back to (see `fallback`), or "". `held_back`: why the
    newest final release was not chosen, as the resolver says it (pip_index.fallback_held_back), or ""."""
    late = fallback(installed, named)
    if not late:
        return ""
    name, version = late
    because = f"; {held_back}" if held_back else ""
    return (
        f"the resolver fell back to {name} {version}, a pre-release the recipe did not ask for: no final release of "
        f"{name} fits the base's pins and the recipe's other packages, so none is there to pin{because}: ask for this "
        f"one by its version ({name}=={version}) if it is what you want; else drop {name}, or use a base whose pins "
        f"admit a final release of {name}"
    )


def resolver_cause(why):
    """The resolver's reason without the cure the guard put after it: "a 2.0 needs b<2, but the base holds b==2.1
    (from ...)" of "...(from ...): pin a to a version made for the base, or drop it"."""
    return why.rsplit("): ", 1)[0] + ")" if "): " in why else why


def read_names(path):
    """The canonical names in a file of names (framework.txt), read bounded; none when it cannot be read."""
    try:
        with open(path) as handle:
            return [canon(name) for name in handle.read(1 << 16).split()]
    except OSError:
        return []


REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9_.-]*)\s*(?:\[[^\]]*\])?\s*\(?([^;()]*)\)?\s*(?:;(.*))?")


def installed_requires(name):
    """The installed distribution `name`'s Requires-Dist lines (none when it is not installed)."""
    import importlib.metadata as md

    try:
        return md.requires(name) or []
    except (md.PackageNotFoundError, ValueError, OSError):
        return []


def framework_needs(dep, frameworks, limit=2000, requires=installed_requires):
    """(framework, the chain of base distributions through which it needs `dep`, their clauses on it) for each of the
    base's framework distributions (`frameworks`: framework.txt's names) whose installed requirements reach `dep`:
    TensorFlow needs numpy>=2 through ml-dtypes. What no extra asks for, read from the base's own metadata (or
    `requires`: a name's Requires-Dist lines, as the base's pins probe read them), bounded."""
    found = []
    for framework in frameworks:
        seen, queue = {framework}, [(framework, [])]
        while queue and len(seen) < limit:
            name, chain = queue.pop(0)
            requires_lines = requires(name)
            if not requires_lines:
                continue
            for line in requires_lines:
                req = REQUIREMENT.fullmatch(line)
                if not req or "extra" in (req.group(3) or ""):
                    continue
                child, spec = canon(req.group(1)), req.group(2).replace(" ", "")
                if child == dep and spec:
                    found.append((framework, " -> ".join([*chain, name][1:]), spec))
                elif child not in seen:
                    seen.add(child)
                    queue.append((child, chain + [name]))
    return found


def needing(dep, want, dists):
    """(name, version, its clause on `dep`) of each of `dists` ((name, version, Requires-Dist lines): the base's
    distributions) that needs `dep`, its extras' needs aside; with `want` (a clause list, "<2"), only those whose
    clause `want` excludes altogether: moving `dep` there would break them."""
    found = []
    for name, version, lines in dists:
        if canon(name) == dep:
            continue
        for line in lines:
            req = REQUIREMENT.fullmatch(line)
            if not req or canon(req.group(1)) != dep or "extra" in (req.group(3) or ""):
                continue
            need = req.group(2).replace(" ", "")
            if not want or (need and admit_together(want, need) is False):
                found.append((name, version, need))
    return found


#: Who holds the pins of each -c file install.sh passes, by the file's name; the first -c file (a temporary
#: copy of the base's constraint file, or a freeze) is the base's.
PIN_FILES = {"constraints.txt": "the recipe's pip.constraints", "resolved.txt": "the recipe's lock"}
PIN_FILES["newest.txt"] = "imgbuild's question (the newest release)"  # pip_index.question's
PIN_LINE = re.compile(
    r"([A-Za-z0-9][A-Za-z0-9_.-]{0,127})(?:\[[^\]]*\])?\s*((?:[<>=!~]=?|===)[^;#\s]*(?:\s*,\s*(?:[<>=!~]=?|===)[^;#\s,]*)*)"
)


def pin_sources(command, origin, frameworks=()):
    """{canonical name: [(spec, who holds it)]} from the -c files in `command`. The framework's pin in
    constraints.txt is the base's (its image config declares it): `frameworks`, framework.txt's names."""
    sources, first = {}, True
    frameworks = set(frameworks)
    for path, lines in files_in(command, ("-c", "--constraint")):
        who = origin if first else PIN_FILES.get(os.path.basename(path), "a constraint file")
        first = False
        for line in lines:
            found = PIN_LINE.match(line.strip())
            if found and found.group(2) != "<0":
                spec = found.group(1) + found.group(2).replace(" ", "")
                framework = who == PIN_FILES["constraints.txt"] and canon(found.group(1)) in frameworks
                holder = "the base's framework (its image config)" if framework else who
                sources.setdefault(canon(found.group(1)), []).append((spec, holder))
    return sources
