"""The node agent's binding handling: idempotent, fenced, every transition reported."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.node_agent.agent import NodeAgent
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.runtimes.simulated import SimulatedRuntime
from shared.events import (
    Binding,
    BindingAction,
    BindingRefused,
    Event,
    GpuAssignment,
    JobState,
    JobStatus,
    TaskBinding,
)


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, event: Event, event_id: str | None) -> None:
        self.events.append(event)

    def states(self) -> list[tuple[str | None, str]]:
        return [(e.task, e.state.value) for e in self.events if isinstance(e, JobStatus)]


def make_agent(rec: Recorder, state_dir: str = "") -> NodeAgent:
    devices = SimulatedDevices("n1", 8)
    inv = node_inventory("n1", devices, 64_000, 512_000, "r0")
    return NodeAgent(inv, devices, SimulatedRuntime, rec, state_dir)


def binding(epoch: int = 1, action: BindingAction = BindingAction.ALLOCATE,
            duration: float = 0.05, reason: str = "") -> Binding:
    return Binding(binding_id="b1", action=action, node_id="n1", epoch=epoch, job_id="J",
                   duration_s=duration, reason=reason, tasks=[TaskBinding(
                       task_id="w-0", task_name="w", role="worker", replica=0, rank=0,
                       gpus=[GpuAssignment(index=2)])])


async def wait_for(pred: object, timeout: float = 5) -> None:
    async with asyncio.timeout(timeout):
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_binding_runs_and_reports_running_then_succeeded() -> None:
    rec = Recorder()
    agent = make_agent(rec)
    await agent.handle(binding())
    assert agent.telemetry().gpus[2].utilization_pct > 50  # the simulated GPU is busy
    await wait_for(lambda: ("w-0", "succeeded") in rec.states())
    assert rec.states() == [("w-0", "running"), ("w-0", "succeeded")]
    assert agent.telemetry().gpus[2].utilization_pct == 0


async def test_redelivered_binding_starts_nothing_twice() -> None:
    rec = Recorder()
    agent = make_agent(rec)
    await agent.handle(binding(duration=0.2))
    await agent.handle(binding(duration=0.2))  # redelivery while running
    await wait_for(lambda: ("w-0", "succeeded") in rec.states())
    await agent.handle(binding(duration=0.2))  # redelivery after it ended
    await asyncio.sleep(0.3)
    assert rec.states() == [("w-0", "running"), ("w-0", "succeeded")]


async def test_stale_epoch_is_refused_and_reported(tmp_path: Path) -> None:
    rec = Recorder()
    agent = make_agent(rec, str(tmp_path))
    await agent.handle(binding(epoch=5, duration=0.01))
    await wait_for(lambda: ("w-0", "succeeded") in rec.states())
    stale = binding(epoch=4).model_copy(update={"job_id": "OLD", "binding_id": "b-old"})
    await agent.handle(stale)
    refused = [e for e in rec.events if isinstance(e, BindingRefused)]
    assert [(r.job_id, r.epoch, r.current_epoch, r.reason) for r in refused] == [
        ("OLD", 4, 5, "stale_epoch")]
    assert not [e for e in rec.events if isinstance(e, JobStatus) and e.job_id == "OLD"]
    # the highest epoch seen survives an agent restart
    rec2 = Recorder()
    restarted = make_agent(rec2, str(tmp_path))
    await restarted.handle(stale)
    assert [type(e).__name__ for e in rec2.events] == ["BindingRefused"]


async def test_stop_reports_cancelled_or_preempted() -> None:
    rec = Recorder()
    agent = make_agent(rec)
    await agent.handle(binding(duration=30))
    await agent.handle(binding(action=BindingAction.STOP, reason="preempted by urgent job"))
    assert rec.states() == [("w-0", "running"), ("w-0", "preempted")]
    # a stop for a task never started here is still answered, so the scheduler frees it
    other = binding(action=BindingAction.STOP, reason="cancelled").model_copy(
        update={"job_id": "NEVER"})
    await agent.handle(other)
    assert [(e.job_id, e.state) for e in rec.events if isinstance(e, JobStatus)][-1] == (
        "NEVER", JobState.CANCELLED)


async def test_gang_tasks_start_with_the_rendezvous_environment() -> None:
    """The scheduler's binding carries the whole cluster; the agent turns it into the
    variables torchrun and TF_CONFIG readers expect."""
    import json

    from scheduling import first_fit
    from services.scheduler.state import Output, SchedulerState
    from shared.events import JobReady, utcnow
    from shared.jobspec import parse_job_spec
    from tests.services.builders import node

    sched = SchedulerState(epoch=1, placer=first_fit)
    out = Output()
    sched.handle(node("n1", gpus=2), out)
    sched.handle(node("n2", gpus=2), out)
    spec = parse_job_spec({"name": "ps-job", "tasks": [
        {"name": "ps", "role": "ps", "resources": {"gpu": 0}},
        {"name": "worker", "replicas": 3, "resources": {"gpu": 1}}]})
    sched.handle(JobReady(job_id="PS", queue="q", tenant="t", user="u", spec=spec,
                          submitted_at=utcnow(), admitted_at=utcnow()), out)
    sched.cycle(0, out)
    mine = next(e.payload() for e, t in out.events if t == "bindings"
                and e.payload().node_id == "n1"  # type: ignore[attr-defined]
                and e.payload().action is BindingAction.ALLOCATE)  # type: ignore[attr-defined]
    assert isinstance(mine, Binding) and len(mine.cluster) == 4

    launches = []

    class Recording(SimulatedRuntime):
        async def start(self, launch):  # type: ignore[no-untyped-def]
            launches.append(launch)
            await super().start(launch)

    rec = Recorder()
    devices = SimulatedDevices("n1", 2)
    agent = NodeAgent(node_inventory("n1", devices, 64_000, 512_000, "r0"), devices,
                      Recording, rec)
    await agent.handle(mine)
    env = {la.task_id: la.env for la in launches}
    assert env["ps-0"]["RANK"] == "0" and env["ps-0"]["WORLD_SIZE"] == "4"
    assert env["ps-0"]["MASTER_ADDR"] == "n1.local"
    tf = json.loads(env["ps-0"]["TF_CONFIG"])
    assert tf["task"] == {"type": "ps", "index": 0}
    assert len(tf["cluster"]["worker"]) == 3 and len(tf["cluster"]["ps"]) == 1
    assert [env[t]["LOCAL_RANK"] for t in sorted(env)] == [str(i) for i in range(len(env))]
    await agent.close()
