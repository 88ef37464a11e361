"""Queue order from the scheduling core's ordering plugins (priority with aging, fair
share, FIFO), so queueing and the scheduler rank jobs with the same code.

Fair share runs between *queues*: each job's ``tenant`` for the core is its queue, with
the queue's weight. The core measures shares against cluster capacity, which queueing
does not see; it is given the tree's guaranteed GPUs (or, with no quota at all, the
pending demand) as one capacity-only node. Ties keep arrival order (the ``seq`` the
jobs were stored with), so a restart never reorders a queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduling import GpuSlot, JobRequest, Node, Quota, Resources, Scheduler, Snapshot
from services.queueing.config import OrderingSpec
from services.queueing.quota import Vec
from shared.events import JobSubmitted
from shared.job_request import job_request as shared_job_request
from shared.quota_tree import request_demand


@dataclass(frozen=True, slots=True)
class Held:
    """A job queueing holds, as the ordering needs it."""

    seq: int
    event: JobSubmitted
    attempt: int
    request: JobRequest
    demand: Vec


def job_request(sub: JobSubmitted, attempt: int,
                billing_weights: Mapping[str, float] | None = None) -> JobRequest:
    """A held job for the core: its tenant is its queue (fair share runs between queues,
    GPUs at the queue's billing weights)."""
    return shared_job_request(sub.spec, job_id=sub.job_id, queue=sub.queue, tenant=sub.queue,
                              user=sub.user, submitted_at=sub.submitted_at, attempt=attempt,
                              billing_weights=billing_weights)


def demand(req: JobRequest) -> Vec:
    """What a job reserves of its queue's quota (``request_demand``)."""
    return request_demand(req)


class Ordering:
    def __init__(self, spec: OrderingSpec) -> None:
        self.spec = spec
        self.core = Scheduler(spec.scheduler_config())
        self._capacity: tuple[int, tuple[Node, ...]] = (-1, ())

    def _nodes(self, gpus: int) -> tuple[Node, ...]:
        if self._capacity[0] != gpus:  # the same tuple while unchanged (the core caches it)
            self._capacity = (gpus, (Node("quota", 0, 0, [GpuSlot(i) for i in range(gpus)]),)
                              if gpus > 0 else ())
        return self._capacity[1]

    def order(self, jobs: Sequence[Held], now: float, weights: dict[str, float],
              capacity_gpus: float, past_usage: Mapping[str, float] | None = None) -> list[Held]:
        """``past_usage``: each queue's decayed GPU-seconds (with ``half_life_s``)."""
        if len(jobs) < 2:
            return list(jobs)
        by_id = {h.request.job_id: h for h in jobs}
        gpus = int(capacity_gpus) if capacity_gpus > 0 else int(sum(h.demand[0] for h in jobs)) + 1
        quotas = tuple(Quota(q, Resources(), weight=w) for q, w in weights.items())
        ordered = self.core.order(Snapshot(now=now, nodes=self._nodes(min(gpus, 100_000)),
                                           allocations=(),
                                           pending=tuple(h.request for h in jobs),
                                           quotas=quotas, past_usage=past_usage or {}))
        return [by_id[r.job_id] for r in ordered]
