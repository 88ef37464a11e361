"""Queues as the API shows them, and the admin's changes to them."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.queuespec import (
    MAX_MODEL_QUOTAS,
    NAME_PATTERN,
    TENANT_PATTERN,
    Amount,
    ModelQuota,
    QueueState,
)

MODEL_QUOTAS = ("GPU quota per model (H100, A100-80GB), in the order its jobs try them: "
                "a GPU job of a tree that names models is admitted against the first with "
                "room and runs on that model")
BILLING = ("what one GPU-hour of a model counts as in usage and fair share ({H100: 4, "
           "V100: 1}), inherited from its parent model by model; a model none names counts 1")


class Usage(BaseModel):
    gpus: float = 0.0
    cpu_milli: float = 0.0
    memory_mib: float = 0.0


class QueueOut(BaseModel):
    name: str
    kind: Literal["queue", "cohort"]
    parent: str | None
    tenant: str = Field(description="empty = shared by every tenant")
    state: QueueState
    strategy: str
    weight: float
    guaranteed: Amount | None
    borrowing_limit: Amount | None
    lending_limit: Amount | None
    gpu_models: list[ModelQuota] | None = Field(None, description=MODEL_QUOTAS)
    billing_weights: dict[str, float] | None = Field(None, description=BILLING)
    description: str = ""
    used: Usage = Field(description="what its admitted jobs (and its children's) reserve")
    used_by_model: dict[str, float] = Field(default_factory=dict, description=(
        "GPUs its admitted jobs (and its children's) hold of each model named in gpu_models"))
    borrowed: Usage = Field(description="used above guaranteed, from its cohort")
    pending: int = Field(0, description="jobs waiting in it")
    admitted: int = Field(0, description="admitted jobs not running yet")
    running: int = 0
    version: int
    updated_at: datetime


class QueueIn(BaseModel):
    """A new queue (the fields of a queues file entry)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    kind: Literal["queue", "cohort"] = "queue"
    parent: str | None = None
    tenant: str = Field("", pattern=TENANT_PATTERN, max_length=63)
    guaranteed: Amount | None = None
    borrowing_limit: Amount | None = None
    lending_limit: Amount | None = None
    gpu_models: list[ModelQuota] | None = Field(None, max_length=MAX_MODEL_QUOTAS,
                                                description=MODEL_QUOTAS)
    billing_weights: dict[str, float] | None = Field(None, max_length=32, description=BILLING)
    weight: float = Field(1.0, gt=0)
    state: QueueState = QueueState.OPEN
    strategy: Literal["best_effort", "strict"] = "best_effort"
    description: str = Field("", max_length=500)


class QueuePatch(BaseModel):
    """The fields to change; the others stay. ``null`` clears a limit."""

    model_config = ConfigDict(extra="forbid")
    parent: str | None = None
    tenant: str | None = Field(None, pattern=TENANT_PATTERN, max_length=63)
    guaranteed: Amount | None = None
    borrowing_limit: Amount | None = None
    lending_limit: Amount | None = None
    gpu_models: list[ModelQuota] | None = Field(None, max_length=MAX_MODEL_QUOTAS,
                                                description=MODEL_QUOTAS + "; null clears them")
    billing_weights: dict[str, float] | None = Field(None, max_length=32, description=(
        BILLING + "; null clears them"))
    weight: float | None = Field(None, gt=0)
    strategy: Literal["best_effort", "strict"] | None = None
    description: str | None = Field(None, max_length=500)


class QueueAccepted(BaseModel):
    request_id: str
    detail: str


def queue_out(row: dict[str, Any]) -> QueueOut:
    s = row["settings"] if isinstance(row["settings"], dict) else json.loads(row["settings"])
    st = row["status"] if isinstance(row["status"], dict) else json.loads(row["status"] or "{}")

    def usage(d: dict[str, Any] | None) -> Usage:
        return Usage(**{k: v for k, v in (d or {}).items() if v is not None})

    return QueueOut(
        name=row["name"], kind=s.get("kind", "queue"), parent=s.get("parent"),
        tenant=row["tenant"], state=QueueState(row["state"]),
        strategy=s.get("strategy", "best_effort"), weight=s.get("weight", 1.0),
        guaranteed=s.get("guaranteed"), borrowing_limit=s.get("borrowing_limit"),
        lending_limit=s.get("lending_limit"), gpu_models=s.get("gpu_models"),
        billing_weights=s.get("billing_weights"),
        description=s.get("description", ""),
        used=usage(st.get("used")), borrowed=usage(st.get("borrowed")),
        used_by_model=st.get("used_by_model") or {},
        pending=st.get("pending", 0), admitted=st.get("admitted", 0),
        running=st.get("running", 0), version=row["version"], updated_at=row["updated_at"])
