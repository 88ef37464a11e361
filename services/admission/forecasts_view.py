"""Admission's copy of the forecaster's forecasts (``jobs.forecasts``): the latest one
of each job that still waits. A forecast for a job that is placed or over by now is
ignored (the topics are read in no order relative to each other), an older one than
what is stored too; the status that ends the wait deletes the row (``store._JOB_STATUS``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared.events import JobForecast

WAITING_STATES = ("pending", "admitted", "preempted")

_APPLY = text("""
    INSERT INTO job_forecasts (job_id, as_of, start, finish, start_low, start_high, nodes,
                               waits_for, reason)
    SELECT id, :as_of, :start, :finish, :low, :high, CAST(:nodes AS jsonb), :waits_for, :reason
    FROM jobs WHERE id = :j AND state IN ('pending', 'admitted', 'preempted')
    ON CONFLICT (job_id) DO UPDATE SET as_of = EXCLUDED.as_of, start = EXCLUDED.start,
        finish = EXCLUDED.finish, start_low = EXCLUDED.start_low,
        start_high = EXCLUDED.start_high, nodes = EXCLUDED.nodes,
        waits_for = EXCLUDED.waits_for, reason = EXCLUDED.reason
    WHERE job_forecasts.as_of <= EXCLUDED.as_of""")


def _at(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


async def apply_forecast(conn: AsyncConnection, ev: JobForecast) -> None:
    await conn.execute(_APPLY, {
        "j": ev.job_id, "as_of": _at(ev.as_of), "start": _at(ev.start), "finish": _at(ev.finish),
        "low": _at(ev.start_low), "high": _at(ev.start_high), "nodes": json.dumps(ev.nodes),
        "waits_for": ev.waits_for, "reason": ev.reason.value if ev.reason else None})


_COLUMNS = "f.as_of, f.start, f.finish, f.start_low, f.start_high, f.nodes, f.waits_for, f.reason"


async def forecast(engine: AsyncEngine, job_id: str) -> dict[str, Any] | None:
    async with engine.connect() as conn:
        row = (await conn.execute(text(
            f"SELECT {_COLUMNS} FROM job_forecasts f WHERE f.job_id = :j"), {"j": job_id})
        ).mappings().first()
    return dict(row) if row else None


async def waiting_forecasts(engine: AsyncEngine, tenant: str | None, queue: str | None,
                            limit: int) -> list[dict[str, Any]]:
    """Waiting jobs (oldest first) with their forecast, if one: ``squeue --start``."""
    clauses = ["j.state IN ('pending', 'admitted', 'preempted')"]
    params: dict[str, Any] = {"limit": limit}
    for col, val in (("tenant", tenant), ("queue", queue)):
        if val is not None:
            clauses.append(f"j.{col} = :{col}")
            params[col] = val
    async with engine.connect() as conn:
        rows = (await conn.execute(text(
            f"""SELECT j.id AS job_id, j.name, j.queue, j.tenant, j.state, j.submitted_at,
                       {_COLUMNS}
                FROM jobs j LEFT JOIN job_forecasts f ON f.job_id = j.id
                WHERE {' AND '.join(clauses)}
                ORDER BY j.submitted_at, j.id LIMIT :limit"""), params)).mappings().all()
    return [dict(r) for r in rows]
