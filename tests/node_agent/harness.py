"""A real node-agent service (``services.node_agent.main.start``) inside the test's event
loop, against the real broker: bindings go in on ``bindings``, statuses come out on
``jobs.status``, its HTTP port serves /logs."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from kairos.embedded import free_port
from services.node_agent.agent import NodeAgent
from services.node_agent.main import AgentHost, start
from services.node_agent.settings import AgentSettings
from shared.bus import Producer
from shared.events import BindingRefused, Envelope, Event, JobStatus
from shared.topics import JOBS_STATUS


@dataclass
class StatusFeed:
    """Every event published on jobs.status from the moment it started."""

    events: list[Event] = field(default_factory=list)

    def statuses(self, job_id: str) -> list[JobStatus]:
        return [e for e in self.events if isinstance(e, JobStatus) and e.job_id == job_id]

    def refusals(self, job_id: str) -> list[BindingRefused]:
        return [e for e in self.events if isinstance(e, BindingRefused) and e.job_id == job_id]

    def find(self, job_id: str, state: str, task: str | None = None,
             attempt: int | None = None) -> JobStatus | None:
        return next((s for s in self.statuses(job_id) if s.state.value == state
                     and (task is None or s.task == task)
                     and (attempt is None or s.attempt == attempt)), None)

    async def wait(self, job_id: str, state: str, task: str | None = None,
                   attempt: int | None = None, timeout: float = 30) -> JobStatus:
        async with asyncio.timeout(timeout):
            while (found := self.find(job_id, state, task, attempt)) is None:
                await asyncio.sleep(0.02)
        return found


async def _follow(bootstrap: str, feed: StatusFeed, started: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=20,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(JOBS_STATUS.name) or set()
        tps = [TopicPartition(JOBS_STATUS.name, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        started.set()
        while True:
            for records in (await consumer.getmany(timeout_ms=100)).values():
                for r in records:
                    feed.events.append(Envelope.decode(r.value or b"").payload())
    finally:
        await consumer.stop()


@dataclass
class AgentRun:
    settings: AgentSettings
    host: AgentHost
    producer: Producer
    feed: StatusFeed

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.http_port}"

    def agent(self, node_id: str | None = None) -> NodeAgent:
        return self.host.agents[node_id or next(iter(self.host.agents))]

    async def send(self, event: Event, event_id: str | None = None) -> None:
        await self.producer.publish(event, event_id=event_id)


@contextlib.asynccontextmanager
async def running_agent(bootstrap: str, tmp: Any, **overrides: Any) -> AsyncIterator[AgentRun]:
    """An agent service named ``a<random>`` (sim nodes ``a<random>-<i>`` when several);
    ``overrides`` are AgentSettings (``node_id`` of an earlier run: that agent restarted)."""
    options: dict[str, Any] = {
        "kafka_bootstrap": bootstrap, "node_id": f"a{uuid.uuid4().hex[:8]}",
        "http_port": free_port(), "heartbeat_s": 0.2, "telemetry_s": 0.2,
        "state_dir": str(tmp), "log_json": False, "sim_gpus_per_node": 8}
    settings = AgentSettings(**{**options, **overrides})  # node_id too: a restarted agent
    feed = StatusFeed()
    follow_started = asyncio.Event()
    follower = asyncio.create_task(_follow(bootstrap, feed, follow_started))
    await asyncio.wait_for(follow_started.wait(), 30)
    rt, host, http = await start(settings)
    runner = asyncio.create_task(rt.run(http))
    producer = Producer(bootstrap, "test-scheduler")
    await producer.start()
    try:
        async with asyncio.timeout(30):
            while not await rt.producer.reachable() or not (http._server.started):
                await asyncio.sleep(0.05)
        yield AgentRun(settings, host, producer, feed)
    finally:
        await producer.stop()
        rt.stopping.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(runner, 30)
        await host.close()
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower


async def until(predicate: Callable[[], bool], timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)
