"""The scheduler service's bookkeeping: events in, bindings and job transitions out."""

from __future__ import annotations

import pytest

from scheduling import Scheduler, SchedulerConfig, first_fit
from services.scheduler.state import Output, SchedulerState
from shared.events import (
    Binding,
    BindingAction,
    CommandAction,
    JobCommand,
    JobState,
    JobStatus,
    NodeLost,
    utcnow,
)
from tests.services.builders import node, ready, step


@pytest.fixture(params=["first_fit", "core"])
def state(request: pytest.FixtureRequest) -> SchedulerState:
    """Each scenario runs with plain first fit and with the scheduling core the service
    uses by default (gang, priority, topology, bin-packing, backfill...)."""
    placer = first_fit if request.param == "first_fit" else Scheduler(
        SchedulerConfig.preset("default")).schedule
    s = SchedulerState(epoch=3, placer=placer)
    out = Output()
    s.handle(node("n1"), out)
    s.handle(node("n2"), out)
    return s


def bindings(out: Output) -> list[Binding]:
    return [e.payload() for e, t in out.events if t == "bindings"]  # type: ignore[misc]


def statuses(out: Output) -> list[tuple[str, str]]:
    return [(p.job_id, p.state.value) for e, t in out.events if t == "jobs.status"
            for p in [e.payload()] if isinstance(p, JobStatus)]


def task_status(job: str, task: str, state: JobState, attempt: int = 1,
                node_id: str = "n1", exit_code: int | None = None) -> JobStatus:
    return JobStatus(job_id=job, state=state, reason="agent", attempt=attempt, task=task,
                     node_id=node_id, exit_code=exit_code)


def test_gang_across_nodes_gets_one_binding_per_node_with_ranks(state: SchedulerState) -> None:
    out = step(state, ready("J").gpus(8).replicas(2).build())
    bs = bindings(out)
    assert sorted(b.node_id for b in bs) == ["n1", "n2"]
    assert all(b.epoch == 3 and b.world_size == 2 and b.action is BindingAction.ALLOCATE
               for b in bs)
    assert sorted(t.rank for b in bs for t in b.tasks) == [0, 1]
    rank0 = next(b for b in bs if b.tasks[0].rank == 0)
    assert all(b.master_addr == f"{rank0.node_id}.local" for b in bs)
    assert statuses(out) == [("J", "bound")]


def test_gang_that_does_not_fit_holds_nothing(state: SchedulerState) -> None:
    out = step(state, ready("BIG").gpus(8).replicas(3).build(), ready("SMALL").gpus(1).build())
    assert [b.job_id for b in bindings(out)] == ["SMALL"]
    # first fit only knows "no fit now"; the core sees 24 GPUs exceed the whole cluster
    assert state.pending_reasons["BIG"] in ("no_fit", "never_fits")


def test_job_runs_then_succeeds_when_every_task_has(state: SchedulerState) -> None:
    step(state, ready("J").gpus(4).replicas(2).build())
    out = step(state, task_status("J", "worker-0", JobState.RUNNING))
    assert statuses(out) == []
    out = step(state, task_status("J", "worker-1", JobState.RUNNING))
    assert statuses(out) == [("J", "running")]
    step(state, task_status("J", "worker-0", JobState.SUCCEEDED))
    out = step(state, task_status("J", "worker-1", JobState.SUCCEEDED),
               task_status("J", "worker-1", JobState.SUCCEEDED))  # a replay changes nothing
    assert statuses(out) == [("J", "succeeded")]


def test_freed_gpus_go_to_the_next_job(state: SchedulerState) -> None:
    step(state, ready("A").gpus(8).replicas(2).build())
    out = step(state, ready("B").gpus(8).build())
    assert bindings(out) == [] and state.pending_reasons == {"B": "no_fit"}
    out = step(state, task_status("A", "worker-0", JobState.SUCCEEDED))
    assert [(b.job_id, b.node_id) for b in bindings(out)] == [("B", "n1")]


def test_cancel_of_a_pending_job_is_immediate(state: SchedulerState) -> None:
    step(state, ready("BIG").gpus(8).replicas(3).build())
    out = step(state, JobCommand(job_id="BIG", action=CommandAction.CANCEL, reason="user"))
    assert statuses(out) == [("BIG", "cancelled")]


def test_cancel_of_a_running_job_stops_its_tasks_first(state: SchedulerState) -> None:
    step(state, ready("J").gpus(8).replicas(2).build())
    out = step(state, JobCommand(job_id="J", action=CommandAction.CANCEL))
    stops = bindings(out)
    assert {b.action for b in stops} == {BindingAction.STOP} and len(stops) == 2
    assert statuses(out) == []
    step(state, task_status("J", "worker-0", JobState.CANCELLED))
    out = step(state, task_status("J", "worker-1", JobState.CANCELLED, node_id="n2"))
    assert statuses(out) == [("J", "cancelled")]


