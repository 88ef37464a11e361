"""The queueing service's settings (``KAIROS_*`` environment variables).

The queue tree and the ordering policy are not settings but the queues file that
``queues_file`` names (``config.py``).
"""

from __future__ import annotations

from shared.config import CommonSettings


class QueueingSettings(CommonSettings):
    service_name: str = "queueing"
    http_port: int = 8001
    queues_file: str = ""  # KAIROS_QUEUES_FILE; empty = one shared `default` queue, no quota
    cycle_interval_s: float = 1.0  # other replicas' changes and aging show up this often
