#!/bin/sh
# Installs the recipe's pip packages without ever replacing the base's framework:
# everything already in the base is a constraint (NGC's own /etc/pip/constraint.txt when the base
# has one, a freeze of the base's packages otherwise).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
pins=$(mktemp)
if [ -n "${PIP_CONSTRAINT:-}" ] && [ -f "$PIP_CONSTRAINT" ]; then
  cp "$PIP_CONSTRAINT" "$pins"; origin="the base's $PIP_CONSTRAINT"
else
  # what `pip list --format=freeze --exclude pip` says, without pip's start-up (a quarter second a step)
  python3 - > "$pins" <<'EOF'
import importlib.metadata as md, re
seen = set()
for dist in md.distributions():  # in sys.path order: the first of a name is the one Python imports
    name = dist.metadata["Name"]
    key = re.sub(r"[-_.]+", "-", name or "").lower()
    if name and dist.version and key not in seen and key != "pip":
        seen.add(key)
        print(f"{name}=={dist.version}")
EOF
  origin="a freeze of the base's packages"
fi
unset PIP_CONSTRAINT
# pip.unpin: base packages the recipe lets pip move, on purpose (never the framework or CUDA stack).
if [ -s "$here/unpin.txt" ]; then
  python3 - "$pins" "$here/unpin.txt" "$here" <<'EOF'
import re, sys
sys.path.insert(0, sys.argv[3])
from pip_versions import canon  # beside this script, as the guard has it
drop = {canon(name) for name in open(sys.argv[2]).read().split()}
lines = open(sys.argv[1]).read().splitlines()
keep = [ln for ln in lines if canon(re.split(r"[<>=!~;\[ @]", ln.strip(), maxsplit=1)[0]) not in drop]
open(sys.argv[1], "w").write("".join(ln + "\n" for ln in keep))
print("imgbuild: unpinned " + ", ".join(sorted(drop)) + " (pip.unpin)")
EOF
fi
# pip.provides: a name a dependency asks for (tensorflow), provided by a base package of another name
# (tensorflow-cpu). A stub distribution of that name, with no files, stands at the provider's version and is
# pinned there: the dependency is met, and pip can never fetch the real thing over the base's.
if [ -s "$here/provides.txt" ]; then
  python3 - "$here/provides.txt" >> "$pins" <<'EOF'
