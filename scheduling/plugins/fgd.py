"""FGD: fragmentation gradient descent (Weng et al., USENIX ATC'23).

For a node n and a task type m, the fragment F_n(m) is the GPU capacity on n that m
cannot use: all of n's free GPU if m cannot run there at all (CPU short, no GPU of
its model, too few GPUs with room), else the free part of each GPU too small for m's
per-GPU demand. Over the workload's task types M with popularities p_m, the node's
fragmentation is F_n(M) = sum_m p_m F_n(m). A task goes where (node and GPU) it
increases F_n(M) least. Quantities are in GPUs (compute share; memory must also fit).

The workload M is ``Snapshot.task_mix`` when given (the simulator passes the trace's
mix), else the pending and running tasks of the snapshot; as in the paper's simulator
it keeps the most popular types, 10 at a time, until they cover 60% of tasks.

Speed: a node's free-resource state is interned; F and the best GPU per (state, task
type) are memoised, and a per-task-type array indexed by state id turns scoring into
one numpy gather, so only nodes whose state is new cost Python work.
"""

from __future__ import annotations

from collections.abc import Hashable
from operator import attrgetter
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scheduling.arrays import FloatArray, IntArray
from scheduling.framework import Cycle, PlacementHints, Placing, Plugin, register
from scheduling.model import GpuUse, JobRequest, TaskRequest, TaskShape
from scheduling.node_table import NodeTable
from scheduling.plugins.fgd_frag import _Type, fragmentation, live_mix, task_shapes, typical_mix
from scheduling.stash import swap
from scheduling.state import ClusterState

__all__ = ["MIX_MEMOS", "Fgd", "FgdArgs", "_Type", "fragmentation", "live_mix", "task_shapes", "typical_mix"]

_Key = tuple[int, int, int, tuple[int, ...], tuple[int, ...]]
# one mix's memos: generation, F by state, F by canonical state, increase by task type, GPU choice
_MixMemo = tuple[int, dict[int, float], dict[tuple[object, ...], float], dict[tuple[object, ...], FloatArray],
                 dict[tuple[int, tuple[object, ...]], int]]
_JOB = attrgetter("job")
MIX_MEMOS = 16  # mixes whose memos are kept besides the current one


class FgdArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    popularity_pct: float = Field(60.0, gt=0, le=100, description="task types kept cover this %")
    step: int = Field(10, ge=1, description="types are added this many at a time")
    mix_step: float = Field(0.05, ge=0, le=1, description="shares of the live mix (no Snapshot.task_mix) "
                            "are rounded to this; 0: exact")
    include_cpu_tasks: bool = Field(False, description="count GPU-less tasks in the mix")
    max_states: int = Field(200_000, ge=1000, description="memo size before it is reset")
    score: Literal["exact", "paper"] = Field(
        "exact", description="exact: -(increase of F), rounded to 1e-9 so that float noise never "
        "breaks a tie; paper: the public simulator's integer score int(levels * sigmoid(-increase))")
    levels: int = Field(100, ge=2, description="integer score levels of the paper score (theirs: 100)")
    gpu_pick: Literal["exact", "paper"] = Field(
        "exact", description="a share's GPU: exact: least increase of F, ties to the fuller GPU; paper: the "
        "lowest-index GPU of the best paper score (the public simulator's)")


