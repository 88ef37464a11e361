"""Choosing victims: the least lost work that makes a blocked job fit.

Works on the *future* state (capacity once every terminating job has stopped). For
each replica that does not fit there, the candidate nodes holding eligible victims are
examined; on each, victims are taken cheapest first (elastic replicas above their
minimum, then lower priority, then least work lost since the last checkpoint) until
the replica fits, and the node whose set costs least wins. A job is never preempted
for unless the whole gang then fits: otherwise everything is rolled back.

``VictimIndex`` holds, once per cycle, the allocations as arrays (job, node, GPUs) so
that finding candidate nodes for a preemptor is a handful of numpy operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduling.arrays import BoolArray, FloatArray, IntArray
from scheduling.framework import Cycle, JobInfo, Placing, Plugin, RunningInfo
from scheduling.model import Allocation, Bind, GpuUse, PreemptReason
from scheduling.placer import Placer
from scheduling.state import ClusterState


def task_of(a: Allocation) -> str:
    return a.task_name or a.task_id.rsplit("-", 1)[0]


def replica_of(a: Allocation) -> int:
    tail = a.task_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def alloc_gpus(a: Allocation) -> float:
    return sum(u.share for u in a.gpus)


@dataclass(slots=True)
class Unit:
    """What can be stopped: a whole job, or one replica of an elastic job (shrink)."""

    run: RunningInfo
    run_index: int
    allocs: list[int]
    reason: PreemptReason
    shrink: bool
    lost: float
    cost: tuple[object, ...]


class VictimIndex:
    """The cycle's allocations and running jobs as arrays, and who is already gone."""

    def __init__(self, cycle: Cycle, shrink: bool) -> None:
        self.cycle = cycle
        allocs = cycle.snapshot.allocations
        a_n = len(allocs)
        self.node: IntArray = cycle.alloc_node
        self.gpu: FloatArray = cycle.alloc_gpu
        self.run: IntArray = cycle.alloc_run
        self.gone: BoolArray = np.zeros(a_n, dtype=bool)
        self.taken: BoolArray = np.zeros(len(cycle.running), dtype=bool)
        self.rt = cycle.runs()
        # allocations of no known running job index one padding slot (never a victim), so
        # the lookups in ``candidates`` also hold when the snapshot lists no running jobs
        n_run = len(cycle.running)
        self._run_padded: IntArray = np.where(self.run >= 0, self.run, n_run)
        self._has_run: BoolArray = (self.run >= 0) & (self.node >= 0)  # allocations on unknown nodes: ignored
        self._static_padded: FloatArray = np.append(self.rt.static, np.inf)
        # elastic replicas above their minimum, highest replica index first
        self.excess: BoolArray = np.zeros(a_n, dtype=bool)
        self.replica: IntArray = np.zeros(a_n, dtype=np.int64)
        if shrink:
            for r in cycle.running:
                if not r.elastic:
                    continue
                for t in r.job.tasks:
                    if not t.elastic:
                        continue
                    mine = sorted(((replica_of(allocs[k]), k) for k in r.allocs
                                   if task_of(allocs[k]) == t.name), reverse=True)
                    for rep, k in mine[: max(0, len(mine) - t.least_replicas)]:
                        self.excess[k] = True
                        self.replica[k] = rep
        self.any_excess = bool(self.excess.any())

    def mark_gone(self, ks: list[int] | IntArray) -> None:
        self.gone[ks] = True

    def candidates(self, info: JobInfo, plugins: list[Plugin]) -> tuple[BoolArray, BoolArray]:
        """Allocations that may be stopped for ``info``: whole jobs, and shrinkable
        replicas (each running job's reason is kept for ``units_on``)."""
        n_run = len(self.cycle.running)
        elig = np.zeros(n_run, dtype=bool)
        reason_of = np.full(n_run, -1, dtype=np.int64)
        reasons: list[PreemptReason] = []
        for p in plugins:
            for mask, why in p.victims(self.cycle, info):
                new = mask & ~elig
                reason_of[new] = len(reasons)
                reasons.append(why)
                elig |= mask
        self._reason_of = reason_of
        self._reasons = reasons
        run = self._run_padded
        if reasons:
            elig &= ~self.rt.protected & ~self.taken
            whole = self._has_run & np.append(elig, False)[run] & ~self.gone
        else:
            whole = np.zeros(len(run), dtype=bool)
        if not self.any_excess:  # no elastic replica above its minimum: nothing to shrink
            return whole, np.zeros(len(run), dtype=bool)
        shrink = (self.excess & ~self.gone & self._has_run & ~np.append(self.rt.protected | self.taken, True)[run]
                  & (self._static_padded[run] <= info.static_priority))
        return whole, shrink

    def units_on(self, i: int, whole: BoolArray, shrink: BoolArray) -> list[Unit]:
        """Victim units with an allocation on node ``i``, cheapest first."""
        cycle, rt = self.cycle, self.rt
        out: list[Unit] = []
        seen: set[int] = set()
        for k in np.flatnonzero((self.node == i) & (whole | shrink)).tolist():
            ri = int(self.run[k])
            r = cycle.running[ri]
            if shrink[k]:
                out.append(Unit(r, ri, [k], PreemptReason.SHRINK, True, 0.0,
                                (0, float(rt.static[ri]), 0.0, r.job.job_id, -int(self.replica[k]))))
            elif ri not in seen:
                seen.add(ri)
                live = [a for a in r.allocs if not self.gone[a]]
                why = self._reasons[int(self._reason_of[ri])]
                out.append(Unit(r, ri, live, why, False, float(rt.lost[ri]),
                                (1, float(rt.static[ri]), float(rt.lost[ri]), r.job.job_id, 0)))
        out.sort(key=lambda u: u.cost)
        return out


