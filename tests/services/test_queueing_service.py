"""The queueing service against real PostgreSQL and the real broker: quota admission,
borrowing and lending limits, reclaim, closed and draining queues, admin commands, a
restart that keeps the order, and every waiting job explained.

The service's handlers are called with events as its consumer would call them; what it
publishes goes to the real broker and is also recorded here to check it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission.queues_view import refusal_status
from services.queueing.config import OrderingSpec, parse_queues
from services.queueing.service import Queueing
from shared.bus import Producer
from shared.db import make_engine
from shared.events import (
    CommandAction,
    Envelope,
    Event,
    JobCommand,
    JobReady,
    JobState,
    JobStatus,
    JobSubmitted,
    QueueAction,
    QueueChanged,
    QueueCommand,
    QueueRefusal,
    QueueStatus,
    utcnow,
)
from shared.jobspec import parse_job_spec
from shared.queuespec import QueueSpec

pytestmark = [pytest.mark.db, pytest.mark.broker]

TREE = {
    "cohorts": [{"name": "cluster"}],
    "queues": [
        {"name": "vision", "cohort": "cluster", "tenant": "vision", "guaranteed": {"gpus": 4},
         "borrowing_limit": {"gpus": 2}},
        {"name": "nlp", "cohort": "cluster", "tenant": "nlp", "guaranteed": {"gpus": 4},
         "lending_limit": {"gpus": 2}},
    ],
}
SOLO = {"queues": [{"name": "solo", "guaranteed": {"gpus": 4}}]}


class Recording(Producer):
    """The real producer (to the real broker), remembering what it sent."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(bootstrap, "queueing")
        self.sent: list[Event] = []

    async def send_future(self, topic: str, key: str, value: bytes) -> asyncio.Future[Any]:
        """What queueing's outbox relay sends, after each commit."""
        self.sent.append(Envelope.decode(value).payload())
        return await super().send_future(topic, key, value)

    def of(self, kind: type[Event]) -> list[Any]:
        return [e for e in self.sent if isinstance(e, kind)]


@dataclass
class World:
    engine: AsyncEngine
    producer: Recording
    q: Queueing
    now: list[float] = field(default_factory=lambda: [1_000_000.0])
    seq: int = 0

    async def restart(self, tree: dict[str, Any] | None = None,
                      ordering: OrderingSpec | None = None) -> None:
        ordering_spec, specs = parse_queues(tree if tree is not None else TREE)
        self.q = Queueing(self.producer, self.engine, ordering or ordering_spec,
                          clock=lambda: self.now[0])
        await self.q.start(specs)

    async def submit(self, queue: str, gpus: int = 1, priority_class: str = "normal",
                     estimate: float | None = None, name: str | None = None) -> str:
        self.seq += 1
        job_id = name or f"j{self.seq:03d}"
        spec: dict[str, Any] = {"name": job_id, "queue": queue, "priorityClass": priority_class,
                                "tasks": [{"name": "w", "resources": {"gpu": gpus}}]}
        if estimate is not None:
            spec["runtimeEstimate"] = estimate
        sub = JobSubmitted(job_id=job_id, queue=queue, tenant="t", user="u",
                           spec=parse_job_spec(spec), submitted_at=utcnow())
        await self.q.handle_batch([(Envelope.wrap(sub, "admission"), sub)])
        return job_id

    async def status(self, job_id: str, state: JobState, attempt: int = 1) -> None:
        st = JobStatus(job_id=job_id, state=state, reason="test", attempt=attempt)
        await self.q.handle_batch([(Envelope.wrap(st, "scheduler"), st)])

    def ready(self) -> list[str]:
        return [e.job_id for e in self.producer.of(JobReady)]

    def last_status(self, queue: str) -> QueueStatus:
        return [s for s in self.producer.of(QueueStatus) if s.queue == queue][-1]

    async def state_of(self, job_id: str) -> str:
        async with self.engine.connect() as conn:
            return str(await conn.scalar(text("SELECT state FROM queue_jobs WHERE job_id = :j"),
                                         {"j": job_id}))


@pytest.fixture
async def world(db_url: str, broker: str) -> AsyncIterator[World]:
    engine = make_engine(db_url, pool_size=3)
    producer = Recording(broker)
    await producer.start()
    w = World(engine, producer, None)  # type: ignore[arg-type]
    await w.restart()
    yield w
    await producer.stop()
    await engine.dispose()


