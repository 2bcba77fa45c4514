"""The guard's cures for a conflict, checked before they are printed (guard.py, beside it): each cure is the same
install changed as the cure says, resolved again on the base, resolved only and bounded in time. `pin X` is
printed with the version the resolver picks once the recipe's clause on X is left to it (none: no release of X
resolves with the base, and the cure is not printed); `pip.unpin: [Y]` only where the install resolves with Y's
base pin gone and every base distribution that needs Y kept at its version, the further base pins that then
stand in the way unpinned with it, all named in one line. The words of each such cure are here too (pin_cure,
unpin_cure, backtrack_cure): the one place a conflict's cure is written. Every question is bounded (CHECK_SECONDS,
and CHECK_BUDGET for the step); a cure not asked in time is printed marked as not checked. Stdlib only: it runs in
the base.
"""

import importlib.metadata as md
import os
import re
import tempfile
import time

from pip_bounds import run
from pip_index import dry_run, recipe_lines, requirement_name
from pip_versions import canon, is_prerelease, needing, pin_sources, read_lines, resolver_cause

CHECK_SECONDS = 120.0  # one resolve of a checked cure; past it the cure is printed as not checked
CHECK_BUDGET = 240.0  # every check of one failed step together: past it, the rest are printed as not checked
QUIET = ("-q", "--quiet", "-qq", "-qqq")
PIN_ROUNDS = 4  # the recipe's lines freed or left out together, at most, in asking for a pin
UNPIN_ROUNDS = 4  # base pins let go together, at most, before the unpin cure is called no cure