def release(st: ClusterState, cycle: Cycle, unit: Unit, gone: BoolArray, node: int = -1,
            where: IntArray | None = None) -> list[int]:
    """Give back the unit's allocations not already gone (only those on ``node`` when it
    is given: enough to test a fit there); returns those it released."""
    index = cycle.table.index
    allocs = cycle.snapshot.allocations
    out = []
    for k in unit.allocs:
        if gone[k] or (where is not None and where[k] != node):
            continue
        a = allocs[k]
        i = index.get(a.node_id)
        if i is not None:
            st.release(i, a.cpu_milli, a.memory_mib, a.gpus)
        gone[k] = True
        out.append(k)
    return out


def preempt_for(placer: Placer, st: ClusterState, info: JobInfo, vix: VictimIndex, plugins: list[Plugin],
                block: BoolArray | None, need: int, candidate_nodes: int
                ) -> tuple[list[Unit], list[Bind]] | None:
    """Victims and the binds (on ``st``) that place ``info``; None, untouched, if none do."""
    cycle = placer.cycle
    whole, shrink = vix.candidates(info, plugins)
    if not (whole.any() or shrink.any()):
        return None
    # cheap bound first: the free GPUs and every candidate's together must cover the job
    want = sum(t.gpu * t.replicas for t in info.tasks) if need >= sum(t.replicas for t in info.tasks) else 0
    if want and float(st.cmp_sum[~block].sum() if block is not None else st.cmp_sum.sum()) / 100.0 + float(
            vix.gpu[(whole | shrink) & (vix.node >= 0)].sum()) < want - 1e-9:
        return None
    gone = vix.gone.copy()  # released within this attempt; adopted only on success
    chosen: list[Unit] = []
    mark = st.mark()
    binds: list[Bind] = []
    nodes: list[int] = []
    roles: list[str] = []
    remaining = sum(t.replicas for t in info.tasks)
    strict = need >= remaining
    for task in info.tasks:
        base = placer.static_mask(info, task)
        if block is not None:
            base = base & ~block
        p = Placing(info, task, st, remaining, nodes, roles)
        for r in range(task.replicas):
            p.remaining = remaining
            res = placer.choose(p, base)
            if res is None:
                res = _with_victims(placer, p, base, vix, whole & ~gone, shrink & ~gone, gone, chosen,
                                    candidate_nodes)
            if res is None:
                if strict:
                    st.rollback(mark)
                    return None
                remaining -= task.replicas - r
                break
            i, uses = res
            st.take(i, task.cpu_milli, task.memory_mib, uses)
            binds.append(Bind(info.job.job_id, f"{task.name}-{r}", task.name, r,
                              cycle.table.node_ids[i], uses, task.cpu_milli, task.memory_mib, task.role))
            nodes.append(i)
            roles.append(task.role)
            remaining -= 1
    if len(binds) < need or not chosen:
        st.rollback(mark)
        return None
    st.commit(mark)
    vix.gone[:] = gone
    for u in chosen:
        if not u.shrink:
            vix.taken[u.run_index] = True
    return chosen, binds


