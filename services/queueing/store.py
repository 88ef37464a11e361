"""Queueing's tables: the queue tree (``queues``), answered admin commands
(``queue_requests``) and the jobs it holds (``queue_jobs``).

A held job is ``queued`` (waiting), ``admitted`` (holds its queue's quota from its release
until it ends), ``reclaiming`` (asked to stop so a queue gets its guarantee back; still
holds quota until it has), then ``done`` or ``cancelled``. ``phase`` follows jobs.status
(admitted / bound / running) for the counts a queue shows.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from scheduling.decay import DecayedUsage
from shared.queuespec import QueueSpec

ACTIVE = ("queued", "admitted", "reclaiming")


@dataclass
class JobRow:
    job_id: str
    seq: int
    queue: str
    state: str
    attempt: int
    phase: str
    borrowing: bool
    reason: str
    notices: int
    event: dict[str, Any]
    admitted_at: datetime | None
    started_at: datetime | None
    gpu_model: str = ""  # admitted: the GPU model quota it holds ("" = none)


@dataclass(frozen=True)
class QueueRow:
    spec: QueueSpec
    version: int
    source: str
    file_hash: str | None


def tree_lock_key(top: str) -> int:
    """The advisory lock one replica holds while it decides for a tree."""
    return 0x4B51_0000_0000 + zlib.crc32(top.encode())


CONFIG_LOCK = 0x4B51_434F_4E46  # "KQCONF": one replica changes the queues at a time


async def lock_config(conn: AsyncConnection) -> None:
    """Hold, until the transaction ends, the lock on changing the queues."""
    await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CONFIG_LOCK})


async def lock_tree(conn: AsyncConnection, top: str) -> None:
    """Hold, until the transaction ends, the lock on deciding for the tree ``top``."""
    await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": tree_lock_key(top)})


async def load_queues(conn: AsyncConnection) -> dict[str, QueueRow]:
    rows = (await conn.execute(text(
        "SELECT name, config, version, source, file_hash FROM queues ORDER BY name"))).all()
    return {r.name: QueueRow(QueueSpec.model_validate(_json(r.config)), r.version, r.source,
                             r.file_hash) for r in rows}


async def queue_versions(conn: AsyncConnection) -> dict[str, int]:
    return {r.name: r.version for r in (await conn.execute(
        text("SELECT name, version FROM queues"))).all()}


async def upsert_queue(conn: AsyncConnection, spec: QueueSpec, source: str,
                       file_hash: str | None) -> int:
    """Write a queue's config; returns its new version."""
    version = await conn.scalar(text(
        """INSERT INTO queues (name, config, version, source, file_hash)
           VALUES (:n, CAST(:c AS jsonb), 1, :s, :h)
           ON CONFLICT (name) DO UPDATE SET config = EXCLUDED.config,
               version = queues.version + 1, source = EXCLUDED.source,
               file_hash = COALESCE(EXCLUDED.file_hash, queues.file_hash), updated_at = now()
           RETURNING version"""),
        {"n": spec.name, "c": json.dumps(spec.public()), "s": source, "h": file_hash})
    return int(version or 1)


async def request_seen(conn: AsyncConnection, request_id: str) -> bool:
    return await conn.scalar(text("SELECT 1 FROM queue_requests WHERE request_id = :r"),
                             {"r": request_id}) is not None


async def record_request(conn: AsyncConnection, request_id: str, queue: str, outcome: str,
                         error: str = "") -> None:
    await conn.execute(text(
        """INSERT INTO queue_requests (request_id, queue, outcome, error)
           VALUES (:r, :q, :o, :e) ON CONFLICT (request_id) DO NOTHING"""),
        {"r": request_id, "q": queue, "o": outcome, "e": error})


@dataclass(frozen=True, slots=True)
class NewJob:
    job_id: str
    queue: str
    tenant: str
    state: str  # queued; done for a job no queue can hold; cancelled for a tombstone
    event: str  # its JobSubmitted, as JSON


async def insert_jobs(conn: AsyncConnection, jobs: list[NewJob]) -> None:
    """Store jobs as they arrive (one already stored is left as it is: a replay)."""
    await conn.execute(text(
        """INSERT INTO queue_jobs (job_id, queue, tenant, state, event)
           VALUES (:j, :q, :t, :s, CAST(:e AS jsonb)) ON CONFLICT (job_id) DO NOTHING"""),
        [{"j": j.job_id, "q": j.queue, "t": j.tenant, "s": j.state, "e": j.event}
         for j in jobs])


_ROW_COLUMNS = """job_id, seq, queue, state, attempt, phase, borrowing, reason, notices,
                  admitted_at, started_at, gpu_model"""


def _row(r: Any, event: dict[str, Any]) -> JobRow:
    return JobRow(r.job_id, r.seq, r.queue, r.state, r.attempt, r.phase, r.borrowing, r.reason,
                  r.notices, event, r.admitted_at, r.started_at, r.gpu_model)


