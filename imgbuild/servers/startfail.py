"""Why a container did not start, said with its cure: runc's refused ulimits as the values to put in run.ulimits,
and docker run's own exit codes as imgbuild's."""

from __future__ import annotations

#: runc's "error setting rlimit type N": Linux's limit numbers, as run.ulimits names them.
RLIMIT_NAMES = {3: "stack", 7: "nofile", 8: "memlock"}


def rlimit_cure(stderr: str = "") -> str:
    """What to do when the engine may not raise the ulimits the house rules ask for (runc's `error setting rlimit
    type N`): the values to put in `run.ulimits` (this session's own hard limits, which a dockerd started the
    same way has too), or the admin's cure. Without the engine's words, memlock and stack both."""
    import re
    import resource

    named = [RLIMIT_NAMES[int(n)] for n in re.findall(r"rlimit type ([0-9]+)", stderr) if int(n) in RLIMIT_NAMES]
    values = []
    for name in dict.fromkeys(named or ["memlock", "stack"]):
        hard = resource.getrlimit(getattr(resource, f"RLIMIT_{name.upper()}"))[1]
        values.append(f"{name}: {hard if hard != resource.RLIM_INFINITY else 67108864}")
    return (
        "the engine may not raise the ulimits NVIDIA recommends: put run: {ulimits: {" + ", ".join(values) + "}} "
        "in ~/.config/imgbuild/config.yaml (the most this session may set), or ask the admin to start dockerd "
        "with LimitMEMLOCK=infinity"
    )


#: docker run's own exit codes (the container never ran the command) as imgbuild's: the engine refused to start
#: it (125: an environment problem, 3), the command could not be run in it (126, 127: failed, 1).
DOCKER_START_CODES = {125: 3, 126: 1, 127: 1}


def explain_start_failure(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else "docker run failed"
    if "rlimit" in text:
        reason = text[text.find("error setting rlimit") :].removesuffix(": unknown.")
        return f"the container did not start ({reason}); {rlimit_cure(text)}"
    return f"the container did not start: {text[-300:]}"
