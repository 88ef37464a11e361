"""The queue API of the gateway over HTTP (in process) against real PostgreSQL: every
refusal (401/403/404/409/422) with its body, tenant isolation, submits checked against
the queue, a waiting job explained by GET /v1/jobs/{id}; and one admin change through
the real chain: gateway outbox -> broker -> queueing -> broker -> gateway read model."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission import store, tokens
from services.admission.app import create_app
from services.admission.routes import queues as routes_queues
from services.admission.settings import AdmissionSettings
from services.queueing.config import parse_queues
from services.queueing.service import Queueing
from shared.bus import Consumer, ConsumerOptions, Producer
from shared.config import CommonSettings
from shared.db import make_engine
from shared.events import Envelope, Event, QueueChanged, QueueStatus, WaitingJob
from shared.outbox import OutboxRelay
from shared.queuespec import QueueSpec
from shared.topics import JOBS_COMMANDS, JOBS_STATUS, JOBS_SUBMITTED, QUEUES_EVENTS

pytestmark = pytest.mark.db
JOB = {"name": "train", "tasks": [{"name": "w", "resources": {"gpu": 1}}]}


@dataclass
class Gateway:
    http: httpx.AsyncClient
    engine: AsyncEngine
    admin: str
    vision: str  # a user token of tenant vision
    nlp: str

    async def announce(self, *events: QueueChanged | QueueStatus) -> None:
        """What queueing publishes, applied by the gateway's read model."""
        await store.apply_events(self.engine, [(Envelope.wrap(e, "queueing"), e)
                                               for e in events])


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def changed(name: str, version: int = 1, **fields: Any) -> QueueChanged:
    spec = QueueSpec.model_validate({"name": name, **fields})
    return QueueChanged(queue=name, change="created", version=version, settings={
        **spec.public(), "effective_tenant": fields.get("tenant", "")})


@pytest.fixture
async def gw(db_url: str) -> AsyncIterator[Gateway]:
    engine = make_engine(db_url, pool_size=3)

    async def ready() -> dict[str, bool]:
        return {"database": True}

    app = create_app(AdmissionSettings(database_url=db_url), engine, ready)
    _, admin = await tokens.create_token(engine, "ops", "admin", "root")
    _, vision = await tokens.create_token(engine, "vision", "user", "ana")
    _, nlp = await tokens.create_token(engine, "nlp", "user", "bo")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as http:
        g = Gateway(http, engine, admin, vision, nlp)
        await g.announce(changed("cluster", kind="cohort"),
                         changed("vision", parent="cluster", tenant="vision",
                                 guaranteed={"gpus": 4}),
                         changed("nlp", parent="cluster", tenant="nlp", guaranteed={"gpus": 4}),
                         changed("default", parent="cluster"))
        yield g
    await engine.dispose()


