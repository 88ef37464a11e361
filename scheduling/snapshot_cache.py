"""``SnapshotCache``: what a scheduler carries from one cycle to the next, so that a
cycle costs what changed rather than the whole cluster.

Everything is keyed by object identity, and every object of a ``Snapshot`` is frozen,
so the contract for a caller is:

- **Reuse** what did not change: the same ``nodes`` tuple object, and the same
  ``Allocation``, ``RunningJob`` and ``JobRequest`` objects, from one snapshot to the
  next. That is what makes a cycle incremental.
- **Replace** what changed with a new object: a new ``nodes`` tuple on any change to the
  inventory (a node added, removed, cordoned, relabelled), a new ``Allocation`` for a
  task placed again, a new ``JobRequest`` / ``RunningJob`` for a job whose fields
  changed. A new object that equals an old one costs a recompute, never a wrong answer.

What each change invalidates:

- a new ``nodes`` object: the node table, and with it the free-capacity base (rebuilt
  from all allocations) and the placement scores' interned node states;
- an allocation that is new or gone: only its own share of the free capacity, adjusted
  on a copy of the last cycle's state (the same integers as a full rebuild);
- a running or pending job object that is new or gone: only its own derived figures
  (``RunningInfo`` / ``JobInfo`` and their column rows).

The cache holds the objects it keys, so their ids cannot be reused while it does.
Policy carried between cycles (the victim-search backoff, kept reservations) is not
here: it belongs to the actions (scheduling.actions).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import cast

import numpy as np

from scheduling import jobcols as jc
from scheduling.framework import RUN_FIELDS, Cycle, JobInfo, Plugin, RunningInfo
from scheduling.model import Allocation, JobRequest, Resources, RunningJob, Snapshot, TaskRequest
from scheduling.node_table import NodeTable
from scheduling.placer import ScoreMemo
from scheduling.state import ClusterState
from scheduling.victims import alloc_gpus

_INFO, _ROW = itemgetter(1), itemgetter(2)  # of a kept (job, info, row)
_JOB_ID = attrgetter("job_id")
_TENANT = attrgetter("run.job.tenant")
_SLOT = attrgetter("slot")
_RUN_JOB_ID = attrgetter("job.job_id")
_NOTHING = Resources()


class SnapshotCache:
    """Opens each cycle from a snapshot, reusing what the last one derived (see the
    module's docstring for what a caller may reuse and what invalidates what)."""

    def __init__(self, hooks: dict[str, list[Plugin]], default_runtime_s: float | None) -> None:
        # the plugins with each hook a job's derived figures ask (asked once per job object)
        self._min_members = hooks["min_members"]
        self._priority = hooks["static_priority"]
        self._task_order = hooks["task_order"]
        self._default_runtime_s = default_runtime_s  # a pending job's estimate when it has none
        self._table: NodeTable | None = None
        self._base: tuple[NodeTable, dict[int, Allocation], ClusterState] | None = None
        self._meta: dict[int, tuple[int, float, int, int]] = {}  # id(allocation) -> node index, GPUs, CPU, memory
        self._infos: dict[int, tuple[JobRequest, JobInfo, int]] = {}  # id(job) -> job, info, row
        self._shapes: dict[tuple[object, ...], int] = {}  # job shapes, interned for the fit memo
        self._running: dict[int, RunningInfo] = {}  # id(running job) -> its RunningInfo
        self._run_cols = jc.JobColumns(256, RUN_FIELDS)  # their RunTable numbers, a row each
        self._cols = jc.JobColumns()
        self.scores = ScoreMemo()  # placement scores by node state (invalidated with the node table)

    def cycle(self, snapshot: Snapshot, seed: int) -> Cycle:
        """A new cycle: the node table and the free capacity after the allocations."""
        table = self._table
        if table is None or table.src is not snapshot.nodes:
            table = self._table = NodeTable(snapshot.nodes)
        return Cycle(snapshot, table, self._state(table, snapshot.allocations), seed)

    def add_running(self, cycle: Cycle) -> None:
        """The cycle's capacity, running jobs (with their allocations and RunTable
        columns), each allocation's node, GPUs and job, and each tenant's usage."""
        snapshot, table = cycle.snapshot, cycle.table
        usable = table.schedulable[:, None] & table.share_ok
        cycle.capacity = Resources(float(usable.sum()), float(table.cpu_total[table.schedulable].sum()),
                                   float(table.mem_total[table.schedulable].sum()))
        runs, run_index = self._kept_running(snapshot.running)
        allocs = snapshot.allocations
        meta = self._meta
        m = np.array(list(map(meta.__getitem__, map(id, allocs))), dtype=float).reshape(len(allocs), 4)
        cycle.alloc_node, cycle.alloc_gpu = m[:, 0].astype(np.int64), m[:, 1].copy()
        owner = np.fromiter(map(run_index.get, map(_JOB_ID, allocs), repeat(-1)), dtype=np.int64, count=len(allocs))
        # each running job's allocations (positions, in snapshot order) and demand
        mine = np.flatnonzero(owner >= 0)
        by_run = mine[np.argsort(owner[mine], kind="stable")]
        counts = np.bincount(owner[mine], minlength=len(runs))
        bounds = np.cumsum(counts).tolist()
        pos = by_run.tolist()
        demand = np.stack([np.bincount(owner[mine], weights=m[mine, c], minlength=len(runs)) for c in (1, 2, 3)],
                          axis=1) if len(runs) else np.zeros((0, 3))
        for ri, lo, hi in zip(runs, [0, *bounds][: len(bounds)], bounds, strict=True):
            ri.allocs = pos[lo:hi]
        # a job's RunTable row is rewritten where its demand is not the row's (or it has none)
        store = self._run_cols
        slots = np.fromiter(map(_SLOT, runs), dtype=np.int64, count=len(runs))
        stale = (slots < 0) | (demand != store.data[8:11, slots].T).any(axis=1)
        for k in np.flatnonzero(stale).tolist():
            ri, d = runs[k], demand[k].tolist()
            ri.gpus = d[0]
            ri.demand = Resources(d[0], d[1], d[2])
            if ri.slot < 0:
                ri.slot = store.add(ri.table_row())
            else:
                store.data[:, ri.slot] = ri.table_row()
        cycle.running = [r for r in runs if r.allocs]
        cycle.run_cols = store.gather(np.fromiter(map(_SLOT, cycle.running), dtype=np.int64, count=len(cycle.running)))
        # each allocation's running job, as a position in cycle.running (-1: none)
        at = np.cumsum(counts > 0) - 1 if len(runs) else np.zeros(1, dtype=np.int64)
        cycle.alloc_run = np.where(owner >= 0, at[np.maximum(owner, 0)], -1)
        cycle.running_by_id = {r.run.job.job_id: r for r in cycle.running}
        # each tenant's usage (tenants in order of first appearance; sums in running order)
        tenants = list(map(_TENANT, cycle.running))
        code = {t: k for k, t in enumerate(dict.fromkeys(tenants))}
        which = np.fromiter(map(code.__getitem__, tenants), dtype=np.int64, count=len(tenants))
        held = demand[counts > 0]
        sums = np.stack([np.bincount(which, weights=held[:, c], minlength=len(code)) for c in (0, 1, 2)], axis=1)
        cycle.usage = {t: Resources(*u) for t, u in zip(code, sums.tolist(), strict=True)}

    def job_infos(self, cycle: Cycle) -> list[JobInfo]:
        """The pending jobs' derived data, in the snapshot's order; their numbers
        gathered into ``cycle.cols`` (one column per job, same order)."""
        infos = self._infos
        pending = cycle.snapshot.pending
        ids = list(map(id, pending))
        now = dict(zip(ids, pending, strict=True))
        new = now.keys() - infos.keys()  # set operations in C: thousands may wait
        if new:
            # new job objects, in the snapshot's order: arrivals come last, so their
            # positions are looked up at the tail when no job object is listed twice
            tail = ids[-(4 * len(new) + 16):]
            first = dict(zip(tail, range(len(ids) - len(tail), len(ids)), strict=True))
            if len(now) < len(ids) or not new <= first.keys():
                first = dict(zip(reversed(ids), range(len(ids) - 1, -1, -1), strict=True))  # first position of each
            for k in sorted(new, key=first.__getitem__):
                info = self._new_info(now[k])
                infos[k] = (now[k], info, self._cols.add(self._row(info)))
        gone = infos.keys() - now.keys()
        self._cols.release([infos[k][2] for k in gone])
        for k in gone:
            del infos[k]
        hits = list(map(infos.__getitem__, ids))
        cycle.cols = self._cols.gather(np.fromiter(map(_ROW, hits), dtype=np.int64, count=len(hits)))
        return list(map(_INFO, hits))

    def _state(self, table: NodeTable, allocations: Sequence[Allocation]) -> ClusterState:
        """Free capacity after the allocations: the last cycle's, adjusted by the
        allocations that came and went."""
        now = dict(zip(map(id, allocations), allocations, strict=True))
        base = self._base
        if base is not None and base[0] is table:
            before = base[1]
            state = base[2].copy()
            gone = before.keys() - now.keys()
            state.apply([before[k] for k in gone], sign=-1)
            added = [now[k] for k in now.keys() - before.keys()]
            state.apply(added)
            meta = self._meta
            for k in gone:
                del meta[k]
        else:
            state = ClusterState(table)
            state.apply(allocations)
            added, meta = list(now.values()), {}
        for a in added:  # node index, GPUs, CPU and memory of each allocation, computed once
            meta[id(a)] = (table.index.get(a.node_id, -1), alloc_gpus(a), a.cpu_milli, a.memory_mib)
        self._meta = meta
        state.state_ids()  # caught up here, and so inherited by the next cycle's copy
        self._base = (table, now, state.copy())  # keeps the objects alive, so ids stay unique
        return state

    def _kept_running(self, running: Sequence[RunningJob]) -> tuple[list[RunningInfo], dict[str, int]]:
        """The running jobs as RunningInfo (static priority, elastic, RunTable row), kept
        per RunningJob object. A job listed twice: the later entry wins, as a dict
        would. Returns them and each job's position."""
        kept = self._running
        ids = list(map(id, running))
        found = list(map(kept.get, ids))
        if None in found:
            for k in [k for k, ri in enumerate(found) if ri is None]:
                r = running[k]
                found[k] = RunningInfo(r, [], 0.0, _NOTHING, self._static_priority(r.job),
                                       any(t.elastic for t in r.job.tasks))
        ris = cast(list[RunningInfo], found)
        self._running = now = dict(zip(ids, ris, strict=True))
        gone = kept.keys() - now.keys()  # running jobs that ended: their rows are reused
        self._run_cols.release([kept[k].slot for k in gone if kept[k].slot >= 0])
        jids = list(map(_RUN_JOB_ID, running))
        run_index = dict(zip(jids, range(len(jids)), strict=True))
        if len(run_index) == len(jids):
            return ris, run_index
        runs: list[RunningInfo] = []
        run_index = {}
        for jid, ri in zip(jids, ris, strict=True):
            if jid in run_index:
                runs[run_index[jid]] = ri
            else:
                run_index[jid] = len(runs)
                runs.append(ri)
        return runs, run_index

    def _static_priority(self, job: JobRequest) -> float:
        """The first plugin's answer (the priority plugin's), else the job's own."""
        for p in self._priority:
            v = p.static_priority(job)
            if v is not None:
                return v
        return float(job.priority)

    def _tasks(self, job: JobRequest) -> tuple[TaskRequest, ...]:
        """The job's tasks in placement order: the first plugin's answer, else as listed."""
        for p in self._task_order:
            tasks = p.task_order(job)
            if tasks is not None:
                return tasks
        return job.tasks

    def _new_info(self, job: JobRequest) -> JobInfo:
        tasks = self._tasks(job)
        gpus = job.total_gpus
        info = JobInfo(
            job=job, tasks=tasks,
            demand=Resources(gpus, sum(t.cpu_milli * t.replicas for t in tasks),
                             sum(t.memory_mib * t.replicas for t in tasks)),
            gpus=gpus, min_members=1,
        )
        for g in self._min_members:
            info.min_members = g.min_members(info) or info.min_members
        shape = (
            tuple((*t.shape, t.replicas, t.role) for t in tasks),
            info.min_members, job.gpu_models, tuple(sorted(job.node_selector.items())),
            job.tolerations, job.affinity, job.gpu_speeds)
        info.shape = (self._shapes.setdefault(shape, len(self._shapes)),)
        info.static_priority = self._static_priority(job)
        pkey = (info.shape[0], info.static_priority, job.tenant)
        info.pshape = self._shapes.setdefault(pkey, len(self._shapes))
        info.priority = info.static_priority  # the priority plugin adds aging per cycle
        est = job.runtime_estimate_s
        if est is None:
            est = self._default_runtime_s
        info.estimate = est
        return info

    def _row(self, info: JobInfo) -> tuple[float, ...]:
        job = info.job
        return (job.submit_time, info.static_priority, info.gpus, info.shape[0], info.pshape,
                np.nan if info.estimate is None else info.estimate, job.attained_service_s,
                info.demand.cpu_milli, info.demand.memory_mib, self._cols.tenant_code(job.tenant))
