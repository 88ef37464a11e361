"""Forecast accuracy in the simulator: forecasts made while a trace runs, held against
the starts that actually followed, beside two baselines computed on the same snapshots.

Two passes over the same deterministic simulation: the first finds each job's actual
start; the second forecasts a sample of the jobs that waited, once when the scheduler
first sees them (their submit) and once when they have waited half their actual wait,
through an observer that only reads the simulation (pass 2 reproduces pass 1's starts;
checked). The forecast is ``scheduling.forecast`` with the times of
``scheduling.estimates.DurationHistory`` as the simulator has learnt it by then.

Baselines, on the same snapshot and the policy's own queue order:
- reservation (Slurm's backfill estimate, ``squeue --start``): walk the queue in order,
  reserve each job at the earliest time enough GPUs are free, for its estimated run time,
  given running jobs' estimated ends and the earlier reservations;
- naive: now + (jobs ahead in the queue) x (mean GPU-seconds of a finished job) / (the
  cluster's GPUs).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scheduling import Scheduler, SchedulerConfig, Snapshot
from scheduling.estimates import DurationHistory, Spread, remaining_by_rule
from scheduling.forecast import JobForecast, forecast
from sim.engine import JobRun, SimSettings, Simulation
from sim.traces import TraceJob, uniform_cluster


@dataclass(slots=True)
class Record:
    job_id: str
    when: str  # "submit" | "half"
    at: float
    actual: float
    forecast: float
    low: float | None
    high: float | None
    reservation: float
    naive: float
    round_s: float  # wall time of this forecast (three replays, this job's)


@dataclass(slots=True)
class Probe:
    """The observer: forecasts the sampled jobs at their submit and half-wait times."""

    config: SchedulerConfig
    settings: SimSettings
    sample: set[str]
    half: dict[float, list[str]]
    actual: dict[str, float]
    resolution: float
    records: list[Record] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def __call__(self, t: float, sim: Simulation) -> None:
        if t in self.half:
            for job_id in self.half.pop(t):
                self._one(t, sim, job_id, "half")
            return
        fresh = [j for j in self.sample - self.seen if j in sim.pending]
        for job_id in sorted(fresh):
            self.seen.add(job_id)
            self._one(t, sim, job_id, "submit")

    def _one(self, t: float, sim: Simulation, job_id: str, when: str) -> None:
        snap = sim.snapshot(t)
        remaining, durations = spreads(sim, t)
        t0 = time.perf_counter()
        f = forecast(self.config, snap, remaining, durations, targets=[job_id], cycle_s=self.settings.cycle_s,
                     restore_s=self.settings.restore_s, resolution=self.resolution,
                     first_cycle=sim.next_cycle)[job_id]
        wall = time.perf_counter() - t0
        order = [j.job_id for j in Scheduler(self.config).order(snap)]
        self.records.append(Record(
            job_id, when, t, self.actual[job_id], _or_horizon(f, t), f.start_low, f.start_high,
            reservation_start(snap, order, job_id, sim.capacity), naive_start(sim.history, snap, order, job_id, sim.capacity),
            wall))


def _or_horizon(f: JobForecast, t: float) -> float:
    return f.start if f.start is not None else t + 30 * 86400.0


def _done(jr: JobRun) -> float:
    g = jr.request.total_gpus
    return jr.request.attained_service_s / g if g else 0.0


def spreads(sim: Simulation, now: float) -> tuple[dict[str, Spread], dict[str, Spread]]:
    """Running jobs' time left and waiting jobs' run time, as the history knows them."""
    h = sim.history
    remaining: dict[str, Spread] = {}
    for job_id, jr in sim.runs.items():
        restore_left = max(0.0, jr.start + jr.restore - now)
        ran = _done(jr) + max(0.0, now - jr.start - jr.restore)
        s = h.spread(jr.trace.tenant, jr.gpus, ran)
        if s is not None:
            remaining[job_id] = Spread(s.low + restore_left, s.mid + restore_left, s.high + restore_left)
    durations: dict[str, Spread] = {}
    for job_id, jr in sim.pending.items():
        ran = _done(jr)
        est = jr.request.runtime_estimate_s
        s = h.spread(jr.trace.tenant, jr.gpus, ran, point=est)
        if s is not None:
            durations[job_id] = s
    return remaining, durations


def reservation_start(snap: Snapshot, order: Sequence[str], job_id: str, capacity: int) -> float:
    """Slurm-style: reservations on the cluster's free-GPU profile, in queue order."""
    now, cap = snap.now, capacity
    used = sum(r.job.total_gpus for r in snap.running)
    times, deltas = [now], [float(cap - used)]
    for r in snap.running:
        est = r.job.runtime_estimate_s
        done = (r.job.attained_service_s / r.job.total_gpus if r.job.total_gpus else 0.0)
        end = r.start_time + (est - done if est is not None else 0.0)
        if end <= now:  # past its estimate, or none: as long again (the core's rule)
            end = now + max(now - r.start_time, 60.0)
        times.append(end)
        deltas.append(r.job.total_gpus)
    pending = {j.job_id: j for j in snap.pending}
    for k in order:
        j = pending[k]
        need = j.total_gpus
        if need > cap:
            return now + 30 * 86400.0
        t_arr = np.asarray(times)
        ix = np.argsort(t_arr, kind="stable")
        ts, free = t_arr[ix], np.cumsum(np.asarray(deltas)[ix])
        ok = free >= need - 1e-9
        dur = remaining_by_rule(j.runtime_estimate_s, j.attained_service_s / need if need else 0.0)
        # the first breakpoint that is ok and stays ok for ``dur``
        bad_after = np.flatnonzero(~ok)
        start = None
        for i in np.flatnonzero(ok).tolist():
            if ts[i] < now:
                continue
            nxt = bad_after[np.searchsorted(bad_after, i)] if bad_after.size and bad_after[-1] > i else None
            if nxt is None or ts[nxt] >= ts[i] + dur:
                start = float(ts[i])
                break
        if start is None:
            return now + 30 * 86400.0
        if k == job_id:
            return start
        times += [start, start + dur]
        deltas += [-need, need]
    raise KeyError(job_id)


