"""Job ordering plugins: combined priority with aging, FIFO, SJF, SRTF, Tiresias 2D-LAS.

Each returns sort keys over the pending jobs (ascending = earlier); keys of plugins
earlier in the config dominate, like Volcano's tiers. Those that are preemptive
(priority, SRTF, Tiresias) also name the running jobs a pending job may preempt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scheduling import jobcols as jc
from scheduling.arrays import BoolArray, FloatArray
from scheduling.estimates import expected_left, mean_left
from scheduling.framework import Cycle, JobInfo, JobPriorities, Plugin, register
from scheduling.model import JobRequest, Plan, PreemptReason, TaskRequest

UNKNOWN_S = 3600.0  # expected run time of a job with no estimate that has not run yet


class PriorityArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    class_values: dict[str, float] = Field(
        default_factory=lambda: {"low": 0.0, "normal": 1000.0, "high": 2000.0, "urgent": 3000.0}
    )
    user_weight: float = Field(0.4, ge=0, description="points per unit of user priority")
    aging_per_hour: float = Field(50.0, ge=0, description="points gained per hour waited")
    starvation_bound_s: float = Field(4 * 3600.0, gt=0, description="wait after which a job goes first")
    backlog_factor: float = Field(0.0, ge=0, description=">0: under overload the bound stretches to this "
                                  "many times the time the cluster needs to clear its backlog")
    fifo_ahead: float = Field(0.0, ge=0, description=">0: a job is also starved once it has waited this "
                              "many times the time the cluster needs for the work submitted before it "
                              "and still queued or running (what FIFO would still make it wait)")
    fifo_guard: float = Field(0.0, ge=0, description=">0: a job is also starved once its total wait "
                              "(first wait and every requeue) reaches this fraction of the longest wait "
                              "FIFO is known to give: the peak so far of the time the whole cluster needs "
                              "for the expected work queued and running")
    overtaken: bool = Field(False, description="a job that has never run is also starved once jobs "
                            "submitted after it, and put after it in the order, have started while it "
                            "waited (it is kept out by its shape, not its rank), and it has waited as "
                            "long as FIFO would still make it wait (fifo_ahead's estimate)")
    fairshare_weight: float = Field(0.0, ge=0, description="points a tenant's jobs lose per unit of "
                                    "its decayed past share of the GPUs (with fairshare's half_life_s; "
                                    "Slurm's PriorityWeightFairshare): at 100, a tenant that held the whole "
                                    "cluster lately waits two hours of aging behind one that held nothing")
    hold_line: bool = Field(True, description="a starved job that cannot start and has no reservation "
                            "stops every job after it (false: later jobs that fit still start, as in FIFO)")
    parallelism_weight: float = Field(0.0, description="points per log2(1 + GPUs); <0 favours small")
    role_order: list[str] = Field(
        default_factory=lambda: ["chief", "master", "ps", "scheduler", "worker", "evaluator"]
    )
    preempt: bool = True
    preempt_by: Literal["class", "priority"] = "class"
    preempt_gap: float = Field(1000.0, ge=0, description="static priority gap (preempt_by=priority)")


def waited(cycle: Cycle) -> FloatArray:
    """Seconds each pending job has spent waiting: since submission, less the time it
    ran before it was preempted (a requeued long job has not starved for its run)."""
    c = cycle.cols
    ran = np.where(c[jc.GPUS] > 0, c[jc.ATTAINED] / np.maximum(c[jc.GPUS], 1e-9), 0.0)
    out: FloatArray = np.maximum(0.0, cycle.now - c[jc.SUBMIT] - ran)
    return out


def with_mean_left(jobs: Sequence[JobRequest], done: FloatArray, left: FloatArray) -> FloatArray:
    """``left`` with the mean time left over the job's similar jobs where it has them."""
    out = left.copy()
    # by samples object: jobs of one class share the history's tuple, so a long queue
    # costs one vectorised pass per class, not one per job
    groups: dict[int, tuple[tuple[float, ...], list[int]]] = {}
    for i, job in enumerate(jobs):
        s = job.runtime_samples
        if s:
            groups.setdefault(id(s), (s, []))[1].append(i)
    for s, members in groups.values():
        idx = np.asarray(members, dtype=np.int64)
        m = mean_left(s, done[idx])
        known = ~np.isnan(m)
        out[idx[known]] = np.maximum(m[known], 1.0)
    return out


