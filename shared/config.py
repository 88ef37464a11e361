"""Configuration from the environment (prefix ``KAIROS_``), one settings class per service."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class CommonSettings(BaseSettings):
    """What every service reads. Each service subclasses it with its own fields."""

    model_config = SettingsConfigDict(env_prefix="KAIROS_", extra="ignore")

    service_name: str = "kairos"
    kafka_bootstrap: str = "127.0.0.1:9092"
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/kairos"
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    log_level: str = "INFO"
    log_json: bool = True
    # Consumer tuning: aiokafka's default 500 ms fetch wait dominates end-to-end latency,
    # while 5 ms makes every idle consumer (and the broker) spin. Measured on Tansu:
    # 20 ms gives p99 ~13 ms a hop at ~4% of a core per idle consumer.
    fetch_max_wait_ms: int = 20
    # ... and an idle consumer stretches it up to this (shared.bus.fetch_pacing.FetchPacer):
    # on the embedded broker a consumer polls with a short wait, so an idle one costs it
    # CPU per fetch. A broker that long-polls (Apache Kafka) can take 500 for both.
    fetch_idle_max_wait_ms: int = 100
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    rebalance_timeout_ms: int = 10_000
    topic_partitions_max: int | None = None  # cap partitions when creating topics
    handler_retries: int = 3
    retry_backoff_s: float = 0.2
    dedupe_window: int = 100_000
    # the largest event any service publishes, checked before the send: below Kafka's
    # default message.max.bytes (1 MiB), so production brokers take every event we make
    max_event_bytes: int = 1_000_000
    # how long a new database connection waits for a PostgreSQL that is restarting
    # before the request or handler sees the error (the gateway's 503)
    db_connect_wait_s: float = 3.0
    # how long published outbox rows are kept, so a broker that came back empty can be
    # refilled from PostgreSQL (and how far back that refill goes)
    outbox_replay_window_s: int = 24 * 3600
