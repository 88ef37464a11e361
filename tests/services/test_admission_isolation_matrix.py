"""Tenant isolation over every /v1 endpoint, one table: two tenants' user tokens and an
admin token, and no, malformed, unknown, expired and revoked tokens, over real HTTP
(uvicorn) against real PostgreSQL.

The table is checked against the app's own routes: a new /v1 route without a row fails
here, so nobody adds an endpoint without saying who may call it. Each row says what
tenant vision's user (the owner of the objects), tenant nlp's user (another tenant) and
an admin get; another tenant's object answers exactly like one that does not exist.
No secret of any token may reach the logs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import structlog
from fastapi import FastAPI
from fastapi.routing import APIRoute
from sqlalchemy import text
from starlette.routing import Route

from services.admission import tokens
from services.admission.routes import queues as routes_queues
from shared.events import GpuInfo, JobState, NodeInventory, NodeRegistered, utcnow
from tests.services.gateway_helpers import JOB, Gateway, auth, gateway

pytestmark = pytest.mark.db
ADMIN_ONLY = "admin role required (this token's role is user)"
MISSING = "missing bearer token: send 'Authorization: Bearer <token>'"
ELASTIC = {"name": "el", "tasks": [{"name": "w", "replicas": 2, "minReplicas": 1,
                                    "maxReplicas": 4}]}
ROLES = ("owner", "other", "admin")
TENANT = {"owner": "vision", "other": "nlp", "admin": "ops"}


def routes_of(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, those of included routers too
    (FastAPI keeps an included router whole, as one entry of ``app.routes``)."""
    out: list[tuple[str, str]] = []

    def walk(routes: list[Any], prefix: str) -> None:
        for r in routes:
            if hasattr(r, "original_router"):
                walk(r.original_router.routes, prefix + r.include_context.prefix)
            elif isinstance(r, APIRoute | Route):
                out.extend((m, prefix + r.path) for m in sorted(r.methods or ()) if m != "HEAD")
    walk(app.routes, "")
    return out


@dataclass
class Case:
    """One endpoint: the request (``{job}``, ``{env}``... filled from the world) and the
    status each role gets. ``detail``: the exact answer for a role. ``hidden``: what
    another tenant must not see in its answer, and the owner and admin do see."""

    url: str
    status: dict[str, int]
    body: dict[str, Any] | None = None
    detail: dict[str, str] = field(default_factory=dict)
    hidden: str | None = None
    own_tenant: bool = False  # the answer's tenant is the caller's


def users(admin: int) -> dict[str, int]:
    return {"owner": 403, "other": 403, "admin": admin}