class Cures:
    """The resolver, asked of cures to the failed install `command` (guard.py's Watch.cures)."""

    def __init__(self, command, origin, watch_type, frameworks=()):
        self.command, self.origin, self.watch_type = list(command), origin, watch_type
        self.frameworks = set(frameworks)
        self.answers = {}  # each question once: a line may name one cure twice
        self.deadline = None  # CHECK_BUDGET from the first question on

    def spend(self):
        """No more questions: the step itself was stopped by a bound, which a question would run into again."""
        self.deadline = time.monotonic()

    def resolve(self, command, what):
        """(resolved, the watch of that resolve), or None where a bound stopped it (or the budget is spent)."""
        self.deadline = self.deadline if self.deadline is not None else time.monotonic() + CHECK_BUDGET
        left = min(CHECK_SECONDS, self.deadline - time.monotonic())
        if left <= 0:
            return None
        print(f"imgbuild: checking the cure ({what}): resolving again, resolved only", flush=True)
        watch = self.watch_type(pin_sources(command, self.origin, self.frameworks))
        told = [word for word in dry_run(command) if word not in QUIET]  # its "Would install" line is the answer
        outcome = run(told, watch, limit_s=left)
        return None if isinstance(outcome, str) else (outcome == 0, watch)

    def pin(self, package, without=""):
        """The final release of `package` the resolver picks (pins' answer for it): "" for none, None: not asked."""
        answer = self.pins(package, without)
        return None if answer is None or answer[1] else answer[0].get(canon(package), "")

    def pins(self, package, without=""):
        """({canonical name: the final release the resolver picks, or "" where none resolves}, whether the rest of
        the recipe still stands in the way) for `package`, its version left to the resolver (the recipe's clause on
        it dropped; with `without`, that distribution refused), and for each other line of the recipe that then
        stands in the way: freed the same where it has a clause, else found to have no release (and left out, to
        see whether the rest resolves). Where the resolver names `package` still, it is asked of `package` alone
        with the base. None: the resolver could not be asked, or the failure was not one line's to say."""
        key = ("pin", canon(package), canon(without))
        if key not in self.answers:
            self.answers[key] = _guarded(self._pins, canon(package), canon(without))
        return self.answers[key]

    def _pins(self, package, without):
        asked, options, lines = recipe_lines(self.command)
        if any("--hash" in line for line in lines):  # hash-checking mode: a line changed here has no hash to check
            return None
        named = {canon(requirement_name(line)): line for line in lines}
        freed, dropped = [package], []
        for _ in range(1 if without else PIN_ROUNDS):
            kept = [line for line in lines if canon(requirement_name(line)) not in dropped]
            changed = [_without_clause(ln) if canon(requirement_name(ln)) in freed else ln for ln in kept]
            if changed == lines and not without:  # asked for by name alone, or not at all: the resolver tried them
                return {package: ""}, False
            answer = self._resolve_freed(asked, [*options, *changed], freed, without)
            if answer is None:
                return None
            resolved, watch = answer
            if resolved:
                found = {name: _version(watch, name, without) for name in freed}
                return {**found, **dict.fromkeys(dropped, "")}, False
            if without:
                return {package: ""}, False
            other = _standing(watch, freed)
            if other == package:  # pip names only the last it backtracked through: asked of it alone
                return self._alone(asked, options, named.get(package, package), package)
            if other in freed or (other in named and _without_clause(named[other]) == named[other]):
                freed = [n for n in freed if n != other]  # no release of it resolves: without it, does the rest?
                dropped.append(other)
            elif other in named:
                freed.append(other)
            else:  # a dependency no line names, or no conflict: not one line's to say
                return None
        return None

    def _alone(self, asked, options, line, package):
        """`package` alone with the base, its clause dropped: ({package: its release}, True: the rest of the recipe
        stands in its way) where it resolves, ({package: ""}, False) where it does not."""
        answer = self._resolve_freed(asked, [*options, _without_clause(line)], [package], "")
        if answer is None:
            return None
        resolved, watch = answer
        version = _version(watch, package, "") if resolved else ""
        return ({package: version}, True) if version else ({package: ""}, False)

    def _resolve_freed(self, asked, lines, freed, without):
        with tempfile.TemporaryDirectory() as folder:
            path, refused = os.path.join(folder, "freed.txt"), os.path.join(folder, "refused.txt")
            _write(path, lines)
            _write(refused, [f"{without}<0"] if without else [])
            what = f"{', '.join(freed)} by name, the version left to the resolver"
            what += f", without {without}" if without else ""
            # past a finished install (without: its layer is not kept) what it installed is no answer: the index is
            fresh = ["--reinstall" if os.path.basename(asked[0]) == "uv" else "--ignore-installed"] if without else []
            return self.resolve([*asked, *fresh, "-r", path, "-c", refused], what)

    def unpin(self, dep, want):
        """(the base pins to let go, all of them, dep first; "") when the install resolves without them, each base
        distribution that needs one kept at its version; ((), why not) when it does not; None: not asked."""
        key = ("unpin", canon(dep), want)
        if key not in self.answers:
            self.answers[key] = _guarded(self._unpin, canon(dep), want)
        return self.answers[key]

    def _unpin(self, dep, want):
        freed = [dep]
        for _ in range(UNPIN_ROUNDS):
            if dep in self.frameworks:
                return (), f"the base's framework {dep} is never moved"
            needs = dependents(freed[-1], want) if len(freed) == 1 else []
            if needs:  # a base distribution that needs what `want` excludes: moving it breaks that one
                return (), " and ".join(
                    f"the base's {name} {version} needs {dep}{need}" for name, version, need in needs
                )
            with tempfile.TemporaryDirectory() as folder:
                answer = self.resolve(self._unpinned(freed, folder), f"the base's pins on {', '.join(freed)} let go")
            if answer is None:
                return None
            resolved, watch = answer
            if resolved:
                return tuple(freed), ""
            why = watch.failure(self.origin)  # names the conflict, and the base pin in it (watch.blocked)
            blocked = watch.blocked  # (package, dep, want) of the conflict that failed it, when a base pin holds
            if not blocked or blocked[1] in freed or blocked[1] in self.frameworks:
                return (), resolver_cause(why)
            freed.append(blocked[1])
        return (), f"more than {UNPIN_ROUNDS} of the base's pins would have to move"

    def _unpinned(self, freed, folder):
        """The install with the base's pins (its first -c file) without `freed`, and every base distribution that
        needs one of them asked for at its installed version (moving it must keep them)."""
        command, first = list(self.command), True
        for at, word in enumerate(self.command[:-1]):
            if word in ("-c", "--constraint") and first:
                first = False
                path = os.path.join(folder, "pins.txt")
                kept = [ln for ln in read_lines(self.command[at + 1]) if canon(requirement_name(ln)) not in freed]
                _write(path, kept)
                command[at + 1] = path
        keep = os.path.join(folder, "kept.txt")
        _write(keep, [f"{name}=={version}" for dep in freed for name, version, _ in dependents(dep, "")])
        return [*command, "-r", keep]


NOT_CHECKED = " (not checked: the resolver did not answer it in time, or not for one line)"


# The words of each checked cure, for guard.py's Watch (`cures`: its Cures, or None where there is no install to
# ask again of, as for lines read alone).


