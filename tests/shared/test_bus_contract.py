"""The bus's contract, run against the real broker (Tansu) and the in-memory fake.

tests/fakes/fake_bus.py is a stand-in for the broker, checked against the real one by
this suite: every test here runs on both, so a test that uses the fake relies only on
what is asserted here. The contract: messages of a key arrive in publish order; a fetch
is committed only after it was handled, so a consumer stopped mid-batch leaves it to the
group's next consumer (at least once); committed offsets hold for a new consumer of the
group; a consumer that does not commit reads again from its start; an envelope delivered
twice is handled once; a failing handler is retried, then its message dead-lettered with
the reason, as is a message that does not decode; a manual assignment reads only its
partitions, from where they were at ``start``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition

from shared.bus import Consumer, ConsumerOptions, Producer, ensure_topics, partition_for
from shared.config import CommonSettings
from shared.errors import NonRetryable
from shared.events import DeadLetter, Envelope, Event, JobState, JobStatus
from shared.topics import DEAD_LETTER, Topic
from tests.fakes.fake_bus import FakeConsumer, FakeProducer, InMemoryBroker

AnyProducer = Producer | FakeProducer
AnyConsumer = Consumer | FakeConsumer


def settings(bootstrap: str) -> CommonSettings:
    return CommonSettings(service_name="test", kafka_bootstrap=bootstrap, retry_backoff_s=0.01,
                          session_timeout_ms=6000, heartbeat_interval_ms=500,
                          rebalance_timeout_ms=6000)


@dataclass
class RealBus:
    bootstrap: str

    async def topic(self, partitions: int = 1) -> str:
        name = "c-" + uuid.uuid4().hex[:8]
        await ensure_topics(self.bootstrap, [Topic(name, "k", partitions, 3_600_000, (), "")])
        return name

    def producer(self) -> AnyProducer:
        return Producer(self.bootstrap, "test")

    def consumer(self, producer: AnyProducer, options: ConsumerOptions,
                 handler: Callable[[Envelope, Event], Awaitable[None]],
                 **kwargs: Any) -> AnyConsumer:
        assert isinstance(producer, Producer)
        return Consumer(settings(self.bootstrap), options, handler, producer, **kwargs)


@dataclass
class MemoryBus:
    broker: InMemoryBroker = field(default_factory=InMemoryBroker)

    async def topic(self, partitions: int = 1) -> str:
        name = "c-" + uuid.uuid4().hex[:8]
        self.broker.create_topic(name, partitions)
        return name

    def producer(self) -> AnyProducer:
        return FakeProducer(self.broker, "test")

    def consumer(self, producer: AnyProducer, options: ConsumerOptions,
                 handler: Callable[[Envelope, Event], Awaitable[None]],
                 **kwargs: Any) -> AnyConsumer:
        assert isinstance(producer, FakeProducer)
        return FakeConsumer(settings("memory"), options, handler, producer, **kwargs)


Bus = RealBus | MemoryBus


@pytest.fixture(params=[pytest.param("tansu", marks=pytest.mark.broker), "memory"])
def bus(request: pytest.FixtureRequest) -> Bus:
    if request.param == "tansu":
        return RealBus(request.getfixturevalue("broker"))
    return MemoryBus()


@pytest.fixture
async def producer(bus: Bus) -> AsyncIterator[AnyProducer]:
    p = bus.producer()
    await p.start()
    yield p
    await p.stop()


def status(job: str) -> JobStatus:
    return JobStatus(job_id=job, state=JobState.RUNNING, reason="test")


async def publish(producer: AnyProducer, topic: str, job: str, key: str | None = None) -> None:
    env = Envelope.wrap(status(job), "test")
    await producer.publish_envelope(env.model_copy(update={"key": key or env.key}), topic)


def collector() -> tuple[list[str], Callable[[Envelope, Event], Awaitable[None]]]:
    got: list[str] = []

    async def handle(env: Envelope, ev: Event) -> None:
        assert isinstance(ev, JobStatus)
        got.append(ev.job_id)

    return got, handle


async def consume_until(consumer: AnyConsumer, done: Callable[[], bool],
                        timeout: float = 30) -> None:
    """Run ``consumer`` until ``done()``, then cancel it mid-whatever and stop it."""
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


def group() -> str:
    return "g-" + uuid.uuid4().hex[:8]


async def test_messages_of_a_key_arrive_in_publish_order(bus: Bus,
                                                         producer: AnyProducer) -> None:
    topic = await bus.topic(partitions=4)
    sent = [(f"key-{i % 3}", f"{i % 3}-{i}") for i in range(12)]
    for key, job in sent:
        await publish(producer, topic, job, key)
    got, handle = collector()
    await consume_until(bus.consumer(producer, ConsumerOptions(group(), [topic]), handle),
                        lambda: len(got) == len(sent))
    for k in range(3):
        assert [j for j in got if j.startswith(f"{k}-")] == [
            job for _, job in sent if job.startswith(f"{k}-")]


async def test_committed_offsets_hold_for_a_new_consumer_of_the_group(
        bus: Bus, producer: AnyProducer) -> None:
    topic, g = await bus.topic(), group()
    for i in range(3):
        await publish(producer, topic, f"j{i}")
    got, handle = collector()
    await consume_until(bus.consumer(producer, ConsumerOptions(g, [topic]), handle),
                        lambda: len(got) == 3)
    assert got == ["j0", "j1", "j2"]
    await publish(producer, topic, "j3")
    got2, handle2 = collector()
    await consume_until(bus.consumer(producer, ConsumerOptions(g, [topic]), handle2),
                        lambda: len(got2) >= 1)
    await asyncio.sleep(0.3)
    assert got2 == ["j3"]


async def test_a_fetch_stopped_mid_batch_is_delivered_again(bus: Bus,
                                                            producer: AnyProducer) -> None:
    """At least once: nothing of a fetch is committed before all of it was handled."""
    topic, g = await bus.topic(), group()
    for i in range(5):
        await publish(producer, topic, f"j{i}")
    got: list[str] = []

    async def stuck_at_j2(env: Envelope, ev: Event) -> None:
        assert isinstance(ev, JobStatus)
        got.append(ev.job_id)
        if ev.job_id == "j2":
            await asyncio.Event().wait()  # the consumer is stopped while handling j2

    await consume_until(bus.consumer(producer, ConsumerOptions(g, [topic]), stuck_at_j2),
                        lambda: "j2" in got)
    got2, handle2 = collector()
    await consume_until(bus.consumer(producer, ConsumerOptions(g, [topic]), handle2),
                        lambda: got2[-1:] == ["j4"])
    # from the start of the uncommitted fetch (at j2 or before), in order, j2 again
    first = int(got2[0][1:])
    assert first <= 2 and got2 == [f"j{i}" for i in range(first, 5)]


async def test_a_consumer_that_does_not_commit_reads_from_its_start_again(
        bus: Bus, producer: AnyProducer) -> None:
    topic = await bus.topic()
    for i in range(3):
        await publish(producer, topic, f"j{i}")
    options = ConsumerOptions(group(), [topic], assign=[TopicPartition(topic, 0)],
                              commit=False)
    for _ in range(2):
        got, handle = collector()
        await consume_until(bus.consumer(producer, options, handle),
                            lambda got=got: len(got) == 3)
        assert got == ["j0", "j1", "j2"]


async def test_an_envelope_delivered_twice_is_handled_once(bus: Bus,
                                                           producer: AnyProducer) -> None:
    topic = await bus.topic()
    env = Envelope.wrap(status("dup"), "test")
    for _ in range(3):
        await producer.publish_envelope(env, topic)
    await publish(producer, topic, "other")
    got, handle = collector()
    await consume_until(bus.consumer(producer, ConsumerOptions(group(), [topic]), handle),
                        lambda: len(got) >= 2)
    await asyncio.sleep(0.3)
    assert got == ["dup", "other"]


async def dead_letters(bus: Bus, producer: AnyProducer, of_group: str,
                       n: int) -> list[DeadLetter]:
    """The dead letters ``of_group`` wrote, read through the bus itself."""
    found: list[DeadLetter] = []

    async def handle(env: Envelope, ev: Event) -> None:
        if isinstance(ev, DeadLetter) and ev.consumer_group == of_group:
            found.append(ev)

    await consume_until(bus.consumer(producer, ConsumerOptions(group(), [DEAD_LETTER.name]),
                                     handle), lambda: len(found) >= n)
    return sorted(found, key=lambda d: d.offset)


async def test_failing_handlers_are_retried_then_dead_lettered(bus: Bus,
                                                               producer: AnyProducer) -> None:
    topic, g = await bus.topic(), group()
    await producer.send_raw(topic, b"k", b"\x00not json at all")
    for job in ("poison", "always-fails", "flaky", "fine"):
        await publish(producer, topic, job)
    calls: dict[str, int] = {}
    handled: list[str] = []

    async def handle(env: Envelope, ev: Event) -> None:
        assert isinstance(ev, JobStatus)
        calls[ev.job_id] = calls.get(ev.job_id, 0) + 1
        if ev.job_id == "poison":
            raise NonRetryable("refers to a queue that never existed")
        if ev.job_id == "always-fails":
            raise RuntimeError("bug")
        if ev.job_id == "flaky" and calls["flaky"] < 3:
            raise RuntimeError("not yet")
        handled.append(ev.job_id)

    await consume_until(bus.consumer(producer, ConsumerOptions(g, [topic]), handle),
                        lambda: handled == ["flaky", "fine"])
    retries = settings("").handler_retries
    assert calls == {"poison": 1, "always-fails": retries + 1, "flaky": 3, "fine": 1}
    letters = await dead_letters(bus, producer, g, 3)
    assert [(d.reason, d.offset, d.topic) for d in letters] == [
        ("undecodable", 0, topic), ("rejected", 1, topic), ("handler_failed", 2, topic)]
    assert letters[0].value.endswith("not json at all")
    assert "never existed" in letters[1].error


async def test_a_manual_assignment_reads_its_partition_from_start_on(
        bus: Bus, producer: AnyProducer) -> None:
    topic = await bus.topic(partitions=4)
    keys = [f"node-{i}" for i in range(12)]
    part = partition_for("node-3", 4)
    await publish(producer, topic, "before-start", key="node-3")
    got, handle = collector()
    consumer = bus.consumer(producer, ConsumerOptions(
        group(), [topic], assign=[TopicPartition(topic, part)], from_beginning=False), handle)
    await consumer.start()  # fixes the start position: later messages are not skipped
    for k in keys:
        await publish(producer, topic, k, key=k)
    expected = [k for k in keys if partition_for(k, 4) == part]
    await consume_until(consumer, lambda: len(got) >= len(expected))
    await asyncio.sleep(0.3)
    assert got == expected and "node-3" in expected and len(expected) < len(keys)
