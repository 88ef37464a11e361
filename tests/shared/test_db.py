"""PostgreSQL: migrations, the transactional outbox and its relay, the leader lease.
Run against the embedded PostgreSQL and, where present, the system's (15+)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from shared.bus import Producer, ensure_topics
from shared.db import make_engine, migrate
from shared.events import Envelope, JobState, JobStatus, utcnow
from shared.leader import LeaderLease
from shared.outbox import OutboxRelay, add_many, add_to_outbox, replay

pytestmark = [pytest.mark.db, pytest.mark.both_pg]
MIGRATIONS = Path(__file__).resolve().parents[2] / "shared" / "migrations" / "versions"


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    e = make_engine(db_url, pool_size=3)
    yield e
    await e.dispose()


async def test_migrations_are_idempotent_and_serialised(engine: AsyncEngine) -> None:
    await asyncio.gather(migrate(engine), migrate(engine))
    async with engine.connect() as conn:
        version = await conn.scalar(text("SELECT version_num FROM alembic_version"))
        server = await conn.scalar(text("SHOW server_version_num"))
        tables = set((await conn.execute(text(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))).scalars())
    newest = max(p.name[:4] for p in MIGRATIONS.glob("[0-9]*.py"))
    assert version == newest == "0018"
    assert int(server) >= 150000
    assert {"jobs", "job_events", "outbox", "queue_jobs", "sched_jobs", "scheduler_leases",
            "api_tokens"} <= tables


async def test_outbox_rolls_back_with_the_business_row(engine: AsyncEngine) -> None:
    with pytest.raises(RuntimeError):
        async with engine.begin() as conn:
            await add_to_outbox(conn, JobStatus(job_id="j", state=JobState.RUNNING, reason=""),
                                "test")
            raise RuntimeError("the business write failed")
    async with engine.connect() as conn:
        assert await conn.scalar(text("SELECT count(*) FROM outbox")) == 0


@pytest.mark.broker
async def test_relay_publishes_in_order_and_replays_after_broker_loss(
        engine: AsyncEngine, db_url: str, broker: str) -> None:
    await ensure_topics(broker)
    job = "relay-" + utcnow().strftime("%H%M%S%f")
    async with engine.begin() as conn:
        for i in range(5):
            await add_to_outbox(conn, JobStatus(job_id=job, state=JobState.RUNNING,
                                                reason=f"r{i}"), "test", event_id=f"{job}-{i}")
    producer = Producer(broker, "test")
    await producer.start()
    relay = OutboxRelay(engine, producer, db_url, replay_window=timedelta(hours=1))
    try:
        assert await relay.publish_pending() == 5
        assert await relay.publish_pending() == 0  # marked published
        # the broker "came back empty": replay the window, consumers dedupe by id
        assert await replay(engine, utcnow() - timedelta(minutes=5)) == 5
        assert await relay.publish_pending() == 5
    finally:
        await producer.stop()
    c = AIOKafkaConsumer("jobs.status", bootstrap_servers=broker,
                         auto_offset_reset="earliest", fetch_max_wait_ms=20)
    await c.start()
    seen: list[str] = []
    try:
        async with asyncio.timeout(15):
            while len(seen) < 10:
                for records in (await c.getmany(timeout_ms=200)).values():
                    seen += [Envelope.decode(r.value or b"").id for r in records
                             if r.key == job.encode()]
    finally:
        await c.stop()
    assert seen == [f"{job}-{i}" for i in range(5)] * 2
    async with engine.connect() as conn:
        assert await conn.scalar(text(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL")) == 0
    assert await relay.purge() == 0  # still inside the replay window


async def _read_ids(broker: str, key: str, want: int) -> list[str]:
    c = AIOKafkaConsumer("jobs.status", bootstrap_servers=broker,
                         auto_offset_reset="earliest", fetch_max_wait_ms=20)
    await c.start()
    seen: list[str] = []
    try:
        async with asyncio.timeout(15):
            while len(seen) < want:
                for records in (await c.getmany(timeout_ms=200)).values():
                    seen += [Envelope.decode(r.value or b"").id for r in records
                             if r.key == key.encode()]
        await asyncio.sleep(0.3)  # and nothing more arrives
        for records in (await c.getmany(timeout_ms=300)).values():
            seen += [Envelope.decode(r.value or b"").id for r in records
                     if r.key == key.encode()]
    finally:
        await c.stop()
    return seen


def _statuses(job: str, ids: range) -> list[tuple[Envelope, str]]:
    return [(Envelope.wrap(JobStatus(job_id=job, state=JobState.RUNNING, reason=f"r{i}"),
                           "mem", f"{job}-{i}"), "jobs.status") for i in ids]


@pytest.mark.broker
async def test_a_commit_is_published_from_memory_in_order_behind_what_was_left(
        engine: AsyncEngine, db_url: str, broker: str) -> None:
    """The scheduler's path: what its transaction stored is sent from memory and marked
    in one statement. Rows left unpublished before it (a send that failed, the last
    leader's) go first, from the table; an id already stored is not sent again."""
    await ensure_topics(broker)
    job = "mem-" + utcnow().strftime("%H%M%S%f")
    producer = Producer(broker, "mem")
    await producer.start()
    relay = OutboxRelay(engine, producer, db_url, source="mem")
    try:
        async with engine.begin() as conn:  # left behind: never published
            left = await add_many(conn, _statuses(job, range(0, 2)), "mem", notify=False)
        assert [r.event_id for r in left.rows] == [f"{job}-0", f"{job}-1"]
        async with relay.exclusive():
            async with engine.begin() as conn:
                stored = await add_many(conn, _statuses(job, range(1, 4)), "mem", notify=False)
            assert stored.behind  # job-0 and job-1 wait in the table
            assert [r.event_id for r in stored.rows] == [f"{job}-2", f"{job}-3"]  # 1 was there
            await relay.publish_stored(stored)
        async with relay.exclusive():
            async with engine.begin() as conn:
                stored = await add_many(conn, _statuses(job, range(4, 6)), "mem", notify=False)
            assert not stored.behind  # all published: this one goes from memory
            await relay.publish_stored(stored)
        assert await relay.publish_pending() == 0  # every row was marked
    finally:
        await producer.stop()
    assert await _read_ids(broker, job, 6) == [f"{job}-{i}" for i in range(6)]


@pytest.mark.broker
async def test_a_commit_whose_send_fails_is_left_to_the_loop(
        engine: AsyncEngine, db_url: str, broker: str) -> None:
    await ensure_topics(broker)
    job = "down-" + utcnow().strftime("%H%M%S%f")
    producer = Producer(broker, "down")
    await producer.start()
    relay = OutboxRelay(engine, producer, db_url, source="down")
    try:
        async with engine.begin() as conn:
            stored = await add_many(conn, _statuses(job, range(3)), "down", notify=False)

        async def broker_away(topic: str, key: str, value: bytes) -> asyncio.Future[object]:
            raise ConnectionError("broker away")

        real, producer.send_future = producer.send_future, broker_away  # type: ignore[method-assign]
        async with relay.exclusive():
            await relay.publish_stored(stored)  # deferred, never raised
        producer.send_future = real  # type: ignore[method-assign]
        assert await relay.pending() == 3
        assert await relay.publish_pending() == 3  # the loop's next turn
    finally:
        await producer.stop()
    assert await _read_ids(broker, job, 3) == [f"{job}-{i}" for i in range(3)]


async def test_second_scheduler_waits_and_takes_over_with_a_higher_epoch(db_url: str) -> None:
    a = LeaderLease(db_url, "a")
    b = LeaderLease(db_url, "b")
    assert await a.acquire() == 1
    waiting = asyncio.create_task(b.acquire(poll_s=0.05))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # b stands by while a leads
    assert await a.still_leader()
    await a.release()  # a dies: its connection, and so its lock, is gone
    assert await asyncio.wait_for(waiting, 10) == 2
    assert not await a.still_leader()
    await b.release()


async def test_a_leader_that_reconnects_keeps_its_lease(db_url: str) -> None:
    """Found by `make chaos-loaded`: a renewal that timed out under load made the leader
    reconnect; its lease still named the old session, so a standby took over at once
    from a live, renewing leader (which then stopped). A renewal now names its session."""
    leader = LeaderLease(db_url, "leader", ttl_s=60.0)
    assert await leader.acquire() == 1
    assert leader._conn is not None
    leader._conn.terminate()  # its session is cut: the next renewal opens another
    assert await leader.still_leader()
    standby = LeaderLease(db_url, "standby", ttl_s=60.0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(standby.acquire(poll_s=0.05), 1.5)
    assert await leader.still_leader()
    await leader.release()
    assert await asyncio.wait_for(standby.acquire(poll_s=0.05), 10) == 2
    await standby.release()


async def test_a_paused_leader_loses_its_lease_and_a_dead_one_at_once(db_url: str) -> None:
    """Before: the lease was an advisory lock held by the leader's connection, so a leader
    paused (SIGSTOP) kept it forever and no standby could take over. Now it expires; and a
    leader whose session is gone (killed) is replaced without waiting for the expiry."""
    paused = LeaderLease(db_url, "paused", ttl_s=1.0)
    assert await paused.acquire() == 1
    standby = LeaderLease(db_url, "standby", ttl_s=60.0)
    # `paused` renews nothing from here on: its lease runs out, the standby takes it
    assert await asyncio.wait_for(standby.acquire(poll_s=0.05), 20) == 2
    assert not await paused.still_leader()  # resumed: it finds it lost the lease
    assert standby._conn is not None
    standby._conn.terminate()  # killed: its session ends, its lease does not yet expire
    third = LeaderLease(db_url, "third", ttl_s=60.0)
    assert await asyncio.wait_for(third.acquire(poll_s=0.05), 20) == 3
    await third.release()
    await paused.release()
