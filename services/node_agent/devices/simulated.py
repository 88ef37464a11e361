"""Simulated GPUs whose telemetry follows the simulated load placed on them."""

from __future__ import annotations

import hashlib

from services.node_agent.devices.base import GpuDevice, GpuSample


class SimulatedDevices:
    def __init__(self, node_id: str, count: int = 8, model: str = "NVIDIA H100 80GB HBM3",
                 memory_mib: int = 81559) -> None:
        self.node_id = node_id
        self._devices = [
            GpuDevice(
                index=i,
                uuid="GPU-" + hashlib.sha1(f"{node_id}/{i}".encode()).hexdigest()[:32],
                model=model,
                memory_mib=memory_mib,
                compute_capability="9.0",
                nvlink_peers=tuple(j for j in range(count) if j != i and j // 4 == i // 4),
                nvlink_domain=i // 4,
            )
            for i in range(count)
        ]
        # index -> (compute % busy, MiB used) from the tasks placed on it
        self._load: dict[int, tuple[float, int]] = {}

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def set_load(self, index: int, compute_pct: float, memory_mib: int) -> None:
        self._load[index] = (min(compute_pct, 100.0), memory_mib)

    def sample(self) -> list[GpuSample]:
        out = []
        for d in self._devices:
            busy, mem = self._load.get(d.index, (0.0, 0))
            out.append(GpuSample(
                index=d.index,
                utilization_pct=busy,
                memory_used_mib=mem,
                temperature_c=32.0 + 0.4 * busy,
                power_w=70.0 + 6.3 * busy,
                sm_clock_mhz=1980 if busy else 345,
            ))
        return out

    def close(self) -> None:
        return None
