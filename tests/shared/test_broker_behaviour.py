"""Regression tests for the broker behaviours Kairos relies on (Tansu today, Apache Kafka
in production). If the broker changes, these say which way."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from shared.bus import Producer, ensure_topics
from shared.topics import Topic

pytestmark = pytest.mark.broker


async def test_creating_an_existing_topic_is_harmless(broker: str) -> None:
    t = Topic("b-" + uuid.uuid4().hex[:8], "k", 4, 60_000, (), "")
    await ensure_topics(broker, [t])
    await ensure_topics(broker, [t])  # Tansu says nothing; Kafka raises, which we absorb
    # ... and the topic is the one first created, with its partitions
    p = Producer(broker, "test")
    await p.start()
    try:
        assert await p.partition_count(t.name) == 4
    finally:
        await p.stop()


async def test_manual_assignment_commits_survive_a_new_consumer(broker: str) -> None:
    """The node agent reads its partitions without a group rebalance and still commits."""
    t = Topic("b-" + uuid.uuid4().hex[:8], "k", 2, 60_000, (), "")
    await ensure_topics(broker, [t])
    tp = TopicPartition(t.name, 1)
    p = AIOKafkaProducer(bootstrap_servers=broker)
    await p.start()
    for i in range(4):
        await p.send_and_wait(t.name, str(i).encode(), partition=1)
    await p.stop()
    group = "agent-" + uuid.uuid4().hex[:6]
    c = AIOKafkaConsumer(bootstrap_servers=broker, group_id=group, enable_auto_commit=False,
                         auto_offset_reset="earliest", fetch_max_wait_ms=20)
    await c.start()
    c.assign([tp])
    first = await c.getmany(tp, timeout_ms=3000)
    assert [r.value for r in first[tp]][:2] == [b"0", b"1"]
    await c.commit({tp: OffsetAndMetadata(2, "")})
    assert c.highwater(tp) == 4  # what the lag metric reads
    await c.stop()
    c2 = AIOKafkaConsumer(bootstrap_servers=broker, group_id=group, enable_auto_commit=False,
                          auto_offset_reset="earliest", fetch_max_wait_ms=20)
    await c2.start()
    c2.assign([tp])
    assert await c2.committed(tp) == 2
    again = await c2.getmany(tp, timeout_ms=3000)
    assert [r.value for r in again[tp]] == [b"2", b"3"]
    end = await c2.end_offsets([tp])
    assert end[tp] == 4
    await c2.stop()
