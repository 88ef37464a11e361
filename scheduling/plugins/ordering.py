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

from scheduling.framework import Cycle, JobInfo, Plugin, RunningInfo, register
from scheduling.model import JobRequest, PreemptReason
from scheduling.state import FloatArray


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
        tier = np.empty(len(jobs))
        key = np.empty(len(jobs))
        for k, info in enumerate(jobs):
            j = info.job
            wait = max(0.0, cycle.now - j.submit_time)
            info.static_priority = self._static(j)
            info.priority = (info.static_priority + a.aging_per_hour * wait / 3600.0
                             + a.parallelism_weight * math.log2(1.0 + info.gpus))
            info.starved = wait >= a.starvation_bound_s
            tier[k] = 0.0 if info.starved else 1.0
            # starved jobs go oldest first, the rest by combined priority
            key[k] = j.submit_time if info.starved else -info.priority
        return [tier, key]

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[RunningInfo, PreemptReason]]:
        a = self.args
        if not a.preempt:
            return []
        if a.preempt_by == "class":
            mine = a.class_values.get(info.job.priority_class, 0.0)
            return [(r, PreemptReason.PRIORITY) for r in cycle.running
                    if a.class_values.get(r.job.priority_class, 0.0) < mine]
        return [(r, PreemptReason.PRIORITY) for r in cycle.running
                if info.static_priority - r.static_priority >= a.preempt_gap]


@register
class Fifo(Plugin):
    """First come, first served (submit time, then queue order)."""

    name = "fifo"

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        return [np.fromiter((i.job.submit_time for i in jobs), float, len(jobs))]


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
        return [np.fromiter(
            (math.inf if i.job.runtime_estimate_s is None else i.job.runtime_estimate_s for i in jobs),
            float, len(jobs))]


@register
class Srtf(Plugin):
    """Shortest remaining time first; preemptive when ``preempt`` is set."""

    name = "srtf"
    Args = EstimateArgs
    args: EstimateArgs

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        return [np.fromiter((_remaining(i.job, i.gpus) for i in jobs), float, len(jobs))]

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[RunningInfo, PreemptReason]]:
        if not self.args.preempt:
            return []
        mine = _remaining(info.job, info.gpus)
        return [(r, PreemptReason.SRTF) for r in cycle.running
                if _remaining(r.job, r.gpus, cycle.now - r.run.start_time) > mine]


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

    def attained(self, cycle: Cycle, r: RunningInfo) -> float:
        return r.job.attained_service_s + r.gpus * max(0.0, cycle.now - r.run.start_time)

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        q = np.fromiter((self.queue_of(i.job.attained_service_s) for i in jobs), float, len(jobs))
        return [q, np.fromiter((i.job.submit_time for i in jobs), float, len(jobs))]

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[RunningInfo, PreemptReason]]:
        if not self.args.preempt:
            return []
        mine = self.queue_of(info.job.attained_service_s)
        return [(r, PreemptReason.LAS) for r in cycle.running
                if self.queue_of(self.attained(cycle, r)) > mine]
