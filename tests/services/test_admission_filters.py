"""GET /v1/jobs over HTTP against real PostgreSQL: the state, queue, tenant and user
filters, who may use which, and pages that stay stable while jobs come and change."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared.events import JobState
from tests.services.gateway_helpers import JOB, Gateway, auth, gateway

pytestmark = pytest.mark.db


@pytest.fixture
async def gw(db_url: str) -> AsyncIterator[Gateway]:
    async with gateway(db_url) as g:
        await g.queue("research")
        yield g


async def ids(gw: Gateway, token: str, **params: Any) -> list[str]:
    r = await gw.http.get("/v1/jobs", params=params, headers=auth(token))
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["items"]]


async def test_filters_by_state_queue_user_and_tenant(gw: Gateway) -> None:
    alice = await gw.token("vision", name="alice")
    carol = await gw.token("vision", name="carol")
    bob = await gw.token("nlp", name="bob")
    a1 = await gw.submit(alice)
    a2 = await gw.submit(alice, {**JOB, "queue": "research"})
    c1 = await gw.submit(carol)
    b1 = await gw.submit(bob, {**JOB, "queue": "research"})
    await gw.status(a1, JobState.ADMITTED)
    await gw.status(a1, JobState.RUNNING)

    assert await ids(gw, alice) == [a1, a2, c1]  # the tenant's jobs, every user's
    assert await ids(gw, alice, user="alice") == [a1, a2]
    assert await ids(gw, alice, user="carol") == [c1]
    assert await ids(gw, alice, user="bob") == []  # bob is another tenant's user
    assert await ids(gw, alice, state="running") == [a1]
    assert await ids(gw, alice, state="pending") == [a2, c1]
    assert await ids(gw, alice, queue="research") == [a2]
    assert await ids(gw, alice, queue="research", user="alice", state="pending") == [a2]
    assert await ids(gw, alice, tenant="vision", user="carol") == [c1]

    # an admin: every tenant, or one, with the same filters
    assert await ids(gw, gw.admin) == [a1, a2, c1, b1]
    assert await ids(gw, gw.admin, queue="research") == [a2, b1]
    assert await ids(gw, gw.admin, tenant="nlp") == [b1]
    assert await ids(gw, gw.admin, user="bob") == [b1]
    assert await ids(gw, gw.admin, tenant="nlp", user="alice") == []


async def test_a_user_asking_for_another_tenant_gets_403_with_the_reason(gw: Gateway) -> None:
    alice = await gw.token("vision", name="alice")
    await gw.submit(await gw.token("nlp"))
    for params in ({"tenant": "nlp"}, {"tenant": "nlp", "user": "bob"}, {"tenant": "ops"}):
        r = await gw.http.get("/v1/jobs", params=params, headers=auth(alice))
        assert r.status_code == 403, params
        assert r.json() == {"detail": "this token lists only tenant vision's jobs"}


async def test_bad_filters_are_422_naming_the_parameter(gw: Gateway) -> None:
    for params, field in (({"state": "flying"}, "query.state"),
                          ({"limit": 0}, "query.limit"),
                          ({"limit": 501}, "query.limit"),
                          ({"offset": -1}, "query.offset"),
                          ({"offset": 2**63}, "query.offset"),
                          ({"user": "u" * 64}, "query.user"),
                          ({"queue": "q" * 64}, "query.queue"),
                          ({"cursor": "not-a-cursor"}, "query.cursor"),
                          ({"cursor": "WyJ4IiwxXQ"}, "query.cursor")):  # ["x",1]
        r = await gw.http.get("/v1/jobs", params=params, headers=auth(gw.admin))
        assert r.status_code == 422, (params, r.text)
        assert [d["field"] for d in r.json()["detail"]] == [field], r.text


async def test_cursor_pages_are_stable_while_jobs_come_and_change_state(gw: Gateway) -> None:
    token = await gw.token("vision")
    jobs = [await gw.submit(token) for _ in range(7)]
    seen: list[str] = []
    r = await gw.http.get("/v1/jobs", params={"limit": 3, "state": "pending"},
                          headers=auth(token))
    page = r.json()
    seen += [j["id"] for j in page["items"]]
    assert seen == jobs[:3] and page["next_cursor"]
    # meanwhile the first page's jobs leave `pending` and new jobs arrive: an offset
    # would now skip jobs[3:6]; the cursor goes on after the last job seen
    for job in jobs[:3]:
        await gw.status(job, JobState.ADMITTED)
    late = [await gw.submit(token) for _ in range(2)]
    cursor = page["next_cursor"]
    while cursor:
        page = (await gw.http.get("/v1/jobs", params={
            "limit": 3, "state": "pending", "cursor": cursor}, headers=auth(token))).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
    assert seen == jobs + late
    assert page["next_offset"] is None

    # offset paging still works for a list that stands still
    everything = await ids(gw, token, limit=100)
    first = (await gw.http.get("/v1/jobs", params={"limit": 5}, headers=auth(token))).json()
    rest = await ids(gw, token, limit=100, offset=first["next_offset"])
    assert [j["id"] for j in first["items"]] + rest == everything


async def test_the_openapi_schema_documents_filters_and_paging(gw: Gateway) -> None:
    op = (await gw.http.get("/openapi.json")).json()["paths"]["/v1/jobs"]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    assert {"state", "queue", "tenant", "user", "limit", "offset", "cursor"} <= set(params)
    assert all(params[n].get("description") for n in ("state", "queue", "user", "cursor"))
    assert {"401", "403", "422"} <= set(op["responses"])
    assert op["responses"]["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"}
