"""An agent restarted after kill -9 reattaches to its simulated tasks within the grace.

Each simulated task is a file in the agent's state directory (its binding, wall-clock
start and duration), and so is the lease's last renewal. A restart within the lease
(``fence_after_s``) resumes each task for the time it has left, or reports it
succeeded if its time ran out while the agent was down, once. A restart after it adopts
nothing: the scheduler may have placed the tasks elsewhere, so they are stopped and
reported ``failed`` (fenced), never ``succeeded``; bindings sent while the agent was
down are not started. The first heartbeat of a restart goes out before its
registration.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest

from services.node_agent.agent import NodeAgent
from services.node_agent.lease import Lease, LeaseBook
from shared.bus import Producer
from shared.events import BindingAction, NodeHeartbeat, NodeRegistered
from tests.node_agent.agent_process import agent_process, feed
from tests.node_agent.harness import until
from tests.services.test_agent_fencing import Broker, bind, process_agent, sim_agent


def task_file(state_dir: Path, node: str, key: str) -> dict[str, float]:
    path = state_dir / node / "sim-tasks" / f"{quote(key, safe='')}.json"
    return json.loads(path.read_text())


def lease_stamp(state_dir: Path, node: str) -> float:
    """The last renewal on disk: the agent process's lease book (its node id names it), or
    the node's own file for an agent built in the test with ``Lease(path)``."""
    stamp = LeaseBook(state_dir / f"{node}.leases.json").get(node)
    return stamp if stamp is not None else float((state_dir / node / "lease").read_text())


def restarted(broker: Broker, tmp_path: Path, fence_after_s: float) -> NodeAgent:
    return sim_agent(broker, Lease(fence_after_s, tmp_path / "n1" / "lease"), str(tmp_path))


async def killed(agent: NodeAgent) -> None:
    """What kill -9 leaves of a simulated agent: its files (its timers die with it)."""
    await agent.runtime.close()


async def test_a_restart_within_the_grace_adopts_the_tasks_and_reports_them_once(
        tmp_path: Path) -> None:
    broker = Broker()
    first = restarted(broker, tmp_path, fence_after_s=30)
    await first.handle(bind("T", duration=0.3))  # its time runs out while the agent is down
    await first.handle(bind("U", duration=1.5))  # resumed for what it has left
    await first.handle(bind("L"))
    first.renewed(time.monotonic())
    await killed(first)
    t = task_file(tmp_path, "n1", "T/w-0/1")
    await until(lambda: time.time() > t["started"] + t["duration"])

    again = restarted(broker, tmp_path, fence_after_s=30)
    assert await again.reconcile() == 2  # U and L
    assert broker.states("T") == ["running", "succeeded"]
    assert broker.statuses("T")[1].reason == "completed while the agent was down"
    assert again.running("U/w-0/1") and again.running("L/w-0/1")
    await until(lambda: "succeeded" in broker.states("U"))
    await again.handle(bind("U", duration=1.5))  # redelivered after the restart: not rerun
    await again.handle(bind("T", duration=0.3))
    assert broker.states("U") == ["running", "succeeded"]
    assert broker.states("T") == ["running", "succeeded"]
    await again.handle(bind("L", action=BindingAction.STOP, reason="cancelled"))
    assert broker.states("L") == ["running", "cancelled"]  # adopted: a real stop
    await again.close()


async def test_a_restart_after_the_grace_stops_the_tasks_and_reports_them_fenced(
        tmp_path: Path) -> None:
    broker = Broker()
    first = restarted(broker, tmp_path, fence_after_s=1)
    await first.handle(bind("T", duration=0.2))
    await first.handle(bind("L"))
    first.renewed(time.monotonic())
    await killed(first)
    await until(lambda: time.time() > lease_stamp(tmp_path, "n1") + 1.5)

    again = restarted(broker, tmp_path, fence_after_s=1)
    again.renewed(time.monotonic())  # its first heartbeat went out before the adoption
    assert await again.reconcile() == 0
    await until(lambda: not again.running("L/w-0/1"))
    for job in ("T", "L"):
        assert broker.states(job) == ["running", "failed"]  # never "succeeded"
        assert broker.statuses(job)[1].reason.startswith("fenced: ")
        assert "down longer than its lease" in broker.statuses(job)[1].reason
    # a binding the scheduler sent while the agent was down is not started; a new one is
    await again.handle(bind("D"), sent_at=time.time() - 1)
    await again.handle(bind("N"), sent_at=time.time() + 1)
    assert broker.states("D") == ["failed"] and broker.states("N") == ["running"]
    await again.close()


