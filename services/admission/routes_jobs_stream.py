"""GET /v1/jobs/{id}/events: a job's status changes as server-sent events.

The stream sends the job's history first, then each new transition (the job's and its
tasks') as it lands in admission's read model (``job_events``, filled from jobs.status by
whichever replica consumes the job's partition), and ends after the job reaches a final
state. The database is the source of truth, so a client may be served by any replica.

One ``JobEventsFeed`` per process reads, every ``stream_poll_s``, the new events of every
job being watched in a single query (a cursor per job, so its cost does not grow with
the number of watchers of a job), and hands them to the streams. Each job's events are
written in order by one consumer, so a per-job ``seq`` cursor misses nothing.

Events: ``status`` (``id`` is the event's seq: a client that reconnects with
``Last-Event-ID`` resumes after it), then one ``end`` with the final state. A comment
line every ``stream_keepalive_s`` keeps proxies from closing an idle stream. A stream
open ``stream_max_s`` is closed without ``end``: the client reconnects and resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request, status
from fastapi.responses import StreamingResponse
from prometheus_client import Gauge
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission.auth import Principal, authenticate
from shared.events import JobState
from shared.logging import get_logger

log = get_logger(__name__)
router = APIRouter()
WATCHERS = Gauge("kairos_admission_event_streams", "Open job event streams (SSE)")
_COLUMNS = "seq, job_id, state, reason, attempt, exit_code, task, node_id, message, occurred_at"


class StreamedEvent(BaseModel):
    """The data of a `status` event."""

    seq: int
    job_id: str
    state: str
    reason: str
    attempt: int
    exit_code: int | None = None
    task: str | None = None
    node_id: str | None = None
    message: str | None = None
    occurred_at: datetime


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


def _feed(request: Request) -> JobEventsFeed:
    state = request.app.state
    feed = getattr(state, "job_events_feed", None)
    if feed is None:
        feed = state.job_events_feed = JobEventsFeed(state.engine, state.settings.stream_poll_s)
    return feed  # type: ignore[no-any-return]


async def _job_state(engine: AsyncEngine, job_id: str) -> dict[str, Any] | None:
    async with engine.connect() as conn:
        row = (await conn.execute(text(
            "SELECT tenant, state, reason, attempt, exit_code FROM jobs WHERE id = :j"),
            {"j": job_id})).mappings().first()
    return dict(row) if row else None


def _sse(event: str, data: dict[str, Any], event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, default=str)}\n\n".encode()


def _status(row: dict[str, Any]) -> bytes:
    return _sse("status", StreamedEvent(**row).model_dump(mode="json"), row["seq"])


@router.get(
    "/v1/jobs/{job_id}/events",
    response_class=StreamingResponse,
    responses={200: {"description": (
        "text/event-stream: `status` events (data: StreamedEvent; id: its seq), then one "
        "`end` event with the job's final state; `: keep-alive` comments while idle"),
        "content": {"text/event-stream": {"schema": {"type": "string"}}}}},
)
async def job_events(
    job_id: str, request: Request,
    caller: Annotated[Principal, Depends(authenticate)],
    last_event_id: Annotated[str | None, Header(
        max_length=18, description="resume after this event (the id of the last one seen)")
    ] = None,
) -> StreamingResponse:
    """Follow a job: its history, then its status changes live, until it ends."""
    engine: AsyncEngine = request.app.state.engine
    settings = request.app.state.settings
    job = await _job_state(engine, job_id)
    if job is None or (not caller.admin and job["tenant"] != caller.tenant):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job {job_id}")
    after = 0
    if last_event_id:
        if not (last_event_id.isascii() and last_event_id.isdigit()):
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
                "field": "header.last-event-id", "type": "value_error",
                "message": "the id of an event of this stream (digits)"}])
        after = int(last_event_id)
    feed = _feed(request)

    async def stream() -> AsyncIterator[bytes]:
        WATCHERS.inc()
        try:
            # watch first, then read the history: nothing lands in between unseen
            async with feed.watch(job_id, after) as queue:
                # the state before the history: a job that ends meanwhile has its last
                # events in the history or, after it, in the feed
                final = await _ended(engine, job_id)
                last, ending = after, False
                for row in await read_events(engine, {job_id: after}):
                    last, ending = row["seq"], ending or _ends(row)
                    yield _status(row)
                if final is None and ending:  # it ended while we read
                    final = await _ended(engine, job_id)
                close_at = time.monotonic() + settings.stream_max_s
                while final is None:
                    left = close_at - time.monotonic()
                    if left <= 0:
                        return  # no `end`: the client resumes with Last-Event-ID
                    try:
                        row = await asyncio.wait_for(
                            queue.get(), min(settings.stream_keepalive_s, left))
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    if row["seq"] <= last:
                        continue
                    last = row["seq"]
                    yield _status(row)
                    if _ends(row):
                        # the jobs row changed in the same transaction as this event
                        final = await _ended(engine, job_id)
                yield _sse("end", {"job_id": job_id, **final})
        finally:
            WATCHERS.dec()

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _ends(row: dict[str, Any]) -> bool:
    """A job-level final state: the job may have ended (the state machine decides)."""
    return row["task"] is None and JobState(row["state"]).terminal


async def _ended(engine: AsyncEngine, job_id: str) -> dict[str, Any] | None:
    job = await _job_state(engine, job_id)
    if job is None or not JobState(job["state"]).terminal:
        return None
    return {k: job[k] for k in ("state", "reason", "attempt", "exit_code")}
