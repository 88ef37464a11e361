"""Kairos' ordering plugin: shortest expected remaining service first (optionally by
the Gittins index over similar finished jobs), preempting work expected to hold its GPUs
far longer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from scheduling import jobcols as jc
from scheduling.arrays import BoolArray, FloatArray, IntArray
from scheduling.estimates import expected_left, gittins_rank, remaining_by_rule
from scheduling.framework import Cycle, JobInfo, JobPriorities, Plugin, register
from scheduling.model import JobRequest, PreemptReason
from scheduling.plugins.ordering import UNKNOWN_S, waited, with_mean_left


class SrptArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    by: Literal["gpu_time", "time"] = Field("gpu_time", description="rank by GPU-seconds or seconds left")
    unknown_s: float = Field(UNKNOWN_S, ge=0, description="expected run time of a job with no estimate "
                             "that has not run (then: as long as it has run, like LAS)")
    overrun: float = Field(1.0, ge=0, description="a job past its estimate is expected to run this "
                           "many times as long again")
    aging_s: float = Field(0.0, ge=0, description=">0: response-ratio aging, key / (1 + wait / aging_s)")
    rank: Literal["estimate", "gittins"] = Field("estimate", description="gittins: jobs with similar jobs' "
                                                 "durations (runtime_samples) rank by the inverse Gittins "
                                                 "index given what they ran; the rest by the estimate")
    siblings: bool = Field(True, description="gittins: a job that never ran is ranked no worse than "
                           "any job of its tenant and size submitted after it that never ran either (they "
                           "are alike but for when the history was read for them)")
    preempt: bool = True
    preempt_ratio: float = Field(4.0, ge=1, description="a victim must have this many times more "
                                 "expected service left than the preemptor")
    pay: bool = Field(False, description="a victim's stop must cost it less time (work since its "
                      "checkpoint, plus the restore) than the preemptor would wait for running jobs to end")
    restore_s: float = Field(60.0, ge=0, description="a restart's cost, beside the work lost")
    stop_width: float | None = Field(None, ge=0, le=1, description="the stop rule compares expected "
                                     "time left x GPUs ** this (0: time, 1: GPU-seconds); None: as `by`")
    stop_need: float = Field(0.0, ge=0, le=1, description="the stop rule also weighs the preemptor's time "
                             "left by (GPUs it must take from running jobs / the victim's GPUs) ** this, "
                             "the count of victims like it, scaled by how long stopped jobs wait here to "
                             "resume over its time left (at most 1) and at least 1; 0: off")


@dataclass(slots=True)
class _SrptVictims:
    """Srpt's preemption memo for one cycle: the same for every preemptor."""

    theirs: FloatArray | None = None  # each running job's expected service left (or Gittins rank)
    fresh: BoolArray | None = None  # each running job did not starve before it started
    cost: FloatArray | None = None  # seconds each running job would lose if stopped now
    ends: FloatArray | None = None  # running jobs' expected ends (s from now), soonest first
    freed: FloatArray | None = None  # GPUs freed by then, cumulative
    resume_wait: float | None = None  # the mean wait of the queued jobs that have run (stop_need)


def oldest_not_behind(tenant: FloatArray, gpus: FloatArray, submit: FloatArray, alike: BoolArray,
                      left: FloatArray) -> FloatArray:
    """``left`` lowered so that no job in ``alike`` (never ran, ranked by its similar jobs'
    durations) ranks behind a later one of its tenant and size in ``alike``: each takes
    the least rank of itself and those submitted after it. Such jobs differ only in when
    the history was read for them (when a job queues, starts or stops, not while it
    waits), so a later one must not pass an earlier one for knowing more: the earlier one
    would wait for as long as its size kept arriving (syn-exp-bursts-4t,
    docs/design/simulator.md)."""
    idx = np.flatnonzero(alike)
    if len(idx) < 2:
        return left
    # by tenant, then size, then latest submit first: a running minimum per group
    order = idx[np.lexsort((-submit[idx], gpus[idx], tenant[idx]))]
    t, g = tenant[order], gpus[order]
    cuts = np.flatnonzero((t[1:] != t[:-1]) | (g[1:] != g[:-1])) + 1
    out = left.copy()
    for seg in np.split(order, cuts):
        if len(seg) > 1:
            out[seg] = np.minimum.accumulate(left[seg])
    return out


def must_take(info: JobInfo, idle: IntArray) -> float:
    """Whole GPUs a job must take from running jobs to start, at least: its replicas
    (an elastic group's minimum), widest first, on the nodes with the most idle GPUs."""
    per = sorted((t.gpu for t in info.tasks for _ in range(t.least_replicas) if t.gpu), reverse=True)
    most = np.sort(idle)[::-1][:len(per)]
    return float(sum(max(0.0, g - float(most[i])) if i < len(most) else g for i, g in enumerate(per)))