async def test_queue_routes_refuse_without_a_valid_token(gw: Gateway) -> None:
    for method, path in (("GET", "/v1/queues"), ("GET", "/v1/queues/nlp"),
                         ("POST", "/v1/queues"), ("PATCH", "/v1/queues/nlp"),
                         ("POST", "/v1/queues/nlp/close"), ("POST", "/v1/queues/nlp/drain"),
                         ("POST", "/v1/queues/nlp/open")):
        r = await gw.http.request(method, path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (method, path)
        r = await gw.http.request(method, path, headers=auth("kairos_nope"))
        assert r.status_code == 401 and r.json() == {"detail": "invalid token"}


async def test_users_see_their_tenants_and_shared_queues_and_manage_none(gw: Gateway) -> None:
    r = await gw.http.get("/v1/queues", headers=auth(gw.vision))
    assert r.status_code == 200
    assert [q["name"] for q in r.json()] == ["cluster", "default", "vision"]  # shared + own
    r = await gw.http.get("/v1/queues", headers=auth(gw.admin))
    assert [q["name"] for q in r.json()] == ["cluster", "default", "nlp", "vision"]
    r = await gw.http.get("/v1/queues/nlp", headers=auth(gw.vision))
    assert r.status_code == 404 and r.json() == {"detail": "no queue nlp"}  # no leak
    for method, path, body in (("POST", "/v1/queues", {"name": "x"}),
                               ("PATCH", "/v1/queues/vision", {"weight": 2}),
                               ("POST", "/v1/queues/vision/close", None),
                               ("POST", "/v1/queues/vision/drain", None),
                               ("POST", "/v1/queues/vision/open", None)):
        r = await gw.http.request(method, path, json=body, headers=auth(gw.vision))
        assert r.status_code == 403, (method, path)
        assert r.json() == {"detail": "admin role required (this token's role is user)"}


async def test_admin_changes_are_checked_before_they_are_sent(gw: Gateway) -> None:
    h = auth(gw.admin)

    async def refused(method: str, path: str, body: Any = None) -> tuple[int, Any]:
        r = await gw.http.request(method, path, json=body, headers=h)
        return r.status_code, r.json()["detail"]

    assert await refused("POST", "/v1/queues", {"name": "nlp"}) == (
        409, "queue nlp already exists")
    code, detail = await refused("POST", "/v1/queues", {"name": "Bad!", "weight": 0})
    assert code == 422 and {d["field"] for d in detail} == {"body.name", "body.weight"}
    code, detail = await refused("POST", "/v1/queues", {"name": "cv", "parent": "visoin"})
    assert code == 422 and detail[0]["field"] == "parent"
    assert detail[0]["message"] == "unknown queue or cohort 'visoin' (did you mean 'vision'?)"
    code, detail = await refused("POST", "/v1/queues", {
        "name": "cv", "parent": "vision", "tenant": "nlp"})
    assert code == 422 and detail[0]["field"] == "tenant"
    code, detail = await refused("POST", "/v1/queues", {
        "name": "cv", "guaranteed": {"gpus": 1}, "lending_limit": {"gpus": 2}})
    assert code == 422 and detail[0]["field"] == "lending_limit.gpus"
    assert await refused("PATCH", "/v1/queues/ghost", {"weight": 2}) == (404, "no queue ghost")
    code, detail = await refused("PATCH", "/v1/queues/nlp", {})
    assert code == 422 and detail[0]["message"] == "name at least one field to change"
    code, detail = await refused("PATCH", "/v1/queues/nlp", {"colour": "red"})
    assert code == 422 and detail[0]["field"] == "body.colour"
    assert await refused("POST", "/v1/queues/ghost/close") == (404, "no queue ghost")
    assert await refused("POST", "/v1/queues/nlp/open") == (409, "queue nlp is already open")
    assert await refused("POST", "/v1/queues/cluster/drain") == (
        409, "cluster is a cohort: it holds no jobs, so it cannot be drained")


async def test_submits_go_only_to_open_queues_the_caller_may_use(gw: Gateway) -> None:
    async def submit(token: str, queue: str) -> httpx.Response:
        return await gw.http.post("/v1/jobs", json={**JOB, "queue": queue}, headers=auth(token))

    assert (await submit(gw.vision, "vision")).status_code == 201
    assert (await submit(gw.vision, "default")).status_code == 201  # shared
    for queue in ("nlp", "nowhere"):  # another tenant's queue answers like no queue
        r = await submit(gw.vision, queue)
        assert r.status_code == 422
        assert r.json()["detail"] == [{"field": "queue", "type": "value_error", "message":
                                       f"no queue {queue!r}; open queues: default, vision"}]
    r = await submit(gw.vision, "cluster")
    assert r.status_code == 422 and "is a cohort" in r.json()["detail"][0]["message"]
    closed = changed("vision", version=2, parent="cluster", tenant="vision", state="closed")
    await gw.announce(closed)
    r = await submit(gw.vision, "vision")
    assert r.status_code == 409
    assert r.json() == {"detail": "queue vision is closed: it accepts no new jobs"}


async def test_a_job_larger_than_its_queues_quota_ceiling_is_refused(gw: Gateway) -> None:
    """vision is guaranteed 4 GPUs in cohort cluster, whose members lend it up to 4 more:
    it can never hold more than 8. A larger job would wait forever with reason quota."""
    def job(gpus: int, queue: str = "vision") -> dict[str, Any]:
        return {"name": "big", "queue": queue,
                "tasks": [{"name": "w", "replicas": gpus, "resources": {"gpu": 1}}]}

    r = await gw.http.post("/v1/jobs", json=job(9), headers=auth(gw.vision))
    assert r.status_code == 422
    assert r.json()["detail"] == [{
        "field": "tasks", "type": "over_quota", "queue": "vision", "limited_at": "cluster",
        "ceiling": {"gpus": 8.0, "cpu_milli": None, "memory_mib": None},
        "ask": {"gpus": 9.0, "cpu_milli": 9000.0, "memory_mib": 9 * 1024.0},
        "message": "the job asks for 9 GPUs at once; queue vision can never hold more than "
                   "8 (its guarantee with all it may borrow, bounded by cluster above it): "
                   "it would wait forever"}]
    assert (await gw.http.post("/v1/jobs", json=job(8), headers=auth(gw.vision))).status_code \
        == 201
    # an environment is held to the same ceiling
    r = await gw.http.post("/v1/environments", json={"queue": "vision", "gpu": 9},
                           headers=auth(gw.vision))
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "over_quota"
    # a borrowing limit lowers it; the refusal names where the limit binds
    await gw.announce(changed("vision", version=2, parent="cluster", tenant="vision",
                              guaranteed={"gpus": 4}, borrowing_limit={"gpus": 1}))
    r = await gw.http.post("/v1/jobs", json=job(6), headers=auth(gw.vision))
    assert r.status_code == 422 and r.json()["detail"][0]["ceiling"]["gpus"] == 5.0
    # a team queue under vision is bounded by vision's ceiling above it
    await gw.announce(changed("vision-dev", parent="vision", tenant="vision"))
    r = await gw.http.post("/v1/jobs", json=job(6, "vision-dev"), headers=auth(gw.vision))
    d = r.json()["detail"][0]
    assert r.status_code == 422 and (d["limited_at"], d["ceiling"]["gpus"]) == ("vision", 5.0)
    assert "bounded by vision above it" in d["message"]
    # a tree without quota has no ceiling
    await gw.announce(changed("scratch"))
    r = await gw.http.post("/v1/jobs", json=job(64, "scratch"), headers=auth(gw.vision))
    assert r.status_code == 201


async def test_a_waiting_job_says_where_and_why(gw: Gateway) -> None:
    r = await gw.http.post("/v1/jobs", json={**JOB, "queue": "nlp"}, headers=auth(gw.nlp))
    job_id = r.json()["id"]
    await gw.announce(QueueStatus(
        queue="nlp", tenant="nlp", guaranteed={"gpus": 4}, used={"gpus": 4.0},
        borrowed={"gpus": 0.0}, pending=1, running=4,
        waiting=[WaitingJob(job_id=job_id, position=1, reason="quota",
                            detail="nlp: over nominal quota")]))
    job = (await gw.http.get(f"/v1/jobs/{job_id}", headers=auth(gw.nlp))).json()
    assert job["waiting"]["position"] == 1 and job["waiting"]["reason"] == "quota"
    assert job["waiting"]["queue"] == "nlp" and job["waiting"]["estimated_start"] is None
    q = (await gw.http.get("/v1/queues/nlp", headers=auth(gw.nlp))).json()
    assert (q["used"]["gpus"], q["pending"], q["running"]) == (4.0, 1, 4)
    await gw.announce(QueueStatus(queue="nlp", tenant="nlp"))  # it left the queue
    job = (await gw.http.get(f"/v1/jobs/{job_id}", headers=auth(gw.nlp))).json()
    assert job["waiting"] is None


@pytest.mark.broker
async def test_an_admin_change_goes_through_queueing_and_back(db_url: str, broker: str) -> None:
    """The real chain: the gateway's outbox relay, queueing's consumer and the gateway's
    read-model consumer, all on the real broker; the API answers once queueing applied."""
    engine = make_engine(db_url, pool_size=5)
    settings = CommonSettings(service_name="test", kafka_bootstrap=broker, retry_backoff_s=0.01,
                              session_timeout_ms=6000, heartbeat_interval_ms=500,
                              rebalance_timeout_ms=6000, fetch_max_wait_ms=20)
    producer = Producer(broker, "test")
    await producer.start()
    ordering, specs = parse_queues({"cohorts": [{"name": "cluster"}], "queues": [
        {"name": "nlp", "parent": "cluster", "tenant": "nlp", "guaranteed": {"gpus": 4}}]})
    queueing = Queueing(producer, engine, ordering)

    async def read_model(env: Envelope, ev: Event) -> None:
        await store.apply_events(engine, [(env, ev)])

    tag = uuid.uuid4().hex[:8]
    dev = f"dev-{tag}"  # the topic keeps earlier runs' commands: a name of this run only
    consumers = [
        Consumer(settings, ConsumerOptions(f"queueing-{tag}", [
            JOBS_SUBMITTED.name, JOBS_COMMANDS.name, JOBS_STATUS.name, QUEUES_EVENTS.name]),
            queueing.handle, producer, batch_handler=queueing.handle_batch),
        Consumer(settings, ConsumerOptions(f"admission-{tag}", [QUEUES_EVENTS.name]),
                 read_model, producer)]
    relay = OutboxRelay(engine, producer, db_url, timedelta(hours=1), source="admission")
    tasks = []
    try:
        await queueing.start(specs)  # announces its queues to the read model
        for c in consumers:
            await c.start()
            tasks.append(asyncio.create_task(c.run()))
        tasks.append(asyncio.create_task(relay.run()))

        async def ready() -> dict[str, bool]:
            return {"database": True}

        app = create_app(AdmissionSettings(database_url=db_url), engine, ready)
        _, admin = await tokens.create_token(engine, "ops", "admin", "root")
        routes_queues.APPLY_TIMEOUT_S = 60.0  # a fresh consumer group takes seconds to join
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw") as http:
            async with asyncio.timeout(60):  # queueing's start announcement reaches the model
                while "cluster" not in {q["name"] for q in (await http.get(
                        "/v1/queues", headers=auth(admin))).json()}:
                    await asyncio.sleep(0.1)
            r = await http.post("/v1/queues", headers=auth(admin), json={
                "name": dev, "parent": "cluster", "guaranteed": {"gpus": 2},
                "borrowing_limit": {"gpus": 2}})
            assert r.status_code == 201, r.text
            made = r.json()
            assert (made["tenant"], made["guaranteed"]["gpus"], made["version"]) == ("", 2, 1)
            r = await http.post(f"/v1/queues/{dev}/drain", headers=auth(admin))
            assert r.status_code == 200 and r.json()["state"] == "draining"
            r = await http.patch(f"/v1/queues/{dev}", headers=auth(admin),
                                 json={"guaranteed": {"gpus": 3}, "weight": 2})
            assert r.status_code == 200
            assert (r.json()["guaranteed"]["gpus"], r.json()["weight"]) == (3, 2)
            assert r.json()["state"] == "draining" and r.json()["version"] == 3
    finally:
        routes_queues.APPLY_TIMEOUT_S = 10.0
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for c in consumers:
            await c.stop()
        await producer.stop()
        await engine.dispose()
