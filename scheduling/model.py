"""The core's data model: cluster, allocations and requests in; a plan out.

Plain slotted dataclasses (no pydantic) because the simulator builds millions of them.
Units: CPU millicores, memory and GPU memory MiB, GPU compute percent, time seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class PendingReason(StrEnum):
    """Why a job was left pending; one vocabulary for events, API and metric labels."""

    NO_FIT = "no_fit"  # no node set can hold the job now
    GANG_INCOMPLETE = "gang_incomplete"  # some but not all of a gang fits: place none
    NEVER_FITS = "never_fits"  # larger than the whole (healthy) cluster
    QUOTA = "quota"
    PRIORITY = "priority"  # capacity is reserved for a higher-priority job
    BACKFILL_BLOCKED = "backfill_blocked"  # would delay the reserved head job
    GPU_MODEL = "gpu_model"  # no GPU of an allowed model is free


@dataclass(slots=True)
class GpuSlot:
    """One physical GPU of a node."""

    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int = 81920
    nvlink_domain: int = 0
    healthy: bool = True


@dataclass(slots=True)
class Node:
    node_id: str
    cpu_milli: int
    memory_mib: int
    gpus: list[GpuSlot] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    rack: str = ""
    schedulable: bool = True  # False when cordoned, lost or draining


@dataclass(frozen=True, slots=True)
class GpuUse:
    """Part of one GPU held by a task: memory MiB (0 = whole) and compute percent."""

    index: int
    memory_mib: int = 0
    compute_pct: int = 100

    @property
    def whole(self) -> bool:
        return self.memory_mib == 0 and self.compute_pct >= 100


@dataclass(frozen=True, slots=True)
class Allocation:
    """A task already placed (bound or running)."""

    job_id: str
    task_id: str
    node_id: str
    gpus: tuple[GpuUse, ...]
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """One replica group of a job: ``replicas`` identical tasks."""

    name: str
    role: str
    replicas: int
    gpu: int = 0  # whole GPUs per replica
    gpu_memory_mib: int = 0  # fractional request on one GPU
    gpu_compute_pct: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def shared(self) -> bool:
        return self.gpu == 0 and (self.gpu_memory_mib > 0 or self.gpu_compute_pct > 0)


@dataclass(frozen=True, slots=True)
class JobRequest:
    job_id: str
    tasks: tuple[TaskRequest, ...]
    queue: str = "default"
    tenant: str = "default"
    priority: int = 0
    submit_time: float = 0.0
    min_available: int | None = None

    @property
    def total_replicas(self) -> int:
        return sum(t.replicas for t in self.tasks)

    @property
    def gang_size(self) -> int:
        return self.min_available or self.total_replicas


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[Node, ...]
    allocations: tuple[Allocation, ...]
    pending: tuple[JobRequest, ...]  # in the order queueing admitted them


@dataclass(frozen=True, slots=True)
class Bind:
    job_id: str
    task_id: str  # "<task name>-<replica>"
    task_name: str
    replica: int
    node_id: str
    gpus: tuple[GpuUse, ...]
    cpu_milli: int
    memory_mib: int


@dataclass(slots=True)
class Plan:
    binds: list[Bind] = field(default_factory=list)
    pending: dict[str, PendingReason] = field(default_factory=dict)

    def binds_by_job(self) -> dict[str, list[Bind]]:
        out: dict[str, list[Bind]] = {}
        for b in self.binds:
            out.setdefault(b.job_id, []).append(b)
        return out
