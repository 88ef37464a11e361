"""The forecaster's settings (environment, prefix ``KAIROS_``). ``policy_file``,
``policy`` and ``history_estimates`` are the scheduler's own settings, under the same
names: set once, both read them, so the replay runs the policy the scheduler runs, on
the same estimates."""

from __future__ import annotations

from pydantic import Field

from shared.config import CommonSettings


class ForecasterSettings(CommonSettings):
    service_name: str = "forecaster"
    http_port: int = 8005
    policy_file: str = ""  # a SchedulerConfig YAML; empty = the preset below
    policy: str = "default"
    history_estimates: bool = Field(True, description="estimates from succeeded jobs' durations")
    forecast_every_s: float = Field(5.0, gt=0, description="seconds between rounds")
    # ... and rounds busy at most this share of the time (a slow round waits longer), so
    # the forecaster's CPU stays bounded however large the cluster and its queue grow
    forecast_max_busy: float = Field(0.2, gt=0, le=1)
    # publish a job's forecast again only when it moved this much, or this long after
    forecast_move_ratio: float = Field(0.05, ge=0, description="of the time to its start")
    forecast_move_s: float = Field(30.0, ge=0)
    forecast_refresh_s: float = Field(60.0, gt=0)
    # a replay steps at least this fraction of the time already replayed apart
    forecast_resolution: float = Field(0.02, ge=0, le=1)
    # the process's CPU priority (os.nice): forecasts are best effort, and where it shares
    # cores with the scheduler (the embedded stack, one VM), a cycle must not wait for one
    forecast_nice: int = Field(10, ge=0, le=19, description="added to the process's niceness")
    # replicas: every one forecasts (each answers what-ifs from its own fresh snapshot),
    # the one holding this PostgreSQL advisory lock publishes (so events are not doubled)
    election_key: int = 0x4B41495246  # "KAIRF"
    election_poll_s: float = Field(2.0, gt=0)
    forecast_history: int = Field(2000, ge=0, description="finished jobs read at start")
