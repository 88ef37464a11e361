"""The monitor's settings (environment, prefix ``KAIROS_``)."""

from __future__ import annotations

from shared.config import CommonSettings

# the advisory lock the replicas of one monitor deployment compete for ("KMON")
LOCK_KEY = 0x4B4D_4F4E


class MonitorSettings(CommonSettings):
    service_name: str = "monitor"
    http_port: int = 8004
    lost_after_s: float = 20.0
    check_every_s: float = 2.0
    stuck_after_s: float = 120.0  # bound this long without running: stuck
    starvation_bound_s: float = 14 * 86400.0  # queues without their own (the default policy's)
    election_poll_s: float = 2.0
    election_key: int = LOCK_KEY  # one per monitor deployment sharing a database
    shard_group: str = "monitor"  # the consumer group the replicas split the shard topics in
    export_every_s: float = 0.5  # the cluster view's export, at most this often
