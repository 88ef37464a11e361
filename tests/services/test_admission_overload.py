"""Graceful overload at the gateway (uvicorn) against real PostgreSQL: past the submits it
handles at once, or with the platform behind in taking up accepted jobs, a submit is 429
with Retry-After at once, stores nothing, and the next one after the pressure is gone
is accepted; reads are never refused."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from services.admission.overload import SUBMIT_SECONDS, OverloadGuard
from tests.services.gateway_helpers import JOB, auth, gateway

pytestmark = pytest.mark.db


async def _count(engine: object, table: str) -> int:
    async with engine.connect() as conn:  # type: ignore[attr-defined]
        return int(await conn.scalar(text(f"SELECT count(*) FROM {table}")) or 0)


async def test_past_the_submits_in_flight_a_submit_is_429_at_once(db_url: str) -> None:
    async with gateway(db_url, max_submits_in_flight=2) as gw:
        tok = await gw.token("vision")
        await gw.submit(tok)  # the tenant's rate-limit bucket exists now
        async with gw.engine.connect() as lock:  # hold it: submits wait on its row lock
            tx = await lock.begin()
            await lock.execute(text("SELECT * FROM submit_buckets FOR UPDATE"))
            held = [asyncio.create_task(gw.http.post("/v1/jobs", json=JOB, headers=auth(tok)))
                    for _ in range(2)]
            async with asyncio.timeout(30):
                while gw.app.state.overload.in_flight < 2:
                    await asyncio.sleep(0.01)
            refused = await gw.http.post("/v1/jobs", json=JOB, headers=auth(tok))
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == "1"
            assert "as many as it takes at once" in refused.json()["detail"]
            env = await gw.http.post("/v1/environments", json={"name": "nb"},
                                     headers=auth(tok))
            assert env.status_code == 429  # every kind of submit
            listed = await gw.http.get("/v1/jobs", headers=auth(tok))
            assert listed.status_code == 200  # reads are not submits
            await tx.rollback()
        accepted = SUBMIT_SECONDS.labels("accepted")._sum.get()  # type: ignore[attr-defined]
        assert [r.status_code for r in await asyncio.gather(*held)] == [201, 201]
        # the gateway's own account of how long what it let through took: they waited
        assert SUBMIT_SECONDS.labels("accepted")._sum.get() > accepted  # type: ignore[attr-defined]
        assert await _count(gw.engine, "jobs") == 3  # the refused ones stored nothing
        assert gw.app.state.overload.in_flight == 0
        await gw.submit(tok)


async def test_a_platform_behind_on_its_intake_refuses_until_it_caught_up(db_url: str) -> None:
    async with gateway(db_url, max_submits_in_flight=0, max_intake_lag_s=30) as gw:
        guard: OverloadGuard = gw.app.state.overload
        tok = await gw.token("vision")
        old = await gw.submit(tok)
        await guard.sample(gw.engine)
        assert guard.intake_lag_s < 30  # just accepted
        async with gw.engine.begin() as conn:  # queueing has not taken it up for 70 s
            await conn.execute(text("UPDATE jobs SET submitted_at = now() - interval '70 s'"))
        await guard.sample(gw.engine)
        assert guard.intake_lag_s >= 70
        before = await _count(gw.engine, "jobs")
        assert guard.refusal() is not None
        async with gw.engine.begin() as conn:  # it is waiting in its queue now: taken up
            await conn.execute(text("UPDATE jobs SET reason = 'waiting: quota' WHERE id = :j"),
                               {"j": old})
        await guard.sample(gw.engine)
        assert guard.intake_lag_s == 0 and guard.refusal() is None
        assert await _count(gw.engine, "jobs") == before


async def test_the_middleware_answers_the_lag_with_a_bounded_retry_after(db_url: str) -> None:
    async with gateway(db_url, max_intake_lag_s=30) as gw:
        guard = gw.app.state.overload
        tok = await gw.token("vision")
        await gw.submit(tok)
        async with gw.engine.begin() as conn:
            await conn.execute(text("UPDATE jobs SET submitted_at = now() - interval '45 s'"))
        await guard.sample(gw.engine)
        r = await gw.http.post("/v1/jobs", json=JOB, headers=auth(tok))
        assert r.status_code == 429 and "behind taking up accepted jobs" in r.json()["detail"]
        assert 15 <= int(r.headers["retry-after"]) <= 30  # the excess, at most 30 s
        async with gw.engine.begin() as conn:
            await conn.execute(text("UPDATE jobs SET submitted_at = now() - interval '1 h'"))
        await guard.sample(gw.engine)
        r = await gw.http.post("/v1/jobs", json=JOB, headers=auth(tok))
        assert r.status_code == 429 and r.headers["retry-after"] == "30"
        assert await _count(gw.engine, "jobs") == 1


def test_the_in_flight_limit_adapts_to_the_latency_of_what_it_lets_in() -> None:
    now = [0.0]
    guard = OverloadGuard(max_in_flight=64, max_intake_lag_s=0, latency_target_s=0.5,
                          clock=lambda: now[0])
    assert guard.limit == 64  # quiet: a burst of 64 is taken at once
    for _ in range(20):  # a few slow ones among fast ones are not overload
        guard.finished(0.05)
    guard.finished(3.0)
    assert guard.limit == 64 and guard.latency_s < 0.5
    for _ in range(100):  # a burst of slow ones at one moment shrinks it once
        guard.finished(2.0)
    assert guard.limit == pytest.approx(57.6)
    for _ in range(200):  # slow for a while: a tenth less per target interval, to the floor
        now[0] += 0.5
        guard.finished(2.0)
    assert guard.limit == 4
    guard.in_flight = 4
    assert guard.refusal() is not None
    guard.in_flight = 3
    assert guard.refusal() is None
    for _ in range(10_000):  # fast again: it grows back (by 1/limit each), up to the maximum
        guard.finished(0.05)
    assert guard.limit == 64
