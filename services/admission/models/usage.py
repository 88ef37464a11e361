"""GPU-hours per tenant and queue (``GET /v1/usage``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class QueueUsage(BaseModel):
    queue: str
    gpu_hours: float = Field(description="GPU-hours, shares counted by their fraction")
    shared_gpu_hours: float = Field(description="the part of gpu_hours held as GPU shares")
    runs: int = Field(description="task replica runs that overlap the range")


class TenantUsage(BaseModel):
    tenant: str
    gpu_hours: float
    shared_gpu_hours: float
    runs: int
    queues: list[QueueUsage]


class UsageReport(BaseModel):
    from_: datetime = Field(alias="from", description="start of the range (inclusive)")
    to: datetime = Field(description="end of the range (exclusive); runs still going "
                         "count up to now")
    gpu_hours: float = Field(description="all tenants shown, together")
    tenants: list[TenantUsage]

    model_config = {"populate_by_name": True}
