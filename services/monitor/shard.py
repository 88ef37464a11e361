"""The partitioned share of the monitor's work.

Every replica joins the ``monitor`` consumer group on the topics whose events stand alone
(nodes.telemetry keyed by node, jobs.status and jobs.forecasts keyed by job, deadletter
keyed by source topic); the group gives each replica a subset of their partitions, and each replica
exports only what it read: per-GPU telemetry for the nodes of its partitions, the count
of their degraded GPUs, job transitions and dead letters. Prometheus adds the shares up.
When a rebalance takes a partition away, the next export drops its nodes' series, so a
GPU is not reported by two replicas for longer than one batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from services.monitor.metrics import MonitorMetrics
from shared.bus import partition_for
from shared.events import (
    DeadLetter,
    Event,
    GpuHealth,
    JobForecast,
    JobStatus,
    NodeTelemetry,
    TransitionReason,
    WaitReason,
    classify_transition,
)

MIB = 1024 * 1024


def transition_reason(event: JobStatus) -> TransitionReason:
    """The label of a transition: its code; an older producer's event has none, and is
    classified by its text (the fallback)."""
    if event.reason_code is not None:
        return event.reason_code
    return classify_transition(event.reason)


@dataclass
class ShardView:
    metrics: MonitorMetrics
    telemetry_partitions: int  # of nodes.telemetry, to know which nodes a partition holds
    topic: str = "nodes.telemetry"
    gpus: dict[str, set[int]] = field(default_factory=dict)  # node -> GPU indices exported
    degraded: dict[str, set[int]] = field(default_factory=dict)
    # each GPU's five series, looked up once: ``labels()`` takes a lock and hashes its
    # labels on every call, 40 calls a telemetry sample of 8 GPUs (the shard's main cost
    # at 2,000 nodes). Only this view removes these series (``export``), and it drops
    # them here too.
    _series: dict[tuple[str, int], tuple[Any, ...]] = field(default_factory=dict)

    def apply(self, event: Event) -> None:
        m = self.metrics
        if isinstance(event, NodeTelemetry):
            self.gpus.setdefault(event.node_id, set()).update(g.index for g in event.gpus)
            self.degraded[event.node_id] = {
                g.index for g in event.gpus if g.health is GpuHealth.DEGRADED}
            for g in event.gpus:
                series = self._series.get((event.node_id, g.index))
                if series is None:
                    labels = (event.node_id, str(g.index))
                    series = self._series[(event.node_id, g.index)] = tuple(
                        gauge.labels(*labels) for gauge in m.per_gpu())
                util, mem, temp, power, degraded = series
                util.set(g.utilization_pct / 100)
                mem.set(g.memory_used_mib * MIB)
                temp.set(g.temperature_c)
                power.set(g.power_w)
                degraded.set(1 if g.health is GpuHealth.DEGRADED else 0)
        elif isinstance(event, JobStatus) and event.task is None:
            m.transitions.labels(event.state.value, transition_reason(event).value).inc()
        elif isinstance(event, DeadLetter):
            m.deadletters.labels(event.topic, event.reason).inc()
        elif isinstance(event, JobForecast) and (event.start is not None or event.reason is not WaitReason.QUOTA):
            wait = math.inf if event.start is None else max(0.0, event.start - event.as_of)
            m.forecast_wait.labels(event.queue).observe(wait)

    def export(self, owned: set[int]) -> None:
        """``owned``: the telemetry partitions this replica holds now."""
        for node in [n for n in self.gpus
                     if partition_for(n, self.telemetry_partitions) not in owned]:
            for idx in self.gpus.pop(node):
                self._series.pop((node, idx), None)
                for gauge in self.metrics.per_gpu():
                    gauge.remove(node, str(idx))
            self.degraded.pop(node, None)
        self.metrics.gpus.labels("degraded").set(sum(len(v) for v in self.degraded.values()))
