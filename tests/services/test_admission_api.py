"""The gateway over HTTP (in process) against real PostgreSQL: every authentication and
authorization refusal with its body, tenant isolation, and token management."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import tokens
from services.admission.app import create_app
from services.admission.settings import AdmissionSettings
from shared.db import make_engine

pytestmark = pytest.mark.db
JOB = {"name": "train", "tasks": [{"name": "w", "resources": {"gpu": 1}}]}
ELASTIC = {"name": "el", "tasks": [{"name": "w", "replicas": 2, "minReplicas": 1,
                                    "maxReplicas": 4}]}


@dataclass
class Gateway:
    http: httpx.AsyncClient
    engine: AsyncEngine
    admin: str  # a bootstrap admin token

    async def token(self, tenant: str, role: str = "user", name: str | None = None) -> str:
        return (await tokens.create_token(self.engine, tenant, role, name))[1]

    async def submit(self, token: str, spec: dict[str, object] = JOB) -> str:
        r = await self.http.post("/v1/jobs", json=spec, headers=auth(token))
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def gw(db_url: str) -> AsyncIterator[Gateway]:
    engine = make_engine(db_url, pool_size=3)

    async def ready() -> dict[str, bool]:
        return {"database": True}

    app = create_app(AdmissionSettings(database_url=db_url), engine, ready)
    _, admin = await tokens.create_token(engine, "ops", "admin", "root")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as http:
        yield Gateway(http, engine, admin)
    await engine.dispose()


async def test_a_missing_or_malformed_token_is_401_asking_for_a_bearer(gw: Gateway) -> None:
    for headers in ({}, {"Authorization": "Basic dXNlcjpwdw=="}, {"Authorization": "Bearer "},
                    {"Authorization": "kairos_x"}):
        for method, path in (("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/nodes"),
                             ("GET", "/v1/jobs/j-1"), ("DELETE", "/v1/jobs/j-1"),
                             ("GET", "/v1/tokens"), ("POST", "/v1/tokens"), ("GET", "/v1/me")):
            r = await gw.http.request(method, path, headers=headers)
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json() == {
                "detail": "missing bearer token: send 'Authorization: Bearer <token>'"}


async def test_unknown_expired_and_revoked_tokens_are_401_saying_why(gw: Gateway) -> None:
    expired_row, expired = await tokens.create_token(gw.engine, "vision")
    revoked_row, revoked = await tokens.create_token(gw.engine, "vision")
    async with gw.engine.begin() as conn:
        await conn.execute(text("UPDATE api_tokens SET expires_at = now() - interval '1 s'"
                                " WHERE id = :i"), {"i": expired_row["id"]})
    r = await gw.http.delete(f"/v1/tokens/{revoked_row['id']}", headers=auth(gw.admin))
    assert r.status_code == 200 and r.json()["state"] == "revoked"
    for token, why in (("kairos_unknown", "invalid token"), (expired, "token expired"),
                       (revoked, "token revoked")):
        r = await gw.http.get("/v1/jobs", headers=auth(token))
        assert r.status_code == 401 and r.json() == {"detail": why}
        assert r.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
        assert why in r.headers["www-authenticate"]


async def test_only_admins_manage_tokens(gw: Gateway) -> None:
    user = await gw.token("vision")
    row = (await tokens.list_tokens(gw.engine))[0]
    for method, path, body in (("POST", "/v1/tokens", {"tenant": "vision", "role": "admin"}),
                               ("GET", "/v1/tokens", None),
                               ("DELETE", f"/v1/tokens/{row['id']}", None)):
        r = await gw.http.request(method, path, json=body, headers=auth(user))
        assert r.status_code == 403, (method, path, r.text)
        assert r.json() == {"detail": "admin role required (this token's role is user)"}
    assert tokens.token_state((await tokens.list_tokens(gw.engine))[0]) == "active"


async def test_tokens_through_the_api_show_the_secret_once(gw: Gateway) -> None:
    r = await gw.http.post("/v1/tokens", headers=auth(gw.admin), json={
        "tenant": "vision", "role": "user", "name": "alice", "expires_in_s": 3600})
    assert r.status_code == 201, r.text
    created = r.json()
    secret = created["token"]
    assert secret.startswith("kairos_") and created["state"] == "active"
    assert (created["tenant"], created["name"], created["role"]) == ("vision", "alice", "user")
    assert created["created_by"] == "root" and created["expires_at"] is not None

    me = (await gw.http.get("/v1/me", headers=auth(secret))).json()
    assert me == {"tenant": "vision", "user": "alice", "role": "user",
                  "token_id": created["id"]}

    r = await gw.http.get("/v1/tokens", headers=auth(gw.admin))
    assert r.status_code == 200 and secret not in r.text and "sha256" not in r.text
    listed = {t["id"]: t for t in r.json()}
    assert listed[created["id"]]["last_used_at"] is not None and "token" not in listed[
        created["id"]]
    assert [t["tenant"] for t in (await gw.http.get(
        "/v1/tokens", params={"tenant": "vision"}, headers=auth(gw.admin))).json()] == ["vision"]

    r = await gw.http.delete(f"/v1/tokens/{created['id']}", headers=auth(gw.admin))
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    assert (await gw.http.get("/v1/me", headers=auth(secret))).json() == {
        "detail": "token revoked"}
    r = await gw.http.delete("/v1/tokens/t-nope", headers=auth(gw.admin))
    assert r.status_code == 404 and r.json() == {"detail": "no token t-nope"}

    for body, field in (({"tenant": "Vision"}, "body.tenant"),
                        ({"tenant": "vision", "role": "root"}, "body.role"),
                        ({"tenant": "vision", "expires_in_s": 0}, "body.expires_in_s"),
                        ({"tenant": "vision", "scopes": ["x"]}, "body.scopes"),
                        ({"role": "user"}, "body.tenant")):
        r = await gw.http.post("/v1/tokens", json=body, headers=auth(gw.admin))
        assert r.status_code == 422, body
        assert [d["field"] for d in r.json()["detail"]] == [field]


async def test_a_tenant_sees_and_touches_only_its_own_jobs(gw: Gateway) -> None:
    a, b = await gw.token("vision", name="alice"), await gw.token("nlp", name="bob")
    a_job, b_job = await gw.submit(a), await gw.submit(b)
    b_elastic = await gw.submit(b, ELASTIC)
    got = (await gw.http.get(f"/v1/jobs/{a_job}", headers=auth(a))).json()
    assert (got["tenant"], got["user"]) == ("vision", "alice")  # taken from the token

    page = (await gw.http.get("/v1/jobs", headers=auth(a))).json()
    assert [j["id"] for j in page["items"]] == [a_job]
    page = (await gw.http.get("/v1/jobs", params={"tenant": "vision"}, headers=auth(a))).json()
    assert [j["id"] for j in page["items"]] == [a_job]
    r = await gw.http.get("/v1/jobs", params={"tenant": "nlp"}, headers=auth(a))
    assert r.status_code == 403 and r.json() == {
        "detail": "this token lists only tenant vision's jobs"}

    # another tenant's job answers exactly like a job that does not exist
    for job in (b_job, b_elastic, "j-doesnotexist"):
        for method, path, body in (("GET", f"/v1/jobs/{job}", None),
                                   ("DELETE", f"/v1/jobs/{job}", None),
                                   ("POST", f"/v1/jobs/{job}/resize", {"replicas": 3})):
            r = await gw.http.request(method, path, json=body, headers=auth(a))
            assert r.status_code == 404, (method, path, r.text)
            assert r.json() == {"detail": f"no job {job}"}

    # a spec cannot name a tenant; the same idempotency key in two tenants is two jobs
    r = await gw.http.post("/v1/jobs", json={**JOB, "tenant": "nlp"}, headers=auth(a))
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "tenant"
    key = {"Idempotency-Key": "same"}
    ka = await gw.http.post("/v1/jobs", json=JOB, headers={**auth(a), **key})
    kb = await gw.http.post("/v1/jobs", json=JOB, headers={**auth(b), **key})
    assert ka.status_code == kb.status_code == 201 and ka.json()["id"] != kb.json()["id"]

    # its own jobs it may cancel and resize
    assert (await gw.http.delete(f"/v1/jobs/{a_job}", headers=auth(a))).status_code == 202
    r = await gw.http.post(f"/v1/jobs/{b_elastic}/resize", json={"replicas": 3},
                           headers=auth(b))
    assert r.status_code == 202, r.text

    # an admin sees every tenant, or one
    page = (await gw.http.get("/v1/jobs", headers=auth(gw.admin))).json()
    assert {j["tenant"] for j in page["items"]} == {"vision", "nlp"}
    page = (await gw.http.get("/v1/jobs", params={"tenant": "nlp"},
                              headers=auth(gw.admin))).json()
    assert {j["tenant"] for j in page["items"]} == {"nlp"} and len(page["items"]) == 3
    assert (await gw.http.get(f"/v1/jobs/{b_job}", headers=auth(gw.admin))).status_code == 200
    assert (await gw.http.delete(f"/v1/jobs/{b_job}", headers=auth(gw.admin))
            ).status_code == 202
    # every cancel went to the outbox with who asked
    async with gw.engine.connect() as conn:
        payloads = [json.loads(p) for p in (await conn.execute(text(
            "SELECT payload FROM outbox WHERE topic = 'jobs.commands' ORDER BY seq"))).scalars()]
    assert [(p["data"]["job_id"], p["data"]["requested_by"]) for p in payloads] == [
        (a_job, "alice"), (b_elastic, "bob"), (b_job, "root")]


async def test_nodes_show_other_tenants_allocations_without_their_jobs(gw: Gateway) -> None:
    a, b = await gw.token("vision"), await gw.token("nlp")
    a_job, b_job = await gw.submit(a), await gw.submit(b)
    async with gw.engine.begin() as conn:
        await conn.execute(text(
            """INSERT INTO nodes_view (node_id, inventory, state, registered_at)
               VALUES ('n1', CAST(:inv AS jsonb), 'ready', now())"""),
            {"inv": json.dumps({"node_id": "n1", "gpus": [{"index": 0, "model": "H100"},
                                                          {"index": 1, "model": "H100"}]})})
        for job, gpu in ((a_job, 0), (b_job, 1)):
            await conn.execute(text(
                """INSERT INTO allocations_view (job_id, task_id, node_id, attempt, gpus,
                       cpu_milli, memory_mib, bound_at)
                   VALUES (:j, 'w-0', 'n1', 1, CAST(:g AS jsonb), 1000, 1024, now())"""),
                {"j": job, "g": json.dumps([{"index": gpu}])})
    [node] = (await gw.http.get("/v1/nodes", headers=auth(a))).json()
    assert node["gpus_allocated"] == 2
    assert sorted(node["allocations"], key=lambda x: x["gpus"][0]["index"]) == [
        {"node_id": "n1", "job_id": a_job, "task_id": "w-0", "gpus": [{"index": 0}],
         "tenant": "vision"},
        {"gpus": [{"index": 1}]}]
    assert b_job not in json.dumps(node) and "nlp" not in json.dumps(node)
    [node] = (await gw.http.get("/v1/nodes", headers=auth(gw.admin))).json()
    assert {x["job_id"] for x in node["allocations"]} == {a_job, b_job}


async def test_the_openapi_schema_declares_bearer_auth(gw: Gateway) -> None:
    schema = (await gw.http.get("/openapi.json")).json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert {"/v1/tokens", "/v1/tokens/{token_id}", "/v1/me"} <= set(schema["paths"])
    assert schema["paths"]["/v1/jobs"]["get"]["security"] == [{"HTTPBearer": []}]