def _with_victims(placer: Placer, p: Placing, base: BoolArray, vix: VictimIndex, whole: BoolArray,
                  shrink: BoolArray, gone: BoolArray, chosen: list[Unit], candidate_nodes: int
                  ) -> tuple[int, tuple[GpuUse, ...]] | None:
    st, t, tbl = p.state, p.task, placer.table
    ok = whole | shrink
    if not ok.any():
        return None
    nodes = vix.node[ok]
    # an upper bound: what the node would have free if every candidate there stopped
    free_gpu = st.cmp_sum / 100.0 + np.bincount(nodes, weights=vix.gpu[ok], minlength=tbl.n)
    has = np.zeros(tbl.n, dtype=bool)
    has[nodes] = True
    cand = np.flatnonzero(has & base & (free_gpu >= t.gpu_amount - 1e-9))
    if cand.size == 0:
        return None
    # cheapest first: the lowest-priority victim on the node (a shrink counts lowest)
    cost = np.where(shrink[ok], -np.inf, vix.rt.static[vix.run[ok]])
    low = np.full(tbl.n, np.inf)
    np.minimum.at(low, nodes, cost)
    cand = cand[np.lexsort((cand, -st.cmp_sum[cand], low[cand]))][:candidate_nodes]
    best: tuple[tuple[object, ...], int, list[Unit]] | None = None
    for i in cand.tolist():
        m = st.mark()
        used: list[Unit] = []
        trial: list[int] = []
        fits = False
        for u in vix.units_on(i, whole & ~gone, shrink & ~gone):
            trial += release(st, placer.cycle, u, gone, i, vix.node)  # the fit test is node-local
            used.append(u)
            if _fits(placer, p, i):
                fits = True
                break
        st.rollback(m)
        gone[trial] = False
        if fits:
            stops = [u for u in used if not u.shrink]
            key = (bool(stops), max((u.run.static_priority for u in stops), default=-np.inf),
                   sum(u.lost for u in used), len(used), i)
            if best is None or key < best[0]:
                best = (key, i, used)
    if best is None:
        return None
    _, i, used = best
    for u in used:
        release(st, placer.cycle, u, gone)
        chosen.append(u)
    uses = placer.pick(p, i) if _fits(placer, p, i) else None
    return None if uses is None else (i, uses)


def _fits(placer: Placer, p: Placing, i: int) -> bool:
    st, t = p.state, p.task
    if st.cpu_free[i] < t.cpu_milli or st.mem_free[i] < t.memory_mib or st.idle[i] < t.gpu:
        return False  # (whole GPUs must be wholly free: no pick could place them)
    cand = np.asarray([i])
    for tm in placer.task_masks:
        r = tm.task_mask(placer.cycle, p, cand)
        if r is not None and not r[0]:
            return False
    return placer.pick(p, i) is not None
