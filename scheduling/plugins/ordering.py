"""Job ordering plugins: combined priority with aging, FIFO, SJF, SRTF, Tiresias 2D-LAS.

Each returns sort keys over the pending jobs (ascending = earlier); keys of plugins
earlier in the config dominate, like Volcano's tiers. Those that are preemptive
(priority, SRTF, Tiresias) also name the running jobs a pending job may preempt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scheduling import jobcols as jc
from scheduling.framework import Cycle, JobInfo, Plugin, register
from scheduling.model import JobRequest, PreemptReason
from scheduling.state import BoolArray, FloatArray


class PriorityArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    class_values: dict[str, float] = Field(
        default_factory=lambda: {"low": 0.0, "normal": 1000.0, "high": 2000.0, "urgent": 3000.0}
    )
    user_weight: float = Field(0.4, ge=0, description="points per unit of user priority")
    aging_per_hour: float = Field(50.0, ge=0, description="points gained per hour waited")
    starvation_bound_s: float = Field(4 * 3600.0, gt=0, description="wait after which a job goes first")
    parallelism_weight: float = Field(0.0, description="points per log2(1 + GPUs); <0 favours small")
    role_order: list[str] = Field(
        default_factory=lambda: ["chief", "master", "ps", "scheduler", "worker", "evaluator"]
    )
    preempt: bool = True
    preempt_by: Literal["class", "priority"] = "class"
    preempt_gap: float = Field(1000.0, ge=0, description="static priority gap (preempt_by=priority)")


@register
class Priority(Plugin):
    """Combined priority: class, user priority, aging, parallelism; starved jobs first."""

    name = "priority"
    Args = PriorityArgs
    args: PriorityArgs

    def _static(self, job: JobRequest) -> float:
        a = self.args
        return a.class_values.get(job.priority_class, 0.0) + a.user_weight * job.priority

    def open(self, cycle: Cycle) -> None:
        cycle.priority_of = self._static
        cycle.role_rank = {r: i for i, r in enumerate(self.args.role_order)}
        cycle.starvation_bound_s = self.args.starvation_bound_s

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        a = self.args
        c = cycle.cols
        submit = c[jc.SUBMIT]
        wait = np.maximum(0.0, cycle.now - submit)
        prio = c[jc.STATIC] + a.aging_per_hour * wait / 3600.0 + a.parallelism_weight * np.log2(1.0 + c[jc.GPUS])
        starved = wait >= a.starvation_bound_s
        cycle.job_priority, cycle.job_starved = prio, starved  # the scheduler copies them to JobInfo
        # starved jobs go oldest first, the rest by combined priority
        return [np.where(starved, 0.0, 1.0), np.where(starved, submit, -prio)]

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[BoolArray, PreemptReason]]:
        a = self.args
        if not a.preempt or not cycle.running:
            return []
        if a.preempt_by == "class":
            classes = cycle.extra.get("priority.class")
            if classes is None:
                classes = cycle.extra["priority.class"] = np.fromiter(
                    (a.class_values.get(r.job.priority_class, 0.0) for r in cycle.running), float,
                    len(cycle.running))
            return [(classes < a.class_values.get(info.job.priority_class, 0.0), PreemptReason.PRIORITY)]
        return [(info.static_priority - cycle.runs().static >= a.preempt_gap, PreemptReason.PRIORITY)]


@register
class Fifo(Plugin):
    """First come, first served (submit time, then queue order)."""

    name = "fifo"

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        return [cycle.cols[jc.SUBMIT]]


class EstimateArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    preempt: bool = Field(False, description="SRTF only: preempt jobs with more time left")


def _remaining(job: JobRequest, gpus: float, elapsed: float = 0.0) -> float:
    """Estimated seconds left; jobs without an estimate go last."""
    if job.runtime_estimate_s is None:
        return math.inf
    done = elapsed + (job.attained_service_s / gpus if gpus else 0.0)
    return max(0.0, job.runtime_estimate_s - done)


@register
class Sjf(Plugin):
    """Shortest job first on runtime estimates."""

    name = "sjf"
    Args = EstimateArgs

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        est = cycle.cols[jc.ESTIMATE]
        return [np.where(np.isnan(est), math.inf, est)]


@register
class Srtf(Plugin):
    """Shortest remaining time first; preemptive when ``preempt`` is set."""

    name = "srtf"
    Args = EstimateArgs
    args: EstimateArgs

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        c = cycle.cols
        est = np.where(np.isnan(c[jc.ESTIMATE]), math.inf, c[jc.ESTIMATE])
        done = np.where(c[jc.GPUS] > 0, c[jc.ATTAINED] / np.maximum(c[jc.GPUS], 1e-9), 0.0)
        return [np.maximum(0.0, est - done)]

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[BoolArray, PreemptReason]]:
        if not self.args.preempt or not cycle.running:
            return []
        rt = cycle.runs()
        done = (cycle.now - rt.start) + np.where(rt.gpus > 0, rt.attained / np.maximum(rt.gpus, 1e-9), 0.0)
        left = np.maximum(0.0, rt.estimate - done)
        return [(left > _remaining(info.job, info.gpus), PreemptReason.SRTF)]


class TiresiasArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # the public Tiresias simulator's defaults: two queues split at 3,600 GPU-seconds
    thresholds_gpu_s: list[float] = Field(default_factory=lambda: [3600.0])
    preempt: bool = True


@register
class Tiresias(Plugin):
    """Tiresias 2D-LAS: queues by attained GPU-seconds, FIFO within a queue; preemptive."""

    name = "tiresias"
    Args = TiresiasArgs
    args: TiresiasArgs

    def queue_of(self, attained: float) -> int:
        return sum(1 for t in self.args.thresholds_gpu_s if attained >= t)

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        c = cycle.cols
        q = np.searchsorted(np.asarray(self.args.thresholds_gpu_s), c[jc.ATTAINED], side="right")
        return [q.astype(float), c[jc.SUBMIT]]

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[BoolArray, PreemptReason]]:
        if not self.args.preempt or not cycle.running:
            return []
        rt = cycle.runs()
        attained = rt.attained + rt.gpus * np.maximum(0.0, cycle.now - rt.start)
        queue = np.searchsorted(np.asarray(self.args.thresholds_gpu_s), attained, side="right")
        return [(queue > self.queue_of(info.job.attained_service_s), PreemptReason.LAS)]
