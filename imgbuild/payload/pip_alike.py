"""Source builds of a failed pip step, for guard.py beside it: the cure for those that ask for the base's framework
in the installer's isolated build environment (`isolation_cure`), the cure for each build tool the base lacks
(`tool_cure`), and the other packages whose builds need the same cure (`builds_alike`), found by resolving again,
resolved only. Stdlib only: it runs in the base.
"""

import os
import shutil

from pip_bounds import run
from pip_index import by_itself, dry_run, recipe_names
from pip_versions import canon
from pip_words import nvcc_cure, spoken

ALIKE_ROUNDS = 32  # dry runs, each a resolve: the same cure found for up to this many more packages
TOOL_KINDS = ("nvcc", "ninja", "headers", "compiler")  # the build tools a failed source build names
NO_COMPILER = "; it needs a C/C++ compiler too, which the base lacks: add apt: [g++, python3-dev]"


def isolation_cure(names, then="", framework=""):
    """The line for source builds of `names` that need the base's framework in the installer's isolated build
    environment: asked for by name (`framework`, uv's words) or imported (pip's), the field that cures them, a
    compiler the base lacks (they will compile here once built against the base), and `then`: what fails after."""
    names = sorted({n for n in names if n})
    what = f"building {spoken(names)}" if names else "building a package from source"
    who, many = ", ".join(names) or "the package", len(names) > 1
    it, builds, asks, imports = ("them", "build", "ask", "import") if many else ("it", "builds", "asks", "imports")
    compiler = "" if shutil.which("c++") or shutil.which("g++") else NO_COMPILER
    then = f"; then {then}" if then else ""
    if framework:
        return (
            f"{what} {asks} for {framework} in {'their' if many else 'its'} isolated build environment, which would "
            f"build {it} against another {framework} than the base's: add {who} to pip.no_build_isolation, so that "
            f"{'they' if many else 'it'} {builds} against the base's own{compiler}{then}"
        )
    return (
        f"{what} {imports} the base's framework, which the isolated build environment lacks: add {who} to "
        f"pip.no_build_isolation, so that {'they' if many else 'it'} {builds} against the base's own "
        f"framework{compiler}{then}"
    )


def tool_cure(kind, what):
    """The line for a source build (`what`) that found a build tool missing, by its kind (one of TOOL_KINDS) with
    its cure; "" for no kind."""
    if kind == "nvcc":
        return f"{what} needs CUDA's compiler (nvcc), which the base lacks: {nvcc_cure()}"
    if kind == "ninja":
        return f"{what} needs the ninja build program, which the base lacks: add ninja to pip.packages"
    if kind == "headers":
        return f"{what} needs Python's C headers (Python.h), which the base lacks: add apt: [python3-dev] to the recipe"
    if kind == "compiler":
        return f"{what} needs a C/C++ compiler, which the base lacks: add apt: [g++, python3-dev] to the recipe"
    return ""


def builds_alike(command, watch, tools=()):
    """The other packages whose source builds ask for the base's framework, as `watch`'s does, and what fails once
    they are all built against the base (each build tool the base lacks, once, after `tools`), or "". Resolved again
    with those found so far built against the base (uv: per package; pip: its global switch), each round without the
    recipe's line whose build failed for another reason (or that asked for it), until it resolves. Then, with pip,
    what it built and the recipe's own are asked alone, isolated (uv too where a failed build was no line's)."""
    import tempfile

    uv = os.path.basename(command[0]) == "uv"
    names = [watch.building] if watch.needs_the_framework() else []  # else its build failed otherwise: past it
    first, tools, built, kept, done = len(names), list(tools), [], None, False
    missing = {watch.missing_tool()} if tools else set()  # each build tool the base lacks, named once
    if not names:  # the recipe's own lines, each by its name, but the one whose build failed (or that asked for it)
        kept = recipe_names(command)
        failed = watch.whose(kept)
        kept = [n for n in kept if n != failed]
        done = not kept
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(0 if done else ALIKE_ROUNDS):
            unisolated = (
                [w for n in names for w in ("--no-build-isolation-package", n)] if uv else ["--no-build-isolation"]
            )
            with_ = f"with {spoken(names)} built against the base's own packages" if names else "past that build"
            print(f"imgbuild: resolving again {with_}", flush=True)
            again = type(watch)(watch.sources, watch.named)
            asked = command if kept is None else by_itself(command, kept, folder, deps=True)
            outcome = run([*dry_run(asked), *unisolated], again)
            built += again.from_source
            done = outcome == 0 or isinstance(outcome, str)
            if done:
                break
            if uv and again.needs_the_framework() and canon(again.building) not in {canon(n) for n in names}:
                names.append(again.building)
                continue
            if again.missing_tool() not in {"", *missing}:
                missing.add(again.missing_tool())
                tools.append(again.build_tool(f"building {again.building or 'a package from source'}"))
            if kept is None:  # the recipe's own lines, each by its name
                kept = recipe_names(command)
            failed = again.whose(kept)  # the recipe's line whose build failed otherwise, or that asked for it
            if failed:
                kept.remove(failed)
            done = bool(failed) and not kept
            if done or not failed:
                break
    if not uv or not done:
        names += asked_alone(command, watch, [*(() if uv else built)], [*names, watch.building])
    return names[first:], "; then ".join(tools)


def asked_alone(command, watch, built, names):
    """Of `built` and the recipe's own requirements not in `names`, those whose build asks for the base's
    framework when asked alone, isolated; each round drops the one whose build failed (a round per failing build
    at most). uv resolves them with their dependencies (with `--no-deps` it builds nothing), those in `names`
    built against the base."""
    import tempfile

    uv = os.path.basename(command[0]) == "uv"
    rest = [n for n in [*built, *recipe_names(command)] if canon(n) not in map(canon, names)]  # never reached too
    rest = [n for i, n in enumerate(rest) if canon(n) not in map(canon, rest[:i])]  # as it first spelled them
    found = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(ALIKE_ROUNDS if rest else 0):
            print(f"imgbuild: asking whether building {spoken(rest)} needs the base's framework too", flush=True)
            alone = type(watch)(watch.sources, watch.named)
            asked = dry_run(by_itself(command, rest, folder, deps=uv))
            if uv:
                asked += [w for n in [*names, *found] for w in ("--no-build-isolation-package", n)]
            if run(asked, alone) == 0:
                break
            failed, new = alone.whose(rest), alone.needs_the_framework()
            if new and canon(alone.building) not in {canon(n) for n in [*names, *found]}:
                found.append(alone.building)  # uv: a dependency's, built against the base next round
            elif not failed:
                break
            if failed and (not new or canon(failed) == canon(alone.building)):
                rest.remove(failed)
            if not rest:
                break
    return found