def fifo_ahead(cycle: Cycle, jobs: Sequence[JobInfo]) -> tuple[FloatArray, FloatArray | None]:
    """Seconds the whole cluster needs for the expected work (GPU-seconds left: the mean
    over similar jobs where the job has them, else the estimate's rule) of the
    jobs submitted before each pending job, and before each running job, that are still
    queued or running: FIFO would still make the job wait about that long. Waiting past
    it, a job has waited as long as FIFO would make it wait from now on: it goes first,
    in arrival order, and no later job's priority keeps it out (the no-starvation rule)."""
    c = cycle.cols
    gpus = c[jc.GPUS]
    done = np.where(gpus > 0, c[jc.ATTAINED] / np.maximum(gpus, 1e-9), 0.0)
    subs = [c[jc.SUBMIT]]
    works = [with_mean_left([i.job for i in jobs], done, expected_left(c[jc.ESTIMATE], done, UNKNOWN_S, 1.0)) * gpus]
    if cycle.running:
        rt = cycle.runs()
        ran = (cycle.now - rt.start) + np.where(rt.gpus > 0, rt.attained / np.maximum(rt.gpus, 1e-9), 0.0)
        est = np.where(np.isinf(rt.estimate), np.nan, rt.estimate)
        subs.append(cycle.run_cols[11])
        left = with_mean_left([r.job for r in cycle.running], ran, expected_left(est, ran, UNKNOWN_S, 1.0))
        works.append(left * rt.gpus)
    sub, work = np.concatenate(subs), np.concatenate(works)
    order = np.argsort(sub, kind="stable")
    before = np.concatenate([[0.0], np.cumsum(work[order])])  # work of the first i jobs by submit time
    # strictly earlier submits (ties: none is ahead of the other)
    ahead = before[np.searchsorted(sub[order], sub, side="left")] / cycle.capacity.gpu
    n = c.shape[1]
    return ahead[:n], (ahead[n:] if cycle.running else None)


@dataclass(slots=True)
class _ClassVictims:
    """The priority plugin's preemption memo for one cycle (``preempt_by: class``)."""

    classes: FloatArray | None = None  # each running job's class value
    below: dict[float, BoolArray] = field(default_factory=dict)  # by the preemptor's class value


