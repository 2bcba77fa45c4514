#!/bin/sh
# Creates the image's non-root user with the host's UID/GID, adopting a user or group that already
# holds them (NGC images from 25.01 are Ubuntu 24.04 and ship `ubuntu` with UID/GID 1000).
set -eu
name=$1 uid=$2 gid=$3 home=$4 workdir=$5 sudo=${6:-0}
shell=/bin/bash; [ -x "$shell" ] || shell=/bin/sh

# Never rewrite a system account (UID < 1000): the recipe's user must be a person's account.
existing=$(getent passwd "$name" | cut -d: -f3 || true)
if [ -n "$existing" ] && [ "$existing" -lt 1000 ]; then
  echo "imgbuild: $name is a system account of the base (UID $existing); choose another user name" >&2; exit 1
fi
holder_uid_name=$(getent passwd "$uid" | cut -d: -f1 || true)
if [ "$uid" -lt 1000 ] && [ -n "$holder_uid_name" ]; then
  echo "imgbuild: UID $uid belongs to the base's system account $holder_uid_name; build with another UID" >&2; exit 1
fi

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
if [ "$sudo" = 1 ]; then
  # user.sudo: passwordless sudo inside the user's own container (the recipe's apt installs sudo)
  command -v sudo >/dev/null || { echo "imgbuild: user.sudo needs the sudo package in apt:" >&2; exit 1; }
  mkdir -p /etc/sudoers.d
  printf '%s ALL=(ALL) NOPASSWD:ALL\n' "$name" > "/etc/sudoers.d/90-imgbuild-$name"
  chmod 0440 "/etc/sudoers.d/90-imgbuild-$name"
  if command -v visudo >/dev/null; then visudo -cqf "/etc/sudoers.d/90-imgbuild-$name"; fi
  echo "imgbuild: $name may use sudo without a password"
fi
echo "imgbuild: user $name ($uid:$gid) owns $workdir"
