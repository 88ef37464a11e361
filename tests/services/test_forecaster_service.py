"""The forecaster's process parts on the real broker and PostgreSQL: started before the
scheduler has any rows it answers the what-if with 503 and publishes nothing, then, once
the leader has stored jobs, publishes a forecast for each on jobs.forecasts (once, not
every round); a restarted forecaster publishes them all again; of two replicas only the
elected one publishes, and the other takes over when it goes."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from sqlalchemy.ext.asyncio import AsyncEngine

from services.scheduler.forecaster.service import (
    Forecaster,
    create_app,
    load_config,
    publisher_election,
)
from services.scheduler.forecaster.settings import ForecasterSettings
from shared.bus import Producer
from shared.db import make_engine
from shared.events import Envelope, JobForecast
from shared.topics import JOBS_FORECASTS
from tests.services.test_forecaster_round import busy_cluster

pytestmark = [pytest.mark.db, pytest.mark.broker]


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    e = make_engine(db_url, pool_size=3)
    yield e
    await e.dispose()


async def ready() -> dict[str, bool]:
    return {"database": True}


async def published(broker: str, jobs: set[str], since: float, want: int) -> list[JobForecast]:
    """The forecasts of ``jobs`` made since ``since`` on the topic (the session's broker
    holds other tests' too), once ``want`` are seen."""
    c = AIOKafkaConsumer(JOBS_FORECASTS.name, bootstrap_servers=broker,
                         auto_offset_reset="earliest", fetch_max_wait_ms=20)
    await c.start()
    seen: list[JobForecast] = []
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(15):
                while len(seen) < want:
                    for records in (await c.getmany(timeout_ms=200)).values():
                        for r in records:
                            ev = Envelope.decode(r.value or b"").payload()
                            if isinstance(ev, JobForecast) and ev.job_id in jobs and ev.as_of >= since:
                                seen.append(ev)
        await asyncio.sleep(0.5)  # and nothing more arrives
        for records in (await c.getmany(timeout_ms=500)).values():
            seen += [ev for r in records if isinstance(ev := Envelope.decode(r.value or b"").payload(),
                                                       JobForecast) and ev.job_id in jobs and ev.as_of >= since]
    finally:
        await c.stop()
    return seen


def candidate(job_id: str, gpus: int) -> dict[str, object]:
    return {"job_id": job_id, "queue": "default", "tenant": "t", "user": "u",
            "spec": {"name": job_id, "runtimeEstimate": 100,
                     "tasks": [{"name": "w", "resources": {"gpu": gpus}}]}}


async def test_started_before_any_rows_it_recovers_and_publishes(
        engine: AsyncEngine, db_url: str, broker: str) -> None:
    settings = ForecasterSettings(database_url=db_url, kafka_bootstrap=broker)
    producer = Producer(broker, "forecaster")
    await producer.start()
    try:
        fc = Forecaster(settings, engine, producer, load_config(settings))
        app = create_app(fc, ready)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://forecaster") as http:
            r = await http.post("/v1/what-if", json={"candidates": [candidate("c", 1)]})
            assert r.status_code == 503 and "no snapshot" in r.json()["detail"]
            assert await fc.round_once() == 0  # no rows yet: nothing waits
            r = await http.post("/v1/what-if", json={"candidates": [candidate("c", 1)]})
            assert r.status_code == 200
            assert r.json()["forecasts"][0]["start"] is None  # no node: no start

            now = time.time()
            await busy_cluster(engine, db_url, now)
            assert await fc.round_once() == 3
            assert await fc.round_once() == 0  # nothing moved: nothing sent again
            r = await http.post("/v1/what-if", json={"candidates": [
                candidate("c1", 8), candidate("c2", 2)]})
            body = r.json()
            assert r.status_code == 200, body
            assert [f["job_id"] for f in body["forecasts"]] == ["c1", "c2"]
            assert body["as_of"] >= now
            assert all(f["start"] > now and f["nodes"] for f in body["forecasts"])
            bad = await http.post("/v1/what-if", json={"candidates": [{"job_id": "x"}]})
            assert bad.status_code == 422
            dup = await http.post("/v1/what-if", json={"candidates": [candidate("w1", 1)]})
            assert dup.status_code == 422 and "already waiting" in dup.json()["detail"]
            metrics = (await http.get("/metrics")).text
            assert 'kairos_forecaster_waiting_jobs{kind="scheduler"} 3.0' in metrics

        restarted = Forecaster(settings, engine, producer, load_config(settings))
        assert await restarted.round_once() == 3  # a fresh process sends every forecast
    finally:
        await producer.stop()
    got = await published(broker, {"w1", "w2", "w3"}, now, want=6)
    assert sorted(f.job_id for f in got) == ["w1", "w1", "w2", "w2", "w3", "w3"]
    assert all(f.start is not None and f.nodes for f in got)


async def test_of_two_replicas_one_publishes_and_the_other_takes_over(
        engine: AsyncEngine, db_url: str, broker: str) -> None:
    settings = ForecasterSettings(database_url=db_url, kafka_bootstrap=broker, election_poll_s=0.2,
                                  election_key=random.randrange(1, 2**62))
    producer = Producer(broker, "forecaster")
    await producer.start()
    now = time.time()
    await busy_cluster(engine, db_url, now)
    replicas = [Forecaster(settings, engine, producer, load_config(settings)) for _ in range(2)]
    campaigns = {id(fc): asyncio.create_task(publisher_election(fc)()) for fc in replicas}
    try:
        # one full run hung here past pytest's 300 s (not reproduced alone): this bound
        # fails it sooner, with the traceback of the await that hung
        async with asyncio.timeout(120):
            await takeover(replicas, campaigns)
    finally:
        for t in campaigns.values():
            t.cancel()
        await asyncio.gather(*campaigns.values(), return_exceptions=True)
        await producer.stop()
    got = await published(broker, {"w1", "w2", "w3"}, now, want=6)
    assert sorted(f.job_id for f in got) == ["w1", "w1", "w2", "w2", "w3", "w3"]


async def takeover(replicas: list[Forecaster], campaigns: dict[int, asyncio.Task[None]]) -> None:
    """The elected replica publishes, the standby sends nothing; when the leader's
    campaign ends the standby is elected and sends every forecast once."""
    async with asyncio.timeout(20):
        while not any(fc.publishing for fc in replicas):
            await asyncio.sleep(0.05)
    leader, standby = sorted(replicas, key=lambda fc: not fc.publishing)
    assert not standby.publishing
    assert await standby.round_once() == 0  # it forecasts (for its what-ifs), sends nothing
    assert standby.snapshot is not None and len(standby.snapshot.pending) == 3
    assert await leader.round_once() == 3
    assert await leader.round_once() == 0
    # the leader's process ends (its campaign with it): the standby is elected and
    # sends every forecast once, as a fresh publisher
    campaigns[id(leader)].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await campaigns[id(leader)]
    assert not leader.publishing
    async with asyncio.timeout(20):
        while not standby.publishing:
            await asyncio.sleep(0.05)
    assert await standby.round_once() == 3
