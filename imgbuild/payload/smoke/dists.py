"""The image's distributions: the base's list, what the recipe added, their modules, what a distribution needs, and
what imported in the last promoted image with the same files (spared from importing again)."""

from __future__ import annotations

import re

from .versions import normal_version

DISTS_BASELINE = "/opt/imgbuild/dists.base"  # the base's distributions (name==version), likewise


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_baseline(path: str) -> set | None:
    """`name==version` lines of the base's distributions, canonical names and normal versions (pip wrote
    them; the metadata may spell them otherwise); None when not recorded."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [ln.strip() for ln in handle if "==" in ln]
    except OSError:
        return None
    return {(_canonical(ln.split("==", 1)[0]), normal_version(ln.split("==", 1)[1])) for ln in lines}


def top_level_modules(files, top_level_text: str | None) -> list:
    """The importable top-level modules a distribution installs: its top_level.txt when it has one, else
    the first part of each installed path (packages, modules, extension modules)."""
    names = set()
    if top_level_text:
        names = {ln.strip().replace("/", ".").split(".")[0] for ln in top_level_text.splitlines() if ln.strip()}
        if files:  # a name the distribution installs nothing for is no module of it (lmdb 1.4.1 lists `cpython`)
            heads = {str(p).replace("\\", "/").split("/")[0] for p in files}
            stems = {h.split(".")[0] for h in heads}
            names = {n for n in names if n in heads or n in stems}
    else:
        for path in files or []:
            parts = str(path).replace("\\", "/").split("/")
            head = parts[0]
            if head.endswith((".dist-info", ".egg-info", ".data", ".pth")) or head in ("..", "__pycache__", "bin"):
                continue
            if len(parts) > 1:
                names.add(head)
            elif head.endswith(".py"):
                names.add(head[:-3])
            elif ".cpython-" in head or head.endswith(".so"):
                names.add(head.split(".")[0])
    skip = {"test", "tests", "testing", "docs", "doc", "examples", "example", "benchmarks", "scripts", "tools"}
    return sorted(n for n in names if n.isidentifier() and not n.startswith("_") and n not in skip)


def _module_file(path: str) -> bool:
    """A top-level module's own file: `pkg/__init__.py`, `mod.py`, an extension module at the top, or one directly
    in a top-level package (`cv2/cv2.abi3.so`: opencv-python and -headless ship the same `__init__.py`)."""
    parts = path.split("/")
    extension = ".cpython-" in parts[-1] or parts[-1].endswith(".so")
    if len(parts) == 2:
        own = parts[1] == "__init__.py" or extension
        return own and not parts[0].endswith((".dist-info", ".egg-info", ".data", ".libs"))
    return len(parts) == 1 and (path.endswith(".py") or extension)


def shared_modules(dists, added) -> list:
    """Module files two distributions both install with different contents (opencv-python and -headless both own
    cv2/__init__.py: the one installed last wins, whatever pip says), where one of them is an added distribution.
    `dists`: (name, version, files) of every distribution; identical files (namespace boilerplate) are fine."""
    owners: dict = {}
    for name, version, files in dists:
        for f in files or []:
            path = str(f).replace("\\", "/")
            if _module_file(path):
                digest = getattr(getattr(f, "hash", None), "value", "") or ""
                owners.setdefault(path, []).append((name, version, digest))
    found = []
    for path, who in sorted(owners.items()):
        names = {n for n, _, _ in who}
        if len(names) < 2 or not names & set(added):
            continue
        if len({d for _, _, d in who}) == 1 and who[0][2]:
            continue  # the same bytes from each: nothing was overwritten
        listed = " and ".join(f"{n} {v}" for n, v, _ in sorted(who))
        found.append(f"{path.split('/')[0].split('.')[0]} is installed by {listed}: the last one installed "
                     f"overwrote the other's files; keep one of them")  # fmt: skip
    return found


def _distributions() -> list:
    """(canonical name, distribution) of every distribution on the path, each once: a second copy further down
    sys.path is shadowed, it is never imported. One pass over the metadata, for every question asked of it."""
    import importlib.metadata as md

    seen, out = set(), []
    for dist in md.distributions():
        name = _canonical(dist.metadata["Name"] or "")
        if name and name not in seen:
            seen.add(name)
            out.append((name, dist))
    return out


def _added(baseline: set, every=None) -> list:
    """(canonical name, distribution) of every distribution the recipe's layers installed or changed."""
    found = every if every is not None else _distributions()
    return sorted(((n, d) for n, d in found if (n, normal_version(d.version)) not in baseline), key=lambda i: i[0])


