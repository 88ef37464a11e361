"""Dry-run submits (``POST /v1/jobs?dryRun=All``) against the real gateway and real
PostgreSQL: nothing stored or published, the same refusals as a submit, the quota's
verdict from the usage queueing announced, and the forecast from a forecaster.

The forecaster here is ``forecaster_stub``: a small HTTP server with the service's
contract (``POST /v1/what-if``) and the answers a test chooses. It stands in for the
forecaster service until the end-to-end test runs the real one."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy import text

from kairos.embedded import free_port
from shared.bus import Producer
from shared.events import QueueStatus
from shared.outbox import OutboxRelay
from shared.topics import JOBS_SUBMITTED
from tests.services.forecaster_stub import StubForecaster, running_stub
from tests.services.gateway_helpers import JOB, Gateway, auth, gateway

pytestmark = pytest.mark.db
TABLES = ("jobs", "job_events", "job_arrays", "outbox", "submit_buckets")
DRY = "/v1/jobs?dryRun=All"


async def counts(gw: Gateway) -> dict[str, int]:
    async with gw.engine.connect() as conn:
        return {t: int(await conn.scalar(text(f"SELECT count(*) FROM {t}")) or 0)
                for t in TABLES}


@pytest.fixture
async def forecaster() -> AsyncIterator[StubForecaster]:
    async with running_stub() as stub:
        yield stub


@pytest.fixture
async def gw(db_url: str, forecaster: StubForecaster) -> AsyncIterator[Gateway]:
    # a small event limit: a spec within the body limit can be over it (413)
    async with gateway(db_url, forecaster_url=forecaster.url, forecaster_timeout_s=0.5,
                       max_event_bytes=50_000) as g:
        yield g


async def announce_usage(gw: Gateway, queue: str, gpus: float, pending: int = 0) -> None:
    """What queueing announces after a cycle: the queue's usage (its subtree's)."""
    await gw.apply(QueueStatus(queue=queue, used={"gpus": gpus, "cpu_milli": 0.0,
                                                  "memory_mib": 0.0}, pending=pending))


async def test_a_dry_run_stores_and_publishes_nothing_a_submit_would(gw: Gateway) -> None:
    token = await gw.token("vision")
    before = await counts(gw)
    r = await gw.http.post(DRY, json=JOB, headers=auth(token))
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["dry_run"], out["valid"], out["queue"], out["tenant"]) == (
        "All", True, "default", "vision")
    assert out["quota"]["admitted"] is True and out["quota"]["blocked_by"] is None
    assert out["quota"]["ask"]["gpus"] == 1
    r = await gw.http.post(DRY, json={**JOB, "array": "0-99%10"}, headers=auth(token))
    assert r.status_code == 200, r.text
    assert r.json()["array_size"] == 100
    assert r.json()["summary"].startswith("an array of 100 jobs")
    assert await counts(gw) == before  # no job, history, array, outbox row or rate token
    await gw.submit(token)  # the same spec for real: the counts can move
    after = await counts(gw)
    assert after["jobs"] == before["jobs"] + 1 and after["outbox"] == before["outbox"] + 1


BAD: list[tuple[dict[str, Any] | bytes, int]] = [
    ({"name": "Bad_Name", "tasks": []}, 422),  # spec validation
    ({"name": "x", "tasks": [{"name": "w", "resources": {"gpu": 65}}]}, 422),
    (b"{not json", 400),
    ([1, 2], 422),  # not a mapping
    ({**JOB, "queue": "nowhere"}, 422),  # no such queue
    ({**JOB, "queue": "closed"}, 409),  # a closed queue
    ({**JOB, "queue": "small", "tasks": [{"name": "w", "replicas": 3,
                                          "resources": {"gpu": 2}}]}, 422),  # over ceiling
    ({**JOB, "array": "0-20000"}, 422),  # larger than max_array_size
    ({**JOB, "tasks": [{"name": "w", "env": {"X": "y" * 60_000}}]}, 413),  # event size
]


@pytest.mark.parametrize(("body", "code"), BAD)
async def test_a_bad_dry_run_gets_exactly_a_submits_refusal(
        gw: Gateway, body: dict[str, Any] | bytes, code: int) -> None:
    token = await gw.token("vision")
    await gw.queue("closed", state="closed")
    await gw.queue("small", guaranteed={"gpus": 4})
    kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    real = await gw.http.post("/v1/jobs", headers=auth(token), **kw)
    dry = await gw.http.post(DRY, headers=auth(token), **kw)
    assert real.status_code == code, real.text

    def same(text: str) -> str:  # the event size refusal names the new job's id
        return re.sub(r"j-[0-9a-f]{16}", "j-<id>", text)

    assert (dry.status_code, same(dry.text)) == (real.status_code, same(real.text))


@pytest.mark.parametrize("value", ["all", "", "true", "Server", "All,All"])
async def test_a_dry_run_value_other_than_all_is_400_saying_so(gw: Gateway, value: str) -> None:
    before = await counts(gw)
    r = await gw.http.post("/v1/jobs", params={"dryRun": value}, json=JOB,
                           headers=auth(await gw.token("vision")))
    assert r.status_code == 400, r.text
    assert "dryRun must be All" in r.json()["detail"] and repr(value) in r.json()["detail"]
    assert await counts(gw) == before


async def test_a_dry_run_needs_a_token(gw: Gateway) -> None:
    assert (await gw.http.post(DRY, json=JOB)).status_code == 401


async def test_over_quota_the_dry_run_names_the_queue_that_blocks_it(gw: Gateway) -> None:
    token = await gw.token("lab")
    await gw.queue("lab", kind="cohort", tenant="lab")
    await gw.queue("research", parent="lab", tenant="lab", guaranteed={"gpus": 8},
                   borrowing_limit={"gpus": 0})
    await gw.queue("prod", parent="lab", tenant="lab", guaranteed={"gpus": 8})
    job = {**JOB, "queue": "research", "tasks": [{"name": "w", "resources": {"gpu": 2}}]}
    await announce_usage(gw, "research", 7, pending=3)
    await announce_usage(gw, "lab", 7)
    r = await gw.http.post(DRY, json=job, headers=auth(token))
    assert r.status_code == 200, r.text
    quota = r.json()["quota"]
    assert quota["admitted"] is False
    assert quota["blocked_by"] == "quota of queue `research`"
    assert quota["waiting_ahead"] == 3 and "research" in quota["detail"]
    assert "blocked meanwhile by: quota of queue `research`" in r.json()["summary"]
    await announce_usage(gw, "research", 6)  # room for 2 again
    await announce_usage(gw, "lab", 6)
    quota = (await gw.http.post(DRY, json=job, headers=auth(token))).json()["quota"]
    assert (quota["admitted"], quota["blocked_by"], quota["borrowing"]) == (True, None, False)


async def test_above_its_guarantee_a_job_borrows_from_the_cohort(gw: Gateway) -> None:
    token = await gw.token("lab")
    await gw.queue("lab", kind="cohort", tenant="lab")
    await gw.queue("dev", parent="lab", tenant="lab", guaranteed={"gpus": 2})
    await gw.queue("prod", parent="lab", tenant="lab", guaranteed={"gpus": 8})
    job = {**JOB, "queue": "dev", "tasks": [{"name": "w", "resources": {"gpu": 4}}]}
    quota = (await gw.http.post(DRY, json=job, headers=auth(token))).json()["quota"]
    assert (quota["admitted"], quota["borrowing"]) == (True, True)
    await announce_usage(gw, "prod", 8)  # prod takes back what it lends
    await announce_usage(gw, "lab", 8)
    quota = (await gw.http.post(DRY, json=job, headers=auth(token))).json()["quota"]
    assert quota["admitted"] is False and quota["blocked_by"] == "quota of queue `dev`"


async def test_the_forecast_comes_from_the_forecaster(
        gw: Gateway, forecaster: StubForecaster) -> None:
    token = await gw.token("vision")
    # seconds from the stub's now; 20 s past each whole minute, so a few seconds between
    # its clock and the gateway's do not change the minutes the summary rounds to
    forecaster.answer = {"start": 740, "start_low": 500, "start_high": 1220,
                         "finish": 7820, "nodes": ["node3-1", "node3-2"],
                         "waits_for": "job j-abc (priority)"}
    spec = {**JOB, "runtimeEstimate": 7080}
    r = await gw.http.post(DRY, json=spec, headers=auth(token))
    assert r.status_code == 200, r.text
    out = r.json()
    # what the forecaster was asked: the job alone, its spec as a job spec's JSON
    (asked,) = forecaster.asked
    (cand,) = asked["candidates"]
    assert (cand["queue"], cand["tenant"], cand["user"]) == ("default", "vision", "vision")
    assert cand["spec"]["runtimeEstimate"] == 7080 and cand["job_id"].startswith("dryrun-")
    f = out["forecast"]
    assert out["forecast_unavailable"] is None
    start, low, high = (datetime.fromisoformat(f[k]) for k in ("start", "start_low",
                                                                "start_high"))
    assert low < start < high < datetime.fromisoformat(f["finish"])
    assert start - low == timedelta(seconds=240)
    assert 600 < f["in_seconds"] <= 740
    assert f["nodes"] == ["node3-1", "node3-2"] and f["waits_for"] == "job j-abc (priority)"
    assert out["summary"] == (
        "would start in about 12 min (between 8 and 20) on node3-1, node3-2; would "
        "finish about 2 h 10 min from now; blocked meanwhile by: job j-abc (priority)")


async def test_without_a_start_in_the_horizon_the_forecast_says_so(
        gw: Gateway, forecaster: StubForecaster) -> None:
    forecaster.answer = {"start": None, "waits_for": "never fits: no node has 64 GPUs"}
    out = (await gw.http.post(DRY, json=JOB, headers=auth(await gw.token("v")))).json()
    assert out["forecast"]["start"] is None and out["forecast"]["in_seconds"] is None
    assert out["summary"].startswith("no start expected within the forecast's horizon; "
                                     "blocked meanwhile by: never fits")


@pytest.mark.parametrize(("setup", "why"), [
    ({"status": 503}, "the forecaster has no snapshot of the cluster yet: no snapshot yet"),
    ({"status": 500}, "the forecaster answered 500"),
    ({"delay_s": 2.0}, "did not answer within 0.5 s"),
    ({"garbage": True}, "the forecaster's answer was not understood"),
])
async def test_a_forecaster_that_cannot_answer_leaves_the_forecast_out_saying_why(
        gw: Gateway, forecaster: StubForecaster, setup: dict[str, Any], why: str) -> None:
    for k, v in setup.items():
        setattr(forecaster, k, v)
    r = await gw.http.post(DRY, json=JOB, headers=auth(await gw.token("vision")))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["forecast"] is None and why in out["forecast_unavailable"]
    assert out["summary"].startswith("would be accepted; the quota of queue `default` "
                                     "admits it now; no forecast: ")


@pytest.mark.parametrize(("url", "why"), [
    ("", "no forecaster is configured (KAIROS_FORECASTER_URL)"),
    ("down", "cannot be reached (ConnectError)"),
])
async def test_no_forecaster_or_one_down_the_dry_run_still_answers(
        db_url: str, url: str, why: str) -> None:
    if url == "down":
        url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with gateway(db_url, forecaster_url=url) as gw:
        r = await gw.http.post(DRY, json=JOB, headers=auth(await gw.token("vision")))
    assert r.status_code == 200, r.text
    assert r.json()["forecast"] is None and why in r.json()["forecast_unavailable"]


async def test_dry_runs_take_nothing_from_the_tenants_submit_rate(db_url: str) -> None:
    async with gateway(db_url, forecaster_url="", submit_rate_per_s=0.001,
                       submit_burst=1) as gw:
        token = await gw.token("vision")
        for _ in range(3):
            assert (await gw.http.post(DRY, json=JOB, headers=auth(token))).status_code == 200
        await gw.submit(token)  # the one token of the bucket is still there
        assert (await gw.http.post("/v1/jobs", json=JOB, headers=auth(token))
                ).status_code == 429
        assert (await gw.http.post(DRY, json=JOB, headers=auth(token))).status_code == 200


async def test_an_overloaded_gateway_still_answers_dry_runs(db_url: str) -> None:
    """The overload gate bounds submits, which store work; a dry run stores none."""
    async with gateway(db_url, forecaster_url="", max_intake_lag_s=30) as gw:
        token = await gw.token("vision")
        await gw.submit(token)
        async with gw.engine.begin() as conn:  # queueing has not taken it up for 70 s
            await conn.execute(text("UPDATE jobs SET submitted_at = now() - interval '70 s'"))
        await gw.app.state.overload.sample(gw.engine)
        refused = await gw.http.post("/v1/jobs", json=JOB, headers=auth(token))
        assert refused.status_code == 429, refused.text
        assert (await gw.http.post(DRY, json=JOB, headers=auth(token))).status_code == 200
        bad = await gw.http.post("/v1/jobs?dryRun=yes", json=JOB, headers=auth(token))
        assert bad.status_code == 400  # not let through as a submit either


async def submitted_offsets(bootstrap: str) -> int:
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await c.start()
    try:
        tps = [TopicPartition(JOBS_SUBMITTED.name, p)
               for p in c.partitions_for_topic(JOBS_SUBMITTED.name) or ()]
        assert tps
        return sum((await c.end_offsets(tps)).values())
    finally:
        await c.stop()


@pytest.mark.broker
async def test_no_event_reaches_jobs_submitted_from_a_dry_run(
        gw: Gateway, db_url: str, broker: str) -> None:
    """The gateway's outbox relay publishes what it holds: nothing for a dry run, the
    job's event for a submit."""
    producer = Producer(broker, "admission")
    await producer.start()
    relay = OutboxRelay(gw.engine, producer, db_url, timedelta(hours=1), source="admission")
    try:
        token = await gw.token("vision")
        await relay.publish_pending()
        before = await submitted_offsets(broker)
        assert (await gw.http.post(DRY, json=JOB, headers=auth(token))).status_code == 200
        assert await relay.publish_pending() == 0
        assert await submitted_offsets(broker) == before
        await gw.submit(token)
        assert await relay.publish_pending() == 1
        assert await submitted_offsets(broker) == before + 1
    finally:
        await producer.stop()
