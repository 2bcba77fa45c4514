"""Runs pip for install.sh: its output goes on to the build log as it comes, resolution is bounded (time
until pip starts installing, bytes downloaded by the whole step), a status line ("imgbuild: pip ...",
which the build's progress shows) comes whenever pip has been quiet for a while, and a failure ends in
one line saying what kind it was, naming the package: the cure differs.

usage: python3 guard.py ORIGIN COMMAND...   ORIGIN: where the base's pins came from, for messages.
Bounds from the environment: IMGBUILD_PIP_RESOLVE_SECONDS, IMGBUILD_PIP_DOWNLOAD_LIMIT (bytes); unset: none.
Exit status: 0, or 1 after the line "imgbuild: pip step failed: WHY". Stdlib only: it runs in the base.

An install (not `--dry-run`) must leave every file a base distribution owns as it was (owners.py, beside
this script): a distribution of another name writing over one fails the step, so its layer is never kept.
"""

import functools
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its helpers beside it, however it is loaded
from pip_alike import TOOL_KINDS, builds_alike, isolation_cure, tool_cure  # noqa: E402
from pip_bounds import run  # noqa: E402
from pip_cures import Cures, backtrack_cure, pin_cure, unpin_cure  # noqa: E402
from pip_index import (  # noqa: E402
    fallback_held_back,
    old_release_line,
    project_on_index,
    question,
    trusted_hosts,
)
from pip_pages import missing_line, stopped_note, unread_line  # noqa: E402
from pip_versions import (  # noqa: E402
    PIN_FILES,
    admit_together,
    asked_lines,
    canon,
    exact_pin,
    fallback_line,
    find_links_pages,
    framework_needs,
    installed_from,
    meets,
    named_specs,
    pin_sources,
    prerelease_trap,
    read_names,
    resolver_cause,
)
from pip_words import (  # noqa: E402
    BACKTRACK,
    BUILD_FRAMEWORK,
    BUILDING,
    CONSTRAINT,
    DEPENDS,
    FETCH,
    IGNORED_HOST,
    KINDS,
    MISSING,
    NAME,
    OTHER_FRAMEWORK,
    PAGE_UNREAD,
    PULLED,
    REQUESTED,
    RETRIED_PATH,
    SOURCE_STEP,
    UV_DEPENDS,
    UV_DEPENDS_VIA,
    UV_NEEDS_REFUSED,
    UV_REQUIRES,
    plain,
    spoken,
)

FRAMEWORK_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "framework.txt")  # render writes it


