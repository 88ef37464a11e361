"""A gang on the fewest nodes, then the fewest racks, that can hold it now.

The placer places a gang replica by replica, each on the best-scoring node. Scores
alone do not keep a gang together: bin-packing sends the first replica of 2 x 4 GPUs
to the fullest node with 4 free, and the second then has to go elsewhere, while an
empty node could have held both (issue 17). So, before the plugins score, the nodes a
replica may go to are fenced: only those from which the rest of the group can still
be placed on the fewest nodes possible now, and inside one rack (switch) when one rack
can hold it on as few nodes (with the topology plugin, which makes racks matter).
Among the nodes left, the plugins choose as before.

The count is exact for a group of identical replicas: ``capacity`` is how many of them
each node holds now (free GPUs, shares, MIG slices, CPU and memory, as the placer's fit
test counts them), and one replica placed lowers its node's count by exactly one. The
fewest nodes for ``need`` replicas are then the largest counts, taken in order.
"""

from __future__ import annotations

import numpy as np

from scheduling.arrays import BoolArray, IntArray
from scheduling.model import TaskRequest
from scheduling.state import ClusterState

_MANY = 1 << 30  # "unbounded" replicas of a resource the task does not ask for


def capacity(st: ClusterState, task: TaskRequest, rows: IntArray) -> IntArray:
    """How many replicas of ``task`` each node in ``rows`` can hold now."""
    n = np.full(rows.size, _MANY, dtype=np.int64)
    if task.cpu_milli:
        n = np.minimum(n, st.cpu_free[rows] // task.cpu_milli)
    if task.memory_mib:
        n = np.minimum(n, st.mem_free[rows] // task.memory_mib)
    if task.gpu:
        n = np.minimum(n, st.idle[rows] // task.gpu)
    elif task.shared:
        per = np.full((rows.size, st.t.g), _MANY, dtype=np.int64)
        if task.gpu_memory_mib:
            per = np.minimum(per, st.gmem_free[rows] // task.gpu_memory_mib)
        if task.gpu_compute_pct:
            per = np.minimum(per, st.gcmp_free[rows] // task.gpu_compute_pct)
        n = np.minimum(n, np.where(st.t.share_ok[rows], per, 0).sum(axis=1))
    elif task.mig:
        c = st.t.mig_masks(task.mig_profile)[rows]  # instances of the profile free, counted
        n = np.minimum(n, ((st.mig_free[rows][:, :, None] & c) == c).sum(axis=(1, 2)))
    out: IntArray = np.maximum(n, 0)
    return out


def fewest_nodes(cap: IntArray, used: BoolArray, need: int) -> int | None:
    """The fewest nodes, the ``used`` ones counted, that hold ``need`` more replicas
    (``cap`` of them each); None if all of them together cannot."""
    have = int(cap[used].sum())
    k = int(used.sum())
    if have >= need:
        return k
    rest = np.cumsum(np.sort(cap[~used])[::-1])
    j = int(np.searchsorted(rest, need - have))  # the first prefix that covers the rest
    return None if j >= rest.size else k + j + 1


def within(cap: IntArray, used: BoolArray, need: int, budget: int) -> BoolArray:
    """Nodes where the next of ``need`` replicas leaves the others placeable on at most
    ``budget`` nodes in all (given that all ``need`` are, now).

    A used node with room always is. A fresh node i is iff i and the best
    ``budget - used - 1`` other fresh nodes hold what the used ones do not:
    ``cap[i] + top(budget - used - 1) >= need - have``; taking the top over every
    fresh node, i included, changes nothing (if i is among them, the true best set is
    the top ``budget - used``, which holds it by assumption)."""
    room = cap > 0
    ok = used & room
    slots = budget - int(used.sum())
    if slots > 0:
        fresh = ~used & room
        top = int(np.sort(cap[fresh])[::-1][: slots - 1].sum())
        ok |= fresh & (cap + top >= need - int(cap[used].sum()))
    return ok


class GangFence:
    """The nodes each replica of one group may go to, on ``st``, as the group is placed
    (``allowed`` before each replica, ``placed`` after it)."""

    def __init__(self, st: ClusterState, task: TaskRequest, base: BoolArray, nodes: list[int], need: int,
                 budget: int, cap: IntArray, racks: bool) -> None:
        self.st, self.task, self.base = st, task, base
        self.need, self.budget, self.cap = need, budget, cap
        self.used = np.zeros(cap.size, dtype=bool)
        self.used[nodes] = True
        t = st.t
        self.racks = t.rack if racks and len(t.racks) > 1 else None

    @classmethod
    def open(cls, st: ClusterState, task: TaskRequest, base: BoolArray, nodes: list[int],
             need: int, racks: bool = True) -> GangFence | None:
        """A fence for ``need`` replicas of ``task`` on the nodes in ``base`` (the job
        already on ``nodes``), and with ``racks`` in one rack where one rack holds them
        on as few nodes; None when they do not all fit now (nothing to keep)."""
        rows = np.arange(st.t.n)
        cap = np.where(base, capacity(st, task, rows), 0)
        used = np.zeros(cap.size, dtype=bool)
        used[nodes] = True
        budget = fewest_nodes(cap, used, need)
        if budget is None:
            return None
        return cls(st, task, base, nodes, need, budget, cap, racks)

    def allowed(self) -> BoolArray:
        cap, used, need, budget = self.cap, self.used, self.need, self.budget
        if self.racks is not None:
            rack = self.racks
            racks = np.unique(rack[used] if used.any() else rack[cap > 0])
            if racks.size == 1 or not used.any():
                out = np.zeros(cap.size, dtype=bool)
                for r in racks.tolist():
                    c = np.where(rack == r, cap, 0)
                    b = fewest_nodes(c, used, need)
                    if b is not None and b <= budget:
                        out |= within(c, used, need, budget)
                if out.any():
                    return out
        return within(cap, used, need, budget)

    def placed(self, i: int) -> None:
        self.used[i] = True
        self.need -= 1
        self.cap[i] = capacity(self.st, self.task, np.asarray([i]))[0] if self.base[i] else 0
