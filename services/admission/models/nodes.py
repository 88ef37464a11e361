"""Nodes as the API shows them, and the admin's commands to them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator

from services.admission.node_health import GpuHealthOut
from shared.events import NodeAction, NodeSchedulability
from shared.node_constraints import LabelKey, LabelValue, parse_taint


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
    admin_labels: dict[str, str] = Field(default_factory=dict, description=(
        "an admin's labels (kairos node label), over the agent's in inventory.labels"))
    admin_taints: list[str] = Field(default_factory=list, description=(
        "an admin's taints (kairos node taint), beside the agent's in inventory.taints"))


RESERVED = "kairos.io/"  # the labels the platform sets from the node's inventory


class NodeLabelsIn(BaseModel):
    """The whole set of an admin's labels for a node (what is not named is removed)."""

    model_config = {"extra": "forbid"}
    labels: dict[LabelKey, LabelValue] = Field(max_length=64, description=(
        "key: value, as Kubernetes labels; kairos.io/ keys are the platform's own"))

    @field_validator("labels")
    @classmethod
    def _not_reserved(cls, v: dict[str, str]) -> dict[str, str]:
        taken = [k for k in v if k.startswith(RESERVED)]
        if taken:
            raise ValueError(f"{', '.join(taken)}: {RESERVED} labels come from the node's "
                             "inventory and cannot be set")
        return v


class NodeTaintsIn(BaseModel):
    """The whole set of an admin's taints for a node (what is not named is removed)."""

    model_config = {"extra": "forbid"}
    taints: list[Annotated[str, Field(max_length=400)]] = Field(max_length=32, description=(
        "key=value:Effect as kubectl taint writes them (NoSchedule, PreferNoSchedule, "
        "NoExecute)"))

    @field_validator("taints")
    @classmethod
    def _valid(cls, v: list[str]) -> list[str]:
        out: dict[str, None] = {}
        for t in v:
            kv, effect = parse_taint(t)  # a ValueError names what is wrong
            out[f"{kv}:{effect}"] = None
        return list(out)


class NodeLabelsOut(BaseModel):
    node_id: str
    labels: dict[str, str] = Field(description="the admin's labels now")
    taints: list[str] = Field(description="the admin's taints now")
    generation: int = Field(description="rises with every change of this node's labels")
    requested_by: str


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
        gpu_health=row.get("gpu_health") or [],
        admin_labels=row.get("admin_labels") or {}, admin_taints=row.get("admin_taints") or [])
