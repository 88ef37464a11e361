"""Elastic resizes in the scheduler service: the core's Plan.resizes (and a user's resize
command) become ``resize`` bindings per node, a ``resized`` job transition and rows that
survive a restart."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from scheduling import Scheduler, SchedulerConfig
from services.scheduler.state import Output, SchedulerState
from shared.events import (
    Binding,
    BindingAction,
    CommandAction,
    JobCommand,
    JobState,
    JobStatus,
)
from shared.jobspec import parse_job_spec
from tests.services.builders import node, ready
from tests.services.test_scheduler_state import bindings, step, task_status


def new_state(epoch: int = 3) -> SchedulerState:
    s = SchedulerState(epoch=epoch, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    out = Output()
    s.handle(node("n1"), out)
    s.handle(node("n2"), out)
    return s


def job_statuses(out: Output) -> list[JobStatus]:
    return [p for e, t in out.events if t == "jobs.status"
            for p in [e.payload()] if isinstance(p, JobStatus) and p.task is None]


def run_all(s: SchedulerState, job_id: str) -> Output:
    """Every task of the job the agents were told to start reports running."""
    job = s.jobs[job_id]
    return step(s, *(task_status(job_id, p.task_id, JobState.RUNNING, node_id=p.node_id)
                     for p in job.active() if p.state is JobState.BOUND))


def grown(s: SchedulerState) -> tuple[SchedulerState, Output]:
    """E (4 GPUs a replica, 1..4 replicas) starts with one replica, then fills n1 and n2."""
    out = step(s, ready("E").gpus(4).replicas(1).elastic(1, 4).duration(600).build())
    assert [b.action for b in bindings(out)] == [BindingAction.ALLOCATE]
    assert s.needs_cycle  # placement never grows: the next cycle may
    grow = run_all(s, "E")
    return s, grow


def test_an_elastic_job_grows_into_idle_gpus_with_resize_bindings() -> None:
    s, out = grown(new_state())
    bs = bindings(out)
    assert bs and {b.action for b in bs} == {BindingAction.RESIZE}
    assert all(b.epoch == 3 and b.world_size == 4 and not b.stop_task_ids for b in bs)
    new = sorted((t for b in bs for t in b.tasks), key=lambda t: t.rank)
    assert [t.rank for t in new] == [1, 2, 3]
    assert sorted(t.replica for t in new) == [1, 2, 3]
    assert all(len(t.gpus) == 4 and t.gpus[0].uuid.startswith("GPU-") for t in new)
    # a new replica's id is new for this attempt: an earlier incarnation never collides
    assert all(t.task_id.startswith(f"worker-{t.replica}.") for t in new)
    for b in bs:  # the whole membership after the change, for the rendezvous
        assert sorted(m.rank for m in b.cluster) == [0, 1, 2, 3]
        assert b.master_addr == "n1.local" or b.master_addr == "n2.local"
        assert all(t.local_world_size is not None and t.local_rank is not None
                   for t in b.tasks)
    [st] = job_statuses(out)[-1:]
    assert (st.reason, st.state, st.replicas) == ("resized", JobState.RUNNING, {"worker": 4})
    assert st.message == "worker: 1 -> 4 replicas (grow into idle GPUs)"
    # the original replica was not touched: no binding names it
    assert all(t.task_id != "worker-0" for b in bs for t in b.tasks)
    assert step(s).events == []  # at its maximum, nothing more


def test_a_higher_priority_job_shrinks_it_instead_of_preempting_it() -> None:
    s, _ = grown(new_state())
    run_all(s, "E")
    out = step(s, ready("H").gpus(8).priority_class("high").build())
    bs = bindings(out)
    assert {b.action for b in bs} == {BindingAction.RESIZE}  # no stop, no allocate yet
    stopped = sorted(t for b in bs for t in b.stop_task_ids)
    assert len(stopped) == 2 and all(b.grace_period_s == 30 and not b.tasks for b in bs)
    assert all(b.reason == "shrink for H" for b in bs)
    [st] = job_statuses(out)
    assert (st.reason, st.replicas) == ("resized", {"worker": 2})
    job = s.jobs["E"]
    assert job.state is JobState.RUNNING and job.attempt == 1
    kept = {p.task_id for p in job.active()}
    assert len(kept) == 2 and not kept & set(stopped)
    # the stops are confirmed: H starts where they were; E goes on, untouched
    node_of = {p.task_id: p.node_id for p in job.placed}
    out = step(s, *(task_status("E", t, JobState.CANCELLED, node_id=node_of[t])
                    for t in stopped))
    [hb] = bindings(out)
    assert (hb.job_id, hb.action, hb.node_id) == ("H", BindingAction.ALLOCATE,
                                                  node_of[stopped[0]])
    assert [(x.job_id, x.state) for x in job_statuses(out)] == [("H", JobState.BOUND)]
    assert {p.task_id for p in s.jobs["E"].active()} == kept
    assert s.jobs["E"].state is JobState.RUNNING
    # the stopped replicas' reports changed nothing about the job: it ends when the
    # replicas it kept end
    out = step(s, *(task_status("E", t, JobState.SUCCEEDED, node_id=node_of[t])
                    for t in kept))
    assert [(x.job_id, x.state) for x in job_statuses(out)] == [("E", JobState.SUCCEEDED)]


def test_replicas_grown_again_after_a_shrink_get_new_task_ids() -> None:
    s, first = grown(new_state())
    run_all(s, "E")
    step(s, ready("H").gpus(8).priority_class("high").duration(1).build())
    stopped = [p for p in s.jobs["E"].live() if p.removed]
    step(s, *(task_status("E", p.task_id, JobState.CANCELLED, node_id=p.node_id)
              for p in stopped))
    h = s.jobs["H"].current()[0]
    out = step(s, task_status("H", h.task_id, JobState.SUCCEEDED, node_id=h.node_id))
    again = [t for b in bindings(out) if b.action is BindingAction.RESIZE for t in b.tasks]
    assert len(again) == 2
    before = {t.task_id for b in bindings(first) for t in b.tasks}
    assert not {t.task_id for t in again} & before
    assert {t.replica for t in again} == {p.replica for p in stopped}


def test_a_user_resize_shrinks_at_once_and_caps_growth() -> None:
    s, _ = grown(new_state())
    run_all(s, "E")
    out = step(s, JobCommand(job_id="E", action=CommandAction.RESIZE, replicas=2,
                             requested_by="alice"))
    bs = bindings(out)
    stopped = {t for b in bs for t in b.stop_task_ids}
    assert {p.replica for p in s.jobs["E"].placed
            if p.task_id in stopped} == {2, 3}  # the highest replicas go first
    assert bs[0].reason == "resize to 2 requested by alice"
    [st] = job_statuses(out)
    assert st.message == "worker: 4 -> 2 replicas (resize to 2 requested by alice)"
    for p in [p for p in s.jobs["E"].live() if p.removed]:
        out = step(s, task_status("E", p.task_id, JobState.CANCELLED, node_id=p.node_id))
        assert bindings(out) == []  # idle GPUs again, but 2 is what the user wants
    # a replay of the command changes nothing
    assert bindings(step(s, JobCommand(job_id="E", action=CommandAction.RESIZE,
                                       replicas=2))) == []
    # out of range or no elastic group: ignored
    assert step(s, JobCommand(job_id="E", action=CommandAction.RESIZE, replicas=9)).events == []
    # up again: grows into the idle GPUs
    out = step(s, JobCommand(job_id="E", action=CommandAction.RESIZE, replicas=3))
    assert sum(len(b.tasks) for b in bindings(out)) == 1
    assert job_statuses(out)[-1].replicas == {"worker": 3}


def test_a_resize_of_a_job_not_yet_placed_sets_its_starting_size() -> None:
    s = new_state()
    out = step(s, ready("X").gpus(8).replicas(2).build())  # fills both nodes
    assert {b.job_id for b in bindings(out)} == {"X"}
    assert bindings(step(s, ready("E").gpus(4).replicas(1).elastic(1, 4).build())) == []
    step(s, JobCommand(job_id="E", action=CommandAction.RESIZE, replicas=3))
    x = s.jobs["X"].current()
    out = step(s, *(task_status("X", p.task_id, JobState.SUCCEEDED, node_id=p.node_id)
                    for p in x))
    assert sum(len(b.tasks) for b in bindings(out) if b.job_id == "E") == 3
    out = run_all(s, "E")
    assert [b for b in bindings(out) if b.action is BindingAction.RESIZE] == []  # capped at 3


def test_a_finishing_group_does_not_grow_again() -> None:
    s, _ = grown(new_state())
    run_all(s, "E")
    p = s.jobs["E"].active()[-1]
    out = step(s, task_status("E", p.task_id, JobState.SUCCEEDED, node_id=p.node_id))
    assert bindings(out) == []  # its GPUs are idle, but the job is ending


def test_resized_allocations_survive_a_restart_and_are_resent_by_the_next_leader() -> None:
    s, _ = grown(new_state())
    for p in s.jobs["E"].active()[:2]:  # two of the grown replicas never reported running
        step(s, task_status("E", p.task_id, JobState.RUNNING, node_id=p.node_id))
    step(s, JobCommand(job_id="E", action=CommandAction.RESIZE, replicas=3))
    row = json.loads(json.dumps(s.job_row("E")))  # as the jsonb columns read back
    row["ready"] = json.loads(row["ready"])
    nxt = SchedulerState(epoch=4, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    for n in ("n1", "n2"):
        nxt.handle(node(n), Output())
    nxt.load_job(row)
    job = nxt.jobs["E"]
    assert (job.targets, job.resizes) == ({"worker": 3}, 2)
    assert [p.to_json() for p in job.placed] == row["placement"]
    assert len(job.active()) == 3 and sum(p.removed for p in job.placed) == 1
    out = Output()
    nxt.republish(out)
    resent = [b for b in bindings(out) if b.action is BindingAction.RESIZE]
    assert {b.epoch for b in resent} == {4}
    assert sorted(t for b in resent for t in b.stop_task_ids) == [
        p.task_id for p in job.placed if p.removed]
    assert sorted(t.task_id for b in resent for t in b.tasks) == sorted(
        p.task_id for p in job.active() if p.state is JobState.BOUND)
    # the core sees the job as it was: 3 replicas, the removed one apart and terminating
    snap = nxt.snapshot(0.0)
    assert sum(a.job_id == "E" for a in snap.allocations) == 3
    assert [r.terminating for r in snap.running if r.job.job_id.startswith("E~")] == [True]
    assert step(nxt).events == []  # no double growth, no second shrink


def test_a_resize_binding_is_fenced_like_any_other() -> None:
    _, out = grown(new_state(epoch=7))
    assert {b.epoch for b in bindings(out)} == {7}
    b: Binding = bindings(out)[0]
    assert b.binding_id.startswith("E-1-") and "-rz" in b.binding_id


def test_the_job_spec_bounds_an_elastic_group() -> None:
    def spec(**task: object) -> object:
        return parse_job_spec({"name": "e", "tasks": [{"name": "w", **task}]})

    t = spec(replicas=2, minReplicas=1, maxReplicas=8).tasks[0]  # type: ignore[attr-defined]
    assert (t.elastic, t.least_replicas, t.most_replicas) == (True, 1, 8)
    assert not spec(replicas=2).tasks[0].elastic  # type: ignore[attr-defined]
    assert spec(replicas=2, maxReplicas=4).tasks[0].least_replicas == 2  # type: ignore[attr-defined]
    for bad in ({"replicas": 5, "maxReplicas": 4}, {"replicas": 1, "minReplicas": 2},
                {"replicas": 1, "minReplicas": 0}):
        with pytest.raises(ValidationError, match="eplicas"):
            spec(**bad)
