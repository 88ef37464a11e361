"""The scheduler's settings (environment, prefix ``KAIROS_``)."""

from __future__ import annotations

from pydantic import Field

from shared.config import CommonSettings


class SchedulerSettings(CommonSettings):
    service_name: str = "scheduler"
    http_port: int = 8002
    policy_file: str = ""  # a SchedulerConfig YAML; empty = the preset below
    policy: str = "default"  # a preset of scheduling.SchedulerConfig
    # the leader's lease: renewed this often, taken over once it is this old (at once if
    # the leader's database session is gone); kube-scheduler's defaults are 15 s / 2 s
    lease_ttl_s: float = 15.0
    lease_renew_s: float = 2.0
    # a waiting job's estimate (unless its spec gives one) and its Gittins rank's samples:
    # the durations of its tenant's succeeded jobs of its size, as the simulator's
    # "history" estimates (services/scheduler/history.py); learnt as jobs succeed, and at
    # start from this many of the newest succeeded jobs. The forecaster reads the switch
    # too, under the same name, so its replay ranks as the scheduler does.
    history_estimates: bool = Field(True, description="estimates from succeeded jobs' durations")
    history_first_read: int = Field(2000, ge=0, description="succeeded jobs read at start")
