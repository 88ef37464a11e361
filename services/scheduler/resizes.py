"""Elastic jobs change size while they run: the core grows them into idle GPUs or shrinks
them for another job, and a user asks for a number of replicas (``kairos resize``)."""

from __future__ import annotations

import itertools

from scheduling import Resize, ResizeReason
from services.scheduler.bindings import Bindings
from services.scheduler.model import (
    DEFAULT_GRACE_S,
    SOURCE,
    TERMINAL,
    Cluster,
    Output,
    Placed,
    SchedJob,
)
from shared.elastic_resize import ResizeRefused, elastic_task
from shared.events import JobCommand, JobState, JobStatus, TransitionReason
from shared.logging import get_logger

log = get_logger(__name__)


class Resizes:
    def __init__(self, cluster: Cluster, bindings: Bindings) -> None:
        self.cluster = cluster
        self.bindings = bindings

    def on_command(self, cmd: JobCommand, out: Output) -> None:
        """A user asks for ``replicas`` of an elastic group: fewer stop now (highest
        replicas first); more grow when GPUs are idle; either way it is the new cap."""
        job = self.cluster.jobs.get(cmd.job_id)
        if job is None or job.ready is None or job.state in TERMINAL or \
                job.ending or cmd.replicas is None:
            log.warning("resize ignored: no such live job", job=cmd.job_id)
            return
        try:
            task = elastic_task(job.ready.spec, cmd.task, cmd.replicas)
        except ResizeRefused as e:
            log.warning("resize ignored", job=cmd.job_id, task=cmd.task,
                        replicas=cmd.replicas, why=e.message)
            return
        job.targets[task.name] = cmd.replicas
        out.dirty_jobs.add(job.job_id)
        self.cluster.needs_cycle = True
        if job.state in (JobState.BOUND, JobState.RUNNING) and not job.preempted:
            active = sorted(job.active(task.name), key=lambda p: p.replica, reverse=True)
            self._shrink(job, task.name, active[:max(0, len(active) - cmd.replicas)],
                         f"resize to {cmd.replicas} requested"
                         + (f" by {cmd.requested_by}" if cmd.requested_by else ""),
                         DEFAULT_GRACE_S, out)

    def apply(self, rz: Resize, out: Output) -> None:
        """One resize of the core's plan."""
        job = self.cluster.jobs.get(rz.job_id)
        if job is None or job.ready is None or job.ending or job.preempted or \
                job.state not in (JobState.BOUND, JobState.RUNNING):
            return
        if rz.reason is ResizeReason.GROW:
            self._grow(job, rz, out)
            return
        by_core = {p.core_id: p for p in job.active(rz.task_name)}
        stop = [by_core[t] for t in rz.stop_task_ids if t in by_core]
        self._shrink(job, rz.task_name, stop,
                     f"shrink for {rz.for_job}" if rz.for_job else "shrink",
                     rz.grace_period_s, out)

    def _grow(self, job: SchedJob, rz: Resize, out: Output) -> None:
        before = len(job.active(rz.task_name))
        job.resizes += 1
        used = {p.rank for p in job.active()}
        free_ranks = (r for r in itertools.count() if r not in used)
        new = [Placed(f"{b.task_id}.{job.resizes}", b.task_name, b.replica, next(free_ranks),
                      b.node_id, b.gpus, b.cpu_milli, b.memory_mib, job.attempt)
               for b in sorted(rz.binds, key=lambda b: b.replica)]
        job.placed.extend(new)
        out.dirty_jobs.add(job.job_id)
        why = "grow into idle GPUs"
        self.bindings.resize(job, new, [], why, 0.0, out)
        self._resized(job, rz.task_name, before, before + len(new), why, out)

    def _shrink(self, job: SchedJob, task_name: str, stop: list[Placed], why: str,
                grace_s: float, out: Output) -> None:
        if not stop:
            return
        before = len(job.active(task_name))
        for p in stop:
            p.removed = True
        job.resizes += 1
        out.dirty_jobs.add(job.job_id)
        self.bindings.resize(job, [], stop, why, grace_s, out)
        self._resized(job, task_name, before, before - len(stop), why, out)

    def _resized(self, job: SchedJob, task_name: str, before: int, after: int, why: str,
                 out: Output) -> None:
        assert job.ready is not None
        out.emit(JobStatus(
            job_id=job.job_id, state=job.state, reason="resized",
            reason_code=TransitionReason.RESIZED, attempt=job.attempt,
            message=f"{task_name}: {before} -> {after} replicas ({why})",
            epoch=self.cluster.epoch,
            replicas={t.name: len(job.active(t.name)) for t in job.ready.spec.tasks}),
            SOURCE, event_id=f"resized-{job.job_id}-{job.attempt}-{job.resizes}")

    def resend(self, job: SchedJob, out: Output) -> None:
        """Resizes the agents may have missed (a new leader): grown replicas not yet
        running, removed ones not yet stopped (agents do each once)."""
        grown = ([p for p in job.active() if p.state is JobState.BOUND]
                 if job.state is JobState.RUNNING else [])
        stopping = [p for p in job.live() if p.removed and p.attempt == job.attempt]
        if grown or stopping:
            self.bindings.resize(job, grown, stopping, "resent by a new leader",
                                 DEFAULT_GRACE_S, out)
