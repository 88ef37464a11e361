"""GET /v1/jobs/{id}/events: a job's status changes as server-sent events.

The stream sends the job's history first, then each new transition (the job's and its
tasks') as it lands in admission's read model (``job_events``, filled from jobs.status by
whichever replica consumes the job's partition), and ends after the job reaches a final
state. The database is the source of truth, so a client may be served by any replica;
the process's ``JobEventsFeed`` (``services.admission.job_events``) reads the new events.

Events: ``status`` (``id`` is the event's seq: a client that reconnects with
``Last-Event-ID`` resumes after it), then one ``end`` with the final state. A comment
line every ``stream_keepalive_s`` keeps proxies from closing an idle stream. A stream
open ``stream_max_s`` is closed without ``end``: the client reconnects and resumes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, status
from fastapi.responses import StreamingResponse
from prometheus_client import Gauge
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission.deps import Caller, EngineDep, JobEventsFeedDep, SettingsDep
from services.admission.job_events import job_state, read_events
from services.admission.models.jobs import StreamedEvent
from shared.events import JobState

router = APIRouter()
WATCHERS = Gauge("kairos_admission_event_streams", "Open job event streams (SSE)")


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
    job_id: str, caller: Caller, engine: EngineDep, settings: SettingsDep,
    feed: JobEventsFeedDep,
    last_event_id: Annotated[str | None, Header(
        max_length=18, description="resume after this event (the id of the last one seen)")
    ] = None,
) -> StreamingResponse:
    """Follow a job: its history, then its status changes live, until it ends."""
    job = await job_state(engine, job_id)
    if job is None or (not caller.admin and job["tenant"] != caller.tenant):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job {job_id}")
    after = 0
    if last_event_id:
        if not (last_event_id.isascii() and last_event_id.isdigit()):
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[{
                "field": "header.last-event-id", "type": "value_error",
                "message": "the id of an event of this stream (digits)"}])
        after = int(last_event_id)

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
                        async with asyncio.timeout(min(settings.stream_keepalive_s, left)):
                            row = await queue.get()
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
    job = await job_state(engine, job_id)
    if job is None or not JobState(job["state"]).terminal:
        return None
    return {k: job[k] for k in ("state", "reason", "attempt", "exit_code")}
