"""Prometheus metrics every service exports about its own messaging."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CONSUMER_LAG = Gauge(
    "kairos_consumer_lag",
    "Messages not yet consumed: highwater minus position",
    ["service", "group", "topic", "partition"],
)
HANDLER_SECONDS = Histogram(
    "kairos_handler_seconds",
    "Time spent handling one message",
    ["service", "topic"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
MESSAGES = Counter(
    "kairos_messages_total",
    "Messages consumed, by outcome (ok, retried, deadlettered, duplicate)",
    ["service", "topic", "outcome"],
)
DEADLETTERS = Counter(
    "kairos_deadletters_total",
    "Messages sent to the dead-letter topic",
    ["service", "topic", "reason"],
)
PUBLISHED = Counter(
    "kairos_published_total", "Events published", ["service", "topic"]
)
OUTBOX_PENDING = Gauge("kairos_outbox_pending", "Outbox rows written but not yet published")
BUILD_INFO = Gauge("kairos_build_info", "Always 1; carries the running version",
                   ["service", "version"])
DEPENDENCY_WAITS = Counter(
    "kairos_dependency_waits_total",
    "Retries while PostgreSQL or the broker was unavailable, by what was waiting",
    ["what"],
)
OFFSET_RESETS = Counter(
    "kairos_consumer_offset_resets_total",
    "Partitions whose log was gone (a broker that came back empty): read from the start",
    ["service", "topic"],
)
OUTBOX_DEADLETTERED = Counter(
    "kairos_outbox_deadlettered_total",
    "Outbox rows that could never be published, set aside with their reason",
    ["source"],
)
BROKER_REFILLS = Counter(
    "kairos_broker_refills_total",
    "Times the broker was found empty and its topics refilled from the outbox",
)