def sleepers(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", marker]]


async def test_a_local_process_found_after_the_grace_is_killed_not_adopted(
        tmp_path: Path) -> None:
    """The local-process runtime's tasks outlive the agent (their own process groups):
    within the grace they are adopted (test_agent_process_runtime.py); after it, killed."""
    broker = Broker()

    marker = f"600.{uuid.uuid4().int % 10**9:09d}"
    try:
        first = process_agent(broker, tmp_path, fence_after_s=2)
        await first.handle(bind("P", command=["sleep", marker]))
        first.renewed(time.monotonic())
        await first.runtime.close()  # the agent dies; its task keeps running
        await until(lambda: len(sleepers(marker)) == 1)
        await until(lambda: time.time() > lease_stamp(tmp_path, "n1") + 2.5)

        again = process_agent(broker, tmp_path, fence_after_s=2)
        again.renewed(time.monotonic())  # its first heartbeat, before the adoption
        assert await again.reconcile() == 0
        await until(lambda: not sleepers(marker))
        await until(lambda: len(broker.states("P")) == 2)
        assert broker.states("P") == ["running", "failed"]
        assert broker.statuses("P")[1].reason.startswith("fenced: the agent was down longer")
        await again.close()
    finally:  # never leave the task behind, even when a check failed
        for p in sleepers(marker):
            with contextlib.suppress(psutil.Error):
                p.kill()


@pytest.mark.broker
async def test_an_agent_killed_and_restarted_within_the_grace_reattaches(
        broker: str, tmp_path: Path) -> None:
    node, tag = f"r{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:6]
    job, long_ = f"T{tag}", f"L{tag}"
    producer = Producer(broker, "test-scheduler")
    await producer.start()
    try:
        async with feed(broker) as seen:
            async with agent_process(broker, tmp_path, node, fence_after_s=60) as agent:
                await producer.publish(bind(job, duration=3, node=node))
                await producer.publish(bind(long_, node=node))
                for j in (job, long_):
                    await seen.wait(j, "running", timeout=60)
                await agent.kill()
            since = time.time()
            async with agent_process(broker, tmp_path, node, fence_after_s=60):
                done = await seen.wait(job, "succeeded", timeout=60)
                assert done.node_id == node
                await producer.publish(bind(long_, node=node, action=BindingAction.STOP,
                                            reason="cancelled"))
                stopped = await seen.wait(long_, "cancelled", timeout=60)
                assert stopped.reason == "stopped by scheduler"  # it ran: adopted
                assert [s.state.value for s in seen.statuses(job)] == ["running", "succeeded"]
                assert [s.state.value for s in seen.statuses(long_)] == ["running", "cancelled"]
                # the restart said it was alive before anything slow: a heartbeat first
                await until(lambda: len(seen.registrations(node)) >= 2, timeout=60)
                kinds = [type(e) for e in seen.node_events(node, since)]
                assert kinds[0] is NodeHeartbeat and NodeRegistered in kinds
    finally:
        await producer.stop()


@pytest.mark.broker
async def test_an_agent_killed_and_restarted_after_the_grace_reports_its_tasks_fenced(
        broker: str, tmp_path: Path) -> None:
    node, tag = f"r{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:6]
    short, long_ = f"S{tag}", f"L{tag}"
    producer = Producer(broker, "test-scheduler")
    await producer.start()
    try:
        async with feed(broker) as seen:
            async with agent_process(broker, tmp_path, node, fence_after_s=2) as agent:
                await producer.publish(bind(short, duration=1, node=node))
                await producer.publish(bind(long_, node=node))
                for j in (short, long_):
                    await seen.wait(j, "running", timeout=60)
                await agent.kill()
            s = task_file(tmp_path, node, f"{short}/w-0/1")
            await until(lambda: time.time() > lease_stamp(tmp_path, node) + 3
                        and time.time() > s["started"] + s["duration"] + 1)
            async with agent_process(broker, tmp_path, node, fence_after_s=2):
                for j in (short, long_):
                    fenced = await seen.wait(j, "failed", timeout=60)
                    assert fenced.reason.startswith("fenced: ")
                    assert "down longer than its lease" in fenced.reason
                await until(lambda: len(seen.registrations(node)) >= 2, timeout=60)
                after = f"A{tag}"  # a new binding runs: the agent is not stuck fenced
                await producer.publish(bind(after, node=node))
                await seen.wait(after, "running", timeout=60)
                for j in (short, long_):
                    assert [st.state.value for st in seen.statuses(j)] == ["running", "failed"]
    finally:
        await producer.stop()
