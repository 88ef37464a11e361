"""The share watchdog wired into a running agent.

The agent calls ``started``/``ended`` as its tasks come and go and ``check`` with each
telemetry sample (one NVML read serves both). A task holding GPU shares is watched; one
over its share in ``strikes`` samples in a row is stopped through the agent, which
reports it ``failed`` with the reason ``gpu memory share exceeded: ...``.

On a simulated node the tasks' GPU memory is simulated too: each task appears as a
process of its GPUs (under the runtime's synthetic pid) using ~90 % of its grant, or
``KAIROS_SIM_GPU_MEMORY_MIB`` MiB per GPU where its env sets it (a task that outgrows its
share, for tests and demos), so the same watchdog acts on simulated nodes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from services.node_agent.devices.base import DeviceBackend, GpuSample
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.isolation.watchdog import ShareWatchdog, Violation
from services.node_agent.runtimes.base import TaskLaunch

SIM_MEMORY_ENV = "KAIROS_SIM_GPU_MEMORY_MIB"
SHARE_EXCEEDED = "gpu memory share exceeded"

Stop = Callable[[str, float, str, str], Awaitable[None]]


@dataclass(frozen=True)
class ShareLimits:
    grace_s: float = 10.0  # checkpoint grace of a task stopped over its share
    strikes: int = 2  # consecutive samples over the share before it is stopped
    tolerance_mib: int = 0


class _Stopper:
    """What the watchdog calls ``runtime``: the agent's stop, which records why."""

    def __init__(self, stop: Stop) -> None:
        self.stop_fn = stop

    async def stop(self, key: str, grace_s: float, reason: str = "stopped",
                   message: str = "") -> None:
        await self.stop_fn(key, grace_s, reason, message)


class ShareEnforcement:
    def __init__(self, devices: DeviceBackend, runtime: Any, stop: Stop,
                 limits: ShareLimits | None = None) -> None:
        limits = limits or ShareLimits()
        task_pids = getattr(runtime, "task_pids", None)
        self._devices = devices
        # simulated tasks' memory shows on simulated GPUs; real processes on NVML
        self._simulate = isinstance(devices, SimulatedDevices) and runtime.name == "simulated"
        self._pids: Callable[[str], set[int]] = task_pids or (lambda key: set())
        self._sim_pid: dict[str, int] = {}  # simulated tasks' synthetic pids
        self.watchdog = ShareWatchdog(
            devices, _Stopper(stop), self._pids, grace_s=limits.grace_s,
            strikes=limits.strikes, tolerance_mib=limits.tolerance_mib) if task_pids else None

    def started(self, launch: TaskLaunch, gpu_memory_mib: Callable[[int, int], int]) -> None:
        """``gpu_memory_mib(index, mig_start)``: a GPU's memory, or its MIG instance's."""
        if self.watchdog is not None:
            self.watchdog.watch(launch.key, launch.gpus)
        if self._simulate and launch.gpus:
            assert isinstance(self._devices, SimulatedDevices)
            pid = min(self._pids(launch.key), default=None)
            if pid is None:
                return
            self._sim_pid[launch.key] = pid
            wanted = launch.env.get(SIM_MEMORY_ENV, "")
            for g in launch.gpus:
                use = int(wanted) if wanted.isdigit() else int(
                    0.9 * (g.memory_mib or gpu_memory_mib(g.index, g.mig_start)))
                self._devices.run_process(g.index, pid, use)

    def ended(self, launch: TaskLaunch) -> None:
        if self.watchdog is not None:
            self.watchdog.unwatch(launch.key)
        pid = self._sim_pid.pop(launch.key, None)
        if pid is not None:
            assert isinstance(self._devices, SimulatedDevices)
            self._devices.end_process(pid)

    def check(self, samples: Sequence[GpuSample]) -> list[Violation]:
        if self.watchdog is None or not self.watchdog.watching:
            return []
        return self.watchdog.check(samples)
