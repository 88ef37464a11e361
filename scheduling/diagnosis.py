"""Why a job is left pending: the one ``PendingReason`` a job that did not fit gets.

Asked once per job shape and cycle (the allocate action memoises the answer), so it
may try a placement; the answer says what would have to change for the job to start.
"""

from __future__ import annotations

from scheduling.arrays import BoolArray
from scheduling.framework import JobInfo
from scheduling.model import PendingReason
from scheduling.session import Session

# for want of room now: a preemption or a reservation may still help
CAPACITY = (PendingReason.NO_FIT, PendingReason.GANG_INCOMPLETE, PendingReason.AFFINITY,
            PendingReason.GPU_MODEL)
# reasons a cordoned node's room may explain
_ROOM = (PendingReason.NO_FIT, PendingReason.GANG_INCOMPLETE, PendingReason.NEVER_FITS,
         PendingReason.NO_MATCHING_NODE)


def why_pending(s: Session, info: JobInfo, block: BoolArray | None, placed: int) -> PendingReason:
    """Why the job did not fit with ``block`` kept off; ``placed``: replicas that did."""
    tbl, job, placer = s.cycle.table, info.job, s.placer
    statics = [placer.static_mask(info, t) for t in info.tasks]
    if not all(m.any() for m in statics):
        return PendingReason.GPU_MODEL if job.gpu_models else PendingReason.NO_MATCHING_NODE
    for t, m in zip(info.tasks, statics, strict=True):
        if (t.gpu > tbl.gpu_count[m].max() or t.cpu_milli > tbl.cpu_total[m].max()
                or t.memory_mib > tbl.mem_total[m].max()):
            return PendingReason.NEVER_FITS
    whole = sum(t.gpu * t.replicas for t in info.tasks)
    if whole and info.min_members >= sum(t.replicas for t in info.tasks) and (
            whole > int(tbl.gpu_count[tbl.schedulable].sum())):
        return PendingReason.NEVER_FITS
    if block is not None and block.any():
        st = s.cycle.state  # a trial, undone: cheaper than a copy, whose caches start empty
        mark = st.mark()
        binds, _ = placer.place_job(st, info, None, info.min_members)
        st.rollback(mark)
        if binds is not None:
            return PendingReason.BACKFILL_BLOCKED if (s.soft & ~s.hard).any() else PendingReason.PRIORITY
    if job.gpu_models:
        return PendingReason.GPU_MODEL
    if any(r.required for r in job.affinity):
        return PendingReason.AFFINITY
    return PendingReason.GANG_INCOMPLETE if placed else PendingReason.NO_FIT


def blame_cordon(s: Session) -> None:
    """A job left pending for want of room that a cordoned node has free now says
    ``cordoned``: uncordoning is what would start it. Only the reason changes."""
    tbl, st = s.cycle.table, s.cycle.state
    pend = s.plan.pending
    for info in s.infos:
        if pend.get(info.job.job_id) in _ROOM and any(
                s.placer.fit_mask(st, t, tbl.cordoned).any() for t in info.tasks):
            pend[info.job.job_id] = PendingReason.CORDONED
