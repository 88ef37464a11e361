"""Nodes as the API shows them, and the admin's commands to them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from services.admission.node_health import GpuHealthOut
from shared.events import NodeAction, NodeSchedulability


class NodeOut(BaseModel):
    node_id: str
    state: str
    inventory: dict[str, Any]
    last_heartbeat: datetime | None
    gpus_total: int
    gpus_allocated: int
    gpus_shared: int
    allocations: list[dict[str, Any]]
    scheduling: str = Field(default="schedulable", description="schedulable, cordoned, "
                            "draining or drained (POST /v1/nodes/{id}/cordon|drain|uncordon)")
    scheduling_reason: str = ""
    gpu_health: list[GpuHealthOut] = Field(
        default_factory=list, description="the GPUs the node's agent reports not healthy, "
        "with the telemetry that said so; empty when all are healthy")


class NodeCommandIn(BaseModel):
    model_config = {"extra": "forbid"}
    reason: str = Field(default="", max_length=500, description="why (shown on the node)")
    grace_period_s: float = Field(default=30.0, ge=0, le=86400, description=(
        "drain: seconds each task gets to checkpoint after its stop signal"))


class NodeCommandOut(BaseModel):
    node_id: str
    action: NodeAction
    scheduling: NodeSchedulability = Field(description="the state the node moves to")
    generation: int = Field(description="rises with every command for this node")
    requested_by: str
    reason: str


def node_out(row: dict[str, Any], tenant: str | None) -> NodeOut:
    """A node and its allocations; with ``tenant`` (a user token's), other tenants'
    allocations show only the GPUs they hold."""
    inv = row["inventory"]
    used: set[int] = set()
    shared: set[int] = set()
    for a in row["allocations"]:
        for g in a["gpus"]:
            (shared if g.get("memory_mib") else used).add(g["index"])
    return NodeOut(
        node_id=row["node_id"], state=row["state"], inventory=inv,
        last_heartbeat=row["last_heartbeat"], gpus_total=len(inv.get("gpus", [])),
        gpus_allocated=len(used | shared), gpus_shared=len(shared - used),
        allocations=[a if tenant is None or a["tenant"] == tenant
                     else {"gpus": a["gpus"]} for a in row["allocations"]],
        scheduling=row.get("scheduling", "schedulable"),
        scheduling_reason=row.get("scheduling_reason", ""),
        gpu_health=row.get("gpu_health") or [])
