#!/usr/bin/env bash
# README's main command (or another of its blocks: test-command), verbatim, as on a machine with nothing cached: an
# empty Docker data root, an empty bed cache, a fresh HOME (no pip or imgbuild caches) and a clean clone of this
# repository. Each output line gets the seconds since the start; the last line is the total.
#
#     sudo benchmarks/fresh_machine.sh [BLOCK]    (root; the test bed must be down: tests/testbed/down)
#
# What a fresh machine would also do and this does not: install Debian's docker.io, docker-registry and curl (the
# bed installs what is missing, as it does mmdebstrap). Remove mmdebstrap first (apt-get remove mmdebstrap) to
# count its installation. Everything it makes lives under $FRESH (default /tmp/imgbuild-fresh) and is removed by
# the next run; the real /var/lib/docker and bed cache are only hidden while it runs.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "fresh_machine.sh: run as root (it hides /var/lib/docker behind an empty folder)" >&2; exit 3; }
if pgrep -x dockerd >/dev/null; then
  echo "fresh_machine.sh: dockerd is running; bring the bed down first (tests/testbed/down)" >&2
  exit 3
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-main-command}" in main-command|test-command) ;; *) echo "fresh_machine.sh: BLOCK is main-command or test-command" >&2; exit 2 ;; esac
F=${FRESH:-/tmp/imgbuild-fresh}
CACHE=${IMGBUILD_TESTBED_CACHE:-/var/cache/imgbuild-testbed}
rm -rf "$F"
mkdir -p "$F/docker" "$F/bedcache" "$F/home" "$CACHE" /var/lib/docker
mount --bind "$F/docker" /var/lib/docker
mount --bind "$F/bedcache" "$CACHE"
cleanup() {
  (cd "$F/repo" 2>/dev/null && tests/testbed/down >/dev/null 2>&1) || true
  sleep 3
  while findmnt /var/lib/docker | grep -q "$F/docker"; do umount /var/lib/docker || break; done
  umount "$CACHE" || true
}
trap cleanup EXIT
git clone -q "$REPO" "$F/repo"
cd "$F/repo"
BLOCK=${1:-main-command}
main=$(awk -v mark="<!-- $BLOCK -->" '$0 == mark {found=1; next} found && /^```/{if (inblock) exit; inblock=1; next} inblock{print}' README.md)
start=$(date +%s.%N)
elapsed() { python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):6.1f}')" "$start"; }
rc=0
env HOME="$F/home" XDG_CACHE_HOME= XDG_CONFIG_HOME= bash -c "set -eo pipefail; $main" 2>&1 \
  | while IFS= read -r line; do printf '%s %s\n' "$(elapsed)" "$line"; done || rc=$?
echo "rc=$rc total=$(elapsed) s"