async def active_jobs(conn: AsyncConnection, queues: list[str],
                      known: Callable[[str, int], bool] = lambda job_id, attempt: False
                      ) -> list[JobRow]:
    """The queues' held jobs, locked, in order. A job's event (its whole spec) is read
    only where ``known(job_id, attempt)`` says the caller has not parsed it already:
    every cycle reads every held job, and the backlog grows fastest when the service is
    busiest, so re-reading what it holds would make each cycle slower the further it is
    behind. The others' ``event`` is empty."""
    rows = (await conn.execute(text(
        f"""SELECT {_ROW_COLUMNS}
           FROM queue_jobs WHERE state IN ('queued', 'admitted', 'reclaiming')
               AND queue = ANY(:q) ORDER BY seq FOR UPDATE"""), {"q": queues})).all()
    missing = [r.job_id for r in rows if not known(r.job_id, r.attempt)]
    events: dict[str, Any] = {}
    if missing:
        events = {r.job_id: r.event for r in (await conn.execute(text(
            "SELECT job_id, event FROM queue_jobs WHERE job_id = ANY(:j)"), {"j": missing}))}
    return [_row(r, _json(events[r.job_id]) if r.job_id in events else {}) for r in rows]


async def lock_job(conn: AsyncConnection, job_id: str) -> JobRow | None:
    return (await lock_jobs(conn, [job_id])).get(job_id)


async def lock_jobs(conn: AsyncConnection, job_ids: list[str]) -> dict[str, JobRow]:
    """Several jobs' rows (without their events), locked in ``seq`` order: the order a
    cycle locks them in, so the two never wait on each other in a circle."""
    rows = (await conn.execute(text(
        f"""SELECT {_ROW_COLUMNS}
           FROM queue_jobs WHERE job_id = ANY(:j) ORDER BY seq FOR UPDATE"""),
        {"j": job_ids})).all()
    return {r.job_id: _row(r, {}) for r in rows}


async def admit(conn: AsyncConnection, job_id: str, borrowing: bool, at: datetime,
                gpu_model: str = "") -> None:
    """A waiting job now holds its queue's quota (``gpu_model``'s, if the tree gives that
    model a quota of its own)."""
    await conn.execute(text(
        """UPDATE queue_jobs SET state = 'admitted', phase = 'admitted',
               borrowing = :b, reason = '', admitted_at = :t, gpu_model = :m
           WHERE job_id = :j AND state = 'queued'"""),
        {"b": borrowing, "t": at, "m": gpu_model, "j": job_id})


async def reclaim(conn: AsyncConnection, job_id: str) -> None:
    """An admitted job is asked to stop; it holds its quota until it has."""
    await _update_job(conn, job_id, state="reclaiming")


async def note_wait(conn: AsyncConnection, job_id: str, reason: str, notices: int) -> None:
    """A waiting job's reason changed; ``notices`` counts the changes announced."""
    await _update_job(conn, job_id, reason=reason, notices=notices)


async def requeue(conn: AsyncConnection, job_id: str, attempt: int) -> None:
    """A reclaimed job is back in its queue, as attempt ``attempt``, without its quota."""
    await _update_job(conn, job_id, state="queued", attempt=attempt, phase="",
                      borrowing=False, reason="", admitted_at=None, started_at=None,
                      gpu_model="")


async def follow_phase(conn: AsyncConnection, job_id: str, phase: str, attempt: int,
                       started_at: datetime | None = None) -> None:
    """An admitted job's progress (admitted, bound, running: since ``started_at``)."""
    values: dict[str, Any] = {"phase": phase, "attempt": attempt}
    if started_at is not None:
        values["started_at"] = started_at
    await _update_job(conn, job_id, **values)


async def end(conn: AsyncConnection, job_id: str, phase: str) -> None:
    """The job ended (``phase``: how); its quota is free."""
    await _update_job(conn, job_id, state="done", phase=phase)


async def cancel(conn: AsyncConnection, job_id: str) -> None:
    await _update_job(conn, job_id, state="cancelled")


async def _update_job(conn: AsyncConnection, job_id: str, **values: Any) -> None:
    sets = ", ".join(f"{k} = :{k}" for k in values)
    await conn.execute(text(f"UPDATE queue_jobs SET {sets} WHERE job_id = :job_id"),
                       {**values, "job_id": job_id})


def _json(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else json.loads(v)


async def load_usage(conn: AsyncConnection, queues: list[str], half_life_s: float
                     ) -> DecayedUsage:
    """The tree's decayed past use per queue as its last cycle stored it."""
    rows = (await conn.execute(text(
        "SELECT queue, gpu_s, held, at FROM queue_usage WHERE queue = ANY(:q)"),
        {"q": queues})).all()
    return DecayedUsage(half_life_s, {r.queue: float(r.gpu_s) for r in rows},
                        max((float(r.at) for r in rows), default=None),
                        {r.queue: float(r.held) for r in rows if r.held > 0})


async def save_usage(conn: AsyncConnection, queues: list[str], usage: DecayedUsage) -> None:
    """The tree's figure after a cycle: each queue's past and what it holds from now."""
    await conn.execute(text("DELETE FROM queue_usage WHERE queue = ANY(:q)"), {"q": queues})
    keep = sorted(usage.gpu_s.keys() | usage.held.keys())
    if keep and usage.at is not None:
        await conn.execute(text(
            "INSERT INTO queue_usage (queue, gpu_s, held, at) VALUES (:q, :g, :h, :a)"),
            [{"q": q, "g": usage.gpu_s.get(q, 0.0), "h": usage.held.get(q, 0.0), "a": usage.at}
             for q in keep])
