#!/bin/bash
# Records what real pip and uv print for installs, upgrades, downgrades, reinstalls, dry runs, uninstalls, pre-releases,
# local wheels (from a folder whose name has a space and a non-ASCII letter), conflicts, missing names and a failed source
# build, into pip-output.txt and uv-output.txt beside this script, and again in each output mode the installers have:
# *.color.txt (FORCE_COLOR, CLICOLOR_FORCE: escapes in every line), *.tty.txt (on a terminal, through script(1):
# progress bars redrawn with carriage returns, CRLF line ends), *.verbose.txt (-v). The logs are kept byte for byte.
# The guard's parsers are tested against these logs (tests/test_pip_messages.py). Needs PyPI and script(1); run from
# anywhere:
#   UV=/path/to/uv PYTHON=python3.11 tests/data/installer-logs/record.sh
# Each block: "$ command" (paths shortened), the command's stdout and stderr together (as the guard reads them),
# "[exit N]". The failed source build's CUDA_HOME (a folder without nvcc, as on a base without the toolkit) is
# shown as /usr/local/cuda, where torch and the setup.py files look first.
set -u
here=$(cd "$(dirname "$0")" && pwd)
lab=$(mktemp -d)
trap 'rm -rf "$lab"' EXIT
UV=${UV:-uv}
PYTHON=${PYTHON:-python3}
export PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 UV_NO_PROGRESS=1 UV_CACHE_DIR="$lab/uvcache"
unset PIP_FIND_LINKS PIP_CONSTRAINT UV_NATIVE_TLS
# one sentence a line, as install.sh has uv write them (a terminal of 80 columns would wrap them)
export COLUMNS=100000
cd "$lab" || exit 1
# an sdist whose setup.py runs nvcc as apex's get_cuda_bare_metal_version does (causal-conv1d, mamba-ssm, flash-attn)
wheels="wheels ü"
mkdir -p src/cudaext-1.0 "$wheels"
cat > src/cudaext-1.0/setup.py <<'PY'
import os
import subprocess
from setuptools import setup

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")


def get_cuda_bare_metal_version(cuda_dir):
    return subprocess.check_output([cuda_dir + "/bin/nvcc", "-V"], universal_newlines=True)


get_cuda_bare_metal_version(CUDA_HOME)
setup(name="cudaext", version="1.0")
PY
printf '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n' > src/cudaext-1.0/pyproject.toml
printf 'Metadata-Version: 2.1\nName: cudaext\nVersion: 1.0\n' > src/cudaext-1.0/PKG-INFO
tar czf "$wheels/cudaext-1.0.tar.gz" -C src cudaext-1.0
printf 'six==1.4.1\n' > pins.txt
printf 'six<1.5\n' > asked.txt  # the recipe's constraint against what it asks for
printf 'six<0\n' > refused.txt  # how install.sh refuses another name of the base's framework
printf 'setuptools==0.0.1\n' > build-pins.txt  # a build requirement no index has, as install.sh's --build-constraint
printf 'six==1.16.0 --hash=sha256:%064d\n' 0 > hashes.txt  # a lock's sha256 the file does not have
# sdists whose builds fail for want of a build tool, in the words a base without it prints: sh's for ninja (torch's
# cpp_extension runs `ninja --version`) and a compiler, gcc's for Python's headers, Python's for a framework the
# build imports
sdist() {  # name, the setup.py line that fails
  mkdir -p "src/$1-1.0"
  printf 'import subprocess\nfrom setuptools import setup\n\n%s\nsetup(name="%s", version="1.0")\n' "$2" "$1" > "src/$1-1.0/setup.py"
  printf '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n' > "src/$1-1.0/pyproject.toml"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: 1.0\n' "$1" > "src/$1-1.0/PKG-INFO"
  tar czf "$wheels/$1-1.0.tar.gz" -C src "$1-1.0"
}
sdist noninja 'subprocess.check_call(["/bin/sh", "-c", "ninja --version"], env={"PATH": "/nonexistent"})'
sdist nocompiler 'subprocess.check_call(["/bin/sh", "-c", "c++ --version"], env={"PATH": "/nonexistent"})'
sdist noheaders 'open("probe.c", "w").write("#include \"Python.h\"\n"); subprocess.check_call(["gcc", "-nostdinc", "-c", "probe.c"])'
sdist needstorch 'import torch'
# wheels: one that needs cudaext (the installer names who asked for the package whose build failed), and two that need
# two versions of depx (each names the other)
"$PYTHON" - "$wheels" <<'PY'
import sys, zipfile
for name, version, needs in [("needsext", "1.0", "cudaext"), ("depx", "1.0", ""), ("depx", "2.0", ""),
                             ("pinner", "1.0", "depx==1.0"), ("user", "1.0", "depx>=2")]:
    info = f"{name}-{version}.dist-info/"
    with zipfile.ZipFile(f"{sys.argv[1]}/{name}-{version}-py3-none-any.whl", "w") as whl:
        needed = f"Requires-Dist: {needs}\n" if needs else ""
        whl.writestr(info + "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{needed}")
        whl.writestr(info + "WHEEL", "Wheel-Version: 1.0\nGenerator: record.sh\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(info + "RECORD", "")
PY
# an index behind a certificate nobody trusts
openssl req -x509 -newkey rsa:2048 -nodes -keyout tls.key -out tls.crt -days 1 -subj /CN=127.0.0.1 > /dev/null 2>&1
"$PYTHON" - <<'PY' &
import http.server, ssl
server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
tls.load_cert_chain("tls.crt", "tls.key")
server.socket = tls.wrap_socket(server.socket, server_side=True)
open("tls.port", "w").write(str(server.server_address[1]))
server.serve_forever()
PY
server=$!
trap 'kill "$server"; rm -rf "$lab"' EXIT
while [ ! -s tls.port ]; do sleep 0.1; done
untrusted="https://127.0.0.1:$(cat tls.port)/simple"
outside=$(hostname -I | tr ' ' '\n' | grep -v '^127\.' | head -1)  # an address of this machine's, not loopback
export UV_HTTP_RETRIES=0  # pip: --retries 1 (its retry names the path it could not reach)

run() {  # in $mode: plain, color, tty or verbose
  echo "\$ $*" | sed "s#$lab/##g; s#$UV #uv #; s#target/bin/python#python3#g"
  local rc
  case $mode in
    color) FORCE_COLOR=1 CLICOLOR_FORCE=1 "$@" > out.txt 2>&1; rc=$? ;;
    tty) UV_NO_PROGRESS=0 script -qec "$(printf '%q ' "$@")" /dev/null < /dev/null > out.txt 2>&1; rc=$? ;;
    *) "$@" > out.txt 2>&1; rc=$? ;;
  esac
  sed "s#$lab/cuda#/usr/local/cuda#g; s#$lab/##g; s#$lab#.#g" out.txt
  echo "[exit $rc]"
}

