"""The agent shell with the local-process runtime: real processes, exit codes reported,
and an agent restart that adopts the running task, starting nothing twice."""

from __future__ import annotations

import asyncio
import gc
import uuid
from pathlib import Path

import psutil

from services.node_agent.agent import NodeAgent
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.runtimes.base import ExitCallback, Runtime
from services.node_agent.runtimes.local_process import LocalProcessRuntime
from shared.events import Binding, BindingAction, JobStatus, TaskBinding
from tests.services.test_agent_shell import Recorder, wait_for


def agent(state: Path, rec: Recorder) -> NodeAgent:
    devices = SimulatedDevices("n1", 2)

    def runtime(on_exit: ExitCallback) -> Runtime:
        return LocalProcessRuntime(on_exit, state, poll_s=0.05)

    return NodeAgent(node_inventory("n1", devices, 8000, 16384, "r0", runtime="process"),
                     devices, runtime, rec, str(state))


def binding(job: str, command: list[str], action: BindingAction = BindingAction.ALLOCATE
            ) -> Binding:
    return Binding(binding_id=f"b-{job}", action=action, node_id="n1", epoch=1, job_id=job,
                   grace_period_s=1, tasks=[TaskBinding(task_id="w-0", task_name="w",
                                                        role="worker", replica=0, rank=0,
                                                        command=command)])


def states(rec: Recorder, job: str) -> list[tuple[str, int | None]]:
    return [(e.state.value, e.exit_code) for e in rec.events
            if isinstance(e, JobStatus) and e.job_id == job]


async def test_exit_codes_become_succeeded_and_failed(tmp_path: Path) -> None:
    rec = Recorder()
    a = agent(tmp_path, rec)
    await a.handle(binding("OK", ["sh", "-c", "echo $RANK/$WORLD_SIZE"]))
    await a.handle(binding("BAD", ["sh", "-c", "exit 3"]))
    await a.handle(binding("NONE", ["no-such-command-xyz"]))
    await wait_for(lambda: len(states(rec, "OK")) == 2 and len(states(rec, "BAD")) == 2)
    assert states(rec, "OK") == [("running", None), ("succeeded", 0)]
    assert states(rec, "BAD") == [("running", None), ("failed", 3)]
    assert states(rec, "NONE") == [("failed", 127)]
    assert a.runtime.logs("OK/w-0/1").strip() == "0/1"  # type: ignore[attr-defined]
    await a.close()


LONG = ["sleep", f"30.{uuid.uuid4().int % 10**9:09d}"]  # this test's task and no other


def sleepers() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == LONG]


async def test_restart_adopts_the_running_task_and_starts_nothing_twice(tmp_path: Path) -> None:
    rec = Recorder()
    first = agent(tmp_path, rec)
    await first.handle(binding("LONG", LONG))
    assert states(rec, "LONG") == [("running", None)]
    # the wrapper shell forks the command a moment after start() returns (later still
    # on a busy machine): wait for it, so the count below is not a race
    await wait_for(lambda: len(sleepers()) == 1, timeout=30)
    task = sleepers()
    del first  # the agent dies; its task keeps running
    gc.collect()  # and whatever it held is finalised (its subprocess transports too)

    rec2 = Recorder()
    second = agent(tmp_path, rec2)
    try:
        await _restart_checks(second, rec2, task)
    finally:  # never leave a task behind, even when a check fails
        for key in await second.runtime.running():
            await second.runtime.stop(key, 0)
        await second.close()


async def _restart_checks(second: NodeAgent, rec2: Recorder, task: list[int]) -> None:
    assert await second.reconcile() == 1
    await second.handle(binding("LONG", LONG))  # the binding is redelivered
    await asyncio.sleep(0.5)  # time for a second copy to show, were one started
    assert sleepers() == task  # adopted, not started again
    await second.handle(binding("LONG", [], BindingAction.STOP))
    await wait_for(lambda: ("cancelled", 143) in states(rec2, "LONG")
                   or any(s == "cancelled" for s, _ in states(rec2, "LONG")))
    assert [s for s, _ in states(rec2, "LONG")].count("cancelled") == 1
    assert await second.runtime.running() == []
