"""A broker that restarts empty (the embedded Tansu keeps its log in memory): consumers
read the new log from its start, and the platform refills it from the outboxes.

Each test runs its own Tansu on its own port, so restarting it touches no other test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import pytest
from aiokafka import AIOKafkaConsumer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from kairos.embedded import EmbeddedBroker
from shared.bus import Consumer, ConsumerOptions, Producer, ensure_topics
from shared.config import CommonSettings
from shared.db import make_engine
from shared.events import Binding, BindingAction, Envelope, Event, JobState, JobStatus
from shared.outbox import OutboxRelay, add_many, add_to_outbox
from shared.refill import BrokerWatch
from shared.retry import retry_transient
from shared.topics import BINDINGS, JOBS_STATUS

pytestmark = [pytest.mark.broker, pytest.mark.db]


@pytest.fixture
def own_broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    b.start()
    yield b
    b.stop()


def restart(b: EmbeddedBroker) -> None:
    """Stop the broker and start an empty one on the same port."""
    b.stop()
    b.start()


def settings(bootstrap: str, db_url: str = "", name: str = "test") -> CommonSettings:
    return CommonSettings(service_name=name, kafka_bootstrap=bootstrap, database_url=db_url,
                          retry_backoff_s=0.01, session_timeout_ms=6000,
                          heartbeat_interval_ms=500, rebalance_timeout_ms=6000,
                          topic_partitions_max=4, outbox_replay_window_s=3600)


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    e = make_engine(db_url, pool_size=3)
    yield e
    await e.dispose()


def status(job: str, reason: str) -> JobStatus:
    return JobStatus(job_id=job, state=JobState.RUNNING, reason=reason)


async def wait_for(cond: object, timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("assigned", [True, False], ids=["manual-assignment", "group"])
async def test_a_consumer_reads_the_log_of_a_broker_that_came_back_empty(
        own_broker: EmbeddedBroker, assigned: bool) -> None:
    """Before: a consumer kept its old position past the new log's end and never read
    another message (the agents' bindings, the monitor's view)."""
    boot = own_broker.bootstrap
    await ensure_topics(boot, max_partitions=4)
    producer = Producer(boot, "test")
    await producer.start()
    seen: list[str] = []

    async def handle(env: Envelope, event: Event) -> None:
        assert isinstance(event, JobStatus)
        seen.append(event.reason)

    from aiokafka import TopicPartition
    opts = ConsumerOptions("restart-test", [JOBS_STATUS.name],
                           assign=[TopicPartition(JOBS_STATUS.name, p) for p in range(4)]
                           if assigned else None)
    consumer = Consumer(settings(boot), opts, handle, producer)
    await consumer.start()
    task = asyncio.create_task(consumer.run())
    try:
        for i in range(5):
            await producer.publish(status("j", f"old-{i}"))
        await wait_for(lambda: len(seen) == 5)
        restart(own_broker)
        await ensure_topics(boot, max_partitions=4)
        for i in range(3):  # fewer than before: the new log ends before our position
            await producer.publish(status("j", f"new-{i}"))
        await wait_for(lambda: len(seen) >= 8, timeout=90)
        assert seen == [f"old-{i}" for i in range(5)] + [f"new-{i}" for i in range(3)]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.stop()
        await producer.stop()


async def read_all(boot: str, topic: str, want: int, timeout: float = 30) -> list[Envelope]:
    c = AIOKafkaConsumer(topic, bootstrap_servers=boot, auto_offset_reset="earliest",
                         fetch_max_wait_ms=20)
    await c.start()
    out: list[Envelope] = []
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while len(out) < want:
                    for records in (await c.getmany(timeout_ms=200)).values():
                        out += [Envelope.decode(r.value or b"") for r in records]
    finally:
        await c.stop()
    return out


async def test_an_empty_broker_is_refilled_from_the_outbox_but_for_bindings(
        own_broker: EmbeddedBroker, engine: AsyncEngine, db_url: str) -> None:
    """Before: only a test called ``replay``; a broker that came back empty stayed empty
    (three topics never recreated, every status and admission gone)."""
    boot = own_broker.bootstrap
    s = settings(boot, db_url, "scheduler")
    await ensure_topics(boot, max_partitions=4)
    producer = Producer(boot, "scheduler")
    await producer.start()
    relay = OutboxRelay(engine, producer, db_url, timedelta(hours=1))
    watch = BrokerWatch(s, engine, producer)
    other = BrokerWatch(settings(boot, db_url, "queueing"), engine, producer)
    resent: list[str] = []

    async def hook() -> None:
        resent.append("scheduler resends its bindings")

    watch.on_new_incarnation(hook)
    assert not await watch.check()  # first look at a new broker: writes its incarnation
    first = watch.incarnation
    async with engine.begin() as conn:
        for i in range(3):
            await add_to_outbox(conn, status("refill", f"s{i}"), "scheduler", f"st-{i}")
        await add_to_outbox(conn, Binding(binding_id="b1", action=BindingAction.ALLOCATE,
                                          node_id="n1", epoch=1, job_id="refill"),
                            "scheduler", "bind-1")
    try:
        assert await relay.publish_pending() == 4
        assert not await watch.check() and watch.incarnation == first and not resent
        restart(own_broker)  # every topic and message gone
        assert await retry_transient(watch.check, "test")  # found empty: topics made, window marked, hook ran
        assert watch.incarnation != first and resent
        assert await relay.publish_pending() == 3  # statuses again, not the binding
        got = await read_all(boot, JOBS_STATUS.name, 3)
        assert sorted(e.id for e in got) == ["st-0", "st-1", "st-2"]
        assert await read_all(boot, BINDINGS.name, 1, timeout=3) == []
        # a second watcher (another service) sees the same incarnation: no second refill
        assert not await other.check() and other.incarnation == watch.incarnation
        async with engine.connect() as conn:
            assert await conn.scalar(text(
                "SELECT count(*) FROM outbox WHERE published_at IS NULL")) == 0
    finally:
        await watch.close()
        await other.close()  # left open, its reader retried the stopped broker all session
        await producer.stop()


@pytest.mark.parametrize("path", ["relay-loop", "stored"])
async def test_a_send_the_dead_broker_took_is_sent_again_after_the_refill(
        own_broker: EmbeddedBroker, engine: AsyncEngine, db_url: str, path: str) -> None:
    """The old broker acknowledges a row, dies, and the refill runs before the relay
    marks the row published. Before: the mark landed after the refill's pass, so the row
    stood published though no broker held it (a job accepted and never queued, seen in
    the chaos slice's broker restart). Now the refill counts rows in flight, the relay's
    mark skips them, and the row goes to the new broker."""
    boot = own_broker.bootstrap
    await ensure_topics(boot, max_partitions=4)
    producer = Producer(boot, "admission")
    await producer.start()
    relay = OutboxRelay(engine, producer, db_url, timedelta(hours=1))
    watch = BrokerWatch(settings(boot, db_url, "admission"), engine, producer)
    send = relay._send

    async def send_then_the_broker_dies(rows):  # type: ignore[no-untyped-def]
        out = await send(rows)  # acknowledged by the broker that is about to die
        restart(own_broker)
        assert await retry_transient(watch.check, "test")  # the refill, before the mark
        return out

    try:
        assert not await watch.check()
        relay._send = send_then_the_broker_dies  # type: ignore[method-assign]
        if path == "relay-loop":
            async with engine.begin() as conn:
                await add_to_outbox(conn, status("race", "accepted"), "admission", "st-race")
            assert await relay.publish_pending() == 1
        else:
            async with relay.exclusive():
                async with engine.begin() as conn:
                    stored = await add_many(conn, [(Envelope.wrap(
                        status("race", "accepted"), "admission", "st-race"), JOBS_STATUS.name)],
                        "admission", notify=False)
                await relay.publish_stored(stored)
        relay._send = send  # type: ignore[method-assign]
        async with engine.connect() as conn:
            row = (await conn.execute(text(
                "SELECT published_at, replays FROM outbox WHERE event_id = 'st-race'"))).one()
        assert (row.published_at, row.replays) == (None, 1)  # still to publish, once more
        assert await relay.publish_pending() == 1
        got = await read_all(boot, JOBS_STATUS.name, 1)
        assert [e.id for e in got] == ["st-race"]  # the new broker has it
    finally:
        await watch.close()
        await producer.stop()


async def test_a_stop_does_not_wait_for_connected_clients(own_broker: EmbeddedBroker) -> None:
    """Tansu exits on SIGTERM only once its clients hang up: a stop while a consumer is
    connected took the full 5 s wait, and made every full restart 5 s slower. The
    memory log keeps nothing worth waiting for. Timed against a stop with no client,
    in the same run (the baseline), never against a fixed figure."""
    import time

    idle = EmbeddedBroker()
    idle.start()
    began = time.monotonic()
    await asyncio.to_thread(idle.stop)
    alone_s = time.monotonic() - began

    consumer = AIOKafkaConsumer(bootstrap_servers=own_broker.bootstrap)
    await consumer.start()
    try:
        await consumer.topics()  # connected
        began = time.monotonic()
        await asyncio.to_thread(own_broker.stop)
        connected_s = time.monotonic() - began
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(consumer.stop(), 5)
    assert own_broker.exited()[0]
    # at most the SIGTERM wait beyond a stop with nobody connected (it was 5 s)
    assert connected_s < alone_s + 2.0, (connected_s, alone_s)
