"""``Scheduler``: one cycle, snapshot in, plan out, in numbered phases.

1. open      the node table (kept while ``Snapshot.nodes`` is the same object), free
             capacity from the allocations, running jobs, usage; plugins' ``open``
2. order     pending jobs by the order plugins' keys (tiers, then submit time, then
             the snapshot's order)
3. allocate  in order: quota admission, gang placement (all-or-nothing, statement
             rolled back on failure), and for a job that does not fit: preemption on
             the future state, else an EASY reservation that later jobs backfill around
4. grow      elastic jobs take idle GPUs outside reservations
5. plan      binds, preemptions, resizes, reservations and a reason for every job left
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import cast

import numpy as np

from scheduling import jobcols as jc
from scheduling.backfill import reserve
from scheduling.config import SchedulerConfig
from scheduling.framework import RUN_FIELDS, Cycle, JobInfo, Placing, Plugin, RunningInfo, overrides
from scheduling.model import (
    Allocation,
    Bind,
    JobRequest,
    PendingReason,
    Plan,
    Preemption,
    Reservation,
    Resize,
    ResizeReason,
    Resources,
    RunningJob,
    Snapshot,
)
from scheduling.placer import Placer, ScoreMemo
from scheduling.plugins.special import BackfillArgs, ElasticArgs
from scheduling.preempt import Unit, VictimIndex, alloc_gpus, preempt_for, replica_of, task_of
from scheduling.quota import Admission, QuotaBook
from scheduling.state import BoolArray, ClusterState, NodeTable

HOOKS = ("order_keys", "admit", "node_mask", "task_mask", "score", "victims", "min_members", "pick")
_INFO, _ROW = itemgetter(1), itemgetter(2)  # of a kept (job, info, row)
_JOB_ID = attrgetter("job_id")
_TENANT = attrgetter("run.job.tenant")
_SLOT = attrgetter("slot")
_RUN_JOB_ID = attrgetter("job.job_id")
STARVED_RESERVATIONS = 16  # starved jobs beyond the EASY head that get a reservation per cycle
_CAPACITY = (PendingReason.NO_FIT, PendingReason.GANG_INCOMPLETE, PendingReason.AFFINITY,
             PendingReason.GPU_MODEL)
_NOTHING = Resources()
_ROOM = (PendingReason.NO_FIT, PendingReason.GANG_INCOMPLETE, PendingReason.NEVER_FITS,
         PendingReason.NO_MATCHING_NODE)  # reasons a cordoned node's room may explain


def _demand(binds: Sequence[Bind]) -> Resources:
    g = 0.0
    cpu = mem = 0
    for b in binds:
        for u in b.gpus:
            g += 1.0 if u.whole else (u.mig_slices / 7.0 if u.mig_slices else u.compute_pct / 100.0)
        cpu += b.cpu_milli
        mem += b.memory_mib
    return Resources(g, cpu, mem)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """A cycle makes many short-lived objects and no garbage cycles that matter: the
    cyclic collector's passes over the large long-lived heap (the snapshot) are pure
    cost, 5-13% of a cycle at 5,000 nodes. Reference counting still frees everything."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(slots=True)
class AdmissionResult:
    """Queueing's answer: jobs admitted against quota, in order, and why others wait."""

    admitted: list[str] = field(default_factory=list)
    borrowing: list[str] = field(default_factory=list)
    pending: dict[str, PendingReason] = field(default_factory=dict)