def test_cancel_before_the_job_arrives_leaves_a_tombstone(state: SchedulerState) -> None:
    step(state, JobCommand(job_id="J", action=CommandAction.CANCEL))
    out = step(state, ready("J").build())
    assert bindings(out) == [] and statuses(out) == [("J", "cancelled")]


def test_failed_task_retries_with_a_new_attempt_then_fails(state: SchedulerState) -> None:
    step(state, ready("J").gpus(8).replicas(2).retries(1).build())
    out = step(state, task_status("J", "worker-0", JobState.FAILED, exit_code=2))
    # the surviving task is stopped; its GPUs stay held until it reports
    assert [(b.action, b.node_id) for b in bindings(out)] == [(BindingAction.STOP, "n2")]
    assert ("J", "admitted") in statuses(out)
    assert state.jobs["J"].attempt == 2
    assert not [b for b in bindings(out) if b.action is BindingAction.ALLOCATE]  # n2 still held
    out = step(state, task_status("J", "worker-1", JobState.CANCELLED, node_id="n2"))
    again = [b for b in bindings(out) if b.action is BindingAction.ALLOCATE]
    assert again and all(b.attempt == 2 for b in again)
    out = step(state, task_status("J", "worker-0", JobState.FAILED, attempt=2, exit_code=1))
    assert ("J", "failed") in statuses(out)


def test_lost_node_requeues_its_jobs(state: SchedulerState) -> None:
    step(state, ready("J").gpus(8).build())
    placed_on = state.jobs["J"].placed[0].node_id
    out = step(state, NodeLost(node_id=placed_on, last_seen=utcnow()))
    assert ("J", "admitted") in statuses(out)
    rebound = [b for b in bindings(out) if b.action is BindingAction.ALLOCATE]
    assert rebound and rebound[0].node_id != placed_on and rebound[0].attempt == 2


def test_persisted_rows_restore_the_same_state(state: SchedulerState) -> None:
    step(state, ready("J").gpus(8).replicas(2).build(), ready("W").gpus(8).build())
    rows = [state.job_row(j) for j in state.jobs]
    import json

    fresh = SchedulerState(epoch=4, placer=first_fit)
    fresh.nodes = state.nodes
    for r in rows:
        fresh.load_job({**r, "ready": json.loads(r["ready"])})
    assert fresh.snapshot(0).allocations == state.snapshot(0).allocations
    out = Output()
    fresh.republish(out)
    assert {b.epoch for b in bindings(out)} == {4}
    placed_on = {(a.job_id, a.node_id) for a in state.snapshot(0).allocations}  # which job goes
    # first depends on the placer's order; one allocate per (job, node) either way
    assert sorted(b.action.value for b in bindings(out)) == ["allocate"] * len(placed_on) + ["fence", "fence"]


def test_urgent_job_preempts_low_priority_work_which_is_requeued() -> None:
    """With the core's default policy the scheduler publishes stops for the victims, the
    agents' reports free the GPUs, the victim goes back to admitted with a new attempt."""
    s = SchedulerState(epoch=1, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    step(s, node("n1"))
    low = ready("LOW").gpus(8).priority_class("low").build()
    step(s, low, task_status("LOW", "worker-0", JobState.RUNNING))
    urgent = ready("URGENT").gpus(8).priority_class("urgent").build()
    out = step(s, urgent)
    stops = bindings(out)
    assert [(b.action, b.job_id) for b in stops] == [(BindingAction.STOP, "LOW")]
    assert stops[0].reason.startswith("preempted") and stops[0].grace_period_s >= 0
    assert s.pending_reasons.get("URGENT") == "preempting"
    out = step(s, task_status("LOW", "worker-0", JobState.PREEMPTED))
    assert ("LOW", "preempted") in statuses(out) and ("LOW", "admitted") in statuses(out)
    assert [(b.job_id, b.action) for b in bindings(out)] == [("URGENT", BindingAction.ALLOCATE)]
    assert s.jobs["LOW"].attempt == 2 and s.jobs["LOW"].state is JobState.ADMITTED


def test_snapshots_reuse_unchanged_objects_for_the_core_caches(state: SchedulerState) -> None:
    """The core keeps its node table while the nodes tuple is the same object and diffs
    allocations by identity: unchanged parts of the cluster must come back identical."""
    step(state, ready("A").gpus(4).build())
    first = state.snapshot(0)
    again = state.snapshot(1)
    assert again.nodes is first.nodes
    assert all(a is b for a, b in zip(first.allocations, again.allocations, strict=True))
    step(state, node("n3"))
    assert state.snapshot(2).nodes is not first.nodes
    step(state, NodeLost(node_id="n3", last_seen=utcnow()))
    lost = state.snapshot(3).nodes
    assert [n.schedulable for n in lost if n.node_id == "n3"] == [False]
