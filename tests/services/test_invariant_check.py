"""The invariant checker (`kairos check`) on histories made to break one rule each: it
must find every one, and nothing in a clean history."""

from __future__ import annotations

from datetime import timedelta

from kairos.check import History, check
from shared.events import (
    Binding,
    BindingAction,
    Envelope,
    Event,
    GpuAssignment,
    JobState,
    JobStatus,
    NodeLost,
    QueueChanged,
    QueueStatus,
    TaskBinding,
    utcnow,
)
from tests.services.builders import node

T0 = utcnow()


def history(*events: Event) -> History:
    h = History()
    for i, ev in enumerate(events):  # one second apart, in this order
        h.add(Envelope.wrap(ev, "test").model_copy(update={"occurred_at": T0 + timedelta(
            seconds=i)}))
    return h


def bind(job: str, attempt: int, node_id: str, gpu: int, mib: int = 0, pct: int = 100,
         epoch: int = 1) -> Binding:
    return Binding(binding_id=f"{job}-{attempt}-{node_id}", action=BindingAction.ALLOCATE,
                   node_id=node_id, epoch=epoch, job_id=job, attempt=attempt,
                   tasks=[TaskBinding(task_id="w-0", task_name="w", role="worker", replica=0,
                                      rank=0, gpus=[GpuAssignment(index=gpu, memory_mib=mib,
                                                                  compute_pct=pct)])])


def task(job: str, state: JobState, attempt: int = 1, node_id: str = "n1",
         epoch: int | None = 1) -> JobStatus:
    return JobStatus(job_id=job, state=state, reason="agent", attempt=attempt, task="w-0",
                     node_id=node_id, epoch=epoch)


def job(job_id: str, state: JobState, attempt: int = 1, reason: str = "") -> JobStatus:
    return JobStatus(job_id=job_id, state=state, reason=reason or state.value, attempt=attempt)


def kinds(h: History, states: dict[str, str]) -> list[str]:
    return [v.kind for v in check(h, states).violations]


def test_a_clean_run_with_a_rerun_after_a_node_loss_breaks_nothing() -> None:
    h = history(node("n1"), node("n2"),
                bind("A", 1, "n1", 0), task("A", JobState.RUNNING),
                NodeLost(node_id="n1", last_seen=T0),
                job("A", JobState.ADMITTED, 2, "retry after node n1 lost"),
                bind("A", 2, "n2", 0), task("A", JobState.RUNNING, 2, "n2"),
                task("A", JobState.SUCCEEDED, 2, "n2"), job("A", JobState.SUCCEEDED, 2))
    report = check(h, {"A": "succeeded"})
    assert report.violations == []
    assert report.reruns == {"A": ["retry after node n1 lost"]}


def test_a_job_that_never_ended_is_reported() -> None:
    assert kinds(history(), {"A": "admitted", "B": "succeeded"}) == ["not_terminal"]


def test_an_attempt_started_while_the_last_one_still_runs_is_a_double_run() -> None:
    h = history(node("n1"), node("n2"), bind("A", 1, "n1", 0), task("A", JobState.RUNNING),
                job("A", JobState.ADMITTED, 2, "retry"), bind("A", 2, "n2", 0),
                task("A", JobState.RUNNING, 2, "n2"))
    assert kinds(h, {"A": "running"}) == ["not_terminal", "double_run"]


def test_a_task_that_goes_on_on_a_lost_node_is_a_double_run() -> None:
    h = history(node("n1"), bind("A", 1, "n1", 0), task("A", JobState.RUNNING),
                NodeLost(node_id="n1", last_seen=T0), task("A", JobState.SUCCEEDED))
    assert kinds(h, {"A": "succeeded"}) == ["double_run"]


