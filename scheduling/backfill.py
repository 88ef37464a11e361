"""EASY backfill: when and where the blocked head job can start.

Running jobs end at ``start + runtime estimate`` (jobs without one never end, unless
the backfill plugin gives a default). Releasing them in that order on a scratch copy
of the state, the first moment the head job fits is its reserved start ("shadow
time"), and the nodes it would use there are its reservation. Later jobs may use those
nodes only if their own estimate ends before the shadow time.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduling.framework import Cycle, JobInfo, RunningInfo
from scheduling.model import Reservation
from scheduling.placer import Placer
from scheduling.state import BoolArray, ClusterState

MAX_TRIALS = 48  # full placement trials per reservation; cheap bounds screen the rest


def _could_fit(st: ClusterState, info: JobInfo) -> bool:
    """A necessary condition, O(nodes): enough idle GPUs overall and on some node."""
    whole = sum(t.gpu * t.replicas for t in info.tasks if t.gpu)
    if whole and int(st.idle.sum()) < whole:
        return False
    return all(int(st.idle.max(initial=0)) >= t.gpu for t in info.tasks if t.gpu)


def reserve(placer: Placer, base: ClusterState, info: JobInfo, need: int,
            running: Iterable[RunningInfo], default_runtime_s: float | None,
            gone: BoolArray) -> Reservation | None:
    cycle: Cycle = placer.cycle
    ends: list[tuple[float, str, RunningInfo]] = []
    for r in running:
        est = r.job.runtime_estimate_s if r.job.runtime_estimate_s is not None else default_runtime_s
        if est is None:
            continue
        ends.append((max(cycle.now, r.run.start_time + est), r.job.job_id, r))
    ends.sort(key=lambda e: (e[0], e[1]))
    if not ends:
        return None  # nothing is known to end: no start time to promise
    st = base.copy()
    allocs = cycle.snapshot.allocations
    index = cycle.table.index
    trials = 0
    for k, (end, _, r) in enumerate(ends):
        for a in r.allocs:
            if gone[a]:
                continue  # already released in the base state
            i = index.get(allocs[a].node_id)
            if i is not None:
                st.release(i, allocs[a].cpu_milli, allocs[a].memory_mib, allocs[a].gpus)
        last_of_batch = k + 1 == len(ends) or ends[k + 1][0] > end
        if not last_of_batch or not _could_fit(st, info):
            continue
        trials += 1
        if trials > MAX_TRIALS and k + 1 < len(ends):
            continue  # past the budget only the final state is tried
        binds, _ = placer.place_job(st, info, None, need)
        if binds is not None:
            nodes = tuple(sorted({b.node_id for b in binds}))
            return Reservation(info.job.job_id, end, nodes)
    return None
