"""The reason vocabulary (shared/events/reasons.py): the core's and queueing's wait
reasons are members of one set; every transition the scheduler and queueing announce
carries a code, which an older reader's text classifier agrees with; unknown or missing
codes read as their defined fallbacks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduling import PendingReason, Scheduler, SchedulerConfig
from services.queueing import messages
from services.queueing.ordering import Held, job_request
from services.queueing.store import JobRow
from services.scheduler.state import Output, SchedulerState
from shared.events import (
    CommandAction,
    Envelope,
    JobCommand,
    JobState,
    JobStatus,
    JobSubmitted,
    JobWaiting,
    NodeLost,
    TransitionReason,
    WaitingJob,
    WaitReason,
    classify_transition,
    from_pending,
    utcnow,
)
from shared.events.reasons import QUEUEING_WAITS
from tests.services.builders import node, ready, step


def test_every_pending_reason_of_the_core_is_a_wait_code_of_the_same_name() -> None:
    for r in PendingReason:
        assert from_pending(r.value).value == r.value
    assert set(QUEUEING_WAITS) <= set(WaitReason)
    # the only code no one sets is the readers' fallback
    assert {r.value for r in PendingReason} | {r.value for r in QUEUEING_WAITS} == {
        r.value for r in WaitReason} - {"unknown"}


@pytest.mark.parametrize("model", [JobWaiting, WaitingJob])
def test_a_wait_code_this_reader_lacks_reads_as_unknown(model: type) -> None:
    extra = {"position": 1} if model is WaitingJob else {}
    assert model(job_id="j", reason="no_fit", **extra).reason is WaitReason.NO_FIT
    assert model(job_id="j", reason="solar_flare", **extra).reason is WaitReason.UNKNOWN


def test_an_older_job_waiting_without_blocked_by_is_read() -> None:
    env = Envelope.wrap(JobWaiting(job_id="j", reason=WaitReason.NO_FIT), "scheduler")
    data = env.model_dump(mode="json")
    del data["data"]["blocked_by"]
    ev = Envelope.model_validate(data).payload()
    assert isinstance(ev, JobWaiting) and ev.blocked_by is None


def _statuses(out: Output) -> list[JobStatus]:
    return [p for e, _ in out.events for p in [e.payload()]
            if isinstance(p, JobStatus) and p.task is None]


def _task(job: str, state: JobState, node_id: str, attempt: int = 1, reason: str = "agent",
          exit_code: int | None = None) -> JobStatus:
    return JobStatus(job_id=job, state=state, reason=reason, attempt=attempt, task="worker-0",
                     node_id=node_id, exit_code=exit_code)


def test_every_transition_the_scheduler_announces_has_a_code_its_text_agrees_with() -> None:
    s = SchedulerState(epoch=1, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    seen: list[JobStatus] = []
    seen += _statuses(step(s, node("n1"), node("n2"), ready("OK").build(),
                           ready("F").retries(1).build(), ready("T").build(),
                           ready("L").build(), now=1))
    n_of = {j: s.jobs[j].placed[0].node_id for j in ("OK", "F", "T", "L")}
    seen += _statuses(step(s, _task("OK", JobState.RUNNING, n_of["OK"]), now=2))
    seen += _statuses(step(s, _task("OK", JobState.SUCCEEDED, n_of["OK"], exit_code=0), now=3))
    seen += _statuses(step(s, _task("F", JobState.FAILED, n_of["F"], exit_code=1), now=4))
    seen += _statuses(step(s, _task("F", JobState.FAILED, s.jobs["F"].placed[-1].node_id,
                                    attempt=2, exit_code=1), now=5))
    seen += _statuses(step(s, _task("T", JobState.CANCELLED, n_of["T"],
                                    reason="time limit reached"), now=6))
    seen += _statuses(step(s, NodeLost(node_id=n_of["L"], last_seen=utcnow()), now=7))
    seen += _statuses(step(s, ready("C").gpus(64).build(), JobCommand(
        job_id="C", action=CommandAction.CANCEL, reason="by ana"), now=8))
    codes = {st.reason_code for st in seen}
    assert codes >= {TransitionReason.PLACED, TransitionReason.STARTED,
                     TransitionReason.SUCCEEDED, TransitionReason.RETRY,
                     TransitionReason.OUT_OF_RETRIES, TransitionReason.TIME_LIMIT,
                     TransitionReason.CANCELLED}
    for st in seen:
        assert st.reason_code is not None, st
        if st.job_id != "C":
            assert classify_transition(st.reason) is st.reason_code, st
    # a user's own cancel reason is text no classifier knows: the code is why codes exist
    [c] = [st for st in seen if st.job_id == "C"]
    assert (c.reason, c.reason_code, classify_transition(c.reason)) == (
        "by ana", TransitionReason.CANCELLED, TransitionReason.OTHER)


def test_every_status_queueing_announces_has_a_code_its_text_agrees_with() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    sub = JobSubmitted(job_id="j", queue="q", tenant="t", user="u",
                       spec=ready("j").build().spec, submitted_at=now)
    row = JobRow("j", 1, "q", "queued", 1, "", False, "", 0, sub.model_dump(), None, None)
    held = Held(1, sub, 1, job_request(sub, 1), (1.0, 0.0, 0.0))
    out = [*messages.admitted(held, True, now),
           messages.waiting(row, "quota", "over quota", 1),
           messages.requeued(row, 2),
           messages.cancelled(JobCommand(job_id="j", action=CommandAction.CANCEL)),
           messages.no_queue(sub)]
    statuses = [p for env, _ in out for p in [env.payload()] if isinstance(p, JobStatus)]
    assert [st.reason_code for st in statuses] == [
        TransitionReason.ADMITTED, TransitionReason.WAITING, TransitionReason.REQUEUED,
        TransitionReason.CANCELLED, TransitionReason.NO_QUEUE]
    for st in statuses:
        assert classify_transition(st.reason) is st.reason_code, st
