"""Interactive GPU environments: the job kind, the scheduler's time limit and return,
the agent's port and connection (a real process listening on KAIROS_PORT), and the
environments API over real PostgreSQL with its refusals."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from scheduling import Scheduler, SchedulerConfig
from services.admission import store, tokens
from services.admission.app import create_app
from services.admission.settings import AdmissionSettings
from services.node_agent.agent import NodeAgent
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.runtimes.base import ExitCallback, Runtime
from services.node_agent.runtimes.local_process import LocalProcessRuntime
from services.node_agent.runtimes.simulated import SimulatedRuntime
from services.scheduler.bindings import HELD_S
from services.scheduler.state import Output, SchedulerState
from shared.db import make_engine
from shared.events import (
    RETURNED,
    TIME_LIMIT_REACHED,
    Binding,
    BindingAction,
    CommandAction,
    Connection,
    Envelope,
    JobCommand,
    JobState,
    JobStatus,
    TaskBinding,
    utcnow,
)
from shared.jobspec import JobSpec, parse_job_spec
from tests.services.builders import node, step
from tests.services.test_agent_shell import Recorder, wait_for

SESSION = {"name": "nb", "kind": "Interactive", "timeLimit": 600,
           "tasks": [{"name": "session", "resources": {"gpu": 1}}]}


# --- the job kind --------------------------------------------------------------------------


def test_an_interactive_job_is_one_replica_with_a_time_limit() -> None:
    spec = parse_job_spec(SESSION)
    assert spec.interactive and spec.time_limit == 600
    assert not parse_job_spec({"name": "b", "tasks": [{"name": "w"}]}).interactive
    for bad, says in (({**SESSION, "timeLimit": None}, "needs a timeLimit"),
                      ({**SESSION, "tasks": [{"name": "s", "replicas": 2}]}, "one replica"),
                      ({**SESSION, "kind": "Pod"}, "must be one of Job, Interactive")):
        with pytest.raises(ValidationError, match=says):
            parse_job_spec(bad)


# --- the scheduler ---------------------------------------------------------------------------


def sched() -> SchedulerState:
    s = SchedulerState(epoch=2, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    s.handle(node("n1"), Output())
    return s


def ready_of(job_id: str, spec: JobSpec):  # type: ignore[no-untyped-def]
    from shared.events import JobReady

    return JobReady(job_id=job_id, queue="default", tenant="t", user="u", spec=spec,
                    submitted_at=utcnow(), admitted_at=utcnow())


def job_statuses(out: Output) -> list[tuple[str, str]]:
    return [(p.state.value, p.reason) for e, _ in out.events for p in [e.payload()]
            if isinstance(p, JobStatus) and p.task is None]


def started(s: SchedulerState, job: str) -> str:
    task = s.jobs[job].placed[0].task_id
    step(s, JobStatus(job_id=job, state=JobState.RUNNING, reason="started", task=task,
                      node_id="n1"))
    return task


def test_the_binding_asks_the_agent_for_a_session_held_until_its_limit() -> None:
    s = sched()
    out = step(s, ready_of("E", parse_job_spec(SESSION)))
    (b,) = [e.payload() for e, t in out.events if t == "bindings"]
    assert isinstance(b, Binding)
    assert (b.interactive, b.time_limit_s, b.duration_s) == (True, 600, HELD_S)


def test_the_time_limit_ends_a_session_cancelled_and_a_batch_job_failed_without_retry(
) -> None:
    s = sched()
    step(s, ready_of("E", parse_job_spec(SESSION)),
         ready_of("B", parse_job_spec({"name": "b", "timeLimit": 5, "maxRetry": 3,
                                       "tasks": [{"name": "w", "resources": {"gpu": 1}}]})))
    for job, final in (("E", "cancelled"), ("B", "failed")):
        task = started(s, job)
        out = step(s, JobStatus(job_id=job, state=JobState.CANCELLED, task=task, node_id="n1",
                                reason=TIME_LIMIT_REACHED))
        assert job_statuses(out) == [(final, TIME_LIMIT_REACHED)]
        assert not [t for _, t in out.events if t == "bindings"]  # not placed again


def test_returning_a_session_ends_it_cancelled_returned() -> None:
    s = sched()
    step(s, ready_of("E", parse_job_spec(SESSION)))
    task = started(s, "E")
    out = step(s, JobCommand(job_id="E", action=CommandAction.CANCEL, reason=RETURNED))
    (stop,) = [e.payload() for e, t in out.events if t == "bindings"]
    assert isinstance(stop, Binding) and stop.action is BindingAction.STOP
    out = step(s, JobStatus(job_id="E", state=JobState.CANCELLED, task=task, node_id="n1",
                            reason="stopped by scheduler"))
    assert job_statuses(out) == [("cancelled", RETURNED)]
    # returned while it still waits: ends at once with the same reason
    s.handle(node("n1", gpus=0), Output())
    step(s, ready_of("W", parse_job_spec(SESSION)))
    out = step(s, JobCommand(job_id="W", action=CommandAction.CANCEL, reason=RETURNED))
    assert job_statuses(out) == [("cancelled", RETURNED)]


# --- the agent -------------------------------------------------------------------------------


def session_binding(job: str, command: list[str], limit: float | None = None) -> Binding:
    return Binding(binding_id=f"b-{job}", action=BindingAction.ALLOCATE, node_id="n1",
                   epoch=1, job_id=job, grace_period_s=1, interactive=True,
                   time_limit_s=limit, tasks=[TaskBinding(
                       task_id="session-0", task_name="session", role="session", replica=0,
                       rank=0, command=command)])


def reports(rec: Recorder, job: str) -> list[JobStatus]:
    return [e for e in rec.events if isinstance(e, JobStatus) and e.job_id == job]


async def test_a_simulated_session_reports_a_simulated_connection_and_stops_at_its_limit(
) -> None:
    rec = Recorder()
    devices = SimulatedDevices("n1", 2)
    agent = NodeAgent(node_inventory("n1", devices, 8000, 16384, "r0"), devices,
                      SimulatedRuntime, rec)
    b = session_binding("E", [], limit=0.2).model_copy(update={"duration_s": HELD_S})
    await agent.handle(b)
    (running,) = reports(rec, "E")
    assert running.state is JobState.RUNNING and running.connection is not None
    assert running.connection.simulated and running.connection.host == "127.0.0.1"
    await agent.handle(b)  # redelivered: the same session, not a second one
    await wait_for(lambda: len(reports(rec, "E")) == 2)
    end = reports(rec, "E")[1]
    assert (end.state, end.reason) == (JobState.CANCELLED, TIME_LIMIT_REACHED)
    await agent.close()


async def test_a_process_session_listens_on_the_port_the_agent_reports(tmp_path: Path) -> None:
    rec = Recorder()
    devices = SimulatedDevices("n1", 2)

    def runtime(on_exit: ExitCallback) -> Runtime:
        return LocalProcessRuntime(on_exit, tmp_path, poll_s=0.05)

    agent = NodeAgent(node_inventory("n1", devices, 8000, 16384, "r0", runtime="process"),
                      devices, runtime, rec, str(tmp_path))
    server = ("import os, socket\n"
              "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
              "s.bind(('127.0.0.1', int(os.environ['KAIROS_PORT']))); s.listen()\n"
              "while True:\n"
              "    c, _ = s.accept(); c.sendall(b'kairos ' + os.environ['KAIROS_PORT'].encode())"
              "; c.close()\n")
    import sys

    await agent.handle(session_binding("P", [sys.executable, "-c", server], limit=60))
    try:
        (running,) = reports(rec, "P")
        conn = running.connection
        assert conn is not None and conn.port and not conn.simulated
        greeting = b""
        async with asyncio.timeout(10):
            while not greeting:
                try:
                    reader, writer = await asyncio.open_connection(conn.host, conn.port)
                except OSError:  # not listening yet
                    await asyncio.sleep(0.05)
                    continue
                greeting = await reader.read()
                writer.close()
        assert greeting == f"kairos {conn.port}".encode()
    finally:
        await agent.handle(Binding(binding_id="stop-P", action=BindingAction.STOP,
                                   node_id="n1", epoch=1, job_id="P", grace_period_s=1,
                                   reason="returned", tasks=[TaskBinding(
                                       task_id="session-0", task_name="session", role="",
                                       replica=0, rank=0)]))
        await wait_for(lambda: len(reports(rec, "P")) == 2, timeout=10)
        await agent.close()
    assert reports(rec, "P")[1].state is JobState.CANCELLED


# --- the API ---------------------------------------------------------------------------------


@dataclass
class Gateway:
    http: httpx.AsyncClient
    engine: AsyncEngine
    alice: dict[str, str]  # tenant vision
    bob: dict[str, str]  # tenant nlp


@pytest.fixture
async def gw(db_url: str) -> AsyncIterator[Gateway]:
    engine = make_engine(db_url, pool_size=3)

    async def ready_check() -> dict[str, bool]:
        return {"database": True}

    app = create_app(AdmissionSettings(database_url=db_url), engine, ready_check)
    _, alice = await tokens.create_token(engine, "vision", "user", "alice")
    _, bob = await tokens.create_token(engine, "nlp", "user", "bob")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as http:
        yield Gateway(http, engine, {"Authorization": f"Bearer {alice}"},
                      {"Authorization": f"Bearer {bob}"})
    await engine.dispose()


async def report(gw: Gateway, st: JobStatus) -> None:
    await store.apply_events(gw.engine, [(Envelope.wrap(st, "test"), st)])


async def commands(engine: AsyncEngine) -> list[JobCommand]:
    async with engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT payload FROM outbox WHERE topic = 'jobs.commands' ORDER BY seq"))).all()
    return [p for (raw,) in rows for p in [Envelope.decode(bytes(raw)).payload()]
            if isinstance(p, JobCommand)]


@pytest.mark.db
async def test_request_run_connect_and_return(gw: Gateway) -> None:
    r = await gw.http.post("/v1/environments", headers=gw.alice,
                           json={"gpuMemory": 20480, "gpuCompute": 50, "timeLimit": 900,
                                 "name": "nb"})
    assert r.status_code == 201, r.text
    env = r.json()
    assert (env["state"], env["time_limit_s"], env["connection"], env["tenant"]) == (
        "pending", 900, None, "vision")
    assert env["resources"]["gpuMemory"] == 20480
    eid = env["id"]
    job = (await gw.http.get(f"/v1/jobs/{eid}", headers=gw.alice)).json()
    assert job["spec"]["kind"] == "Interactive"  # the same job, the same queues
    conn = Connection(host="10.0.0.7", port=31234)
    for st in (JobStatus(job_id=eid, state=JobState.RUNNING, reason="started",
                         task="session-0", node_id="n1", connection=conn),
               JobStatus(job_id=eid, state=JobState.RUNNING, reason="all tasks running")):
        await report(gw, st)
    got = (await gw.http.get(f"/v1/environments/{eid}", headers=gw.alice)).json()
    assert got["state"] == "running"
    assert got["connection"] == {"host": "10.0.0.7", "port": 31234, "service": "",
                                 "simulated": False}
    assert got["expires_at"] is not None
    listed = (await gw.http.get("/v1/environments", headers=gw.alice)).json()["items"]
    assert [e["id"] for e in listed] == [eid]
    assert (await gw.http.get("/v1/environments", headers=gw.bob)).json()["items"] == []
    r = await gw.http.delete(f"/v1/environments/{eid}", headers=gw.alice)
    assert r.status_code == 202
    (c,) = await commands(gw.engine)
    assert (c.job_id, c.action, c.reason, c.requested_by) == (
        eid, CommandAction.CANCEL, RETURNED, "alice")
    await report(gw, JobStatus(job_id=eid, state=JobState.CANCELLED, reason=RETURNED))
    got = (await gw.http.get(f"/v1/environments/{eid}", headers=gw.alice)).json()
    assert (got["state"], got["reason"], got["connection"]) == ("cancelled", RETURNED, None)
    r = await gw.http.delete(f"/v1/environments/{eid}", headers=gw.alice)
    assert (r.status_code, r.json()["detail"]) == (
        409, f"environment {eid} already ended (cancelled: returned)")


@pytest.mark.db
async def test_refusals_say_why_and_leak_nothing(gw: Gateway) -> None:
    eid = (await gw.http.post("/v1/environments", headers=gw.alice, json={})).json()["id"]
    for method in ("GET", "DELETE"):  # another tenant's: as if it did not exist
        r = await gw.http.request(method, f"/v1/environments/{eid}", headers=gw.bob)
        assert (r.status_code, r.json()["detail"]) == (404, f"no environment {eid}")
    batch = (await gw.http.post("/v1/jobs", headers=gw.alice, json={
        "name": "b", "tasks": [{"name": "w"}]})).json()["id"]
    r = await gw.http.get(f"/v1/environments/{batch}", headers=gw.alice)
    assert r.status_code == 404  # a batch job is not an environment
    r = await gw.http.get("/v1/environments?tenant=nlp", headers=gw.alice)
    assert r.status_code == 403
    assert (await gw.http.get("/v1/environments")).status_code == 401
    r = await gw.http.post("/v1/environments", headers=gw.alice,
                           json={"timeLimit": 10 * 86400, "gpuz": 1})
    assert r.status_code == 422
    assert {d["field"] for d in r.json()["detail"]} == {"body.timeLimit", "body.gpuz"}
    r = await gw.http.post("/v1/environments", headers=gw.alice,
                           json={"gpu": 2, "gpuMemory": 1024})
    assert r.status_code == 422 and "not both" in r.json()["detail"][0]["message"]
    r = await gw.http.post("/v1/environments", headers=gw.alice, json={"queue": "nope"})
    assert r.status_code == 422 and "no queue 'nope'" in r.text  # the same queue checks
    assert await commands(gw.engine) == []
