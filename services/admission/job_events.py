"""The job events the SSE streams send, read from admission's read model (``job_events``).

One ``JobEventsFeed`` per process reads, every ``stream_poll_s``, the new events of every
job being watched in a single query (a cursor per job, so its cost does not grow with
the number of watchers of a job), and hands them to the streams. Each job's events are
written in order by one consumer, so a per-job ``seq`` cursor misses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.logging import get_logger

log = get_logger(__name__)
_COLUMNS = ("seq, job_id, state, reason, reason_code, attempt, exit_code, task, node_id, "
            "message, occurred_at")


@dataclass
class _Watch:
    after: int
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)


class JobEventsFeed:
    """Polls job_events for every watched job in one query per interval."""

    def __init__(self, engine: AsyncEngine, interval_s: float) -> None:
        self.engine, self.interval_s = engine, interval_s
        self._watches: dict[str, list[_Watch]] = {}
        self._task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def watch(self, job_id: str, after: int) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        w = _Watch(after)
        self._watches.setdefault(job_id, []).append(w)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="job-events-feed")
        try:
            yield w.queue
        finally:
            watches = self._watches.get(job_id, [])
            if w in watches:
                watches.remove(w)
            if not watches:
                self._watches.pop(job_id, None)

    async def _run(self) -> None:
        while self._watches:
            await asyncio.sleep(self.interval_s)
            cursors = {j: min(w.after for w in ws) for j, ws in self._watches.items() if ws}
            if not cursors:
                continue
            try:
                rows = await read_events(self.engine, cursors)
            except Exception as exc:  # the database is away: the streams wait, then resume
                log.warning("job event feed: read failed", error=str(exc)[:200])
                continue
            for row in rows:
                for w in self._watches.get(row["job_id"], []):
                    if row["seq"] > w.after:
                        w.after = row["seq"]
                        w.queue.put_nowait(row)


async def read_events(engine: AsyncEngine, cursors: dict[str, int]) -> list[dict[str, Any]]:
    """Events after each job's cursor, in order."""
    async with engine.connect() as conn:
        rows = await conn.execute(text(
            f"""SELECT {', '.join('e.' + c.strip() for c in _COLUMNS.split(','))}
                FROM job_events e
                JOIN unnest(CAST(:jobs AS text[]), CAST(:seqs AS bigint[])) AS w(job_id, seq)
                  ON e.job_id = w.job_id AND e.seq > w.seq
                ORDER BY e.seq"""),
            {"jobs": list(cursors), "seqs": list(cursors.values())})
        return [dict(r) for r in rows.mappings()]


async def job_state(engine: AsyncEngine, job_id: str) -> dict[str, Any] | None:
    """The job's tenant and where it stands now (its ``jobs`` row)."""
    async with engine.connect() as conn:
        row = (await conn.execute(text(
            "SELECT tenant, state, reason, attempt, exit_code FROM jobs WHERE id = :j"),
            {"j": job_id})).mappings().first()
    return dict(row) if row else None
