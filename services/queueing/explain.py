"""What a cycle tells about a tree: each waiting job's position, reason and estimated
start, and each queue's status (quota, counts, waiting list).

Pure, like ``admit.py`` whose decision it reads; ``now`` is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from services.queueing.admit import Admission, HeldJob, Wait
from services.queueing.quota import EPS, QuotaState, WaitReason
from shared.events import QueueStatus, WaitingJob
from shared.queuespec import RESOURCES

MAX_WAITING_LISTED = 500  # a queue's status lists this many of its waiting jobs


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@dataclass(frozen=True, slots=True)
class Notice:
    """A job whose reason to wait changed: its history gets a ``pending`` status."""

    job: HeldJob
    wait: Wait


def waiting_lists(decision: Admission, jobs: Sequence[HeldJob], now: float
                  ) -> tuple[dict[str, list[WaitingJob]], list[Notice]]:
    """Each queue's waiting jobs as listed, and the jobs whose reason changed."""
    listed: dict[str, list[WaitingJob]] = {}
    notices: list[Notice] = []
    for q, waiting in decision.queued.items():
        items = []
        ahead = 0.0  # GPUs of the jobs ahead that wait for this queue's quota
        for pos, j in enumerate(waiting, 1):
            wait = decision.waits[j.held.request.job_id]
            est = None
            if wait.reason is WaitReason.QUOTA:
                est = _estimate(q, ahead + j.held.demand[0], jobs, decision.quota, now)
                ahead += j.held.demand[0]
            items.append(WaitingJob(job_id=j.job_id, position=pos, reason=wait.reason,
                                    detail=wait.detail, blocked_by=wait.blocked_by,
                                    estimated_start=utc(est) if est else None))
            if j.row.reason != wait.reason.value:
                notices.append(Notice(j, wait))
        listed[q] = items
    return listed, notices


def _estimate(queue: str, need_gpus: float, jobs: Sequence[HeldJob], quota: QuotaState,
              now: float) -> float | None:
    """When enough of the queue's own GPUs come back for ``need_gpus`` (this job and
    those ahead of it), from the runtime estimates of the jobs holding them; None when
    one of those has no estimate (or the queue has no GPU quota)."""
    tree = quota.tree
    if not tree.limited[tree.top_of[queue]][0]:
        return None
    excess = quota.used[queue][0] + need_gpus - tree.nominal[queue][0]
    if excess <= EPS:
        return None  # not its own quota that is short: a cohort's
    ends = []
    for j in jobs:
        r = j.row
        if r.queue != queue or r.state != "admitted":
            continue
        est = j.held.request.runtime_estimate_s
        if est is None or r.started_at is None:
            ends.append((float("inf"), j.held.demand[0]))
        else:
            ends.append((max(now, r.started_at.timestamp() + est), j.held.demand[0]))
    freed = 0.0
    for end, gpus in sorted(ends):
        if end == float("inf"):
            return None
        freed += gpus
        if freed + EPS >= excess:
            return end
    return None


def queue_statuses(queues: Sequence[str], jobs: Sequence[HeldJob], decision: Admission,
                   listed: dict[str, list[WaitingJob]]) -> list[QueueStatus]:
    """Every queue of the tree as it stands after the decision."""
    admitted_now = {j.held.request.job_id for j, _ in decision.admitted}
    counts: dict[str, list[int]] = {q: [0, 0, 0] for q in queues}  # pending, admitted, running
    for j in jobs:
        r = j.row
        c = counts[r.queue]
        if r.state == "queued" and r.job_id not in admitted_now:
            c[0] += 1
        elif r.phase == "running":
            c[2] += 1
        else:
            c[1] += 1
    quota = decision.quota
    tree = quota.tree
    out = []
    for q in queues:
        spec = tree.specs[q]
        g = spec.guaranteed.values() if spec.guaranteed else (None, None, None)
        out.append(QueueStatus(
            queue=q, tenant=tree.tenant(q), state=spec.state.value,
            guaranteed=dict(zip(RESOURCES, g, strict=True)),
            used=dict(zip(RESOURCES, quota.used[q], strict=True)),
            borrowed=dict(zip(RESOURCES, quota.borrowed(q), strict=True)),
            used_by_model=decision.quotas.used_by_model(q),
            pending=counts[q][0], admitted=counts[q][1], running=counts[q][2],
            waiting=listed.get(q, [])[:MAX_WAITING_LISTED]))
    return out
