#!/bin/bash
# The stand-in's /opt/nvidia/nvidia_entrypoint.sh, shaped as NGC's (ngc-real-facts.md section 5): every
# entrypoint.d/*.txt is printed and every *.sh sourced in order (banner, license, driver check, shm note),
# a blank line, then the command, or bash when there is none.
for part in /opt/nvidia/entrypoint.d/*; do
  case "$part" in
    *.txt) cat "$part" ;;
    *.sh) source "$part" ;;
  esac
done
echo
if [ $# -eq 0 ]; then exec /bin/bash; fi
exec "$@"
