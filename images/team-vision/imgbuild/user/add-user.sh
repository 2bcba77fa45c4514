#!/bin/sh
# Creates the image's non-root user with the host's UID/GID, adopting a user or group that already
# holds them (NGC images from 25.01 are Ubuntu 24.04 and ship `ubuntu` with UID/GID 1000).
set -eu
name=$1 uid=$2 gid=$3 home=$4 workdir=$5
shell=/bin/bash; [ -x "$shell" ] || shell=/bin/sh

group=$(getent group "$gid" | cut -d: -f1 || true)
if [ -z "$group" ]; then
  if getent group "$name" >/dev/null; then groupmod -g "$gid" "$name"; else groupadd -g "$gid" "$name"; fi
elif [ "$group" != "$name" ]; then
  groupmod -n "$name" "$group"
fi

holder=$(getent passwd "$uid" | cut -d: -f1 || true)
if [ -n "$holder" ] && [ "$holder" != "$name" ]; then
  usermod -l "$name" -g "$gid" -d "$home" -m -s "$shell" "$holder"
elif [ -z "$holder" ] && getent passwd "$name" >/dev/null; then
  usermod -u "$uid" -g "$gid" -d "$home" -m -s "$shell" "$name"
elif [ -z "$holder" ]; then
  # -l: no lastlog entry (a large UID would otherwise make a huge sparse /var/log/lastlog)
  useradd -l -m -d "$home" -u "$uid" -g "$gid" -s "$shell" "$name"
fi
mkdir -p "$home" "$workdir"
chown "$uid:$gid" "$home" "$workdir"
echo "imgbuild: user $name ($uid:$gid) owns $workdir"
