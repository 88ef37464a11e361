"""The bus against the real broker (Tansu): commit after success, retries, dead letters,
dedupe, and manual partition assignment."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from shared.bus import Consumer, ConsumerOptions, Producer, ensure_topics, partition_for
from shared.config import CommonSettings
from shared.errors import NonRetryable
from shared.events import DeadLetter, Envelope, Event, JobState, JobStatus
from shared.topics import DEAD_LETTER, Topic

pytestmark = pytest.mark.broker


def settings(bootstrap: str) -> CommonSettings:
    return CommonSettings(service_name="test", kafka_bootstrap=bootstrap, retry_backoff_s=0.01,
                          session_timeout_ms=6000, heartbeat_interval_ms=500,
                          rebalance_timeout_ms=6000)


async def fresh_topic(bootstrap: str, partitions: int = 1) -> str:
    name = "t-" + uuid.uuid4().hex[:8]
    await ensure_topics(bootstrap, [Topic(name, "k", partitions, 3_600_000, (), "test")])
    return name


@pytest.fixture
async def producer(broker: str) -> AsyncIterator[Producer]:
    p = Producer(broker, "test")
    await p.start()
    yield p
    await p.stop()


def status(job: str, state: JobState = JobState.RUNNING) -> JobStatus:
    return JobStatus(job_id=job, state=state, reason="test")


async def consume_until(consumer: Consumer, done: Callable[[], bool], timeout: float = 20) -> None:
    await consumer.start()
    task = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(timeout):
            while not done():
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.stop()


async def dead_letters(bootstrap: str, group: str, n: int,
                       timeout: float = 15) -> list[DeadLetter]:
    """Read dead letters written by ``group`` (the topic is shared by the session)."""
    c = AIOKafkaConsumer(DEAD_LETTER.name, bootstrap_servers=bootstrap,
                         auto_offset_reset="earliest", fetch_max_wait_ms=50)
    await c.start()
    found: list[DeadLetter] = []
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while len(found) < n:
                    for records in (await c.getmany(timeout_ms=200)).values():
                        for r in records:
                            ev = Envelope.decode(r.value or b"").payload()
                            assert isinstance(ev, DeadLetter)
                            if ev.consumer_group == group:
                                found.append(ev)
    finally:
        await c.stop()
    return found


def collector() -> tuple[list[Event], Callable[[Envelope, Event], Awaitable[None]]]:
    got: list[Event] = []

    async def handle(env: Envelope, ev: Event) -> None:
        got.append(ev)

    return got, handle


async def test_consumes_in_order_and_commits_after_success(broker: str,
                                                           producer: Producer) -> None:
    topic = await fresh_topic(broker)
    for i in range(5):
        await producer.publish_envelope(Envelope.wrap(status(f"j{i}"), "test"), topic)
    got, handle = collector()
    group = "g-" + uuid.uuid4().hex[:6]
    await consume_until(Consumer(settings(broker), ConsumerOptions(group, [topic]), handle,
                                 producer), lambda: len(got) == 5)
    assert [e.job_id for e in got] == [f"j{i}" for i in range(5)]  # type: ignore[attr-defined]
    # the group's offsets were committed: a new member of the group sees only new messages
    await producer.publish_envelope(Envelope.wrap(status("j5"), "test"), topic)
    got2, handle2 = collector()
    await consume_until(Consumer(settings(broker), ConsumerOptions(group, [topic]), handle2,
                                 producer), lambda: len(got2) >= 1)
    await asyncio.sleep(0.3)
    assert [e.job_id for e in got2] == ["j5"]  # type: ignore[attr-defined]


async def test_duplicate_event_ids_are_handled_once(broker: str, producer: Producer) -> None:
    topic = await fresh_topic(broker)
    env = Envelope.wrap(status("dup"), "test")
    for _ in range(3):
        await producer.publish_envelope(env, topic)
    await producer.publish_envelope(Envelope.wrap(status("other"), "test"), topic)
    got, handle = collector()
    await consume_until(Consumer(settings(broker), ConsumerOptions("g-" + topic, [topic]),
                                 handle, producer), lambda: len(got) >= 2)
    await asyncio.sleep(0.3)
    assert [e.job_id for e in got] == ["dup", "other"]  # type: ignore[attr-defined]


async def test_transient_failure_is_retried_then_succeeds(broker: str,
                                                          producer: Producer) -> None:
    topic = await fresh_topic(broker)
    await producer.publish_envelope(Envelope.wrap(status("flaky"), "test"), topic)
    calls = 0

    async def handle(env: Envelope, ev: Event) -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("database busy")

    await consume_until(Consumer(settings(broker), ConsumerOptions("g-" + topic, [topic]),
                                 handle, producer), lambda: calls >= 3)
    assert calls == 3


async def test_a_database_outage_longer_than_the_retries_loses_nothing(
        broker: str, producer: Producer) -> None:
    """Before: a handler failing on a lost database connection spent the message's
    retries (3) and was dead-lettered, so a PostgreSQL restart lost the work; and a
    failing end-of-batch hook killed the loop. Now both wait, without a dead letter."""
    import asyncpg

    topic = await fresh_topic(broker)
    group = "g-" + topic
    for job in ("a", "b"):
        await producer.publish_envelope(Envelope.wrap(status(job), "test"), topic)
    calls: list[str] = []
    ends = 0

    async def handle(env: Envelope, ev: Event) -> None:
        assert isinstance(ev, JobStatus)
        calls.append(ev.job_id)
        if len(calls) < 8:  # more failures than handler_retries + 1
            raise asyncpg.CannotConnectNowError("the database system is starting up")

    async def batch_end() -> None:
        nonlocal ends
        ends += 1
        if ends < 3:
            raise ConnectionRefusedError("connection refused")

    s = settings(broker).model_copy(update={"handler_retries": 2})
    await consume_until(Consumer(s, ConsumerOptions(group, [topic]), handle, producer,
                                 on_batch_end=batch_end),
                        lambda: calls[-1:] == ["b"] and ends >= 3, timeout=60)
    assert calls.count("a") == 8 and calls[-1] == "b" and ends >= 3
    assert await dead_letters(broker, group, 1, timeout=2) == []


async def test_permanent_failures_and_garbage_are_dead_lettered(broker: str,
                                                                producer: Producer) -> None:
    topic = await fresh_topic(broker)
    group = "g-" + topic
    await producer.send_raw(topic, b"k", b"\x00not json at all")
    await producer.publish_envelope(Envelope.wrap(status("poison"), "test"), topic)
    await producer.publish_envelope(Envelope.wrap(status("always-fails"), "test"), topic)
    await producer.publish_envelope(Envelope.wrap(status("fine"), "test"), topic)
    handled: list[str] = []

    async def handle(env: Envelope, ev: Event) -> None:
        assert isinstance(ev, JobStatus)
        if ev.job_id == "poison":
            raise NonRetryable("job spec refers to a queue that never existed")
        if ev.job_id == "always-fails":
            raise RuntimeError("bug")
        handled.append(ev.job_id)

    await consume_until(Consumer(settings(broker), ConsumerOptions(group, [topic]), handle,
                                 producer), lambda: handled == ["fine"])
    letters = await dead_letters(broker, group, 3)
    assert [(d.reason, d.offset) for d in letters] == [
        ("undecodable", 0), ("rejected", 1), ("handler_failed", 2)]
    assert letters[0].value.endswith("not json at all") and letters[0].topic == topic
    assert "never existed" in letters[1].error


async def test_manual_assignment_reads_only_its_partition(broker: str,
                                                          producer: Producer) -> None:
    topic = await fresh_topic(broker, partitions=8)
    keys = [f"node-{i}" for i in range(20)]
    mine = "node-3"
    part = partition_for(mine, 8)
    got, handle = collector()
    consumer = Consumer(settings(broker), ConsumerOptions(
        "g-" + topic, [topic], assign=[TopicPartition(topic, part)], from_beginning=False),
        handle, producer)
    await consumer.start()  # fixes the start position: later messages are not skipped
    for k in keys:
        env = Envelope.wrap(status(k), "test")
        await producer.publish_envelope(env.model_copy(update={"key": k}), topic)
    expected = {k for k in keys if partition_for(k, 8) == part}
    await consume_until(consumer, lambda: {e.job_id for e in got} >= expected)  # type: ignore[attr-defined]
    assert await producer.partition_count(topic) == 8
    assert {e.job_id for e in got} == expected  # type: ignore[attr-defined]
    assert mine in expected and len(expected) < len(keys)


async def test_reachable_follows_the_broker() -> None:
    """What /readyz reports: a metadata round trip, not a cached view."""
    from kairos.embedded import EmbeddedBroker

    b = EmbeddedBroker()
    p = Producer(b.start(), "test")
    await p.start()
    try:
        assert await p.reachable()
        b.stop()
        assert not await p.reachable(timeout_s=1)
    finally:
        b.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(p.stop(), 5)


async def test_lag_is_reported_per_consumer_group(broker: str, producer: Producer) -> None:
    """Two consumers of one service reading the same topic in different groups (the
    monitor's shard and view) each have their own lag series, not one overwriting the other."""
    from prometheus_client import REGISTRY

    topic = await fresh_topic(broker, partitions=1)
    for i in range(3):
        await producer.publish_envelope(Envelope.wrap(status(f"j{i}"), "test"), topic)
    groups = ["g-" + uuid.uuid4().hex[:6] for _ in range(2)]
    service = settings(broker).service_name

    def lag(group: str) -> float | None:
        return REGISTRY.get_sample_value("kairos_consumer_lag", {
            "service": service, "group": group, "topic": topic, "partition": "0"})

    for group in groups:
        got, handle = collector()
        # the lag is reported after the batch is handled: wait for it too (a loaded
        # machine may stop the consumer between the two)
        await consume_until(Consumer(settings(broker), ConsumerOptions(group, [topic]), handle,
                                     producer),
                            lambda got=got, group=group: len(got) == 3 and lag(group) == 0.0)
    assert [lag(g) for g in groups] == [0.0, 0.0]



async def test_an_idle_consumer_stretches_its_fetch_wait_and_snaps_back_on_data(
        broker: str, producer: Producer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tansu does not answer a waiting fetch as soon as data arrives, so consumers poll with
    a short wait, and an idle one polling every 20 ms costs the broker CPU for nothing: idle, the wait doubles per empty poll up to the idle bound,
    and the first message brings it back to the short wait. The waits are read from the
    fetch requests aiokafka sends, so this also checks that it builds each request with
    the wait its fetcher holds at that moment."""
    import aiokafka.consumer.fetcher as aiokafka_fetcher

    sent: list[int] = []
    real = aiokafka_fetcher.FetchRequest

    topic = await fresh_topic(broker)

    class Recording(real):  # type: ignore[misc,valid-type]
        def __init__(self, max_wait_time: int, min_bytes: int, max_bytes: int,
                     isolation_level: int, topics: list[tuple[str, Any]],
                     *args: object, **kwargs: object) -> None:
            if any(t == topic for t, _ in topics):  # this consumer's, not another test's
                sent.append(max_wait_time)
            super().__init__(max_wait_time, min_bytes, max_bytes, isolation_level, topics,
                             *args, **kwargs)

    monkeypatch.setattr(aiokafka_fetcher, "FetchRequest", Recording)
    s = settings(broker).model_copy(update={"fetch_max_wait_ms": 20,
                                            "fetch_idle_max_wait_ms": 160})
    got, handle = collector()
    consumer = Consumer(s, ConsumerOptions("g-" + uuid.uuid4().hex[:6], [topic],
                                           assign=[TopicPartition(topic, 0)]), handle, producer)
    await consumer.start()
    task = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(20):
            while sent[-3:] != [160, 160, 160]:  # empty polls: 40, 80, 160, then it stays
                await asyncio.sleep(0.05)
            assert {20, 40, 80} <= set(sent)  # it doubled its way there
            await producer.publish_envelope(Envelope.wrap(status("j-wait"), "test"), topic)
            while not got:
                await asyncio.sleep(0.01)
            n = len(sent)
            while len(sent) < n + 2:
                await asyncio.sleep(0.01)
            assert sent[-1] == 20  # data: the short wait again
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.stop()
