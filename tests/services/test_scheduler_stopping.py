"""Why the scheduler stops a job's attempt is one typed cause (``SchedJob.stopping``):
the stronger cause stands when two meet (ending > handed back > for others), a stop in
flight is never sent twice, the code travels on the stop bindings, and a row stored
before causes is read back as the one cause its flags meant."""

from __future__ import annotations

import json

from scheduling import Scheduler, SchedulerConfig, first_fit
from services.scheduler.model import Stopping
from services.scheduler.rows import JobMeta, JobRow, job_from_row
from services.scheduler.state import SchedulerState
from shared.events import Binding, BindingAction, EndCause, JobState, JobStatus
from tests.services.builders import node, ready, step
from tests.services.test_queueing_scheduler_reclaim import reclaim


def running(job: str) -> JobStatus:
    return JobStatus(job_id=job, task="worker-0", state=JobState.RUNNING, reason="started",
                     node_id="n1")


def stops(out: object) -> list[Binding]:
    return [b for env, topic in out.events  # type: ignore[attr-defined]
            if topic == "bindings" and (b := env.payload()).action is BindingAction.STOP]


def test_a_reclaim_during_a_preemption_hands_the_job_back_without_a_second_stop() -> None:
    s = SchedulerState(epoch=1, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    step(s, node("n1"))
    step(s, ready("LOW").gpus(8).priority_class("low").build(), running("LOW"))
    out = step(s, ready("URGENT").gpus(8).priority_class("urgent").build())
    assert [(b.job_id, b.cause) for b in stops(out)] == [("LOW", EndCause.PREEMPTED)]
    out = step(s, reclaim("LOW"))
    low = s.jobs["LOW"]
    assert low.stopping == Stopping(EndCause.RECLAIMED, low.stopping.detail,  # type: ignore[union-attr]
                                    after=EndCause.PREEMPTED)
    assert low.preempted and low.reclaimed and not stops(out)  # the stop is in flight
    out = step(s, JobStatus(job_id="LOW", task="worker-0", state=JobState.PREEMPTED,
                            reason="stopped", cause=EndCause.PREEMPTED, node_id="n1"))
    assert not stops(out) and low.state is JobState.PREEMPTED  # back with its queue
    assert low.attempt == 1  # not retried here: its queue admits it again


def test_a_cancel_outranks_a_preemption_and_the_job_ends_cancelled() -> None:
    s = SchedulerState(epoch=1, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    step(s, node("n1"))
    step(s, ready("LOW").gpus(8).priority_class("low").build(), running("LOW"))
    step(s, ready("URGENT").gpus(8).priority_class("urgent").build())
    from shared.events import CommandAction, JobCommand

    step(s, JobCommand(job_id="LOW", action=CommandAction.CANCEL, reason="cancelled by user"))
    assert s.jobs["LOW"].ending and s.jobs["LOW"].preempted
    step(s, JobStatus(job_id="LOW", task="worker-0", state=JobState.PREEMPTED,
                      reason="stopped", cause=EndCause.PREEMPTED, node_id="n1"))
    assert s.jobs.get("LOW") is None or s.jobs["LOW"].state is JobState.CANCELLED


def test_a_time_limit_is_decided_by_its_code_not_its_words() -> None:
    s = SchedulerState(epoch=1, placer=first_fit)
    step(s, node("n1"))
    step(s, ready("T").gpus(1).replicas(2).duration(600).build(), running("T"),
         JobStatus(job_id="T", task="worker-1", state=JobState.RUNNING, reason="started",
                   node_id="n1"))
    out = step(s, JobStatus(job_id="T", task="worker-0", state=JobState.CANCELLED,
                            reason="stopped at the limit the spec set",  # new words
                            cause=EndCause.TIME_LIMIT, node_id="n1"))
    assert s.jobs["T"].state is JobState.FAILED  # batch: failed, no retry
    assert s.jobs["T"].stopping == Stopping(EndCause.TIME_LIMIT)
    assert [(b.cause, [t.task_id for t in b.tasks]) for b in stops(out)] == [
        (EndCause.TIME_LIMIT, ["worker-1"])]  # the other task, with the code


def test_stopping_survives_a_row_and_an_old_row_reads_as_its_cause() -> None:
    s = SchedulerState(epoch=1, placer=first_fit)
    step(s, node("n1"))
    step(s, ready("A").gpus(1).duration(600).build(), running("A"))
    s.jobs["A"].ask_stop(EndCause.PREEMPTED, "B")
    s.jobs["A"].ask_stop(EndCause.RECLAIMED, "quota reclaimed")
    row = s.job_row("A")
    back = job_from_row({**row, "ready": json.loads(row["ready"])})
    assert back.stopping == Stopping(EndCause.RECLAIMED, "quota reclaimed", EndCause.PREEMPTED)

    def old(**flags: object) -> Stopping | None:
        meta = JobMeta(seq=1, **flags)  # type: ignore[typeddict-item]
        return job_from_row(JobRow(job_id="O", state="running", attempt=1, ready={},
                                   placement=[], tasks=meta)).stopping

    assert old() is None
    assert old(preempted_by="B") == Stopping(EndCause.PREEMPTED, "B")
    assert old(preempted_by="drain of node n1", drain_requeue=True) == Stopping(
        EndCause.DRAINED, "drain of node n1")
    assert old(cancel_requested=True, cancel_reason="returned", preempted_by="B") == \
        Stopping(EndCause.CANCELLED, "returned", EndCause.PREEMPTED)
    assert old(reclaimed="quota reclaimed") == Stopping(EndCause.RECLAIMED, "quota reclaimed")
