"""What the package index says of a project's releases, read in the base with the stdlib: PEP 691's JSON (with
PEP 700's upload times) or PEP 503's HTML (no dates). The pip step asks it whether the resolver fell back to a
release far older than the newest one the recipe admits (uv's vllm 0.2.5 beside 0.11), or to one the index
yanked. Best effort and bounded: an index that cannot be read in time answers nothing, and nothing is said.
Imported by guard.py, beside it.
"""

import base64
import concurrent.futures
import configparser
import contextlib
import datetime
import html
import http.client
import json
import os
import platform
import re
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from pip_versions import canon, fallback, files_in, meets, read_lines, release_tuple, resolver_cause  # beside it

PAGE_LIMIT = 32 << 20  # bytes of one project's page (PyPI's torch page is about 3 MB of JSON)
TIMEOUT = 8.0  # seconds for one page
OLD_DAYS = 365  # a fallback this much older than the newest admitted release is reported
FINAL = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9}){0,9}")
ANCHOR = re.compile(r"<a\b([^>]{0,4096})>([^<]{1,512})</a>", re.IGNORECASE)
ATTRIBUTE = re.compile(r"""([a-z-]{1,40})\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)
ARCHIVES = (".tar.gz", ".zip", ".tar.bz2", ".tgz")
MACHINE = platform.machine()
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


def _words(value):
    return value.split() if isinstance(value, str) else []


def _file_options(command):
    """(option, value) of each `--option value` line of the requirement files in `command`."""
    found = []
    for _, lines in files_in(command, ("-r",)):
        for line in lines:
            words = line.replace("=", " ", 1).split() if line.startswith("--") else line.split()
            if words[:1] == ["--no-index"] or (len(words) == 2 and words[0].startswith("-")):
                found.append((words[0], words[1] if len(words) == 2 else ""))
    return found


def _pip_conf(environ):
    conf = configparser.ConfigParser(interpolation=None)
    with contextlib.suppress(configparser.Error, UnicodeDecodeError):
        conf.read(environ.get("PIP_CONFIG_FILE") or "/nonexistent")
    found = conf["global"] if conf.has_section("global") else {}
    return found.get("index-url", "").strip(), _words(found.get("extra-index-url", ""))


def index_urls(command, environ=os.environ):
    """The indexes the installer reads, as it is told: the requirement files' `--index-url` and
    `--extra-index-url`, then uv's and pip's environment, then pip.conf, then PyPI; none with `--no-index`."""
    options = _file_options(command)
    if ("--no-index", "") in options or "--no-index" in command:  # in a requirements file or on the command line
        return []
    primary = next((value for option, value in options if option in ("--index-url", "-i")), "")
    extra = [value for option, value in options if option == "--extra-index-url"]
    for key in ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "PIP_INDEX_URL"):
        primary = primary or (environ.get(key) or "").strip()
    for key in ("UV_EXTRA_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        extra += _words(environ.get(key))
    conf_primary, conf_extra = _pip_conf(environ)
    urls = [primary or conf_primary or "https://pypi.org/simple", *extra, *conf_extra]
    return [u for i, u in enumerate(urls) if u not in urls[:i] and u.startswith(("http://", "https://"))]


def trusted_hosts(command, environ=os.environ):
    hosts = _words(environ.get("UV_INSECURE_HOST")) + _words(environ.get("PIP_TRUSTED_HOST"))
    hosts += [value for option, value in _file_options(command) if option == "--trusted-host"]
    return {h.strip().split(":")[0] for h in hosts}


class _SameHost(urllib.request.HTTPRedirectHandler):
    """Redirects to another host only for a request that carries no credentials: the index's never go to another."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        away = urllib.parse.urlsplit(newurl)[:2] != urllib.parse.urlsplit(req.full_url)[:2]  # https to http too
        if away and req.has_header("Authorization"):
            return None
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch(url, trusted=(), environ=os.environ, accept=ACCEPT):
    """(status, body, content type) of `url`, read bounded (PAGE_LIMIT bytes, 2 * TIMEOUT seconds): the HTTP status
    (the body only with 200), or "long" (past either bound) or "unreached" (no answer) for a status. A user part of
    the URL goes as a Basic Authorization header to its own host only (never in the URL, never redirected away)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "unreached", b"", ""
    headers = {"Accept": accept, "User-Agent": "imgbuild-pip-step"}
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        secret = urllib.parse.unquote(parts.password or "")
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
    clean = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    deadline = time.monotonic() + 2 * TIMEOUT  # a server dripping a byte at a time ends here too
    body = bytearray()
    try:
        cafile = environ.get("PIP_CERT") or environ.get("SSL_CERT_FILE") or None
        context = ssl.create_default_context(cafile=cafile)  # a CA file that is not there: no answer, no traceback
        if host in trusted:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        opener = urllib.request.build_opener(_SameHost, urllib.request.HTTPSHandler(context=context))
        with opener.open(urllib.request.Request(clean, headers=headers), timeout=TIMEOUT) as answer:
            kind = answer.headers.get_content_type()
            while len(body) <= PAGE_LIMIT and time.monotonic() < deadline:
                chunk = answer.read1(1 << 16)
                if not chunk:
                    return 200, bytes(body), kind
                body += chunk
    except urllib.error.HTTPError as err:
        return err.code, b"", ""
    except (OSError, ValueError, urllib.error.URLError, ssl.SSLError, http.client.HTTPException):
        return "unreached", b"", ""
    return "long", b"", ""


def page(url, name, trusted=(), environ=os.environ, missing=None):
    """(body, content type) of the index's page for `name`, or None; `missing` where the index says it has no such
    project (404)."""
    status, body, kind = fetch(url.rstrip("/") + "/" + canon(name) + "/", trusted, environ)
    if status == 200:
        return body, kind
    return missing if status == 404 else None


def _when(text):
    if not isinstance(text, str) or not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{1,20}Z?", text):
        return None
    try:
        return datetime.datetime.fromisoformat(text.rstrip("Z")[:19])
    except ValueError:
        return None


def files_of(body, kind):
    """[(filename, uploaded or None, yanked, requires-python)] from a page, JSON or HTML."""
    if kind == "application/vnd.pypi.simple.v1+json":
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return []
        found = data.get("files") if isinstance(data, dict) else None
        return [
            (f["filename"], _when(f.get("upload-time")), bool(f.get("yanked")), f.get("requires-python") or "")
            for f in (found if isinstance(found, list) else [])
            if isinstance(f, dict)
            and isinstance(f.get("filename"), str)
            and isinstance(f.get("requires-python") or "", str)
        ]
    text = body.decode("utf-8", errors="replace")
    out = []
    for attrs, filename in ANCHOR.findall(text):
        values = {k.lower(): html.unescape(a or b) for k, a, b in ATTRIBUTE.findall(attrs)}
        out.append(
            (html.unescape(filename).strip(), None, "data-yanked" in values, values.get("data-requires-python", ""))
        )
    return out


def version_of(filename):
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return parts[1] if len(parts) >= 5 else ""
    for ending in ARCHIVES:
        if filename.endswith(ending) and "-" in filename:
            return filename[: -len(ending)].rsplit("-", 1)[1]
    return ""


def installable(filename, requires_python, python=sys.version_info[:2], machine=MACHINE):
    """Whether this Python could install the file: its Requires-Python, and a wheel's tags (a rough reading:
    an sdist is always a candidate)."""
    if meets(python, ",".join(c.strip() for c in requires_python.split(","))) is False:
        return False
    if not filename.endswith(".whl"):
        return True
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return False
    pythons, abis, platforms = parts[-3].split("."), parts[-2].split("."), parts[-1].split(".")
    own = (f"py{python[0]}", f"py{python[0]}{python[1]}", f"cp{python[0]}{python[1]}")
    abi3 = "abi3" in abis and any(re.fullmatch(r"cp3([0-9]{1,2})", p) and int(p[3:]) <= python[1] for p in pythons)
    return (abi3 or any(p in own for p in pythons)) and any(p == "any" or p.endswith(machine) for p in platforms)


def releases(files):
    """{final version: (first upload or None, every file yanked, any file this Python can install)}"""
    out = {}
    for filename, uploaded, yanked, requires in files:
        version = version_of(filename)
        if not FINAL.fullmatch(version):
            continue
        first, all_yanked, usable = out.get(version, (None, True, False))
        if uploaded and (first is None or uploaded < first):
            first = uploaded
        out[version] = (first, all_yanked and yanked, usable or (not yanked and installable(filename, requires)))
    return out


def merged(pages):
    out = {}
    for found in pages:
        for version, row in found.items():
            out.setdefault(version, row)
    return out


def look_up(names, command, environ=os.environ, deadline=20.0):
    """{canonical name: releases} for each name, from every index the installer reads, fetched side by side;
    a name no index answered for is absent."""
    urls, trusted = index_urls(command, environ), trusted_hosts(command, environ)
    if not urls or not names:
        return {}
    jobs = {(n, u): None for n in names for u in urls}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(jobs)))
    futures = {pool.submit(page, u, n, trusted, environ): (n, u) for n, u in jobs}
    done, _ = concurrent.futures.wait(futures, timeout=deadline)
    pool.shutdown(wait=False, cancel_futures=True)
    found = {}
    for future in done:
        name, _ = futures[future]
        try:
            answer = future.result()
        except Exception:  # noqa: BLE001 - the index is best effort: its trouble never fails the step
            continue
        if answer is not None:
            found.setdefault(canon(name), []).append(releases(files_of(*answer)))
    return {name: merged(pages) for name, pages in found.items()}


def project_on_index(name, command, environ=os.environ):
    """Whether an index the install reads has a release of `name` this Python can install: True, False (every index
    that answered has none, or says it has no such project), or None where no index answered."""
    trusted, answers = trusted_hosts(command, environ), []
    for url in index_urls(command, environ):
        answer = page(url, name, trusted, environ, missing=(b"", "text/html"))
        if answer is not None:
            answers.append(releases(files_of(*answer)))
    if not answers:
        return None
    return any(usable and not yanked for found in answers for _, yanked, usable in found.values())


def old_fallback(name, version, wanted, known):
    """(newest, its upload, the chosen one's upload) when `version` is a final release more than OLD_DAYS older
    than the newest installable, unyanked final release that `wanted` (the recipe's clauses) admits; else None."""
    if not FINAL.fullmatch(version) or version not in known:
        return None
    chosen = release_tuple(version)
    newer = [
        v
        for v, (_, yanked, usable) in known.items()
        if usable
        and not yanked
        and release_tuple(v) > chosen
        and all(meets(release_tuple(v), w) is not False for w in wanted)
    ]
    if not newer:
        return None
    newest = max(newer, key=release_tuple)
    then, now = known[version][0], known[newest][0]
    if then is None or now is None or (now - then).days < OLD_DAYS:
        return None
    return newest, now, then


def old_release_line(installed, named, command, ask, locked=frozenset()):
    """The failure line for a resolver's quiet fallback to a release the index yanked, or to one far older than
    the newest the recipe admits (uv's vllm 0.2.5 beside 0.11), for the packages the recipe names (`named`:
    `named_specs` of its lines) without asking for a version; "" when there is none or the index cannot say.
    `ask(name, newest)`: the resolver's reason. `locked`: the names the recipe's lock pins, which its lock chose
    (kept on purpose by `imgbuild lock`, freed by `--upgrade-package`), not the resolver."""
    chosen = [
        (name, version)
        for name, version in installed
        # asked for by version (==, ===) or from a URL or path (name @ ...): the recipe chose it, not the resolver
        if canon(name) in named
        and canon(name) not in locked
        and not any("==" in spec or "@" in spec for spec in named[canon(name)])
    ]
    known = look_up(sorted({name for name, _ in chosen}), command) if chosen else {}
    for name, version in chosen:
        found = known.get(canon(name), {})
        if found.get(version, (None, False, True))[1]:
            return (
                f"the resolver chose {name} {version}, which the index marks yanked (withdrawn by its authors): pin "
                f"{name} to a release that is not, or ask for this one by its version ({name}=={version})"
            )
        old = old_fallback(name, version, named[canon(name)], found)
        if old:
            newest, now, then = old
            why = ask(name, newest)
            because = f", because {resolver_cause(why)}" if why else ""
            return (
                f"the resolver fell back to {name} {version} ({then:%Y-%m}), {(now - then).days / 365:.1f} years "
                f"older than {name} {newest} ({now:%Y-%m}), the newest the recipe admits{because}: if {name} "
                f"{version} is what you want, ask for it by its version ({name}=={version}); else change what holds "
                f"{name} back (a base made for {name} {newest}, or a pin)"
            )
    return ""


def fallback_held_back(installed, named, command, ask):
    """Why the newest final release of the package the resolver fell back to a pre-release of (pip_versions.fallback)
    was not chosen, as the resolver says when asked for it (`ask(name, newest)`): "the newest, X 2.20.0, is held
    back: X 2.20.0 needs tensorflow~=2.20.0, but the base holds ..."; "" when there is none or nobody can say."""
    late = fallback(installed, named)
    if not late:
        return ""
    name = late[0]
    known = look_up([name], command).get(canon(name), {})
    finals = [v for v, (_, yanked, usable) in known.items() if usable and not yanked]
    if not finals:
        return ""
    newest = max(finals, key=release_tuple)
    why = ask(name, newest)
    return f"the newest, {name} {newest}, is held back: {resolver_cause(why)}" if why else ""


def dry_run(command):
    """The same install, resolved only: no report file written over, nothing installed."""
    asked, skip = [], False
    for word in command:
        if skip or word == "--report":
            skip = not skip
            continue
        asked.append(word)
    return asked if "--dry-run" in asked else [*asked, "--dry-run"]


def question(command, name, newest, folder):
    """The same install, resolved only, with `name`==`newest` asked of it: a constraint file in `folder` named for
    the guard's holders (newest.txt)."""
    path = os.path.join(folder, "newest.txt")
    with open(path, "w") as handle:
        handle.write(f"{name}=={newest}\n")
    return [*dry_run(command), "-c", path]


def recipe_lines(command):
    """The install's words but its requirement files, their option lines (nested files read, paths made
    absolute), and their requirement lines."""
    asked, files, skip = [], [], False
    for word in command:
        if skip:
            files.append(word)
            skip = False
        elif word in ("-r", "--requirement"):
            skip = True
        elif word.startswith("--requirement="):
            files.append(word.split("=", 1)[1])
        elif word.startswith("-r") and not word.startswith("--"):
            files.append(word[2:])
        else:
            asked.append(word)
    options, lines, seen = [], [], set()
    for path in files:
        options += option_lines(path, seen, lines)
    return asked, options, lines


def recipe_names(command):
    """The project each of the recipe's requirement lines asks for, as it spells it (those that name one)."""
    return [name for name in (requirement_name(line) for line in recipe_lines(command)[2]) if name]


def by_itself(command, names, folder, deps=False):
    """The same install of `names` alone: the recipe's requirement files replaced by one in `folder` holding only
    their option lines (an index, find-links, trusted hosts) and each name as the recipe asks for it (else the name
    alone); their dependencies not asked for unless `deps`; the same pins, constraints and options."""
    asked, options, lines = recipe_lines(command)
    asked_for = []
    for name in names:  # a path, a URL, its extras and range: the recipe's own line for it
        own = [line for line in lines if canon(requirement_name(line)) == canon(name)]
        asked_for.append(own[0] if own else name)
    alone = os.path.join(folder, "alone.txt")
    with open(alone, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{line}\n" for line in [*options, *asked_for]))
    return [*asked, *(() if deps else ("--no-deps",)), "-r", alone]


#: a requirement file's line that names another file or folder: `-r more.txt`, `--find-links=wheels`, `-f wheels`
PATH_OPTION = re.compile(r"^(-[rcf]|--requirement|--constraint|--find-links)(?:\s*=\s*|\s+|(?<=^-[rcf]))(\S.*)$")


def option_lines(path, seen, requirements):
    """The option lines of requirement file `path` and of those it names (`-r`), each path in them made absolute
    as pip reads it (relative to the file that holds it, where such a path exists); its requirement lines are added
    to `requirements`."""
    real = os.path.realpath(path)
    if real in seen:
        return []
    seen.add(real)
    here, options = os.path.dirname(os.path.abspath(path)), []
    for line in read_lines(path):
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        if line and not line.startswith("-"):
            requirements.append(line)
        if not line.startswith("-"):
            continue
        found = PATH_OPTION.fullmatch(line)
        option, value = (found.group(1), found.group(2).strip()) if found else ("", "")
        if found and "://" not in value and os.path.exists(os.path.join(here, value)):
            value = os.path.join(here, value)
        if option in ("-r", "--requirement"):
            options += option_lines(value, seen, requirements)
        elif found:
            options.append(f"{option} {value}")
        else:
            options.append(line)
    return options


def requirement_name(line):
    """The project a requirement line asks for: `name[extra]>=1`, `name @ URL`, or a path or URL to a
    distribution file (`.../Name_Two-1.0.tar.gz`, `...whl`, `#egg=name`); "" when it names none."""
    if found := re.search(r"#egg=([A-Za-z0-9][A-Za-z0-9_.-]*)", line):
        return found.group(1)
    if found := re.match(r"([A-Za-z0-9][A-Za-z0-9_.-]*)\s*(?:\[[^]]*\]\s*)?@", line):
        return found.group(1)
    if "/" in line or "\\" in line or re.search(r"\.(?:whl|tar\.gz|zip|tgz|tar\.bz2)$", line.split(";")[0].strip()):
        base = os.path.basename(line.split(";")[0].strip().rstrip("/"))
        found = re.match(r"([A-Za-z0-9][A-Za-z0-9_.]*?(?:-[A-Za-z_][A-Za-z0-9_.]*?)*)-[0-9]", base)
        return found.group(1) if found else ""
    found = re.match(r"[A-Za-z0-9][A-Za-z0-9_.-]*", line)
    return found.group(0) if found else ""
