"""The ids admission gives the events it writes: one per job and kind, so a resend or a
retried submit is the same event to its consumers (they deduplicate by id)."""

from __future__ import annotations

SUBMITTED_EVENT_PREFIX = "submitted-"  # overload.py's resend of stuck submits matches it in SQL


def submitted_event_id(job_id: str) -> str:
    """The id of a job's jobs.submitted event."""
    return SUBMITTED_EVENT_PREFIX + job_id
