"""The Engine API backend: the docker SDK's legacy builder (no BuildKit: no cache mounts, no secrets)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from imgbuild.engine.types import (
    _SDK_STEP,
    BuildRequest,
    ProgressFn,
    Redactor,
    StepTracker,
    _failure_text,
    own_status,
    step_name,
)
from imgbuild.errors import BuildFailed

if TYPE_CHECKING:
    from imgbuild.hostio.regular import LogWriter


def build(client: Any, req: BuildRequest, progress: ProgressFn, redact: Redactor, log: LogWriter) -> str:
    """Build through the Engine API (no BuildKit: no cache mounts, no secrets)."""
    import requests
    from docker.errors import APIError

    tracker = StepTracker()
    outcome = {"image_id": "", "error": ""}
    try:
        stream = client.api.build(
            path=str(req.context),
            tag=req.tag,
            rm=True,
            forcerm=True,
            decode=True,
            buildargs=req.build_args,
            nocache=req.no_cache,
            dockerfile="Dockerfile",
        )
        for chunk in stream:
            _follow_sdk_chunk(chunk, tracker, outcome, progress, redact, log)
    except APIError as exc:
        outcome["error"] = redact(str(exc.explanation or exc))
    except requests.RequestException as exc:  # the engine went quiet past the client's read timeout
        outcome["error"] = f"the engine stopped answering ({type(exc).__name__})"
    if outcome["error"] or not outcome["image_id"]:
        step = tracker.steps.get(tracker.current, "")
        errors = [outcome["error"] or "no image id"]
        raise BuildFailed(_failure_text(step, tracker.tail(tracker.current), errors, req.log_path))
    return outcome["image_id"]


def _follow_sdk_chunk(
    chunk: dict[str, Any],
    tracker: StepTracker,
    outcome: dict[str, str],
    progress: ProgressFn,
    redact: Redactor,
    log: Any,
) -> None:
    """One decoded chunk of the Engine API's build stream: step lines, output, an error, the image id."""
    for raw in chunk.get("stream", "").splitlines():
        line = redact(raw.rstrip())
        if not line:
            continue
        log.write(line + "\n")
        if m := _SDK_STEP.fullmatch(line):
            tracker.current = m.group(1)
            tracker.steps[m.group(1)] = f"[{m.group(1)}] {m.group(2)}"
            progress(step_name(tracker.steps[m.group(1)]))
        else:
            tracker.tails.setdefault(tracker.current, deque(maxlen=40)).append(line)
            if status := own_status(line):
                progress(status)
    if "error" in chunk or "errorDetail" in chunk:
        outcome["error"] = redact((chunk.get("errorDetail") or {}).get("message") or chunk.get("error", ""))
        log.write("ERROR: " + outcome["error"] + "\n")
    if isinstance(chunk.get("aux"), dict) and "ID" in chunk["aux"]:
        outcome["image_id"] = chunk["aux"]["ID"]