async def test_jobs_are_admitted_only_within_quota_and_the_rest_explained(world: World) -> None:
    jobs = [await world.submit("nlp") for _ in range(10)]
    await world.q.cycle()
    assert world.ready() == jobs[:8]  # its own 4 GPUs and the 4 vision lends
    waiting = world.last_status("nlp").waiting
    assert [(w.job_id, w.position, w.reason) for w in waiting] == [
        (jobs[8], 1, "quota"), (jobs[9], 2, "quota")]
    assert "cohort has nothing left to lend" in waiting[0].detail
    pending = [e for e in world.producer.of(JobStatus) if e.state is JobState.PENDING]
    assert {e.job_id for e in pending} == set(jobs[8:])  # their history says why
    st = world.last_status("nlp")
    assert st.used["gpus"] == 8 and st.borrowed["gpus"] == 4 and st.pending == 2
    # a job that ends gives its GPU back: the next one starts
    await world.status(jobs[0], JobState.RUNNING)
    await world.q.cycle()
    assert world.last_status("nlp").running == 1
    await world.status(jobs[0], JobState.SUCCEEDED)
    await world.q.cycle()
    assert world.ready() == jobs[:9]
    assert world.last_status("nlp").running == 0 and world.last_status("nlp").pending == 1


async def test_borrowing_stops_at_the_borrowing_limit_and_the_lending_limit(world: World) -> None:
    # vision may borrow 2 above its 4; nlp lends at most 2 of its 4
    jobs = [await world.submit("vision") for _ in range(8)]
    await world.q.cycle()
    assert world.ready() == jobs[:6]
    st = world.last_status("vision")
    assert st.used["gpus"] == 6 and st.borrowed["gpus"] == 2
    assert "over borrowing limit" in st.waiting[0].detail
    admitted = [e for e in world.producer.of(JobStatus) if e.state is JobState.ADMITTED]
    assert sum("borrowing" in e.reason for e in admitted) == 2
    # with a higher borrowing limit, nlp's lending limit is what stops it
    await world.restart({**TREE, "queues": [{**TREE["queues"][0], "borrowing_limit": {
        "gpus": 8}}, TREE["queues"][1]]})
    await world.q.cycle()
    assert world.ready() == jobs[:6]  # still 6: nlp lends only 2
    assert "cohort has nothing left to lend" in world.last_status("vision").waiting[0].detail


async def test_a_queue_reclaims_its_guarantee_from_borrowers(world: World) -> None:
    tree = {**TREE, "queues": [TREE["queues"][0], {**TREE["queues"][1], "lending_limit": {
        "gpus": 4}}]}
    await world.restart(tree)
    borrowed = [await world.submit("vision", priority_class=c) for c in
                ("high", "low", "normal", "normal", "normal", "normal")]
    await world.q.cycle()
    assert sorted(world.ready()) == borrowed  # 4 own + 2 borrowed from nlp (low class last)
    mine = [await world.submit("nlp") for _ in range(4)]
    await world.q.cycle()
    assert world.ready()[6:] == mine[:2]  # nlp's 2 GPUs nobody borrowed, at once
    preempts = world.producer.of(JobCommand)
    assert all(c.action is CommandAction.PREEMPT for c in preempts)
    # the least valuable borrowers go: low class first, then the last admitted
    assert [c.job_id for c in preempts] == [borrowed[1], borrowed[5]]
    assert "quota reclaimed" in preempts[0].reason
    assert {w.reason for w in world.last_status("nlp").waiting} == {"reclaim"}
    await world.q.cycle()
    assert len(world.producer.of(JobCommand)) == 2  # not asked twice
    # the victims stop: they go back to their queue, and nlp gets its GPUs
    for v in (borrowed[1], borrowed[5]):
        await world.status(v, JobState.PREEMPTED)
        assert await world.state_of(v) == "queued"
    await world.q.cycle()
    assert world.ready()[-2:] == mine[2:]
    requeued = [e for e in world.producer.of(JobStatus) if e.state is JobState.PENDING
                and e.reason.startswith("requeued")]
    assert {(e.job_id, e.attempt) for e in requeued} == {(borrowed[1], 2), (borrowed[5], 2)}
    vision = world.last_status("vision")
    assert vision.used["gpus"] == 4 and {w.job_id for w in vision.waiting} == {
        borrowed[1], borrowed[5]}
    # when nlp's work ends, the requeued jobs are admitted again with a new attempt
    for j in mine:
        await world.status(j, JobState.SUCCEEDED)
    await world.q.cycle()
    again = [e for e in world.producer.of(JobReady) if e.attempt == 2]
    assert {e.job_id for e in again} == {borrowed[1], borrowed[5]}


