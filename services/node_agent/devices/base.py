"""The interface both device backends (NVML, simulated) implement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    uuid: str
    model: str
    memory_mib: int
    compute_capability: str = ""
    mig_mode: bool = False
    nvlink_peers: tuple[int, ...] = ()
    nvlink_domain: int = 0


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    utilization_pct: float
    memory_used_mib: int
    temperature_c: float
    power_w: float = 0.0
    sm_clock_mhz: int = 0
    ecc_errors: int = 0
    xid_errors: int = 0
    process_memory_mib: dict[int, int] = field(default_factory=dict)  # pid -> MiB

    def degraded(self, max_temp_c: float = 90.0) -> bool:
        return self.ecc_errors > 0 or self.xid_errors > 0 or self.temperature_c > max_temp_c


class DeviceBackend(Protocol):
    def devices(self) -> list[GpuDevice]: ...

    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...
