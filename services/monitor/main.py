"""The monitor: cluster metrics from every topic, lost-node detection.

Replicas split the work two ways (docs/deploy.md, "Monitor replicas"):

- each replica consumes its consumer-group share of the self-contained, keyed streams
  (telemetry, job transitions, dead letters) and exports only that share (``ShardView``);
- the replica elected through a PostgreSQL advisory lock also reads every partition of
  the topics the cluster view joins, from the beginning, and exports the cluster-wide
  series (``ClusterView``); it alone declares lost nodes, so no node.lost is sent twice.

A node whose heartbeats stop for ``lost_after_s`` is declared lost with a ``node.lost``
event on nodes.lifecycle, so the scheduler requeues its tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from datetime import UTC, datetime

from aiokafka import TopicPartition

from services.monitor.metrics import MonitorMetrics
from services.monitor.settings import MonitorSettings
from services.monitor.shard import ShardView
from services.monitor.view import ClusterView
from shared.bus import Consumer, ConsumerOptions, Producer
from shared.events import Envelope, Event, NodeLost
from shared.http import HttpServer, ops_app
from shared.leader import AdvisoryLock
from shared.logging import get_logger
from shared.retry import retry_transient
from shared.service import ServiceRuntime, run_main
from shared.topics import (
    BINDINGS,
    DEAD_LETTER,
    JOBS_FORECASTS,
    JOBS_STATUS,
    JOBS_SUBMITTED,
    NODES_LIFECYCLE,
    NODES_TELEMETRY,
    QUEUES_EVENTS,
)

log = get_logger(__name__)

SHARD_TOPICS = (NODES_TELEMETRY.name, JOBS_STATUS.name, DEAD_LETTER.name, JOBS_FORECASTS.name)
VIEW_TOPICS = (JOBS_SUBMITTED.name, JOBS_STATUS.name, BINDINGS.name, NODES_LIFECYCLE.name,
               QUEUES_EVENTS.name)


class MonitorReplica:
    """One replica's work: its shard always, the cluster view while elected."""

    def __init__(self, settings: MonitorSettings, producer: Producer,
                 metrics: MonitorMetrics) -> None:
        self.settings = settings
        self.producer = producer
        self.metrics = metrics
        self.view: ClusterView | None = None
        self._view_consumer: Consumer | None = None
        self._view_task: asyncio.Task[None] | None = None
        self._exported_at = 0.0
        self.shard: ShardView | None = None
        self.shard_consumer: Consumer | None = None
        self.election = AdvisoryLock(settings.database_url,
                                     f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}",
                                     settings.election_key, "monitor",
                                     poll_s=settings.election_poll_s)

    async def setup(self) -> Consumer:
        """The shard consumer (group ``monitor``); the caller runs it."""
        parts = await self.producer.partition_count(NODES_TELEMETRY.name)
        shard = self.shard = ShardView(self.metrics, parts)

        async def handle(env: Envelope, event: Event) -> None:
            shard.apply(event)

        async def handle_batch(items: list[tuple[Envelope, Event]]) -> None:
            for _, event in items:  # a whole fetch at once: no per-message bookkeeping
                shard.apply(event)

        async def export() -> None:
            shard.export(self._owned_telemetry())

        self.shard_consumer = Consumer(
            self.settings, ConsumerOptions(self.settings.shard_group, SHARD_TOPICS,
                                           fetch_max_wait_ms=100),
            handle, self.producer, on_batch_end=export, batch_handler=handle_batch)
        return self.shard_consumer

    def _owned_telemetry(self) -> set[int]:
        assert self.shard_consumer is not None
        return {tp.partition for tp in self.shard_consumer.assignment()
                if tp.topic == NODES_TELEMETRY.name}

    # --- the cluster view, while elected -------------------------------------------------

    async def lead(self) -> None:
        s = self.settings
        self.view = view = ClusterView(stuck_after_s=s.stuck_after_s,
                                       starvation_bound_s=s.starvation_bound_s,
                                       metrics=self.metrics)
        tps = [TopicPartition(t, p) for t in VIEW_TOPICS
               for p in range(await self.producer.partition_count(t))]

        async def handle(env: Envelope, event: Event) -> None:
            view.apply(event, env.occurred_at.timestamp(), time.time())

        async def handle_batch(items: list[tuple[Envelope, Event]]) -> None:
            now = time.time()
            for env, event in items:
                view.apply(event, env.occurred_at.timestamp(), now)

        async def export() -> None:
            if time.monotonic() - self._exported_at >= s.export_every_s:
                self.export()

        # no group, no commits: the view is rebuilt from the whole history on every start
        consumer = Consumer(s, ConsumerOptions("monitor-view", VIEW_TOPICS, assign=tps,
                                               fetch_max_wait_ms=100, commit=False,
                                               dead_letter=False),
                            handle, self.producer, on_batch_end=export,
                            batch_handler=handle_batch)
        # kept before it starts: leadership lost (or the process stopping) while it
        # connects must stop it too, or its fetcher would poll on, unowned
        self._view_consumer = consumer
        await consumer.start()
        self._view_task = asyncio.create_task(consumer.run())
        self.metrics.heartbeat_timeout.set(s.lost_after_s)
        self.metrics.is_leader.set(1)

    async def stand_down(self) -> None:
        consumer, task = self._view_consumer, self._view_task
        self._view_consumer = self._view_task = None
        self.view = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if consumer is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await consumer.stop()
        self.metrics.is_leader.set(0)
        self.metrics.clear_cluster()

    def export(self) -> None:
        if self.view is not None:
            self._exported_at = time.monotonic()
            self.view.export(time.time())

    async def campaign(self) -> None:
        try:
            await self.election.run(self.lead, self.stand_down)
        finally:
            await self.stand_down()

    async def watch_nodes(self) -> None:
        """While elected: declare silent nodes lost, and keep the exported ages current."""
        while True:
            await asyncio.sleep(self.settings.check_every_s)
            view = self.view
            if view is None:
                continue
            await self.declare_lost(view, time.time())
            self.export()

    async def declare_lost(self, view: ClusterView, now: float) -> None:
        after = self.settings.lost_after_s
        for node, seen in list(view.last_seen.items()):
            if node in view.lost or now - seen <= after:
                continue
            view.lost.add(node)
            self.metrics.nodes_lost.inc()
            log.warning("node lost", node=node, silent_s=round(now - seen, 1))
            lost = NodeLost(node_id=node, last_seen=datetime.fromtimestamp(seen, UTC),
                            reason=f"no heartbeat for {after:.0f}s")
            # the broker may be away: wait for it rather than end the loop (and the service)
            await retry_transient(lambda ev=lost: self.producer.publish(ev), "monitor.node_lost")


async def main(settings: MonitorSettings | None = None) -> None:
    settings = settings or MonitorSettings()
    rt = ServiceRuntime(settings, use_db=False)  # the election opens its own connection
    await rt.start_dependencies()
    replica = MonitorReplica(settings, rt.producer, MonitorMetrics())
    rt.add_consumer(await replica.setup())
    rt.add_loop(replica.campaign)
    rt.add_loop(replica.watch_nodes)
    await rt.run(HttpServer(ops_app(rt.ready), settings.http_host, settings.http_port))


def run() -> None:
    run_main(main)
