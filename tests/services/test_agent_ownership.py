"""A node that comes back after it was declared lost stops the tasks it no longer owns.

The scheduler answers a node that registers, or whose heartbeats resume after a
``node.lost``, with a ``reconcile`` binding listing every task it holds there (fenced by
its epoch); the agent stops any other task it still runs and reports it, and reports
failed a listed task it does not run. Tasks bound after the answer are not touched."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from scheduling import first_fit
from services.scheduler.state import Output, SchedulerState
from shared.events import (
    Binding,
    BindingAction,
    BindingRefused,
    JobState,
    JobStatus,
    NodeHeartbeat,
    NodeLost,
    NodeRegistered,
    utcnow,
)
from tests.node_agent.harness import running_agent
from tests.services.builders import node, ready, step
from tests.services.test_agent_shell import Recorder, binding, make_agent, wait_for


def reconciles(out: Output) -> list[Binding]:
    return [b for e, t in out.events if t == "bindings" for b in [e.payload()]
            if isinstance(b, Binding) and b.action is BindingAction.RECONCILE]


def running(job: str, task: str, node_id: str, attempt: int = 1) -> JobStatus:
    return JobStatus(job_id=job, state=JobState.RUNNING, reason="started", attempt=attempt,
                     task=task, node_id=node_id)


def test_the_scheduler_tells_a_returning_node_what_it_still_owns() -> None:
    s = SchedulerState(epoch=4, placer=first_fit)
    first = step(s, node("n1"), node("n2"))
    assert [(b.node_id, b.owned, b.epoch) for b in reconciles(first)] == [
        ("n1", [], 4), ("n2", [], 4)]  # a registration is answered too
    step(s, ready("A").gpus(8).duration(600).build())  # fills n1
    step(s, ready("B").gpus(8).duration(600).build())  # fills n2
    step(s, running("A", "worker-0", "n1"), running("B", "worker-0", "n2"))
    lost = step(s, NodeLost(node_id="n1", last_seen=utcnow()))
    assert s.jobs["A"].attempt == 2 and not reconciles(lost)
    assert step(s, NodeHeartbeat(node_id="n2")).events == []  # n2 was never lost: no answer
    back = step(s, NodeHeartbeat(node_id="n1"))
    answer = reconciles(back)
    assert [(b.node_id, b.owned, b.epoch) for b in answer] == [("n1", [], 4)]
    assert "back after it was declared lost" in answer[0].reason
    # A's new attempt was placed on n1 in the same flush, after the answer: it is n1's
    placed = [b for e, t in back.events if t == "bindings" for b in [e.payload()]
              if isinstance(b, Binding) and b.action is BindingAction.ALLOCATE]
    assert [(b.job_id, b.attempt, b.node_id) for b in placed] == [("A", 2, "n1")]
    kinds = [e.payload().action for e, t in back.events if t == "bindings"]  # type: ignore[attr-defined]
    assert kinds == [BindingAction.RECONCILE, BindingAction.ALLOCATE]
    # a re-registration lists what the node holds now
    again = reconciles(step(s, node("n1")))
    assert [b.owned for b in again] == [["A/worker-0/2"]]
    assert again[0].binding_id != answer[0].binding_id  # not deduplicated as a replay


async def test_a_listed_task_the_agent_does_not_run_is_reported_failed() -> None:
    rec = Recorder()
    agent = make_agent(rec)
    await agent.handle(binding(epoch=2, duration=600))  # J/w-0/1 runs
    await agent.handle(Binding(binding_id="r1", action=BindingAction.RECONCILE, node_id="n1",
                               epoch=2, job_id="", reason="node registered",
                               owned=["J/w-0/1", "GONE/w-3/2"]))
    assert agent.running("J/w-0/1")  # listed: untouched
    lost = [e for e in rec.events if isinstance(e, JobStatus) and e.job_id == "GONE"]
    assert [(e.task, e.attempt, e.state) for e in lost] == [("w-3", 2, JobState.FAILED)]
    assert lost[0].reason.startswith("lost: not running on this node")
    # a stale scheduler's answer is refused: it stops nothing
    await agent.handle(Binding(binding_id="r0", action=BindingAction.RECONCILE, node_id="n1",
                               epoch=1, job_id="", owned=[]))
    assert agent.running("J/w-0/1")
    assert [(e.binding_id, e.reason) for e in rec.events if isinstance(e, BindingRefused)] == [
        ("r0", "stale_epoch")]
    # the newest answer without it: stopped and reported once, even when redelivered
    stop = Binding(binding_id="r2", action=BindingAction.RECONCILE, node_id="n1", epoch=2,
                   job_id="", reason="node back after it was declared lost",
                   grace_period_s=0, owned=[])
    await agent.handle(stop)
    await wait_for(lambda: not agent.running("J/w-0/1"))
    await agent.handle(stop)
    assert [(e.task, e.state) for e in rec.events
            if isinstance(e, JobStatus) and e.job_id == "J"] == [
        ("w-0", JobState.RUNNING), ("w-0", JobState.CANCELLED)]
    await agent.close()


@pytest.mark.broker
async def test_a_node_back_from_lost_stops_its_stale_task_not_the_new_one(
        broker: str, tmp_path: Path) -> None:
    """Two simulated nodes of one agent service; the scheduler's decisions (the real
    ``SchedulerState``) travel to it over the real broker."""
    async with running_agent(broker, tmp_path, sim_nodes=2) as run:
        n0, n1 = sorted(run.host.agents)
        sched = SchedulerState(epoch=1, placer=first_fit)
        job, late = f"J{uuid.uuid4().hex[:6]}", f"K{uuid.uuid4().hex[:6]}"

        async def publish(out: Output) -> None:
            await run.producer.publish_many(out.events)

        def register(name: str) -> NodeRegistered:
            return NodeRegistered(inventory=run.agent(name).inventory,
                                  agent_started_at=utcnow())

        await publish(step(sched, register(n0), ready(job).gpus(8).duration(600).build()))
        first = await run.feed.wait(job, "running")
        assert (first.node_id, first.attempt) == (n0, 1)
        step(sched, first)

        # n0 goes silent (as far as the monitor can tell): its job is placed again on n1
        await publish(step(sched, register(n1), NodeLost(node_id=n0, last_seen=utcnow())))
        moved = await run.feed.wait(job, "running", attempt=2)
        assert moved.node_id == n1
        step(sched, moved)
        assert run.agent(n0).running(f"{job}/worker-0/1")  # n0 never knew it was lost

        # n0's heartbeats resume; a job submitted then is bound to n0 after the answer
        await publish(step(sched, NodeHeartbeat(node_id=n0),
                           ready(late).gpus(8).duration(600).build()))
        stale = await run.feed.wait(job, "cancelled", task="worker-0")
        assert (stale.node_id, stale.attempt) == (n0, 1)
        assert stale.reason.startswith("no longer owned: node back after it was declared lost")
        started = await run.feed.wait(late, "running")
        assert started.node_id == n0
        assert run.agent(n0).running(f"{late}/worker-0/1")  # bound after: untouched
        assert run.agent(n1).running(f"{job}/worker-0/2")  # the requeued attempt runs on
        assert not run.agent(n0).running(f"{job}/worker-0/1")
        # the scheduler ignores the stale task's report: attempt 2 stays its job
        after = step(sched, stale)
        assert sched.jobs[job].attempt == 2 and not after.events
