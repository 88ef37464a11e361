"""Graceful overload at the gateway (uvicorn) against real PostgreSQL: past the submits it
handles at once and a bounded wait for a turn, or with the platform behind in taking up accepted jobs, a submit is 429
with Retry-After at once, stores nothing, and the next one after the pressure is gone
is accepted; reads are never refused."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from services.admission.overload import SUBMIT_SECONDS, OverloadGuard
from shared.events import JobState
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
        assert guard.lag_refusal() is not None
        async with gw.engine.begin() as conn:  # it is waiting in its queue now: taken up
            await conn.execute(text("UPDATE jobs SET reason = 'waiting: quota' WHERE id = :j"),
                               {"j": old})
        await guard.sample(gw.engine)
        assert guard.intake_lag_s == 0 and guard.lag_refusal() is None
        assert await _count(gw.engine, "jobs") == before


async def test_a_job_waiting_in_its_queue_is_taken_up_not_intake_lag(db_url: str) -> None:
    """Queueing's notice that a job waits for quota moves the job's reason on in the read
    model, so a job that waits long in its queue never reads as intake lag (it did: every
    submit was refused once any job had waited 30 s for quota)."""
    async with gateway(db_url, max_intake_lag_s=30) as gw:
        guard: OverloadGuard = gw.app.state.overload
        tok = await gw.token("vision")
        job = await gw.submit(tok)
        await gw.status(job, JobState.PENDING, reason="waiting: quota")
        async with gw.engine.begin() as conn:  # it has waited in its queue for 70 s
            await conn.execute(text("UPDATE jobs SET submitted_at = now() - interval '70 s'"))
        await guard.sample(gw.engine)
        assert guard.intake_lag_s == 0 and guard.lag_refusal() is None
        await gw.submit(tok)


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


async def test_a_submit_waits_its_turn_for_a_slot_and_is_refused_past_the_wait() -> None:
    guard = OverloadGuard(max_in_flight=2, max_intake_lag_s=0, queue_wait_s=0.1,
                          burst_wait_s=0.5)
    assert await guard.acquire() is None and await guard.acquire() is None
    assert guard.in_flight == 2
    third = asyncio.create_task(guard.acquire())
    fourth = asyncio.create_task(guard.acquire())
    async with asyncio.timeout(5):
        while guard.waiting < 2:
            await asyncio.sleep(0.005)
    guard.release()  # the slot goes to the longest waiting one, first come first served
    assert await third is None
    assert guard.in_flight == 2 and guard.waiting == 1
    refused = await fourth  # nobody answered within the wait: refused, nothing held
    assert refused is not None and refused[1] == 1
    assert "waited 0.5 s for a turn" in refused[0]
    assert guard.in_flight == 2 and guard.waiting == 0
    guard.release()
    guard.release()
    assert guard.in_flight == 0


async def test_a_queue_that_stood_past_the_burst_allowance_gets_short_waits() -> None:
    now = [0.0]
    guard = OverloadGuard(max_in_flight=1, max_intake_lag_s=0, queue_wait_s=0.05,
                          burst_wait_s=30, clock=lambda: now[0])
    assert await guard.acquire() is None
    early = asyncio.create_task(guard.acquire())  # a burst: may wait up to 30 s
    async with asyncio.timeout(5):
        while guard.waiting < 1:
            await asyncio.sleep(0.005)
    now[0] = 31.0  # the queue has not been empty since: overload, not a burst
    late = await guard.acquire()
    assert late is not None and "waited 0.05 s for a turn" in late[0]
    assert not early.done()  # the burst's own allowance still holds
    guard.release()
    assert await early is None
    guard.release()
    assert guard.in_flight == 0 and guard.waiting == 0


async def test_a_client_gone_while_it_waits_leaves_no_slot_behind() -> None:
    guard = OverloadGuard(max_in_flight=1, max_intake_lag_s=0, queue_wait_s=30)
    assert await guard.acquire() is None
    gone = asyncio.create_task(guard.acquire())
    nxt = asyncio.create_task(guard.acquire())
    async with asyncio.timeout(5):
        while guard.waiting < 2:
            await asyncio.sleep(0.005)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert guard.waiting == 1
    guard.release()  # to the one still waiting, not to the one that left
    assert await nxt is None
    assert guard.in_flight == 1
    guard.release()
    assert guard.in_flight == 0 and guard.waiting == 0


async def test_a_job_behind_twice_the_bound_has_its_submit_event_sent_again(db_url: str) -> None:
    """Its event may have died with a broker: it is marked for the relay again, once per
    twice the bound; a job just behind, or one taken up, is left alone."""
    async with gateway(db_url, max_submits_in_flight=0, max_intake_lag_s=30) as gw:
        guard: OverloadGuard = gw.app.state.overload
        tok = await gw.token("vision")
        stuck = await gw.submit(tok)
        await gw.submit(tok)  # another, just accepted
        async with gw.engine.begin() as conn:
            await conn.execute(text("UPDATE outbox SET published_at = now() - interval '2 min'"))
            await conn.execute(text("UPDATE jobs SET submitted_at = now() - interval '2 min'"
                                    " WHERE id = :j"), {"j": stuck})
        await guard.sample(gw.engine)
        assert await guard.resend_stuck(gw.engine) == [f"submitted-{stuck}"]
        async with gw.engine.connect() as conn:
            rows = dict((await conn.execute(text(
                "SELECT event_id, replays FROM outbox WHERE published_at IS NULL"))).all())
        assert rows == {f"submitted-{stuck}": 1}
        async with gw.engine.begin() as conn:  # the relay sent it again just now
            await conn.execute(text("UPDATE outbox SET published_at = now()"
                                    " WHERE published_at IS NULL"))
        assert await guard.resend_stuck(gw.engine) == []  # not again before 60 s
