"""``Session``: one cycle's working state, shared by the actions (Volcano's Session).

The actions (scheduling.actions) read and change it in turn: the plan so far, the nodes
claimed for preemptors (``hard``) or reserved for blocked jobs (``soft``), the capacity
once every stopping job has stopped (``future``), and each tenant's usage as jobs are
placed. It lives for one ``Scheduler.schedule`` call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scheduling.arrays import BoolArray
from scheduling.framework import Cycle, JobInfo
from scheduling.model import Bind, PendingReason, Plan, Resources
from scheduling.placer import Placer
from scheduling.quota import QuotaBook
from scheduling.state import ClusterState


def demand_of(binds: Sequence[Bind]) -> Resources:
    """What the binds take: GPUs (shares as fractions), CPU and memory."""
    g = 0.0
    cpu = mem = 0
    for b in binds:
        g += sum(u.share for u in b.gpus)
        cpu += b.cpu_milli
        mem += b.memory_mib
    return Resources(g, cpu, mem)


class Session:
    def __init__(self, cycle: Cycle, infos: list[JobInfo], placer: Placer) -> None:
        self.cycle = cycle
        self.infos = infos  # the pending jobs, in the snapshot's order
        self.ordered: list[JobInfo] = []  # ... in the order they are tried
        self.placer = placer
        self.plan = Plan()
        n = cycle.table.n
        self.hard: BoolArray = np.zeros(n, dtype=bool)  # nominated for preemptors
        self.soft: BoolArray = np.zeros(n, dtype=bool)  # reserved for blocked head jobs
        self.shadow = np.inf  # earliest reserved start
        self.future: ClusterState | None = None
        # allocations released in the future state (stopping, preempted, shrunk)
        self.gone: BoolArray = np.zeros(len(cycle.snapshot.allocations), dtype=bool)
        self.victims: set[str] = set()  # jobs this cycle preempts
        # the failure memo: (job shape, soft) -> why it did not fit this cycle
        self.failed: dict[tuple[object, ...], PendingReason] = {}
        # nodes held for earlier jobs (preemptors' claims, reservations), in the order
        # held: job -> its nodes; and per job shape, the holder that kept it out
        self.holders: dict[str, set[str]] = {}
        self.blockers: dict[object, str] = {}
        self.memo_grew = False  # this job added to a memo or used a try (the bulk skip looks again)
        self.masks_dirty = True
        self.any_hard = self.any_soft = False
        self.both = self.hard

    def block_for(self, info: JobInfo) -> tuple[BoolArray | None, bool]:
        """The nodes the job may not use (None: none), and whether reservations are
        among them (its estimate does not end before the earliest reserved start)."""
        if self.masks_dirty:
            self.any_hard, self.any_soft = bool(self.hard.any()), bool(self.soft.any())
            self.both = self.hard | self.soft
            self.masks_dirty = False
        if self.any_soft and not (info.estimate is not None and self.cycle.now + info.estimate <= self.shadow):
            return self.both, True
        return (self.hard if self.any_hard else None), False

    def claim(self, binds: Sequence[Bind]) -> None:
        """Nominate the binds' nodes for a preemptor: later jobs keep off them."""
        for b in binds:
            self.hard[self.cycle.table.index[b.node_id]] = True
            self.holders.setdefault(b.job_id, set()).add(b.node_id)
        self.masks_dirty = True

    def reserve(self, node_ids: Sequence[str], start: float, job_id: str = "") -> None:
        """Reserve nodes for ``job_id`` from ``start`` on: only jobs that end before may
        use them."""
        self.shadow = min(self.shadow, start)
        idx = self.cycle.table.index
        for nid in node_ids:
            self.soft[idx[nid]] = True
        self.holders.setdefault(job_id, set()).update(node_ids)
        self.masks_dirty = True

    def holder_of(self, node_ids: set[str]) -> str | None:
        """The earliest job holding one of these nodes (claimed or reserved)."""
        return next((j for j, held in self.holders.items() if j and held & node_ids), None)

    def commit(self, info: JobInfo, binds: list[Bind]) -> None:
        self.plan.binds.extend(binds)
        self.cycle.placed.append((info.job, binds))
        if self.future is not None:
            self.placer.apply_binds(self.future, binds)
        self.account(info.job.tenant, demand_of(binds))

    def account(self, tenant: str, d: Resources, sign: int = 1) -> None:
        """Add (sign 1) or take back (-1) a tenant's usage, quota book included."""
        cycle = self.cycle
        u = cycle.usage.get(tenant, Resources())
        cycle.usage[tenant] = u + d if sign > 0 else u - d
        book = cycle.get(QuotaBook)
        if book is not None:
            book.add(tenant, d, sign)

    def future_state(self) -> ClusterState:
        """Capacity once every job already asked to stop has stopped."""
        if self.future is None:
            f = self.cycle.state.copy()
            allocs = self.cycle.snapshot.allocations
            idx = self.cycle.table.index
            for r in self.cycle.running:
                if r.run.terminating:
                    for k in r.allocs:
                        a = allocs[k]
                        if not self.gone[k] and a.node_id in idx:
                            f.release(idx[a.node_id], a.cpu_milli, a.memory_mib, a.gpus)
                        self.gone[k] = True
            self.future = f
        return self.future
