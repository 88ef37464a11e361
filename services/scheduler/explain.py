"""Why an admitted job is not placed yet, told to the rest of the platform.

Each cycle the core leaves every job it could not place with a ``PendingReason``, and
EASY backfill gives the blocked head job a reservation (when it is expected to start);
a job that waits behind another (``priority``, ``backfill_blocked``) names it. The
core's reason goes out as the shared vocabulary's code (``shared/events/reasons.py``).
The scheduler sends a ``job.waiting`` on ``jobs.status`` (keyed by job, so it stays in
order with the job's transitions) only when that changes for a job: another reason or
job it waits behind, an estimate that appears, goes, or moves by more than ``shift_s``. A cycle where nothing
changed sends nothing, so the volume follows the changes, not the cycle rate or the
backlog. The gateway shows the last one while the job stays admitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from scheduling import JobRequest, PendingReason, Plan
from scheduling.plugins.throughput import relative_speeds
from shared.events import JobWaiting, from_pending

DETAIL = {
    PendingReason.NO_FIT: "no node has room for it now",
    PendingReason.GANG_INCOMPLETE: "only part of its gang fits now; it starts when all of "
                                   "it can (all or nothing)",
    PendingReason.NEVER_FITS: "larger than the whole healthy cluster: it starts only once "
                              "nodes are added or GPUs recover",
    PendingReason.QUOTA: "over its quota",
    PendingReason.PRIORITY: "it waits behind a job ahead of it in the order, which took "
                            "or holds the capacity it needs",
    PendingReason.BACKFILL_BLOCKED: "starting it now would delay the job the backfill "
                                    "holds capacity for",
    PendingReason.GPU_MODEL: "no GPU of the models it asks for (gpuModel) is free on a "
                             "node its nodeSelector and tolerations allow",
    PendingReason.PREEMPTING: "lower-priority work is stopping to make room for it",
    PendingReason.AFFINITY: "a required affinity or anti-affinity rule cannot be met now",
    PendingReason.NO_MATCHING_NODE: "its nodeSelector, or taints it does not tolerate, "
                                    "exclude every node",
    PendingReason.CORDONED: "there is room for it only on cordoned or draining nodes",
}


def placed_words(nodes: int, model: str, req: JobRequest | None, mig: str = "",
                 learnt: bool = False) -> str:
    """Why a job went where it went, for its history (``describe``): the nodes, and the
    GPU model with what made it the choice (its speeds, given or learnt from its class's
    earlier jobs, or its gpuModel order), or its MIG profile."""
    words = f"placed on {nodes} node(s)"
    if mig:
        return f"{words}, on MIG {mig} instances"
    if not model or req is None:
        return words
    if req.gpu_speeds:
        speeds = dict(req.gpu_speeds)
        best = max(speeds, key=lambda m: (speeds[m], m))
        here = relative_speeds(req, [model, best])[0]  # the core's rule for a model it lacks
        how = "learnt from its earlier jobs" if learnt else "its throughput"
        if here >= 0.999:
            return f"{words}, on {model}: where it runs fastest ({how})"
        return (f"{words}, on {model}: at {here:.2f}x its speed on {best} ({how}); the faster "
                f"GPUs were taken or kept for jobs that lose more here")
    if req.gpu_model_ranks:
        rank = dict(zip(req.gpu_models, req.gpu_model_ranks, strict=True)).get(model)
        if rank is not None:
            return f"{words}, on {model}: " + ("its first choice" if rank == 0 else (
                f"choice {rank + 1} of its gpuModel list; the ones before were taken"))
    return f"{words}, on {model}"


@dataclass(frozen=True, slots=True)
class _Said:
    attempt: int
    reason: str
    blocked_by: str | None
    estimate: float | None


class PendingNotices:
    """What was last said of each waiting job, to send only what changed."""

    def __init__(self, shift_s: float = 60.0) -> None:
        self.shift_s = shift_s
        self._said: dict[str, _Said] = {}
        self._sent: dict[str, int] = {}  # notices per job: their event ids

    def update(self, plan: Plan, admitted: Mapping[str, int], now: float, epoch: int,
               details: Mapping[str, str] | None = None) -> list[tuple[JobWaiting, str]]:
        """Notices for this cycle's plan: ``admitted`` maps each job still waiting for
        placement to its attempt; ``details`` words a job's reason in its spec's terms
        where the reason alone would not name the constraint. Returns (event, event id)
        pairs to publish."""
        reserved = {r.job_id: r for r in plan.reservations}
        out = []
        for job_id, reason in plan.pending.items():
            attempt = admitted.get(job_id)
            if attempt is None:
                continue
            res = reserved.get(job_id)
            est = res.start_time if res is not None and res.start_time > now else None
            behind = plan.blocked_by.get(job_id)
            last = self._said.get(job_id)
            if last is not None and last.attempt == attempt and last.reason == reason.value \
                    and last.blocked_by == behind and self._close(last.estimate, est):
                continue
            self._said[job_id] = _Said(attempt, reason.value, behind, est)
            n = self._sent[job_id] = self._sent.get(job_id, 0) + 1
            detail = (details or {}).get(job_id) or DETAIL.get(reason, reason.value)
            if res is not None:
                detail += f"; backfill holds {', '.join(res.node_ids)} for it"
            out.append((JobWaiting(
                job_id=job_id, attempt=attempt, reason=from_pending(reason.value),
                detail=detail, blocked_by=behind,
                estimated_start=datetime.fromtimestamp(est, UTC) if est is not None else None,
                epoch=epoch), f"waiting-{job_id}-{attempt}-e{epoch}-{n}"))
        for job_id in [j for j in self._said if j not in plan.pending]:
            del self._said[job_id]  # placed or gone: a later wait is news again
        for job_id in [j for j in self._sent if j not in admitted and j not in self._said]:
            del self._sent[job_id]
        return out

    def _close(self, a: float | None, b: float | None) -> bool:
        if a is None or b is None:
            return a is b
        return abs(a - b) < self.shift_s
