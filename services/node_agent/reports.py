"""The agent's reports to the scheduler: published at once, or kept in the outbox
(``outbox.py``, in order) while the agent is fenced, while earlier reports wait, or when
the broker does not take them; the next lease renewal publishes what waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from services.node_agent.fencing import LeaseFence
from services.node_agent.outbox import Outbox
from services.node_agent.runtimes.base import TaskLaunch
from shared.events import Connection, Event, JobState, JobStatus
from shared.logging import get_logger

log = get_logger(__name__)
Publish = Callable[[Event, str | None], Awaitable[None]]


class Reporter:
    def __init__(self, node_id: str, publish: Publish, outbox: Outbox,
                 fence: LeaseFence) -> None:
        self.node_id = node_id
        self._publish = publish
        self._outbox = outbox
        self._fence = fence
        self._flusher: asyncio.Task[None] | None = None

    async def send(self, event: Event, event_id: str | None) -> bool:
        """Publish a report, or keep it in the outbox (in order) until it can be. True
        when it is safe, published or kept on disk: the runtime may forget the exit."""
        if self._fence.check() and not self._outbox:
            try:
                await self._publish(event, event_id)
                return True
            except Exception as exc:
                log.warning("report not published: kept until the broker takes it",
                            node=self.node_id, kind=event.TYPE, error=repr(exc))
        self._outbox.put(event, event_id)
        if self._fence.reason is None:
            self.flush_soon()
        return self._outbox.durable

    async def started(self, launch: TaskLaunch, connection: Connection | None) -> bool:
        """A task runs (with its session's connection, an interactive one). Its end goes
        through the agent's journal first (``NodeAgent._final``)."""
        return await self.send(JobStatus(
            job_id=launch.job_id, state=JobState.RUNNING, reason="started",
            attempt=launch.attempt, task=launch.task_id, node_id=self.node_id,
            connection=connection), f"{JobState.RUNNING.value}-{launch.key}")

    def flush_soon(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self._outbox and self._fence.check():
            event, event_id = self._outbox.head()
            try:
                await self._publish(event, event_id)
            except Exception as exc:  # the next renewal tries again
                log.warning("pending reports still not published", node=self.node_id,
                            pending=len(self._outbox), error=repr(exc))
                return
            self._outbox.pop()

    def cancel(self) -> None:
        if self._flusher:
            self._flusher.cancel()