def test_a_gpu_given_twice_is_over_capacity_but_a_freed_one_is_not() -> None:
    freed = history(node("n1"), bind("A", 1, "n1", 0), task("A", JobState.SUCCEEDED),
                    bind("B", 1, "n1", 0))
    assert kinds(freed, {}) == []
    shared = history(node("n1"), bind("A", 1, "n1", 0, mib=40000, pct=50),
                     bind("B", 1, "n1", 0, mib=40000, pct=50))
    assert kinds(shared, {}) == []  # two halves of one 80 GiB GPU (81,559 MiB)
    twice = history(node("n1"), bind("A", 1, "n1", 0), bind("B", 1, "n1", 0, mib=1024, pct=10))
    assert kinds(twice, {}) == ["over_capacity"]


def test_a_binding_resent_for_a_task_that_had_ended_holds_nothing_unless_it_runs_again(
        ) -> None:
    """A new leader that loaded A as running resends its binding after A's task ended
    (seen in `make chaos-loaded`, the leader paused past its lease); the agent runs
    nothing, and B may have the GPU. Had the agent run A again, the GPU is given twice."""
    resent = history(node("n1"), bind("A", 1, "n1", 0), task("A", JobState.RUNNING),
                     task("A", JobState.SUCCEEDED), bind("A", 1, "n1", 0, epoch=2),
                     bind("B", 1, "n1", 0, epoch=2), task("B", JobState.RUNNING, epoch=2))
    assert kinds(resent, {}) == []
    ran_again = history(node("n1"), bind("A", 1, "n1", 0), task("A", JobState.SUCCEEDED),
                        bind("A", 1, "n1", 0, epoch=2), task("A", JobState.RUNNING, epoch=2),
                        bind("B", 1, "n1", 0, epoch=2))
    assert kinds(ran_again, {}) == ["over_capacity"]


def test_a_binding_to_a_node_already_declared_lost_holds_nothing_unless_it_runs() -> None:
    """The monitor declares n1 lost; the scheduler, before it hears, binds A there (seen
    in the partition chaos slice), then gives A back. Once n1 registers again, B may have
    the GPU. Had A's task run there, the GPU is given twice."""
    lost = NodeLost(node_id="n1", last_seen=T0)
    given_back = history(node("n1"), lost, bind("A", 1, "n1", 0), node("n1"),
                         bind("B", 1, "n1", 0), task("B", JobState.RUNNING))
    assert kinds(given_back, {}) == []
    ran = history(node("n1"), lost, bind("A", 1, "n1", 0), node("n1"),
                  task("A", JobState.RUNNING), bind("B", 1, "n1", 0))
    assert kinds(ran, {}) == ["over_capacity"]


def test_a_task_started_from_a_fenced_off_epoch_is_reported() -> None:
    fence = Binding(binding_id="fence-n1-e2", action=BindingAction.FENCE, node_id="n1",
                    epoch=2, job_id="")
    h = history(node("n1"), fence, bind("A", 1, "n1", 0), task("A", JobState.RUNNING, epoch=1))
    assert kinds(h, {}) == ["stale_epoch"]


def test_borrowing_past_the_limit_is_reported() -> None:
    h = history(QueueChanged(queue="q", change="updated",
                             settings={"name": "q", "borrowing_limit": {"gpus": 2}}),
                QueueStatus(queue="q", borrowed={"gpus": 2}),
                QueueStatus(queue="q", borrowed={"gpus": 3}))
    assert kinds(h, {}) == ["quota_exceeded"]


def test_holding_more_of_a_gpu_model_than_its_quota_allows_is_reported() -> None:
    settings = {"name": "q", "gpu_models": [
        {"model": "H100", "guaranteed": 4, "borrowing_limit": 2}, {"model": "V100"}]}
    within = history(QueueChanged(queue="q", change="updated", settings=settings),
                     QueueStatus(queue="q", used_by_model={"H100": 6, "V100": 40}))
    assert kinds(within, {}) == []
    over = history(QueueChanged(queue="q", change="updated", settings=settings),
                   QueueStatus(queue="q", used_by_model={"H100": 7}))
    assert kinds(over, {}) == ["quota_exceeded"]