async def test_closed_queues_admit_nothing_and_draining_ones_run_what_they_hold(
        world: World) -> None:
    jobs = [await world.submit("nlp") for _ in range(2)]
    close = QueueCommand(request_id="r1", queue="nlp", action=QueueAction.CLOSE)
    await world.q.handle_batch([(Envelope.wrap(close, "admission"), close)])
    await world.q.cycle()
    assert world.ready() == []
    assert {(w.reason, w.position) for w in world.last_status("nlp").waiting} == {
        ("queue_closed", 1), ("queue_closed", 2)}
    drain = QueueCommand(request_id="r2", queue="nlp", action=QueueAction.DRAIN)
    await world.q.handle_batch([(Envelope.wrap(drain, "admission"), drain)])
    await world.q.cycle()
    assert world.ready() == jobs  # draining: what it holds still runs
    changes = [(c.change, c.request_id) for c in world.producer.of(QueueChanged) if c.request_id]
    assert changes == [("closed", "r1"), ("draining", "r2")]
    # a replayed command is not applied twice; a repeated one is refused
    await world.q.handle_batch([(Envelope.wrap(drain, "admission"), drain)])
    again = QueueCommand(request_id="r3", queue="nlp", action=QueueAction.DRAIN)
    await world.q.handle_batch([(Envelope.wrap(again, "admission"), again)])
    answers = [c for c in world.producer.of(QueueChanged) if c.request_id in ("r2", "r3")]
    assert [(c.change, c.error) for c in answers] == [
        ("draining", ""), ("rejected", "queue nlp is already draining")]


async def test_admin_commands_are_validated_and_survive_a_restart(world: World) -> None:
    async def command(rid: str, action: QueueAction, queue: str, **settings: Any) -> QueueChanged:
        cmd = QueueCommand(request_id=rid, queue=queue, action=action, settings=settings)
        await world.q.handle_batch([(Envelope.wrap(cmd, "admission"), cmd)])
        return next(c for c in world.producer.of(QueueChanged) if c.request_id == rid)

    bad = await command("a", QueueAction.CREATE, "cv", parent="nowhere")
    assert bad.change == "rejected" and "unknown queue or cohort 'nowhere'" in bad.error
    assert bad.refusal == QueueRefusal.INVALID and refusal_status(bad) == 422
    bad = await command("b", QueueAction.CREATE, "cv", guaranteed={"gpus": -1})
    assert "guaranteed.gpus" in bad.error
    assert (await command("c", QueueAction.CREATE, "nlp")).error == "queue nlp already exists"
    missing = await command("d", QueueAction.UPDATE, "nope", weight=2)
    assert missing.refusal == QueueRefusal.NOT_FOUND and refusal_status(missing) == 404
    made = await command("e", QueueAction.CREATE, "cv", parent="cluster", tenant="vision",
                         guaranteed={"gpus": 2})
    assert made.change == "created" and made.settings["effective_tenant"] == "vision"
    bad = await command("f", QueueAction.UPDATE, "nlp", guaranteed={"gpus": 1})
    assert bad.error == "nlp.lending_limit.gpus: 2 exceeds the guaranteed 1"
    upd = await command("g", QueueAction.UPDATE, "nlp", guaranteed={"gpus": 3})
    assert upd.change == "updated" and upd.settings["guaranteed"] == {"gpus": 3.0}
    assert upd.settings["lending_limit"] == {"gpus": 2.0}  # the fields not named stay
    await world.restart()  # the same file: the API's changes stand
    assert world.q.tree.specs["nlp"].guaranteed.gpus == 3  # type: ignore[union-attr]
    assert "cv" in world.q.tree.specs
    # an edit of the file's entry wins over the API's change
    tree = {**TREE, "queues": [TREE["queues"][0], {**TREE["queues"][1],
                                                   "guaranteed": {"gpus": 5}}]}
    await world.restart(tree)
    assert world.q.tree.specs["nlp"].guaranteed.gpus == 5  # type: ignore[union-attr]


