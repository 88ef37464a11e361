"""One forecast round, pure: a snapshot and the durations learnt so far in, one
``JobForecast`` per waiting job out; and the what-if of a job not submitted yet.

The replay is ``scheduling.forecast`` with the scheduler's policy. Its times, as the
simulator's forecast experiment feeds them (``sim/forecast_experiment.spreads``):
running jobs' time left and waiting jobs' run time from ``DurationHistory.spread`` (the
quantiles of similar finished jobs, for the band); a waiting job's middle is its
request's estimate when it has one (what the policy ranks by: its own ``runtimeEstimate``,
else the history's median, as the scheduler gives it). A job with no similar
finished job and no estimate gets the core's rule (``estimates.remaining_by_rule``).
Who a job waits behind comes from one plain cycle on the same snapshot (the scheduler's
diagnosis, ``Plan.blocked_by``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from scheduling import JobRequest, Scheduler, SchedulerConfig, Snapshot
from scheduling.estimates import DurationHistory, Spread
from scheduling.forecast import JobForecast as CoreForecast
from scheduling.forecast import forecast
from services.scheduler.forecaster.load import Queued, Waiting
from services.scheduler.forecaster.quota import admit_rule
from services.scheduler.history import gpu_key
from shared.events import JobForecast, WaitReason, from_pending


def _done(job: JobRequest) -> float:
    g = job.total_gpus
    return job.attained_service_s / g if g else 0.0


def spreads(snap: Snapshot, history: DurationHistory, held: Iterable[JobRequest] = ()
            ) -> tuple[dict[str, Spread], dict[str, Spread]]:
    """Running jobs' time left and waiting jobs' run time (held ones' too), as the
    history knows them."""
    remaining: dict[str, Spread] = {}
    for r in snap.running:
        job = r.job
        s = history.spread(job.tenant, gpu_key(job), _done(job) + max(0.0, snap.now - r.start_time))
        if s is not None:
            remaining[job.job_id] = s
    durations: dict[str, Spread] = {}
    for job in (*snap.pending, *held):
        s = history.spread(job.tenant, gpu_key(job), _done(job), point=job.runtime_estimate_s)
        if s is not None:
            durations[job.job_id] = s
    return remaining, durations


def _event(f: CoreForecast, who: Waiting, as_of: float, waits_for: str | None,
           reason: WaitReason | None) -> JobForecast:
    return JobForecast(job_id=f.job_id, queue=who.queue, tenant=who.tenant, as_of=as_of,
                       start=f.start, finish=f.finish, start_low=f.start_low,
                       start_high=f.start_high, nodes=list(f.nodes), waits_for=waits_for,
                       reason=reason)


def forecast_round(config: SchedulerConfig, snap: Snapshot, who: Mapping[str, Waiting],
                   history: DurationHistory, *, resolution: float = 0.02,
                   queued: Queued | None = None) -> dict[str, JobForecast]:
    """Every waiting job's forecast, jobs queueing holds for quota (``queued``) included:
    the replay admits them when their queue's quota would (``quota.admit_rule``); their
    reason is ``quota``. One whose spec could not be read gets no start."""
    out: dict[str, JobForecast] = {}
    held = [j for j in queued.held if j.job_id not in who] if queued else []
    if snap.pending or held:
        remaining, durations = spreads(snap, history, held)
        plan = Scheduler(config).schedule(snap)
        for job_id, f in forecast(config, snap, remaining, durations, resolution=resolution, held=held,
                                  admit=admit_rule(queued.tree) if queued else None).items():
            if queued is not None and job_id in queued.who and job_id not in who:
                out[job_id] = _event(f, queued.who[job_id], snap.now, None, WaitReason.QUOTA)
                continue
            reason = plan.pending.get(job_id)
            out[job_id] = _event(f, who.get(job_id, Waiting("", "")), snap.now,
                                 plan.blocked_by.get(job_id),
                                 from_pending(reason.value) if reason is not None else None)
    for job_id, w in (queued.who if queued else {}).items():
        if job_id not in out:
            out[job_id] = JobForecast(job_id=job_id, queue=w.queue, tenant=w.tenant,
                                      as_of=snap.now, reason=WaitReason.QUOTA)
    return out


def what_if(config: SchedulerConfig, snap: Snapshot, history: DurationHistory,
            candidates: Iterable[JobRequest], *, resolution: float = 0.02,
            queued: Queued | None = None) -> list[JobForecast]:
    """Each candidate alone: the snapshot with it added as a new job (submitted now,
    after every job already waiting), replayed until it starts. Candidates do not
    compete with one another. With ``queued``, a candidate waits for its queue's quota
    as a submitted job would, behind the jobs already held for theirs."""
    pending = {j.job_id for j in snap.pending}
    held = [j for j in queued.held if j.job_id not in pending] if queued else []
    remaining, durations = spreads(snap, history, held)
    rule = admit_rule(queued.tree) if queued else None
    admitted_now = [*(r.job for r in snap.running), *snap.pending]
    out = []
    for cand in candidates:
        cand = replace(cand, submit_time=snap.now)
        if cand.job_id in pending or cand.job_id in {j.job_id for j in held}:
            raise ValueError(f"job id {cand.job_id} is already waiting")
        s = history.spread(cand.tenant, gpu_key(cand), 0.0, point=cand.runtime_estimate_s)
        times = {**durations, cand.job_id: s} if s is not None else durations
        who = Waiting(cand.queue, cand.tenant)
        if rule is not None and cand.job_id not in rule(admitted_now, [*held, cand]):
            # its quota holds it now: queueing's rule admits it in the replay
            f = forecast(config, snap, remaining, times, targets=[cand.job_id], resolution=resolution,
                         held=[*held, cand], admit=rule)[cand.job_id]
            out.append(_event(f, who, snap.now, f"quota of queue {cand.queue}", WaitReason.QUOTA))
            continue
        alone = replace(snap, pending=(*snap.pending, cand))
        plan = Scheduler(config).schedule(alone)
        f = forecast(config, alone, remaining, times, targets=[cand.job_id], resolution=resolution,
                     held=held, admit=rule)[cand.job_id]
        reason = plan.pending.get(cand.job_id)
        out.append(_event(f, who, snap.now, plan.blocked_by.get(cand.job_id),
                          from_pending(reason.value) if reason is not None else None))
    return out
