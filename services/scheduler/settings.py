"""The scheduler's settings (environment, prefix ``KAIROS_``)."""

from __future__ import annotations

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