def _modules(dist) -> list:
    return top_level_modules(dist.files, dist.read_text("top_level.txt"))


EXTRA_MARKER = re.compile(r"""\bextra\s*==""")


def requirement_names(requires) -> set:
    """The canonical names a distribution's Requires-Dist lines name, other markers' included (erring towards
    re-checking), but not its extras': pandas lists tabulate for its `output-formatting` extra, and adding
    tabulate does not change how pandas imports (it would re-check pandas and all that needs it)."""
    return {
        _canonical(re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0])
        for r in requires or []
        if r.strip() and not EXTRA_MARKER.search(r.partition(";")[2])
    }


#: Where imgbuild puts, beside this script, what imported in the last promoted image: one line per distribution,
#: `name==version sha256-of-its-RECORD`. Always written (empty when nothing is spared), so an image's own file at
#: this path is overwritten; the image's environment is never read for it.
KNOWN_GOOD_FILE = "/tmp/imgbuild-smoke-known.txt"
KNOWN_GOOD_LINES = 5000  # a longer record is not believed at all


def read_known_good(path: str = "") -> str:
    """The known-good file's text; empty when absent, unreadable, or over its bound."""
    try:
        with open(path or KNOWN_GOOD_FILE, "rb") as handle:
            data = handle.read(KNOWN_GOOD_LINES * 400 + 1)
    except OSError:
        return ""
    if len(data) > KNOWN_GOOD_LINES * 400:
        return ""
    return data.decode("utf-8", "replace")


def record_fingerprint(dist) -> str:
    """sha256 of a distribution's RECORD (every installed file with its own hash), its lines sorted: a wheel
    swapped at the same name and version installs other files, and so has another fingerprint. Empty without a
    RECORD: such a distribution is never spared."""
    import hashlib

    try:
        text = dist.read_text("RECORD")
    except (OSError, ValueError):
        return ""
    if not text:
        return ""
    return hashlib.sha256("\n".join(sorted(text.splitlines())).encode()).hexdigest()


def unchanged_since_last(work: list, known_text: str, needs: dict, present: dict | None = None) -> set:
    """The added distributions that need no import check again: the same version with the same installed files
    (its RECORD's fingerprint) imported in the last promoted image of this recipe (`known_text`: its lines
    `name==version fingerprint`, on the same base and system layers), and nothing they require (`needs`: name ->
    the names it requires), directly or not, changed since. `present` ({name: (version, fingerprint)}) is every
    added distribution, modules or not (tzdata's data, a skipped one): what is gone is judged against it, not
    against `work`. Empty without a record."""
    known = set()
    for line in known_text.splitlines()[:KNOWN_GOOD_LINES]:
        word, _, fingerprint = line.strip().partition(" ")
        name, sep, version = word.partition("==")
        if sep and re.fullmatch(r"[0-9a-f]{64}", fingerprint):
            known.add((_canonical(name), normal_version(version), fingerprint))
    if not known:
        return set()
    versions = {n: normal_version(v) for n, v, _ in work}
    every = {n: (normal_version(v), f) for n, (v, f) in (present or {}).items()}
    changed = {n for n, (v, f) in every.items() if not f or (n, v, f) not in known}
    changed |= set(versions) - set(every)  # a fingerprint unknown: never spared
    changed |= {n for n, _, _ in known} - set(every)  # gone: what needed it is re-checked
    needed_by: dict = {}  # whatever needs something affected is affected (a changed numpy re-checks what imports it)
    for name, wanted in needs.items():
        for want in wanted:
            needed_by.setdefault(want, []).append(name)
    affected, todo = set(changed), list(changed)
    while todo:  # each name once: linear in the dependency graph, however long its chains
        for name in needed_by.get(todo.pop(), ()):
            if name not in affected:
                affected.add(name)
                todo.append(name)
    return set(versions) - affected
