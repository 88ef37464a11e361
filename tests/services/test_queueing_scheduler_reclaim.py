"""The scheduler's side of queueing's reclaim: a ``preempt`` command stops the job and
hands it back to its queue (``preempted``, no retry here); the queue's later release
with a new attempt starts it again, and a replay of the old release is refused."""

from __future__ import annotations

from scheduling import Scheduler, SchedulerConfig
from services.scheduler.state import Output, SchedulerState
from shared.events import BindingAction, CommandAction, JobCommand, JobState, JobStatus
from tests.services import builders
from tests.services.builders import node, ready


def step(s: SchedulerState, *events: object) -> Output:
    out = builders.step(s, *events)
    s.evict_finished()
    return out


def report(out: Output) -> tuple[list[tuple[str, BindingAction]], list[tuple[str, str, int]]]:
    binds, states = [], []
    for env, topic in out.events:
        ev = env.payload()
        if topic == "bindings":
            binds.append((ev.job_id, ev.action))  # type: ignore[attr-defined]
        elif isinstance(ev, JobStatus) and ev.task is None:
            states.append((ev.job_id, ev.state.value, ev.attempt))
    return binds, states


def reclaim(job: str) -> JobCommand:
    return JobCommand(job_id=job, action=CommandAction.PREEMPT, requested_by="queueing",
                      reason="quota reclaimed: queue vision borrowed what nlp is guaranteed")


def test_a_reclaimed_job_stops_goes_back_to_its_queue_and_returns_with_a_new_attempt() -> None:
    s = SchedulerState(epoch=1, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    step(s, node("n1"))
    first = ready("B").gpus(8).build()
    step(s, first, JobStatus(job_id="B", state=JobState.RUNNING, reason="agent",
                             task="worker-0", node_id="n1"))
    binds, _ = report(step(s, reclaim("B")))
    assert binds == [("B", BindingAction.STOP)]
    assert report(step(s, reclaim("B")))[0] == []  # asked once
    _, states = report(step(s, JobStatus(job_id="B", state=JobState.PREEMPTED, reason="agent",
                                         task="worker-0", node_id="n1")))
    assert states == [("B", "preempted", 1)]  # not retried here: its queue decides
    assert s.jobs["B"].state is JobState.PREEMPTED and "B" not in s.finished
    binds, _ = report(step(s, first))  # a replay of the old release
    assert binds == []
    binds, _ = report(step(s, first.model_copy(update={"attempt": 2})))
    assert binds == [("B", BindingAction.ALLOCATE)] and s.jobs["B"].attempt == 2


def test_a_job_reclaimed_before_placement_is_handed_back_at_once() -> None:
    s = SchedulerState(epoch=1, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    step(s, ready("BIG").gpus(8).build())  # no node yet: it waits in the scheduler
    _, states = report(step(s, reclaim("BIG")))
    assert states == [("BIG", "preempted", 1)]
    _, states = report(step(s, JobCommand(job_id="BIG", action=CommandAction.CANCEL)))
    assert states == [("BIG", "cancelled", 1)]
