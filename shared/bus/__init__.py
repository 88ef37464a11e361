"""The event bus on aiokafka: a producer and a consumer loop.

The consumer commits only after the handler succeeded (at-least-once), retries a
failing handler with bounded backoff, dead-letters undecodable or permanently failing
messages with the reason, and drops duplicates by event id. Kafka transactions and
the idempotent producer are not used: the embedded broker lacks them, and every
consumer is idempotent anyway.

Modules: ``producer``; ``consumer`` (the fetch/commit loop) with ``fetch_pacing`` and
``positions`` (lag, logs gone); ``dispatch`` (decode → dedupe → handle → dead-letter,
shared with the in-memory test double); ``codec``; ``dedupe``; ``admin`` (topics).
This package exports the public API: import from ``shared.bus``.
"""

from shared.bus.admin import ensure_topics, partition_for, wait_for_broker
from shared.bus.codec import check_size, decode_record
from shared.bus.consumer import Consumer, ConsumerOptions
from shared.bus.dispatch import BatchHandler, BatchHook, Handler
from shared.bus.producer import Producer, all_partitions

__all__ = [
    "BatchHandler",
    "BatchHook",
    "Consumer",
    "ConsumerOptions",
    "Handler",
    "Producer",
    "all_partitions",
    "check_size",
    "decode_record",
    "ensure_topics",
    "partition_for",
    "wait_for_broker",
]
