"""Heterogeneity-aware placement: a job goes where it runs fastest, and a slow model
goes to the jobs that lose least there (Gavel's idea in the core's terms).

A job that carries ``gpu_speeds`` (its speed per GPU model, relative to the model its
runtime estimate is for) scores each node by the log of its speed there over its best:
twice as slow costs ``weight`` points, more than the whole range of the packing scores,
so speed comes first and packing chooses among equally fast nodes. A node whose GPUs
are of several models counts its slowest (a gang steps together). Jobs without speeds
are left alone: the plugin scores and masks nothing for them, but for a list of models
in order of preference (``gpu_model_ranks``, from ``gpuModel: [H100, A100]``), where each
step down the list scores as a halving of speed would: the first choice while it is free,
then the next (no mask, no moves: a preference is not a measured speed).

Competition (``node_mask``). While the jobs waiting ask for more whole GPUs than are
free, a job does not start on a model where it runs slower, relative to its best, than
the median waiting job does there: it leaves that model to the half of the queue that
loses less on it and waits for a better one (its best model is never refused, so it
waits at most for that). A job 10x slower on a K80 waits for a V100; a job only 1.5x
slower there takes the K80. With room for every waiting job, nothing is refused.

Jobs that started on a slow model move when a faster one is left free: the ``migrate``
action (``scheduling/actions/migrate.py``), on by default with this plugin.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scheduling.arrays import BoolArray, FloatArray, IntArray
from scheduling.framework import Cycle, JobInfo, Placing, Plugin, register
from scheduling.model import JobRequest, TaskRequest

FLOOR = 1e-6  # relative speed of a model the job cannot run on (its gpu_models keep it off)


def relative_speeds(job: JobRequest, models: Sequence[str]) -> list[float]:
    """The job's speed on each of ``models`` over its best: a model it gives no speed
    for counts at its lowest given speed (an unprofiled model is not assumed fast)."""
    speeds = dict(job.gpu_speeds)
    low = min(speeds.values())
    raw = [speeds.get(m, low) for m in models]
    top = max(max(raw), FLOOR)
    return [max(v / top, FLOOR) for v in raw]


def _gpus(job: JobRequest) -> int:
    return sum(t.replicas * t.gpu for t in job.tasks)


class SpeedBar:
    """This cycle's bar per model (by the node table's model codes): the median
    relative speed of the waiting jobs there; None while there is room for them all."""

    def __init__(self, bar: FloatArray | None) -> None:
        self.bar = bar


class ThroughputArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    migrate: bool = Field(True, description="running jobs move to faster GPUs left free when it pays "
                          "(the migrate action; needs preemption)")


@register
class Throughput(Plugin):
    name = "throughput"
    Args = ThroughputArgs
    score_by = "node"

    def bar(self, cycle: Cycle) -> FloatArray | None:
        """The models' bars for this cycle (worked out on first use)."""
        got = cycle.get(SpeedBar)
        if got is not None:
            return got.bar
        tbl = cycle.table
        jobs = [j for j in cycle.snapshot.pending if j.gpu_speeds]
        if not jobs or sum(map(_gpus, jobs)) <= int(cycle.state.idle[tbl.schedulable].sum()):
            return cycle.put(SpeedBar(None)).bar
        speeds = np.asarray([relative_speeds(j, tbl.models) for j in jobs])
        return cycle.put(SpeedBar(np.median(speeds, axis=0))).bar

    def node_mask(self, cycle: Cycle, info: JobInfo, task: TaskRequest) -> BoolArray | None:
        job = info.job
        if not job.gpu_speeds or not task.gpu:
            return None
        bar = self.bar(cycle)
        if bar is None:
            return None
        tbl = cycle.table
        speed = np.asarray(relative_speeds(job, tbl.models))
        ok = (speed >= bar) | (speed >= 1.0)
        out: BoolArray = np.asarray(np.where(tbl.exists, ok[np.maximum(tbl.gmodel, 0)], True).all(axis=1), dtype=bool)
        return out

    def score(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        job = p.info.job
        if not (job.gpu_speeds or job.gpu_model_ranks) or not (p.task.gpu or p.task.shared or p.task.mig):
            return None
        tbl = cycle.table
        if job.gpu_speeds:
            logs = np.log2(np.asarray(relative_speeds(job, tbl.models)))
        else:  # a preference: each step down the list as a halving of speed
            rank = dict(zip(job.gpu_models, job.gpu_model_ranks, strict=False))
            worst = max(job.gpu_model_ranks) + 1
            logs = -np.asarray([float(rank.get(m, worst)) for m in tbl.models])
        # per node: its slowest present model (absent GPUs count as fastest)
        node = np.where(tbl.exists, logs[np.maximum(tbl.gmodel, 0)], math.inf).min(axis=1)
        out: FloatArray = np.where(np.isfinite(node), node, 0.0)[cand]
        return out

    def score_key(self, cycle: Cycle, p: Placing) -> Hashable | None:
        job = p.info.job
        if not (job.gpu_speeds or job.gpu_model_ranks) or not (p.task.gpu or p.task.shared or p.task.mig):
            return ()
        return job.gpu_speeds, job.gpu_models, job.gpu_model_ranks
