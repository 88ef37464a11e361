"""What the forecaster reads: the scheduler leader's rows, as the leader loads them
(``SchedulerService.load``), into the core's ``Snapshot`` through the scheduler's own
``SnapshotBuilder``; finished jobs' durations; jobs still waiting for quota in queueing
(``queue_jobs``) and the queue tree they wait on (``queues``).

``sched_jobs`` keeps every job that ever ended, so a round must not scan it: the first
read is the leader's own start-up query (every job not over, or over but still holding a
task) and the newest ``forecast_history`` succeeded rows; each later read takes the jobs
not over through the table's partial index, and looks up by id those of the last read
that left it (ended since): one still holding a task stays in the snapshot, a succeeded
one teaches the history its duration.

Durations are learnt as the scheduler learns them (``services.scheduler.history``); jobs
that came and went between two reads (shorter than a round's interval) are left out.
The snapshot's requests carry the history's estimates and samples, as the leader's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from scheduling import JobRequest, Snapshot
from services.scheduler.forecaster.quota import tree_of
from services.scheduler.history import JobHistory
from services.scheduler.model import Cluster
from services.scheduler.rows import JobRow, NodeRow, job_from_row, node_from_row
from services.scheduler.snapshot import SnapshotBuilder
from shared.events import JobSubmitted
from shared.job_request import job_request
from shared.quota_tree import QueueTree

_COLUMNS = "job_id, state, attempt, ready, placement, tasks"
_HOLDS = "jsonb_path_exists(placement, '$[*] ? (@.state == \"bound\" || @.state == \"running\")')"
_TERMINAL = "state NOT IN ('succeeded', 'failed', 'cancelled')"  # sched_jobs_active_idx's
# the scheduler leader's own start-up query: every job not over, or over but holding a task
_LIVE = text(f"SELECT {_COLUMNS} FROM sched_jobs WHERE {_TERMINAL} OR {_HOLDS}")
_ACTIVE = text(f"SELECT {_COLUMNS} FROM sched_jobs WHERE {_TERMINAL}")
_BY_ID = text(f"SELECT {_COLUMNS}, {_HOLDS} AS holds,"
              " extract(epoch FROM updated_at)::float8 AS ended_at"
              " FROM sched_jobs WHERE job_id = ANY(CAST(:ids AS text[]))")
_NODES = text("SELECT node_id, inventory, state, cordon, cordon_generation, cordon_reason,"
              " admin_labels, admin_taints, labels_generation"
              " FROM sched_nodes ORDER BY node_id")  # a stable order: ties break alike each round
# admitted by nothing yet: queueing holds it until its queue has quota
_QUEUED = text("SELECT job_id, queue, tenant, event FROM queue_jobs WHERE state = 'queued'"
               " ORDER BY seq LIMIT :n")
_QUEUES = text("SELECT name, config FROM queues")


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


def snapshot_of(rows: Rows, now: float, history: JobHistory | None = None
                ) -> tuple[Snapshot, dict[str, Waiting]]:
    """The snapshot the leader's next cycle would see (had it loaded these rows, and
    learnt ``history``: None, no history estimates), and the queue and tenant of every
    job in it (``<job>~<attempt>`` stand-ins excluded)."""
    cluster = Cluster(epoch=0, history=history)
    for n in rows.nodes:
        cluster.nodes[n["node_id"]] = node_from_row(n)
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


@dataclass(slots=True)
class Queued:
    """Jobs queueing holds for quota (not yet the scheduler's), and its queue tree."""

    who: dict[str, Waiting]
    held: list[JobRequest]  # in arrival order; one whose event cannot be read is left out
    tree: QueueTree
    names: list[str] = field(default_factory=list)  # each held job's name (its speeds' class)


async def read_queued(conn: AsyncConnection, limit: int = 10_000) -> Queued:
    who: dict[str, Waiting] = {}
    held: list[JobRequest] = []
    names: list[str] = []
    for r in await conn.execute(_QUEUED, {"n": limit}):
        who[r.job_id] = Waiting(r.queue, r.tenant)
        try:
            ev = JobSubmitted.model_validate(r.event)
        except ValidationError:
            continue  # it still gets a forecast: waiting for quota, no start
        held.append(job_request(ev.spec, job_id=r.job_id, queue=r.queue, tenant=r.tenant, user=ev.user,
                                submitted_at=ev.submitted_at, attempt=1))
        names.append(ev.spec.name)
    configs = {r.name: r.config for r in await conn.execute(_QUEUES)}
    return Queued(who, held, tree_of(configs), names)


@dataclass
class RowReader:
    """Reads the scheduler's rows round after round, and learns durations on the way."""

    first_read: int = 2000  # succeeded jobs the history starts from
    history: JobHistory = field(default_factory=JobHistory)
    tracked: set[str] = field(default_factory=set)  # the job ids of the last read
    started: bool = False

    async def read(self, conn: AsyncConnection) -> Rows:
        nodes = [cast(NodeRow, dict(r)) for r in (await conn.execute(_NODES)).mappings()]
        if not self.started:
            jobs = [cast(JobRow, dict(r)) for r in (await conn.execute(_LIVE)).mappings()]
            await self.history.load(conn, self.first_read)
            self.started = True
        else:
            jobs = [cast(JobRow, dict(r)) for r in (await conn.execute(_ACTIVE)).mappings()]
            gone = self.tracked - {j["job_id"] for j in jobs}
            if gone:
                for r in (await conn.execute(_BY_ID, {"ids": sorted(gone)})).mappings():
                    if r["holds"]:  # over, but a task still stops: it holds its GPUs
                        jobs.append(cast(JobRow, {k: r[k] for k in JobRow.__annotations__}))
                    else:
                        self.history.learn_row(r)
        self.tracked = {j["job_id"] for j in jobs}
        return Rows(jobs, nodes)