import importlib.metadata as md, os, re, sys
for line in open(sys.argv[1]).read().splitlines():
    name, provider = line.split()
    try:
        base = md.distribution(provider)
    except md.PackageNotFoundError:
        sys.exit(f"imgbuild: pip step failed: pip.provides: {name} is to be provided by the base's {provider}, "
                 f"which the base does not have (drop the line, or name the base package that provides it)")
    version = base.version
    try:
        have = md.distribution(name)
    except md.PackageNotFoundError:
        have = None
    if have is not None and (have.read_text("INSTALLER") or "").strip() != "imgbuild-provides":
        sys.exit(f"imgbuild: pip step failed: pip.provides: the base has {name} {have.version} itself "
                 f"(drop pip.provides.{name})")
    if have is None:
        info = os.path.join(str(base.locate_file("")), f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info")
        os.makedirs(info)
        files = {
            "METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: provided by the base's {provider} {version} (imgbuild pip.provides); installs no files\n",
            "INSTALLER": "imgbuild-provides\n",
        }
        files["RECORD"] = "".join(f"{os.path.basename(info)}/{f},,\n" for f in (*files, "RECORD"))
        for file, text in files.items():
            with open(os.path.join(info, file), "w") as handle:
                handle.write(text)
        print(f"imgbuild: {name} is provided by the base's {provider} {version} (pip.provides)", file=sys.stderr)
    print(f"{name}=={version}")
EOF
fi
# The base's framework under another distribution name (PyPI's tensorflow over the base's tensorflow-cpu)
# would overwrite its files: every such name the base does not have is refused outright.
if [ -f "$here/framework.txt" ]; then
  python3 - "$here/framework.txt" >> "$pins" <<'EOF'
import importlib.metadata as md, sys
for name in open(sys.argv[1]).read().split():
    try:
        md.version(name)
    except md.PackageNotFoundError:
        print(name + "<0")
EOF
fi
[ -f /run/secrets/imgbuild-pip.conf ] && export PIP_CONFIG_FILE=/run/secrets/imgbuild-pip.conf
if [ -f /run/secrets/imgbuild-ca.crt ]; then export PIP_CERT=/run/secrets/imgbuild-ca.crt
elif [ -f "$here/ca.crt" ]; then export PIP_CERT="$here/ca.crt"; fi
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_WARN_SCRIPT_LOCATION=1
# Bytecode that records its source's hash, not the install time (py_compile does so when SOURCE_DATE_EPOCH is
# set): the same inputs give the same layer, and build --reproducible the same digest. 1980: ZIP's earliest.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-315532800}"
# A source build against the base's own packages (pip.no_build_isolation) imports them: no bytecode cache is written
# into the base's folders by those imports (the stack check would rightly call each a change of the base); what the
# step installs is compiled by the installer as before.
export PYTHONDONTWRITEBYTECODE=1
# The recipe's lock (imgbuild lock): the versions resolved before, installed again.
locked=""; [ -f "$here/resolved.txt" ] && locked="-c $here/resolved.txt"
# The lock layer (its requirements are the lock's exact pins): install exactly those, resolving nothing.
nodeps=""; [ -f "$here/lock-layer" ] && nodeps="--no-deps"
# `imgbuild lock` runs this script with IMGBUILD_PIP_REPORT set: resolve, report, install nothing. With uv
# (IMGBUILD_LOCK_UV: the uv it brought, from its cache) the report is uv's "Would install" list.
dry=""; [ -n "${IMGBUILD_PIP_REPORT:-}" ] && dry="--dry-run --report $IMGBUILD_PIP_REPORT"
# pip.installer: uv mounts uv here (a build stage of its own); `imgbuild lock` brings its own when the recipe
# installs with uv, and resolves with pip otherwise.
uv=/tmp/imgbuild-uv/bin/uv
if [ -n "$dry" ]; then uv="${IMGBUILD_LOCK_UV:-/nonexistent}"; fi
if [ -s "$here/uv.txt" ] && [ ! -x "$uv" ] && [ -z "$dry" ]; then
  # Buildah before 1.29 mounts a stage it restored from a registry cache empty: uv is installed here instead,
  # never silently replaced by pip.
  own=$(mktemp -d)
  echo "imgbuild: uv's stage came without uv (a registry cache restored it); installing $(cat "$here/uv.txt") in this step"
  python3 -m pip install -q --no-deps --target "$own" -r "$here/uv.txt" \
    || { echo "imgbuild: pip step failed: uv (pip.installer: uv) could not be installed; see above"; exit 1; }
  uv="$own/bin/uv"
fi
if [ -x "$uv" ]; then
  [ -n "$dry" ] && dry="--dry-run"
  # uv reads no pip.conf: the site's index settings go from the secret into this step's environment only.
  if [ -n "${PIP_CONFIG_FILE:-}" ]; then
    eval "$(python3 - "$PIP_CONFIG_FILE" <<'EOF'
import configparser, shlex, sys
conf = configparser.ConfigParser(interpolation=None)
conf.read(sys.argv[1])
found = conf["global"] if conf.has_section("global") else {}
for key, env in (("index-url", "UV_INDEX_URL"), ("extra-index-url", "UV_EXTRA_INDEX_URL"), ("trusted-host", "UV_INSECURE_HOST")):
    if found.get(key):
        print(f"export {env}={shlex.quote(' '.join(found[key].split()))}")
EOF
)"
  fi
  # uv ignores --trusted-host inside requirements files: the recipe's (and its files') go in the environment.
  hosts=$(sed -n 's/^--trusted-host[ =]*//p' "$here/requirements.txt" | tr '\n' ' ')
  if [ -n "$hosts" ]; then export UV_INSECURE_HOST="${UV_INSECURE_HOST:-} $hosts"; fi
  if [ -n "${PIP_CERT:-}" ]; then export SSL_CERT_FILE="$PIP_CERT"; fi
  export UV_CACHE_DIR="${IMGBUILD_LOCK_UV_CACHE:-/root/.cache/uv}" UV_NO_PROGRESS=1 UV_PYTHON_DOWNLOADS=never
  # uv wraps its messages to the terminal's width (80 columns where there is none, as in a build): one sentence a
  # line, as the guard and the lock read them
  export COLUMNS=100000
  if [ -n "${IMGBUILD_LOCK_HASHES:-}" ]; then
    # imgbuild lock's second pass: the sha256 of every file of each version uv would install, from the index
    exec "$uv" pip compile --python "$(command -v python3)" --no-deps --generate-hashes --no-header --no-annotate \
      --quiet -o "$IMGBUILD_LOCK_HASHES.out" "$IMGBUILD_LOCK_HASHES"
  fi
  tool=uv; set -- "$uv" pip install --python "$(command -v python3)" --system --break-system-packages --compile-bytecode \
    --link-mode copy
  # A source build's isolated environment gets the base's framework or none: asked for torch there, uv would fetch
  # another torch from the index and build against it (GBs, and a C++ ABI the base's torch may not load). The
  # build fails instead, naming pip.no_build_isolation, which builds against the base's own.
  if [ -s "$here/framework.txt" ]; then
    framework_pins=$(mktemp)
    python3 - "$pins" "$here/framework.txt" "$here" > "$framework_pins" <<'EOF'
