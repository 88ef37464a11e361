"""The monitor: cluster-level metrics from every topic, and lost-node detection.

A node whose heartbeats stop for ``lost_after_s`` is declared lost with a ``node.lost``
event on nodes.lifecycle, so the scheduler requeues its tasks.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import Counter, Gauge

from shared.bus import Consumer, ConsumerOptions
from shared.config import CommonSettings
from shared.events import (
    Binding,
    BindingAction,
    DeadLetter,
    Envelope,
    Event,
    GpuHealth,
    JobState,
    JobStatus,
    JobSubmitted,
    NodeHeartbeat,
    NodeLost,
    NodeRegistered,
    NodeTelemetry,
)
from shared.http import HttpServer, ops_app
from shared.logging import get_logger
from shared.service import ServiceRuntime
from shared.topics import ALL_TOPICS

log = get_logger(__name__)

JOBS = Gauge("kairos_jobs", "Jobs by state", ["state"])
GPUS = Gauge("kairos_cluster_gpus", "GPUs by state (total, allocated, shared, degraded)",
             ["state"])
NODES = Gauge("kairos_nodes", "Nodes by state", ["state"])
NODES_LOST = Counter("kairos_nodes_lost_total", "Nodes declared lost")
DEADLETTERED = Counter("kairos_cluster_deadletters_total", "Dead letters seen on the bus",
                       ["topic", "reason"])
GPU_UTIL = Gauge("kairos_gpu_utilization_ratio", "GPU utilisation (0-1)", ["node", "gpu"])
GPU_MEM = Gauge("kairos_gpu_memory_used_bytes", "GPU memory used", ["node", "gpu"])
GPU_TEMP = Gauge("kairos_gpu_temperature_celsius", "GPU temperature", ["node", "gpu"])
GPU_POWER = Gauge("kairos_gpu_power_watts", "GPU power draw", ["node", "gpu"])
GPU_DEGRADED = Gauge("kairos_gpu_degraded", "1 if the GPU is degraded", ["node", "gpu"])
LAST_HEARTBEAT = Gauge("kairos_node_last_heartbeat_timestamp_seconds",
                       "Unix time of a node's last heartbeat", ["node"])


class MonitorSettings(CommonSettings):
    service_name: str = "monitor"
    http_port: int = 8004
    lost_after_s: float = 20.0
    check_every_s: float = 2.0


@dataclass
class ClusterView:
    job_state: dict[str, str] = field(default_factory=dict)
    node_gpus: dict[str, int] = field(default_factory=dict)
    last_seen: dict[str, float] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    # (job, attempt, node) -> [(gpu index, shared)] of live bindings
    bound: dict[tuple[str, int, str], list[tuple[int, bool]]] = field(default_factory=dict)
    degraded: dict[str, set[int]] = field(default_factory=dict)

    def apply(self, event: Event, seen_at: float) -> None:
        if isinstance(event, JobSubmitted):
            self.job_state.setdefault(event.job_id, JobState.PENDING.value)
        elif isinstance(event, JobStatus) and event.task is None:
            if self.job_state.get(event.job_id) not in ("succeeded", "failed", "cancelled"):
                self.job_state[event.job_id] = event.state.value
            if event.state.terminal or event.state is JobState.PREEMPTED:
                for k in [k for k in self.bound if k[0] == event.job_id]:
                    del self.bound[k]
        elif isinstance(event, JobStatus) and event.state.terminal and event.node_id:
            key = (event.job_id, event.attempt, event.node_id)
            self.bound.pop(key, None)
        elif isinstance(event, Binding) and event.action is BindingAction.ALLOCATE:
            self.bound[(event.job_id, event.attempt, event.node_id)] = [
                (g.index, bool(g.memory_mib)) for t in event.tasks for g in t.gpus]
        elif isinstance(event, NodeRegistered):
            node = event.inventory.node_id
            self.node_gpus[node] = len(event.inventory.gpus)
            self.last_seen[node] = seen_at
            self.lost.discard(node)
        elif isinstance(event, NodeHeartbeat):
            self.last_seen[event.node_id] = seen_at
            self.lost.discard(event.node_id)
        elif isinstance(event, NodeLost):
            self.lost.add(event.node_id)
        elif isinstance(event, NodeTelemetry):
            self.degraded[event.node_id] = {
                g.index for g in event.gpus if g.health is GpuHealth.DEGRADED}
            for g in event.gpus:
                labels = (event.node_id, str(g.index))
                GPU_UTIL.labels(*labels).set(g.utilization_pct / 100)
                GPU_MEM.labels(*labels).set(g.memory_used_mib * 1024 * 1024)
                GPU_TEMP.labels(*labels).set(g.temperature_c)
                GPU_POWER.labels(*labels).set(g.power_w)
                GPU_DEGRADED.labels(*labels).set(1 if g.health is GpuHealth.DEGRADED else 0)
        elif isinstance(event, DeadLetter):
            DEADLETTERED.labels(event.topic, event.reason).inc()

    def export(self) -> None:
        counts: dict[str, int] = dict.fromkeys((s.value for s in JobState), 0)
        for s in self.job_state.values():
            counts[s] += 1
        for s, n in counts.items():
            JOBS.labels(s).set(n)
        whole: set[tuple[str, int]] = set()
        shared: set[tuple[str, int]] = set()
        for (_, _, node), gpus in self.bound.items():
            for idx, is_shared in gpus:
                (shared if is_shared else whole).add((node, idx))
        GPUS.labels("total").set(sum(self.node_gpus.values()))
        GPUS.labels("allocated").set(len(whole | shared))
        GPUS.labels("shared").set(len(shared - whole))
        GPUS.labels("degraded").set(sum(len(v) for v in self.degraded.values()))
        NODES.labels("ready").set(len(set(self.node_gpus) - self.lost))
        NODES.labels("lost").set(len(self.lost))
        for node, t in self.last_seen.items():
            LAST_HEARTBEAT.labels(node).set(t)


async def main(settings: MonitorSettings | None = None) -> None:
    settings = settings or MonitorSettings()
    rt = ServiceRuntime(settings, use_db=False)
    await rt.start_dependencies()
    view = ClusterView()

    async def handle(env: Envelope, event: Event) -> None:
        view.apply(event, time.time())

    async def export() -> None:
        view.export()

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
