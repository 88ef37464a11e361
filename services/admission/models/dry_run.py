"""A dry-run submit's answer (``POST /v1/jobs?dryRun=All``): the spec is valid, what its
queue's quota says now, and when the forecaster expects it to start. Field names as the
job API's answers (snake_case); only the query parameter follows the Kubernetes API."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from shared.events.reasons import WaitCode


class QuotaDemand(BaseModel):
    gpus: float = Field(description="GPUs (a share counts its compute fraction)")
    cpu_milli: float
    memory_mib: float


class DryRunQuota(BaseModel):
    """Whether the queue's quota would admit the job now, from the usage queueing last
    announced (jobs already waiting in the queue may be admitted first)."""

    admitted: bool = Field(description="the quota has room for it now")
    borrowing: bool = Field(False, description="admitted above its queue's guarantee, "
                            "on quota its cohort lends (reclaimable)")
    blocked_by: str | None = Field(None, description="not admitted: whose quota stops it "
                                   "(quota of queue `research`, reclaim in cohort `lab`)")
    detail: str = Field(description="why, in words")
    ask: QuotaDemand = Field(description="what the job reserves of its queue's quota")
    gpu_model: str | None = Field(None, description="the GPU model whose quota it would be "
                                  "admitted against, where its queue's tree gives models a "
                                  "quota of their own (it then runs on that model only)")
    waiting_ahead: int = Field(0, description="jobs waiting in its queue now")


class DryRunForecast(BaseModel):
    """The forecaster's replay of the live cluster with the job added."""

    as_of: datetime = Field(description="the snapshot the forecast replayed")
    start: datetime | None = Field(description="expected start; empty = none in the "
                                   "forecast's horizon")
    finish: datetime | None
    start_low: datetime | None = Field(description="the band's earliest start")
    start_high: datetime | None = Field(description="the band's latest start")
    in_seconds: float | None = Field(description="from now to the expected start")
    nodes: list[str] = Field(description="the nodes it would get")
    waits_for: str | None = Field(description="what it waits behind meanwhile")
    reason: WaitCode | None = Field(default=None, description=(
        "why it would wait: the scheduler's pending reason in the replay (gpu_model, "
        "no_matching_node, never_fits: no node it may use could take it)"))


class DryRunOut(BaseModel):
    dry_run: Literal["All"] = Field("All", description="nothing was stored or published")
    valid: bool = Field(True, description="a submit of this spec would be accepted")
    name: str
    queue: str
    tenant: str
    user: str
    array_size: int | None = Field(None, description="a job array: its elements (the "
                                   "forecast is one element's)")
    quota: DryRunQuota
    forecast: DryRunForecast | None = None
    forecast_unavailable: str | None = Field(None, description="why there is no forecast")
    summary: str = Field(description="the answer in one sentence")