@register
class Priority(Plugin):
    """Combined priority: class, user priority, aging, parallelism; starved jobs first."""

    name = "priority"
    Args = PriorityArgs
    args: PriorityArgs

    def __init__(self, args: BaseModel, weight: float = 1.0) -> None:
        super().__init__(args, weight)
        self._rank = {r: i for i, r in enumerate(self.args.role_order)}
        self._peak = 0.0  # the longest drain time seen (fifo_guard)
        self.passed_over: set[str] = set()  # pending jobs passed by later jobs ordered after them
        self.promoted: set[str] = set()  # jobs that went first for it: not preempted by srpt

    def static_priority(self, job: JobRequest) -> float:
        a = self.args
        return a.class_values.get(job.priority_class, 0.0) + a.user_weight * job.priority

    def task_order(self, job: JobRequest) -> tuple[TaskRequest, ...] | None:
        rank = self._rank
        return tuple(sorted(job.tasks, key=lambda t: rank.get(t.role, len(rank)))) if rank else None

    def drain(self, cycle: Cycle, jobs: Sequence[JobInfo] | None = None) -> float:
        """Seconds the whole cluster needs for the expected work queued and running: about
        what FIFO makes a job arriving now wait (whatever the order, the same work is there).
        With ``jobs``, the mean over similar jobs where a job has them (a median understates
        the work of heavy tails)."""
        c = cycle.cols
        gpus = c[jc.GPUS]
        done = np.where(gpus > 0, c[jc.ATTAINED] / np.maximum(gpus, 1e-9), 0.0)
        left = expected_left(c[jc.ESTIMATE], done, UNKNOWN_S, 1.0)
        if jobs is not None:
            left = with_mean_left([i.job for i in jobs], done, left)
        work = float((left * gpus).sum())
        if cycle.running:
            rt = cycle.runs()
            ran = (cycle.now - rt.start) + np.where(rt.gpus > 0, rt.attained / np.maximum(rt.gpus, 1e-9), 0.0)
            est = np.where(np.isinf(rt.estimate), np.nan, rt.estimate)
            left = expected_left(est, ran, UNKNOWN_S, 1.0)
            if jobs is not None:
                left = with_mean_left([r.job for r in cycle.running], ran, left)
            work += float((left * rt.gpus).sum())
        return work / cycle.capacity.gpu

    def bound(self, cycle: Cycle, longest_wait: float) -> float:
        """The starvation bound this cycle. Under sustained overload no fixed bound can
        be kept (the backlog grows without end) and keeping it anyway turns the queue
        into FIFO; so the promise becomes: no job waits past ``backlog_factor`` times the
        time the whole cluster needs to clear the work queued and running now."""
        a = self.args
        if a.backlog_factor <= 0 or cycle.capacity.gpu <= 0 or longest_wait < a.starvation_bound_s:
            return a.starvation_bound_s  # (the stretched bound is never shorter: skip its sums)
        return max(a.starvation_bound_s, a.backlog_factor * self.drain(cycle))

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        a = self.args
        c = cycle.cols
        submit = c[jc.SUBMIT]
        wait = waited(cycle)
        prio = c[jc.STATIC] + a.aging_per_hour * wait / 3600.0 + a.parallelism_weight * np.log2(1.0 + c[jc.GPUS])
        if a.fairshare_weight > 0 and cycle.past_share:
            prio = prio - a.fairshare_weight * np.fromiter(
                (cycle.past_share.get(i.job.tenant, 0.0) for i in jobs), float, len(jobs))
        bound = self.bound(cycle, float(wait.max(initial=0.0)))
        starved = wait >= bound
        run_starved = None
        ahead: FloatArray | None = None  # fifo_ahead's estimate, once per cycle for both rules
        if a.fifo_ahead > 0 and cycle.capacity.gpu > 0:
            ahead, run_ahead = fifo_ahead(cycle, jobs)
            starved |= wait >= a.fifo_ahead * ahead
            if run_ahead is not None:
                run_starved = cycle.runs().waited >= np.minimum(bound, a.fifo_ahead * run_ahead)
        if a.fifo_guard > 0 and cycle.capacity.gpu > 0:
            # the peak, not today's drain: FIFO's longest wait is that of its worst moment
            self._peak = max(self._peak, self.drain(cycle, jobs))
            guard = a.fifo_guard * self._peak
            starved |= wait >= guard
            if cycle.running:
                over = cycle.runs().waited >= min(bound, guard)
                run_starved = over if run_starved is None else run_starved | over
        if a.overtaken and cycle.capacity.gpu > 0:
            over = np.fromiter((i.job.job_id in self.passed_over for i in jobs), bool, len(jobs))
            if over.any():
                if ahead is None:
                    ahead, _ = fifo_ahead(cycle, jobs)
                over &= wait >= ahead
                self.promoted.update(jobs[k].job.job_id for k in np.flatnonzero(over).tolist())
                starved |= over
            if cycle.running and self.promoted:
                kept = np.fromiter((r.job.job_id in self.promoted for r in cycle.running), bool,
                                   len(cycle.running))
                run_starved = kept if run_starved is None else run_starved | kept
        cycle.put(JobPriorities(prio, starved, bound, run_starved, a.hold_line))  # the allocate action copies them to JobInfo
        # starved jobs go oldest first, the rest by combined priority
        return [np.where(starved, 0.0, 1.0), np.where(starved, submit, -prio)]

    def settle(self, cycle: Cycle, plan: Plan, ordered: Sequence[JobInfo]) -> None:
        """Note the jobs overtaken this cycle: never run, not started, and a job submitted
        after them and tried after them started (so it fitted where they did not)."""
        if not self.args.overtaken:
            return
        pending = {i.job.job_id for i in ordered}
        self.passed_over &= pending
        running = {r.job.job_id for r in cycle.running}
        self.promoted &= pending | running
        started = {b.job_id for b in plan.binds}
        if not started:
            return
        latest = -math.inf  # the latest submit among jobs started after this position
        for info in reversed(ordered):
            job = info.job
            if job.job_id in started:
                latest = max(latest, job.submit_time)
            elif latest > job.submit_time and job.attained_service_s == 0:
                self.passed_over.add(job.job_id)

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[BoolArray, PreemptReason]]:
        a = self.args
        if not a.preempt or not cycle.running:
            return []
        if a.preempt_by == "class":
            memo = cycle.setdefault(_ClassVictims)
            if memo.classes is None:
                memo.classes = np.fromiter(
                    (a.class_values.get(r.job.priority_class, 0.0) for r in cycle.running), float,
                    len(cycle.running))
            mine = a.class_values.get(info.job.priority_class, 0.0)
            mask = memo.below.get(mine)
            if mask is None:
                mask = memo.below[mine] = memo.classes < mine
            return [(mask, PreemptReason.PRIORITY)]
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


def _remaining(job: JobRequest, gpus: float) -> float:
    """Estimated seconds left; jobs without an estimate go last."""
    if job.runtime_estimate_s is None:
        return math.inf
    done = job.attained_service_s / gpus if gpus else 0.0
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
