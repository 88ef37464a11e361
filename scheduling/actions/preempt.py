"""The preempt action: a job blocked for want of room takes it from lower-priority
running jobs (shrinking elastic ones first), within a budget of preemptors per cycle.

It plans on the future state (every job already asked to stop has stopped): if that
alone holds the job, it claims the room and stops no one more. The nodes it claims are
kept off for the jobs after it; the job itself waits, ``preempting``.
"""

from __future__ import annotations

import numpy as np

from scheduling.actions.base import BlockedJobAction, ShapeGroups
from scheduling.arrays import BoolArray
from scheduling.config import PreemptionSettings
from scheduling.framework import JobInfo, Plugin
from scheduling.model import PendingReason, Preemption, Resize, ResizeReason, Resources
from scheduling.session import Session, demand_of
from scheduling.victims import Unit, VictimIndex, alloc_gpus, preempt_for, task_of

_Key = tuple[object, ...]  # (job shape, static priority, tenant, soft): who asks, as the memos key it


class Preempt(BlockedJobAction):
    name = "preempt"

    def __init__(self, settings: PreemptionSettings, victim_hooks: list[Plugin], shrink: bool) -> None:
        self.settings = settings
        self.victim_hooks = victim_hooks
        self.shrink = shrink  # elastic jobs give replicas back before anyone is preempted
        # kept across cycles: asks whose victim search found nothing last cycle (they sit
        # the next search out, so the budget reaches the jobs behind them)
        self.backoff: set[_Key] = set()
        self.open_cycle()

    def open_cycle(self) -> None:
        self.budget = self.settings.max_preemptors_per_cycle  # searches left this cycle
        self.no_victims: set[_Key] = set()  # asks that will not search again this cycle
        self.fruitless: set[_Key] = set()  # searches that found nothing this cycle
        self.vix: VictimIndex | None = None

    def open(self, s: Session) -> None:
        self.open_cycle()

    def close(self) -> None:
        self.backoff = self.fruitless

    @property
    def may_preempt(self) -> bool:
        """Blocked jobs may still look for victims this cycle (found or not, a search
        counts: one that finds none costs as much)."""
        return self.budget > 0

    def rescue(self, s: Session, info: JobInfo, block: BoolArray | None, soft: bool) -> PendingReason | None:
        # a failed attempt is remembered per shape, priority and tenant: victims only
        # get scarcer during the cycle, so the same ask would fail again
        key = (info.shape, info.static_priority, info.job.tenant, soft)
        if self.may_preempt and key not in self.no_victims:
            if key in self.backoff:
                # found no victims last cycle: it sits this one out, and the budget
                # goes to jobs behind it (else the same few blocked jobs at the head
                # would spend it every cycle and nobody behind them would ever look)
                self.no_victims.add(key)
            elif self._preempt(s, info, block):
                return PendingReason.PREEMPTING
            else:
                self.no_victims.add(key)
                self.fruitless.add(key)
            s.memo_grew = True
        return None

    def settled(self, s: Session, info: JobInfo, soft: bool) -> bool:
        return not (self.may_preempt and (info.shape, info.static_priority, info.job.tenant, soft)
                    not in self.no_victims)

    def unsettled(self, s: Session, ordered: list[JobInfo], groups: ShapeGroups, live: BoolArray) -> BoolArray:
        if not self.may_preempt:
            return np.zeros(len(live), dtype=bool)
        # per (shape, priority, tenant) and soft: whether a preemption is still to be tried
        first, inverse, sides = groups
        todo = np.zeros((len(first), 2), dtype=bool)
        todo[inverse[live], sides[live]] = True
        for m, side in np.argwhere(todo).tolist():
            info = ordered[int(first[m])]  # any job of the group: they share the memo's key
            if (info.shape, info.static_priority, info.job.tenant, bool(side)) in self.no_victims:
                todo[m, side] = False
        return todo[inverse, sides]

    def _preempt(self, s: Session, info: JobInfo, block: BoolArray | None) -> bool:
        self.budget -= 1
        fut = s.future_state()
        # already room once the terminating jobs are gone: claim it, preempt no one more
        binds, _ = s.placer.place_job(fut, info, block, info.min_members)
        if binds is None:
            if self.vix is None:
                self.vix = VictimIndex(s.cycle, self.shrink)
                self.vix.gone = s.gone
            res = preempt_for(s.placer, fut, info, self.vix, self.victim_hooks, block,
                              info.min_members, self.settings.candidate_nodes)
            if res is None:
                return False
            chosen, binds = res
            self._emit(s, info, chosen)
        s.claim(binds)
        s.account(info.job.tenant, demand_of(binds))  # its quota is held while it waits
        return True

    def _emit(self, s: Session, info: JobInfo, chosen: list[Unit]) -> None:
        allocs = s.cycle.snapshot.allocations
        stopped = {u.run.job.job_id for u in chosen if not u.shrink}
        shrinks: dict[tuple[str, str], list[Unit]] = {}
        for u in chosen:
            jid = u.run.job.job_id
            if u.shrink and jid not in stopped:
                shrinks.setdefault((jid, task_of(allocs[u.allocs[0]])), []).append(u)
            elif not u.shrink:
                s.victims.add(jid)
                s.plan.preemptions.append(Preemption(
                    jid, u.reason, info.job.job_id, u.run.job.checkpoint_grace_s,
                    tuple(allocs[k].task_id for k in u.run.allocs),
                    tuple(sorted({allocs[k].node_id for k in u.run.allocs}))))
                s.account(u.run.job.tenant, u.run.demand, -1)
        for (jid, tname), us in shrinks.items():
            r = us[0].run
            stop = tuple(allocs[u.allocs[0]].task_id for u in us)
            current = len(us) + sum(1 for k in r.allocs if task_of(allocs[k]) == tname and not s.gone[k])
            for u in us:
                a = allocs[u.allocs[0]]
                s.account(r.job.tenant, Resources(alloc_gpus(a), a.cpu_milli, a.memory_mib), -1)
            s.plan.resizes.append(Resize(jid, tname, current, current - len(us), ResizeReason.SHRINK,
                                         stop_task_ids=stop, for_job=info.job.job_id,
                                         grace_period_s=r.job.checkpoint_grace_s))
