"""The graceful stop's wait (kairos/drain.py): it returns once every group has committed
through the end of every partition of the topics, and not before, on the real broker."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from kairos.drain import wait_consumed
from shared.bus import ensure_topics
from shared.topics import Topic

pytestmark = pytest.mark.broker


async def test_it_waits_for_every_group_to_commit_through_the_end(broker: str) -> None:
    t = Topic("drain-" + uuid.uuid4().hex[:8], "k", 2, 60_000, (), "")
    await ensure_topics(broker, [t])
    p = AIOKafkaProducer(bootstrap_servers=broker)
    await p.start()
    for i in range(3):
        await p.send_and_wait(t.name, str(i).encode(), partition=i % 2)  # 2 + 1
    await p.stop()
    groups = ["a-" + uuid.uuid4().hex[:6], "b-" + uuid.uuid4().hex[:6]]

    async def commit(group: str, offsets: dict[int, int]) -> None:
        c = AIOKafkaConsumer(bootstrap_servers=broker, group_id=group,
                             enable_auto_commit=False)
        await c.start()
        tps = [TopicPartition(t.name, n) for n in offsets]
        c.assign(tps)
        await c.commit({tp: OffsetAndMetadata(offsets[tp.partition], "") for tp in tps})
        await c.stop()

    assert not await wait_consumed(broker, groups, [t.name], timeout_s=0.5)  # none read
    await commit(groups[0], {0: 2, 1: 1})
    await commit(groups[1], {0: 2, 1: 0})  # one message left behind
    assert not await wait_consumed(broker, groups, [t.name], timeout_s=0.5)
    await commit(groups[1], {1: 1})
    assert await wait_consumed(broker, groups, [t.name], timeout_s=5)