record() {  # installer, mode: the command prefix for "install", then "uninstall"
  local py=target/bin/python mode=$2 bar=(--progress-bar off) loud=()
  if [ "$mode" = tty ]; then bar=(); fi
  if [ "$mode" = verbose ]; then loud=(-v); fi
  rm -rf target && "$PYTHON" -m venv target && $py -m pip install -q -U pip setuptools > /dev/null
  if [ "$1" = uv ]; then
    set -- "$UV" pip install "${loud[@]}" --python "$py"; local remove=("$UV" pip uninstall --python "$py") again=(--reinstall-package six)
    echo "# uv $("$UV" --version | cut -d' ' -f2), Python $($py -V | cut -d' ' -f2), $mode, recorded $(date -u +%F)"
  else
    set -- "$py" -m pip install "${loud[@]}" "${bar[@]}"; local remove=("$py" -m pip uninstall -y) again=(--force-reinstall --no-deps)
    echo "# pip $($py -m pip --version | cut -d' ' -f2), Python $($py -V | cut -d' ' -f2), $mode, recorded $(date -u +%F)"
  fi
  run "$@" six==1.16.0 typing-extensions==4.12.2 python-dateutil==2.8.2
  run "$@" six==1.17.0 python-dateutil==2.9.0.post0
  run "$@" typing-extensions==4.11.0
  run "$@" "${again[@]}" six
  run "$@" --dry-run idna==3.10 six==1.16.0
  run "$@" --pre typing-extensions==4.13.0rc1
  "$py" -m pip download -q --no-deps -d "$wheels" idna==3.9 > /dev/null 2>&1
  run "$@" "./$wheels/idna-3.9-py3-none-any.whl"
  run "${remove[@]}" six
  run "$@" -c pins.txt python-dateutil==2.9.0.post0
  run "$@" einopz
  run "$@" six==9.9
  CUDA_HOME="$lab/cuda" run "$@" --no-index --find-links "$wheels" --no-build-isolation cudaext==1.0
  local once=(); [ "$1" != "$UV" ] && once=(--retries 1)
  run "$@" -c asked.txt six==1.16.0
  run "$@" -c refused.txt python-dateutil==2.9.0.post0
  run "$@" -c pins.txt "python-dateutil>=2.8,<2.9.1"
  run "$@" --build-constraint build-pins.txt --find-links "$wheels" cudaext==1.0
  CUDA_HOME="$lab/cuda" run "$@" --no-index --find-links "$wheels" --no-build-isolation needsext
  run "$@" --no-index --find-links "$wheels" einopz
  run "$@" "${once[@]}" --no-index --find-links http://127.0.0.1:9/whl/links.html cudaext==1.0
  run "$@" "${once[@]}" --index-url "$untrusted" cudaext==1.0
  # a plain-http page on a host that is not this machine's loopback (pip trusts only those, and ignores the page; uv
  # reads it: this machine's own address, where nothing listens on port 9)
  run "$@" "${once[@]}" --no-index --find-links "http://$outside:9/whl/links.html" cudaext==1.0
  run "$@" -r hashes.txt
  run "$@" --no-index --find-links "$wheels" --no-build-isolation needstorch
  run "$@" --no-index --find-links "$wheels" --no-build-isolation noninja
  run "$@" --no-index --find-links "$wheels" --no-build-isolation nocompiler
  run "$@" --no-index --find-links "$wheels" --no-build-isolation noheaders
  run "$@" --no-index --find-links "$wheels" pinner user
}
for mode in plain color tty verbose; do
  suffix=.$mode; [ "$mode" = plain ] && suffix=""
  record uv "$mode" > "$here/uv-output$suffix.txt"
  record pip "$mode" > "$here/pip-output$suffix.txt"
done