def naive_start(h: DurationHistory, snap: Snapshot, order: Sequence[str], job_id: str, capacity: int) -> float:
    ahead = order.index(job_id)
    mean = h.mean_gpu_s() or 0.0
    return snap.now + ahead * mean / max(capacity, 1)


def run(jobs: Sequence[TraceJob], nodes: int, gpus: int, config: SchedulerConfig, settings: SimSettings,
        sample_size: int, seed: int, resolution: float) -> tuple[list[Record], dict[str, Any]]:
    """Both passes; the records and what the protocol needs to say."""
    cluster = uniform_cluster(nodes, gpus)
    t0 = time.perf_counter()
    first = Simulation(cluster, jobs, config, settings).run()
    sim_s = time.perf_counter() - t0
    actual = {j.trace.job_id: j.first_start for j in first.jobs if j.first_start is not None}
    waited = sorted(j.trace.job_id for j in first.jobs
                    if j.first_start is not None and j.first_start - j.trace.submit_s > settings.cycle_s)
    sample = sorted(random.Random(seed).sample(waited, min(sample_size, len(waited))))
    submit = {j.job_id: j.submit_s for j in jobs}
    half: dict[float, list[str]] = {}
    for k in sample:
        half.setdefault(submit[k] + (actual[k] - submit[k]) / 2, []).append(k)
    probe = Probe(config, settings, set(sample), half, {k: actual[k] for k in sample}, resolution)
    second = Simulation(cluster, jobs, config, settings, watch=probe, probes=list(half)).run()
    same = all(a.first_start == b.first_start for a, b in zip(first.jobs, second.jobs, strict=True))
    waits = [actual[k] - submit[k] for k in waited]
    return probe.records, {"jobs": len(jobs), "jobs_that_waited": len(waited), "sampled_jobs": len(sample),
                           "second_pass_reproduces_first": same, "sim_pass_s": round(sim_s, 1),
                           "median_wait_of_waiting_jobs_s": round(statistics.median(waits), 1) if waits else None}


