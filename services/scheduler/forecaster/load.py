"""What the forecaster reads: the scheduler leader's rows, as the leader loads them
(``SchedulerService.load``), into the core's ``Snapshot`` through the scheduler's own
``SnapshotBuilder``; finished jobs' durations; jobs still waiting for quota in queueing.

Durations are learnt from ``sched_jobs`` rows of succeeded jobs: from ``tasks.bound_at``
(when the cycle placed the job's last attempt) to the row's ``updated_at`` (written when
the job's end was stored), keyed by the job's tenant and GPU count. Failed and cancelled
jobs do not say how long a job of theirs takes, and are left out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from scheduling import JobRequest, Snapshot
from scheduling.estimates import DurationHistory
from services.scheduler.model import Cluster
from services.scheduler.rows import JobRow, NodeRow, job_from_row, node_from_row
from services.scheduler.snapshot import SnapshotBuilder
from shared.events import JobReady
from shared.job_request import job_request

# the scheduler leader's own query: every job that is not over, or still holds a task
_ACTIVE = text(
    "SELECT job_id, state, attempt, ready, placement, tasks FROM sched_jobs"
    " WHERE state NOT IN ('succeeded', 'failed', 'cancelled')"
    " OR jsonb_path_exists(placement, '$[*] ? (@.state == \"bound\" || @.state == \"running\")')")
_NODES = text("SELECT node_id, inventory, state, cordon, cordon_generation, cordon_reason"
              " FROM sched_nodes ORDER BY node_id")  # a stable order: ties break alike each round
_FINISHED = text(
    "SELECT job_id, ready, (tasks->>'bound_at')::float8 AS bound_at,"
    " extract(epoch FROM updated_at)::float8 AS ended_at, updated_at"
    " FROM sched_jobs WHERE state = 'succeeded' AND updated_at > :since"
    " AND tasks->>'bound_at' IS NOT NULL ORDER BY updated_at DESC LIMIT :n")
# admitted by nothing yet: queueing holds it until its queue has quota
_QUEUED = text("SELECT job_id, queue, tenant FROM queue_jobs WHERE state = 'queued'"
               " ORDER BY seq LIMIT :n")


@dataclass(frozen=True, slots=True)
class Waiting:
    """Who a waiting job is, for its event."""

    queue: str
    tenant: str


@dataclass(slots=True)
class Rows:
    """One read of the scheduler's rows."""

    jobs: list[JobRow]
    nodes: list[NodeRow]


def snapshot_of(rows: Rows, now: float) -> tuple[Snapshot, dict[str, Waiting]]:
    """The snapshot the leader's next cycle would see (had it loaded these rows), and
    the queue and tenant of every job in it (``<job>~<attempt>`` stand-ins excluded)."""
    cluster = Cluster(epoch=0)
    for r in rows.nodes:
        cluster.nodes[r["node_id"]] = node_from_row(r)
    who: dict[str, Waiting] = {}
    for r in rows.jobs:
        if not r["ready"]:
            continue  # a cancel that came before its job: nothing to place
        job = job_from_row(r)
        cluster.jobs[job.job_id] = job
        cluster.seq = max(cluster.seq, job.seq)
        assert job.ready is not None
        who[job.job_id] = Waiting(job.ready.queue, job.ready.tenant)
    return SnapshotBuilder(cluster).snapshot(now), who


async def read_rows(conn: AsyncConnection) -> Rows:
    jobs = [JobRow(**r) for r in (await conn.execute(_ACTIVE)).mappings()]
    nodes = [NodeRow(**r) for r in (await conn.execute(_NODES)).mappings()]
    return Rows(jobs, nodes)


async def read_queued(conn: AsyncConnection, limit: int = 10_000) -> dict[str, Waiting]:
    """Jobs waiting in queueing for quota (not yet the scheduler's)."""
    return {r.job_id: Waiting(r.queue, r.tenant)
            for r in (await conn.execute(_QUEUED, {"n": limit}))}


OVERLAP = timedelta(seconds=60)  # re-read: a row's updated_at is its transaction's start
KEEP = 20_000  # durations kept; the history is rebuilt from the last of them past twice that


@dataclass
class Learner:
    """Feeds a ``DurationHistory`` with the jobs that finished since the last read.

    Each read goes back ``OVERLAP`` before the newest ``updated_at`` seen: a transaction
    that began before the last read commits rows stamped earlier than what that read saw.
    The ids read within the overlap are remembered so none is learnt twice."""

    history: DurationHistory = field(default_factory=DurationHistory)
    first_read: int = 2000
    since: datetime | None = None
    seen: dict[str, datetime] = field(default_factory=dict)  # job id -> its updated_at
    recent: deque[tuple[str, int, float]] = field(default_factory=lambda: deque(maxlen=KEEP))

    async def learn(self, conn: AsyncConnection) -> int:
        """Reads what finished since; returns how many it learnt."""
        first = self.since is None
        rows = (await conn.execute(_FINISHED, {
            "since": (self.since - OVERLAP) if self.since else datetime.fromtimestamp(0, UTC),
            "n": self.first_read if first else 100_000})).mappings().all()
        learnt = 0
        for r in reversed(rows):  # oldest first: the history is in finishing order
            self.since = r["updated_at"] if self.since is None else max(self.since, r["updated_at"])
            if r["job_id"] in self.seen:
                continue  # read within the overlap already, or its row moved after its end
            self.seen[r["job_id"]] = r["updated_at"]
            tenant, gpus = _shape(r["ready"])
            d = max(0.0, r["ended_at"] - r["bound_at"])
            self.history.learn(tenant, gpus, d)
            self.recent.append((tenant, gpus, d))
            learnt += 1
        if self.since is not None:  # forget ids the next read's overlap cannot reach
            horizon = self.since - 2 * OVERLAP
            self.seen = {j: t for j, t in self.seen.items() if t >= horizon}
        if len(self.history.every) > 2 * KEEP:  # bounded memory over a long uptime
            self.history = DurationHistory(self.history.quantiles)
            for tenant, gpus, d in self.recent:
                self.history.learn(tenant, gpus, d)
        return learnt


def _shape(ready: Any) -> tuple[str, int]:
    """The key the history learns under: the tenant and the GPUs of the core's request
    (the same conversion the snapshot's jobs went through)."""
    r = JobReady.model_validate(ready)
    req = job_request(r.spec, job_id=r.job_id, queue=r.queue, tenant=r.tenant, user=r.user,
                      submitted_at=r.submitted_at, attempt=r.attempt)
    return r.tenant, gpu_key(req)


def gpu_key(job: JobRequest) -> int:
    """The history's size key: whole GPUs (a shared GPU counts as one)."""
    return math.ceil(job.total_gpus)
