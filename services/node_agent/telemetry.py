"""What the node's GPUs report each telemetry interval, and the load the agent's tasks
put on simulated GPUs (real ones report their own)."""

from __future__ import annotations

import asyncio

from scheduling.mig import SLICES, slices_of
from services.node_agent.devices.base import DeviceBackend, GpuSample
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import gpu_memory_mib
from services.node_agent.runtimes.base import TaskLaunch
from shared.events import GpuHealth, GpuTelemetry, NodeInventory, NodeTelemetry


async def sample_gpus(devices: DeviceBackend) -> list[GpuSample]:
    """One sample of every GPU; NVML's calls block, so they run in a thread."""
    return (devices.sample() if isinstance(devices, SimulatedDevices)
            else await asyncio.to_thread(devices.sample))


def node_telemetry(node_id: str, samples: list[GpuSample]) -> NodeTelemetry:
    return NodeTelemetry(node_id=node_id, gpus=[
        GpuTelemetry(index=s.index, utilization_pct=s.utilization_pct,
                     memory_used_mib=s.memory_used_mib, temperature_c=s.temperature_c,
                     power_w=s.power_w,
                     health=GpuHealth.DEGRADED if s.degraded() else GpuHealth.HEALTHY)
        for s in samples])


class GpuLoad:
    """Each GPU's load from the tasks running on it: a share's compute and memory, a MIG
    instance's slices of compute and 90% of its memory, or (a whole GPU) all of its
    compute and 90% of its memory."""

    def __init__(self, inventory: NodeInventory, devices: DeviceBackend) -> None:
        self._inventory = inventory
        self._devices = devices
        self._load: dict[int, tuple[float, int]] = {}  # index -> (compute %, MiB)

    def add(self, launch: TaskLaunch) -> None:
        self._apply(launch, +1)

    def remove(self, launch: TaskLaunch) -> None:
        self._apply(launch, -1)

    def _apply(self, launch: TaskLaunch, sign: int) -> None:
        for g in launch.gpus:
            busy, mem = self._load.get(g.index, (0.0, 0))
            if g.is_mig:
                share = 100 * slices_of(g.mig_profile) / SLICES
                used = int(gpu_memory_mib(self._inventory, g.index, g.mig_start) * 0.9)
            else:
                share = g.compute_pct if g.memory_mib else 100
                used = g.memory_mib or int(self._inventory.gpus[g.index].memory_mib * 0.9)
            busy, mem = max(0.0, busy + sign * share * 0.95), max(0, mem + sign * used)
            self._load[g.index] = (busy, mem)
            if isinstance(self._devices, SimulatedDevices):  # real GPUs report themselves
                self._devices.set_load(g.index, busy, mem)
