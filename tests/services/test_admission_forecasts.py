"""The gateway's forecasts over HTTP against real PostgreSQL: a waiting job's
``job.forecast`` shows in GET /v1/jobs/{id} and /v1/forecasts, the newest wins, a stale
one does not come back, and the job's start drops it."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from sqlalchemy import text

from shared.events import JobForecast, JobState
from tests.services.gateway_helpers import auth, gateway

pytestmark = pytest.mark.db


def fc(job: str, as_of: float, start: float | None, **kw: object) -> JobForecast:
    return JobForecast(job_id=job, queue="default", tenant="vision", as_of=as_of, start=start,
                       finish=None if start is None else start + 600,
                       start_low=None if start is None else start - 60,
                       start_high=None if start is None else start + 120,
                       nodes=["node0-1", "node0-2"], **kw)


async def test_a_waiting_jobs_forecast_shows_until_it_starts(db_url: str) -> None:
    async with gateway(db_url) as gw:
        alice = await gw.token("vision", name="alice")
        bob = await gw.token("nlp", name="bob")
        job, other = await gw.submit(alice), await gw.submit(bob)
        await gw.status(job, JobState.ADMITTED)
        now = time.time()
        await gw.apply(fc(job, now, now + 720, waits_for="j-ahead", reason="priority"))
        await gw.apply(fc(job, now - 10, now + 9999))  # an older one, late: ignored
        await gw.apply(fc(other, now, None, reason="quota"))
        got = (await gw.http.get(f"/v1/jobs/{job}", headers=auth(alice))).json()["forecast"]
        assert got["nodes"] == ["node0-1", "node0-2"] and got["waits_for"] == "j-ahead"
        assert got["reason"] == "priority"
        assert abs(_ts(got["start"]) - (now + 720)) < 1e-3
        assert abs(_ts(got["start_low"]) - (now + 660)) < 1e-3
        assert abs(_ts(got["as_of"]) - now) < 1e-3

        listed = (await gw.http.get("/v1/forecasts", headers=auth(alice))).json()["items"]
        assert [i["job_id"] for i in listed] == [job]  # alice sees her tenant's only
        every = (await gw.http.get("/v1/forecasts", headers=auth(gw.admin))).json()["items"]
        assert {i["job_id"]: i["forecast"]["reason"] for i in every} == {
            job: "priority", other: "quota"}
        assert (await gw.http.get("/v1/forecasts?tenant=nlp", headers=auth(alice))).status_code == 403

        await gw.status(job, JobState.BOUND)
        body = (await gw.http.get(f"/v1/jobs/{job}", headers=auth(alice))).json()
        assert body["forecast"] is None
        await gw.apply(fc(job, now + 5, now + 700))  # read after its start: ignored
        async with gw.engine.connect() as conn:
            assert await conn.scalar(text("SELECT count(*) FROM job_forecasts WHERE job_id = :j"),
                                     {"j": job}) == 0
        listed = (await gw.http.get("/v1/forecasts", headers=auth(alice))).json()["items"]
        assert listed == []


def _ts(s: str) -> float:
    return datetime.fromisoformat(s).timestamp()