@register
class Srpt(Plugin):
    """Kairos' ordering: shortest expected remaining service first, from submit-time
    estimates (the history of finished jobs) and service attained, optionally aged by
    the response ratio; preempts jobs expected to hold their GPUs far longer."""

    name = "srpt"
    Args = SrptArgs
    args: SrptArgs

    def __init__(self, args: BaseModel, weight: float = 1.0) -> None:
        super().__init__(args, weight)
        self._ranks: dict[int, tuple[JobRequest, float]] = {}  # a pending request's Gittins rank

    def _service(self, left: FloatArray, gpus: FloatArray) -> FloatArray:
        return left * np.maximum(gpus, 1e-3) if self.args.by == "gpu_time" else left

    def _stop_width(self) -> float:
        """The power of a job's GPUs its time left is weighed by when srpt compares a
        victim with a preemptor: ``stop_width``, else as the order (``by``)."""
        a = self.args
        return a.stop_width if a.stop_width is not None else (1.0 if a.by == "gpu_time" else 0.0)

    def _victims_like(self, cycle: Cycle, memo: _SrptVictims, info: JobInfo, left: float) -> FloatArray:
        """Per running job, how many jobs like it the preemptor would stop: the GPUs it
        must take over the job's. Each is delayed by the lesser of the preemptor's run
        and how long a stopped job waits here to resume: a victim that gets GPUs back
        elsewhere soon loses little (Philly's many short jobs free single GPUs often; on
        Muri stopped jobs wait long). That wait is read as the mean wait of the queued
        jobs that have run; the count is scaled by it over the preemptor's time left."""
        if memo.resume_wait is None:
            stopped = cycle.cols[jc.ATTAINED] > 0
            memo.resume_wait = float(np.mean(waited(cycle)[stopped])) if stopped.any() else 0.0
        count = max(must_take(info, cycle.state.idle), 1.0) / np.maximum(cycle.runs().gpus, 1.0)
        out: FloatArray = np.maximum(count * min(1.0, memo.resume_wait / max(left, 1.0)), 1.0)
        return out

    def _gittins(self, jobs: Sequence[JobInfo], left: FloatArray) -> tuple[FloatArray, BoolArray]:
        """``left`` with the Gittins rank where the job's samples give one, and where they
        did; a pending request's rank never changes (its attained service is fixed while
        it waits)."""
        memo = self._ranks
        if len(memo) > 4 * len(jobs) + 1024:
            memo.clear()
        out = left.copy()
        ranked = np.zeros(len(jobs), dtype=bool)
        for i, info in enumerate(jobs):
            job = info.job
            if not job.runtime_samples:
                continue
            hit = memo.get(id(job))
            if hit is None or hit[0] is not job:
                done = job.attained_service_s / info.gpus if info.gpus else 0.0
                g = gittins_rank(job.runtime_samples, done)
                hit = memo[id(job)] = (job, math.nan if g is None else g)
            if not math.isnan(hit[1]):
                out[i] = hit[1]
                ranked[i] = True
        return out, ranked

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        a, c = self.args, cycle.cols
        gpus = c[jc.GPUS]
        done = np.where(gpus > 0, c[jc.ATTAINED] / np.maximum(gpus, 1e-9), 0.0)
        left = expected_left(c[jc.ESTIMATE], done, a.unknown_s, a.overrun)
        if a.rank == "gittins":
            left, ranked = self._gittins(jobs, left)
            if a.siblings:
                left = oldest_not_behind(c[jc.TENANT], gpus, c[jc.SUBMIT], ranked & (done == 0), left)
        key = self._service(left, gpus)
        if a.aging_s > 0:
            key = key / (1.0 + waited(cycle) / a.aging_s)
        return [key]

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[BoolArray, PreemptReason]]:
        a = self.args
        if not a.preempt or not cycle.running or info.starved:
            # a starved job goes first and gets a reservation instead
            return []
        memo = cycle.setdefault(_SrptVictims)
        theirs = memo.theirs
        if theirs is None:
            rt = cycle.runs()
            done = (cycle.now - rt.start) + np.where(rt.gpus > 0, rt.attained / np.maximum(rt.gpus, 1e-9), 0.0)
            left_run = expected_left(np.where(np.isinf(rt.estimate), np.nan, rt.estimate), done, a.unknown_s,
                                     a.overrun)
            left_est = left_run.copy()
            if a.rank == "gittins":
                for i, r in enumerate(cycle.running):
                    g = gittins_rank(r.job.runtime_samples, float(done[i])) if r.job.runtime_samples else None
                    if g is not None:
                        left_run[i] = g
            theirs = memo.theirs = left_run * np.maximum(rt.gpus, 1e-3) ** self._stop_width()
            if a.pay:
                # the time a stop throws away, and when GPUs free up without one
                memo.cost = rt.since_checkpoint + a.restore_s
                # the mean time left (the median estimate understates a heavy tail's)
                mean = with_mean_left([r.job for r in cycle.running], done, left_est)
                order = np.argsort(mean, kind="stable")
                memo.ends, memo.freed = mean[order], np.cumsum(rt.gpus[order])
        ran = info.job.attained_service_s / info.gpus if info.gpus else 0.0
        # with no estimate (no similar job finished yet) as with no history at all: least
        # attained service, like Tiresias; a job that has run far longer gives way
        left = remaining_by_rule(info.job.runtime_estimate_s, ran, a.unknown_s, a.overrun)
        g = gittins_rank(info.job.runtime_samples, ran) if a.rank == "gittins" and info.job.runtime_samples else None
        left = left if g is None else g
        mine = left * max(info.gpus, 1e-3) ** self._stop_width()
        if a.stop_need > 0:
            mine = mine * self._victims_like(cycle, memo, info, left) ** a.stop_need
        ok = theirs > a.preempt_ratio * mine
        if memo.cost is not None and memo.ends is not None and memo.freed is not None:
            # a stop pays for itself when the victim loses less than the preemptor gains:
            # summed over victims freeing its GPUs, GPU-seconds lost < GPU-seconds it waits
            k = int(np.searchsorted(memo.freed, info.gpus))
            wait = memo.ends[k] if k < len(memo.ends) else math.inf
            ok &= memo.cost < wait
        prios = cycle.get(JobPriorities)
        if prios is not None:
            # a job that starved before it started is not stopped for shorter work: it would
            # queue again, starve again and go first again, round and round
            if memo.fresh is None:
                memo.fresh = (~prios.running_starved if prios.running_starved is not None
                              else cycle.runs().waited < prios.starvation_bound_s)
            ok &= memo.fresh
        return [(ok, PreemptReason.SRTF)]
