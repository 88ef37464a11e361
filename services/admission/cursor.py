"""Opaque page cursors for GET /v1/jobs: the (submitted_at, id) of a page's last job.

A keyset cursor keeps pages stable while jobs are added or change state (an offset
shifts when rows before it go away, e.g. under a state filter)."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime


class BadCursor(ValueError):
    pass


def encode(submitted_at: datetime, job_id: str) -> str:
    raw = json.dumps([submitted_at.isoformat(), job_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, job_id = json.loads(raw)
        when = datetime.fromisoformat(at)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise BadCursor("not a cursor this API returned (take next_cursor of a page)") from exc
    if when.tzinfo is None or not isinstance(job_id, str):
        raise BadCursor("not a cursor this API returned (take next_cursor of a page)")
    return when, job_id
