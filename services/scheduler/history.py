"""Durations of succeeded jobs, as the scheduler and the forecaster both learn them: the
history ``scheduling.estimates`` estimates from, fed from ``sched_jobs`` rows (at start,
the newest succeeded ones) and, live, from jobs as they succeed.

A job's duration runs from ``bound_at`` (when the cycle placed its last attempt) to its
end (a row's ``updated_at``, written when its end was stored), keyed by tenant and whole
GPUs. Failed and cancelled jobs do not say how long a job of theirs takes and are left
out. Memory stays bounded over a long uptime: past twice ``KEEP`` durations, the history
is rebuilt from the last ``KEEP``.

The scheduler gives each job's request the median of similar jobs (its
``runtime_estimate_s``, unless the user gave one) and their durations
(``runtime_samples``, for the Gittins rank), as the simulator does (``sim/engine.py``,
``estimates="history"``).

Speeds per GPU model are learnt the same way (``scheduling.speeds``, the simulator's
``speeds="learned"``): a job class is its tenant, name and whole GPUs; a job of it that
succeeded on its first attempt, placed on GPUs of one model, ran at 1/duration there
(jobs of a class doing about the same work). A job that gives no ``throughput`` of its
own (nor a gpuModel order) is placed by its class's speeds, or the typical class's until
its own are measured on two models; a cluster of one model never learns any, so nothing
changes there.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from scheduling import JobRequest
from scheduling.estimates import DurationHistory
from scheduling.speeds import SpeedHistory
from shared.events import JobReady
from shared.job_request import job_request

# the newest succeeded rows first: read oldest first, the history is in finishing order
NEWEST_SUCCEEDED = text(
    "SELECT job_id, state, attempt, ready, placement, tasks,"
    " extract(epoch FROM updated_at)::float8 AS ended_at"
    " FROM sched_jobs WHERE state = 'succeeded' AND tasks->>'bound_at' IS NOT NULL"
    " ORDER BY updated_at DESC LIMIT :n")
KEEP = 20_000  # durations kept; the history is rebuilt from the last of them past twice that


def job_class(tenant: str, name: str, gpus: int) -> tuple[str, str, int]:
    """What speeds are learnt per: jobs of one tenant, name and size do alike work."""
    return tenant, name, gpus


def gpu_key(job: JobRequest) -> int:
    """The history's size key: whole GPUs (a shared GPU counts as one)."""
    return math.ceil(job.total_gpus)


def shape(ready: JobReady) -> tuple[str, int]:
    """The key a job is learnt under: its tenant and the GPUs of the core's request (the
    same conversion the snapshot's jobs go through)."""
    req = job_request(ready.spec, job_id=ready.job_id, queue=ready.queue, tenant=ready.tenant,
                      user=ready.user, submitted_at=ready.submitted_at, attempt=ready.attempt)
    return ready.tenant, gpu_key(req)


class JobHistory(DurationHistory):
    """A ``DurationHistory`` with bounded memory, fed from the scheduler's jobs and rows,
    that says when what it knows of a GPU count changed (``version``) and fills a job's
    request from it (``fill``)."""

    def __init__(self, quantiles: tuple[float, float] = (0.1, 0.9)) -> None:
        super().__init__(quantiles)
        self.recent: deque[tuple[str, int, float]] = deque(maxlen=KEEP)
        self.generation = 0  # rebuilds so far
        self.speeds = SpeedHistory()  # per job class (tenant, name, GPUs), per model

    def learn(self, tenant: str, gpus: int, duration_s: float) -> None:
        super().learn(tenant, gpus, duration_s)
        self.recent.append((tenant, gpus, duration_s))
        if len(self.every) > 2 * KEEP:
            fresh = DurationHistory(self.quantiles)
            for t, g, x in self.recent:
                fresh.learn(t, g, x)
            # swapped whole, attribute by attribute: a forecaster thread reading it meanwhile
            # sees one or the other, never an emptied history
            self.by_key, self.by_size, self.every, self.gpu_s = (
                fresh.by_key, fresh.by_size, fresh.every, fresh.gpu_s)
            self.generation += 1
            self._memo.clear()

    def learn_job(self, ready: JobReady, bound_at: float | None, ended_at: float,
                  model: str = "", attempt: int = 0) -> None:
        """A job that succeeded at ``ended_at``, placed (its last attempt, ``attempt``) at
        ``bound_at`` on GPUs of ``model`` (""; none, or several)."""
        if bound_at is None:
            return
        tenant, gpus = shape(ready)
        took = max(0.0, ended_at - bound_at)
        self.learn(tenant, gpus, took)
        if model and gpus and attempt == 1 and took > 0:  # a later attempt resumed: part of the work
            self.speeds.learn(job_class(ready.tenant, ready.spec.name, gpus), model, 1.0 / took)

    def learn_row(self, r: Any) -> None:
        """A ``sched_jobs`` row with its ``ended_at`` (epoch s of ``updated_at``); one not
        succeeded, never placed or without its job (a tombstone) teaches nothing."""
        if r["state"] != "succeeded" or not r["ready"]:
            return
        meta = r["tasks"] or {}
        self.learn_job(JobReady.model_validate(r["ready"]), meta.get("bound_at"), r["ended_at"],
                       meta.get("bound_model", ""), r["attempt"])

    async def load(self, conn: AsyncConnection, n: int) -> None:
        """Learn the newest ``n`` succeeded jobs (a process starting)."""
        for r in reversed((await conn.execute(NEWEST_SUCCEEDED, {"n": n})).mappings().all()):
            self.learn_row(r)

    def version(self, gpus: int) -> tuple[int, int]:
        """As ``DurationHistory.version``, and changed by every rebuild."""
        return self.generation, len(self.by_size.get(gpus) or ())

    def fill(self, job: JobRequest, gpus: int, name: str | None = None) -> JobRequest:
        """The request with the history's samples of similar jobs and, unless the user
        gave one, their median as its estimate; and, unless the user gave a throughput,
        the speeds learnt for its class (``name``: the job's; None: not asked). The same
        object when the history knows nothing of it."""
        estimate, samples = self.known(job.tenant, gpus)
        if samples:
            own = job.runtime_estimate_s
            job = replace(job, runtime_estimate_s=own if own is not None else estimate,
                          runtime_samples=samples)
        # whole GPUs only (speeds are per GPU model), and never over the user's own
        # throughput or gpuModel order of preference
        if name is not None and not (job.gpu_speeds or job.gpu_model_ranks) and any(t.gpu for t in job.tasks):
            speeds = self.speeds.speeds(job_class(job.tenant, name, gpus))
            if speeds:
                job = replace(job, gpu_speeds=speeds)
        return job
