"""Forecasts: when would each waiting job start, where, and when would it finish?

The answer comes from the policy itself: the snapshot of now is replayed forward through
a fresh ``Scheduler`` of the same config (the same ``schedule`` the live cycle calls). At
each step the core plans, what it binds starts, what it preempts stops after its grace
period and waits again, and the clock moves to the next completion; until every waiting
job has started, or the horizon. Running jobs end after the time left they are given,
waiting jobs run for the duration they are given (both from ``scheduling.estimates``);
the jobs' own ``runtime_estimate_s`` stay what the policy ranks by, as in the live cycle.

The band: the replay is run three times, with every duration at its low quantile, its
middle and its high quantile (``estimates.Spread``), and a job's band is the earliest and
latest of its three starts. Setting every job at the same quantile at once (comonotone
errors) is the pessimistic end of how errors add up, so the band is wide rather than
narrow: the start of a job behind many others is a sum of their durations, and for
comonotone terms the quantile of the sum is the sum of the quantiles (for independent
ones it is narrower). Starts are not monotone in durations (a shorter job ahead may let
a backfill in, or not), hence min and max over the three rather than low and high.

Jobs not admitted yet (held for quota, ``held``): at every step ``admit`` is asked which
of them their quota would admit now, given the jobs admitted in the replay (running or
waiting for GPUs); those join the waiting jobs from then on (the core stays blind to how
quota is kept: the caller's ``admit`` is queueing's rule).

What the replay does not know: jobs submitted after now (a job that ranks ahead of an
old one will overtake it), node failures, elastic grows and shrinks (jobs run at the size
they start with), and work lost to a preemption (a stopped job resumes where it stopped).
Pure: no clock (``snapshot.now`` is now), no I/O; deterministic for a given input.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain

from scheduling.config import SchedulerConfig
from scheduling.estimates import Spread, remaining_by_rule
from scheduling.model import Allocation, JobRequest, RunningJob, Snapshot
from scheduling.scheduler import Scheduler

HORIZON_S = 30 * 86400.0  # replay no further than this past now
MAX_CYCLES = 200_000  # a bound on any replay's steps
_FINISH, _STOP = 0, 1
# (jobs admitted now: running or waiting for GPUs; jobs held for quota, in their order) ->
# the ids of held jobs admitted now
Admit = Callable[[Sequence[JobRequest], Sequence[JobRequest]], Collection[str]]


@dataclass(frozen=True, slots=True)
class Start:
    """One replay's answer for one job."""

    start: float
    finish: float
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JobForecast:
    """A waiting job's forecast; times are absolute (the snapshot's clock). ``None``:
    not within the horizon (in that scenario)."""

    job_id: str
    start: float | None
    finish: float | None
    nodes: tuple[str, ...]
    start_low: float | None  # the band: earliest and latest start over the scenarios
    start_high: float | None


@dataclass(slots=True)
class _Run:
    running: RunningJob
    allocs: tuple[Allocation, ...]
    end: float
    epoch: int = 0


