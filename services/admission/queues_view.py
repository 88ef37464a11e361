"""Admission's read model of the queues, fed by ``queues.events``: each queue's settings
(``queue.changed``), its usage and waiting jobs (``queue.status``), and the answer to
every admin command. Queueing owns the queues; this is what the gateway shows and what
it checks a submit against.

``queue_waiting_view`` explains every waiting job, one row each: queueing's rows (from
``queue.status``: position >= 1 in its queue's order) while the job waits for quota,
then the scheduler's (from ``job.waiting``: position 0) while, admitted, it waits for
GPUs. A status that ends the wait (bound, running, preempted, ended) removes the latter."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared.db import autocommit
from shared.events import JobWaiting, QueueChanged, QueueRefusal, QueueStatus

# how the admin API answers each refusal of queueing's (the edge's mapping)
REFUSAL_STATUS = {QueueRefusal.NOT_FOUND: 404, QueueRefusal.EXISTS: 409,
                  QueueRefusal.CONFLICT: 409, QueueRefusal.INVALID: 422}


def refusal_status(ev: QueueChanged) -> int:
    """The HTTP status for a rejected command (a replica of queueing from before the
    typed ``refusal`` sent the status itself)."""
    if ev.refusal is not None:
        return REFUSAL_STATUS[ev.refusal]
    return int(ev.settings.get("status", 409))


async def apply_queue_event(conn: AsyncConnection, ev: QueueChanged | QueueStatus) -> None:
    if isinstance(ev, QueueStatus):
        await conn.execute(text(
            "UPDATE queues_view SET status = CAST(:s AS jsonb) WHERE name = :n"),
            {"n": ev.queue, "s": ev.model_dump_json(exclude={"waiting"})})
        await conn.execute(text(  # queueing's rows only: position 0 is the scheduler's
            "DELETE FROM queue_waiting_view WHERE queue = :q AND position > 0"), {"q": ev.queue})
        if ev.waiting:
            await conn.execute(text(
                """INSERT INTO queue_waiting_view (job_id, queue, position, reason, detail,
                       estimated_start, blocked_by)
                   VALUES (:j, :q, :p, :r, :d, :e, :b)
                   ON CONFLICT (job_id) DO UPDATE SET queue = EXCLUDED.queue,
                       position = EXCLUDED.position, reason = EXCLUDED.reason,
                       detail = EXCLUDED.detail, estimated_start = EXCLUDED.estimated_start,
                       blocked_by = EXCLUDED.blocked_by, updated_at = now()"""),
                [{"j": w.job_id, "q": ev.queue, "p": w.position, "r": w.reason, "d": w.detail,
                  "e": w.estimated_start, "b": w.blocked_by} for w in ev.waiting])
        return
    if ev.request_id:
        await conn.execute(text(
            """INSERT INTO queue_requests_view (request_id, queue, outcome, error)
               VALUES (:r, :q, :o, :e) ON CONFLICT (request_id) DO NOTHING"""),
            {"r": ev.request_id, "q": ev.queue,
             "o": "rejected" if ev.change == "rejected" else "applied",
             "e": json.dumps({"status": refusal_status(ev), "error": ev.error})
             if ev.change == "rejected" else ""})
    if ev.change == "rejected":
        return
    global _generation
    _generation += 1
    s = ev.settings
    await conn.execute(text(
        """INSERT INTO queues_view (name, parent, tenant, state, settings, version)
           VALUES (:n, :p, :t, :st, CAST(:s AS jsonb), :v)
           ON CONFLICT (name) DO UPDATE SET parent = EXCLUDED.parent, tenant = EXCLUDED.tenant,
               state = EXCLUDED.state, settings = EXCLUDED.settings, version = EXCLUDED.version,
               updated_at = now()
           WHERE queues_view.version <= EXCLUDED.version"""),
        {"n": ev.queue, "p": s.get("parent"), "t": s.get("effective_tenant", ""),
         "st": s.get("state", "open"), "s": json.dumps(s), "v": ev.version})


_generation = 0  # bumped each time this process applies a queue's settings


class QueueCache:
    """Every queue's row, read at most once per ``ttl_s`` for the submit checks (they
    would otherwise read the queue and the whole tree on every submit). A change this
    process applies (``apply_queue_event``) is seen at the next submit; one that another
    replica's consumer applied, within ``ttl_s``. ``derived`` keeps what a caller builds
    from the rows (the quota tree) until they are read again."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._rows: dict[str, dict[str, Any]] | None = None
        self._until = 0.0
        self._generation = -1
        self.derived: dict[str, Any] = {}

    async def rows(self, engine: AsyncEngine) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        if self._rows is None or now >= self._until or self._generation != _generation:
            generation = _generation  # before the read: a change during it reads again
            self._rows = {r["name"]: r for r in await list_queues(engine, None)}
            self._until, self._generation = now + self.ttl_s, generation
            self.derived = {}
        return self._rows


