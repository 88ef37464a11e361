"""Why a job is left pending: the one ``PendingReason`` a job that did not fit gets.

Asked once per job shape and cycle (the allocate action memoises the answer), so it
may try a placement; the answer says what would have to change for the job to start.

Waiting for room (``no_fit``) and waiting behind work ahead in the order
(``priority``, naming that job in ``Plan.blocked_by``) differ the way Slurm's
``Resources`` and ``Priority`` do: a job is behind earlier work when it would fit
without it. Two tests, both undone trials:

- nodes held for earlier jobs (a preemptor's claim, backfill's reservation): it fits
  with them allowed (``why_pending``); the holder of a node it used is named;
- capacity this cycle's earlier placements took: it fits with their binds released
  (``name_blockers``, after the actions); the first of them whose node it used is named.

Anything else, e.g. room held by running jobs, is ``no_fit``: no order would help.
"""

from __future__ import annotations

from scheduling.arrays import BoolArray
from scheduling.framework import JobInfo
from scheduling.model import Bind, PendingReason
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
        if t.mig and not tbl.mig_count(t.mig_profile)[m].any():
            return PendingReason.NEVER_FITS  # no node has an instance of its MIG profile
    whole = sum(t.gpu * t.replicas for t in info.tasks)
    gang = info.min_members >= sum(t.replicas for t in info.tasks)
    if gang and whole and whole > int(tbl.gpu_count[tbl.schedulable].sum()):
        return PendingReason.NEVER_FITS
    mig: dict[str, int] = {}
    for t in info.tasks:
        if t.mig:
            mig[t.mig_profile] = mig.get(t.mig_profile, 0) + t.replicas
    if gang and any(n > int(tbl.mig_count(p)[tbl.schedulable].sum()) for p, n in mig.items()):
        return PendingReason.NEVER_FITS
    if block is not None and block.any():
        st = s.cycle.state  # a trial, undone: cheaper than a copy, whose caches start empty
        mark = st.mark()
        binds, _ = placer.place_job(st, info, None, info.min_members)
        st.rollback(mark)
        if binds is not None:
            holder = s.holder_of({b.node_id for b in binds})
            if holder is not None:
                s.blockers[info.shape] = holder
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


# name_blockers' bounds on what it may cost a cycle: shapes tried, and binds released
# (releasing and restoring them dominates; a cycle that placed more, e.g. the first with
# a long backlog, leaves its jobs no_fit, which they say anyway once those jobs run)
MAX_TRIALS = 4
MAX_RELEASED = 64
_BEHIND = (PendingReason.PRIORITY, PendingReason.BACKFILL_BLOCKED)
_NO_ROOM = (PendingReason.NO_FIT, PendingReason.GANG_INCOMPLETE)


def name_blockers(s: Session) -> None:
    """After the actions: every job waiting behind earlier work names it. A job left
    without room that fits once this cycle's placements are released, on a node an
    earlier-ordered placement took, waits for ``priority`` behind that job; jobs of a
    shape ``why_pending`` found held off name the holder it found. Only reasons change."""
    plan = s.plan
    release = 0 < len(plan.binds) <= MAX_RELEASED
    if not release and not s.blockers:
        return  # nothing placed (or too much to release) nor held: nothing to name
    pend, blocked = plan.pending, plan.blocked_by
    by_job = plan.binds_by_job()  # in the order placed, which is the order tried
    placed = list(by_job)
    earlier: set[str] = set()
    taken: dict[object, str | None] = {}  # shape -> the first placement its trial overlapped
    st = s.cycle.state
    mark: int | None = None
    try:
        for job_id, info in zip(plan.order, s.ordered, strict=True):
            if job_id in by_job:
                earlier.add(job_id)
                continue
            r = pend.get(job_id)
            if r in _BEHIND and job_id not in blocked:
                b = s.blockers.get(info.shape)
                if b is not None:
                    blocked[job_id] = b
            elif r in _NO_ROOM and earlier and release:
                if info.shape not in taken:
                    if len(taken) >= MAX_TRIALS:
                        continue
                    if mark is None:  # the cycle's free capacity before its placements
                        mark = st.mark()
                        for binds in by_job.values():
                            s.placer.apply_binds(st, binds, sign=-1)
                    taken[info.shape] = _first_overlap(s, info, by_job, placed)
                b = taken[info.shape]
                if b is not None and b in earlier:  # placed before it: it took the room
                    pend[job_id] = PendingReason.PRIORITY
                    blocked[job_id] = b
    finally:
        if mark is not None:
            st.rollback(mark)


def _first_overlap(s: Session, info: JobInfo, by_job: dict[str, list[Bind]],
                   placed: list[str]) -> str | None:
    """The first placed job whose nodes the job's trial placement uses (None: it does
    not fit even on the cycle's free capacity)."""
    st = s.cycle.state
    mark = st.mark()
    binds, _ = s.placer.place_job(st, info, None, info.min_members)
    st.rollback(mark)
    if binds is None:
        return None
    used = {b.node_id for b in binds}
    return next((j for j in placed if any(b.node_id in used for b in by_job[j])), None)