import re, sys
sys.path.insert(0, sys.argv[3])
from pip_versions import canon  # beside this script, as the guard has it
names = {canon(n) for n in open(sys.argv[2]).read().split()}
for line in open(sys.argv[1]).read().splitlines():
    found = re.match(r"([A-Za-z0-9][A-Za-z0-9_.-]*)==", line.strip())
    if found and canon(found.group(1)) in names:
        print(line.strip())
EOF
    if [ -s "$framework_pins" ]; then set -- "$@" --build-constraint "$framework_pins"; fi
  fi
else
  tool=pip; set -- python3 -m pip install --progress-bar off
fi
# pip.no_build_isolation: packages whose build imports the base's framework (flash-attn, apex, torch-scatter) are
# built against the base's own packages, not in an isolated environment that lacks them.
built=""
if [ -s "$here/no-build-isolation.txt" ]; then
  names=$(sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*\).*/\1/p' "$here/no-build-isolation.txt" | tr '\n' ' ')
  if [ "$tool" = uv ]; then
    for name in $names; do set -- "$@" --no-build-isolation-package "$name"; done
  elif [ -n "$dry" ]; then
    set -- "$@" --no-build-isolation  # pip has no per-package form: its lock resolves the whole set so
  else
    # pip builds them first, alone and unisolated (its wheel cache, a cache mount, keeps what it built), then
    # installs the set with those wheels at hand and pinned at the versions built.
    built=$(mktemp -d)
    echo "imgbuild: building ${names}against the base's own packages (pip.no_build_isolation)"
    # shellcheck disable=SC2086 # $locked is an option list
    python3 "$here/guard.py" "$origin" python3 -m pip wheel --progress-bar off --no-deps --no-build-isolation \
      -w "$built" -c "$pins" -c "$here/constraints.txt" $locked -r "$here/no-build-isolation.txt" || exit 1
    for wheel in "$built"/*.whl; do
      [ -f "$wheel" ] && basename "$wheel" | sed -n 's/^\([^-]*\)-\([^-]*\)-.*\.whl$/\1==\2/p' >> "$pins"
    done
    set -- "$@" --find-links "$built"
  fi
fi
echo "imgbuild: installing $(grep -cv '^\(#\|-\|$\)' "$here/requirements.txt") requirement(s) with $tool under $(wc -l < "$pins") pins from $origin"
# guard.py runs the installer: live output, bounds on resolution time and download bytes
# (IMGBUILD_PIP_RESOLVE_SECONDS, IMGBUILD_PIP_DOWNLOAD_LIMIT), and on failure one line saying what kind it
# was (the cure differs). Both installers get the same pins, constraints and lock.
# shellcheck disable=SC2086 # $locked, $dry and $nodeps are option lists
python3 "$here/guard.py" "$origin" "$@" $dry $nodeps -c "$pins" -c "$here/constraints.txt" $locked -r "$here/requirements.txt" \
    && rc=0 || rc=$?
rm -rf "$pins" /tmp/uv-*.lock ${own:+"$own"} ${built:+"$built"} ${framework_pins:+"$framework_pins"}
[ "$rc" = 0 ] || exit 1
