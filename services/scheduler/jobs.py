"""A job's life in the scheduler: admitted, bound, running, then ended, retried, handed
back to its queue (reclaimed) or cancelled; each step announced on ``jobs.status``."""

from __future__ import annotations

from services.scheduler.bindings import Bindings
from services.scheduler.model import (
    DEFAULT_GRACE_S,
    MAX_NODE_LOSSES,
    SOURCE,
    TERMINAL,
    Cluster,
    Output,
    SchedJob,
    Stopping,
)
from shared.events import (
    NODE_CAUSES,
    RETURNED,
    TIME_LIMIT_REACHED,
    JobCommand,
    JobReady,
    JobState,
    JobStatus,
)
from shared.events import EndCause as End
from shared.events import TransitionReason as Code


class Lifecycle:
    def __init__(self, cluster: Cluster, bindings: Bindings) -> None:
        self.cluster = cluster
        self.bindings = bindings

    def status(self, out: Output, job: SchedJob, state: JobState, code: Code, reason: str,
               exit_code: int | None = None) -> None:
        """Announce a transition: its code (the vocabulary) and its words."""
        out.emit(JobStatus(job_id=job.job_id, state=state, reason=reason, reason_code=code,
                           attempt=job.attempt, exit_code=exit_code,
                           epoch=self.cluster.epoch), SOURCE,
                 event_id=f"{state.value}-{job.job_id}-{job.attempt}")

    def on_ready(self, ev: JobReady, out: Output) -> None:
        c = self.cluster
        job = c.jobs.get(ev.job_id)
        if ev.job_id in c.finished:
            return  # a replay of a job that already ended (e.g. an outbox refill)
        if job is not None and job.ready is None:  # cancelled before it reached us
            job.ready = ev
            job.attempt = ev.attempt
            job.state = JobState.CANCELLED
            out.dirty_jobs.add(job.job_id)
            self.status(out, job, JobState.CANCELLED, Code.CANCELLED, "cancelled before placement")
            return
        if job is not None and ev.attempt <= job.attempt:
            return  # a replay
        c.jobs[ev.job_id] = SchedJob(ev.job_id, ev, JobState.ADMITTED, ev.attempt,
                                     c.next_seq(),
                                     # a reclaimed attempt may still be stopping
                                     list(job.live()) if job is not None else [])
        out.dirty_jobs.add(ev.job_id)
        c.needs_cycle = True

    def on_reclaim(self, cmd: JobCommand, out: Output) -> None:
        """Queueing takes back the quota the job holds: stop it (checkpoint grace) and,
        once stopped, hand it back to its queue (``preempted``), which admits it again
        later with a new attempt. It is not retried here."""
        job = self.cluster.jobs.get(cmd.job_id)
        if job is None or job.ready is None or job.state in TERMINAL or job.ending or \
                job.reclaimed:
            return
        why = cmd.reason or "quota reclaimed"
        in_flight = job.preempted  # a preemption's stop already goes out
        job.ask_stop(End.RECLAIMED, why)
        out.dirty_jobs.add(job.job_id)
        if job.state is JobState.ADMITTED:  # not placed yet: nothing to stop
            job.state = JobState.PREEMPTED
            self.status(out, job, JobState.PREEMPTED, Code.RECLAIMED, why)
            self.cluster.needs_cycle = True
        elif not in_flight:
            self.bindings.stop(job, out, why, End.RECLAIMED, grace_s=DEFAULT_GRACE_S)

    def on_cancel(self, cmd: JobCommand, out: Output) -> None:
        c = self.cluster
        job = c.jobs.get(cmd.job_id)
        if job is None and cmd.job_id in c.finished:
            return  # it ended already: nothing to cancel (and its row stays as it ended)
        if job is None:
            c.jobs[cmd.job_id] = SchedJob(cmd.job_id, None, JobState.CANCELLED, 0,
                                          c.next_seq(),
                                          stopping=Stopping(End.CANCELLED, cmd.reason))
            out.dirty_jobs.add(cmd.job_id)
            return
        if job.state in TERMINAL - {JobState.PREEMPTED} or job.ending:
            return
        handed_back = job.state is JobState.PREEMPTED and job.reclaimed
        job.ask_stop(End.CANCELLED, cmd.reason if cmd.reason == RETURNED else "")
        out.dirty_jobs.add(job.job_id)
        # reclaimed: back with its queue (which cancels it there too, if it holds it)
        if job.state is JobState.ADMITTED or handed_back:
            job.state = JobState.CANCELLED
            self.status(out, job, JobState.CANCELLED, Code.CANCELLED, cmd.reason or "cancelled")
        else:
            self.bindings.stop(job, out, "cancelled", End.CANCELLED)

    def on_task_status(self, st: JobStatus, out: Output) -> None:
        job = self.cluster.jobs.get(st.job_id)
        if job is None:
            return
        placed = next((p for p in job.placed
                       if p.task_id == st.task and p.attempt == st.attempt), None)
        if placed is None or placed.state in TERMINAL:
            return
        if placed.removed:  # a replica a shrink stopped: the job goes on without it
            if st.state in TERMINAL:
                job.placed.remove(placed)
                self.cluster.needs_cycle = True  # resources freed (the job that asked may start)
            elif st.state is JobState.RUNNING and placed.state is JobState.BOUND:
                placed.state = JobState.RUNNING
            else:
                return
            out.dirty_jobs.add(job.job_id)
            return
        if st.state is JobState.RUNNING:
            if placed.state is not JobState.BOUND:
                return
            placed.state = JobState.RUNNING
        elif st.state in TERMINAL:
            placed.state = st.state
            self.cluster.needs_cycle = True  # resources freed
        else:
            return
        out.dirty_jobs.add(job.job_id)
        if st.attempt != job.attempt:
            return  # a straggler of an older attempt: only its resources mattered
        self.advance(job, st, out)

    def advance(self, job: SchedJob, st: JobStatus, out: Output) -> None:
        """The job's state after one of its current tasks reported ``st``."""
        tasks = job.current()
        states = {p.state for p in tasks}
        if job.ending:
            if all(s in TERMINAL for s in states) and job.state not in TERMINAL:
                assert job.stopping is not None
                job.state = JobState.CANCELLED
                self.status(out, job, JobState.CANCELLED, Code.CANCELLED,
                            job.stopping.detail or "cancelled")
            return
        cause = st.end_cause()
        if cause is End.TIME_LIMIT and st.state is JobState.CANCELLED and \
                job.state in (JobState.BOUND, JobState.RUNNING) and not job.preempted:
            self._time_limit(job, out)
            return
        if st.state is JobState.RUNNING and job.state is JobState.BOUND and states == {
                JobState.RUNNING}:
            job.state = JobState.RUNNING
            self.status(out, job, JobState.RUNNING, Code.STARTED, "all tasks running")
        elif states == {JobState.SUCCEEDED}:
            job.state = JobState.SUCCEEDED
            self.cluster.succeeded.append(job)  # its duration, learnt at the next cycle
            self.status(out, job, JobState.SUCCEEDED, Code.SUCCEEDED, "all tasks succeeded",
                        exit_code=0)
        elif st.state in (JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED) and \
                job.state in (JobState.BOUND, JobState.RUNNING):
            # an agent that could not renew its lease stopped it: like a lost node
            # its node lost, cut off, or restarted without it: not the job's failure
            self.retry_or_fail(job, out, f"task {st.task} {st.state.value}: {st.reason}",
                               st.exit_code, node_lost=cause in NODE_CAUSES)

    def _time_limit(self, job: SchedJob, out: Output) -> None:
        """A task reached the spec's timeLimit: the job ends, no retry. An interactive
        environment was simply held until its limit (cancelled); a batch job failed."""
        assert job.ready is not None
        self.bindings.stop(job, out, TIME_LIMIT_REACHED, End.TIME_LIMIT)
        job.ask_stop(End.TIME_LIMIT)  # the other tasks' reports change nothing any more
        if job.ready.spec.interactive:
            job.state = JobState.CANCELLED
            self.status(out, job, JobState.CANCELLED, Code.TIME_LIMIT, TIME_LIMIT_REACHED)
        else:
            job.state = JobState.FAILED
            self.status(out, job, JobState.FAILED, Code.TIME_LIMIT, TIME_LIMIT_REACHED)

    def retry_or_fail(self, job: SchedJob, out: Output, why: str, exit_code: int | None,
                      node_lost: bool = False) -> None:
        """Start the job again with a new attempt, or fail it. Only the job's own failures
        spend its maxRetry: an attempt ended by a preemption, a drain or a lost node is
        requeued apart (``requeues``)."""
        assert job.ready is not None
        stopping = job.stopping
        if stopping is not None and job.reclaimed:  # back to its queue, which admits it
            if not job.preempted:  # again when quota allows
                self.bindings.stop(job, out, stopping.detail, End.RECLAIMED)
            job.stopping = Stopping(End.RECLAIMED, stopping.detail)  # no stop in flight now
            job.state = JobState.PREEMPTED
            self.status(out, job, JobState.PREEMPTED, Code.RECLAIMED, stopping.detail)
            self.cluster.needs_cycle = True
            return
        not_its_fault = node_lost or job.preempted  # or a drain: a platform cause
        if stopping is not None and job.preempted:  # its tasks were already asked to stop
            self.status(out, job, JobState.PREEMPTED, Code.PREEMPTED,
                        f"preempted for {stopping.detail}")
        else:
            self.bindings.stop(job, out, why, End.RETRY)
        job.stopping = None
        if node_lost:
            job.node_losses += 1
        if not_its_fault:  # preempted, drained or its node lost: this attempt does not count
            job.requeues += 1
        if job.node_losses >= MAX_NODE_LOSSES:
            job.state = JobState.FAILED
            self.status(out, job, JobState.FAILED, Code.NODE_LOST,
                        f"{job.node_losses} nodes lost under it: {why}", exit_code=exit_code)
        elif job.attempt - job.requeues <= job.ready.spec.max_retry:
            job.attempt += 1
            job.state = JobState.ADMITTED
            job.seq = self.cluster.next_seq()
            self.status(out, job, JobState.ADMITTED, Code.RETRY, f"retry after {why}")
            self.cluster.needs_cycle = True
        else:
            job.state = JobState.FAILED
            self.status(out, job, JobState.FAILED, Code.OUT_OF_RETRIES, f"out of retries: {why}",
                        exit_code=exit_code)