ADMIN_DETAIL = {"owner": ADMIN_ONLY, "other": ADMIN_ONLY}
CASES: dict[tuple[str, str], Case] = {
    ("POST", "/v1/jobs"): Case("/v1/jobs", dict.fromkeys(ROLES, 201), JOB, own_tenant=True),
    ("GET", "/v1/jobs"): Case("/v1/jobs", dict.fromkeys(ROLES, 200), hidden="{job}"),
    ("GET", "/v1/jobs/{job_id}"): Case(
        "/v1/jobs/{job}", {"owner": 200, "other": 404, "admin": 200},
        detail={"other": "no job {job}"}),
    ("DELETE", "/v1/jobs/{job_id}"): Case(
        "/v1/jobs/{job}", {"owner": 202, "other": 404, "admin": 202},
        detail={"other": "no job {job}"}),
    ("POST", "/v1/jobs/{job_id}/resize"): Case(
        "/v1/jobs/{elastic}/resize", {"owner": 202, "other": 404, "admin": 202},
        {"replicas": 3}, detail={"other": "no job {elastic}"}),
    ("GET", "/v1/jobs/{job_id}/events"): Case(
        "/v1/jobs/{done}/events", {"owner": 200, "other": 404, "admin": 200},
        detail={"other": "no job {done}"}),
    # the owner gets as far as asking the node's agent, which does not answer
    ("GET", "/v1/jobs/{job_id}/logs"): Case(
        "/v1/jobs/{job}/logs", {"owner": 502, "other": 404, "admin": 502},
        detail={"other": "no job {job}"}),
    ("GET", "/v1/arrays/{array_id}"): Case(
        "/v1/arrays/{array}", {"owner": 200, "other": 404, "admin": 200},
        detail={"other": "no array {array}"}),
    ("DELETE", "/v1/arrays/{array_id}"): Case(
        "/v1/arrays/{array}", {"owner": 202, "other": 404, "admin": 202},
        detail={"other": "no array {array}"}),
    # every role lists its own tenant's waiting jobs with forecasts (the world's job has
    # none: no forecaster runs here; test_admission_forecasts shows a tenant sees only
    # its own and is refused another's)
    ("GET", "/v1/forecasts"): Case("/v1/forecasts", dict.fromkeys(ROLES, 200)),
    ("GET", "/v1/nodes"): Case("/v1/nodes", dict.fromkeys(ROLES, 200), hidden="{job}"),
    ("POST", "/v1/nodes/{node_id}/cordon"): Case(
        "/v1/nodes/n-cordon/cordon", users(202), detail=ADMIN_DETAIL),
    ("POST", "/v1/nodes/{node_id}/drain"): Case(
        "/v1/nodes/n-drain/drain", users(202), detail=ADMIN_DETAIL),
    ("POST", "/v1/nodes/{node_id}/uncordon"): Case(
        "/v1/nodes/n-uncordon/uncordon", users(202), detail=ADMIN_DETAIL),
    ("PUT", "/v1/nodes/{node_id}/labels"): Case(
        "/v1/nodes/n-cordon/labels", users(200), {"labels": {"team": "vision"}},
        detail=ADMIN_DETAIL),
    ("PUT", "/v1/nodes/{node_id}/taints"): Case(
        "/v1/nodes/n-cordon/taints", users(200), {"taints": ["team=vision:NoSchedule"]},
        detail=ADMIN_DETAIL),
    ("GET", "/v1/me"): Case("/v1/me", dict.fromkeys(ROLES, 200), own_tenant=True),
    ("POST", "/v1/tokens"): Case("/v1/tokens", users(201), {"tenant": "vision"},
                                 detail=ADMIN_DETAIL),
    ("GET", "/v1/tokens"): Case("/v1/tokens", users(200), detail=ADMIN_DETAIL),
    ("DELETE", "/v1/tokens/{token_id}"): Case("/v1/tokens/{spare}", users(200),
                                              detail=ADMIN_DETAIL),
    ("POST", "/v1/environments"): Case("/v1/environments", dict.fromkeys(ROLES, 201),
                                       {"name": "nb", "gpu": 1}, own_tenant=True),
    ("GET", "/v1/environments"): Case("/v1/environments", dict.fromkeys(ROLES, 200),
                                      hidden="{env}"),
    ("GET", "/v1/environments/{env_id}"): Case(
        "/v1/environments/{env}", {"owner": 200, "other": 404, "admin": 200},
        detail={"other": "no environment {env}"}),
    ("DELETE", "/v1/environments/{env_id}"): Case(
        "/v1/environments/{env}", {"owner": 202, "other": 404, "admin": 202},
        detail={"other": "no environment {env}"}),
    ("GET", "/v1/usage"): Case("/v1/usage", dict.fromkeys(ROLES, 200), hidden="vision"),
    ("GET", "/v1/queues"): Case("/v1/queues", dict.fromkeys(ROLES, 200), hidden="vision-q"),
    ("GET", "/v1/queues/{name}"): Case(
        "/v1/queues/vision-q", {"owner": 200, "other": 404, "admin": 200},
        detail={"other": "no queue vision-q"}),
    # queueing does not run here: an admin's change is accepted (202), not applied
    ("POST", "/v1/queues"): Case("/v1/queues", users(202), {"name": "new-q"},
                                 detail=ADMIN_DETAIL),
    ("PATCH", "/v1/queues/{name}"): Case("/v1/queues/vision-q", users(202), {"weight": 2},
                                         detail=ADMIN_DETAIL),
    ("POST", "/v1/queues/{name}/close"): Case("/v1/queues/vision-q/close", users(202),
                                              detail=ADMIN_DETAIL),
    ("POST", "/v1/queues/{name}/drain"): Case("/v1/queues/vision-q/drain", users(202),
                                              detail=ADMIN_DETAIL),
    ("POST", "/v1/queues/{name}/open"): Case("/v1/queues/vision-shut/open", users(202),
                                             detail=ADMIN_DETAIL),
}


@dataclass
class World:
    gw: Gateway
    tokens: dict[str, str]  # role -> secret
    ids: dict[str, str]  # what the urls name
    bad: dict[str, tuple[dict[str, str], str]]  # name -> (headers, the 401's detail)

    secrets: list[str]  # every token's, the expired and revoked ones too

    def fill(self, s: str) -> str:
        return s.format(**self.ids)

    async def send(self, method: str, case: Case, headers: dict[str, str]) -> httpx.Response:
        return await self.gw.http.request(method, self.fill(case.url), json=case.body,
                                          headers=headers)


async def _node(gw: Gateway, node_id: str, agent_url: str = "") -> None:
    await gw.apply(NodeRegistered(inventory=NodeInventory(
        node_id=node_id, cpu_milli=128_000, memory_mib=1_048_576, agent_url=agent_url,
        gpus=[GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model="H100", memory_mib=81_920)
              for i in range(8)]), agent_started_at=utcnow()))


