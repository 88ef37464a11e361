"""The node agent's self-fencing lease (services/node_agent/lease.py).

Every heartbeat the broker acknowledges renews the lease. Unrenewed for
``fence_after_s`` (the broker unreachable, the agent paused), the agent fences itself
before the monitor can declare the node lost: it stops every task, starts none, and
reports them ``failed`` with a ``fenced:`` reason, never ``succeeded``, once the broker
takes reports again; then it registers again. After a pause the gap is noticed first,
before an exit or a binding that piled up during it is reported or carried out.

The lease's clock is injected where the pause is simulated (a jump of the monotonic
clock); one test pauses a real agent process with SIGSTOP.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiokafka.errors import KafkaConnectionError

from services.node_agent.agent import NodeAgent
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.lease import Lease, LeaseBook
from services.node_agent.runtimes.simulated import SimulatedRuntime
from shared.bus import Producer
from shared.events import (
    Binding,
    BindingAction,
    Event,
    JobState,
    JobStatus,
    NodeRegistered,
    TaskBinding,
)
from tests.node_agent.agent_process import agent_process, feed
from tests.node_agent.harness import running_agent, until


class Clock:
    """The lease's monotonic clock, moved by hand: a pause is a jump."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Broker:
    """The agent's publish function: keeps what the broker took; raises while away."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.down = False

    async def __call__(self, event: Event, event_id: str | None) -> None:
        if self.down:
            raise KafkaConnectionError("broker unreachable")
        self.events.append(event)

    def statuses(self, job: str) -> list[JobStatus]:
        return [e for e in self.events if isinstance(e, JobStatus) and e.job_id == job]

    def states(self, job: str) -> list[str]:
        return [s.state.value for s in self.statuses(job)]


def bind(job: str, duration: float = 600, node: str = "n1",
         action: BindingAction = BindingAction.ALLOCATE, reason: str = "",
         command: list[str] | None = None) -> Binding:
    return Binding(binding_id=f"{job}-{action.value}", action=action, node_id=node, epoch=1,
                   job_id=job, duration_s=duration, grace_period_s=1, reason=reason,
                   tasks=[TaskBinding(task_id="w-0", task_name="w", role="worker", replica=0,
                                      rank=0, command=command or [])])


def process_agent(publish: Callable[[Event, str | None], Awaitable[None]], state_dir: Path,
                  fence_after_s: float) -> NodeAgent:
    """An agent of the local-process runtime on node n1: its tasks are real process groups
    that outlive it (``runtime.close()`` is what kill -9 leaves of it)."""
    from services.node_agent.runtimes.local_process import LocalProcessRuntime

    devices = SimulatedDevices("n1", 2)
    return NodeAgent(
        node_inventory("n1", devices, 8000, 16384, "r0", runtime="process"), devices,
        lambda on_exit: LocalProcessRuntime(on_exit, state_dir / "n1", poll_s=0.05),
        publish, str(state_dir), lease=Lease(fence_after_s, state_dir / "n1" / "lease"))


def sim_agent(publish: Callable[[Event, str | None], Awaitable[None]], lease: Lease,
              state_dir: str = "") -> NodeAgent:
    devices = SimulatedDevices("n1", 8)
    return NodeAgent(node_inventory("n1", devices, 64_000, 512_000, "r0"), devices,
                     lambda on_exit: SimulatedRuntime(
                         on_exit, Path(state_dir, "n1") if state_dir else None),
                     publish, state_dir, lease=lease)


async def test_an_unrenewed_lease_fences_stops_every_task_and_starts_none() -> None:
    clock, broker = Clock(), Broker()
    agent = sim_agent(broker, Lease(2, clock=clock))
    await agent.handle(bind("L"))
    assert agent.running("L/w-0/1") and agent.check_lease()

    clock.now += 2.5  # no heartbeat acknowledged for longer than the lease
    assert not agent.check_lease()
    assert agent.fenced is not None and agent.fenced.startswith("lease not renewed for 2.5s")
    await until(lambda: not agent.running("L/w-0/1"))
    await agent.handle(bind("N"))  # a binding while fenced: refused, not started
    assert not agent.running("N/w-0/1")
    assert broker.states("L") == ["running"]  # nothing is published with a dead lease
    assert len(agent.outbox) == 2

    clock.now += 0.1
    agent.renewed(clock.now)  # the broker acknowledges a heartbeat again
    assert agent.fenced is None and agent.needs_register
    await until(lambda: not agent.outbox)
    (stopped,) = broker.statuses("L")[1:]
    assert (stopped.state, stopped.exit_code) == (JobState.FAILED, 137)
    assert stopped.reason.startswith("fenced: lease not renewed")
    (refused,) = broker.statuses("N")
    assert refused.state is JobState.FAILED and refused.reason.startswith("fenced: not started")
    await agent.handle(bind("N"))  # redelivered once the fence is lifted: still not run
    assert not agent.running("N/w-0/1") and broker.states("N") == ["failed"]
    await agent.close()


async def test_a_task_that_ended_during_a_pause_is_reported_fenced_not_succeeded() -> None:
    clock, broker = Clock(), Broker()
    agent = sim_agent(broker, Lease(2, clock=clock))
    await agent.handle(bind("S", duration=0.2))
    await agent.handle(bind("L"))
    clock.now += 30  # SIGSTOP for 30 s: nothing ran meanwhile, the clock jumped
    # the first thing to run after the pause is S's end: its exit callback notices
    await until(lambda: not agent.running("S/w-0/1") and not agent.running("L/w-0/1"))
    assert agent.fenced is not None
    await agent.handle(bind("P"))  # a binding that piled up during the pause
    assert not agent.running("P/w-0/1")
    agent.renewed(clock.now)
    await until(lambda: not agent.outbox)
    assert broker.states("S") == ["running", "failed"]  # never "succeeded"
    assert broker.statuses("S")[1].reason.startswith("fenced: lease not renewed for 30.0s")
    assert broker.states("L") == ["running", "failed"]
    assert broker.states("P") == ["failed"]
    # a binding sent before the fence was lifted (delivered late) is not started either;
    # one sent afterwards is
    await agent.handle(bind("Q"), sent_at=time.time() - 60)
    await agent.handle(bind("R"), sent_at=time.time() + 1)
    assert broker.states("Q") == ["failed"] and broker.states("R") == ["running"]
    await agent.close()


async def test_a_heartbeat_acknowledged_after_a_pause_does_not_hide_the_gap() -> None:
    """The lease is renewed as of a heartbeat's sending, not its acknowledgement."""
    clock, broker = Clock(), Broker()
    agent = sim_agent(broker, Lease(2, clock=clock))
    await agent.handle(bind("L"))
    sent = clock.now  # a heartbeat goes out, then the process is paused
    clock.now += 30
    agent.renewed(sent)  # its acknowledgement is the first thing handled after the pause
    assert agent.fenced is not None
    await until(lambda: not agent.running("L/w-0/1"))
    agent.renewed(clock.now)  # a heartbeat sent after the pause lifts the fence
    assert agent.fenced is None and agent.needs_register
    await until(lambda: broker.states("L") == ["running", "failed"])
    await agent.close()


