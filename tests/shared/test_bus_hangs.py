"""What the platform does when a Kafka client call never returns. aiokafka can leave a
delivery future unresolved forever once the broker that took the batch died
(aio-libs/aiokafka#1101), and ``consumer.position`` waits for an offset that a consumer
whose group coordinator died may never get. Neither can be made to happen on demand
against a real broker, so each test stands in a client whose call never returns, and
checks that the relay and the consumer loop go on: the rows are kept and sent again on
the real broker; the position check gives up and says so."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError
from sqlalchemy import text

from shared.bus import Producer, ensure_topics
from shared.bus.positions import PositionWatcher
from shared.db import make_engine
from shared.events import JobState, JobStatus
from shared.outbox import OutboxRelay, add_to_outbox

pytestmark = [pytest.mark.broker, pytest.mark.db]


class UnacknowledgedProducer(Producer):
    """A real producer whose sends are never acknowledged (the future never resolves)."""

    async def send_future(self, topic: str, key: str, value: bytes) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()


async def test_a_delivery_never_acknowledged_keeps_its_row_for_the_next_send(
        broker: str, db_url: str) -> None:
    """Before: the relay awaited the delivery forever while holding its lock, so the
    queueing service's consumer (which flushes through it) stopped for good."""
    await ensure_topics(broker, max_partitions=4)
    engine = make_engine(db_url, pool_size=2)
    hung, good = UnacknowledgedProducer(broker, "scheduler"), Producer(broker, "scheduler")
    await good.start()
    try:
        relay = OutboxRelay(engine, hung, db_url)
        relay.delivery_timeout_s = 0.5
        async with engine.begin() as conn:
            await add_to_outbox(conn, JobStatus(job_id="hang", state=JobState.RUNNING,
                                                reason="r"), "scheduler", "st-hang")
        with pytest.raises(KafkaTimeoutError):
            await asyncio.wait_for(relay.publish_pending(), 30)
        async with engine.connect() as conn:
            assert await conn.scalar(text(
                "SELECT published_at FROM outbox WHERE event_id = 'st-hang'")) is None
        relay._producer = good  # the broker answers again
        assert await relay.publish_pending() == 1
        async with engine.connect() as conn:
            assert await conn.scalar(text(
                "SELECT published_at FROM outbox WHERE event_id = 'st-hang'")) is not None
    finally:
        await good.stop()
        await hung.stop()
        await engine.dispose()


class StuckConsumer:
    """The part of AIOKafkaConsumer the watcher uses, with a ``position`` that never
    returns (its partition never gets an offset)."""

    def assignment(self) -> set[Any]:
        from aiokafka import TopicPartition
        return {TopicPartition("jobs.submitted", 0)}

    def highwater(self, tp: Any) -> int:
        return 5

    async def end_offsets(self, tps: Any) -> dict[Any, int]:
        return {tp: 5 for tp in tps}

    async def position(self, tp: Any) -> int:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_position_that_never_comes_does_not_stop_the_consumer_loop() -> None:
    watcher = PositionWatcher(StuckConsumer(), "queueing", "queueing",  # type: ignore[arg-type]
                              every_s=0.0, timeout_s=0.2)
    await asyncio.wait_for(watcher.watch(), 10)  # returns: gave up on the check
    await asyncio.wait_for(watcher.watch(), 10)  # and the next check too


class IdleConsumer(StuckConsumer):
    """Nothing assigned: every check ends at once (a consumer between rebalances)."""

    def assignment(self) -> set[Any]:
        return set()


async def test_a_loop_of_position_checks_stops_when_cancelled_at_any_step() -> None:
    """Before: the check ran under asyncio.wait_for, which on Python 3.11 swallows a
    cancel that lands in the step where the inner call ends (CPython gh-86296). A
    consumer loop cancelled there ran on: a monitor replica standing down waited on it
    until pytest-timeout, on a loaded machine. Every step of the loop is tried."""
    watcher = PositionWatcher(IdleConsumer(), "monitor", "monitor-view",  # type: ignore[arg-type]
                              every_s=0.0, timeout_s=5)

    async def consume() -> None:  # Consumer.run's shape: poll, then check, for ever
        while True:
            await asyncio.sleep(0)
            await watcher.watch()

    for steps in range(12):
        task = asyncio.create_task(consume())
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        if not done:
            task.cancel()  # free the loop for the next test before failing
        assert done and task.cancelled(), f"the loop ran on after a cancel at step {steps}"
