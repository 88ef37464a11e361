"""The chaos checker's reading of the agents' journals (kairos/node_records.py) finds
what the history alone cannot: work a node finished that was recorded otherwise or run
again, a platform cause that spent a job's last retry, a task past its time limit."""

from __future__ import annotations

from typing import Any

from kairos.check import History
from kairos.node_records import check_records
from shared.events import (
    Binding,
    BindingAction,
    EndCause,
    Envelope,
    Event,
    JobState,
    JobStatus,
    NodeLost,
    TaskBinding,
    TransitionReason,
)


def history(*events: Event) -> History:
    h = History()
    for ev in events:
        h.add(Envelope.wrap(ev, "test"))
    return h


def bound(job: str, attempt: int = 1, *tasks: str) -> Binding:
    return Binding(binding_id=f"{job}-{attempt}", action=BindingAction.ALLOCATE, node_id="n1",
                   epoch=1, job_id=job, attempt=attempt,
                   tasks=[TaskBinding(task_id=t, task_name="w", role="worker", replica=0,
                                      rank=0) for t in tasks or ("w-0",)])


def entry(key: str, state: JobState, cause: EndCause, ran_s: float | None = None,
          limit_s: float | None = None) -> dict[str, Any]:
    job, task, attempt = key.split("/")
    out = JobStatus(job_id=job, task=task, attempt=int(attempt), state=state, reason="x",
                    cause=cause, ran_s=ran_s)
    return {"key": key, "time_limit_s": limit_s, "grace_s": 1.0,
            "outcome": out.model_dump(mode="json")}


def test_work_a_node_finished_must_end_the_job_succeeded() -> None:
    done = [entry("A/w-0/1", JobState.SUCCEEDED, EndCause.COMPLETED),
            entry("B/w-0/1", JobState.SUCCEEDED, EndCause.COMPLETED),
            entry("C/w-0/1", JobState.SUCCEEDED, EndCause.COMPLETED)]
    h = history(bound("A"), bound("B"), bound("B", 2), bound("C"))
    r = check_records(done, h, {"A": "succeeded", "B": "succeeded", "C": "failed"})
    assert r.wrongly_failed == {"B", "C"}  # B ran again, C ended failed
    assert {v.kind for v in r.violations} == {"finished_not_recorded"}
    # a gang with one task not finished is not a finished attempt
    h = history(bound("G", 1, "w-0", "w-1"))
    half = [entry("G/w-0/1", JobState.SUCCEEDED, EndCause.COMPLETED)]
    assert not check_records(half, h, {"G": "failed"}).wrongly_failed


def test_a_platform_cause_must_not_spend_the_last_retry() -> None:
    lost = JobStatus(job_id="L", task="w-0", state=JobState.FAILED, reason="lost: ...",
                     cause=EndCause.LOST)
    own = JobStatus(job_id="O", task="w-0", state=JobState.FAILED, reason="error",
                    cause=EndCause.FAILED, exit_code=1)
    out = [JobStatus(job_id=j, state=JobState.FAILED, reason="out of retries",
                     reason_code=TransitionReason.OUT_OF_RETRIES) for j in "LO"]
    r = check_records([], history(lost, own, *out), {"L": "failed", "O": "failed"})
    assert r.wrongly_failed == {"L"}


def test_a_task_past_its_limit_is_an_overrun() -> None:
    entries = [entry("T/w-0/1", JobState.CANCELLED, EndCause.TIME_LIMIT, ran_s=5.2, limit_s=5),
               entry("U/w-0/1", JobState.SUCCEEDED, EndCause.COMPLETED, ran_s=25, limit_s=5)]
    r = check_records(entries, History(), {"T": "failed", "U": "succeeded"})
    assert r.limit_overruns == ["U/w-0/1"]


def test_work_finished_on_a_node_declared_lost_may_run_again() -> None:
    """A partition: the report could not get through before the node was declared lost,
    so running it again is what the platform must do; counted apart, not a violation."""
    from shared.events import utcnow

    done = [entry("P/w-0/1", JobState.SUCCEEDED, EndCause.COMPLETED)]
    h = history(bound("P"), NodeLost(node_id="n1", last_seen=utcnow()), bound("P", 2))
    r = check_records(done, h, {"P": "succeeded"})
    assert (r.wrongly_failed, r.rerun_after_node_lost, r.violations) == (set(), {"P"}, [])
