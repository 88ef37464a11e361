"""The scheduler's rows in PostgreSQL (``sched_jobs``, ``sched_nodes``) as typed records,
and their conversion to and from what the state holds.

A row is written with its JSON columns as Python objects (``ready`` and ``inventory``
as JSON text, from the event models) and read back from ``jsonb`` as decoded objects.
"""

from __future__ import annotations

from typing import Any, TypedDict

from services.scheduler.model import NodeView, Placed, SchedJob
from shared.events import JobReady, JobState, NodeInventory


class JobMeta(TypedDict, total=False):
    """``sched_jobs.tasks``: what the scheduler keeps of a job besides its placement.
    Every key is optional on reading: rows written before a key existed lack it."""

    seq: int
    cancel_requested: bool
    bound_at: float | None
    preempted_by: str
    targets: dict[str, int]
    resizes: int
    cancel_reason: str
    drain_requeue: bool
    requeues: int
    reclaimed: str
    node_losses: int


class JobRow(TypedDict):
    """One ``sched_jobs`` row."""

    job_id: str
    state: str
    attempt: int
    ready: Any  # JSON text written, a decoded object read back ({} for a tombstone)
    placement: list[dict[str, Any]]
    tasks: JobMeta


class NodeRow(TypedDict):
    """One ``sched_nodes`` row."""

    node_id: str
    inventory: Any  # JSON text written, a decoded object read back
    state: str  # "ready" | "lost"
    cordon: str
    cordon_generation: int
    cordon_reason: str


def job_row(job: SchedJob) -> JobRow:
    return JobRow(
        job_id=job.job_id,
        state=job.state.value,
        attempt=job.attempt,
        ready=job.ready.model_dump_json() if job.ready else "{}",
        placement=[p.to_json() for p in job.placed],
        tasks=JobMeta(seq=job.seq, cancel_requested=job.cancel_requested,
                      bound_at=job.bound_at, preempted_by=job.preempted_by,
                      targets=job.targets, resizes=job.resizes,
                      cancel_reason=job.cancel_reason, drain_requeue=job.drain_requeue,
                      requeues=job.requeues, reclaimed=job.reclaimed,
                      node_losses=job.node_losses),
    )


def job_from_row(row: JobRow) -> SchedJob:
    meta = row["tasks"]
    return SchedJob(
        job_id=row["job_id"],
        ready=JobReady.model_validate(row["ready"]) if row["ready"] else None,
        state=JobState(row["state"]),
        attempt=row["attempt"],
        seq=meta.get("seq", 0),
        placed=[Placed.from_json(p) for p in row["placement"]],
        cancel_requested=meta.get("cancel_requested", False),
        bound_at=meta.get("bound_at"),
        preempted_by=meta.get("preempted_by", ""),
        targets=dict(meta.get("targets") or {}),
        resizes=meta.get("resizes", 0),
        cancel_reason=meta.get("cancel_reason", ""),
        drain_requeue=meta.get("drain_requeue", False),
        requeues=meta.get("requeues", 0),
        reclaimed=meta.get("reclaimed", ""),
        node_losses=meta.get("node_losses", 0),
    )


def node_row(view: NodeView) -> NodeRow:
    return NodeRow(node_id=view.inventory.node_id, inventory=view.inventory.model_dump_json(),
                   state="lost" if view.lost else "ready", cordon=view.cordon,
                   cordon_generation=view.cordon_generation, cordon_reason=view.cordon_reason)


def node_from_row(row: NodeRow) -> NodeView:
    return NodeView(NodeInventory.model_validate(row["inventory"]), lost=row["state"] == "lost",
                    cordon=row["cordon"], cordon_generation=row["cordon_generation"],
                    cordon_reason=row["cordon_reason"])
