"""The recipe's own smoke checks (`smoke.run`): each command must succeed in the image; a failure says its cause."""

from __future__ import annotations

import json
import os
import re
import subprocess

from .report import Fail, Skip

RUN_SECONDS = 600  # one `smoke.run` command


def check_commands() -> dict:
    """The recipe's own checks (`smoke.run`): each command must exit 0 in the image."""
    commands = json.loads(os.environ.get("IMGBUILD_SMOKE_RUN") or "[]")
    if not commands:
        raise Skip("the recipe declares none (smoke.run)")
    import tempfile

    for command in commands:
        with tempfile.TemporaryFile() as out:  # the output in order, on disk: a chatty build stays bounded here
            try:
                code = subprocess.run(["/bin/sh", "-c", command], stdout=out, stderr=subprocess.STDOUT,
                                      timeout=RUN_SECONDS).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                code = None
            out.seek(max(0, out.seek(0, 2) - RUN_TAIL_BYTES))
            output = [line[:300] for line in out.read().decode("utf-8", "replace").splitlines()[-RUN_TAIL_LINES:]]
        if code != 0:
            details = {"command": command, "exit": code, "output": output}
            how = f"ran past {RUN_SECONDS} s" if code is None else f"exited {code}"
            cure = run_cure(output)
            raise Fail(f"{command[:80]!r} {how}: {' | '.join(run_causes(output))}{cure}", details)
    return {"commands": len(commands), "reason": f"{len(commands)} command(s) of smoke.run succeeded"}


RUN_TAIL_BYTES = 64 * 1024  # what is kept of a failing command's output
RUN_TAIL_LINES = 60
_CAUSE = re.compile(
    r"error|not found|no such file|cannot|can't|unable to|won't be available|fatal|undefined reference|"
    r"permission denied",
    re.IGNORECASE,
)


#: What a just-in-time build (DeepSpeed's ops, torch.utils.cpp_extension.load) says when the image lacks its
#: tools, and the cure: (words, cure), the first found wins.
RUN_CURES = (
    (("Python.h: No such file",), "add apt: [python3-dev]"),
    (
        ("nvcc: not found", "CUDA_HOME environment variable is not set"),
        "nvcc is not in the image: use an NGC framework base",
    ),
    (
        ("c++: not found", "g++: not found", "gcc: not found", "cc: not found", "No such file or directory: 'c++'"),
        "a just-in-time build needs a C/C++ compiler, which the image lacks: add apt: [g++, python3-dev]",
    ),
    (("Ninja is required to load C++ extensions", "ninja: not found"), "add ninja to pip.packages"),
)


def run_cure(output: list) -> str:
    """The cure for a failed command whose output says a build tool is missing, as " (cure)"; else ""."""
    text = "\n".join(output)
    found = next((cure for words, cure in RUN_CURES if any(w in text for w in words)), "")
    return f" ({found})" if found else ""


def run_causes(output: list) -> list:
    """The lines of a failed command's output that say why (the compiler's, not ninja's "build stopped"): the
    last three that name an error, else its last line."""
    causes = [line.strip()[:200] for line in output if _CAUSE.search(line)]
    return causes[-3:] or [line.strip()[:200] for line in output[-1:]] or ["(no output)"]
