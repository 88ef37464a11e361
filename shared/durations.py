"""Durations as people write them on a command line: the gateway's token expiry and
the CLI's ``--since`` read the same forms."""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION_RE = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: str) -> timedelta:
    """'30d', '12h', '90m', '3600s', '2w' or a bare number of seconds."""
    m = _DURATION_RE.match(value)
    if not m or int(m[1]) == 0:
        raise ValueError(f"not a duration: {value!r} (use e.g. 30d, 12h, 90m, 3600s)")
    return timedelta(seconds=int(m[1]) * _UNITS[m[2]])


def in_words(seconds: float) -> str:
    """Seconds as a person reads them at a glance: 45 s, 12 min, 2 h 10 min, 3 d 4 h (a
    dry run's summary and the CLI's what-if table)."""
    s = max(0.0, seconds)
    if s < 59.5:
        return f"{round(s)} s"
    m = round(s / 60)
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h" + (f" {m} min" if m else "")
    d, h = divmod(h, 24)
    return f"{d} d" + (f" {h} h" if h else "")
