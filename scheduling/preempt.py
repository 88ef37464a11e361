"""Choosing victims: the least lost work that makes a blocked job fit.

Works on the *future* state (capacity once every terminating job has stopped). For
each replica that does not fit there, the candidate nodes holding eligible victims are
examined; on each, victims are taken cheapest first (elastic replicas above their
minimum, then lower priority, then least work lost since the last checkpoint) until
the replica fits, and the node whose set costs least wins. A job is never preempted
for unless the whole gang then fits: otherwise everything is rolled back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduling.framework import Cycle, JobInfo, Placing, RunningInfo
from scheduling.model import Allocation, Bind, GpuUse, PreemptReason
from scheduling.placer import Placer
from scheduling.state import BoolArray, ClusterState


@dataclass(slots=True)
class Unit:
    """What can be stopped: a whole job, or one replica of an elastic job (shrink)."""

    run: RunningInfo
    allocs: list[int]
    reason: PreemptReason
    shrink: bool
    lost: float
    replica: int = -1
    cost: tuple[object, ...] = field(default=())


def lost_work(cycle: Cycle, r: RunningInfo) -> float:
    """GPU-seconds since the job's last checkpoint (or start), lost if it stops now."""
    since = r.run.start_time
    if r.run.last_checkpoint_time is not None:
        since = max(since, r.run.last_checkpoint_time)
    return r.gpus * max(0.0, cycle.now - since)


def whole_unit(cycle: Cycle, r: RunningInfo, reason: PreemptReason) -> Unit:
    u = Unit(r, list(r.allocs), reason, False, lost_work(cycle, r))
    u.cost = (1, r.static_priority, u.lost, r.job.job_id, 0)
    return u


def shrink_units(cycle: Cycle, r: RunningInfo, taken: set[int]) -> list[Unit]:
    """The replicas of an elastic job above its minimum, highest index first."""
    out: list[Unit] = []
    allocs: Sequence[Allocation] = cycle.snapshot.allocations
    for t in r.job.tasks:
        if not t.elastic:
            continue
        mine = [(replica_of(allocs[a]), a) for a in r.allocs
                if task_of(allocs[a]) == t.name and a not in taken]
        mine.sort(reverse=True)
        for rep, a in mine[: max(0, len(mine) - t.least_replicas)]:
            u = Unit(r, [a], PreemptReason.SHRINK, True, 0.0, rep)
            u.cost = (0, r.static_priority, 0.0, r.job.job_id, -rep)
            out.append(u)
    return out


def task_of(a: Allocation) -> str:
    return a.task_name or a.task_id.rsplit("-", 1)[0]


def replica_of(a: Allocation) -> int:
    tail = a.task_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def release(st: ClusterState, cycle: Cycle, unit: Unit, gone: set[int]) -> list[int]:
    """Give back the unit's allocations not already gone; returns those it released."""
    index = cycle.table.index
    allocs = cycle.snapshot.allocations
    out = []
    for k in unit.allocs:
        if k in gone:
            continue
        a = allocs[k]
        i = index.get(a.node_id)
        if i is not None:
            st.release(i, a.cpu_milli, a.memory_mib, a.gpus)
        gone.add(k)
        out.append(k)
    return out


def preempt_for(placer: Placer, st: ClusterState, info: JobInfo, units: list[Unit],
                block: BoolArray | None, need: int, candidate_nodes: int
                ) -> tuple[list[Unit], list[Bind]] | None:
    """Victims and the binds (on ``st``) that place ``info``; None, untouched, if none do."""
    cycle = placer.cycle
    index = cycle.table.index
    allocs = cycle.snapshot.allocations
    on_node: dict[int, list[Unit]] = {}
    for u in sorted(units, key=lambda u: u.cost):
        seen: set[int] = set()
        for k in u.allocs:
            i = index.get(allocs[k].node_id)
            if i is not None and i not in seen:
                seen.add(i)
                on_node.setdefault(i, []).append(u)
    gone: set[int] = set()  # allocation indices released so far
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
                res = _with_victims(placer, p, base, on_node, gone, chosen, candidate_nodes)
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
    return chosen, binds


def _live(u: Unit, gone: set[int]) -> bool:
    return any(k not in gone for k in u.allocs)


def _with_victims(placer: Placer, p: Placing, base: BoolArray, on_node: dict[int, list[Unit]],
                  gone: set[int], chosen: list[Unit], candidate_nodes: int
                  ) -> tuple[int, tuple[GpuUse, ...]] | None:
    st = p.state
    # nodes that could hold the replica once their victims left, cheapest victims first
    opts = [i for i, us in on_node.items() if base[i] and any(_live(u, gone) for u in us)]
    if not opts:
        return None
    opts.sort(key=lambda i: (min(u.cost for u in on_node[i] if _live(u, gone)), i))
    best: tuple[tuple[object, ...], int, list[Unit]] | None = None
    for i in opts[:candidate_nodes]:
        m = st.mark()
        used: list[Unit] = []
        trial: list[int] = []
        ok = False
        for u in on_node[i]:
            if not _live(u, gone):
                continue
            trial += release(st, placer.cycle, u, gone)
            used.append(u)
            if _fits(placer, p, i):
                ok = True
                break
        st.rollback(m)
        gone.difference_update(trial)
        if ok:
            whole = [u for u in used if not u.shrink]
            cost = (bool(whole), max((u.run.static_priority for u in whole), default=-np.inf),
                    sum(u.lost for u in used), len(used), i)
            if best is None or cost < best[0]:
                best = (cost, i, used)
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
    if st.cpu_free[i] < t.cpu_milli or st.mem_free[i] < t.memory_mib:
        return False
    cand = np.asarray([i])
    for tm in placer.task_masks:
        r = tm.task_mask(placer.cycle, p, cand)
        if r is not None and not r[0]:
            return False
    return placer.pick(p, i) is not None
