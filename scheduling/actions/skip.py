"""The allocate action's bulk skip: with thousands of jobs waiting on a full cluster,
the jobs that would only hit a failure remembered this cycle, with nothing more to try
for them (no preemption, no reservation), get their reasons at once.

The plan is the same as trying them one by one (a property test holds it so): admission
(quotas) is still asked of each skipped job in order, and cannot change while nothing
starts.
"""

from __future__ import annotations

import numpy as np

from scheduling import jobcols as jc
from scheduling.actions.base import BlockedJobAction, ShapeGroups, settled
from scheduling.arrays import BoolArray
from scheduling.diagnosis import CAPACITY
from scheduling.framework import JobInfo, JobPriorities, Plugin
from scheduling.model import PendingReason
from scheduling.session import Session


class BulkSkip:
    """For one cycle: per ordered job, whether the memos settle it (kept until they grow)."""

    def __init__(self, s: Session, admit_hooks: list[Plugin], rescuers: list[BlockedJobAction]) -> None:
        self.s = s
        self.admit_hooks = admit_hooks
        self.rescuers = rescuers
        self.arrays: tuple[np.ndarray, ...] | None = None  # per ordered job, fixed for the cycle
        self.resolved: tuple[BoolArray, BoolArray, np.ndarray, dict[int, PendingReason]] | None = None
        self.resolved_soft: tuple[bool, float] = (False, np.inf)

    def skip(self, ordered: list[JobInfo], start: int) -> int:
        """Give the settled jobs from ``start`` on their reasons, up to the next job
        that must be tried; returns its position (the end when the rest is settled)."""
        s = self.s
        _, soft = s.block_for(ordered[start])
        info = ordered[start]
        reason = s.failed.get((info.shape, soft))
        if reason is None or (reason in CAPACITY and not settled(self.rescuers, s, info, soft)):
            return start  # the next job is to be tried anyway: no need to look further
        if s.memo_grew or self.resolved is None or self.resolved_soft != (s.any_soft, s.shadow):
            self.resolved = self._resolved(ordered)
            self.resolved_soft = (s.any_soft, s.shadow)
        ok, holds, codes, reasons = self.resolved
        rest = np.flatnonzero(~ok[start:])
        stop = start + int(rest[0]) if len(rest) else len(ordered)
        if stop == start:
            return start
        pend, cycle, hooks, ids = s.plan.pending, s.cycle, self.admit_hooks, s.plan.order
        if not hooks:  # all in C: no per-job Python with thousands waiting
            held = np.flatnonzero(holds[start:stop])
            end = start + int(held[0]) + 1 if len(held) else stop
            pend.update(zip(ids[start:end], map(reasons.__getitem__, codes[start:end].tolist()), strict=True))
            if len(held):  # a starved job without a reservation holds the line: nothing after it starts
                pend.update(dict.fromkeys(ids[end:], PendingReason.PRIORITY))
                s.plan.blocked_by.update(dict.fromkeys(ids[end:], ids[end - 1]))
                return len(ordered)
            return stop
        prios = cycle.get(JobPriorities)
        if prios is not None:
            prio = prios.priority[cycle.order[start:stop]].tolist()
            starved = prios.starved[cycle.order[start:stop]].tolist()
        code = codes[start:stop].tolist()
        for j in range(stop - start):
            info = ordered[start + j]
            if prios is not None:
                info.priority, info.starved = prio[j], starved[j]  # what the admit hooks see
            refused = None
            for p in hooks:
                refused = p.admit(cycle, info)
                if refused is not None:
                    break
            reason = pend[ids[start + j]] = refused or reasons[code[j]]
            if reason in CAPACITY and info.starved and prios is not None and prios.hold_line:
                pend.update(dict.fromkeys(ids[start + j + 1:], PendingReason.PRIORITY))
                s.plan.blocked_by.update(dict.fromkeys(ids[start + j + 1:], info.job.job_id))
                return len(ordered)
        return stop

    def _resolved(self, ordered: list[JobInfo]) -> tuple[BoolArray, BoolArray, np.ndarray, dict[int, PendingReason]]:
        """Per ordered job: whether it is settled by this cycle's memos, whether it then
        holds the line (starved, out of room, admitted), its memo code; and the reason
        of each code."""
        s = self.s
        if self.arrays is None:  # the jobs' shapes are fixed for the cycle: grouped once
            c, order = s.cycle.cols, s.cycle.order
            prios = s.cycle.get(JobPriorities)
            shapes, _, inverse = jc.groups(c[jc.SHAPE][order].astype(np.int64))
            _, pfirst, pinverse = jc.groups(c[jc.PSHAPE][order].astype(np.int64))
            self.arrays = (shapes, inverse, pfirst, pinverse, c[jc.ESTIMATE][order],
                           prios.starved[order] if prios is not None and prios.hold_line
                           else np.zeros(len(order), dtype=bool))  # (only those that hold the line)
        shapes, inverse, pfirst, pinverse, est, starved = self.arrays
        soft = ~(est + s.cycle.now <= s.shadow) if s.any_soft else np.zeros(len(est), dtype=bool)
        sides = soft.astype(np.int64)
        codes = shapes[inverse] * 2 + sides
        # the failure memo's verdict on each (shape, soft): looked up once per group
        reasons: dict[int, PendingReason] = {}
        known = np.zeros((len(shapes), 2), dtype=bool)
        capacity = np.zeros((len(shapes), 2), dtype=bool)
        failed = s.failed
        for m, k in enumerate(shapes.tolist()):
            for side in (0, 1):
                r = failed.get(((k,), bool(side)))  # the memo's key: (info.shape, soft)
                if r is not None:
                    reasons[2 * k + side], known[m, side], capacity[m, side] = r, True, r in CAPACITY
        ok = known[inverse, sides]
        cap = capacity[inverse, sides]
        if cap.any():
            live = cap & ok
            groups = ShapeGroups(pfirst, pinverse, sides)
            untried = np.zeros(len(ok), dtype=bool)
            for a in self.rescuers:
                untried |= a.unsettled(s, ordered, groups, live)
            ok &= ~(cap & untried)
        return ok, ok & cap & starved, codes, reasons