async def test_a_restart_keeps_the_order_and_loses_nothing(world: World) -> None:
    # a top-level queue with no cohort: exactly its 4 GPUs
    await world.restart(SOLO, OrderingSpec(policy="fifo"))
    jobs = [await world.submit("solo") for _ in range(4)]
    jobs += [await world.submit("solo", priority_class="urgent") for _ in range(2)]
    await world.q.cycle()
    first = world.ready()
    assert first == jobs[:4]
    before = [w.job_id for w in world.last_status("solo").waiting]
    world.producer.sent.clear()
    await world.restart(SOLO, OrderingSpec(policy="fifo"))
    await world.q.cycle()
    assert world.ready() == []  # nothing released twice
    assert [w.job_id for w in world.last_status("solo").waiting] == before == jobs[4:]
    # with the priority policy, urgent work goes first, in arrival order among equals
    await world.restart(SOLO, OrderingSpec(policy="priority"))
    more = [await world.submit("solo") for _ in range(2)]
    await world.q.cycle()
    assert [w.job_id for w in world.last_status("solo").waiting] == jobs[4:] + more
    for j in jobs[:4]:
        await world.status(j, JobState.SUCCEEDED)
    await world.q.cycle()
    assert world.ready() == jobs[4:] + more[:2]


async def test_cancel_while_queued_and_estimated_start(world: World) -> None:
    await world.restart(SOLO)
    running = [await world.submit("solo", estimate=600) for _ in range(4)]
    await world.q.cycle()
    for j in running:
        await world.status(j, JobState.RUNNING)
    later = await world.submit("solo", gpus=2)
    gone = await world.submit("solo")
    await world.q.cycle()
    w = world.last_status("solo").waiting[0]
    # two of the running jobs must end first: 600 s after they started
    assert w.job_id == later and w.estimated_start == datetime.fromtimestamp(1_000_600, UTC)
    cancel = JobCommand(job_id=gone, action=CommandAction.CANCEL, reason="cancelled by user")
    await world.q.handle_batch([(Envelope.wrap(cancel, "admission"), cancel)])
    assert await world.state_of(gone) == "cancelled"
    assert any(e.job_id == gone and e.state is JobState.CANCELLED
               for e in world.producer.of(JobStatus))
    await world.q.cycle()
    assert [w.job_id for w in world.last_status("solo").waiting] == [later]


async def test_unknown_queues_fail_the_job_and_the_default_queue_is_unlimited(
        world: World) -> None:
    lost = await world.submit("ghost")
    assert any(e.job_id == lost and e.state is JobState.FAILED and "no queue ghost" in e.reason
               for e in world.producer.of(JobStatus))
    jobs = [await world.submit("default", gpus=8) for _ in range(5)]
    await world.q.cycle()
    assert world.ready() == jobs
    assert isinstance(world.q.tree.specs["default"], QueueSpec)


async def test_two_replicas_share_the_intake_and_never_admit_past_the_quota(
        world: World) -> None:
    """Each replica stores what its partitions bring; decisions per tree are taken by one
    replica at a time (advisory lock), so concurrent cycles never exceed the quota and
    never release a job twice."""
    await world.restart(SOLO)
    other = Queueing(world.producer, world.engine, OrderingSpec(), clock=lambda: world.now[0])
    await other.start(parse_queues(SOLO)[1])
    first, second = world.q, other
    for i in range(10):
        world.q = first if i % 2 else second  # alternate which replica stores the job
        await world.submit("solo")
    world.q = first
    await asyncio.gather(first.cycle(), second.cycle(), first.cycle(), second.cycle())
    assert len(world.ready()) == len(set(world.ready())) == 4
    assert world.last_status("solo").used["gpus"] == 4
    for j in world.ready()[:2]:
        await second.handle_batch([(Envelope.wrap(st, "scheduler"), st) for st in [
            JobStatus(job_id=j, state=JobState.SUCCEEDED, reason="test")]])
    await asyncio.gather(first.cycle(), second.cycle())
    assert len(world.ready()) == len(set(world.ready())) == 6


def test_the_gateway_answers_each_refusal_with_its_status() -> None:
    def rejected(**kw: Any) -> QueueChanged:
        return QueueChanged(queue="q", change="rejected", error="no", **kw)

    assert [refusal_status(rejected(refusal=r)) for r in QueueRefusal] == [404, 409, 409, 422]
    # a queueing replica from before the typed refusal sent the status itself
    assert refusal_status(rejected(settings={"status": 404})) == 404
    assert refusal_status(rejected()) == 409
