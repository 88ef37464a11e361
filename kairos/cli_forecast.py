"""Forecasts in words: "in about 12 min (between 8 and 20) on node3-1, node3-2", for
``kairos describe`` and ``kairos jobs --start`` (like ``squeue --start``)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from kairos.cli_output import Col, field


def _epoch(value: Any) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value)).timestamp()


def _unit(seconds: float) -> tuple[float, str]:
    if seconds < 90:
        return 1, "s"
    if seconds < 90 * 60:
        return 60, "min"
    if seconds < 48 * 3600:
        return 3600, "h"
    return 86400, "d"


def span(seconds: float) -> str:
    """A duration to about two figures: "45 s", "12 min", "2 h 10 min", "3 d 4 h"."""
    seconds = max(0.0, seconds)
    size, unit = _unit(seconds)
    if unit in ("s", "min"):
        return f"{round(seconds / size)} {unit}"
    whole = int(seconds // size)
    rest = seconds - whole * size
    small, small_unit = (60, "min") if unit == "h" else (3600, "h")
    part = round(rest / small)
    return f"{whole} {unit} {part} {small_unit}" if part else f"{whole} {unit}"


def in_words(at: float, now: float, low: float | None = None, high: float | None = None) -> str:
    """How far ``at`` is from ``now``, with the band when there is one."""
    if at - now < 1:
        return "now"
    out = f"in about {span(at - now)}"
    if low is None and high is None:
        return out
    lo = span(low - now) if low is not None and low - now >= 1 else "now"
    hi = span(high - now) if high is not None else "beyond the horizon"
    unit = _unit(at - now)[1]
    # "between 8 and 20" when the three share a unit, else each with its own
    if unit in ("s", "min") and lo.endswith(f" {unit}") and hi.endswith(f" {unit}"):
        lo, hi = lo.removesuffix(f" {unit}"), hi.removesuffix(f" {unit}")
    if lo == hi:
        return out
    return f"{out} (between {lo} and {hi})"


def forecast_line(f: dict[str, Any], now: float | None = None) -> str:
    """A forecast (as GET /v1/jobs/{id} shows it) in a sentence."""
    now = time.time() if now is None else now
    start = _epoch(f.get("start"))
    behind = f", waiting behind {f['waits_for']}" if f.get("waits_for") else ""
    if f.get("reason") == "quota":
        behind = ", once its queue's quota admits it" + behind
    if start is None:
        if f.get("reason") == "quota":
            return "Expected start: once its queue has quota (waiting for quota)"
        return "Expected start: not within the forecast's horizon" + behind
    words = in_words(start, now, _epoch(f.get("start_low")), _epoch(f.get("start_high")))
    on = f" on {', '.join(f['nodes'])}" if f.get("nodes") else ""
    out = f"Expected start: {words}{on}{behind}"
    finish = _epoch(f.get("finish"))
    if finish is not None:
        out += f"; finish {in_words(finish, now)}"
    return out


def _start(item: dict[str, Any]) -> str:
    f = item.get("forecast")
    if not f:
        return "-"
    start = _epoch(f.get("start"))
    if start is None:
        return "quota" if f.get("reason") == "quota" else "beyond horizon"
    return in_words(start, time.time())


def _band(item: dict[str, Any]) -> str:
    f = item.get("forecast") or {}
    low, high = _epoch(f.get("start_low")), _epoch(f.get("start_high"))
    if low is None:
        return "-"
    now = time.time()
    return f"{in_words(low, now)} - {in_words(high, now) if high is not None else 'beyond'}"


def _at(key: str) -> Any:
    def cell(item: dict[str, Any]) -> str:
        t = _epoch((item.get("forecast") or {}).get(key))
        return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"
    return cell


START_COLUMNS = (
    Col("job", field("job_id"), whole=True),
    Col("name", field("name")),
    Col("queue", field("queue")),
    Col("tenant", field("tenant"), wide=True),
    Col("state", field("state")),
    Col("start", _start),
    Col("band", _band),
    Col("start at", _at("start"), wide=True),
    Col("finish at", _at("finish"), wide=True),
    Col("nodes", lambda i: ",".join((i.get("forecast") or {}).get("nodes") or []) or "-"),
    Col("waits for", lambda i: (i.get("forecast") or {}).get("waits_for") or "-"),
)
