"""Admission policy over HTTP against real PostgreSQL: the per-tenant submit rate limit
(a token bucket in the database, shared by replicas), the maximum job size, jobs that
could never fit the cluster, and schema errors naming the field. Nothing refused is
stored or sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text

from services.admission import ratelimit
from services.admission.settings import SubmitLimit
from tests.services.gateway_helpers import JOB, Gateway, auth, gateway

pytestmark = pytest.mark.db
LIMITS = {"vision": {"rate_per_s": 0.01, "burst": 3}}  # one submit per 100 s after 3


@pytest.fixture
async def gw(db_url: str) -> AsyncIterator[Gateway]:
    async with gateway(db_url, tenant_submit_limits=LIMITS, max_job_gpus=16) as g:
        yield g


async def stored(gw: Gateway) -> tuple[int, int]:
    """(jobs stored, jobs.submitted events in the outbox)."""
    async with gw.engine.connect() as conn:
        return (int(await conn.scalar(text("SELECT count(*) FROM jobs")) or 0),
                int(await conn.scalar(text(
                    "SELECT count(*) FROM outbox WHERE topic = 'jobs.submitted'")) or 0))


async def test_a_tenant_over_its_rate_gets_429_with_retry_after(gw: Gateway) -> None:
    vision, nlp = await gw.token("vision"), await gw.token("nlp")
    for _ in range(3):
        await gw.submit(vision)
    r = await gw.http.post("/v1/jobs", json=JOB, headers=auth(vision))
    assert r.status_code == 429
    assert r.json() == {"detail": "tenant vision may submit 0.01 jobs a second (bursts of 3): "
                                  f"retry in {r.headers['retry-after']} s"}
    assert 90 <= int(r.headers["retry-after"]) <= 100
    assert await stored(gw) == (3, 3)  # the refused submit left nothing behind
    # another tenant has its own bucket (the lenient default)
    for _ in range(5):
        await gw.submit(nlp)
    # a token refills at the rate: pretend 100 s went by
    async with gw.engine.begin() as conn:
        await conn.execute(text("UPDATE submit_buckets SET updated_at = updated_at"
                                " - interval '100 s' WHERE tenant = 'vision'"))
    await gw.submit(vision)
    assert (await gw.http.post("/v1/jobs", json=JOB, headers=auth(vision))).status_code == 429


async def test_concurrent_submits_on_two_replicas_share_one_bucket(db_url: str) -> None:
    async with gateway(db_url, tenant_submit_limits=LIMITS) as one, \
            gateway(db_url, tenant_submit_limits=LIMITS) as two:
        token = await one.token("vision")
        answers = await asyncio.gather(*(
            gw.http.post("/v1/jobs", json=JOB, headers=auth(token))
            for gw in (one, two) for _ in range(4)))
        codes = sorted(r.status_code for r in answers)
        assert codes == [201] * 3 + [429] * 5
        assert await stored(one) == (3, 3)


async def test_the_bucket_refills_at_its_rate_up_to_its_burst(gw: Gateway) -> None:
    limit = SubmitLimit(rate_per_s=2, burst=4)
    taken = [await ratelimit.take(gw.engine, "t", limit) for _ in range(5)]
    assert taken[:4] == [None] * 4 and taken[4] is not None and 0 < taken[4] <= 0.5
    async with gw.engine.begin() as conn:  # an hour idle: the bucket holds its burst only
        await conn.execute(text("UPDATE submit_buckets SET updated_at = updated_at"
                                " - interval '1 hour'"))
    taken = [await ratelimit.take(gw.engine, "t", limit) for _ in range(5)]
    assert taken[:4] == [None] * 4 and taken[4] is not None
    assert await ratelimit.take(gw.engine, "t", SubmitLimit(rate_per_s=0, burst=1)) is None


async def test_a_job_over_the_size_limit_is_422_naming_it(gw: Gateway) -> None:
    token = await gw.token("nlp")
    for spec in ({"name": "big", "tasks": [{"name": "w", "replicas": 3,
                                             "resources": {"gpu": 8}}]},
                 {"name": "grows", "tasks": [{"name": "w", "replicas": 2, "minReplicas": 1,
                                               "maxReplicas": 17, "resources": {"gpu": 1}}]}):
        r = await gw.http.post("/v1/jobs", json=spec, headers=auth(token))
        assert r.status_code == 422, r.text
        [d] = r.json()["detail"]
        assert d["field"] == "tasks" and d["type"] == "job_too_large"
        assert "this gateway admits jobs of at most 16 GPUs" in d["message"]
    await gw.submit(token, {"name": "ok", "tasks": [{"name": "w", "replicas": 2,
                                                      "resources": {"gpu": 8}}]})
    assert await stored(gw) == (1, 1)


async def test_a_job_that_could_never_fit_the_cluster_is_refused_with_the_reason(
        gw: Gateway) -> None:
    token = await gw.token("nlp")
    # no node known yet: nothing can be judged, the job is accepted
    await gw.submit(token, {"name": "early", "tasks": [{"name": "w", "resources": {
        "gpu": 9}}]})
    await gw.node("n1", gpus=8, gpu_memory_mib=40_960, cpu_milli=64_000)
    await gw.node("n2", gpus=4, gpu_memory_mib=81_920, cpu_milli=256_000)
    gw.app.state.cluster_shapes.ttl_s = 0  # see the new nodes at once
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"gpu": 9}, "tasks.0.resources", "no node can ever hold one replica of task w "
         "(9 GPUs, 1000 millicores, 1024 MiB): the largest nodes have 8 GPUs"),
        ({"gpu": 5, "cpu": 100_000}, "tasks.0.resources", "no node can ever hold"),
        ({"gpuMemory": 90_000, "gpuCompute": 10}, "tasks.0.resources",
         "a GPU with 90000 MiB"),
        ({"memory": 2_000_000}, "tasks.0.resources", "no node can ever hold"),
    ]
    for resources, field, message in cases:
        r = await gw.http.post("/v1/jobs", headers=auth(token), json={
            "name": "x", "tasks": [{"name": "w", "resources": resources}]})
        assert r.status_code == 422, (resources, r.text)
        [d] = r.json()["detail"]
        assert (d["field"], d["type"]) == (field, "never_fits") and message in d["message"], d
    # every replica fits somewhere, but the gang is larger than the cluster (12 GPUs)
    r = await gw.http.post("/v1/jobs", headers=auth(token), json={
        "name": "gang", "minAvailable": 13, "tasks": [
            {"name": "w", "replicas": 14, "resources": {"gpu": 1}}]})
    [d] = r.json()["detail"]
    assert r.status_code == 422 and d["field"] == "minAvailable"
    assert d["message"] == "the gang needs 13 GPUs at once; the whole cluster has 12"
    # what fits is accepted: one node's 8 GPUs, a share on the 80 GiB GPUs, 12 at once
    for resources, replicas in (({"gpu": 8}, 1), ({"gpuMemory": 81_920}, 1), ({"gpu": 1}, 12),
                                ({"gpu": 4, "cpu": 200_000}, 1)):
        await gw.submit(token, {"name": "fits", "tasks": [
            {"name": "w", "replicas": replicas, "resources": resources}]})
    assert await stored(gw) == (5, 5)


async def test_schema_errors_are_422_naming_each_field(gw: Gateway) -> None:
    token = await gw.token("nlp")
    for spec, fields in (
            ({"name": "x", "tasks": [{"name": "w", "resources": {"gpu": -1}}]},
             ["tasks.0.resources.gpu"]),
            ({"name": "X", "tasks": []}, ["name", "tasks"]),
            ({"name": "x", "tasks": [{"name": "w", "replicas": "many"}], "gpus": 3},
             ["tasks.0.replicas", "gpus"]),
            ({"tasks": [{"name": "w"}]}, ["name"])):
        r = await gw.http.post("/v1/jobs", json=spec, headers=auth(token))
        assert r.status_code == 422, r.text
        assert sorted(d["field"] for d in r.json()["detail"]) == sorted(fields), r.text
    r = await gw.http.post("/v1/jobs", content=b"name: [", headers={
        **auth(token), "Content-Type": "application/yaml"})
    assert r.status_code == 400 and "body is not valid application/yaml" in r.json()["detail"]
    assert await stored(gw) == (0, 0)
