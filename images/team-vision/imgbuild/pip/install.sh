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
[ -f /run/secrets/imgbuild-pip.conf ] && export PIP_CONFIG_FILE=/run/secrets/imgbuild-pip.conf
if [ -f /run/secrets/imgbuild-ca.crt ]; then export PIP_CERT=/run/secrets/imgbuild-ca.crt
elif [ -f "$here/ca.crt" ]; then export PIP_CERT="$here/ca.crt"; fi
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_WARN_SCRIPT_LOCATION=1
echo "imgbuild: installing $(grep -cv '^\(#\|-\|$\)' "$here/requirements.txt") requirement(s) under $(wc -l < "$pins") pins from $origin"
if ! python3 -m pip install --progress-bar off -c "$pins" -c "$here/constraints.txt" -r "$here/requirements.txt"; then
  echo "imgbuild: pip cannot install the recipe's packages without changing the base (pins from $origin); see the conflict above" >&2
  rm -f "$pins"; exit 1
fi
rm -f "$pins"
