"""Share watchdog: stops a task whose processes use more GPU memory than it was granted.

Every ``interval_s`` it samples per-process GPU memory (NVML, ``GpuSample.
process_memory_mib``), sums it over each watched task's processes per GPU, and stops a
task that is over its share (plus ``tolerance_mib``) in ``strikes`` consecutive samples,
or that uses a GPU it was not granted. The stop goes through the runtime with reason
``share_exceeded`` and a message naming the GPU and the figures, so the agent reports
why. This is the enforcement where MPS (which refuses allocations past
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` itself) is unavailable, and a backstop where it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.node_agent.devices.base import DeviceBackend, GpuSample
from services.node_agent.runtimes.base import GpuGrant

log = logging.getLogger(__name__)

REASON = "share_exceeded"


@dataclass(frozen=True)
class Violation:
    key: str
    message: str


class ShareWatchdog:
    def __init__(self, devices: DeviceBackend, runtime: object,
                 task_pids: Callable[[str], set[int]], *, grace_s: float = 10.0,
                 strikes: int = 2, tolerance_mib: int = 0, interval_s: float = 5.0) -> None:
        self._devices = devices
        self._runtime = runtime  # a Runtime whose stop() takes reason= and message=
        self._task_pids = task_pids
        self._grace_s = grace_s
        self._strikes_needed = max(1, strikes)
        self._tolerance = tolerance_mib
        self._interval_s = interval_s
        self._grants: dict[str, tuple[GpuGrant, ...]] = {}
        self._strikes: dict[str, int] = {}
        self._stopping: set[asyncio.Future[None]] = set()

    def watch(self, key: str, grants: Sequence[GpuGrant]) -> None:
        """Watch a task holding GPU shares (whole GPUs and MIG instances need none)."""
        if any(g.memory_mib > 0 and not g.is_mig for g in grants):
            self._grants[key] = tuple(grants)

    def unwatch(self, key: str) -> None:
        self._grants.pop(key, None)
        self._strikes.pop(key, None)

    def _violation(self, key: str, usage: dict[int, int]) -> str | None:
        # a MIG instance's memory is bounded by the hardware: no limit of ours on it
        limits = {g.index: 0 if g.is_mig else g.memory_mib for g in self._grants[key]}
        for index, used in sorted(usage.items()):
            if index not in limits:
                return f"GPU {index} used {used} MiB but was not granted to it"
            limit = limits[index]
            if limit and used > limit + self._tolerance:
                return f"GPU {index} used {used} MiB of its {limit} MiB share"
        return None

    @property
    def watching(self) -> bool:
        return bool(self._grants)

    async def check_once(self) -> list[Violation]:
        """One sample; stops the tasks over their share (waiting for them) and says why."""
        if not self._grants:
            return []
        found = self.check(await asyncio.to_thread(self._devices.sample))
        await asyncio.gather(*self._stopping)
        return found

    def check(self, samples: Sequence[GpuSample]) -> list[Violation]:
        """Judge one sample (the agent passes its telemetry sample); the tasks over their
        share are stopped in the background (a stop waits out the grace period)."""
        found = []
        for key in list(self._grants):
            pids = self._task_pids(key)
            usage: dict[int, int] = {}
            for s in samples:
                used = sum(mib for pid, mib in s.process_memory_mib.items() if pid in pids)
                if used:
                    usage[s.index] = used
            message = self._violation(key, usage)
            if message is None:
                self._strikes.pop(key, None)
                continue
            self._strikes[key] = self._strikes.get(key, 0) + 1
            if self._strikes[key] >= self._strikes_needed:
                found.append(Violation(key, message))
        for v in found:
            log.warning("stopping %s: %s", v.key, v.message)
            self.unwatch(v.key)
            stop = asyncio.ensure_future(self._runtime.stop(  # type: ignore[attr-defined]
                v.key, self._grace_s, reason=REASON, message=v.message))
            self._stopping.add(stop)
            stop.add_done_callback(self._stopped)
        return found

    def _stopped(self, task: asyncio.Future[None]) -> None:
        self._stopping.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("stopping a task over its share failed: %r", task.exception())

    async def run(self) -> None:
        """Check every ``interval_s`` until cancelled."""
        while True:
            try:
                await self.check_once()
            except Exception:
                log.exception("share watchdog check failed")
            await asyncio.sleep(self._interval_s)
