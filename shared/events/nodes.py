"""Node events, keyed by node: registration, heartbeats and loss (``nodes.lifecycle``),
operators' cordon / drain and the scheduler's answer, and GPU telemetry
(``nodes.telemetry``)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from shared.events.base import Event


class MigInstanceInfo(BaseModel):
    """One MIG instance configured on a GPU (scheduling/mig.py): NVML's placement."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    profile: str = Field(description="1g.10gb")
    start: int = Field(ge=0, le=7, description="first memory slice of its placement")
    size: int = Field(ge=1, le=8, description="memory slices it spans")
    uuid: str = Field("", description="the MIG device's UUID, MIG-...")


class GpuInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    index: int
    uuid: str
    model: str
    memory_mib: int
    nvlink_domain: int = 0
    nvlink_peers: list[int] = Field(default_factory=list)
    mig_mode: bool = False
    mig_instances: list[MigInstanceInfo] = Field(
        default_factory=list, description="MIG instances configured (mig_mode only)")


class NodeInventory(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    node_id: str
    hostname: str = ""
    address: str = ""
    cpu_milli: int
    memory_mib: int
    gpus: list[GpuInfo] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    # "key=value:Effect" (shared/node_constraints.py): jobs must tolerate the hard ones
    taints: list[str] = Field(default_factory=list)
    rack: str = ""
    runtime: str = "simulated"
    agent_url: str = Field(default="", description="the agent's HTTP base URL (task logs)")
    datasets: list[str] = Field(
        default_factory=list, description="datasets the node's local cache holds (locality)")


class NodeRegistered(Event):
    TYPE: ClassVar[str] = "node.registered"
    inventory: NodeInventory
    agent_started_at: datetime

    def key(self) -> str:
        return self.inventory.node_id


class NodeHeartbeat(Event):
    TYPE: ClassVar[str] = "node.heartbeat"
    node_id: str
    running_tasks: int = 0
    max_epoch_seen: int = 0
    datasets: list[str] | None = Field(
        default=None, description="the local dataset cache now; None = not reported")

    def key(self) -> str:
        return self.node_id


class NodeLost(Event):
    TYPE: ClassVar[str] = "node.lost"
    node_id: str
    last_seen: datetime
    reason: str = "missed heartbeats"

    def key(self) -> str:
        return self.node_id


class NodeAction(StrEnum):
    CORDON = "cordon"
    DRAIN = "drain"
    UNCORDON = "uncordon"


class NodeCommand(Event):
    """An operator's cordon / drain / uncordon of a node (admission, through its outbox).
    ``generation`` rises with every command for the node, so a replay is ignored."""

    TYPE: ClassVar[str] = "node.command"
    node_id: str
    action: NodeAction
    generation: int = 0
    reason: str = ""
    requested_by: str = ""
    grace_period_s: float = Field(default=30.0, ge=0, description="drain: checkpoint grace")

    def key(self) -> str:
        return self.node_id


class NodeLabels(Event):
    """An admin's labels and taints for a node (admission, through its outbox): the whole
    set, beside what its agent reports; ``generation`` rises with every change for the
    node, so a replay or a late older change is ignored. Kept by the scheduler across
    restarts and re-registrations."""

    TYPE: ClassVar[str] = "node.labels"
    node_id: str
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[str] = Field(default_factory=list, description="key=value:Effect")
    generation: int = 0
    requested_by: str = ""

    def key(self) -> str:
        return self.node_id


class NodeSchedulability(StrEnum):
    SCHEDULABLE = "schedulable"
    CORDONED = "cordoned"  # nothing new is placed there
    DRAINING = "draining"  # cordoned, and its tasks are being stopped and requeued
    DRAINED = "drained"  # cordoned, and nothing runs there any more


class NodeSchedulingChanged(Event):
    """The scheduler applied a node command (or a drain finished)."""

    TYPE: ClassVar[str] = "node.scheduling"
    node_id: str
    scheduling: NodeSchedulability
    generation: int = 0
    reason: str = ""

    def key(self) -> str:
        return self.node_id


class GpuHealth(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"


class GpuTelemetry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    index: int
    utilization_pct: float
    memory_used_mib: int
    temperature_c: float
    power_w: float = 0.0
    health: GpuHealth = GpuHealth.HEALTHY


class NodeTelemetry(Event):
    TYPE: ClassVar[str] = "node.telemetry"
    node_id: str
    gpus: list[GpuTelemetry]

    def key(self) -> str:
        return self.node_id