@register
class Fgd(Plugin):
    name = "fgd"
    Args = FgdArgs
    args: FgdArgs

    def __init__(self, args: BaseModel, weight: float = 1.0) -> None:
        super().__init__(args, weight)
        self.mix: tuple[_Type, ...] = ()
        self.table: NodeTable | None = None
        self._counted: dict[int, JobRequest] = {}  # the jobs whose tasks are in _count
        self._count: dict[tuple[int, int, int, int, tuple[str, ...]], int] = {}
        self.generation = 0  # of the memo: the epoch of the scores
        self._generations = 0
        self._reset()

    def _reset(self) -> None:
        """Everything over: the interning of node states, the node classes, every memo."""
        self.keys: dict[_Key, int] = {}
        self.key_list: list[_Key] = []
        self.classes: IntArray | None = None
        self.class_list: list[tuple[tuple[int, ...], tuple[int, ...], tuple[bool, ...]]] = []
        self._stash: dict[tuple[_Type, ...], _MixMemo] = {}
        self._fresh_memo()

    def _fresh_memo(self) -> None:
        """Empty memos of what depends on the mix, under a new generation."""
        self._generations += 1
        self.generation = self._generations
        self.frag_memo: dict[int, float] = {}
        self.canon_memo: dict[tuple[object, ...], float] = {}
        self.delta: dict[tuple[object, ...], FloatArray] = {}
        self.choice: dict[tuple[int, tuple[object, ...]], int] = {}

    def _switch_mix(self, mix: tuple[_Type, ...]) -> None:
        """A new mix: the old one's memos are stashed, the new one's taken back if kept
        (a live mix comes back often: jobs come and go around the rounding steps; on
        Philly 64 x 8 a few hundred mixes take turns over thousands of changes)."""
        hit = swap(self._stash, self.mix, (self.generation, self.frag_memo, self.canon_memo, self.delta, self.choice),
                   mix, MIX_MEMOS)
        self.mix = mix
        if hit is None:
            self._fresh_memo()
        else:
            self.generation, self.frag_memo, self.canon_memo, self.delta, self.choice = hit

    # --- the workload ------------------------------------------------------------------
    def _mix(self, cycle: Cycle) -> tuple[_Type, ...]:
        shapes: list[TaskShape] = list(cycle.snapshot.task_mix)
        if not shapes:
            shapes = live_mix(typical_mix(self._count_tasks(cycle), self.args.popularity_pct, self.args.step,
                                          self.args.include_cpu_tasks), self.args.mix_step)
        models = cycle.table.models
        out = []
        for s in shapes:
            allowed = frozenset(models.index(m) for m in s.gpu_models if m in models) if s.gpu_models else None
            out.append((s.weight, s.gpu, s.gpu_memory_mib, s.gpu_compute_pct, s.cpu_milli, s.memory_mib,
                        allowed))
        return tuple(out)

    def _count_tasks(self, cycle: Cycle) -> list[TaskShape]:
        """The pending and running jobs' task types with their replicas summed, as
        ``task_shapes`` gives them: kept across cycles and changed by the jobs that
        came and went (job objects are compared by identity)."""
        snap = cycle.snapshot
        now = dict(zip(map(id, snap.pending), snap.pending, strict=True))
        running = list(map(_JOB, snap.running))
        now.update(zip(map(id, running), running, strict=True))
        before = self._counted
        count = self._count
        for sign, side, keys in ((-1, before, before.keys() - now.keys()), (1, now, now.keys() - before.keys())):
            for k in keys:
                j = side[k]
                for t in j.tasks:
                    key = (t.gpu, t.gpu_memory_mib, t.gpu_compute_pct, t.cpu_milli, j.gpu_models)
                    n = count.get(key, 0) + sign * t.replicas
                    if n:
                        count[key] = n
                    else:
                        del count[key]
        self._counted = now  # keeps the objects alive, so ids stay unique
        return [TaskShape(float(n), g, gm, gc, cpu, 0, models) for (g, gm, gc, cpu, models), n in count.items()]

    def open(self, cycle: Cycle) -> None:
        mix = self._mix(cycle)
        if cycle.table is not self.table or len(self.keys) > self.args.max_states:
            self.mix, self.table = mix, cycle.table
            self._reset()
        elif mix != self.mix:
            self._switch_mix(mix)
        if self.classes is None:
            t = cycle.table
            seen: dict[tuple[tuple[int, ...], tuple[int, ...], tuple[bool, ...]], int] = {}
            cls = []
            for i in range(t.n):
                c = (tuple(t.gmodel[i].tolist()), tuple(t.gmem_total[i].tolist()),
                     tuple(t.share_ok[i].tolist()))
                cls.append(seen.setdefault(c, len(seen)))
            self.classes = np.asarray(cls, dtype=np.int64)
            self.class_list = list(seen)

    # --- fragmentation of one interned node state ----------------------------------------
    def _intern(self, key: _Key) -> int:
        k = self.keys.get(key)
        if k is None:
            k = self.keys[key] = len(self.key_list)
            self.key_list.append(key)
        return k

    def node_key(self, st: ClusterState, i: int) -> int:
        assert self.classes is not None
        return self._intern((int(self.classes[i]), int(st.cpu_free[i]), int(st.mem_free[i]),
                             tuple(st.gmem_free[i].tolist()), tuple(st.gcmp_free[i].tolist())))

    def frag(self, k: int) -> float:
        f = self.frag_memo.get(k)
        if f is None:
            cls, cpu, mem, gm, gc = self.key_list[k]
            models, total_mem, ok = self.class_list[cls]
            # F does not depend on the order of the GPUs: share the value across permutations
            canon = (cpu, mem, tuple(sorted(zip(models, total_mem, ok, gm, gc, strict=True))))
            f = self.canon_memo.get(canon)
            if f is None:
                f = self.canon_memo[canon] = fragmentation(gm, gc, total_mem, ok, models, cpu, mem, self.mix)
            self.frag_memo[k] = f
        return f

    def _delta(self, k: int, t: TaskRequest, allowed: frozenset[int] | None) -> tuple[float, int]:
        """Least increase of F over the GPU choices for ``t`` on state ``k``; and that GPU."""
        cls, cpu, mem, gm, gc = self.key_list[k]
        models, total_mem, ok = self.class_list[cls]
        before = self.frag(k)
        cols = [j for j in range(len(ok)) if ok[j] and (allowed is None or models[j] in allowed)]
        cpu2, mem2 = cpu - t.cpu_milli, mem - t.memory_mib
        if not (t.gpu or t.shared):  # a GPU-less task: its CPU can strand GPUs (as in the paper's simulator)
            if cpu2 < 0 or mem2 < 0:
                return np.inf, -1
            return self.frag(self._intern((cls, cpu2, mem2, gm, gc))) - before, -1
        if t.gpu:
            idle = [j for j in cols if gc[j] >= 100 and gm[j] >= total_mem[j]][: t.gpu]
            if len(idle) < t.gpu:
                return np.inf, -1
            gm2, gc2 = list(gm), list(gc)
            for j in idle:
                gm2[j], gc2[j] = 0, 0
            return self.frag(self._intern((cls, cpu2, mem2, tuple(gm2), tuple(gc2)))) - before, -1
        best, col = np.inf, -1
        paper = self.args.gpu_pick == "paper"
        seen = set()
        for j in cols:
            if gm[j] < t.gpu_memory_mib or gc[j] < t.gpu_compute_pct:
                continue
            same = (gm[j], gc[j], models[j], total_mem[j])
            if same in seen:
                continue  # an identical GPU earlier in the row gives the same F
            seen.add(same)
            gm2, gc2 = list(gm), list(gc)
            gm2[j] -= t.gpu_memory_mib
            gc2[j] -= t.gpu_compute_pct
            d = self.frag(self._intern((cls, cpu2, mem2, tuple(gm2), tuple(gc2)))) - before
            d += self.share_cost(gc[j], gc2[j])
            if paper:  # the first GPU of the best integer score, as the public simulator picks
                if col < 0 or self.paper_score(d) > self.paper_score(best):
                    best, col = d, j
            # else ties: the fuller GPU (best fit), then the lower index
            elif d < best - 1e-12 or (abs(d - best) <= 1e-12 and col >= 0 and gc2[j] < gc[col] - t.gpu_compute_pct):
                best, col = d, j
        return best, col

    def paper_score(self, d: float) -> float:
        """The public simulator's node score for an increase ``d`` of F (GPUs)."""
        return float(np.floor(self.args.levels / (1.0 + np.exp(min(d, 700.0)))))

    def share_cost(self, before_pct: int, after_pct: int) -> float:
        """Extra cost of a share taking one GPU from ``before_pct`` to ``after_pct`` free
        compute, added to the increase of F (none for FGD; Kairos' packing values holes)."""
        return 0.0

    # --- hooks ---------------------------------------------------------------------------
    def _task_key(self, cycle: Cycle, p: Placing) -> tuple[tuple[object, ...], frozenset[int] | None]:
        t = p.task
        models = p.info.job.gpu_models if cycle.setdefault(PlacementHints).enforce_models else ()
        allowed = (frozenset(cycle.table.models.index(m) for m in models if m in cycle.table.models)
                   if models else None)
        return (t.gpu, t.gpu_memory_mib, t.gpu_compute_pct, t.cpu_milli, t.memory_mib, allowed), allowed

    def _state_ids(self, st: ClusterState, cand: IntArray) -> IntArray:
        """Interned state of each candidate node, kept on the state, caught up with the
        nodes changed since the last call."""
        ent = st.cache.get("fgd")
        if ent is None or ent[0] is not self.keys:
            ent = st.cache["fgd"] = [self.keys, np.full(st.t.n, -1, dtype=np.int64), len(st.dirty)]
        kid = ent[1]
        rows, ent[2] = st.changed_since(ent[2])
        for i in rows:
            kid[i] = -1
        ids: IntArray = kid[cand]
        if (ids < 0).any():
            for j in np.flatnonzero(ids < 0).tolist():
                i = int(cand[j])
                kid[i] = ids[j] = self.node_key(st, i)
        return ids

    def score(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        d = self.increase(cycle, p, cand)
        if d is None:
            return None
        if self.args.score == "paper":
            # ties (many: whole GPUs often leave F unchanged) go to the lowest node index
            return np.floor(self.args.levels / (1.0 + np.exp(np.minimum(d, 700.0))))
        return -np.round(d, 9)

    def score_key(self, cycle: Cycle, p: Placing) -> Hashable | None:
        return self._task_key(cycle, p)[0]

    def score_epoch(self, cycle: Cycle) -> Hashable | None:
        return self.generation  # a new mix (or table) starts the memo over, a kept one resumes it

    def increase(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        """Least increase of F on each candidate node (1e6 where the task cannot go)."""
        t = p.task
        if not (t.gpu or t.shared or t.cpu_milli or t.memory_mib) or t.mig:
            return None
        ids = self._state_ids(p.state, cand)
        tk, allowed = self._task_key(cycle, p)
        arr = self.delta.get(tk)
        if arr is None or arr.size < len(self.key_list):
            grown = np.full(max(2 * len(self.key_list), 1024), np.nan)
            if arr is not None:
                grown[: arr.size] = arr
            arr = self.delta[tk] = grown
        d = arr[ids]
        miss = np.isnan(d)
        if miss.any():
            for k in np.unique(ids[miss]).tolist():
                arr[k], self.choice[(k, tk)] = self._delta(k, t, allowed)
            if arr.size < len(self.key_list):  # interning the after-states grew the table
                grown = np.full(2 * len(self.key_list), np.nan)
                grown[: arr.size] = arr
                arr = self.delta[tk] = grown
            d = arr[ids]
        out: FloatArray = np.where(np.isfinite(d), d, 1e6)
        return out

    def pick(self, cycle: Cycle, p: Placing, i: int) -> tuple[GpuUse, ...] | None:
        t = p.task
        if not t.shared:
            return None  # whole GPUs: the topology-aware default pick
        k = int(self._state_ids(p.state, np.asarray([i]))[0])
        tk, allowed = self._task_key(cycle, p)
        col = self.choice.get((k, tk))
        if col is None:
            _, col = self._delta(k, t, allowed)
        if col is None or col < 0:
            return None
        return (GpuUse(cycle.table.gpu_index[i][col], t.gpu_memory_mib, t.gpu_compute_pct),)
