"""The monitor: cluster-level metrics from every topic, and lost-node detection.

A node whose heartbeats stop for ``lost_after_s`` is declared lost with a ``node.lost``
event on nodes.lifecycle, so the scheduler requeues its tasks.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from services.monitor.view import HEARTBEAT_TIMEOUT, NODES_LOST, ClusterView
from shared.bus import Consumer, ConsumerOptions
from shared.config import CommonSettings
from shared.events import Envelope, Event, NodeLost
from shared.http import HttpServer, ops_app
from shared.logging import get_logger
from shared.service import ServiceRuntime
from shared.topics import ALL_TOPICS

log = get_logger(__name__)


class MonitorSettings(CommonSettings):
    service_name: str = "monitor"
    http_port: int = 8004
    lost_after_s: float = 20.0
    check_every_s: float = 2.0
    stuck_after_s: float = 120.0  # bound this long without running: stuck


async def main(settings: MonitorSettings | None = None) -> None:
    settings = settings or MonitorSettings()
    rt = ServiceRuntime(settings, use_db=False)
    await rt.start_dependencies()
    view = ClusterView(stuck_after_s=settings.stuck_after_s)
    HEARTBEAT_TIMEOUT.set(settings.lost_after_s)

    async def handle(env: Envelope, event: Event) -> None:
        view.apply(event, env.occurred_at.timestamp(), time.time())

    async def export() -> None:
        view.export(time.time())

    async def detect_lost() -> None:
        while True:
            await asyncio.sleep(settings.check_every_s)
            now = time.time()
            for node, seen in list(view.last_seen.items()):
                if node not in view.lost and now - seen > settings.lost_after_s:
                    view.lost.add(node)
                    NODES_LOST.inc()
                    log.warning("node lost", node=node, silent_s=round(now - seen, 1))
                    await rt.producer.publish(NodeLost(
                        node_id=node, last_seen=datetime.fromtimestamp(seen, UTC),
                        reason=f"no heartbeat for {settings.lost_after_s:.0f}s"))

    rt.add_consumer(Consumer(
        settings, ConsumerOptions("monitor", [t.name for t in ALL_TOPICS], from_beginning=True,
                                  fetch_max_wait_ms=100),
        handle, rt.producer, on_batch_end=export))
    rt.add_loop(detect_lost)
    await rt.run(HttpServer(ops_app(rt.ready), settings.http_host, settings.http_port))


def run() -> None:
    asyncio.run(main())