async def get_queue(engine: AsyncEngine, name: str) -> dict[str, Any] | None:
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT * FROM queues_view WHERE name = :n"),
                                  {"n": name})).mappings().first()
    return dict(row) if row else None


async def list_queues(engine: AsyncEngine, tenant: str | None) -> list[dict[str, Any]]:
    """Every queue (``tenant`` None), or those of one tenant and the shared ones."""
    where = "" if tenant is None else "WHERE tenant = :t OR tenant = ''"
    async with autocommit(engine).connect() as conn:
        rows = await conn.execute(text(f"SELECT * FROM queues_view {where} ORDER BY name"),
                                  {"t": tenant})
        return [dict(r) for r in rows.mappings()]


async def request_outcome(engine: AsyncEngine, request_id: str) -> dict[str, Any] | None:
    async with engine.connect() as conn:
        row = (await conn.execute(text(
            "SELECT outcome, error FROM queue_requests_view WHERE request_id = :r"),
            {"r": request_id})).mappings().first()
    return dict(row) if row else None


async def waiting(engine: AsyncEngine, job_id: str) -> dict[str, Any] | None:
    async with engine.connect() as conn:
        row = (await conn.execute(text(
            """SELECT queue, position, reason, detail, estimated_start, blocked_by,
                      updated_at
               FROM queue_waiting_view WHERE job_id = :j AND position > 0"""),
            {"j": job_id})).mappings().first()
    return dict(row) if row else None


async def apply_job_waiting(conn: AsyncConnection, event_id: str, ev: JobWaiting,
                            occurred_at: datetime) -> None:
    """The scheduler's reason an admitted job is not placed yet. The first reason of a
    wait also goes into the job's history (``admitted``, ``waiting: <reason>``), so
    ``describe`` shows why it waited; later ones (on a busy cluster a gang's reason can
    flip between no_fit and gang_incomplete every cycle) and moved estimates only update
    the row. Ignored for a job that is placed, ended or on a later attempt by now."""
    job = (await conn.execute(text(
        """SELECT j.state, j.attempt, w.reason AS said FROM jobs j
           LEFT JOIN queue_waiting_view w ON w.job_id = j.id AND w.position = 0
           WHERE j.id = :j"""), {"j": ev.job_id})).first()
    if job is None or job.state not in ("pending", "admitted") or job.attempt > ev.attempt:
        return
    if job.said is None:
        await conn.execute(text(
            """INSERT INTO job_events (event_id, job_id, state, reason, reason_code, attempt,
                   message, occurred_at)
               VALUES (:e, :j, 'admitted', :r, 'waiting', :a, :m, :o)
               ON CONFLICT (event_id) DO NOTHING"""),
            {"e": event_id, "j": ev.job_id, "r": f"waiting: {ev.reason}", "a": ev.attempt,
             "m": ev.detail, "o": occurred_at})
    await conn.execute(text(
        """INSERT INTO queue_waiting_view (job_id, queue, position, reason, detail,
               estimated_start, blocked_by, updated_at)
           SELECT id, queue, 0, :r, :d, :e, :b, :o FROM jobs WHERE id = :j
           ON CONFLICT (job_id) DO UPDATE SET queue = EXCLUDED.queue, position = 0,
               reason = EXCLUDED.reason, detail = EXCLUDED.detail,
               estimated_start = EXCLUDED.estimated_start, blocked_by = EXCLUDED.blocked_by,
               updated_at = EXCLUDED.updated_at"""),
        {"j": ev.job_id, "r": ev.reason, "d": ev.detail, "e": ev.estimated_start,
         "b": ev.blocked_by, "o": occurred_at})


async def job_waiting(engine: AsyncEngine, job_id: str) -> dict[str, Any] | None:
    async with engine.connect() as conn:
        row = (await conn.execute(text(
            """SELECT reason, detail, estimated_start, blocked_by, updated_at
               FROM queue_waiting_view WHERE job_id = :j AND position = 0"""),
            {"j": job_id})).mappings().first()
    return dict(row) if row else None
