"""CSCS's Container Engine (Alps): `srun --environment=FILE` runs each task in the image an environment definition
file (EDF, TOML) names, with its mounts, working folder and hooks (eth-cscs/cscs-docs
`docs/software/container-engine/edf.md`, `run.md`, `resource-hook.md`).

The job script writes the EDF when it starts, into the submit folder (which every node reads), with the job's
folder at /workspace: Alps' vClusters expand no variables inside an EDF (a technical preview on one), so the
script's own shell puts the paths in. Every word reaches the TOML as a string: the user's and the site's only
with their $VAR / ${VAR} expanded, never a command substitution, and `"` and `\\` escaped for TOML."""

from __future__ import annotations

import re

from imgbuild.shellwords import VARIABLES_ONLY, UserWord

#: A variable the script's shell may expand inside the EDF (the job's own: $SCRATCH, ${LOCAL_SCRATCH}).
_VARIABLE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")
#: The NCCL hook's variants for NVIDIA images (resource-hook.md: cuda12, cuda13, statically linked against that
#: CUDA and to be matched exactly; cuda-dl, CSCS's general recommendation for NGC's deep-learning images).
NCCL_VARIANTS = {"12": "cuda12", "13": "cuda13"}
GENERAL_VARIANT = "cuda-dl"


def nccl_hook(cuda_major: str) -> dict[str, str]:
    """The NCCL hook that gives NGC images Slingshot, in the variant of the image's CUDA major where CSCS builds
    one for it, else cuda-dl (the image's CUDA unknown, or one without a numbered variant)."""
    variant = NCCL_VARIANTS.get(cuda_major, GENERAL_VARIANT)
    return {"com.hooks.aws_ofi_nccl.enabled": "true", "com.hooks.aws_ofi_nccl.variant": variant}


EDF_FILE = '"$SLURM_SUBMIT_DIR/.imgbuild-edf-$SLURM_JOB_ID.toml"'
DELIMITER = "IMGBUILD_EDF"


def toml_string(word: str) -> str:
    """`word` as a TOML basic string inside an unquoted here-document: only $VAR / ${VAR} expand (for a user's
    word, only where nothing else in it would); `"` and `\\` are TOML's escapes after the shell's; no other
    shell expansion ($(...), `...`, $((...))) survives. Control characters are refused before this."""
    expand = not isinstance(word, UserWord) or bool(VARIABLES_ONLY.fullmatch(word))
    out, at = [], 0
    for found in _VARIABLE.finditer(word) if expand else ():
        out.append(_literal(word[at : found.start()]))
        out.append(found.group(0))
        at = found.end()
    out.append(_literal(word[at:]))
    return '"' + "".join(out) + '"'


def _literal(text: str) -> str:
    # the here-document removes one backslash before \ $ `; TOML then reads \\ as \ and \" as "
    return text.replace("\\", "\\\\\\\\").replace("$", "\\$").replace("`", "\\`").replace('"', '\\"')


def edf_lines(image: str, binds: list[str], hooks: dict[str, str], annotations: dict[str, str]) -> list[str]:
    """Script lines that write the job's EDF and name it in `$edf` (removed when the job ends): the image (a
    registry reference as enroot names it, or a .sqsh), the job's folder at /workspace, the binds, the hooks (the
    site's annotations over imgbuild's)."""
    hooks = {**hooks, **annotations}
    toml = [
        f"image = {toml_string(image)}",
        'workdir = "/workspace"',
        "mounts = [" + ", ".join(['"$PWD:/workspace"', *(toml_string(b) for b in binds)]) + "]",
    ]
    if hooks:
        toml += ["", "[annotations]", *(f"{key} = {toml_string(value)}" for key, value in sorted(hooks.items()))]
    return [
        "",
        "# CSCS's Container Engine: each task runs in the image this environment definition file names, with",
        "# these mounts and hooks; written now, where the job's folder is known, into the submit folder every",
        "# node reads.",
        f"edf={EDF_FILE}",
        "case \"$PWD\" in *'\"'*|*'\\'*|*$'\\n'*)",
        '  echo "imgbuild: $PWD: a quote, a backslash or a new line in its name cannot go into an EDF" >&2',
        "  exit 2 ;;",
        "esac",
        f'cat > "$edf" <<{DELIMITER}',
        *toml,
        DELIMITER,
        "trap 'rm -f \"$edf\"' EXIT",
    ]
