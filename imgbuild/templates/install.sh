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
  python3 -m pip list --format=freeze --exclude pip > "$pins"; origin="a freeze of the base's packages"
fi
unset PIP_CONSTRAINT
# pip.unpin: base packages the recipe lets pip move, on purpose (never the framework or CUDA stack).
if [ -s "$here/unpin.txt" ]; then
  python3 - "$pins" "$here/unpin.txt" <<'EOF'
import re, sys
canon = lambda name: re.sub(r"[-_.]+", "-", name).lower()
drop = {canon(name) for name in open(sys.argv[2]).read().split()}
lines = open(sys.argv[1]).read().splitlines()
keep = [ln for ln in lines if canon(re.split(r"[<>=!~;\[ @]", ln.strip(), maxsplit=1)[0]) not in drop]
open(sys.argv[1], "w").write("".join(ln + "\n" for ln in keep))
print("imgbuild: unpinned " + ", ".join(sorted(drop)) + " (pip.unpin)")
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
echo "imgbuild: installing $(grep -cv '^\(#\|-\|$\)' "$here/requirements.txt") requirement(s) under $(wc -l < "$pins") pins from $origin"
log=$(mktemp); status=$(mktemp)
# Live output and a copy to classify a failure; pip's own status survives the pipe through a file.
# The recipe's lock (imgbuild lock): the versions resolved before, installed again.
locked=""; [ -f "$here/resolved.txt" ] && locked="-c $here/resolved.txt"
# `imgbuild lock` runs this script with IMGBUILD_PIP_REPORT set: resolve, report, install nothing.
dry=""; [ -n "${IMGBUILD_PIP_REPORT:-}" ] && dry="--dry-run --quiet --report $IMGBUILD_PIP_REPORT"
# shellcheck disable=SC2086 # $locked and $dry are option lists
{ python3 -m pip install --progress-bar off $dry -c "$pins" -c "$here/constraints.txt" $locked -r "$here/requirements.txt" \
    && echo 0 > "$status" || echo $? > "$status"; } 2>&1 | tee "$log"
rc=$(cat "$status" 2>/dev/null || true); rm -f "$status"
if [ "${rc:-1}" != 0 ]; then
  # Say what kind of failure this was: the cure differs.
  if grep -qiE 'SSLError|CERTIFICATE_VERIFY_FAILED|certificate verify failed' "$log"; then
    why="TLS failure reaching the package index (a proxy's CA? set pip_ca_bundle)"
  elif grep -qiE 'Failed to establish a new connection|Name or service not known|Temporary failure in name resolution|ConnectTimeout|ReadTimeoutError|Network is unreachable|ProxyError' "$log"; then
    why="network failure reaching the package index (offline? a proxy? set pip_index_url)"
  elif other=$(grep -oE 'requested \(constraint\) [A-Za-z0-9_.-]+<0' "$log" | head -n 1 | sed -E 's/.* ([^<]+)<0/\1/') && [ -n "$other" ]; then
    why="a package needs $other, another distribution of the base's framework: it would overwrite the base's own; see the conflict above"
  elif grep -qiE 'ResolutionImpossible|conflicting dependencies|The conflict is caused by' "$log"; then
    why="the recipe's packages conflict with the base's pins (from $origin); see the conflict above"
  elif grep -qiE 'No matching distribution found|Could not find a version that satisfies' "$log"; then
    why="a package or version does not exist on the index for this Python and platform; see above"
  elif grep -qiE 'Failed building wheel|subprocess-exited-with-error|metadata-generation-failed' "$log"; then
    why="building a package from source failed; see the compiler or build output above"
  else
    why="pip failed; see its output above"
  fi
  # The resolver tried version after version of a package: name it (every version wants another torch?).
  looked=$(grep -oE 'pip is looking at multiple versions of [A-Za-z0-9_.-]+' "$log" | tail -n 1 | sed 's/.* of //')
  [ -n "$looked" ] && why="$why (pip backtracked through versions of $looked: each may need another pin of the base)"
  echo "imgbuild: pip step failed: $why" >&2
  rm -f "$pins" "$log"; exit 1
fi
rm -f "$pins" "$log"