def pin_cure(cures, package, holder, unchecked="a version made for the base"):
    """ "pin X to a version made for the base, or drop it", checked where the resolver can be asked: the
    version that resolves named (with the other lines that then stand in the way: their pins, or which have no
    release for the base), or no pin offered where none does (what would be needed said instead)."""
    answer = cures.pins(package) if cures else None
    if answer is None:  # the resolver could not be asked: the cure as the failure suggests it, said to be so
        return f"pin {package} to {unchecked}, or drop it{NOT_CHECKED if cures else ''}"
    answer, rest = answer
    if rest:  # it resolves alone: another of the recipe's lines is what stands in the way
        return (
            f"{package}=={answer[canon(package)]} resolves with the base alone, but not beside the recipe's other "
            f"lines (see the conflict above): ask for it and change the line that conflicts with it, or drop {package}"
        )
    if not answer.get(canon(package)):
        return (
            f"drop {package}: no release of {package} resolves with {holder}; what would be "
            f"needed is a base whose packages admit one"
        )
    pins = [f"pin {n}=={v} (the newest release that resolves with the base)" for n, v in answer.items() if v]
    drops = [n for n, v in answer.items() if not v]
    gone = f" and drop {', '.join(drops)} (no release of {', '.join(drops)} resolves with {holder})" if drops else ""
    return f"{' and '.join(pins)}{gone}, or drop {package}"


def unpin_cure(cures, pin, package, dep, wanted):
    """`pin` (pin_cure's) and the unpin cure for `dep`, named only where the install resolves with it (and with
    every base pin that then stands in the way, all in one list); else why it cannot help."""
    answer = cures.unpin(dep, wanted) if cures else None
    freed, why = ((dep,), "") if answer is None else answer
    unpin = f"let pip move {dep}: pip.unpin: [{', '.join(freed)}]"
    if answer is None and cures:
        unpin += NOT_CHECKED
    if freed and pin.startswith("drop "):  # no pin resolves, the unpin does
        return f"{unpin}, or drop {package} (no release of {package} resolves with the base as it is)"
    if freed:
        return f"{pin.replace(', or drop', ', drop', 1)}, or {unpin}"
    if pin.startswith("drop "):
        return (
            f"{pin.split(';')[0]}, and pip.unpin: [{dep}] cannot help ({why}); what would be needed is a base "
            f"whose {dep} admits {dep}{wanted}"
        )
    return f"{pin} (pip.unpin: [{dep}] cannot help: {why})"


def backtrack_cure(cures, name):
    """The pin that ends a backtrack: the version the resolver picks once asked again, where it answers; else the
    guess, said to be one (the resolver did not say which release fits: no release is called missing)."""
    version = cures.pin(name) if cures else None
    if version:
        return f"pin {name}=={version} (the newest release that resolves with the base)"
    unsure = " (not checked: the resolver did not say which release fits)" if cures else ""
    return f"pin {name} to a version made for the base{unsure}"


def _guarded(question, *args):
    """A check's answer, or None (not asked) where asking failed: a check never fails the step's own line."""
    try:
        return question(*args)
    except Exception:  # noqa: BLE001 - best effort, as the index's answers are: the cure is then printed unchecked
        return None


def _standing(watch, freed):
    """The package a failed resolve's conflict with a pin names (canonical), one not `freed` first: the resolver
    names a freed one's old releases too (uv: "app<=1.0 needs numlib<2"); "" where it names none."""
    watch.failure("")  # reads the conflict as the guard's line does
    held = [canon(requirement_name(package)) for (package, dep) in watch.depends if dep in watch.held]
    held += [canon(requirement_name(watch.blocked[0]))] if watch.blocked else []
    return next((name for name in held if name not in freed), held[0] if held else "")


def _version(watch, name, without):
    """The final release of `name` a resolve would install (or, past no finished install, the one installed)."""
    version = next((v for n, v in watch.installed if canon(n) == name), "") or ("" if without else _installed(name))
    return version if version and not is_prerelease(version) else ""


def dependents(dep, want):
    """pip_versions.needing over the base's installed distributions (the first of each name, as Python imports)."""
    dists, seen = [], set()
    for dist in md.distributions():
        name = dist.metadata["Name"] or ""
        if name and canon(name) not in seen:
            seen.add(canon(name))
            dists.append((name, dist.version, dist.requires or []))
    return needing(dep, want, dists)


def _without_clause(line):
    """A requirement line with its version clause gone, its extras and marker kept: `x[a]>=2 ; m` -> `x[a] ; m`."""
    found = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9_.-]*\s*(?:\[[^\]]*\])?)\s*[^;@]*(;.*)?", line)
    if not found or "@" in line:
        return line
    return found.group(1) + (f" {found.group(2)}" if found.group(2) else "")


def _installed(name):
    try:
        return md.version(name)
    except (md.PackageNotFoundError, ValueError):
        return ""


def _write(path, lines):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{line}\n" for line in lines))