@pytest.fixture
async def world(db_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    monkeypatch.setattr(routes_queues, "APPLY_TIMEOUT_S", 0.2)  # no queueing to answer
    async with gateway(db_url) as gw:
        secrets = {"owner": await gw.token("vision", name="alice"),
                   "other": await gw.token("nlp", name="bob"), "admin": gw.admin}
        expired_row, expired = await tokens.create_token(gw.engine, "vision", name="late")
        revoked_row, revoked = await tokens.create_token(gw.engine, "vision", name="gone")
        spare_row, _ = await tokens.create_token(gw.engine, "vision", name="spare")
        async with gw.engine.begin() as conn:
            await conn.execute(text("UPDATE api_tokens SET expires_at = now() - interval '1 s'"
                                    " WHERE id = :i"), {"i": expired_row["id"]})
        await tokens.revoke_token(gw.engine, revoked_row["id"])

        # the owner's objects: nodes (one holding its job, with an agent that does not
        # answer), queues, jobs (one elastic, one ended) and an environment
        await _node(gw, "n1", agent_url="http://127.0.0.1:9")
        for n in ("n-cordon", "n-drain", "n-uncordon"):
            await _node(gw, n)
        async with gw.engine.begin() as conn:
            await conn.execute(text("UPDATE nodes_view SET scheduling = 'cordoned'"
                                    " WHERE node_id = 'n-uncordon'"))
        await gw.queue("vision-q", tenant="vision")
        await gw.queue("vision-shut", tenant="vision", state="closed")
        owner = secrets["owner"]
        job, elastic, done = (await gw.submit(owner), await gw.submit(owner, ELASTIC),
                              await gw.submit(owner))
        async with gw.engine.begin() as conn:
            await conn.execute(text(
                """INSERT INTO allocations_view (job_id, task_id, node_id, attempt, gpus,
                       cpu_milli, memory_mib, bound_at)
                   VALUES (:j, 'w-0', 'n1', 1, CAST(:g AS jsonb), 1000, 1024, now())"""),
                {"j": job, "g": json.dumps([{"index": 0}])})
        for state in (JobState.RUNNING, JobState.SUCCEEDED):  # a run: usage for vision
            await gw.status(done, state, task="w-0", node="n1")
            await gw.status(done, state)
        r = await gw.http.post("/v1/environments", json={"name": "nb"}, headers=auth(owner))
        assert r.status_code == 201, r.text
        arr = await gw.http.post("/v1/jobs", json={**JOB, "array": "0-2"}, headers=auth(owner))
        assert arr.status_code == 201, arr.text
        yield World(gw, secrets, {"job": job, "elastic": elastic, "done": done,
                                  "env": r.json()["id"], "spare": spare_row["id"],
                                  "array": arr.json()["id"]}, {
            "no header": ({}, MISSING),
            "basic": ({"Authorization": "Basic dXNlcjpwdw=="}, MISSING),
            "bare scheme": ({"Authorization": "Bearer"}, MISSING),
            "no scheme": ({"Authorization": owner}, MISSING),
            "unknown": (auth("kairos_" + "x" * 43), "invalid token"),
            "garbage": (auth("not a token at all; 'quoted' \"too\""), "invalid token"),
            "very long": (auth("k" * 4000), "invalid token"),
            "expired": (auth(expired), "token expired"),
            "revoked": (auth(revoked), "token revoked"),
        }, [*secrets.values(), expired, revoked])


def test_every_v1_route_has_a_row() -> None:
    from services.admission.app import create_app
    from services.admission.settings import AdmissionSettings

    async def ready() -> dict[str, bool]:
        return {}

    app = create_app(AdmissionSettings(), None, ready)  # type: ignore[arg-type]
    served = {(m, p) for m, p in routes_of(app) if p.startswith("/v1/")}
    assert served - set(CASES) == set(), "add a row to CASES for each new route"
    assert set(CASES) - served == set(), "a row names a route that no longer exists"


async def test_every_route_isolates_tenants_and_refuses_bad_tokens(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    gw = world.gw
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logged:
        # bad tokens first: each is 401 saying why, and changes nothing
        before = await _outbox(gw)
        for (method, path), case in CASES.items():
            for name, (headers, why) in world.bad.items():
                r = await world.send(method, case, headers)
                assert r.status_code == 401, (method, path, name, r.text)
                assert r.json() == {"detail": why}, (method, path, name)
                assert r.headers["www-authenticate"].startswith("Bearer"), (method, path, name)
        assert await _outbox(gw) == before

        for (method, path), case in CASES.items():
            for role in ("other", "owner", "admin"):  # another tenant first: it changes nothing
                r = await world.send(method, case, auth(world.tokens[role]))
                where = (method, path, role, r.text[:300])
                assert r.status_code == case.status[role], where
                if role in case.detail:
                    assert r.json() == {"detail": world.fill(case.detail[role])}, where
                elif "other" in case.detail:  # the owner and admin get past that check
                    assert r.text != json.dumps({"detail": world.fill(case.detail["other"])})
                if case.hidden:
                    hidden = world.fill(case.hidden)
                    assert (hidden in r.text) == (role != "other"), where
                if case.own_tenant:
                    assert r.json()["tenant"] == TENANT[role], where

    # the gateway logged (the agent that did not answer), and no token's secret or hash
    assert any(e.get("event") == "agent unreachable" for e in logged), logged
    no_secret_in(repr(logged) + caplog.text, world.secrets)


def no_secret_in(logs: str, secrets: list[str]) -> None:
    for secret in secrets:
        assert secret not in logs
        assert tokens.hash_token(secret) not in logs  # the stored digest neither


async def _outbox(gw: Gateway) -> int:
    async with gw.engine.connect() as conn:
        return int(await conn.scalar(text("SELECT count(*) FROM outbox")) or 0)
