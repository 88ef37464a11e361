"""``Scheduler``: one cycle, snapshot in, plan out, in numbered phases.

1. open      the cycle from the snapshot, reusing what the last one derived
             (``SnapshotCache``); plugins' ``open`` (their per-cycle state)
2. order     pending jobs by the order plugins' keys (tiers, then submit time, then
             the snapshot's order)
3. actions   as the config lists them (scheduling.actions): allocate (with preempt
             and backfill for blocked jobs), then grow
4. plan      binds, preemptions, resizes, reservations and a reason for every job
             left, naming the job it waits behind (scheduling.diagnosis)
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from scheduling import jobcols as jc
from scheduling.actions import Action, build_actions
from scheduling.config import SchedulerConfig
from scheduling.decay import past_share
from scheduling.diagnosis import blame_cordon, name_blockers
from scheduling.framework import Cycle, JobInfo, Plugin, overrides
from scheduling.model import JobRequest, Plan, Snapshot
from scheduling.placer import Placer
from scheduling.session import Session
from scheduling.snapshot_cache import SnapshotCache

HOOKS = ("static_priority", "task_order", "order_keys", "admit", "node_mask", "task_mask", "score", "victims",
         "min_members", "pick", "settle")


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


class Scheduler:
    """Built once from a validated config; ``schedule`` is called every cycle. Keeps
    what cycles share (``SnapshotCache``; the actions' own state), so one instance
    serves one stream of snapshots."""

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self._half_life_s = self.config.decay_half_life_s()  # fair share over decayed past use
        self.plugins: list[Plugin] = self.config.build_plugins()
        self.by_name = {p.name: p for p in self.plugins}
        self.hooks: dict[str, list[Plugin]] = {h: [p for p in self.plugins if overrides(p, h)] for h in HOOKS}
        self.actions: list[Action] = build_actions(self.config, self.hooks)
        backfill = self.config.backfill_args()
        self.cache = SnapshotCache(self.hooks, backfill.default_runtime_s if backfill else None)

    def action(self, name: str) -> Action | None:
        """The configured action of that name (None: not in this config)."""
        return next((a for a in self.actions if a.name == name), None)

    # --- public API --------------------------------------------------------------------
    def schedule(self, snapshot: Snapshot) -> Plan:
        with _collector_paused():
            cycle = self.open_cycle(snapshot)
            s = Session(cycle, self.cache.job_infos(cycle), Placer(cycle, self.plugins, self.hooks, self.cache.scores))
            for a in self.actions:
                a.open(s)
            s.ordered = self._ordered(cycle, s.infos)
            s.plan.order = [i.job.job_id for i in s.ordered]
            for a in self.actions:
                a.execute(s)
            for a in self.actions:
                a.close()
            for p in self.hooks["settle"]:
                p.settle(cycle, s.plan, s.ordered)
            # a cordon first: uncordoning is what would start such a job, which says more
            # than the job that took the schedulable room
            if cycle.table.cordoned.any():
                blame_cordon(s)
            name_blockers(s)
            return s.plan

    def order(self, snapshot: Snapshot) -> list[JobRequest]:
        """The pending jobs in the order this config would try them (queueing's order)."""
        cycle = self.open_cycle(snapshot)
        return [i.job for i in self._ordered(cycle, self.cache.job_infos(cycle))]

    # --- phase 1: open -----------------------------------------------------------------
    def open_cycle(self, snapshot: Snapshot) -> Cycle:
        """The cycle's arrays and running jobs, every plugin opened (phase 1 alone)."""
        cycle = self.cache.cycle(snapshot, self.config.seed)
        self.cache.add_running(cycle)
        if snapshot.past_usage and self._half_life_s > 0:
            cycle.past_share = {t: past_share(u, cycle.capacity.gpu, self._half_life_s)
                                for t, u in snapshot.past_usage.items()}
        for p in self.plugins:
            p.open(cycle)
        return cycle

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
