"""Placement scores: bin-packing or spread, topology, telemetry, dataset locality,
and the BestFit and Random baselines. Scores are arrays over candidate nodes, higher
is better, roughly in [-1, 1]; the scheduler sums them with the configured weights.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scheduling.arrays import FloatArray, IntArray
from scheduling.framework import Cycle, PlacementHints, Placing, Plugin, register


def _need_pct(p: Placing) -> float:
    return 100.0 * p.task.gpu_amount  # a MIG instance: its slices of seven


def _gpu_fill_after(cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray:
    """Share of the node's GPU (else CPU) capacity in use once the replica is placed."""
    st, tbl = p.state, cycle.table
    cap = tbl.gpu_count[cand] * 100.0
    need = _need_pct(p)
    if need > 0:
        return np.where(cap > 0, (cap - st.cmp_sum[cand] + need) / np.maximum(cap, 1.0), 1.0)
    cpu = np.maximum(tbl.cpu_total[cand], 1)
    return 1.0 - (st.cpu_free[cand] - p.task.cpu_milli) / cpu


class BinpackArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    strategy: Literal["binpack", "spread"] = "binpack"


@register
class Binpack(Plugin):
    """Bin-packing (fill busy nodes first, keep whole nodes free) or spread."""

    name = "binpack"
    Args = BinpackArgs
    args: BinpackArgs

    def open(self, cycle: Cycle) -> None:
        cycle.setdefault(PlacementHints).spread = self.args.strategy == "spread"

    def score(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        fill = _gpu_fill_after(cycle, p, cand)
        return 1.0 - fill if self.args.strategy == "spread" else fill

    def score_key(self, cycle: Cycle, p: Placing) -> Hashable | None:
        return p.task.shape

    def score_epoch(self, cycle: Cycle) -> Hashable | None:
        return ()  # a function of the node's state and the task alone


@register
class BestFit(Plugin):
    """The FGD paper's BestFit baseline: least remaining (GPU + CPU) after placement."""

    name = "bestfit"
    # The paper's simulator normalises by one largest node spec (128 cores, 8 GPUs), not
    # by each node's own capacity: least remaining in absolute terms wins.
    MAX_CPU_MILLI = 128_000.0
    MAX_GPU_PCT = 800.0

    def score(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        cpu_left = (p.state.cpu_free[cand] - p.task.cpu_milli) / self.MAX_CPU_MILLI
        gpu_left = (p.state.cmp_sum[cand] - _need_pct(p)) / self.MAX_GPU_PCT
        return np.asarray(-(0.5 * cpu_left + 0.5 * gpu_left), dtype=np.float64)

    def score_key(self, cycle: Cycle, p: Placing) -> Hashable | None:
        return p.task.shape

    def score_epoch(self, cycle: Cycle) -> Hashable | None:
        return ()  # a function of the node's state and the task alone


@register
class RandomPlacement(Plugin):
    """The Random baseline: any feasible node, seeded from config and snapshot time."""

    name = "random"

    def open(self, cycle: Cycle) -> None:
        self.rng = cycle.rng(salt=1)

    def score(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        return self.rng.random(cand.size)


@register
class Topology(Plugin):
    """Same node, then one NVLink domain, then one rack (switch) for a job's GPUs.

    With it, the placer's gang fence (``scheduling/gangfit.py``) keeps a gang that goes
    on the fewest nodes also in the fewest racks (one, where one holds it on as few).
    +1 when a multi-GPU replica fits inside one NVLink domain of the node; for gangs,
    +1 on a node already holding the job, +0.5 in a rack already holding it, and for
    the first replica +0.5 in racks that can hold the whole remaining gang.
    """

    name = "topology"

    def open(self, cycle: Cycle) -> None:
        cycle.setdefault(PlacementHints).gang_racks = True  # the gang fence: one rack where it can

    def score(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        t, st, tbl = p.task, p.state, cycle.table
        gang = p.remaining + len(p.nodes) > 1
        if t.gpu < 2 and not gang:
            return None
        out = np.zeros(cand.size)
        if t.gpu >= 2:
            out += st.dom_idle[cand] >= t.gpu
        if gang:
            if p.nodes:
                here = np.zeros(tbl.n, dtype=bool)
                here[p.nodes] = True
                racks = np.zeros(len(tbl.racks), dtype=bool)
                racks[tbl.rack[p.nodes]] = True
                out += here[cand]
                out += 0.5 * racks[tbl.rack[cand]]
            elif t.gpu:
                per_node = np.minimum(st.idle[cand] // t.gpu, st.cpu_free[cand] // max(t.cpu_milli, 1))
                fit = np.bincount(tbl.rack[cand], weights=per_node, minlength=len(tbl.racks))
                out += 0.5 * (fit[tbl.rack[cand]] >= p.remaining)
        return out

    def score_epoch(self, cycle: Cycle) -> Hashable | None:
        return ()

    def score_key(self, cycle: Cycle, p: Placing) -> Hashable | None:
        if p.remaining + len(p.nodes) > 1:
            return None  # a gang's score depends on where its other replicas went
        return p.task.gpu


@register
class LoadAware(Plugin):
    """Away from hot, busy or degraded GPUs, from the agents' telemetry."""

    name = "loadaware"
    score_by = "node"

    def __init__(self, args: BaseModel, weight: float = 1.0) -> None:
        super().__init__(args, weight)
        self._src: object = None
        self._node: FloatArray | None = None
        self._gpu: FloatArray | None = None

    def open(self, cycle: Cycle) -> None:
        tele = cycle.snapshot.telemetry
        if not tele:
            self._node = None
            cycle.setdefault(PlacementHints).gpu_penalty = None
            return
        if tele is not self._src or self._gpu is None or self._gpu.shape != (cycle.table.n, cycle.table.g):
            tbl = cycle.table
            pen = np.zeros((tbl.n, tbl.g))
            for nid, stats in tele.items():
                i = tbl.index.get(nid)
                if i is None:
                    continue
                cols = tbl.col_of[i]
                for s in stats:
                    j = cols.get(s.index)
                    if j is not None:
                        heat = min(max((s.temperature_c - 40.0) / 50.0, 0.0), 1.0)
                        pen[i, j] = 0.5 * s.utilization_pct / 100.0 + 0.5 * heat + (1.0 if s.degraded else 0.0)
            self._src, self._gpu = tele, pen
            self._node = pen.sum(axis=1) / np.maximum(tbl.exists.sum(axis=1), 1)
        cycle.setdefault(PlacementHints).gpu_penalty = self._gpu

    def score(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        if self._node is None:
            return None
        return -self._node[cand]

    def score_key(self, cycle: Cycle, p: Placing) -> Hashable | None:
        return ()


class LocalityArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    bonus: float = Field(1.0, ge=0)


@register
class Locality(Plugin):
    """Prefer nodes whose local cache already holds the job's dataset."""

    name = "locality"
    score_by = "node"
    Args = LocalityArgs
    args: LocalityArgs

    def score(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        ds = p.info.job.dataset
        if not ds:
            return None
        key = ("dataset", ds)
        m = cycle.table.mask_cache.get(key)
        if m is None:
            m = np.fromiter((ds in n.datasets for n in cycle.table.nodes), bool, cycle.table.n)
            cycle.table.mask_cache[key] = m
        return np.asarray(self.args.bonus * m[cand], dtype=np.float64)

    def score_key(self, cycle: Cycle, p: Placing) -> Hashable | None:
        return p.info.job.dataset
