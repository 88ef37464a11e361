"""Degraded GPU telemetry stops placement on that GPU.

The chain end to end in one process: the agent's NVML backend reads a node whose GPUs
report uncorrected ECC errors, a critical XID and an over-temperature (the fake NVML of
``tests/fakes/fake_nvml.py``, which implements the real pynvml contract: no GPU here),
the agent's telemetry marks them degraded, and the scheduler's ``SchedulerState`` fed
that ``NodeTelemetry`` places the next jobs only on the healthy GPU, and again on a GPU
once it recovers."""

from __future__ import annotations

from scheduling import Scheduler, SchedulerConfig
from services.node_agent.agent import NodeAgent
from services.node_agent.devices.nvml import NvmlDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.runtimes.simulated import SimulatedRuntime
from services.scheduler.state import Output, SchedulerState
from shared.events import Binding, BindingAction, Event, GpuHealth, NodeRegistered, utcnow
from tests.fakes.fake_nvml import FakeNvml, h100_hgx
from tests.services.builders import ready, step


async def _nothing(event: Event, event_id: str | None) -> None:
    return None


def placed(out: Output) -> dict[str, list[int]]:
    """job -> GPU indices of its allocate bindings in this output."""
    found: dict[str, list[int]] = {}
    for env, topic in out.events:
        b = env.payload()
        if topic == "bindings" and isinstance(b, Binding) and b.action is BindingAction.ALLOCATE:
            found.setdefault(b.job_id, []).extend(g.index for t in b.tasks for g in t.gpus)
    return found


async def test_a_degraded_gpu_is_avoided_until_it_recovers() -> None:
    nvml = FakeNvml(h100_hgx(4))
    devices = NvmlDevices(nvml)
    agent = NodeAgent(node_inventory("gpu-1", devices, 64_000, 512_000, "r0",
                                     runtime="process"),
                      devices, SimulatedRuntime, _nothing)
    s = SchedulerState(epoch=1, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    step(s, NodeRegistered(inventory=agent.inventory, agent_started_at=utcnow()))
    healthy = await agent.tick()
    assert {g.health for g in healthy.gpus} == {GpuHealth.HEALTHY}

    nvml.gpus[0].xid(13)  # an application's fault (illegal address): not the GPU's
    nvml.gpus[1].ecc_uncorrected = 2  # volatile uncorrected ECC errors
    nvml.gpus[2].xid(79)  # fallen off the bus
    nvml.gpus[3].temperature = 95  # over 90 C
    telemetry = await agent.tick()
    assert [g.health for g in telemetry.gpus] == [
        GpuHealth.HEALTHY, GpuHealth.DEGRADED, GpuHealth.DEGRADED, GpuHealth.DEGRADED]

    out = step(s, telemetry, ready("A").gpus(1).duration(600).build())
    assert placed(out) == {"A": [0]}  # the only healthy GPU
    out = step(s, ready("B").gpus(1).duration(600).build(),
               ready("C").gpus(2).duration(600).build())
    assert placed(out) == {}  # three idle GPUs, none of them healthy: nothing placed
    assert {s.jobs[j].state.value for j in "BC"} == {"admitted"}  # waiting, not bound

    nvml.gpus[3].temperature = 64  # cooled down: healthy again at the next sample
    out = step(s, await agent.tick())
    assert placed(out) == {"B": [3]}  # C needs two healthy GPUs: still waits
    await agent.close()
    devices.close()
