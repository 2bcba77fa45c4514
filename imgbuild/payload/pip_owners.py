"""The base's files, safe at install time: the pip step's guard (guard.py, beside this script) takes a
snapshot of which distribution owns each file in site-packages before the installer runs, and compares after.
A distribution of another name that wrote over a base file with other contents (jax[cuda12]'s
nvidia-cudnn-cu12 over a CUDA 13 base's nvidia-cudnn-cu13, both in nvidia/cudnn/) fails the step, so the layer
holding it is never kept; the line names the package, who asked for it, whose files, and the cure.

Stdlib only: it runs in the base.
"""

import base64
import hashlib
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its helpers beside it, however it is loaded
from pip_versions import canon  # noqa: E402

#: Bytes of base files hashed at the snapshot when their RECORD gives no hash (Debian's egg-info, old pips);
#: past it, a file without a hash counts as changed when another distribution lists it.
HASH_BUDGET = 256 << 20
NAMESPACE_INIT = 1024  # an __init__.py this small that extends __path__ is namespace boilerplate


def file_hash(where):
    digest = hashlib.sha256()
    with open(where, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def dist_paths(paths=None):
    """The metadata folders of the installed distributions: what `owners(skip=...)` leaves out after the install."""
    import importlib.metadata as md

    found = md.distributions(path=paths) if paths is not None else md.distributions()
    return {str(getattr(dist, "_path", "")) for dist in found} - {""}


METADATA_DIR = re.compile(r"\.(dist|egg)-info(/|$)")


def owners(paths=None, budget=HASH_BUDGET, skip=frozenset()):
    """{file: [(canonical distribution, version, hash)]} for the files inside site-packages that installed
    distributions list (their metadata folders and bytecode aside). A missing hash is computed from the file
    while `budget` lasts, else left "". `skip`: metadata folders (`dist_paths()`) whose distributions are left
    out: after an install, only what it added or replaced needs reading again."""
    import importlib.metadata as md

    found = {}
    for dist in md.distributions(path=paths) if paths is not None else md.distributions():
        if str(getattr(dist, "_path", "")) in skip:
            continue
        meta = dist.metadata  # parsed once: each call parses METADATA again
        name, version, root = canon(meta["Name"] or ""), meta["Version"], os.path.normpath(str(dist.locate_file("")))
        prefix = root + os.sep
        for entry in dist.files or ():
            text = str(entry)
            if "__pycache__" in text or text.endswith(".pyc") or METADATA_DIR.search(text):
                continue
            where = os.path.normpath(os.path.join(root, text))  # strings, not pathlib: a base lists 100,000s
            if not where.startswith(prefix) or not os.path.lexists(where):
                continue  # scripts in bin/ and data files are not what this protects; egg-info lists sources
            digest = f"{entry.hash.mode}={entry.hash.value}" if entry.hash else ""
            if not digest and budget > 0 and os.path.isfile(where) and not os.path.islink(where):
                budget -= os.path.getsize(where)
                digest = file_hash(where)
            found.setdefault(where, []).append((name, version, digest))
    return found


def boilerplate(where):
    """A namespace package's __init__.py (empty, or extending __path__): the same in spirit wherever it is."""
    if os.path.basename(where) != "__init__.py" or not os.path.isfile(where):
        return False
    if os.path.getsize(where) > NAMESPACE_INIT:
        return False
    with open(where, "rb") as handle:
        text = handle.read()
    return not text.strip() or b"extend_path" in text or b"declare_namespace" in text


def overwritten(before, after):
    """{(distribution, version): {(base distribution, version): [files]}}: files a base distribution owned
    that a distribution of another name now lists with other contents."""
    hits = {}
    for where, listed in after.items():
        had = before.get(where)
        if not had:
            continue
        base_names = {name for name, _, _ in had}
        for name, version, digest in listed:
            if name in base_names or (digest and digest == had[0][2]) or boilerplate(where):
                continue
            hits.setdefault((name, version), {}).setdefault(had[0][:2], []).append(where)
    return hits


def requirers(name, paths=None):
    """Installed distributions whose requirements name `name` (canonical), sorted."""
    import importlib.metadata as md

    found = set()
    for dist in md.distributions(path=paths) if paths is not None else md.distributions():
        for req in dist.requires or ():
            if canon(re.split(r"[\s<>=!~;\[(@]", req.strip(), maxsplit=1)[0]) == name:
                found.add(f"{canon(dist.metadata['Name'] or '')} {dist.version}")
    return sorted(found)


#: imgbuild.ngc.CUDA_BUILD_RE, copied (this script runs in the base, without imgbuild); a test keeps them equal.
CUDA_BUILD_RE = re.compile(r"(?:(?<=-)cu|(?:^|(?<=-))cuda)([0-9]{2,3})(?=x?(?:$|[-_]))")


def cuda_build(name):
    """The CUDA major a distribution's canonical name is built for (`nvidia-cudnn-cu12`: `12`), or None;
    imgbuild.ngc.cuda_build's twin."""
    found = CUDA_BUILD_RE.search(name)
    if not found:
        return None
    digits = found.group(1)
    return digits if len(digits) == 2 else digits[:2].lstrip("0") or None


def protected(hits, paths=None, cuda_version=None, has=None, without=None):
    """One line on the first distribution that wrote over the base's files: which, who asked for it, whose
    files, and the cure, checked where it can be: `has(name)` (the index has the project: True, False, None), and
    `without(package, name)` (the release of package the resolver picks with name refused: a version, "" for none,
    None where it could not be asked); "" when none did."""
    if not hits:
        return ""
    (name, version), victims = sorted(hits.items())[0]
    (base, base_version), files = sorted(victims.items(), key=lambda item: -len(item[1]))[0]
    asked = [who for who in requirers(name, paths) if not who.startswith(base + " ")]
    by = f" (needed by {', '.join(asked[:3])})" if asked else " (asked for by the recipe)"
    shown = ", ".join(sorted(re.sub(r"^.*/(?:site|dist)-packages/", "", f) for f in files)[:2])
    more = f" and {len(files) - 2} more" if len(files) > 2 else ""
    cuda = (cuda_version if cuda_version is not None else os.environ.get("CUDA_VERSION", "")).split(".")[0]
    theirs = cuda_build(name)
    first = canon(asked[0].split()[0]) if asked else name
    if theirs and cuda.isascii() and cuda.isdigit() and theirs != cuda:
        cure = f"{name} is built for CUDA {theirs} and the base has CUDA {cuda}: "
        cure += cuda_build_cure(first, theirs, cuda, has)
    elif asked:
        release = without(first, name) if without is not None else None
        cure = f"pin {first} to a release that does not need {name}, or drop it"
        if release:
            cure = f"pin {first}=={release} (the newest release that resolves without {name}), or drop it"
        elif release == "":
            cure = f"drop {first}: no release of it resolves without {name}"
    else:
        cure = f"drop {name}: the base's {base} provides these files"
    others = f" (and {len(hits) - 1} other distribution(s))" if len(hits) > 1 else ""
    return (
        f"{name} {version}{by} would overwrite {len(files)} file(s) of the base's {base} {base_version} "
        f"({shown}{more}){others}; the base's files are protected, so this layer is not kept: {cure}"
    )


def other_cuda(installed, paths=None, cuda_version=None, has=None):
    """One line when the install added libraries built for another CUDA major than the base's (`installed`: the
    installer's (name, version) list): faiss-gpu brings nvidia-*-cu12 onto a CUDA 13 base as faiss-gpu-cu12 does,
    judged by what it brings, not by its name; "" when it did not. `has(name)`: whether the index has the project
    (True, False, None: not known), so that the CUDA build the cure names is one the index has."""
    cuda = (cuda_version if cuda_version is not None else os.environ.get("CUDA_VERSION", "")).split(".")[0]
    if not (cuda.isascii() and cuda.isdigit()):
        return ""
    brought = sorted({canon(n) for n, _ in installed if cuda_build(canon(n)) not in (None, cuda)})
    if not brought:
        return ""
    theirs = cuda_build(brought[0])
    others = {n for n in brought if cuda_build(n) == theirs}
    needed_by = {n: {canon(w.split()[0]) for w in requirers(n, paths)} for n in others}
    outside = sorted({w for ws in needed_by.values() for w in ws} - others)  # faiss-gpu: no CUDA in its name
    roots = sorted(n for n in others if not needed_by[n] & others)  # faiss-gpu-cu12 itself
    who = ", ".join((outside or roots)[:3])
    libraries = sorted(others - set(roots)) or roots
    shown = ", ".join(libraries[:3]) + (f" and {len(libraries) - 3} more" if len(libraries) > 3 else "")
    return (
        f"{who} brought CUDA {theirs} libraries ({shown}) beside the base's CUDA {cuda}: its code is built for "
        f"them, as a package named for CUDA {theirs} is (refused before the build): "
        + cuda_build_cure((outside or roots)[0], theirs, cuda, has)
    )


def cuda_build_cure(name, theirs, cuda, has=None):
    """The cure for `name`, built for CUDA `theirs` on a base with CUDA `cuda`: the same project named for the base's
    CUDA (faiss-gpu-cu12 -> faiss-gpu-cu13, faiss-gpu -> faiss-gpu-cu13) where the index has it, what else works
    where it does not."""
    found = CUDA_BUILD_RE.search(name)
    renamed = name[: found.start(1)] + cuda + name[found.end(1) :] if found and cuda_build(name) else f"{name}-cu{cuda}"
    there = has(renamed) if has is not None else None
    if there:
        return f"ask for its CUDA {cuda} build, {renamed} (on the index), or use a base with CUDA {theirs}"
    if there is False:
        return f"the index has no CUDA {cuda} build of {name} ({renamed} is not there): drop it, or use a base with CUDA {theirs}"  # noqa: E501
    return f"ask for the CUDA {cuda} build of {name}, or drop it, or use a base with CUDA {theirs} (the index could not be asked whether it has {renamed})"  # noqa: E501
