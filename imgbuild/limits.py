"""Every bound imgbuild enforces on untrusted input, in one table (docs/limits.md lists them).

Recipes and the files they name come from merge requests; registries can misbehave. Each limit turns
what would be unbounded time or memory into a one-line error naming the file, line and field.
"""

from __future__ import annotations

KIB = 1024
MIB = 1024 * KIB

# --- recipes -------------------------------------------------------------------------------------
#: Size of one recipe file. Real recipes are a few KB.
RECIPE_BYTES = 256 * KIB
#: Nesting of mappings and lists in one recipe.
YAML_DEPTH = 32
#: Values in one recipe after YAML aliases are expanded (an alias bomb stops here).
YAML_VALUES = 20_000
#: Recipes in one `extends` chain.
EXTENDS_DEPTH = 8
#: Size of one requirements file (and of all of them together, nested `-r` included).
REQUIREMENTS_BYTES = 1 * MIB
#: A copied file or folder: files and total bytes (the context is streamed, never held in memory).
COPY_FILES = 10_000
COPY_BYTES = 2048 * MIB
#: Folders inside a folder imgbuild walks (a copied folder, a build context, a staged dataset, recipes/).
TREE_DEPTH = 128
#: Length of an image name component (`name:`) and of a whole reference (Docker's own limit).
NAME_CHARS = 128
REFERENCE_CHARS = 255
#: One string value in a recipe (a run: command, an env value).
VALUE_CHARS = 8 * KIB

# --- builds --------------------------------------------------------------------------------------
#: One image build (a `run: sleep infinity` ends here); the `build_timeout` setting changes it.
BUILD_SECONDS = 4 * 3600.0
#: pip's resolution in the pip step (until it starts installing): a resolver backtracking through every
#: release of a package stops here; the `pip_resolve_timeout` setting changes it.
PIP_RESOLVE_SECONDS = 1800.0
#: Bytes the pip step may download (77 wheels of one package were 22.6 GB); `pip_download_limit`.
PIP_DOWNLOAD_BYTES = 16 * 1024 * MIB
#: One smoke test run inside the image.
SMOKE_SECONDS = 1800
#: The smoke test's GPU checks beyond one device's arithmetic together: the NCCL all-reduce, P2P copies,
#: torch.compile and FP8 (the in-image script's GPU_SECONDS)
SMOKE_GPU_SECONDS = 300
#: One added distribution's imports in the smoke test, on a quiet machine (the in-image script's IMPORT_SECONDS)
IMPORT_SECONDS = 120
#: Reading a remote engine's GPUs in a short-lived container (its start, an image pull excluded, and nvidia-smi).
GPU_READ_SECONDS = 120

# --- registries ------------------------------------------------------------------------------------
#: One HTTP exchange, headers and body, however slowly the server trickles it.
HTTP_REQUEST_SECONDS = 30.0
#: Everything one command asks of registries (retries and pages included).
HTTP_COMMAND_SECONDS = 180.0
#: `imgbuild mirror`: everything one run asks of one registry, blobs of many GB included.
MIRROR_SECONDS = 6 * 3600.0
#: One blob a mirror copies: NGC's largest layers are a few GB; a manifest claiming more is not believed.
MIRROR_BLOB_BYTES = 64 * 1024 * MIB
#: Manifest lists inside manifest lists: real ones are one deep.
MIRROR_INDEX_DEPTH = 4
#: One response body, after decompression (manifests and configs are KBs, a tag page 100s of KB).
HTTP_BODY_BYTES = 8 * MIB
#: All tag-list pages of one repository together.
HTTP_TAGS_BYTES = 32 * MIB
#: Longest `Retry-After` imgbuild waits for; a longer one is reported, not slept through.
RETRY_AFTER_SECONDS = 30.0
