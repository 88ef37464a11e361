"""EASY backfill's reservation search: when and where the blocked head job can start.

Running jobs end at ``start + runtime estimate`` (or the backfill action's default); one
without an estimate, or already past it, is expected to run as long again as it has
(heavy-tailed run times), so a blocked head job always gets a start time and nodes. Releasing them in that order on a scratch copy
of the state, the first moment the head job fits is its reserved start ("shadow
time"), and the nodes it would use there are its reservation. Later jobs may use those
nodes only if their own estimate ends before the shadow time.
"""

from __future__ import annotations

from operator import itemgetter

import numpy as np

from scheduling.arrays import BoolArray, IntArray
from scheduling.framework import Cycle, JobInfo, RunningInfo
from scheduling.model import Bind, Reservation
from scheduling.placer import Placer
from scheduling.state import ClusterState

MAX_TRIALS = 16  # full placement trials per reservation; cheap bounds screen the rest
CHUNK = 64  # most running jobs released at once while the head job cannot fit anyway
MIN_LEFT_S = 60.0  # a job just started without an estimate is expected to run at least this
_END_AND_ID = itemgetter(0, 1)


def _could_fit(st: ClusterState, info: JobInfo) -> bool:
    """A necessary condition, O(nodes): each whole-GPU group has room for its replicas
    counting every node's idle GPUs, and all groups together have enough idle GPUs."""
    whole = sum(t.gpu * t.replicas for t in info.tasks if t.gpu)
    if whole and int(st.idle.sum()) < whole:
        return False
    return all(int((st.idle // t.gpu).sum()) >= t.replicas for t in info.tasks if t.gpu)


def expected_ends(cycle: Cycle, which: IntArray, default_runtime_s: float | None
                  ) -> list[tuple[float, str, RunningInfo]]:
    """When the running jobs at ``which`` (positions in ``cycle.running``) are expected
    to end, soonest first (ties by job id)."""
    rt, now = cycle.runs(), cycle.now
    start, est = rt.start[which], rt.estimate[which]  # no estimate: inf
    if default_runtime_s is not None:
        est = np.where(np.isinf(est), default_runtime_s, est)
    end = np.where(np.isinf(est), now, start + est)
    # past its estimate, or none: heavy tails say as long again
    end = np.where(end <= now, now + np.maximum(now - start, MIN_LEFT_S), end)
    running = cycle.running
    return sorted([(e, running[k].job.job_id, running[k]) for e, k in zip(end.tolist(), which.tolist(), strict=True)],
                  key=_END_AND_ID)


def reserve(placer: Placer, base: ClusterState, info: JobInfo, need: int,
            running: IntArray, default_runtime_s: float | None,
            gone: BoolArray) -> Reservation | None:
    """The head job's start time and nodes, releasing ``running`` (positions in
    ``cycle.running``) as they are expected to end; None if it never fits."""
    cycle: Cycle = placer.cycle
    ends = expected_ends(cycle, running, default_runtime_s)
    if not ends:
        return None  # nothing is known to end: no start time to promise
    st = base.copy()
    allocs = cycle.snapshot.allocations

    trials = 0
    k = 0
    size = 1
    while k < len(ends):
        # Release a chunk at once (vectorised), chunks doubling from one end time to
        # CHUNK: the head job often fits after a few ends, and a long wait costs a
        # handful of bulk steps. Only when the job fits after the whole chunk, step back
        # and walk it one end time at a time for the exact moment.
        chunk = ends[k: k + size]
        size = min(2 * size, CHUNK)
        j = k + len(chunk)
        while j < len(ends) and ends[j][0] == ends[j - 1][0]:
            chunk.append(ends[j])
            j += 1
        freed = [allocs[a] for _, _, r in chunk for a in r.allocs if not gone[a]]
        st.apply(freed, sign=-1)
        k = j
        if not _could_fit(st, info) or (trials >= MAX_TRIALS and k < len(ends)):
            continue
        trials += 1
        fit = _trial(placer, st, info, need)
        if fit is None:
            continue
        if len(chunk) == 1:
            return Reservation(info.job.job_id, chunk[0][0], tuple(sorted({b.node_id for b in fit})))
        st.apply(freed, sign=1)
        for m, (end, _, r) in enumerate(chunk):
            for a in r.allocs:
                if not gone[a]:
                    x = allocs[a]
                    st.release(cycle.table.index[x.node_id], x.cpu_milli, x.memory_mib, x.gpus)
            if m + 1 < len(chunk):
                if chunk[m + 1][0] == end or not _could_fit(st, info):
                    continue  # jobs ending at the same moment go together
                binds = _trial(placer, st, info, need)
                if binds is None:
                    continue
                fit = binds
            return Reservation(info.job.job_id, end, tuple(sorted({b.node_id for b in fit})))
    return None


def _trial(placer: Placer, st: ClusterState, info: JobInfo, need: int) -> list[Bind] | None:
    """Where the job would go on ``st``, leaving ``st`` as it was."""
    m = st.mark()
    binds, _ = placer.place_job(st, info, None, need)
    st.rollback(m)
    return binds
