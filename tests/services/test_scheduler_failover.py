"""The scheduler across leader changes, cancels and node losses: what it decided is
stored with its events in one transaction, so a kill between the commit and the publish
loses nothing; replays and late commands never rewrite what ended.

Real PostgreSQL (and the real broker where events are read back)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from scheduling import first_fit
from services.scheduler.main import LeadershipLost, SchedulerService
from services.scheduler.state import Output, SchedulerState
from shared.bus import Consumer, ConsumerOptions, Producer, ensure_topics
from shared.config import CommonSettings
from shared.db import make_engine
from shared.events import (
    CommandAction,
    Envelope,
    JobCommand,
    JobState,
    JobStatus,
    NodeLost,
    utcnow,
)
from shared.topics import JOBS_STATUS
from tests.services.builders import node, ready, step
from tests.shared.test_bus import consume_until

pytestmark = [pytest.mark.db, pytest.mark.both_pg]


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    e = make_engine(db_url, pool_size=3)
    yield e
    await e.dispose()


def service(engine: AsyncEngine, db_url: str, epoch: int,
            producer: Producer | None = None) -> SchedulerService:
    rt = SimpleNamespace(producer=producer, settings=CommonSettings(database_url=db_url))
    return SchedulerService(rt, engine, SchedulerState(epoch, first_fit))  # type: ignore[arg-type]


def task_done(job: str, task: str, state: JobState, node_id: str) -> JobStatus:
    return JobStatus(job_id=job, state=state, reason="agent", attempt=1, task=task,
                     node_id=node_id)


async def store_only(svc: SchedulerService, *events: object) -> Output:
    """Handle, cycle and commit, then 'die' before the publish."""
    for ev in events:
        svc.state.handle(ev, svc.out)  # type: ignore[arg-type]
    if svc.state.needs_cycle:
        svc.state.cycle(0.0, svc.out)
    out, svc.out = svc.out, Output()
    await svc.persist(out)
    return out


async def job_statuses(broker: str, job: str, want: int) -> list[str]:
    c = AIOKafkaConsumer(JOBS_STATUS.name, bootstrap_servers=broker,
                         auto_offset_reset="earliest", fetch_max_wait_ms=20)
    await c.start()
    seen: list[str] = []
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(20):
                while len(seen) < want:
                    for records in (await c.getmany(timeout_ms=200)).values():
                        for r in records:
                            env = Envelope.decode(r.value or b"")
                            if env.key == job and env.data.get("task") is None:
                                seen.append(env.data["state"])
    finally:
        await c.stop()
    return seen


@pytest.mark.broker
async def test_a_leader_killed_after_storing_a_job_end_has_it_published_by_the_next(
        engine: AsyncEngine, db_url: str, broker: str) -> None:
    """Before: the task's `succeeded` was stored, the leader died before publishing the
    job's `succeeded`, and a new leader only resent bindings of bound jobs: the job stayed
    `running` forever, holding its quota."""
    job = "J-" + utcnow().strftime("%H%M%S%f")
    first = service(engine, db_url, epoch=1)
    await store_only(first, node("n1"), ready(job).gpus(2).build())
    task = first.state.jobs[job].placed[0].task_id
    await store_only(first, task_done(job, task, JobState.RUNNING, "n1"))
    out = await store_only(first, task_done(job, task, JobState.SUCCEEDED, "n1"))
    assert (job, "succeeded") in [(e.key, e.data["state"]) for e, t in out.events
                                  if t == JOBS_STATUS.name]

    producer = Producer(broker, "scheduler")
    await producer.start()
    try:
        nxt = service(engine, db_url, epoch=2, producer=producer)
        await nxt.load()
        assert job in nxt.state.finished
        await nxt.relay.flush()  # what the last leader stored but never published
        assert await nxt.relay.pending() == 0
    finally:
        await producer.stop()
    assert await job_statuses(broker, job, 3) == ["bound", "running", "succeeded"]


def test_a_cancel_after_the_job_ended_changes_nothing() -> None:
    """Before: a cancel of an ended (evicted) job wrote a cancelled placeholder over its
    row, attempt 0."""
    s = SchedulerState(1, first_fit)
    step(s, node("n1"), ready("J").gpus(1).build())
    task = s.jobs["J"].placed[0].task_id
    step(s, task_done("J", task, JobState.SUCCEEDED, "n1"))
    s.evict_finished()
    assert "J" in s.finished and "J" not in s.jobs
    out = step(s, JobCommand(job_id="J", action=CommandAction.CANCEL))
    assert out.events == [] and out.dirty_jobs == set() and "J" not in s.jobs


async def test_a_cancel_stored_before_its_job_arrived_still_cancels_it_after_a_restart(
        engine: AsyncEngine, db_url: str) -> None:
    """Before: the placeholder a cancel left was loaded as a finished job, so the job's
    admission after a restart was dropped as a replay and it stayed `admitted`."""
    first = service(engine, db_url, epoch=1)
    await store_only(first, node("n1"), JobCommand(job_id="C", action=CommandAction.CANCEL))
    nxt = service(engine, db_url, epoch=2)
    await nxt.load()
    assert "C" not in nxt.state.finished and nxt.state.jobs["C"].ready is None
    out = step(nxt.state, ready("C").build())
    assert [(e.key, e.data["state"]) for e, t in out.events if t == JOBS_STATUS.name] == [
        ("C", "cancelled")]


def test_a_lost_node_requeues_without_spending_the_jobs_retries() -> None:
    """Before: every node loss spent a retry; the monitor declaring nodes lost failed
    jobs "out of retries" that had never failed themselves."""
    s = SchedulerState(1, first_fit)
    step(s, node("n1"), node("n2"), ready("J").gpus(1).retries(0).build())
    where = s.jobs["J"].placed[0].node_id
    out = step(s, NodeLost(node_id=where, last_seen=utcnow()))
    states = [e.data["state"] for e, t in out.events if t == JOBS_STATUS.name]
    assert "failed" not in states and "admitted" in states
    assert s.jobs["J"].attempt == 2 and s.jobs["J"].node_losses == 1
    assert s.jobs["J"].placed[-1].node_id != where  # placed again elsewhere
    # its own failure still counts: maxRetry 0 means this one ends it
    task = s.jobs["J"].current()[0]
    out = step(s, JobStatus(job_id="J", state=JobState.FAILED, reason="exit 1", attempt=2,
                            task=task.task_id, node_id=task.node_id, exit_code=1))
    assert "failed" in [e.data["state"] for e, t in out.events if t == JOBS_STATUS.name]


async def test_a_leader_that_lost_its_lease_stores_nothing(engine: AsyncEngine,
                                                           db_url: str) -> None:
    """A leader paused past its lease while another took over must not write a decision
    when it resumes (its bindings would be refused by the agents, its rows would not)."""
    old = service(engine, db_url, epoch=1)
    async with engine.begin() as conn:
        await conn.execute(text("INSERT INTO scheduler_leases (name, epoch, holder, acquired_at)"
                                " VALUES ('scheduler', 2, 'new', now())"))
    with pytest.raises(LeadershipLost):
        await store_only(old, node("n1"), ready("S").build())
    async with engine.connect() as conn:
        assert await conn.scalar(text("SELECT count(*) FROM sched_jobs")) == 0
        assert await conn.scalar(text(
            "SELECT count(*) FROM outbox WHERE source = 'scheduler'")) == 0


async def test_rows_keep_the_node_loss_count(engine: AsyncEngine, db_url: str) -> None:
    s = service(engine, db_url, epoch=1)
    await store_only(s, node("n1"), node("n2"), ready("L").gpus(1).build())
    where = s.state.jobs["L"].placed[0].node_id
    await store_only(s, NodeLost(node_id=where, last_seen=utcnow()))
    async with engine.connect() as conn:
        meta = await conn.scalar(text("SELECT tasks FROM sched_jobs WHERE job_id = 'L'"))
    meta = meta if isinstance(meta, dict) else json.loads(meta)
    assert meta["node_losses"] == 1
    nxt = service(engine, db_url, epoch=2)
    await nxt.load()
    assert nxt.state.jobs["L"].node_losses == 1


def test_a_task_its_agent_fenced_requeues_without_spending_the_jobs_retries() -> None:
    """An agent that could not renew its lease stops its tasks and reports them `failed`
    with a `fenced:` reason: its node is as good as lost, the job is not to blame."""
    s = SchedulerState(1, first_fit)
    step(s, node("n1"), node("n2"), ready("F").gpus(1).retries(0).build())
    p = s.jobs["F"].placed[0]
    out = step(s, JobStatus(job_id="F", state=JobState.FAILED, attempt=1, task=p.task_id,
                            node_id=p.node_id, reason="fenced: lease not renewed for 7s"))
    states = [e.data["state"] for e, t in out.events if t == JOBS_STATUS.name]
    assert "failed" not in states and "admitted" in states and s.jobs["F"].node_losses == 1


@pytest.mark.broker
async def test_a_leader_resumed_past_its_lease_leaves_its_batch_for_the_next(
        engine: AsyncEngine, db_url: str, broker: str) -> None:
    """A leader paused past its lease resumes holding its partitions for a moment and
    reads task ends of jobs the new leader placed: unknown to it, they store nothing, so
    the write fence never fired and it committed them; the new leader never read them
    and the jobs stayed running (seen in `make chaos`, pause_scheduler_leader_past_lease:
    12 jobs). Now the batch is not committed: the next member of the group reads it."""
    await ensure_topics(broker, max_partitions=4)
    settings = CommonSettings(service_name="scheduler", kafka_bootstrap=broker, database_url=db_url,
                              retry_backoff_s=0.01, session_timeout_ms=6000,
                              heartbeat_interval_ms=500, rebalance_timeout_ms=6000)
    producer = Producer(broker, "agent")
    await producer.start()
    group = "fence-" + uuid.uuid4().hex[:8]
    job = "placed-by-new-" + uuid.uuid4().hex[:8]
    try:
        await producer.publish(task_done(job, "w-0", JobState.SUCCEEDED, "n1"))
        old = service(engine, db_url, epoch=1, producer=producer)
        old.lease_valid = lambda: False  # resumed past its lease, by its own clock
        stale = Consumer(settings, ConsumerOptions(group, [JOBS_STATUS.name]), old.handle,
                         producer, on_batch_end=old.flush)
        await stale.start()
        try:
            with pytest.raises(LeadershipLost):
                await asyncio.wait_for(stale.run(), 60)
        finally:
            await stale.stop()
        seen: list[str] = []

        async def record(env: object, event: object) -> None:
            if isinstance(event, JobStatus) and event.job_id == job:
                seen.append(event.job_id)

        await consume_until(Consumer(settings, ConsumerOptions(group, [JOBS_STATUS.name]), record,
                                     producer), lambda: bool(seen), timeout=60)
        assert seen == [job]
    finally:
        await producer.stop()
