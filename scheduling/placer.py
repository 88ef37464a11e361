"""Placing replicas: feasibility as numpy masks, plugin scores (memoised by node
state), and the GPU pick (plugins', else ``scheduling.gpu_pick``).

One path for every caller (allocation, preemption trials, backfill reservations,
elastic growth, the simulator): ``place_job`` on a ``ClusterState``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduling.arrays import BoolArray, FloatArray, IntArray
from scheduling.framework import Cycle, JobInfo, PlacementHints, Placing, Plugin
from scheduling.gangfit import GangFence
from scheduling.gpu_pick import default_pick
from scheduling.model import Bind, GpuUse, TaskRequest
from scheduling.stash import swap
from scheduling.state import ClusterState

_NEG = -np.inf
EPOCHS_KEPT = 16  # score epochs whose arrays are kept besides the current one


@dataclass(slots=True)
class ScoreMemo:
    """Weighted scores by node state (``ClusterState.state_ids``), one array per key:
    kept across cycles while the table's interning of states and every per-state
    plugin's ``score_epoch`` stay the same (an epoch of None: this cycle only). The
    arrays of the last few epochs are kept too: an epoch that comes back (FGD's live
    workload mix returning to an earlier value) resumes its scores."""

    states: object = None
    epoch: tuple[Hashable | None, ...] = ()
    arrays: dict[tuple[object, ...], FloatArray] = field(default_factory=dict)
    stash: dict[tuple[Hashable | None, ...], dict[tuple[object, ...], FloatArray]] = field(default_factory=dict)

    def check(self, states: object, epoch: tuple[Hashable | None, ...]) -> None:
        if self.states is not states or None in epoch:
            self.restart(states)
            self.epoch = epoch
        elif self.epoch != epoch:
            # leaving scores of one cycle only (None in the epoch: the stash was emptied then)
            self.arrays = {} if None in self.epoch else swap(self.stash, self.epoch, self.arrays, epoch,
                                                             EPOCHS_KEPT) or {}
            self.epoch = epoch

    def restart(self, states: object) -> None:
        """A new interning of node states: nothing kept holds."""
        self.states, self.arrays, self.stash = states, {}, {}


class Placer:
    memo = True  # keep keyed scores (same plans either way; False is the reference path)

    def __init__(self, cycle: Cycle, plugins: Sequence[Plugin], hooks: dict[str, list[Plugin]],
                 memo: ScoreMemo | None = None) -> None:
        self.cycle = cycle
        self.table = cycle.table
        self.node_masks = hooks["node_mask"]
        self.task_masks = hooks["task_mask"]
        self.scorers = [p for p in hooks["score"] if p.weight > 0]
        self.pickers = hooks["pick"]
        self.hints = cycle.setdefault(PlacementHints)  # as the plugins set it in ``open``
        self._static: dict[tuple[object, ...], BoolArray] = {}
        self._memo = memo if memo is not None else ScoreMemo()
        self._memo.check(self.table.states,
                         tuple(sp.score_epoch(cycle) for sp in self.scorers if sp.score_by == "state"))
        self._per_node: dict[tuple[object, ...], FloatArray] = {}  # per-node plugins' scores
        self._lead = 0  # the leading run of per-state scorers, summed from one memo
        while self._lead < len(self.scorers) and self.scorers[self._lead].score_by == "state":
            self._lead += 1

    # --- predicates ------------------------------------------------------------------
    def static_mask(self, info: JobInfo, task: TaskRequest) -> BoolArray:
        """Nodes the task may ever use this cycle (schedulable, selectors, taints, models)."""
        job = info.job
        uses_gpu = bool(task.gpu or task.shared or task.mig)
        key = (tuple(sorted(job.node_selector.items())), job.tolerations,
               job.gpu_models if uses_gpu else (), uses_gpu, job.gpu_speeds if uses_gpu else ())
        m = self._static.get(key)
        if m is None:
            m = self.table.schedulable.copy()
            for p in self.node_masks:
                r = p.node_mask(self.cycle, info, task)
                if r is not None:
                    m &= r
            self._static[key] = m
        return m

    def fit_mask(self, st: ClusterState, task: TaskRequest, base: BoolArray) -> BoolArray:
        """Nodes in ``base`` with room for one replica. The capacity part is cached per
        task shape on the state and brought up to date for the nodes changed since."""
        key = task.shape
        cache: dict[tuple[object, ...], list[object]] = st.cache.setdefault("fit", {})
        ent = cache.get(key)
        if ent is None:
            mask = self._room(st, task, np.arange(self.table.n))
            cache[key] = [mask, len(st.dirty)]
        else:
            mask, cursor = ent  # type: ignore[assignment]
            rows, ent[1] = st.changed_since(cursor)  # type: ignore[arg-type]
            if rows:
                r = np.asarray(rows)
                mask[r] = self._room(st, task, r)
        return base & mask

    def _room(self, st: ClusterState, task: TaskRequest, rows: IntArray) -> BoolArray:
        m = (st.cpu_free[rows] >= task.cpu_milli) & (st.mem_free[rows] >= task.memory_mib)
        if task.gpu:
            m &= st.idle[rows] >= task.gpu
        elif task.shared:
            m &= ((st.gmem_free[rows] >= task.gpu_memory_mib) & (st.gcmp_free[rows] >= task.gpu_compute_pct)
                  & self.table.share_ok[rows]).any(axis=1)
        elif task.mig:
            c = self.table.mig_masks(task.mig_profile)[rows]
            m &= ((st.mig_free[rows][:, :, None] & c) == c).any(axis=(1, 2))
        out: BoolArray = m
        return out

    # --- one replica -----------------------------------------------------------------
    def choose(self, p: Placing, base: BoolArray) -> tuple[int, tuple[GpuUse, ...]] | None:
        t = p.task
        if t.gpu and not (p.state.idle[base] >= t.gpu).any():
            return None  # no allowed node has that many idle GPUs: no score needs bringing up to date
        kept = self._kept_total(p)
        if kept is None:
            cand: IntArray = np.flatnonzero(self.fit_mask(p.state, p.task, base))
            return self.choose_among(p, cand)
        # the same choice as choose_among: the best score, ties to the lowest node index
        total = np.where(base, kept, _NEG)
        while total.size:
            i = int(np.argmax(total))
            if total[i] == _NEG:
                return None
            uses = self.pick(p, i)
            if uses is not None:
                return i, uses
            total[i] = _NEG
        return None  # no nodes at all

    def choose_among(self, p: Placing, cand: IntArray) -> tuple[int, tuple[GpuUse, ...]] | None:
        if cand.size == 0:
            return None
        for tm in self.task_masks:
            r = tm.task_mask(self.cycle, p, cand)
            if r is not None:
                cand = cand[r]
                if cand.size == 0:
                    return None
        total = np.zeros(cand.size) if cand.size == 1 or not self.scorers else self.scores(p, cand)
        while True:
            j = int(np.argmax(total))  # first of the best: ties go to the lowest node index
            if total[j] == _NEG:
                return None
            i = int(cand[j])
            uses = self.pick(p, i)
            if uses is not None:
                return i, uses
            total[j] = _NEG  # e.g. free GPUs of a disallowed model on a mixed node

    def scores(self, p: Placing, cand: IntArray) -> FloatArray:
        """The weighted sum of the plugins' scores on each candidate, in plugin order
        (plugins with a ``score_key`` from their memos: the same numbers)."""
        keys = [sp.score_key(self.cycle, p) if self.memo else None for sp in self.scorers]
        total = np.zeros(cand.size)
        sid = p.state.state_ids()[cand] if any(k is not None for k in keys) else None
        for sp, k in zip(self.scorers, keys, strict=True):
            if k is None:
                s = sp.score(self.cycle, p, cand)
                if s is not None:
                    total += sp.weight * s
            elif sp.score_by == "node":
                total += self._by_node(p, sp, k)[cand]
            else:
                assert sid is not None
                total += self._by_state(p, (sp.name, k), (sp,), sid, cand, False)
        return total

    def _kept_total(self, p: Placing) -> FloatArray | None:
        """Every node's weighted score sum for this replica, -inf where it does not fit,
        kept on the state while every plugin has a ``score_key`` and no task mask
        applies, and brought up to date for the nodes changed since. Else None.

        The sum is taken in plugin order, as ``scores`` does; its leading run of
        per-state plugins comes from one memo by node state, so a changed node whose
        new state was seen before costs no plugin call."""
        if not self.memo:
            return None
        if self.task_masks and any(tm.task_mask_applies(self.cycle, p) for tm in self.task_masks):
            return None
        keys = [sp.score_key(self.cycle, p) for sp in self.scorers]
        if None in keys:
            return None
        t, st = p.task, p.state
        shape = t.shape
        key = (shape, *keys)
        cache: dict[tuple[object, ...], list[object]] = st.cache.setdefault("scores", {})
        ent = cache.get(key)
        sids = st.state_ids()
        if ent is None:
            rows = np.arange(self.table.n)
            out = np.empty(self.table.n)
            cache[key] = ent = [out, len(st.dirty)]
        else:
            out = ent[0]  # type: ignore[assignment]
            changed, ent[1] = st.changed_since(ent[1])  # type: ignore[arg-type]
            if not changed:
                return out
            rows = np.asarray(changed)
        sid = sids[rows]
        lead = self._lead
        total = self._by_state(p, ("lead", shape, *keys[:lead]), tuple(self.scorers[:lead]), sid, rows, True)
        for sp, k in zip(self.scorers[lead:], keys[lead:], strict=True):
            if sp.score_by == "node":
                total += self._by_node(p, sp, k)[rows]
            else:
                total += self._by_state(p, (sp.name, k), (sp,), sid, rows, False)
        out[rows] = total
        return out

    def _by_state(self, p: Placing, key: tuple[object, ...], plugins: tuple[Plugin, ...], sid: IntArray,
                  rows: IntArray, fit: bool) -> FloatArray:
        """The plugins' weighted score sum on ``rows`` (-inf where the replica does not
        fit, with ``fit``), memoised by node state (``sid``, the rows' ids) in the
        ``ScoreMemo``, which outlives the cycle while the epochs hold."""
        if self._memo.states is not self.table.states:  # the interning started over mid-cycle
            self._memo.restart(self.table.states)
        memos = self._memo.arrays
        memo = memos.get(key)
        top = int(sid.max()) + 1 if sid.size else 0
        if memo is None or memo.size < top:
            grown = np.full(max(2 * top, 1024), np.nan)
            if memo is not None:
                grown[: memo.size] = memo
            memo = memos[key] = grown
        vals = memo[sid]
        miss = np.isnan(vals)
        if miss.any():
            new, first = np.unique(sid[miss], return_index=True)
            rep = rows[miss][first]  # one node in each missing state
            total = np.zeros(rep.size)
            for sp in plugins:
                s = sp.score(self.cycle, p, rep)
                if s is not None:
                    total += sp.weight * s
            if fit:
                total = np.where(self._room(p.state, p.task, rep), total, _NEG)
            memo[new] = total
            vals = memo[sid]
        return vals

    def _by_node(self, p: Placing, sp: Plugin, key: object) -> FloatArray:
        """A per-node plugin's weighted scores of every node, for this cycle."""
        arr = self._per_node.get((sp.name, key))
        if arr is None:
            s = sp.score(self.cycle, p, np.arange(self.table.n))
            arr = self._per_node[(sp.name, key)] = np.zeros(self.table.n) if s is None else sp.weight * s
        return arr

    def pick(self, p: Placing, i: int) -> tuple[GpuUse, ...] | None:
        for pk in self.pickers:
            uses = pk.pick(self.cycle, p, i)
            if uses is not None:
                return uses
        return default_pick(self.table, self.hints, p, i)

    # --- a whole job -----------------------------------------------------------------
    def place_job(self, st: ClusterState, info: JobInfo, block: BoolArray | None,
                  need: int, prefix: Placing | None = None,
                  fence: bool = True) -> tuple[list[Bind] | None, int]:
        """Place the job's replicas on ``st``: at least ``need`` of them, or none.

        A gang goes on the fewest nodes (then, with the topology plugin, racks) that can
        hold it now (``scheduling/gangfit.py``): each replica group that fits whole is
        fenced to the nodes that keep that possible, the plugins choosing among them.
        Where the fence cannot be kept (a task mask, a GPU pick refused), the job is
        placed again without it, as the plugins alone would place it.

        Returns (binds, 0) on success, else (None, how many replicas had been placed).
        """
        remaining = sum(t.replicas for t in info.tasks)
        gang = fence and remaining + (len(prefix.nodes) if prefix else 0) > 1 and not any(
            r.anti for r in info.job.affinity)  # spread on purpose: as the plugins place it
        strict = need >= remaining
        if strict:
            # A necessary condition first: a gang that cannot fit is not placed and undone.
            for t in info.tasks:
                if t.gpu and t.replicas > 1:
                    room = int((st.idle // t.gpu).sum())
                    if room < t.replicas:
                        return None, room
        mark = st.mark()
        binds: list[Bind] = []
        nodes = list(prefix.nodes) if prefix else []
        roles = list(prefix.roles) if prefix else []
        domains: dict[int, set[int]] = {}
        node_ids = self.table.node_ids
        multi_domain = self.table.multi_domain
        for task in info.tasks:
            base = self.static_mask(info, task)
            if block is not None:
                base = base & ~block
            p = Placing(info, task, st, remaining, nodes, roles, domains)
            gf = GangFence.open(st, task, base, nodes, task.replicas, self.hints.gang_racks) if gang else None
            for r in range(task.replicas):
                p.remaining = remaining
                res = self.choose(p, base if gf is None else base & gf.allowed())
                if res is None:
                    if gf is not None:  # the fence could not be kept: without it
                        st.rollback(mark)
                        return self.place_job(st, info, block, need, prefix, fence=False)
                    if strict:
                        placed = len(binds)
                        st.rollback(mark)
                        return None, placed
                    remaining -= task.replicas - r
                    break
                i, uses = res
                st.take(i, task.cpu_milli, task.memory_mib, uses)
                if gf is not None:
                    gf.placed(i)
                if multi_domain and task.gpu:
                    dom, cols = self.table.nvlink_l[i], self.table.col_of[i]
                    domains.setdefault(i, set()).update(dom[cols[u.index]] for u in uses)
                binds.append(Bind(info.job.job_id, f"{task.name}-{r}", task.name, r, node_ids[i],
                                  uses, task.cpu_milli, task.memory_mib, task.role))
                nodes.append(i)
                roles.append(task.role)
                remaining -= 1
        if len(binds) < need or not binds:
            placed = len(binds)
            st.rollback(mark)
            return None, placed
        st.commit(mark)
        return binds, 0

    def apply_binds(self, st: ClusterState, binds: Sequence[Bind], sign: int = 1) -> None:
        index = self.table.index
        for b in binds:
            st.take(index[b.node_id], b.cpu_milli, b.memory_mib, b.gpus, sign)
