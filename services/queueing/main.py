"""Queueing: holds submitted jobs per queue and releases them as jobs.ready.

Today every queue is FIFO with no quota: a job is released as soon as it is stored.
The row is written before the event is published and the release is marked after, so
a crash in between republishes with the same event id, which consumers drop.
"""

from __future__ import annotations

import asyncio
import json

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.bus import Consumer, ConsumerOptions
from shared.config import CommonSettings
from shared.events import (
    CommandAction,
    Envelope,
    Event,
    JobCommand,
    JobReady,
    JobState,
    JobStatus,
    JobSubmitted,
    utcnow,
)
from shared.http import HttpServer, ops_app
from shared.service import ServiceRuntime
from shared.topics import JOBS_COMMANDS, JOBS_READY, JOBS_STATUS, JOBS_SUBMITTED


class QueueingSettings(CommonSettings):
    service_name: str = "queueing"
    http_port: int = 8001


class Queueing:
    def __init__(self, rt: ServiceRuntime, engine: AsyncEngine) -> None:
        self.rt = rt
        self.engine = engine
        self._dirty = True

    async def handle(self, env: Envelope, event: Event) -> None:
        await self.handle_batch([(env, event)])

    async def handle_batch(self, items: list[tuple[Envelope, Event]]) -> None:
        submitted = [e for _, e in items if isinstance(e, JobSubmitted)]
        if submitted:
            async with self.engine.begin() as conn:
                await conn.execute(
                    text("""INSERT INTO queue_jobs (job_id, queue, tenant, state, event)
                            VALUES (:j, :q, :t, 'queued', CAST(:e AS jsonb))
                            ON CONFLICT (job_id) DO NOTHING"""),
                    [{"j": e.job_id, "q": e.queue, "t": e.tenant, "e": e.model_dump_json()}
                     for e in submitted])
            self._dirty = True
        for _, event in items:  # in order: a cancel may follow its submit in one batch
            if isinstance(event, JobCommand) and event.action is CommandAction.CANCEL:
                await self._cancel(event)

    async def _cancel(self, cmd: JobCommand) -> None:
        async with self.engine.begin() as conn:
            row = (await conn.execute(
                text("SELECT state FROM queue_jobs WHERE job_id = :j FOR UPDATE"),
                {"j": cmd.job_id})).first()
            if row is not None and row.state != "queued":
                return  # already released: the scheduler owns it now
            if row is None:  # cancel overtook the submit: keep a tombstone
                await conn.execute(
                    text("""INSERT INTO queue_jobs (job_id, queue, tenant, state, event)
                            VALUES (:j, '', '', 'cancelled', '{}'::jsonb)
                            ON CONFLICT (job_id) DO NOTHING"""), {"j": cmd.job_id})
            else:
                await conn.execute(
                    text("UPDATE queue_jobs SET state = 'cancelled' WHERE job_id = :j"),
                    {"j": cmd.job_id})
        await self.rt.producer.publish(
            JobStatus(job_id=cmd.job_id, state=JobState.CANCELLED, reason=cmd.reason or
                      "cancelled while queued"), event_id=f"cancelled-q-{cmd.job_id}")

    async def release(self) -> None:
        """Emit jobs.ready for queued jobs, in arrival order (FIFO, no quota yet)."""
        if not self._dirty:
            return
        self._dirty = False
        async with self.engine.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT job_id, event FROM queue_jobs WHERE state = 'queued' ORDER BY seq"))).all()
        if not rows:
            return
        now = utcnow()
        batch = []
        for r in rows:
            sub = JobSubmitted.model_validate(r.event if isinstance(r.event, dict)
                                              else json.loads(r.event))
            ready = JobReady(job_id=sub.job_id, queue=sub.queue, tenant=sub.tenant, user=sub.user,
                             spec=sub.spec, submitted_at=sub.submitted_at, admitted_at=now)
            admitted = JobStatus(job_id=sub.job_id, state=JobState.ADMITTED,
                                 reason="admitted by queue (fifo)", attempt=1)
            batch.append((Envelope.wrap(ready, "queueing", f"ready-{sub.job_id}-1"),
                          JOBS_READY.name))
            batch.append((Envelope.wrap(admitted, "queueing", f"admitted-{sub.job_id}-1"),
                          JOBS_STATUS.name))
        await self.rt.producer.publish_many(batch)
        async with self.engine.begin() as conn:
            await conn.execute(
                text("UPDATE queue_jobs SET state = 'released' WHERE job_id = ANY(:j)"
                     " AND state = 'queued'"), {"j": [r.job_id for r in rows]})


async def main(settings: QueueingSettings | None = None) -> None:
    settings = settings or QueueingSettings()
    rt = ServiceRuntime(settings)
    await rt.start_dependencies()
    assert rt.engine is not None
    q = Queueing(rt, rt.engine)
    await q.release()  # anything stored but not released before a restart
    rt.add_consumer(Consumer(
        settings, ConsumerOptions("queueing", [JOBS_SUBMITTED.name, JOBS_COMMANDS.name]),
        q.handle, rt.producer, on_batch_end=q.release, batch_handler=q.handle_batch))
    await rt.run(HttpServer(ops_app(rt.ready), settings.http_host, settings.http_port))


def run() -> None:
    asyncio.run(main())
