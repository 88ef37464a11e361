"""Forecasts as the API shows them: a waiting job's expected start, finish and band."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from shared.events.reasons import WaitCode


class ForecastOut(BaseModel):
    """The forecaster's latest forecast of a waiting job: the live policy replayed
    forward from the cluster as it was at ``as_of``."""

    as_of: datetime = Field(description="the cluster snapshot it was made from")
    start: datetime | None = Field(description="expected start; empty: not within the "
                                   "forecast's horizon (or held for quota with no readable spec)")
    finish: datetime | None = Field(description="expected finish")
    start_low: datetime | None = Field(description="the band: earliest expected start")
    start_high: datetime | None = Field(description="the band: latest expected start; "
                                        "empty: beyond the horizon")
    nodes: list[str] = Field(description="the nodes it is expected to get")
    waits_for: str | None = Field(default=None, description="the job it waits behind")
    reason: WaitCode | None = Field(default=None, description="why it waits (quota: not "
                                    "admitted yet: its start is when the replay admits it)")


def forecast_out(row: dict[str, Any] | None) -> ForecastOut | None:
    if row is None or row.get("as_of") is None:
        return None
    return ForecastOut(**{k: row[k] for k in ForecastOut.model_fields})


class WaitingJobOut(BaseModel):
    """A waiting job with its forecast (``squeue --start``)."""

    job_id: str
    name: str
    queue: str
    tenant: str
    state: str
    submitted_at: datetime
    forecast: ForecastOut | None = Field(description="empty: none made yet")


class WaitingJobList(BaseModel):
    items: list[WaitingJobOut]
