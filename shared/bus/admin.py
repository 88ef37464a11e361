"""Topics on the broker: creating the registry's topics, waiting for the broker, and
which partition a key's messages land in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError
from aiokafka.partitioner import murmur2

from shared.logging import get_logger
from shared.topics import ALL_TOPICS, Topic

log = get_logger(__name__)


def partition_for(key: str, partitions: int) -> int:
    """Kafka's default partitioner (murmur2, as the producer uses), so a manual assigner
    knows which partition a key's messages land in."""
    return int(murmur2(key.encode()) & 0x7FFFFFFF) % partitions


async def ensure_topics(bootstrap: str, topics: Iterable[Topic] = ALL_TOPICS,
                        max_partitions: int | None = None) -> None:
    """Create the registry's topics; an existing topic is fine (Tansu says nothing,
    Apache Kafka raises TopicAlreadyExistsError). ``max_partitions`` caps the counts for
    a one-machine stack: every idle fetch costs the embedded broker CPU per partition.
    Clients read the real count from the broker's metadata, never from the registry."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(t.name, min(t.partitions, max_partitions or t.partitions), 1,
                     topic_configs={"retention.ms": str(t.retention_ms)})
            for t in topics
            if t.name not in existing
        ]
        if new:
            try:
                await admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


async def wait_for_broker(bootstrap: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            await admin.start()
            await admin.list_topics()
            return
        except (KafkaConnectionError, OSError) as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka at {bootstrap} unreachable after {timeout_s}s") from exc
            log.info("waiting for kafka", bootstrap=bootstrap)
            await asyncio.sleep(0.5)
        finally:
            await admin.close()
