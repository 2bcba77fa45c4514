"""Slurm's time limits, as its own parser reads them (src/common/parse_time.c, what sbatch's --time runs): the
forms it takes and the minutes it counts. One rule for the site config's `slurm.time`, `--time`, and the requeue's
signal lead."""

from __future__ import annotations

import re

#: The longest lead `--signal=B:USR1@SECONDS` takes: Slurm keeps it in 16 bits (get_signal_opts refuses more).
MAX_SIGNAL_LEAD = 0xFFFF

#: A time limit as Slurm reads one (its parse_time.c): MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-,
#: DAYS-HOURS[:MINUTES[:SECONDS]], and no limit as UNLIMITED, INFINITE (any case) or -1; up to 4 digits each.
SLURM_TIME_RE = re.compile(
    r"(?i:UNLIMITED|INFINITE)|-1|[0-9]{1,4}-(?:[0-9]{1,4}(?::[0-9]{1,4}){0,2})?|[0-9]{1,4}(?::[0-9]{1,4}){0,2}"
)


def slurm_minutes(text: str) -> int | None:
    """A time limit that SLURM_TIME_RE matched, in minutes as Slurm counts them (seconds rounded up); None for no
    limit (UNLIMITED, INFINITE, -1, and 0, which sbatch takes as none)."""
    if text.upper() in ("UNLIMITED", "INFINITE", "-1"):
        return None
    days, dash, clock = text.partition("-")
    if not dash:
        days, clock = "", text
    parts = [int(part) for part in clock.split(":")] if clock else []
    if dash:  # DAYS-HOURS[:MINUTES[:SECONDS]]
        hours, minutes, seconds = (parts + [0, 0, 0])[:3]
    else:  # MINUTES[:SECONDS], or HOURS:MINUTES:SECONDS
        hours, minutes, seconds = ([0, *parts, 0][:3]) if len(parts) < 3 else parts
    total = int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
    return -(-total // 60) or None
