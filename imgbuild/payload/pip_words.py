"""What pip's and uv's output says, as patterns the pip step's guard reads line by line: the package each line is
about, the conflict it states, and the kinds of failure with the words that say so. Stdlib only, in the base;
imported by guard.py, beside it.
"""

import os
import re

NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
#: what a terminal does not show as text: colour and cursor escapes (CSI `ESC [ ... m`, `ESC [2K`), OSC titles and
#: links (`ESC ] ... BEL`), and the two-byte ones. uv and pip colour their lines under FORCE_COLOR or CLICOLOR_FORCE,
#: and draw progress bars with them on a terminal.
ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")


def plain(raw):
    """One line of an installer's output as a terminal leaves it, the only form every pattern here reads: escapes
    removed, and of a line redrawn by carriage returns (a progress bar, then the line drawn over it; or a CRLF end)
    the last text drawn; no line end. Its indent is kept."""
    drawn = [part for part in ESCAPE.sub("", raw).split("\r") if part.strip()]
    return drawn[-1].rstrip() if drawn else ""


#: what follows a name in uv's sentences: `==2.1` (the version), or a range `>=2.20.0,<2.21` (kept whole)
SPEC = r"(?:(?:==|(?=[<>!~]))(\S+))?"
FETCH = re.compile(r"^(?:Downloading|Collecting|Using cached) (?:\S*/)?([A-Za-z0-9][A-Za-z0-9_.]*)-([0-9][^-\s]*)-")
BACKTRACK = re.compile(rf"pip is looking at multiple versions of ({NAME})")
#: the package pip or uv is working on (the last one named is the one a source build failure is about): pip's
#: "Collecting flash-attn", "Processing /wheels/srcpkg-1.0.tar.gz", "Building wheel for flash-attn (setup.py)";
#: uv's "Building flash-attn==2.7.4", "Failed to build `flash-attn==2.7.4`". pip's "Processing" names a path as
#: given, spaces and all ("Processing ./wheels ü/srcpkg-1.0.tar.gz (from app)"): its folders run to the last "/"
#: before the "(from".
BUILDING = re.compile(
    r"(?:× |error: )?"
    r"(?:Building wheel for|Failed to build|Failed to download and build|Building|Collecting|Processing) "
    rf"`?(?:(?<=Processing )[^(]*/|\S*/)?(?!installable )({NAME}?)(?:==|-[0-9]|[ `(\[;<>=!~@]|$)"
)
#: who asked for the package a line is about (a dependency's chain, the recipe's line among them): pip's "Collecting
#: cpkg (from parent==1.0->-r requirements.txt (line 4))", uv's "hint: `cpkg` (v1.0) was included because
#: `parent[gpu]` (v1.0) depends on `cpkg`"
PULLED = re.compile(rf"^(?:Collecting|Processing) .*\(from (.*)\)\Z|`({NAME})` \(v\S+\) was included because (.*)")
#: pip working on a source distribution (the package BUILDING last named): "Preparing metadata (setup.py) ... done",
#: "Getting requirements to build wheel: started", "Installing build dependencies ... done"
SOURCE_STEP = re.compile(r"(?:Preparing metadata \(|Getting requirements to build |Installing build dependencies)")
#: uv's way of saying it: "Because torchvision==0.18.0 depends on torch==2.3.0 and torch==2.13.0+cpu, we can
#: conclude ..." (the second requirement is the base's pin).
UV_DEPENDS = re.compile(rf"Because (?:all versions of )?({NAME}?){SPEC} depends? on ({NAME})(\S*) and \3(\S+), we")
#: uv, on two packages that need what excludes each other: "Because all versions of user depend on depx>=2 and all
#: versions of pinner depend on depx==1.0, we can conclude ...", also where it folded the base's pin into the second
#: first: "Because torchvision==0.28.0 depends on torch==2.13.0 and timm>=1.0.31 depends on torch==2.13.0a0, ..."
UV_DEPENDS_VIA = re.compile(
    rf"Because (?:all versions of )?({NAME}?){SPEC} depends? on ({NAME})(\S*) and "
    rf"(?:all versions of )?({NAME}?){SPEC} depends? on \3(\S+), we"
)
#: uv, on two requirements of one name that exclude each other (the recipe's constraint and its lock): "Because you
#: require hub-lib<1 and hub-lib==2.4.0, we can conclude ..." (pip: "The user requested hub-lib" and its constraints)
UV_REQUIRES = re.compile(rf"Because you require ({NAME})\S* and \1\S*, we")
OTHER_FRAMEWORK = re.compile(rf"(?<![A-Za-z0-9_.-])({NAME})<0(?![A-Za-z0-9_.])")  # `<0` alone: not `<0.28`
#: uv, on a package that needs another name of the base's framework: "Because keras-hub==0.18.1 depends on
#: tensorflow and you require tensorflow<0, we can conclude ...", or with the refusal folded in first (uv 0.13):
#: "Because python-dateutil==2.9.0.post0 depends on six<0, which does not allow any versions and you require ..."
UV_NEEDS_REFUSED = re.compile(
    rf"Because (?:all versions of )?({NAME}?){SPEC} depends? on ({NAME})(\S*?)"
    r"(?: and you require \3<0|<0, which does not allow any versions)"
)
#: pip's "torchvision 0.18.0 depends on torch==2.3.0" (never uv's "Because X>=v depends on ...", whose first word
#: is no package)
DEPENDS = re.compile(rf"^(?!(?:And )?[Bb]ecause )({NAME}) (\S+) depends on ({NAME})(.*)$")
CONSTRAINT = re.compile(rf"^The user requested \(constraint\) ({NAME})(\S*)$")
REQUESTED = re.compile(rf"^The user requested ({NAME})(\S*)$")
#: the name pip or uv could not find: "No matching distribution found for nosuch", "Because nosuch was not found
#: in the package registry" (or "in the provided package locations", uv's words with --no-index --find-links),
#: "Because there is no version of einops==9.9", "Because pyg-lib==0.4.0 has no wheels with a matching Python ABI tag"
MISSING = re.compile(
    rf"No matching distribution found for ({NAME}\S*)|Because ({NAME}) was not found in the "
    rf"|Because ({NAME})==\S+ has no wheels with a matching"
    rf"|Because there is no version of ({NAME}\S*?)(?: and|,|$)"
)
#: uv, when a source build's isolated environment asks for the framework and install.sh's --build-constraint
#: allows only the base's, which no index has: "Because there is no version of torch==2.13.0a0+07cecf4 and you
#: require torch==2.13.0a0+07cecf4, we can conclude ..."
BUILD_FRAMEWORK = re.compile(rf"Because there is no version of ({NAME})==(\S+) and you require \1==\2,")
#: a find-links page the installer could not read: uv's "error: Failed to read `--find-links` URL: https://...";
#: pip's retries name only the page's path: "WARNING: Retrying (Retry(total=4, ...)) after connection broken by
#: 'NewConnectionError(...)': /whl/torch-2.4.0+cu124.html"
PAGE_UNREAD = re.compile(r"Failed to read `--find-links` URL: (\S+)")
#: pip, of a plain-http index or find-links page on a host it does not trust (uv reads it): it reads nothing there
IGNORED_HOST = re.compile(
    r"The repository located at ([A-Za-z0-9.:\[\]-]{1,255}) is not a trusted or secure host and is being ignored"
)
#: searched: \Z is the very end, never before a newline
RETRIED_PATH = re.compile(r"Retrying \(Retry\(.*\)\) after .*: (/\S*)\Z")
#: (kind, the words in pip's output that say so: text, or a pattern where the words hold a path); the first kind
#: seen wins, in this order.
KINDS = (
    ("tls", ("SSLError", "CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "invalid peer certificate")),
    (
        "network",
        (
            "Failed to establish a new connection",
            "Name or service not known",
            "Temporary failure in name resolution",
            "ConnectTimeout",
            "ReadTimeoutError",
            "Network is unreachable",
            "ProxyError",
            "dns error",
            "failed to lookup address",
            "HTTP status server error",
            # uv's words for every request that failed on the way (a refused connection, a name, a timeout, a
            # proxy): "error sending request for url (https://...)", then its causes
            "error sending request for url",
        ),
    ),
    # (uv says a name it cannot find as "... was not found in the package registry ... No solution found": both
    # kinds are seen, and `failure` puts "missing" first: a typo is not a conflict with the base's pins)
    (
        "missing",
        (
            "No matching distribution found",
            "Could not find a version that satisfies",
            re.compile(rf"Because {NAME} was not found in the "),  # the registry, the find-links locations
            "has no wheels with a matching",  # uv: "... Python ABI tag (e.g., `cp311`)", "... platform tag"
            "there is no version of",
        ),
    ),
    (
        "conflict",
        ("ResolutionImpossible", "conflicting dependencies", "The conflict is caused by", "No solution found"),
    ),
    ("hash", ("DO NOT MATCH THE HASHES", "Hash mismatch for")),  # pip's words, uv's
    # a source build that imports the base's framework, isolated from it (pip.no_build_isolation cures it)
    ("isolated", ("No module named 'torch'", "No module named 'tensorflow'", "No module named 'jax'")),
    (
        "nvcc",
        (
            "nvcc: not found",
            "CUDA_HOME environment variable is not set",
            "/bin/nvcc': No such file",
            # Python's words when a setup.py runs `$CUDA_HOME/bin/nvcc -V` (apex's get_cuda_bare_metal_version, which
            # causal-conv1d, mamba-ssm and flash-attn copy): "FileNotFoundError: [Errno 2] No such file or directory:
            # '/usr/local/cuda/bin/nvcc'"
            re.compile(r"No such file or directory: '[^']*/nvcc'"),
        ),
    ),
    (
        "ninja",
        (
            "Ninja is required to load C++ extensions",
            "ninja: not found",
            "No such file or directory: 'ninja'",
            'CMake was unable to find a build program corresponding to "Ninja"',
        ),
    ),
    ("headers", ("Python.h: No such file or directory", "fatal error: Python.h")),  # a compiler, no python3-dev
    (
        "compiler",
        (
            "c++: not found",
            "g++: not found",
            "gcc: not found",
            "cc: not found",
            "unable to execute 'gcc'",
            "unable to execute 'x86_64-linux-gnu-gcc'",
            "command 'gcc' failed",
            "command 'c++' failed",
            "command 'g++' failed",
            "command 'x86_64-linux-gnu-gcc' failed",
            "command 'x86_64-linux-gnu-g++' failed",
            "No CMAKE_CXX_COMPILER could be found",
            # setuptools' and torch's BuildExtension, when the compiler they call is not there
            "No such file or directory: 'x86_64-linux-gnu-g++'",
            "No such file or directory: 'x86_64-linux-gnu-gcc'",
            "No such file or directory: 'aarch64-linux-gnu-g++'",
            "No such file or directory: 'aarch64-linux-gnu-gcc'",
            "No such file or directory: 'c++'",
            "No such file or directory: 'g++'",
            "No such file or directory: 'gcc'",
        ),
    ),
    (
        "sdist",
        ("Failed building wheel", "subprocess-exited-with-error", "metadata-generation-failed", "Failed to build"),
    ),
)


def nvcc_cure(environ=None):
    """A base that carries the toolkit, of the base's own CUDA release (CUDA_VERSION) where the base says it. Never
    an apt line: the toolkit's Debian packages are the CUDA stack, which imgbuild's apt door refuses beside the
    base's own (pipeline/stack.py's STACK_DEB_RE), so that cure could not be followed."""
    found = re.match(
        r"([0-9]{1,3})\.([0-9]{1,3})", (os.environ if environ is None else environ).get("CUDA_VERSION") or ""
    )
    which = f" (CUDA {found[1]}.{found[2]}'s, as this base's CUDA)" if found else ""
    return (
        f"use a base that carries the CUDA toolkit{which}: NGC's framework images have /usr/local/cuda/bin/nvcc; a "
        "runtime or CPU-only base does not"
    )


def spoken(names):
    """ "a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