class Watch:
    """What pip's output has said so far, line by line (nothing is kept but these facts)."""

    def __init__(self, sources=None, named=None, pages=(), trusted=()):
        self.sources = sources or {}  # canonical name -> [(spec, who holds it)], from the -c files
        self.pages = tuple(pages)  # the find-links pages the install reads (pip_versions.find_links_pages)
        self.trusted = tuple(trusted)  # the hosts the install trusts without TLS checks (pip_index.trusted_hosts)
        self.page_unread = ""  # the find-links page the installer said it could not read (uv)
        self.ignored_host = ""  # the plain-http host pip would not read (not trusted)
        self.retried = ""  # the path of the last request pip retried (a page's path, or an index's)
        self.asked = {}  # canonical name -> what the recipe asked for ("The user requested ...")
        self.installing = False
        self.looking_at = ""
        self.versions = {}  # canonical name -> versions pip fetched
        self.kinds = set()
        self.missing = ""  # the requirement pip or uv could not find on the index
        self.depends = {}  # (package, dependency) -> [(version, wanted)]
        self.held = {}  # canonical dependency -> the base's constraint, e.g. "torch==2.3.0"
        self.other_framework = ""
        self.building = ""  # the package being built from source, when one is
        self.from_source = []  # every package pip prepared from source (its metadata, or a wheel), in order
        self.pulled = {}  # canonical name -> the names of those that asked for it, the installer's words (PULLED)
        self.build_framework = ""  # the framework a source build asked for in its isolated environment (uv)
        self.build_requires = False  # uv said it resolved a source build's `build-system.requires`
        self.installed = []  # (name, version) the installer said it installed (or would)
        self.named = named or {}  # canonical name -> the recipe's own clauses for it (pip_versions.named_specs)
        self.cures = None  # pip_cures.Cures: the resolver, asked of each cure before it is printed (main sets it)
        self.blocked = None  # (package, dependency, what it wants) of the conflict with a pin of the base it named
        self.last_line = time.monotonic()

    def see(self, raw):
        """One line of the installer's output as it printed it (colour, progress redraws, a CRLF end and all): every
        fact is read from its plain text (pip_words.plain), stripped."""
        self.last_line = time.monotonic()
        line = plain(raw).strip()
        installing = line.startswith("Installing collected packages") or bool(
            re.match(r"Resolved [0-9]+ packages? in", line)
        )
        self.installing = self.installing or installing
        if found := OTHER_FRAMEWORK.search(line):
            self.other_framework = found.group(1)
        self.see_uv(line)
        lowered = line.lower()
        for kind, words in KINDS:
            if any(word.lower() in lowered if isinstance(word, str) else word.search(line) for word in words):
                self.kinds.add(kind)
        self.installed += installed_from(line)
        if found := BUILDING.match(line):
            self.building = found.group(1)
        self.see_pulled(line)
        if SOURCE_STEP.match(line) and self.building and self.building not in self.from_source:
            self.from_source.append(self.building)
        self.build_requires = self.build_requires or "`build-system.requires`" in line
        if self.build_requires and (found := BUILD_FRAMEWORK.search(line)):  # install.sh's --build-constraint
            self.build_framework = found.group(1)
        if not self.missing and (found := MISSING.search(line)):
            self.missing = next(g for g in found.groups() if g)
        self.see_where(line)
        self.see_pip(line)

    def see_where(self, line):
        """Where the installer could not read: a find-links page (uv by its URL, pip by the path it retried), or a
        plain-http host pip does not trust."""
        if found := IGNORED_HOST.search(line):
            self.ignored_host = found.group(1)
        if found := PAGE_UNREAD.search(line):
            self.page_unread = found.group(1)
        elif found := RETRIED_PATH.search(line):
            self.retried = found.group(1)

    def see_uv(self, line):
        """uv's sentences: who depends on what, and which two requirements of one name exclude each other."""
        if found := UV_REQUIRES.search(line):
            self.asked.setdefault(canon(found.group(1)), found.group(1))
        if found := UV_NEEDS_REFUSED.search(line):
            self.needs(*found.group(1, 2, 3, 4))
        if found := UV_DEPENDS.search(line):
            self.needs(*found.group(1, 2, 3, 4))
            if found.group(5).startswith("=="):  # an exact pin is the base's (or the lock's); a range is a package's
                self.held.setdefault(canon(found.group(3)), found.group(3) + found.group(5))  # uv's first word on it
        elif found := UV_DEPENDS_VIA.search(line):  # two packages' needs; the second's pin is the pins' own only
            self.needs(*found.group(1, 2, 3, 4))  # where the pins files hold that name (uv folded it in first)
            self.needs(*found.group(5, 6, 3, 7))
            if found.group(7).startswith("==") and canon(found.group(3)) in self.sources:
                self.held.setdefault(canon(found.group(3)), found.group(3) + found.group(7))

    def needs(self, package, version, dep, wanted):
        """`package` (at `version`, "" for every version) needs `dep` with `wanted` after its name, as the installer
        said it."""
        self.depends.setdefault((package, canon(dep)), []).append((version or "", dep + wanted.strip()))

    def see_pulled(self, line):
        """Who asked for a package: pip says it on the line that names the package, uv after its failed build."""
        if found := PULLED.search(line):
            who, chain = (self.building, found.group(1)) if found.group(1) else found.group(2, 3)
            # pip's "a->b->-r file", uv's "`parent[gpu]` (v1.0) depends on `cpkg`"
            chain = chain.split("->") if found.group(1) else re.findall(rf"`({NAME})(?:\[[^]`]*\])?`", chain)
            named = [m.group(0) for m in (re.match(NAME, part) for part in chain) if m]
            self.pulled[canon(who)] = [n for n in named if canon(n) != canon(who)]

    def see_pip(self, line):
        """pip's own lines: what it fetched, backtracked through, and said of the conflict."""
        if found := FETCH.match(line):
            self.versions.setdefault(canon(found.group(1)), set()).add(found.group(2))
        elif found := BACKTRACK.search(line):
            self.looking_at = canon(found.group(1))
        elif found := DEPENDS.match(line):
            self.needs(*found.group(1, 2, 3, 4))
        elif (found := CONSTRAINT.match(line)) and found.group(2) != "<0":
            self.held[canon(found.group(1))] = found.group(1) + found.group(2)
        elif found := REQUESTED.match(line):
            self.asked[canon(found.group(1))] = found.group(1) + found.group(2)

    def backtracking(self):
        """The package pip went through release after release of: named by pip, else the most fetched."""
        if self.looking_at:
            return self.looking_at
        most = max(self.versions.items(), key=lambda item: len(item[1]), default=("", ()))
        return most[0] if len(most[1]) >= 3 else ""

    def backtrack_note(self, origin=""):
        name = self.backtracking()
        if not name:
            return ""
        tried = len(self.versions.get(name, ()))
        count = f"{tried} versions" if tried > 1 else "versions"
        if any("==" in spec for spec in self.named.get(name, [])):  # the recipe's own pin: pinning is no cure
            return (
                f"; pip backtracked through {count} of {name}, which the recipe pins: something else the recipe "
                f"asks for needs another {name}; see the conflict above"
            )
        if name in self.sources:  # pinned on purpose: pinning it is not the cure
            return (
                f"; pip backtracked through {count} of {name}, which {self.holders(name, origin)}: something the "
                f"recipe asks for needs another {name}; see the conflict above"
            )
        return (
            f"; pip backtracked through {count} of {name}: each likely needs another version of a package "
            f"the base pins (its framework?); {backtrack_cure(self.cures, name)}"
        )

    def causes(self, dep, want=""):
        """The pins of `dep` from the -c files that `want` (what the package asked for) excludes: an exact pin
        that meets it is not the cause. All of them when none can be judged."""
        found = self.sources.get(dep, [])
        named = re.match(NAME, want)
        wanted = want[named.end() :] if named else ""
        judged = [(spec, who) for spec, who in found if meets(exact_pin(spec), wanted) is not True]
        return judged or found

    def holders(self, dep, origin, want=""):
        """Who holds `dep` at what, from the -c files: "the recipe's lock holds huggingface-hub==2.4.0 and the
        recipe's pip.constraints hold huggingface-hub<1"; pip's own words when the files do not say."""
        found = self.causes(dep, want)
        if not found:
            return f"the base holds {self.held.get(dep, dep)} (from {origin})"
        said = [
            f"the base holds {spec} (from {origin})"
            if who == origin
            else f"{who} {'hold' if who.endswith('constraints') else 'holds'} {spec}"
            for spec, who in found
        ]
        return " and ".join(said)

    def cure(self, dep, package, want=""):
        """One cure, by who holds `dep`: the base (pin the package that asked), the lock (lock again), the
        recipe's constraints (loosen them)."""
        who = {w for _, w in self.causes(dep, want)}
        if "the recipe's lock" in who and not any(w.startswith("the base") for w in who):
            return f"the recipe changed since its lock was written: run imgbuild lock (it re-resolves {dep})"
        if who and all(w.startswith("the recipe") for w in who):
            return f"loosen the recipe's constraint on {dep}, or drop {package}"
        pin = pin_cure(self.cures, package, f"the base's {self.held.get(dep, dep)}")
        if (
            not who
            or dep in read_names(FRAMEWORK_FILE)
            or dep.startswith("nvidia-")
            or any("framework" in w for w in who)
        ):
            return pin
        named = re.match(NAME, want)
        wanted = want[named.end() :] if named else ""
        for framework, chain, spec in framework_needs(dep, read_names(FRAMEWORK_FILE)):
            if admit_together(wanted, spec) is False:  # moving it would break the framework: no cure
                return (
                    f"{pin} (pip.unpin: [{dep}] cannot help: the base's {framework} needs {dep}"
                    f"{spec}{f' via {chain}' if chain else ''})"
                )
        return unpin_cure(self.cures, pin, package, dep, wanted)

    def conflict(self, origin):
        """Which package needs what the base holds otherwise, from pip's "conflict is caused by" lines. A
        release written for the base's very framework release, refused only because NGC's is a pre-release,
        is the most useful thing to say: it comes first."""
        for (package, dep), wanted in self.depends.items():
            for version, want in wanted if dep in self.held else ():
                trap = prerelease_trap(self.held[dep], want)
                if trap:
                    named = f"{package} {version}" if version else f"every version of {package}"
                    older = "an older release that admits it"
                    cure = pin_cure(self.cures, package, f"the base's {self.held[dep]}", older)
                    return (
                        f"{named} needs {want}, which the base's {self.held[dep]} (from {origin}) does not meet: "
                        f"{trap}; {cure}"
                    )
        for (package, dep), wanted in self.depends.items():
            if dep in self.held or dep in self.sources:
                many = len(wanted) > 1
                versions = f"{len(wanted)} versions of {package} need" if many else f"{package} {wanted[0][0]} needs"
                if not wanted[0][0]:  # uv: "all versions of X depend on ..."
                    versions = f"every version of {package} needs"
                if (
                    dep in self.held
                    and dep not in self.sources
                    or any(not w.startswith(("the recipe", "imgbuild")) for _, w in self.causes(dep, wanted[0][1]))
                ):
                    self.blocked = (package, dep, wanted[0][1])
                return (
                    f"{versions} {wanted[0][1]}{' (or similar)' if many else ''}, but "
                    f"{self.holders(dep, origin, wanted[0][1])}: {self.cure(dep, package, wanted[0][1])}"
                )
        for dep, want in self.asked.items():
            if dep in self.held or dep in self.sources:
                return f"the recipe asks for {want}, but {self.holders(dep, origin)}: {self.cure(dep, dep)}"
        return (
            f"the recipe's packages conflict with each other or with the pins (from {origin}); see the conflict above"
        )

    def failure(self, origin):
        """One line: what kind of failure this was."""
        if "tls" in self.kinds:
            return "TLS failure reaching the package index (a proxy's CA? set pip_ca_bundle)"
        if "network" in self.kinds:
            return self.network_failure()
        if self.other_framework:
            other = canon(self.other_framework)
            asked = [(pkg, wanted) for (pkg, dep), wanted in self.depends.items() if dep == other and pkg]
            who = "a package"
            if asked:
                package, wanted = asked[0]
                who = f"{package} {wanted[0][0]}".strip() if len(wanted) == 1 else f"every version of {package}"
            cure = (
                f" (drop {asked[0][0]}, or pin a release of it that needs no {self.other_framework})" if asked else ""
            )
            return (
                f"{who} needs {self.other_framework}, another distribution of the base's framework: it would "
                f"overwrite the base's own; see the conflict above{cure}"
            )
        if self.build_framework:  # uv's words for it read as a missing version: it is a source build's
            return self.installing_failure()
        if said := self.pages_failure():
            return said
        if "missing" in self.kinds and (self.missing or "conflict" not in self.kinds):
            if self.missing:
                return (
                    f"{self.missing}: no such package or version on the index for this Python and platform (a typo "
                    "in the recipe or its requirements file? the name as the index spells it); see above"
                )
            return "a package or version does not exist on the index for this Python and platform; see above"
        if "conflict" in self.kinds:
            return self.conflict(origin)
        return self.installing_failure()

    def network_failure(self):
        """The place the installer could not reach: a find-links page where the installer named one (uv by its URL,
        pip by its path), else the index."""
        from urllib.parse import urlsplit

        retried = [p for p in self.pages if self.retried and urlsplit(p).path == self.retried]
        page = self.page_unread or (retried[0] if retried else "")
        if page:
            return (
                f"network failure reaching the find-links page {page} (a --find-links line of the requirements): "
                "the build could not read it (offline? a proxy? a network that reaches only the package index?), "
                "and what only that page serves cannot be installed without it"
            )
        return "network failure reaching the package index (offline? a proxy? set pip_index_url)"

    def pages_failure(self):
        """The line for a find-links page the installer could not read (uv names it, for any reason: a 404, not a
        page of links), or found nothing on for a requirement it found nowhere; "" where there is none."""
        if self.page_unread:
            return unread_line(self.page_unread, self.trusted)
        if self.ignored_host and "missing" in self.kinds:
            return (
                f"{self.missing or 'a requirement'}: pip read nothing from the plain-http index or find-links page at "
                f"{self.ignored_host}, a host it does not trust (uv reads it): use its https:// address, or add "
                f"{self.ignored_host} to pip.trusted_hosts; see above"
            )
        return missing_line(self.missing, self.pages, self.trusted) if "missing" in self.kinds and self.missing else ""

    def installing_failure(self, alike=(), then=""):
        """Past resolving: a file that is not the one locked, or a source build that failed (with the cure where
        the recipe has one), else what pip said. `alike`: other packages whose builds need the same cure, named in
        the same line; `then`: what fails once they are cured (a build tool the base lacks)."""
        if "hash" in self.kinds:
            return (
                "a file the index served does not match the sha256 the recipe's lock holds for it (the index "
                "changed a release, or the lock was edited); see above, and run imgbuild lock if the new file is right"
            )
        if self.build_framework or "isolated" in self.kinds:
            return isolation_cure([self.building, *alike], then, self.build_framework)
        names = sorted({n for n in (self.building, *alike) if n})
        what = f"building {spoken(names)}" if names else "building a package from source"
        tool = self.build_tool(what)
        if tool:
            return tool
        if "sdist" in self.kinds:
            return "building a package from source failed; see the compiler or build output above"
        return "pip failed; see its output above"

    def missing_tool(self):
        """The kind of build tool a source build found missing (one of TOOL_KINDS, the most telling first), or ""."""
        return next((kind for kind in TOOL_KINDS if kind in self.kinds), "")

    def build_tool(self, what):
        """The build tool a source build found missing, named with its cure; "" when none was."""
        return tool_cure(self.missing_tool(), what)

    def whose(self, names):
        """Of `names` (the recipe's lines), the one whose build failed, else the one that asked for it; or ""."""
        chain = [canon(n) for n in (self.building, *self.pulled.get(canon(self.building), ()))]
        return next((n for c in chain for n in names if canon(n) == c), "")

    def needs_the_framework(self):
        """Whether the failure is a source build asking for the base's framework in its isolated environment."""
        return bool(self.building) and (bool(self.build_framework) or "isolated" in self.kinds)