def score(actual: np.ndarray, guess: np.ndarray, low: np.ndarray | None = None,
          high: np.ndarray | None = None) -> dict[str, Any]:
    err = np.abs(guess - actual)
    out: dict[str, Any] = {"median_abs_error_s": round(float(np.median(err)), 1),
                           "p90_abs_error_s": round(float(np.percentile(err, 90)), 1),
                           "mean_abs_error_s": round(float(err.mean()), 1)}
    out["band_coverage"] = None if low is None or high is None else round(
        float(((low <= actual + 1e-6) & (actual <= high + 1e-6)).mean()), 4)
    return out


def summary(records: Sequence[Record]) -> dict[str, Any]:
    a = np.asarray([r.actual for r in records])
    f = np.asarray([r.forecast for r in records])
    lo = np.asarray([r.low if r.low is not None else -np.inf for r in records])
    hi = np.asarray([r.high if r.high is not None else np.inf for r in records])
    return score(a, f, lo, hi) | {
        "median_band_width_s": round(float(np.median(hi - lo)), 1),
        "baseline_reservation": score(a, np.asarray([r.reservation for r in records])),
        "baseline_naive": score(a, np.asarray([r.naive for r in records])),
        "forecasts": len(records)}


def synthetic_snapshot(nodes: int, gpus: int, waiting: int, seed: int = 0
                       ) -> tuple[Snapshot, dict[str, Spread], dict[str, Spread]]:
    """A full cluster of ``nodes`` x ``gpus`` with ``waiting`` jobs queued (sizes and
    durations as on Philly: mostly 1 GPU, some gangs; log-normal run times)."""
    from sim.engine import to_request

    rng = random.Random(seed)
    sizes, weights = (1, 2, 4, 8, 16, 32), (60, 10, 10, 12, 5, 3)
    s = SimSettings()
    cluster = uniform_cluster(nodes, gpus)
    # fill the cluster through the core itself (a valid state), then queue the rest
    fill = [TraceJob(f"run-{k}", 0.0, rng.lognormvariate(8.0, 1.5), rng.choices(sizes, weights)[0], f"t{k % 8}")
            for k in range(nodes * gpus)]
    snap = Snapshot(0.0, cluster, (), tuple(to_request(t, s, t.duration_s) for t in fill))
    plan = Scheduler(SchedulerConfig.preset("fifo")).schedule(snap)
    placed = plan.binds_by_job()
    from scheduling import Allocation, RunningJob

    by_id = {j.job_id: j for j in snap.pending}
    allocs = tuple(Allocation(b.job_id, b.task_id, b.node_id, b.gpus, b.cpu_milli, b.memory_mib, b.task_name, b.role)
                   for bs in placed.values() for b in bs)
    running = tuple(RunningJob(by_id[k], -rng.uniform(0, 3600)) for k in placed)
    queued = [TraceJob(f"wait-{k}", float(k), rng.lognormvariate(8.0, 1.5), rng.choices(sizes, weights)[0],
                       f"t{k % 8}") for k in range(waiting)]
    pending = tuple(to_request(t, s, t.duration_s) for t in queued)
    remaining = {k: _spread(rng.lognormvariate(7.5, 1.2)) for k in placed}
    durations = {t.job_id: _spread(t.duration_s) for t in queued}
    return Snapshot(3600.0, cluster, allocs, pending, running), remaining, durations


def _spread(x: float) -> Spread:
    return Spread(x / 3, x, 3 * x)
