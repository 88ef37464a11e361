"""Queueing's Prometheus metrics (registered once per process, as the client requires)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram

from shared.events import WaitingJob
from shared.events.reasons import QUEUEING_WAITS

CYCLE_SECONDS = Histogram("kairos_queueing_cycle_seconds", "Queueing cycle time",
                          buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
ADMITTED = Counter("kairos_queueing_admitted_total", "Jobs admitted against quota",
                   ["queue", "borrowing"])
RECLAIMS = Counter("kairos_queueing_reclaims_total", "Jobs preempted to give a queue "
                   "its guaranteed quota back", ["queue"])
WAITING = Gauge("kairos_queueing_waiting_jobs", "Jobs waiting in their queue, by reason",
                ["queue", "reason"])
QUOTA_GPUS = Gauge("kairos_queueing_quota_gpus", "A queue's GPUs: guaranteed, used, borrowed",
                   ["queue", "kind"])


def admitted(queue: str, borrowing: bool) -> None:
    ADMITTED.labels(queue, str(borrowing).lower()).inc()


def reclaimed(queue: str) -> None:
    RECLAIMS.labels(queue).inc()


def queue_seen(queue: str, waiting: Sequence[WaitingJob], guaranteed_gpus: float,
               used_gpus: float, borrowed_gpus: float) -> None:
    """A queue after a cycle: its waiting jobs by reason (all, not only those listed in
    its status) and its GPUs."""
    for reason in QUEUEING_WAITS:
        WAITING.labels(queue, reason.value).set(sum(1 for w in waiting if w.reason == reason))
    QUOTA_GPUS.labels(queue, "guaranteed").set(guaranteed_gpus)
    QUOTA_GPUS.labels(queue, "used").set(used_gpus)
    QUOTA_GPUS.labels(queue, "borrowed").set(borrowed_gpus)