def forecast(config: SchedulerConfig, snapshot: Snapshot, remaining: Mapping[str, Spread],
             durations: Mapping[str, Spread], *, targets: Collection[str] | None = None,
             horizon_s: float = HORIZON_S, cycle_s: float = 0.0, restore_s: float = 0.0,
             resolution: float = 0.0, first_cycle: float | None = None,
             held: Sequence[JobRequest] = (), admit: Admit | None = None) -> dict[str, JobForecast]:
    """Every waiting job's forecast (or only ``targets``'): start, finish and nodes from
    the replay at the middle durations, the band from the replays at the low and high
    quantiles. ``remaining``: running jobs' time left by job id; ``durations``: waiting
    jobs' run time by job id; a job missing from either gets the core's own expectation
    from its ``runtime_estimate_s`` (``estimates.remaining_by_rule``). ``cycle_s``: the
    live scheduler's cycle interval (starts happen on cycles); ``restore_s``: what a
    preempted job pays to start again; ``resolution``: steps at least this fraction of
    the time already replayed apart (0.02: a start 10 h out is known to about 12 min,
    and a replay over days takes hundreds of cycles, not one per completion);
    ``first_cycle``: when the live scheduler's next cycle runs (default: now); ``held``
    and ``admit``: jobs waiting for quota and the rule that admits them (see above)."""
    runs = []
    for q in (1, 0, 2):
        runs.append(replay(config, snapshot, {k: v.at(q) for k, v in remaining.items()},
                           {k: v.at(q) for k, v in durations.items()}, targets=targets,
                           horizon_s=horizon_s, cycle_s=cycle_s, restore_s=restore_s, resolution=resolution,
                           first_cycle=first_cycle, held=held, admit=admit))
    mid = runs[0]
    want = [j.job_id for j in chain(snapshot.pending, held) if targets is None or j.job_id in targets]
    out = {}
    for job_id in want:
        m = mid.get(job_id)
        starts = [r[job_id].start for r in runs if job_id in r]
        out[job_id] = JobForecast(
            job_id, m.start if m else None, m.finish if m else None, m.nodes if m else (),
            min(starts) if starts else None, max(starts) if len(starts) == len(runs) else None)
    return out


def replay(config: SchedulerConfig, snapshot: Snapshot, remaining: Mapping[str, float],
           durations: Mapping[str, float], *, targets: Collection[str] | None = None,
           horizon_s: float = HORIZON_S, cycle_s: float = 0.0, restore_s: float = 0.0,
           resolution: float = 0.0, first_cycle: float | None = None,
           max_cycles: int = MAX_CYCLES, held: Sequence[JobRequest] = (),
           admit: Admit | None = None) -> dict[str, Start]:
    """One scenario: the snapshot played forward with these times (seconds) until every
    waiting job, held ones included (or every one of ``targets``), has started; the
    starts it saw."""
    r = _Replay(config, snapshot, remaining, durations, restore_s, held, admit)
    if first_cycle is not None and first_cycle > snapshot.now:
        r.advance(first_cycle)
    return r.run(set(targets) if targets is not None else None, snapshot.now + horizon_s, cycle_s, resolution,
                 max_cycles)