async def test_reports_the_broker_did_not_take_are_published_later_in_order(
        tmp_path: Path) -> None:
    clock, broker = Clock(), Broker()
    agent = sim_agent(broker, Lease(2, clock=clock), str(tmp_path))
    await agent.handle(bind("S", duration=0.05))
    await agent.handle(bind("T", duration=0.3))
    broker.down = True  # the lease is still live: only the reports cannot go out
    await until(lambda: not agent.running("S/w-0/1") and not agent.running("T/w-0/1"))
    assert agent.fenced is None and len(agent.outbox) == 2
    broker.down = False
    # the agent dies before its next heartbeat; the next run publishes what was pending
    await agent.close()
    again = sim_agent(broker, Lease(2, clock=clock), str(tmp_path))
    assert len(again.outbox) == 2
    again.renewed(clock.now)
    await until(lambda: not again.outbox)
    assert [(e.job_id, e.state.value) for e in broker.events if isinstance(e, JobStatus)] == [
        ("S", "running"), ("T", "running"), ("S", "succeeded"), ("T", "succeeded")]
    assert not list((tmp_path / "n1" / "outbox").glob("*.json"))
    await again.close()


@pytest.mark.broker
async def test_an_agent_whose_heartbeats_fail_fences_then_recovers_and_registers(
        broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real agent service; a partition is its producer raising (the bindings still
    arrive, as in a one-way partition)."""
    async with running_agent(broker, tmp_path, fence_after_s=2) as run:
        agent, producer = run.agent(), run.host.rt.producer
        node = agent.node_id
        tag = uuid.uuid4().hex[:6]
        short, long_, late = f"S{tag}", f"L{tag}", f"N{tag}"
        for job in (short, long_):
            await run.send(bind(job, node=node))
            await run.feed.wait(job, "running")

        down: set[str] = set()
        registered: list[NodeRegistered] = []
        publish, publish_many = producer.publish, producer.publish_many

        async def reports(event: Event, event_id: str | None = None) -> Any:
            if "reports" in down:
                raise KafkaConnectionError("partitioned")
            return await publish(event, event_id=event_id)

        async def batches(items: Any) -> None:  # heartbeats, registrations
            if "heartbeats" in down:
                raise KafkaConnectionError("partitioned")
            await publish_many(items)
            registered.extend(e for env, _ in items if isinstance(e := env.payload(),
                                                                  NodeRegistered))

        monkeypatch.setattr(producer, "publish", reports)
        monkeypatch.setattr(producer, "publish_many", batches)
        down.add("reports")  # first only the reports fail: the lease lives on
        await run.send(bind(short, node=node, action=BindingAction.STOP, reason="cancelled"))
        await until(lambda: len(agent.outbox) == 1)
        assert agent.fenced is None and agent.running(f"{long_}/w-0/1")

        down.add("heartbeats")  # now nothing goes out: the lease runs out
        await until(lambda: agent.fenced is not None)
        await until(lambda: not agent.running(f"{long_}/w-0/1"))
        await run.send(bind(late, node=node))
        await until(lambda: len(agent.outbox) == 3)  # cancelled, fenced, refused
        assert not agent.running(f"{late}/w-0/1")

        down.clear()
        cancelled = await run.feed.wait(short, "cancelled")  # it ended before the fence
        assert cancelled.reason == "stopped by scheduler"
        fenced = await run.feed.wait(long_, "failed")
        assert fenced.reason.startswith("fenced: lease not renewed") and fenced.node_id == node
        refused = await run.feed.wait(late, "failed")
        assert refused.reason.startswith("fenced: not started")
        await until(lambda: any(r.inventory.node_id == node for r in registered))
        assert agent.fenced is None
        assert [s.state.value for s in run.feed.statuses(short)] == ["running", "cancelled"]
        assert [s.state.value for s in run.feed.statuses(long_)] == ["running", "failed"]
        assert [s.state.value for s in run.feed.statuses(late)] == ["failed"]


def _task_file(state_dir: Path, node: str, key: str) -> Path:
    return state_dir / node / "sim-tasks" / f"{quote(key, safe='')}.json"


@pytest.mark.broker
async def test_a_paused_agent_process_fences_before_it_reports_or_binds(
        broker: str, tmp_path: Path) -> None:
    """SIGSTOP past the lease and past a task's end, then SIGCONT."""
    node, tag = f"p{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:6]
    short, long_, piled = f"S{tag}", f"L{tag}", f"P{tag}"
    producer = Producer(broker, "test-scheduler")
    await producer.start()
    try:
        async with feed(broker) as seen, agent_process(broker, tmp_path, node,
                                                       fence_after_s=2) as agent:
            await producer.publish(bind(short, duration=1, node=node))
            await producer.publish(bind(long_, node=node))
            for job in (short, long_):
                await seen.wait(job, "running", timeout=60)
            agent.pause()
            await producer.publish(bind(piled, node=node))  # piles up during the pause
            book = tmp_path / f"{node}.leases.json"  # the process's lease stamps
            task = json.loads(_task_file(tmp_path, node, f"{short}/w-0/1").read_text())
            # paused until the lease has run out (its own record) and the short task's
            # time is up
            await until(lambda: time.time() > (LeaseBook(book).get(node) or 0) + 3
                        and time.time() > task["started"] + task["duration"] + 1)
            agent.resume()

            ended = await seen.wait(short, "failed", timeout=60)
            assert ended.reason.startswith("fenced: lease not renewed")
            stopped = await seen.wait(long_, "failed", timeout=60)
            assert stopped.reason.startswith("fenced: lease not renewed")
            refused = await seen.wait(piled, "failed", timeout=60)
            assert refused.reason.startswith("fenced: not started")
            # the fence lifted: it registered again, and takes new bindings
            await until(lambda: len(seen.registrations(node)) >= 2, timeout=60)
            after = f"A{tag}"
            await producer.publish(bind(after, node=node))
            await seen.wait(after, "running", timeout=60)
            assert [s.state.value for s in seen.statuses(short)] == ["running", "failed"]
            assert [s.state.value for s in seen.statuses(long_)] == ["running", "failed"]
            assert [s.state.value for s in seen.statuses(piled)] == ["failed"]
    finally:
        await producer.stop()