def why_not(command, origin, name, newest):
    """What the resolver says when asked for `name`==`newest` on top of the same install, resolved only: the
    requirement that forced a fallback, as the guard names any conflict; "" when it resolves."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        asked = question(command, name, newest, folder)
        print(f"imgbuild: asking the resolver why not {name} {newest}", flush=True)
        watch = Watch(pin_sources(asked, origin, read_names(FRAMEWORK_FILE)))
        outcome = run(asked, watch)
        if outcome == 0 or isinstance(outcome, str):
            return ""
        why = resolver_cause(watch.failure(origin))
        if not watch.blocked:
            return why
        _, dep, want = watch.blocked  # a base pin holds it back: would letting it go (pip.unpin) take the newest?
        named = re.match(NAME, want)
        answer = Cures(asked, origin, Watch, read_names(FRAMEWORK_FILE)).unpin(
            dep, want[named.end() :] if named else ""
        )
        if answer and answer[0]:
            why += f"; pip.unpin: [{', '.join(answer[0])}] lets the resolver take {name} {newest} (asked of it)"
        return why


def main(argv):
    origin, command = argv[1], argv[2:]
    from owners import dist_paths, other_cuda, overwritten, owners, protected  # beside this script

    before = None if "--dry-run" in command else owners()
    present = dist_paths() if before is not None else set()
    named = named_specs(asked_lines(command))  # the recipe's own lines, read once for every judgement below
    frameworks = read_names(FRAMEWORK_FILE)
    watch = Watch(pin_sources(command, origin, frameworks), named, find_links_pages(command), trusted_hosts(command))
    watch.cures = Cures(command, origin, Watch, frameworks)
    outcome = run(command, watch)
    if outcome == 0:
        # what the install added or replaced: a distribution it left alone lists what it listed before
        has = functools.partial(project_on_index, command=command)
        hits = overwritten(before, owners(skip=present)) if before is not None else {}
        why = protected(hits, has=has, without=watch.cures.pin)
        if not why and before is not None:
            why = other_cuda(watch.installed, has=has)
        ask = functools.partial(why_not, command, origin)
        if not why:  # the index and the resolver are asked only where there is a fallback to explain
            why = fallback_line(watch.installed, named, fallback_held_back(watch.installed, named, command, ask))
        locked = {
            name for name, held in watch.sources.items() if any(who == PIN_FILES["resolved.txt"] for _, who in held)
        }
        why = why or old_release_line(watch.installed, named, command, ask, frozenset(locked))
        if not why:
            return 0
        print(f"imgbuild: pip step failed: {why}", flush=True)
        return 1
    if isinstance(outcome, str):
        watch.cures.spend()
    stopped = f"stopped: {outcome}{stopped_note(watch.pages, watch.trusted)}" if isinstance(outcome, str) else ""
    why = stopped or watch.failure(origin)
    tool = watch.build_tool(f"building {watch.building}") if watch.building else ""
    tool = tool if tool == why else ""  # the failure was that build's, for want of a tool
    if not isinstance(outcome, str) and (watch.needs_the_framework() or tool):
        alike, then = builds_alike(command, watch, [tool] if tool else [])
        if watch.needs_the_framework():
            why = watch.installing_failure(alike, then)
        elif alike:  # a build that failed otherwise came first: those after it that need the framework, with it
            why = isolation_cure(alike, then)
    if watch.backtracking() not in why:  # a conflict that names the package says it already
        why += watch.backtrack_note(origin)
    print(f"imgbuild: pip step failed: {why}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
