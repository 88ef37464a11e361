"""The forecaster's round: the scheduler's persisted rows (written by the scheduler's own
``persist``, on real PostgreSQL) into the snapshot its next cycle would see, durations
learnt from finished rows, a forecast for every waiting job, what-ifs, and which
forecasts are published again."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from scheduling import JobRequest, Scheduler, SchedulerConfig
from scheduling.estimates import DurationHistory
from services.scheduler.forecaster.load import RowReader, read_queued, snapshot_of
from services.scheduler.forecaster.publish import Publisher
from services.scheduler.forecaster.round import forecast_round, what_if
from services.scheduler.main import SchedulerService
from services.scheduler.model import Output
from services.scheduler.state import SchedulerState
from shared.config import CommonSettings
from shared.db import make_engine
from shared.events import JobForecast, JobState, JobStatus, JobSubmitted, WaitReason
from shared.job_request import job_request
from shared.jobspec import parse_job_spec
from tests.services.builders import node, ready

pytestmark = pytest.mark.db
CONFIG = SchedulerConfig.preset("default")


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    e = make_engine(db_url, pool_size=3)
    yield e
    await e.dispose()


def leader(engine: AsyncEngine, db_url: str) -> SchedulerService:
    rt = SimpleNamespace(producer=None, settings=CommonSettings(database_url=db_url))
    return SchedulerService(rt, engine, SchedulerState(1, Scheduler(CONFIG).schedule))  # type: ignore[arg-type]


async def store(svc: SchedulerService, *events: object, now: float) -> None:
    """What the leader does with a batch, up to its commit."""
    for ev in events:
        svc.state.handle(ev, svc.out)  # type: ignore[arg-type]
    if svc.state.needs_cycle:
        svc.state.cycle(now, svc.out)
    out, svc.out = svc.out, Output()
    await svc.persist(out)


async def busy_cluster(engine: AsyncEngine, db_url: str, now: float) -> SchedulerService:
    """Two 8-GPU nodes full for 50 s (with jobs the policy may not preempt); three jobs
    waiting behind them."""
    svc = leader(engine, db_url)
    await store(svc, node("n1"), node("n2"), ready("run1").gpus(8).estimate(300).not_preemptible().build(),
                ready("run2").gpus(8).estimate(900).not_preemptible().build(), now=now - 50)
    await store(svc, ready("w1").gpus(8).estimate(600).build(),
                ready("w2").gpus(4).replicas(4).estimate(60).build(),
                ready("w3").gpus(2).build(), now=now)
    return svc


async def test_every_waiting_job_of_the_leaders_rows_gets_a_forecast(
        engine: AsyncEngine, db_url: str) -> None:
    now = time.time()
    svc = await busy_cluster(engine, db_url, now)
    async with engine.connect() as conn:
        rows = await RowReader().read(conn)
    snap, who = snapshot_of(rows, now)
    # the leader's own snapshot of the same state: the same jobs, nodes and allocations
    mine = svc.state.snapshot(now)
    assert [j.job_id for j in snap.pending] == [j.job_id for j in mine.pending] == ["w1", "w2", "w3"]
    assert {(r.job.job_id, r.start_time) for r in snap.running} == {
        (r.job.job_id, r.start_time) for r in mine.running}
    assert set(snap.allocations) == set(mine.allocations)
    assert sorted(snap.nodes, key=lambda n: n.node_id) == sorted(mine.nodes, key=lambda n: n.node_id)

    out = forecast_round(CONFIG, snap, who, DurationHistory())
    assert set(out) == {"w1", "w2", "w3"}
    for f in out.values():
        assert f.queue == "default" and f.tenant == "t" and f.as_of == now
        assert f.start is not None and f.finish is not None and f.start > now
        assert f.start_low is not None and f.start_high is not None
        assert f.start_low <= f.start <= f.start_high
        assert f.nodes and set(f.nodes) <= {"n1", "n2"}
    # nothing starts before run1 ends (300 s estimate, 50 s run), and the first start then
    # is on its node; w2 needs both nodes, so it waits for run2 (900 s) too
    first = min(out.values(), key=lambda f: f.start or 0)
    assert first.start == pytest.approx(now + 250)
    assert first.nodes == [svc.state.jobs["run1"].placed[0].node_id]
    w2 = out["w2"]
    assert w2.start is not None and w2.start >= now + 850 and w2.nodes == ["n1", "n2"]
    assert all(f.reason is not None for f in out.values())


async def test_durations_are_learnt_from_succeeded_rows(engine: AsyncEngine, db_url: str) -> None:
    now = time.time()
    svc = leader(engine, db_url)
    nodes = [node(f"n{i}") for i in range(5)]
    await store(svc, *nodes, *[ready(f"old{i}").gpus(8).tenant("lab").build() for i in range(5)],
                now=now - 200)  # five jobs of the lab, 8 GPUs each, placed at now - 200
    reader = RowReader()
    async with engine.connect() as conn:
        assert len((await reader.read(conn)).jobs) == 5  # the leader's start-up read
    for i in range(5):
        job = f"old{i}"
        task = svc.state.jobs[job].placed[0].task_id
        for state in (JobState.RUNNING, JobState.SUCCEEDED):
            await store(svc, JobStatus(job_id=job, state=state, reason="agent", attempt=1,
                                       task=task, node_id=f"n{i}"), now=now - 200)
    async with engine.begin() as conn:  # their ends stored 120 s after they were placed
        await conn.execute(text("UPDATE sched_jobs SET updated_at = to_timestamp(:t)"), {"t": now - 80})
    async with engine.connect() as conn:
        assert (await reader.read(conn)).jobs == []  # they left: looked up by id, learnt
        await reader.read(conn)
    assert len(reader.history.every) == 5  # once each
    assert reader.history.estimate("lab", 8) == pytest.approx(120)
    restarted = RowReader()  # a new process learns them from the newest succeeded rows
    async with engine.connect() as conn:
        await restarted.read(conn)
    assert restarted.history.every == reader.history.every
    # later jobs of that tenant and size are expected to run that long: five are placed
    # at once, the sixth starts when they end
    await store(svc, *[ready(f"a{i}").gpus(8).tenant("lab").build() for i in range(6)], now=now)
    async with engine.connect() as conn:  # the requests estimated as the leader's are
        snap, who = snapshot_of(await reader.read(conn), now, reader.history)
    assert [(j.job_id, j.runtime_estimate_s, j.runtime_samples) for j in snap.pending] == [
        ("a5", pytest.approx(120), pytest.approx((120,) * 5))]
    out = forecast_round(CONFIG, snap, who, reader.history)
    assert set(out) == {"a5"}
    assert out["a5"].start == pytest.approx(now + 120)
    assert out["a5"].finish == pytest.approx(now + 240)


async def research_queue(conn: AsyncConnection) -> None:
    """Queue research of tenant lab, which may hold 8 GPUs (as queueing stores it)."""
    await conn.execute(text("INSERT INTO queues (name, config, source) VALUES"
                            " ('research', CAST(:c AS jsonb), 'api')"),
                       {"c": json.dumps({"name": "research", "tenant": "lab", "guaranteed": {"gpus": 8}})})


def submitted(job_id: str, gpus: int, estimate: float) -> str:
    """queue_jobs.event: the JobSubmitted queueing stored."""
    spec = parse_job_spec({"name": job_id, "queue": "research", "runtimeEstimate": estimate,
                           "tasks": [{"name": "w", "resources": {"gpu": gpus}}]})
    return JobSubmitted(job_id=job_id, queue="research", tenant="lab", user="u", spec=spec,
                        submitted_at=datetime.now(UTC)).model_dump_json()


async def test_jobs_waiting_for_quota_are_admitted_in_the_replay_when_their_quota_frees(
        engine: AsyncEngine, db_url: str) -> None:
    """Queue research may hold 8 GPUs: q1 (8 GPUs) is admitted at once in the replay and
    starts when the cluster has room; q2 behind it waits for q1 to end (its quota), not
    for GPUs; a held job whose stored event cannot be read still gets a forecast, with
    no start. The reason of all three is quota."""
    now = time.time()
    await busy_cluster(engine, db_url, now)
    async with engine.begin() as conn:
        await research_queue(conn)
        await conn.execute(text(
            "INSERT INTO queue_jobs (job_id, queue, tenant, state, event) VALUES"
            " ('q1', 'research', 'lab', 'queued', CAST(:e1 AS jsonb)),"
            " ('q2', 'research', 'lab', 'queued', CAST(:e2 AS jsonb)),"
            " ('q3', 'research', 'lab', 'queued', '{}'),"
            " ('q4', 'research', 'lab', 'admitted', '{}')"),
            {"e1": submitted("q1", 8, 100), "e2": submitted("q2", 8, 100)})
    async with engine.connect() as conn:
        queued = await read_queued(conn)
        snap, who = snapshot_of(await RowReader().read(conn), now)
    assert set(queued.who) == {"q1", "q2", "q3"} and [j.job_id for j in queued.held] == ["q1", "q2"]
    out = forecast_round(CONFIG, snap, who, DurationHistory(), queued=queued)
    assert set(out) == {"w1", "w2", "w3", "q1", "q2", "q3"}
    q1, q2, q3 = out["q1"], out["q2"], out["q3"]
    assert {f.reason for f in (q1, q2, q3)} == {WaitReason.QUOTA}
    assert (q1.queue, q1.tenant) == ("research", "lab")
    assert q1.start is not None and q1.start > now and q1.nodes  # the cluster is full now
    assert q1.finish == pytest.approx(q1.start + 100)
    assert q2.start is not None and q2.start >= q1.finish  # its queue's quota, held by q1
    assert q3.start is None


async def test_a_what_if_waits_for_its_queues_quota_behind_the_jobs_held_for_it(
        engine: AsyncEngine, db_url: str) -> None:
    now = time.time()
    await busy_cluster(engine, db_url, now)
    async with engine.begin() as conn:
        await research_queue(conn)
        await conn.execute(text("INSERT INTO queue_jobs (job_id, queue, tenant, state, event)"
                                " VALUES ('q1', 'research', 'lab', 'queued', CAST(:e AS jsonb))"),
                           {"e": submitted("q1", 8, 100)})
    async with engine.connect() as conn:
        queued = await read_queued(conn)
        snap, who = snapshot_of(await RowReader().read(conn), now)
    q1 = forecast_round(CONFIG, snap, who, DurationHistory(), queued=queued)["q1"]

    def cand(job_id: str, queue: str) -> JobRequest:
        spec = parse_job_spec({"name": job_id, "queue": queue, "runtimeEstimate": 100,
                               "tasks": [{"name": "w", "resources": {"gpu": 8}}]})
        return job_request(spec, job_id=job_id, queue=queue, tenant="lab", user="u",
                           submitted_at=datetime.now(UTC), attempt=1)

    mine, other = what_if(CONFIG, snap, DurationHistory(), [cand("c1", "research"), cand("c2", "default")],
                          queued=queued)
    assert (mine.reason, mine.waits_for) == (WaitReason.QUOTA, "quota of queue research")
    assert q1.finish is not None and mine.start is not None and mine.start >= q1.finish
    assert other.reason != WaitReason.QUOTA and other.start is not None and other.start < mine.start


async def test_a_what_if_forecasts_each_candidate_alone(engine: AsyncEngine, db_url: str) -> None:
    now = time.time()
    await busy_cluster(engine, db_url, now)
    async with engine.connect() as conn:
        snap, _ = snapshot_of(await RowReader().read(conn), now)

    def cand(job_id: str, gpus: int) -> object:
        spec = parse_job_spec({"name": job_id, "runtimeEstimate": 100,
                               "tasks": [{"name": "w", "resources": {"gpu": gpus}}]})
        return job_request(spec, job_id=job_id, queue="default", tenant="t", user="u",
                           submitted_at=__import__("datetime").datetime.now(), attempt=1)

    small, big = what_if(CONFIG, snap, DurationHistory(), [cand("c1", 2), cand("c2", 8)])  # type: ignore[list-item]
    alone = what_if(CONFIG, snap, DurationHistory(), [cand("c2", 8)])[0]  # type: ignore[list-item]
    assert big.start == alone.start  # the other candidate does not compete
    assert small.start is not None and big.start is not None
    assert small.start >= now and big.start > now and big.nodes
    with pytest.raises(ValueError, match="already waiting"):
        what_if(CONFIG, snap, DurationHistory(), [cand("w1", 1)])  # type: ignore[list-item]
    assert [j.job_id for j in snap.pending] == ["w1", "w2", "w3"]  # the snapshot is unchanged


def fc(job: str, start: float | None, nodes: tuple[str, ...] = ("n1",)) -> JobForecast:
    return JobForecast(job_id=job, queue="q", tenant="t", as_of=0, start=start,
                       finish=None if start is None else start + 10, nodes=list(nodes))


def test_only_forecasts_that_moved_materially_are_published_again() -> None:
    p = Publisher(move_ratio=0.05, move_s=30, refresh_s=60)
    first = {"a": fc("a", 1000), "b": fc("b", 5000), "c": fc("c", None)}
    assert [f.job_id for f in p.select(first, 0)] == ["a", "b", "c"]
    p.mark_sent(list(first.values()), 0)
    assert p.select(first, 10) == []
    moved = {"a": fc("a", 1020),  # 20 s: under both thresholds
             "b": fc("b", 5200),  # 200 s of 5,000 s away: under 5%
             "c": fc("c", 100)}  # a start where there was none
    assert [f.job_id for f in p.select(moved, 10)] == ["c"]
    assert [f.job_id for f in p.select({**moved, "a": fc("a", 1100)}, 10)] == ["a", "c"]
    assert [f.job_id for f in p.select({**moved, "b": fc("b", 5400)}, 10)] == ["b", "c"]
    assert p.select({**first, "a": fc("a", 1000, ("n2",))}, 10) == []  # nodes alone: no
    assert [f.job_id for f in p.select({**first, "a": fc("a", 1000).model_copy(
        update={"waits_for": "j-0"})}, 10)] == ["a"]
    assert [f.job_id for f in p.select(first, 60)] == ["a", "b", "c"]  # the refresh
    assert p.select({"a": first["a"]}, 20) == [] and set(p.sent) == {"a"}  # b, c forgotten


def test_the_what_if_body_is_the_gateways_contract() -> None:
    from services.scheduler.forecaster.service import WhatIfIn

    spec = json.loads(parse_job_spec({"name": "x", "tasks": [{"name": "w", "resources": {"gpu": 1}}]})
                      .model_dump_json(by_alias=True))
    body = WhatIfIn.model_validate({"candidates": [
        {"job_id": "x", "queue": "default", "tenant": "t", "user": "u", "spec": spec}]})
    assert body.candidates[0].spec.tasks[0].resources.gpu == 1


def test_a_slow_round_waits_longer() -> None:
    from services.scheduler.forecaster.service import pause

    assert pause(0.5, 5, 0.2) == 4.5  # the rest of the interval
    assert pause(2.0, 5, 0.2) == 8.0  # busy 2 s of every 10 at most
    assert pause(0.1, 1, 0.2) == pytest.approx(0.9)