class _Replay:
    def __init__(self, config: SchedulerConfig, snap: Snapshot, remaining: Mapping[str, float],
                 durations: Mapping[str, float], restore_s: float, held: Sequence[JobRequest] = (),
                 admit: Admit | None = None) -> None:
        self.sched = Scheduler(config)
        self.snap = snap
        self.restore_s = restore_s
        self.now = snap.now
        self.events: list[tuple[float, int, int, str, int]] = []
        self.seq = 0
        self.epochs: dict[str, int] = {}  # attempts of a job stopped in the replay (stale events)
        by_job: dict[str, list[Allocation]] = {}
        for a in snap.allocations:
            by_job.setdefault(a.job_id, []).append(a)
        self.runs: dict[str, _Run] = {}
        for r in snap.running:
            job = r.job
            ran = snap.now - r.start_time + _done(job)
            left = remaining.get(job.job_id)
            run = _Run(r, tuple(by_job.pop(job.job_id, ())), snap.now + (
                left if left is not None else remaining_by_rule(job.runtime_estimate_s, ran)))
            self.runs[job.job_id] = run
            if r.terminating:  # already asked to stop: it does after its grace period
                self._push(snap.now + job.checkpoint_grace_s, _STOP, job.job_id, 0)
            self._push(run.end, _FINISH, job.job_id, 0)
        self.fixed = tuple(chain.from_iterable(by_job.values()))  # held by no known job: kept
        self.pending: dict[str, JobRequest] = {j.job_id: j for j in snap.pending}
        self.held: dict[str, JobRequest] = {j.job_id: j for j in held} if admit is not None else {}
        self.admit = admit
        self.left = {j.job_id: _duration(j, durations) for j in chain(snap.pending, self.held.values())}

    def _push(self, t: float, kind: int, job_id: str, epoch: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, job_id, epoch))

    def run(self, targets: set[str] | None, until: float, cycle_s: float, resolution: float,
            max_cycles: int) -> dict[str, Start]:
        waiting = set(self.pending) | set(self.held)
        want = waiting if targets is None else targets & waiting
        starts: dict[str, Start] = {}
        s = self.snap
        for _ in range(max_cycles):
            self._admit()
            runs = self.runs.values()
            allocs = self.fixed + tuple(chain.from_iterable(r.allocs for r in runs))
            running = tuple(r.running for r in runs)
            plan = self.sched.schedule(Snapshot(self.now, s.nodes, allocs, tuple(self.pending.values()), running,
                                                s.quotas, s.telemetry, s.task_mix))
            for job_id, binds in plan.binds_by_job().items():
                end = self._start(job_id, tuple(Allocation(b.job_id, b.task_id, b.node_id, b.gpus, b.cpu_milli,
                                                           b.memory_mib, b.task_name, b.role) for b in binds))
                if job_id in want and job_id not in starts:
                    starts[job_id] = Start(self.now, end, tuple(sorted({b.node_id for b in binds})))
            for p in plan.preemptions:
                run = self.runs.get(p.job_id)
                if run is not None and not run.running.terminating:
                    run.running = replace(run.running, terminating=True)
                    self._push(self.now + p.grace_period_s, _STOP, p.job_id, run.epoch)
            if len(starts) == len(want) or not self.events:
                break  # every job asked about has started, or nothing will change again
            t = max(self.events[0][0], self.now + cycle_s, self.now + resolution * (self.now - s.now))
            if t > until:
                break
            self.advance(t)
        return starts

    def _admit(self) -> None:
        """Held jobs their quota admits now join the waiting ones."""
        if not self.held or self.admit is None:
            return
        admitted = [r.running.job for r in self.runs.values()] + list(self.pending.values())
        for job_id in self.admit(admitted, tuple(self.held.values())):
            job = self.held.pop(job_id, None)
            if job is not None:
                self.pending[job_id] = job

    def advance(self, t: float) -> None:
        """The clock to ``t``: what ends by then ends."""
        self.now = t
        while self.events and self.events[0][0] <= t:
            et, kind, _, job_id, epoch = heapq.heappop(self.events)
            self._end(et, kind, job_id, epoch)

    def _start(self, job_id: str, allocs: tuple[Allocation, ...]) -> float:
        job = self.pending.pop(job_id)
        end = self.now + (self.restore_s if job.attempt > 1 else 0.0) + self.left.pop(job_id)
        run = self.runs[job_id] = _Run(RunningJob(job, self.now), allocs, end, self.epochs.get(job_id, 0))
        self._push(end, _FINISH, job_id, run.epoch)
        return end

    def _end(self, t: float, kind: int, job_id: str, epoch: int) -> None:
        run = self.runs.get(job_id)
        if run is None or run.epoch != epoch:
            return  # stopped before it finished, or a stale stop
        del self.runs[job_id]
        if kind == _FINISH:
            return
        job = run.running.job
        ran = t - run.running.start_time
        self.pending[job_id] = replace(job, attained_service_s=job.attained_service_s + ran * job.total_gpus,
                                       attempt=job.attempt + 1)
        self.left[job_id] = max(0.0, run.end - t)
        self.epochs[job_id] = run.epoch + 1


def _done(job: JobRequest) -> float:
    """Seconds of service the job had before its current attempt."""
    g = job.total_gpus
    return job.attained_service_s / g if g else 0.0


def _duration(job: JobRequest, durations: Mapping[str, float]) -> float:
    d = durations.get(job.job_id)
    return d if d is not None else remaining_by_rule(job.runtime_estimate_s, _done(job))