class Scheduler:
    """Built once from a validated config; ``schedule`` is called every cycle."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.plugins: list[Plugin] = self.config.build_plugins()
        self.by_name = {p.name: p for p in self.plugins}
        self.hooks: dict[str, list[Plugin]] = {h: [p for p in self.plugins if overrides(p, h)] for h in HOOKS}
        bf = self.by_name.get("backfill")
        self.backfill: BackfillArgs | None = bf.args if bf is not None else None  # type: ignore[assignment]
        el = self.by_name.get("elastic")
        self.elastic: ElasticArgs | None = el.args if el is not None else None  # type: ignore[assignment]
        self._table: NodeTable | None = None
        self._base: tuple[NodeTable, dict[int, Allocation], ClusterState] | None = None
        self._meta: dict[int, tuple[int, float, int, int]] = {}  # id(allocation) -> node index, GPUs, CPU, memory
        self._infos: dict[int, tuple[JobRequest, JobInfo, int]] = {}  # id(job) -> job, info, row
        self._shapes: dict[tuple[object, ...], int] = {}  # job shapes, interned for the fit memo
        self._running: dict[int, RunningInfo] = {}  # id(running job) -> its RunningInfo, kept
        self._run_cols = jc.JobColumns(256, RUN_FIELDS)  # their RunTable numbers, a row each
        self._cols = jc.JobColumns()
        self._scores = ScoreMemo()  # placement scores by node state, kept across cycles
        self._fruitless: set[tuple[object, ...]] = set()  # victim searches that found nothing last cycle
        # reservations and when they were searched (backfill.interval_s): job, time, reservation
        self._reservations: dict[str, tuple[JobRequest, float, Reservation]] = {}

    # --- public API --------------------------------------------------------------------
    def schedule(self, snapshot: Snapshot) -> Plan:
        with _collector_paused():
            cycle = self._open(snapshot)
            return _Run(self, cycle, self._job_infos(cycle)).run()

    def order(self, snapshot: Snapshot) -> list[JobRequest]:
        """The pending jobs in the order this config would try them (queueing's order)."""
        cycle = self._open(snapshot)
        return [i.job for i in self._ordered(cycle, self._job_infos(cycle))]

    def admit(self, snapshot: Snapshot) -> AdmissionResult:
        """Order the pending jobs and admit them against the quotas, in that order."""
        cycle = self._open(snapshot)
        book = cycle.quota_book or QuotaBook(snapshot.quotas, cycle.usage)
        out = AdmissionResult()
        for info in self._ordered(cycle, self._job_infos(cycle)):
            adm: Admission = book.check(info.job.tenant, info.demand)
            if adm.admitted:
                book.add(info.job.tenant, info.demand)
                out.admitted.append(info.job.job_id)
                if adm.borrowing:
                    out.borrowing.append(info.job.job_id)
            else:
                out.pending[info.job.job_id] = adm.reason or PendingReason.QUOTA
        return out

    # --- phase 1: open -----------------------------------------------------------------
    def _open(self, snapshot: Snapshot) -> Cycle:
        table = self._table
        # Kept while the nodes tuple is the same object: pass a new tuple on any change.
        if table is None or table.src is not snapshot.nodes:
            table = self._table = NodeTable(snapshot.nodes)
        state = self._state(table, snapshot.allocations)
        cycle = Cycle(snapshot, table, state, self.config.seed)
        for p in self.plugins:
            if p.name == "priority":
                p.open(cycle)  # sets the priority function the running jobs use
        usable = table.schedulable[:, None] & table.share_ok
        cycle.capacity = Resources(float(usable.sum()), float(table.cpu_total[table.schedulable].sum()),
                                   float(table.mem_total[table.schedulable].sum()))
        runs, run_index = self._kept_running(cycle, snapshot.running)
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
        for p in self.plugins:
            if p.name != "priority":
                p.open(cycle)
        return cycle

    def _kept_running(self, cycle: Cycle, running: Sequence[RunningJob]) -> tuple[list[RunningInfo], dict[str, int]]:
        """The running jobs as RunningInfo (static priority, elastic, RunTable row), kept
        per RunningJob object: the cache holds the object, so its id is not reused while
        it is there. A job listed twice: the later entry wins, as a dict would. Returns
        them and each job's position."""
        kept = self._running
        ids = list(map(id, running))
        found = list(map(kept.get, ids))
        if None in found:
            for k in [k for k, ri in enumerate(found) if ri is None]:
                r = running[k]
                found[k] = RunningInfo(r, [], 0.0, _NOTHING, cycle.priority_of(r.job),
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

    def _state(self, table: NodeTable, allocations: Sequence[Allocation]) -> ClusterState:
        """Free capacity after the allocations: the last cycle's, adjusted by the
        allocations that came and went (same integers as a full rebuild, far cheaper)."""
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

    def _job_infos(self, cycle: Cycle) -> list[JobInfo]:
        """Per-job derived data, kept across cycles while the job object is the same;
        their numbers gathered into ``cycle.cols`` (one column per job, same order)."""
        infos = self._infos  # holds the job objects, so their ids are not reused meanwhile
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
                info = self._new_info(cycle, now[k])
                infos[k] = (now[k], info, self._cols.add(self._row(info)))
        gone = infos.keys() - now.keys()
        self._cols.release([infos[k][2] for k in gone])
        for k in gone:
            del infos[k]
        hits = list(map(infos.__getitem__, ids))
        cycle.cols = self._cols.gather(np.fromiter(map(_ROW, hits), dtype=np.int64, count=len(hits)))
        return list(map(_INFO, hits))

    def _new_info(self, cycle: Cycle, job: JobRequest) -> JobInfo:
        rank = cycle.role_rank
        tasks = tuple(sorted(job.tasks, key=lambda t: rank.get(t.role, len(rank)))) if rank else job.tasks
        gpus = job.total_gpus
        info = JobInfo(
            job=job, tasks=tasks,
            demand=Resources(gpus, sum(t.cpu_milli * t.replicas for t in tasks),
                             sum(t.memory_mib * t.replicas for t in tasks)),
            gpus=gpus, min_members=1,
        )
        for g in self.hooks["min_members"]:
            info.min_members = g.min_members(info) or info.min_members
        shape = (
            tuple((*t.shape, t.replicas, t.role) for t in tasks),
            info.min_members, job.gpu_models, tuple(sorted(job.node_selector.items())),
            job.tolerations, job.affinity)
        info.shape = (self._shapes.setdefault(shape, len(self._shapes)),)
        info.static_priority = cycle.priority_of(job)
        pkey = (info.shape[0], info.static_priority, job.tenant)
        info.pshape = self._shapes.setdefault(pkey, len(self._shapes))
        info.priority = info.static_priority  # the priority plugin adds aging per cycle
        est = job.runtime_estimate_s
        if est is None and self.backfill is not None:
            est = self.backfill.default_runtime_s
        info.estimate = est
        return info

    def _row(self, info: JobInfo) -> tuple[float, ...]:
        job = info.job
        return (job.submit_time, info.static_priority, info.gpus, info.shape[0], info.pshape,
                np.nan if info.estimate is None else info.estimate, job.attained_service_s,
                info.demand.cpu_milli, info.demand.memory_mib, self._cols.tenant_code(job.tenant))

    # --- phase 2: order ----------------------------------------------------------------
    def _ordered(self, cycle: Cycle, infos: list[JobInfo]) -> list[JobInfo]:
        if not infos:
            cycle.order = np.zeros(0, dtype=np.int64)
            return []
        keys = []
        for p in self.hooks["order_keys"]:
            keys += p.order_keys(cycle, infos)
        keys.append(cycle.cols[jc.SUBMIT])
        keys.append(np.arange(len(infos), dtype=float))
        order = np.lexsort(keys[::-1])
        cycle.order = order
        return [infos[k] for k in order.tolist()]


class _Run:
    """Phases 2-5 of one cycle."""

    bulk = True  # False: every job tried one by one (the reference for the bulk path's test)

    def __init__(self, sched: Scheduler, cycle: Cycle, infos: list[JobInfo]) -> None:
        self.s = sched
        self.cycle = cycle
        self.infos = infos
        self.placer = Placer(cycle, sched.plugins, sched.hooks, sched._scores)
        self.plan = Plan()
        n = cycle.table.n
        self.hard: BoolArray = np.zeros(n, dtype=bool)  # nominated for preemptors
        self.soft: BoolArray = np.zeros(n, dtype=bool)  # reserved for blocked head jobs
        self.shadow = np.inf  # earliest reserved start
        self.future: ClusterState | None = None
        # allocations released in the future state (stopping, preempted, shrunk)
        self.gone: BoolArray = np.zeros(len(cycle.snapshot.allocations), dtype=bool)
        self.vix: VictimIndex | None = None
        self.victims: set[str] = set()
        self.failed: dict[tuple[object, ...], PendingReason] = {}
        self.reserve_tries = 0
        self.starved_reservations = 0
        self.no_victims: set[tuple[object, ...]] = set()
        self.masks_dirty = True
        self.any_hard = self.any_soft = False
        self.both = self.hard
        pre = sched.config.preemption
        self.preempt_budget = pre.max_preemptors_per_cycle if pre.enabled else 0
        self.backoff = sched._fruitless  # asks whose victim search found nothing last cycle
        self.fruitless: set[tuple[object, ...]] = set()  # ... and this cycle
        self.kept: dict[str, tuple[JobRequest, float, Reservation]] = {}  # reservations kept (backfill.interval_s)
        self.admit_hooks = sched.hooks["admit"]
        self.memo_grew = False  # this job added to the failure / no-victims memos or used a try
        self.arrays: tuple[np.ndarray, ...] | None = None  # per ordered job, for _resolved
        self.resolved: tuple[BoolArray, BoolArray, np.ndarray, dict[int, PendingReason]] | None = None
        self.resolved_soft: tuple[bool, float] = (False, np.inf)

    def run(self) -> Plan:
        cycle = self.cycle
        ordered = self.s._ordered(cycle, self.infos)
        self.plan.order = [i.job.job_id for i in ordered]
        pend = self.plan.pending
        aged = cycle.job_priority is not None and cycle.job_starved is not None
        if aged:
            assert cycle.job_priority is not None and cycle.job_starved is not None
            prio = cycle.job_priority[cycle.order].tolist()
            starved = cycle.job_starved[cycle.order].tolist()
        pos, n = 0, len(ordered)
        while pos < n:
            info = ordered[pos]
            if aged:
                info.priority, info.starved = prio[pos], starved[pos]
            self.memo_grew = False
            reason = self._allocate(info)
            pos += 1
            if reason is not None:
                pend[info.job.job_id] = reason
                if reason in _CAPACITY and info.starved and not any(
                        r.job_id == info.job.job_id for r in self.plan.reservations):
                    # A starved job without a reservation (no backfill, or no estimate tells
                    # when it could start) holds the line: nothing after it starts.
                    pend.update(dict.fromkeys(self.plan.order[pos:], PendingReason.PRIORITY))
                    break
            if self.bulk and pos < n:
                pos = self._skip(ordered, pos)
        self.s._fruitless = self.fruitless
        self.s._reservations = self.kept  # only those of jobs still waiting for one
        if self.s.elastic is not None and self.s.elastic.grow:
            self._grow()
        if cycle.table.cordoned.any():
            self._blame_cordon()
        return self.plan

    def _blame_cordon(self) -> None:
        """A job left pending for want of room that a cordoned node has free now says
        ``cordoned``: uncordoning is what would start it. Only the reason changes."""
        tbl, st = self.cycle.table, self.cycle.state
        pend = self.plan.pending
        for info in self.infos:
            if pend.get(info.job.job_id) in _ROOM and any(
                    self.placer.fit_mask(st, t, tbl.cordoned).any() for t in info.tasks):
                pend[info.job.job_id] = PendingReason.CORDONED

    # --- phase 3: allocate ---------------------------------------------------------------
    def _block_for(self, info: JobInfo) -> tuple[BoolArray | None, bool]:
        if self.masks_dirty:
            self.any_hard, self.any_soft = bool(self.hard.any()), bool(self.soft.any())
            self.both = self.hard | self.soft
            self.masks_dirty = False
        if self.any_soft and not (info.estimate is not None and self.cycle.now + info.estimate <= self.shadow):
            return self.both, True
        return (self.hard if self.any_hard else None), False

    def _allocate(self, info: JobInfo) -> PendingReason | None:
        cycle = self.cycle
        for p in self.admit_hooks:
            r = p.admit(cycle, info)
            if r is not None:
                return r
        block, soft = self._block_for(info)
        key = (info.shape, soft)
        reason = self.failed.get(key)
        if reason is not None and (reason not in _CAPACITY or self._settled(info, soft)):
            return reason  # the same ask failed this cycle and nothing more can be tried
        if reason is None:
            binds, placed = self.placer.place_job(cycle.state, info, block, info.min_members)
            if binds is not None:
                self._commit(info, binds)
                return None
            reason = self._why(info, block, placed)
            self.failed[key] = reason
            self.memo_grew = True
        if reason in _CAPACITY:
            # a failed attempt is remembered per shape, priority and tenant: victims only
            # get scarcer during the cycle, so the same ask would fail again
            pkey = (info.shape, info.static_priority, info.job.tenant, soft)
            if self.may_preempt and pkey not in self.no_victims:
                if pkey in self.backoff:
                    # found no victims last cycle: it sits this one out, and the budget
                    # goes to jobs behind it (else the same few blocked jobs at the head
                    # would spend it every cycle and nobody behind them would ever look)
                    self.no_victims.add(pkey)
                elif self._preempt(info, block):
                    return PendingReason.PREEMPTING
                else:
                    self.no_victims.add(pkey)
                    self.fruitless.add(pkey)
                self.memo_grew = True
            if self.s.backfill is not None and self.reserve_tries < self.s.backfill.depth:
                self.reserve_tries += 1  # EASY: only the head job(s), found or not
                self.memo_grew = True
                self._reserve(info)
            elif self.s.backfill is not None and info.starved and self.starved_reservations < STARVED_RESERVATIONS:
                # every starved job gets its own start time (conservative backfill for
                # them), so one starved job behind another does not stop the cluster
                self.starved_reservations += 1
                self._reserve(info)
        return reason

    def _skip(self, ordered: list[JobInfo], start: int) -> int:
        """Give the jobs from ``start`` on that would only hit a failure remembered this
        cycle, with nothing more to try (no preemption, no reservation), their reasons
        in bulk, up to the next job that must be tried; returns its position (the end
        when the rest is settled). The same plan as one by one, far cheaper with
        thousands of jobs waiting on a full cluster: admission (quotas) is asked of each
        skipped job in order, and cannot change while nothing starts."""
        _, soft = self._block_for(ordered[start])
        info = ordered[start]
        reason = self.failed.get((info.shape, soft))
        if reason is None or (reason in _CAPACITY and not self._settled(info, soft)):
            return start  # the next job is to be tried anyway: no need to look further
        if self.memo_grew or self.resolved is None or self.resolved_soft != (self.any_soft, self.shadow):
            self.resolved = self._resolved(ordered)
            self.resolved_soft = (self.any_soft, self.shadow)
        ok, holds, codes, reasons = self.resolved
        rest = np.flatnonzero(~ok[start:])
        stop = start + int(rest[0]) if len(rest) else len(ordered)
        if stop == start:
            return start
        pend, cycle, hooks, ids = self.plan.pending, self.cycle, self.admit_hooks, self.plan.order
        if not hooks:  # all in C: no per-job Python with thousands waiting
            held = np.flatnonzero(holds[start:stop])
            end = start + int(held[0]) + 1 if len(held) else stop
            pend.update(zip(ids[start:end], map(reasons.__getitem__, codes[start:end].tolist()), strict=True))
            if len(held):  # a starved job without a reservation holds the line: nothing after it starts
                pend.update(dict.fromkeys(ids[end:], PendingReason.PRIORITY))
                return len(ordered)
            return stop
        aged = cycle.job_priority is not None and cycle.job_starved is not None
        if aged:
            assert cycle.job_priority is not None and cycle.job_starved is not None
            prio = cycle.job_priority[cycle.order[start:stop]].tolist()
            starved = cycle.job_starved[cycle.order[start:stop]].tolist()
        code = codes[start:stop].tolist()
        for j in range(stop - start):
            info = ordered[start + j]
            if aged:
                info.priority, info.starved = prio[j], starved[j]  # what the admit hooks see
            refused = None
            for p in hooks:
                refused = p.admit(cycle, info)
                if refused is not None:
                    break
            reason = pend[ids[start + j]] = refused or reasons[code[j]]
            if reason in _CAPACITY and info.starved:
                pend.update(dict.fromkeys(ids[start + j + 1:], PendingReason.PRIORITY))
                return len(ordered)
        return stop

    def _resolved(self, ordered: list[JobInfo]) -> tuple[BoolArray, BoolArray, np.ndarray, dict[int, PendingReason]]:
        """Per ordered job: whether it is settled by this cycle's memos (see ``_skip``),
        whether it then holds the line (starved, out of room, admitted), its memo code;
        and the reason of each code."""
        if self.arrays is None:  # the jobs' shapes are fixed for the cycle: grouped once
            c, order = self.cycle.cols, self.cycle.order
            st = self.cycle.job_starved
            shapes, _, inverse = jc.groups(c[jc.SHAPE][order].astype(np.int64))
            _, pfirst, pinverse = jc.groups(c[jc.PSHAPE][order].astype(np.int64))
            self.arrays = (shapes, inverse, pfirst, pinverse, c[jc.ESTIMATE][order],
                           st[order] if st is not None else np.zeros(len(order), dtype=bool))
        shapes, inverse, pfirst, pinverse, est, starved = self.arrays
        soft = ~(est + self.cycle.now <= self.shadow) if self.any_soft else np.zeros(len(est), dtype=bool)
        sides = soft.astype(np.int64)
        codes = shapes[inverse] * 2 + sides
        # the failure memo's verdict on each (shape, soft): looked up once per group
        reasons: dict[int, PendingReason] = {}
        known = np.zeros((len(shapes), 2), dtype=bool)
        capacity = np.zeros((len(shapes), 2), dtype=bool)
        failed = self.failed
        for m, k in enumerate(shapes.tolist()):
            for side in (0, 1):
                r = failed.get(((k,), bool(side)))  # the memo's key: (info.shape, soft)
                if r is not None:
                    reasons[2 * k + side], known[m, side], capacity[m, side] = r, True, r in _CAPACITY
        ok = known[inverse, sides]
        cap = capacity[inverse, sides]
        if cap.any():
            if not (self.s.backfill is None or self.reserve_tries >= self.s.backfill.depth):
                ok &= ~cap  # the head's reservation is still to be tried
            elif self.may_preempt:
                # per (shape, priority, tenant) and soft: whether a preemption is still to be tried
                todo = np.zeros((len(pfirst), 2), dtype=bool)
                live = cap & ok
                todo[pinverse[live], sides[live]] = True
                for m, side in np.argwhere(todo).tolist():
                    info = ordered[int(pfirst[m])]  # any job of the group: they share the memo's key
                    if (info.shape, info.static_priority, info.job.tenant, bool(side)) in self.no_victims:
                        todo[m, side] = False
                ok &= ~(cap & todo[pinverse, sides])
        return ok, ok & cap & starved, codes, reasons

    def _settled(self, info: JobInfo, soft: bool) -> bool:
        """Neither a preemption nor a reservation would be tried for this job."""
        if self.may_preempt and (info.shape, info.static_priority, info.job.tenant, soft) not in self.no_victims:
            return False
        return self.s.backfill is None or self.reserve_tries >= self.s.backfill.depth

    def _commit(self, info: JobInfo, binds: list[Bind]) -> None:
        self.plan.binds.extend(binds)
        if self.future is not None:
            self.placer.apply_binds(self.future, binds)
        self._account(info.job.tenant, _demand(binds))

    def _account(self, tenant: str, d: Resources, sign: int = 1) -> None:
        cycle = self.cycle
        u = cycle.usage.get(tenant, Resources())
        cycle.usage[tenant] = u + d if sign > 0 else u - d
        if cycle.quota_book is not None:
            cycle.quota_book.add(tenant, d, sign)

    def _why(self, info: JobInfo, block: BoolArray | None, placed: int) -> PendingReason:
        tbl, job = self.cycle.table, info.job
        statics = [self.placer.static_mask(info, t) for t in info.tasks]
        if not all(m.any() for m in statics):
            return PendingReason.GPU_MODEL if job.gpu_models else PendingReason.NO_MATCHING_NODE
        for t, m in zip(info.tasks, statics, strict=True):
            if (t.gpu > tbl.gpu_count[m].max() or t.cpu_milli > tbl.cpu_total[m].max()
                    or t.memory_mib > tbl.mem_total[m].max()):
                return PendingReason.NEVER_FITS
        whole = sum(t.gpu * t.replicas for t in info.tasks)
        if whole and info.min_members >= sum(t.replicas for t in info.tasks) and (
                whole > int(tbl.gpu_count[tbl.schedulable].sum())):
            return PendingReason.NEVER_FITS
        if block is not None and block.any():
            st = self.cycle.state  # a trial, undone: cheaper than a copy, whose caches start empty
            mark = st.mark()
            binds, _ = self.placer.place_job(st, info, None, info.min_members)
            st.rollback(mark)
            if binds is not None:
                return PendingReason.BACKFILL_BLOCKED if (self.soft & ~self.hard).any() else PendingReason.PRIORITY
        if job.gpu_models:
            return PendingReason.GPU_MODEL
        if any(r.required for r in job.affinity):
            return PendingReason.AFFINITY
        return PendingReason.GANG_INCOMPLETE if placed else PendingReason.NO_FIT

    # --- preemption ------------------------------------------------------------------------
    def _future(self) -> ClusterState:
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

    @property
    def may_preempt(self) -> bool:
        """Blocked jobs may still look for victims this cycle (found or not, a search
        counts: one that finds none costs as much)."""
        return self.preempt_budget > 0

    def _preempt(self, info: JobInfo, block: BoolArray | None) -> bool:
        self.preempt_budget -= 1
        fut = self._future()
        # already room once the terminating jobs are gone: claim it, preempt no one more
        binds, _ = self.placer.place_job(fut, info, block, info.min_members)
        if binds is None:
            if self.vix is None:
                shrink = self.s.elastic is not None and self.s.elastic.shrink
                self.vix = VictimIndex(self.cycle, shrink)
                self.vix.gone = self.gone
            res = preempt_for(self.placer, fut, info, self.vix, self.s.hooks["victims"], block,
                              info.min_members, self.s.config.preemption.candidate_nodes)
            if res is None:
                return False
            chosen, binds = res
            self._emit(info, chosen)
        for b in binds:
            self.hard[self.cycle.table.index[b.node_id]] = True
        self.masks_dirty = True
        self._account(info.job.tenant, _demand(binds))  # its quota is held while it waits
        return True

    def _emit(self, info: JobInfo, chosen: list[Unit]) -> None:
        allocs = self.cycle.snapshot.allocations
        stopped = {u.run.job.job_id for u in chosen if not u.shrink}
        shrinks: dict[tuple[str, str], list[Unit]] = {}
        for u in chosen:
            jid = u.run.job.job_id
            if u.shrink and jid not in stopped:
                shrinks.setdefault((jid, task_of(allocs[u.allocs[0]])), []).append(u)
            elif not u.shrink:
                self.victims.add(jid)
                self.plan.preemptions.append(Preemption(
                    jid, u.reason, info.job.job_id, u.run.job.checkpoint_grace_s,
                    tuple(allocs[k].task_id for k in u.run.allocs),
                    tuple(sorted({allocs[k].node_id for k in u.run.allocs}))))
                self._account(u.run.job.tenant, u.run.demand, -1)
        for (jid, tname), us in shrinks.items():
            r = us[0].run
            stop = tuple(allocs[u.allocs[0]].task_id for u in us)
            current = len(us) + sum(1 for k in r.allocs if task_of(allocs[k]) == tname and not self.gone[k])
            for u in us:
                a = allocs[u.allocs[0]]
                self._account(r.job.tenant, Resources(alloc_gpus(a), a.cpu_milli, a.memory_mib), -1)
            self.plan.resizes.append(Resize(jid, tname, current, current - len(us), ResizeReason.SHRINK,
                                            stop_task_ids=stop, for_job=info.job.job_id,
                                            grace_period_s=r.job.checkpoint_grace_s))

    # --- backfill ---------------------------------------------------------------------------
    def _reserve(self, info: JobInfo) -> None:
        bf = self.s.backfill
        assert bf is not None
        now, job = self.cycle.now, info.job
        kept = self.s._reservations.get(job.job_id)
        idx = self.cycle.table.index
        if (kept is not None and kept[0] is job and now - kept[1] < bf.interval_s and kept[2].start_time > now
                and all(n in idx for n in kept[2].node_ids)):
            res: Reservation | None = kept[2]  # recent, and its start is still ahead: kept
            self.kept[job.job_id] = kept
        else:
            res = self._search_reservation(info)
            if res is not None and bf.interval_s > 0:
                self.kept[job.job_id] = (job, now, res)
        if res is None:
            return
        self.plan.reservations.append(res)
        self.shadow = min(self.shadow, res.start_time)
        for nid in res.node_ids:
            self.soft[idx[nid]] = True
        self.masks_dirty = True

    def _search_reservation(self, info: JobInfo) -> Reservation | None:
        base = self.future if self.future is not None else self.cycle.state
        victims = self.victims
        running = np.asarray([k for k, r in enumerate(self.cycle.running)
                              if not r.run.terminating and r.job.job_id not in victims], dtype=np.int64)
        if self.future is None and any(r.run.terminating for r in self.cycle.running):
            base = self._future()
        assert self.s.backfill is not None
        return reserve(self.placer, base, info, info.min_members, running, self.s.backfill.default_runtime_s,
                       self.gone)

    # --- phase 4: elastic growth -------------------------------------------------------------
    def _grow(self) -> None:
        cycle = self.cycle
        allocs = cycle.snapshot.allocations
        block = self.hard | self.soft
        runs = sorted((r for r in cycle.running
                       if r.elastic and not r.run.terminating and r.job.job_id not in self.victims),
                      key=lambda r: (-r.static_priority, r.run.start_time, r.job.job_id))
        for r in runs:
            job = r.job
            if not any(t.elastic and t.most_replicas > 0 for t in job.tasks):
                continue
            nodes = [cycle.table.index[allocs[k].node_id] for k in r.allocs if allocs[k].node_id in cycle.table.index]
            roles = [allocs[k].role or task_of(allocs[k]) for k in r.allocs]
            info = JobInfo(job=job, tasks=job.tasks, demand=Resources(), gpus=r.gpus, min_members=1)
            for t in job.tasks:
                if not t.elastic:
                    continue
                have = sorted(replica_of(allocs[k]) for k in r.allocs
                              if task_of(allocs[k]) == t.name and not self.gone[k])
                want = t.most_replicas - len(have)
                if want <= 0:
                    continue
                free_idx = [x for x in range(t.most_replicas + len(have)) if x not in set(have)][:want]
                base = self.placer.static_mask(info, t) & ~block
                binds: list[Bind] = []
                for rep in free_idx:
                    d = Resources(t.gpu_amount, t.cpu_milli, t.memory_mib)
                    if cycle.quota_book is not None and not cycle.quota_book.check(job.tenant, d).admitted:
                        break
                    p = Placing(info, t, cycle.state, 1, nodes, roles)
                    res = self.placer.choose(p, base)
                    if res is None:
                        break
                    i, uses = res
                    cycle.state.take(i, t.cpu_milli, t.memory_mib, uses)
                    b = Bind(job.job_id, f"{t.name}-{rep}", t.name, rep, cycle.table.node_ids[i], uses,
                             t.cpu_milli, t.memory_mib, t.role)
                    binds.append(b)
                    nodes.append(i)
                    roles.append(t.role)
                    self._account(job.tenant, d)
                if binds:
                    self.plan.resizes.append(Resize(job.job_id, t.name, len(have), len(have) + len(binds),
                                                    ResizeReason.GROW, binds=tuple(binds)))
