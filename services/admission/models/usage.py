"""GPU-hours per tenant and queue (``GET /v1/usage``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class QueueUsage(BaseModel):
    queue: str
    gpu_hours: float = Field(description="GPU-hours, shares counted by their fraction")
    shared_gpu_hours: float = Field(description="the part of gpu_hours held as GPU shares")
    runs: int = Field(description="task replica runs that overlap the range")
    billed_gpu_hours: float = Field(0.0, description="gpu_hours with each model's hours "
                                    "at the queue's billing weight (1 where none is set)")
    gpu_hours_by_model: dict[str, float] = Field(default_factory=dict, description=(
        "gpu_hours per GPU model (H100-80GB); \"\" for runs without a known model"))


class TenantUsage(BaseModel):
    tenant: str
    gpu_hours: float
    shared_gpu_hours: float
    runs: int
    billed_gpu_hours: float = 0.0
    queues: list[QueueUsage]


class UsageReport(BaseModel):
    from_: datetime = Field(alias="from", description="start of the range (inclusive)")
    to: datetime = Field(description="end of the range (exclusive); runs still going "
                         "count up to now")
    gpu_hours: float = Field(description="all tenants shown, together")
    billed_gpu_hours: float = Field(0.0, description="all tenants shown, billed")
    tenants: list[TenantUsage]

    model_config = {"populate_by_name": True}
