"""Forecasts of waiting jobs (``jobs.forecasts``, keyed by job): when each is expected to
start and finish, on which nodes, within which band. Published by the forecaster
(``services/scheduler/forecaster``) when a job's forecast moves, and read by the gateway
(``GET /v1/jobs/{id}``) and the monitor. Times are epoch seconds; a forecast is a guess,
not a state: the job's next status ends it."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from shared.events.base import Event
from shared.events.reasons import WaitCode


class JobForecast(Event):
    """One waiting job's forecast as of ``as_of``."""

    TYPE: ClassVar[str] = "job.forecast"
    job_id: str
    queue: str
    tenant: str
    as_of: float = Field(description="when the snapshot it replays was taken (epoch s)")
    start: float | None = Field(default=None, description="expected start (epoch s); "
                                "empty: not within the horizon, or waiting for quota")
    finish: float | None = Field(default=None, description="expected finish (epoch s)")
    start_low: float | None = Field(default=None, description="the band's earliest start")
    start_high: float | None = Field(default=None, description="the band's latest start; "
                                     "empty: beyond the horizon in the slowest scenario")
    nodes: list[str] = Field(default_factory=list, description="the nodes it would get")
    waits_for: str | None = Field(default=None, description="the job it waits behind "
                                  "(the scheduler's diagnosis), if one")
    reason: WaitCode | None = Field(default=None, description="why it waits: the "
                                    "scheduler's pending reason, or quota (not admitted "
                                    "yet: no start until its queue has room)")

    def key(self) -> str:
        return self.job_id
