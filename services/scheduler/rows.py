"""The scheduler's rows in PostgreSQL (``sched_jobs``, ``sched_nodes``) as typed records,
and their conversion to and from what the state holds.

A row is written with its JSON columns as Python objects (``ready`` and ``inventory``
as JSON text, from the event models) and read back from ``jsonb`` as decoded objects.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

from services.scheduler.model import NodeView, Placed, SchedJob, Stopping
from shared.events import EndCause, JobReady, JobState, NodeInventory


class JobMeta(TypedDict, total=False):
    """``sched_jobs.tasks``: what the scheduler keeps of a job besides its placement.
    Every key is optional on reading: rows written before a key existed lack it."""

    seq: int
    stopping: dict[str, str | None] | None  # Stopping: cause, detail, after
    bound_at: float | None
    bound_model: str
    targets: dict[str, int]
    resizes: int
    requeues: int
    node_losses: int
    # a row written before ``stopping``: what it held instead (read, never written)
    cancel_requested: bool
    preempted_by: str
    cancel_reason: str
    drain_requeue: bool
    reclaimed: str


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
    admin_labels: Any  # JSON text written, a decoded object read back
    admin_taints: Any
    labels_generation: int


def job_row(job: SchedJob) -> JobRow:
    return JobRow(
        job_id=job.job_id,
        state=job.state.value,
        attempt=job.attempt,
        ready=job.ready.model_dump_json() if job.ready else "{}",
        placement=[p.to_json() for p in job.placed],
        tasks=JobMeta(seq=job.seq, stopping=_stopping_json(job.stopping),
                      bound_at=job.bound_at, bound_model=job.bound_model, targets=job.targets,
                      resizes=job.resizes,
                      requeues=job.requeues, node_losses=job.node_losses),
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
        stopping=_stopping_of(meta),
        bound_at=meta.get("bound_at"),
        bound_model=meta.get("bound_model", ""),
        targets=dict(meta.get("targets") or {}),
        resizes=meta.get("resizes", 0),
        requeues=meta.get("requeues", 0),
        node_losses=meta.get("node_losses", 0),
    )


def _stopping_json(s: Stopping | None) -> dict[str, str | None] | None:
    return None if s is None else {"cause": s.cause.value, "detail": s.detail,
                                   "after": s.after.value if s.after else None}


def _stopping_of(meta: JobMeta) -> Stopping | None:
    if "stopping" in meta:
        s = meta["stopping"]
        if s is None:
            return None
        after = s.get("after")
        return Stopping(EndCause(s["cause"] or EndCause.OTHER), s.get("detail") or "",
                        EndCause(after) if after else None)
    # a row from before: its flags, read as the one cause they meant
    preempted = meta.get("preempted_by", "")
    in_flight = ((EndCause.DRAINED if meta.get("drain_requeue") else EndCause.PREEMPTED)
                 if preempted else None)
    if meta.get("cancel_requested"):
        return Stopping(EndCause.CANCELLED, meta.get("cancel_reason", ""), in_flight)
    if meta.get("reclaimed"):
        return Stopping(EndCause.RECLAIMED, meta.get("reclaimed", ""), in_flight)
    return Stopping(in_flight, preempted) if in_flight is not None else None


def node_row(view: NodeView) -> NodeRow:
    return NodeRow(node_id=view.inventory.node_id, inventory=view.inventory.model_dump_json(),
                   state="lost" if view.lost else "ready", cordon=view.cordon,
                   cordon_generation=view.cordon_generation, cordon_reason=view.cordon_reason,
                   admin_labels=json.dumps(view.admin_labels),
                   admin_taints=json.dumps(list(view.admin_taints)),
                   labels_generation=view.labels_generation)


def node_from_row(row: NodeRow) -> NodeView:
    return NodeView(NodeInventory.model_validate(row["inventory"]), lost=row["state"] == "lost",
                    cordon=row["cordon"], cordon_generation=row["cordon_generation"],
                    cordon_reason=row["cordon_reason"],
                    admin_labels=dict(_decoded(row.get("admin_labels")) or {}),
                    admin_taints=tuple(_decoded(row.get("admin_taints")) or ()),
                    labels_generation=int(row.get("labels_generation") or 0))


def _decoded(v: Any) -> Any:
    return json.loads(v) if isinstance(v, str) else v
