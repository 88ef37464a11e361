"""The scheduler's view of the cluster and the jobs it holds, updated from events.

Pure bookkeeping: events in, ``Output`` (events to publish, rows to persist) out. The
placement decision itself comes from the scheduling core (``scheduling``), called in
``cycle()`` with a snapshot built by ``SnapshotBuilder``. Each concern is a part of its
own, all working on the one ``Cluster`` record this state is:

- ``Lifecycle`` (jobs.py): a job admitted, bound, running, ended, retried, reclaimed;
- ``NodeOps`` (nodes.py): nodes registered, heard from, lost, cordoned and drained;
- ``Resizes`` (resizes.py): elastic jobs grown, shrunk and resized by a user;
- ``Bindings`` (bindings.py): the messages agents carry out;
- ``JobHistory`` (history.py): succeeded jobs' durations, the requests' estimates;
- rows.py: the rows persisted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from scheduling import PendingReason, Plan, Snapshot
from scheduling.decay import DecayedUsage
from services.scheduler.bindings import Bindings
from services.scheduler.explain import PendingNotices, placed_words
from services.scheduler.history import JobHistory
from services.scheduler.jobs import Lifecycle
from services.scheduler.model import (
    DEFAULT_GRACE_S,
    FOR_OTHERS,
    SOURCE,
    TERMINAL,
    Cluster,
    Output,
    Placed,
)
from services.scheduler.nodes import NodeOps
from services.scheduler.resizes import Resizes
from services.scheduler.rows import JobRow, job_from_row, job_row
from services.scheduler.snapshot import SnapshotBuilder
from shared.events import (
    CommandAction,
    EndCause,
    Event,
    JobCommand,
    JobReady,
    JobState,
    JobStatus,
    NodeCommand,
    NodeHeartbeat,
    NodeLabels,
    NodeLost,
    NodeRegistered,
    NodeTelemetry,
    TransitionReason,
)
from shared.events.reasons import mig_never_fits
from shared.gpu_models import model_id

Placer = Callable[[Snapshot], Plan]
Handler = Callable[[Any, Output], None]


class SchedulerState(Cluster):
    SOURCE = SOURCE

    def __init__(self, epoch: int, placer: Placer, history: JobHistory | None = None,
                 decay: DecayedUsage | None = None) -> None:
        super().__init__(epoch, history)
        self.placer = placer
        self.decay = decay  # each tenant's decayed past use, with the policy's half-life
        self.pending_reasons: dict[str, str] = {}
        self.notices = PendingNotices()  # job.waiting: why a job waits, when that changes
        self.bindings = Bindings(self)
        self.lifecycle = Lifecycle(self, self.bindings)
        self.node_ops = NodeOps(self, self.bindings, self.lifecycle)
        self.resizes = Resizes(self, self.bindings)
        self.snapshots = SnapshotBuilder(self)
        self._handlers: dict[type[Event], Handler] = {
            JobReady: self.lifecycle.on_ready,
            JobStatus: self._on_job_status,
            JobCommand: self._on_job_command,
            NodeCommand: self.node_ops.on_command,
            NodeLabels: self.node_ops.on_labels,
            NodeRegistered: self.node_ops.on_registered,
            NodeHeartbeat: self.node_ops.on_heartbeat,
            NodeLost: self.node_ops.on_lost,
            NodeTelemetry: lambda event, _out: self.node_ops.on_telemetry(event),
        }
        self._commands: dict[CommandAction, Handler] = {
            CommandAction.CANCEL: self.lifecycle.on_cancel,
            CommandAction.RESIZE: self.resizes.on_command,
            CommandAction.PREEMPT: self.lifecycle.on_reclaim,
        }

    # --- events in ---------------------------------------------------------------------

    def handle(self, event: Event, out: Output) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            handler(event, out)

    def _on_job_status(self, event: JobStatus, out: Output) -> None:
        if event.task is None:
            return  # a job-level report: no task to track
        self.lifecycle.on_task_status(event, out)
        if event.node_id is not None:
            self.node_ops.check_drained(event.node_id, out)

    def _on_job_command(self, event: JobCommand, out: Output) -> None:
        handler = self._commands.get(event.action)
        if handler is not None:
            handler(event, out)

    # --- the cycle ---------------------------------------------------------------------

    def _details(self, plan: Plan) -> dict[str, str]:
        """Waits whose reason alone does not name the constraint: MIG profiles no node has."""
        out = {}
        for job_id, reason in plan.pending.items():
            job = self.jobs.get(job_id)
            if reason is PendingReason.NEVER_FITS and job is not None and job.ready is not None \
                    and job.ready.spec.mig_profiles:
                out[job_id] = mig_never_fits(job.ready.spec.mig_profiles)
        return out

    def snapshot(self, now: float) -> Snapshot:
        return self.snapshots.snapshot(now)

    def cycle(self, now: float, out: Output) -> Plan:
        """Ask the core for a plan and carry it out: notices of why jobs wait, then
        preemptions, resizes and placements, in that order."""
        self.needs_cycle = False
        self.learn_succeeded(now)
        snapshot = self.snapshot(now)
        if self.decay is not None:
            snapshot = replace(snapshot, past_usage=self.decay.advance(now))
        plan = self.placer(snapshot)
        requests = {j.job_id: j for j in snapshot.pending} if plan.binds else {}
        self.pending_reasons = {k: v.value for k, v in plan.pending.items()}
        admitted = {j: job.attempt for j in plan.pending
                    if (job := self.jobs.get(j)) is not None and job.state is JobState.ADMITTED}
        for notice, event_id in self.notices.update(plan, admitted, now, self.epoch, self._details(plan)):
            out.emit(notice, SOURCE, event_id=event_id)
        for pre in plan.preemptions:
            victim = self.jobs.get(pre.job_id)
            if victim is None or victim.preempted or victim.state not in (
                    JobState.BOUND, JobState.RUNNING):
                continue
            victim.ask_stop(EndCause.PREEMPTED, pre.preemptor)
            out.dirty_jobs.add(victim.job_id)
            why = ("stopped to move to a faster GPU model" if pre.preemptor == pre.job_id
                   else f"preempted ({pre.reason.value}) for {pre.preemptor}")
            self.bindings.stop(victim, out, why,
                               EndCause.PREEMPTED, grace_s=pre.grace_period_s)
        for rz in plan.resizes:
            self.resizes.apply(rz, out)
        for job_id, binds in plan.binds_by_job().items():
            job = self.jobs[job_id]
            assert job.ready is not None
            order = {t.name: i for i, t in enumerate(job.ready.spec.tasks)}
            binds.sort(key=lambda b: (order[b.task_name], b.replica))
            new = [Placed(b.task_id, b.task_name, b.replica, rank, b.node_id, b.gpus,
                          b.cpu_milli, b.memory_mib, job.attempt)
                   for rank, b in enumerate(binds)]
            job.placed = [p for p in job.placed if p.state not in TERMINAL] + new
            job.state = JobState.BOUND
            job.bound_at = now
            job.bound_model = self.one_model(new)
            out.dirty_jobs.add(job_id)
            self.bindings.allocate(job, new, out)
            spec = job.ready.spec
            self.lifecycle.status(out, job, JobState.BOUND, TransitionReason.PLACED, placed_words(
                len({p.node_id for p in new}), job.bound_model, requests.get(job_id),
                ", ".join(spec.mig_profiles), learnt=not spec.throughput))
            if any(t.elastic and len(job.active(t.name)) < t.most_replicas
                   for t in job.ready.spec.tasks):
                self.needs_cycle = True  # it may grow next cycle (placement never grows)
        if self.decay is not None:
            self.decay.hold(self.held_gpus())
        return plan

    def one_model(self, placed: list[Placed]) -> str:
        """The GPU model of every GPU placed (its platform name); "" for none or several."""
        models = set()
        for p in placed:
            view = self.nodes.get(p.node_id)
            gpus = {g.index: g for g in view.inventory.gpus} if view else {}
            for u in p.gpus:
                g = gpus.get(u.index)
                models.add(model_id(g.model, g.memory_mib) if g else "")
        return models.pop() if len(models) == 1 else ""

    def held_gpus(self) -> dict[str, float]:
        """GPUs each tenant's live tasks hold (a share by its compute fraction)."""
        held: dict[str, float] = {}
        for job in self.jobs.values():
            if job.ready is None:
                continue
            gpus = sum(u.share for p in job.live() for u in p.gpus)
            if gpus:
                held[job.ready.tenant] = held.get(job.ready.tenant, 0.0) + gpus
        return held

    def learn_succeeded(self, now: float) -> None:
        """Jobs that succeeded since the last cycle teach the history their duration: a
        success frees resources, so a cycle follows in the same batch (``now`` is the end
        the row stores, to within the persist)."""
        if self.history is not None:
            for job in self.succeeded:
                if job.ready is not None:
                    self.history.learn_job(job.ready, job.bound_at, now, job.bound_model, job.attempt)
        self.succeeded.clear()

    # --- a new leader, a broker that came back empty ------------------------------------

    def republish(self, out: Output) -> None:
        """After taking leadership: fence every node with the new epoch, so a late
        decision of the old leader is refused, then resend what agents may have missed."""
        for node_id in list(self.nodes):
            self.node_ops.check_drained(node_id, out)  # a drain that ended while no one led
            self.bindings.fence(node_id, out)
        stop = self.bindings.stop
        for job in self.jobs.values():
            if any(p.attempt < job.attempt for p in job.live()):
                # the stop of a retried attempt's tasks may never have reached its agent,
                # and the retry waits for them
                stop(job, out, "an older attempt of a retried job", EndCause.RETRY,
                     grace_s=DEFAULT_GRACE_S, older_only=True)
            if job.state is JobState.BOUND and not job.ending:
                self.bindings.allocate(job, job.current(), out)
            stopping = job.stopping
            if job.ending and any(True for _ in job.live()):
                stop(job, out, "cancelled", EndCause.CANCELLED)
            elif stopping is not None and any(True for _ in job.live()):
                # the stop a preemption, a drain or a reclaim sent may never have reached
                # the agent
                if stopping.cause in FOR_OTHERS:
                    stop(job, out, f"preempted for {stopping.detail}", stopping.cause)
                else:
                    stop(job, out, stopping.detail, stopping.cause, grace_s=DEFAULT_GRACE_S)
            elif job.state in (JobState.BOUND, JobState.RUNNING) and not job.preempted:
                self.resizes.resend(job, out)

    def resend(self, out: Output) -> None:
        """The broker came back empty: bindings are not refilled from the outbox (an old
        one could start a finished task), so tell every node what it owns and send again
        what agents may not have carried out yet. Agents handle each task once."""
        self.republish(out)
        for node_id, view in self.nodes.items():
            if not view.lost:
                self.bindings.reconcile(node_id, out, "resent after the broker restarted")

    # --- persistence -------------------------------------------------------------------

    def job_row(self, job_id: str) -> JobRow:
        return job_row(self.jobs[job_id])

    def load_job(self, row: JobRow) -> None:
        job = job_from_row(row)
        self.jobs[job.job_id] = job
        self.seq = max(self.seq, job.seq)

    def evict_finished(self) -> None:
        """Drop ended jobs that hold nothing any more (call after persisting them)."""
        for job_id in [j.job_id for j in self.jobs.values()
                       if j.state in TERMINAL and j.ready is not None
                       and not any(True for _ in j.live())
                       # reclaimed: kept until its queue sends it again (replays refused)
                       and (j.state is not JobState.PREEMPTED or j.ending)]:
            del self.jobs[job_id]
            self.finished.add(job_id)
