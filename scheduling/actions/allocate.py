"""The allocate action: the pending jobs in order, each admitted (quotas, fairness)
and placed whole, or given the reason it waits.

A job that does not fit for want of room is offered, right then, to the blocked-job
actions (preempt, backfill) in config order. Failures are remembered per job shape for
the cycle, so a thousand jobs alike cost one placement attempt; once nothing more can
be tried for them, the rest get their reasons in bulk (scheduling.actions.skip).
"""

from __future__ import annotations

from typing import ClassVar

from scheduling.actions.base import Action, BlockedJobAction, settled
from scheduling.actions.skip import BulkSkip
from scheduling.diagnosis import CAPACITY, why_pending
from scheduling.framework import JobInfo, JobPriorities, Plugin
from scheduling.model import PendingReason
from scheduling.session import Session


class Allocate(Action):
    name = "allocate"
    bulk: ClassVar[bool] = True  # False: every job tried one by one (the reference for the bulk path's test)

    def __init__(self, admit_hooks: list[Plugin], rescuers: list[BlockedJobAction]) -> None:
        self.admit_hooks = admit_hooks
        self.rescuers = rescuers  # the blocked-job actions, in config order

    def execute(self, s: Session) -> None:
        cycle, ordered = s.cycle, s.ordered
        pend = s.plan.pending
        skip = BulkSkip(s, self.admit_hooks, self.rescuers)
        prios = cycle.get(JobPriorities)
        if prios is not None:
            prio = prios.priority[cycle.order].tolist()
            starved = prios.starved[cycle.order].tolist()
        pos, n = 0, len(ordered)
        while pos < n:
            info = ordered[pos]
            if prios is not None:
                info.priority, info.starved = prio[pos], starved[pos]
            s.memo_grew = False
            reason = self._allocate(s, info)
            pos += 1
            if reason is not None:
                pend[info.job.job_id] = reason
                if reason in CAPACITY and info.starved and prios is not None and prios.hold_line and not any(
                        r.job_id == info.job.job_id for r in s.plan.reservations):
                    # A starved job without a reservation (no backfill, or no estimate tells
                    # when it could start) holds the line: nothing after it starts.
                    pend.update(dict.fromkeys(s.plan.order[pos:], PendingReason.PRIORITY))
                    s.plan.blocked_by.update(dict.fromkeys(s.plan.order[pos:], info.job.job_id))
                    break
            if self.bulk and pos < n:
                pos = skip.skip(ordered, pos)

    def _allocate(self, s: Session, info: JobInfo) -> PendingReason | None:
        cycle = s.cycle
        for p in self.admit_hooks:
            r = p.admit(cycle, info)
            if r is not None:
                return r
        block, soft = s.block_for(info)
        key = (info.shape, soft)
        reason = s.failed.get(key)
        if reason is not None and (reason not in CAPACITY or settled(self.rescuers, s, info, soft)):
            return reason  # the same ask failed this cycle and nothing more can be tried
        if reason is None:
            binds, placed = s.placer.place_job(cycle.state, info, block, info.min_members)
            if binds is not None:
                s.commit(info, binds)
                return None
            reason = why_pending(s, info, block, placed)
            s.failed[key] = reason
            s.memo_grew = True
        if reason in CAPACITY:
            for a in self.rescuers:
                instead = a.rescue(s, info, block, soft)
                if instead is not None:
                    return instead
        return reason
