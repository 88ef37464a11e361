"""Usage accounting against real PostgreSQL: the read model records each task replica's
running interval from the jobs.status reports (``store.apply_events``, the consumer's
code), and GET /v1/usage sums GPU-hours per tenant and queue inside a range."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic import command
from sqlalchemy import text
from typer.testing import CliRunner

from kairos.cli import app
from services.admission.usage import replica_gpus, task_name
from shared.db import _alembic_config, make_engine, migrate
from shared.events import JobState
from tests.services.gateway_helpers import Gateway, auth, gateway

pytestmark = pytest.mark.db
T0 = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def spec(tasks: list[dict[str, Any]], queue: str = "default") -> dict[str, Any]:
    return {"name": "job", "queue": queue, "tasks": tasks}


@pytest.fixture
async def gw(db_url: str) -> AsyncIterator[Gateway]:
    async with gateway(db_url) as g:
        await g.node("n1", gpus=8, gpu_memory_mib=81_920)
        await g.queue("research")
        yield g


async def run(gw: Gateway, job: str, tasks: list[str], start: float, end: float | None,
              state: JobState = JobState.SUCCEEDED, attempt: int = 1) -> None:
    """Tasks that run from `start` to `end` (hours after T0); the job ends with them."""
    await gw.status(job, JobState.RUNNING, attempt=attempt, at=at(start))
    for t in tasks:
        await gw.status(job, JobState.RUNNING, task=t, attempt=attempt, at=at(start))
    if end is not None:
        for t in tasks:
            await gw.status(job, state, task=t, attempt=attempt, at=at(end))
        await gw.status(job, state, attempt=attempt, at=at(end))


async def usage(gw: Gateway, token: str, **params: str) -> dict[str, Any]:
    r = await gw.http.get("/v1/usage", params=params, headers=auth(token))
    assert r.status_code == 200, r.text
    return dict(r.json())


def by_tenant(report: dict[str, Any]) -> dict[str, float]:
    return {t["tenant"]: t["gpu_hours"] for t in report["tenants"]}


async def test_gpu_hours_per_tenant_and_queue_clipped_to_the_range(gw: Gateway) -> None:
    vision, nlp = await gw.token("vision"), await gw.token("nlp")
    # vision: a 2 x 2-GPU gang for 3 h in queue default, a quarter GPU for 4 h in research
    gang = await gw.submit(vision, spec([{"name": "worker", "replicas": 2,
                                          "resources": {"gpu": 2}}]))
    await run(gw, gang, ["worker-0", "worker-1"], 0, 3)
    share = await gw.submit(vision, spec([{"name": "nb", "resources": {
        "gpuMemory": 20480, "gpuCompute": 25}}], queue="research"))
    await run(gw, share, ["nb-0"], 1, 5)
    # nlp: a parameter server without GPUs and 3 one-GPU workers for 2 h, then failed
    ps = await gw.submit(nlp, spec([{"name": "ps", "resources": {"gpu": 0}},
                                    {"name": "worker", "replicas": 3,
                                     "resources": {"gpu": 1}}]))
    await run(gw, ps, ["ps-0", "worker-0", "worker-1", "worker-2"], 2, 4, JobState.FAILED)

    whole = await usage(gw, gw.admin, **{"from": at(0).isoformat(), "to": at(6).isoformat()})
    assert by_tenant(whole) == {"nlp": pytest.approx(6.0), "vision": pytest.approx(13.0)}
    assert whole["gpu_hours"] == pytest.approx(19.0)
    [v] = [t for t in whole["tenants"] if t["tenant"] == "vision"]
    assert {q["queue"]: (q["gpu_hours"], q["shared_gpu_hours"], q["runs"])
            for q in v["queues"]} == {"default": (pytest.approx(12.0), 0.0, 2),
                                      "research": (pytest.approx(1.0), pytest.approx(1.0), 1)}
    assert v["shared_gpu_hours"] == pytest.approx(1.0) and v["runs"] == 3

    # [2 h, 3 h): the gang's last hour (4), the share's (0.25), nlp's first hour (3)
    part = await usage(gw, gw.admin, **{"from": at(2).isoformat(), "to": at(3).isoformat()})
    assert by_tenant(part) == {"vision": pytest.approx(4.25), "nlp": pytest.approx(3.0)}
    assert part["from"].startswith("2025-01-06T10:00:00")
    # a range with nothing in it
    empty = await usage(gw, gw.admin, **{"from": at(10).isoformat(), "to": at(11).isoformat()})
    assert empty["tenants"] == [] and empty["gpu_hours"] == 0

    # a user sees its own tenant only; an admin narrows with ?tenant=
    mine = await usage(gw, nlp, **{"from": at(0).isoformat(), "to": at(6).isoformat()})
    assert by_tenant(mine) == {"nlp": pytest.approx(6.0)}
    one = await usage(gw, gw.admin, tenant="vision",
                      **{"from": at(0).isoformat(), "to": at(6).isoformat()})
    assert by_tenant(one) == {"vision": pytest.approx(13.0)}


async def test_runs_end_with_the_job_a_new_attempt_or_a_late_task_report(gw: Gateway) -> None:
    token = await gw.token("vision")
    one_gpu = spec([{"name": "w", "resources": {"gpu": 1}}])
    # a node lost: the task never reports; the job's new attempt ends the old run
    lost = await gw.submit(token, one_gpu)
    await run(gw, lost, ["w-0"], 0, None)
    await gw.status(lost, JobState.ADMITTED, attempt=2, at=at(1), reason="node lost")
    await run(gw, lost, ["w-0"], 2, 3, attempt=2)
    # cancelled: the job ends at 1 h, its task stops after a grace period at 1.5 h
    cancelled = await gw.submit(token, one_gpu)
    await run(gw, cancelled, ["w-0"], 0, None)
    await gw.status(cancelled, JobState.CANCELLED, at=at(1))
    await gw.status(cancelled, JobState.CANCELLED, task="w-0", at=at(1.5))
    # still running: counted up to now
    running = await gw.submit(token, spec([{"name": "w", "resources": {"gpu": 2}}]))
    await gw.status(running, JobState.RUNNING, task="w-0",
                    at=datetime.now(UTC) - timedelta(hours=1))
    # a report replayed by the broker counts once
    await gw.apply_replay()

    async with gw.engine.connect() as conn:
        runs = {(r.job_id, r.attempt): (r.started_at, r.ended_at) for r in await conn.execute(
            text("SELECT job_id, attempt, started_at, ended_at FROM task_runs"))}
    assert runs[(lost, 1)] == (at(0), at(1)) and runs[(lost, 2)] == (at(2), at(3))
    assert runs[(cancelled, 1)] == (at(0), at(1.5))
    assert runs[(running, 1)][1] is None

    past = await usage(gw, token, **{"from": at(0).isoformat(), "to": at(4).isoformat()})
    assert by_tenant(past) == {"vision": pytest.approx(1 + 1 + 1.5)}
    now = await usage(gw, token)  # the last day, up to now
    assert by_tenant(now) == {"vision": pytest.approx(2.0, rel=0.01)}


async def test_bad_ranges_and_other_tenants_are_refused_saying_why(gw: Gateway) -> None:
    alice = await gw.token("vision")
    r = await gw.http.get("/v1/usage", params={"tenant": "nlp"}, headers=auth(alice))
    assert r.status_code == 403 and r.json() == {
        "detail": "this token sees only tenant vision's usage"}
    assert (await gw.http.get("/v1/usage")).status_code == 401
    for params, field in (({"from": at(2).isoformat(), "to": at(1).isoformat()}, "query.from"),
                          ({"from": "yesterday"}, "query.from"),
                          ({"to": "0001-01-01T00:00:00Z"}, "query.to"),
                          ({"from": "1900-01-01T00:00:00"}, "query.from"),
                          ({"tenant": "t" * 64}, "query.tenant")):
        r = await gw.http.get("/v1/usage", params=params, headers=auth(gw.admin))
        assert r.status_code == 422, (params, r.text)
        assert [d["field"] for d in r.json()["detail"]] == [field], r.text


def test_a_replica_holds_whole_gpus_or_the_fraction_of_its_share() -> None:
    assert replica_gpus({"resources": {"gpu": 4}}, None) == (4.0, False)
    assert replica_gpus({"resources": {"gpuMemory": 20480, "gpuCompute": 25}}, 81920) == (
        0.25, True)
    assert replica_gpus({"resources": {"gpuMemory": 40960}}, 81920) == (0.5, True)
    assert replica_gpus({"resources": {"gpuMemory": 40960}}, None) == (0.0, True)
    assert replica_gpus({"resources": {"cpu": 4000}}, 81920) == (0.0, False)
    assert [task_name(t) for t in ("worker-0", "worker-12.3", "my-ps-1")] == [
        "worker", "worker", "my-ps"]


async def test_kairos_usage_prints_gpu_hours_per_tenant_and_queue(gw: Gateway) -> None:
    token = await gw.token("vision")
    job = await gw.submit(token, spec([{"name": "w", "replicas": 2, "resources": {"gpu": 3}}]))
    await run(gw, job, ["w-0", "w-1"], 0, 2)

    def cli(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, [*args, "--url", str(gw.http.base_url),
                                          "--token", token])
        return result.exit_code, result.output

    code, out = await asyncio.to_thread(
        cli, "usage", "--from", at(0).isoformat(), "--to", at(24).isoformat())
    assert code == 0, out
    assert "2025-01-06T08:00 .. 2025-01-07T08:00" in out
    row = next(ln for ln in out.splitlines() if "vision" in ln)
    assert [c.strip() for c in row.split("│")[1:7]] == [
        "vision", "default", "12.00", "0.00", "12.00", "2"]
    code, out = await asyncio.to_thread(cli, "usage", "--from", "2d")  # a duration back
    assert code == 0 and "vision" not in out  # nothing in the last two days
    code, out = await asyncio.to_thread(cli, "usage", "--from", "someday")
    assert code == 2 and "neither an ISO time nor a duration" in out
    code, out = await asyncio.to_thread(cli, "usage", "--tenant", "nlp")
    assert code == 1 and "error 403: this token sees only tenant vision's usage" in out


async def test_usage_per_gpu_model_is_billed_at_each_queues_weights(gw: Gateway) -> None:
    """Slurm's TRESBillingWeights per partition: the cohort prices an H100-hour at 4 and
    an A100-hour at 2, its queue ``research`` overrides A100 to 3; the queue ``default``
    prices nothing (each hour counts 1)."""
    await gw.node("h1", gpus=8, model="NVIDIA H100 80GB HBM3")
    await gw.node("a1", gpus=8, model="NVIDIA A100-SXM4-80GB", gpu_memory_mib=81_920)
    await gw.node("v1", gpus=8, model="Tesla V100-SXM2-32GB", gpu_memory_mib=32_768)
    await gw.queue("lab", kind="cohort", billing_weights={"H100": 4, "A100": 2})
    await gw.queue("research", parent="lab", billing_weights={"A100-80GB": 3})
    token = await gw.token("vision")
    one_gpu = [{"name": "w", "resources": {"gpu": 1}}]
    for node, hours in (("h1", 2), ("a1", 1), ("v1", 5)):
        job = await gw.submit(token, spec(one_gpu, queue="research"))
        await gw.status(job, JobState.RUNNING, at=at(0))
        await gw.status(job, JobState.RUNNING, task="w-0", node=node, at=at(0))
        await gw.status(job, JobState.SUCCEEDED, task="w-0", node=node, at=at(hours))
        await gw.status(job, JobState.SUCCEEDED, at=at(hours))
    plain = await gw.submit(token, spec(one_gpu))  # queue default: no weights
    await gw.status(plain, JobState.RUNNING, task="w-0", node="h1", at=at(0))
    await gw.status(plain, JobState.SUCCEEDED, task="w-0", node="h1", at=at(1))

    report = await usage(gw, token, **{"from": at(0).isoformat(), "to": at(6).isoformat()})
    queues = {q["queue"]: q for q in report["tenants"][0]["queues"]}
    research = queues["research"]
    assert research["gpu_hours"] == pytest.approx(8.0)
    assert research["gpu_hours_by_model"] == {"H100-80GB": pytest.approx(2.0),
                                              "A100-80GB": pytest.approx(1.0),
                                              "V100-32GB": pytest.approx(5.0)}
    assert research["billed_gpu_hours"] == pytest.approx(2 * 4 + 1 * 3 + 5 * 1)
    assert queues["default"]["billed_gpu_hours"] == pytest.approx(1.0)
    assert report["billed_gpu_hours"] == pytest.approx(17.0)
    # another tenant sees none of it
    other = await usage(gw, await gw.token("nlp"), **{"from": at(0).isoformat(),
                                                      "to": at(6).isoformat()})
    assert other["tenants"] == [] and other["billed_gpu_hours"] == 0


async def test_the_migration_rebuilds_runs_from_the_recorded_history(db_url: str) -> None:
    """Runs recorded before migration 0004 come back from job_events: ended by the task's
    own report or by the job moving past them, open while still running."""
    def downgrade_to_0003(conn: Any) -> None:
        cfg = _alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0003")

    engine = make_engine(db_url, pool_size=1)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(downgrade_to_0003)
        tasks = [{"name": "w", "replicas": 2, "resources": {"gpu": 2}},
                 {"name": "nb", "resources": {"gpuCompute": 50, "gpuMemory": 1024}}]
        async with engine.begin() as conn:
            await conn.execute(text(
                """INSERT INTO jobs (id, name, queue, tenant, "user", spec, state, attempt,
                       submitted_at, updated_at)
                   VALUES ('j1', 'a', 'research', 'vision', 'u', CAST(:s AS jsonb),
                           'running', 2, :t, :t)"""),
                {"s": json.dumps({"name": "a", "tasks": tasks}), "t": at(0)})
            history = [("running", "w-0", 1, 0), ("running", "w-1", 1, 0),
                       ("running", "nb-0", 1, 0), ("failed", "w-0", 1, 1),
                       ("admitted", None, 2, 1.5),  # the job's attempt 2: w-1, nb-0 end
                       ("running", "w-0", 2, 2), ("succeeded", "w-0", 2, 3),
                       ("running", "w-1", 2, 2)]  # still running
            for i, (state, task, attempt, hours) in enumerate(history):
                await conn.execute(text(
                    """INSERT INTO job_events (event_id, job_id, state, attempt, task,
                           occurred_at) VALUES (:e, 'j1', :s, :a, :t, :o)"""),
                    {"e": f"e{i}", "s": state, "a": attempt, "t": task, "o": at(hours)})
        await migrate(engine)
        async with engine.connect() as conn:
            runs = {(r.task_id, r.attempt): (r.gpus, r.shared, r.started_at, r.ended_at)
                    for r in await conn.execute(text(
                        "SELECT * FROM task_runs WHERE tenant = 'vision' AND queue = 'research'"))}
    finally:
        await engine.dispose()
    assert runs == {("w-0", 1): (2.0, False, at(0), at(1)),
                    ("w-1", 1): (2.0, False, at(0), at(1.5)),
                    ("nb-0", 1): (0.5, True, at(0), at(1.5)),
                    ("w-0", 2): (2.0, False, at(2), at(3)),
                    ("w-1", 2): (2.0, False, at(2), None)}
