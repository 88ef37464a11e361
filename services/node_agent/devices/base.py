"""The interface both device backends (NVML, simulated) implement.

Standard library only, and importable on Python 3.8+: ``devices/nvml.py`` imports this
module and runs as a probe on GPU hosts whose Python is not the project's: annotations
are never evaluated (``from __future__ import annotations``), so the 3.10+ syntax in them
is safe; keep runtime code free of 3.9+ features (no ``slots=True``, no ``match``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# XID codes that an application causes (bad kernel, MMU fault from user code, ...);
# the NVIDIA device plugin skips the same ones when it marks a GPU unhealthy.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class MigDevice:
    """One MIG (GPU) instance configured on a GPU: its profile, its placement in memory
    slices (NVML's ``nvmlGpuInstanceGetInfo``) and the UUID CUDA selects it by."""

    profile: str  # "1g.10gb"
    start: int  # first memory slice
    size: int  # memory slices spanned
    uuid: str  # "MIG-..."


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    model: str
    memory_mib: int
    compute_capability: str = ""
    mig_mode: bool = False
    nvlink_peers: tuple[int, ...] = ()
    nvlink_domain: int = 0
    pci_bus_id: str = ""
    numa_node: int | None = None
    mig_instances: tuple[MigDevice, ...] = ()  # in MIG mode only, by start

    def mig_instance(self, start: int) -> MigDevice | None:
        """The MIG instance whose placement begins at memory slice ``start``."""
        return next((m for m in self.mig_instances if m.start == start), None)


@dataclass(frozen=True)
class NodeFacts:
    """What the node's driver says of it as a whole ("" where it cannot tell)."""

    driver_version: str = ""  # "550.54.15"
    cuda_version: str = ""  # the newest CUDA the driver supports, "12.4"
    # the NVLink domain joining this node's GPUs to other nodes' (GB200 NVL72: the
    # GPU fabric's cluster UUID and clique); not GpuDevice.nvlink_domain, within a node
    fabric_domain: str = ""


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization_pct: float
    memory_used_mib: int
    temperature_c: float
    power_w: float = 0.0
    sm_clock_mhz: int = 0
    ecc_errors: int = 0  # volatile uncorrected ECC errors since the driver loaded
    xid_errors: int = 0  # critical (non-application) XID events seen by this agent
    process_memory_mib: dict[int, int] = field(default_factory=dict)  # pid -> MiB
    memory_utilization_pct: float = 0.0
    mem_clock_mhz: int = 0
    last_xid: int = 0

    def health_reasons(self, max_temp_c: float = 90.0) -> list[str]:
        reasons = []
        if self.ecc_errors > 0:
            reasons.append(f"{self.ecc_errors} uncorrected ECC errors")
        if self.xid_errors > 0:
            reasons.append(f"{self.xid_errors} XID errors (last {self.last_xid})")
        if self.temperature_c > max_temp_c:
            reasons.append(f"temperature {self.temperature_c:.0f}C > {max_temp_c:.0f}C")
        return reasons

    def degraded(self, max_temp_c: float = 90.0) -> bool:
        return bool(self.health_reasons(max_temp_c))


class DeviceBackend(Protocol):
    def devices(self) -> list[GpuDevice]: ...

    def node_facts(self) -> NodeFacts: ...

    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...
