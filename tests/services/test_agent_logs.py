"""Task logs: the agent's /logs endpoint (simulated and local-process runtimes), and the
gateway's GET /v1/jobs/{id}/logs proxying to a real agent HTTP server, against real
PostgreSQL, with every refusal: another tenant's job, nothing started yet, an unknown
task, a lost node, an agent without a URL, an unreachable agent, an agent without it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from kairos.embedded import free_port
from services.admission import store, tokens
from services.admission.app import create_app
from services.admission.settings import AdmissionSettings
from services.node_agent.agent import NodeAgent
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.logs_api import add_log_routes
from services.node_agent.runtimes.local_process import LocalProcessRuntime
from services.node_agent.runtimes.simulated import SimulatedRuntime
from shared.db import make_engine
from shared.events import (
    Binding,
    BindingAction,
    Envelope,
    Event,
    GpuAssignment,
    NodeLost,
    NodeRegistered,
    TaskBinding,
    utcnow,
)
from shared.http import HttpServer
from tests.services.test_agent_shell import wait_for

PRINTER = ["sh", "-c", "echo line 1; sleep 0.3; echo line 2 >&2; sleep 0.3; echo line 3"]


def allocate(job: str, node: str = "n1", duration: float = 1.2,
             command: list[str] | None = None, tasks: int = 1) -> Binding:
    return Binding(binding_id=f"{job}-1-{node}", action=BindingAction.ALLOCATE, node_id=node,
                   epoch=1, job_id=job, duration_s=duration, world_size=tasks, tasks=[
                       TaskBinding(task_id=f"w-{i}", task_name="w", role="worker", replica=i,
                                   rank=i, command=command or [],
                                   gpus=[GpuAssignment(index=i)]) for i in range(tasks)])


class Sink:
    """The agent's publish: kept, and fed to the gateway's read model when one is set."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.engine: AsyncEngine | None = None

    async def __call__(self, event: Event, event_id: str | None) -> None:
        self.events.append(event)
        if self.engine is not None:
            await store.apply_events(self.engine, [(Envelope.wrap(event, "agent", event_id),
                                                    event)])


def sim_agent(sink: Sink, node: str = "n1", url: str = "") -> NodeAgent:
    devices = SimulatedDevices(node, 8)
    return NodeAgent(node_inventory(node, devices, 64_000, 512_000, "r0", agent_url=url),
                     devices, SimulatedRuntime, sink)


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent")


# --- the agent's endpoint -------------------------------------------------------------


async def test_simulated_tasks_write_a_synthetic_log_served_whole_tailed_or_followed() -> None:
    agent = sim_agent(Sink())
    app = FastAPI()
    add_log_routes(app, {"n1": agent}, poll_s=0.05)
    await agent.handle(allocate("J", duration=1.2, tasks=2))
    async with client(app) as http:
        r = await http.get("/logs/J")
        assert r.status_code == 200 and r.headers["x-kairos-task"] == "J/w-0/1"
        assert r.headers["x-kairos-node"] == "n1"
        assert "[kairos-sim] w-0 of J attempt 1: rank 0 of 2, GPUs 0, 1.2s of training" \
            in r.text
        r = await http.get("/logs/J", params={"task": "w-1", "follow": True})
        lines = r.text.splitlines()  # the stream ends when the task does
        assert "rank 1 of 2" in lines[0] and "step 1: loss" in lines[1]
        assert lines[-1].endswith("[kairos-sim] training finished: exit 0")
        assert not agent.running("J/w-1/1")
        r = await http.get("/logs/J", params={"task": "w-1", "tail": 1})
        assert r.text.splitlines() == lines[-1:]
        r = await http.get("/logs/NOPE")
        assert r.status_code == 404
        assert r.json() == {"detail": "no logs yet: job NOPE has not run on this node"}
        r = await http.get("/logs/J", params={"task": "w-9"})
        assert r.status_code == 404 and "task w-9 of job J" in r.json()["detail"]
        r = await http.get("/logs/J", params={"node": "n9"})
        assert r.status_code == 404 and r.json()["detail"] == "node n9 is not served here"
    await agent.close()


async def test_local_process_output_is_followed_as_it_is_written(tmp_path: Path) -> None:
    sink = Sink()
    devices = SimulatedDevices("n1", 2)
    agent = NodeAgent(node_inventory("n1", devices, 8_000, 16_000, "r0"), devices,
                      lambda on_exit: LocalProcessRuntime(on_exit, tmp_path, poll_s=0.05), sink)
    app = FastAPI()
    add_log_routes(app, {"n1": agent}, token="s3cret", poll_s=0.05)
    await agent.handle(allocate("P", command=PRINTER))
    async with client(app) as http:
        r = await http.get("/logs/P")
        assert r.status_code == 401 and r.json() == {"detail": "agent token required"}
        auth = {"Authorization": "Bearer s3cret"}
        r = await http.get("/logs/P", params={"follow": True}, headers=auth)
        assert r.text == "line 1\nline 2\nline 3\n"  # stdout and stderr, in order
        await wait_for(lambda: not agent.running("P/w-0/1"))
        r = await http.get("/logs/P", params={"tail": 2, "attempt": 1}, headers=auth)
        assert r.text == "line 2\nline 3\n"
    await agent.close()


# --- the gateway's proxy ----------------------------------------------------------------


@dataclass
class Setup:
    http: httpx.AsyncClient
    engine: AsyncEngine
    sink: Sink
    agent: NodeAgent
    vision: str  # a user token of tenant vision
    nlp: str  # a user token of tenant nlp

    async def submit(self, token: str) -> str:
        r = await self.http.post("/v1/jobs", headers=auth(token), json={
            "name": "logs", "tasks": [{"name": "w", "replicas": 2, "resources": {"gpu": 1}}]})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    async def node_event(self, event: Event) -> None:
        await store.apply_events(self.engine, [(Envelope.wrap(event, "test"), event)])


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def setup(db_url: str) -> AsyncIterator[Setup]:
    engine = make_engine(db_url, pool_size=3)
    port = free_port()
    sink = Sink()
    sink.engine = engine
    agent = sim_agent(sink, url=f"http://127.0.0.1:{port}")
    agent_app = FastAPI()
    add_log_routes(agent_app, {"n1": agent}, poll_s=0.05)
    server = HttpServer(agent_app, "127.0.0.1", port)
    await server.start()

    async def ready() -> dict[str, bool]:
        return {"database": True}

    app = create_app(AdmissionSettings(database_url=db_url), engine, ready)
    vision = (await tokens.create_token(engine, "vision", "user", "alice"))[1]
    nlp = (await tokens.create_token(engine, "nlp", "user", "bob"))[1]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as http:
        s = Setup(http, engine, sink, agent, vision, nlp)
        await s.node_event(NodeRegistered(inventory=agent.inventory, agent_started_at=utcnow()))
        yield s
    await agent.close()
    await server.stop()
    await engine.dispose()


@pytest.mark.db
async def test_the_gateway_serves_a_tasks_log_from_its_agent(setup: Setup) -> None:
    job = await setup.submit(setup.vision)
    await setup.agent.handle(allocate(job, duration=1.0, tasks=2))  # reports go to the read model
    r = await setup.http.get(f"/v1/jobs/{job}/logs", headers=auth(setup.vision))
    assert r.status_code == 200, r.text
    assert r.headers["x-kairos-task"] == f"{job}/w-0/1" and r.headers["x-kairos-node"] == "n1"
    assert r.headers["x-kairos-attempt"] == "1"
    assert f"w-0 of {job} attempt 1" in r.text
    r = await setup.http.get(f"/v1/jobs/{job}/logs", headers=auth(setup.vision),
                             params={"task": "w-1", "follow": True})
    assert r.status_code == 200 and r.headers["x-kairos-task"] == f"{job}/w-1/1"
    assert r.text.splitlines()[-1].endswith("training finished: exit 0")
    # the read model's nodes show where the agent serves
    nodes = (await setup.http.get("/v1/nodes", headers=auth(setup.vision))).json()
    assert nodes[0]["inventory"]["agent_url"] == setup.agent.inventory.agent_url


@pytest.mark.db
async def test_log_requests_are_refused_with_a_reason(setup: Setup) -> None:
    job = await setup.submit(setup.vision)
    get = setup.http.get
    # another tenant's job is not there, exactly like a job that does not exist
    for who, path in ((setup.nlp, f"/v1/jobs/{job}/logs"), (setup.vision, "/v1/jobs/j-0/logs")):
        r = await get(path, headers=auth(who))
        assert r.status_code == 404 and r.json()["detail"].startswith("no job ")
    r = await get(f"/v1/jobs/{job}/logs")
    assert r.status_code == 401
    r = await get(f"/v1/jobs/{job}/logs", headers=auth(setup.vision))
    assert r.status_code == 404
    assert r.json() == {"detail": f"no logs yet: job {job} has not started a task (pending)"}
    r = await get(f"/v1/jobs/{job}/logs", headers=auth(setup.vision), params={"tail": -1})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "query.tail"

    await setup.agent.handle(allocate(job, duration=600, tasks=2))
    r = await get(f"/v1/jobs/{job}/logs", headers=auth(setup.vision), params={"task": "ps-0"})
    assert r.status_code == 404
    assert r.json() == {"detail": f"job {job} has no task ps-0 in attempt 1 (tasks: w-0, w-1)"}
    r = await get(f"/v1/jobs/{job}/logs", headers=auth(setup.vision), params={"attempt": 2})
    assert r.status_code == 404 and "has no attempt 2" in r.json()["detail"]

    # the agent has no log for a task the read model places on its node
    other = await setup.submit(setup.vision)
    await setup.sink(Binding(binding_id="x", action=BindingAction.ALLOCATE, node_id="n1",
                             epoch=1, job_id=other, tasks=[TaskBinding(
                                 task_id="w-0", task_name="w", role="w", replica=0, rank=0)]),
                     None)  # an allocation in the read model, never run by the agent
    r = await get(f"/v1/jobs/{other}/logs", headers=auth(setup.vision))
    assert r.status_code == 404 and r.json()["detail"].startswith("no logs yet")

    inv = setup.agent.inventory
    for inventory, answer, detail in (
            (inv.model_copy(update={"agent_url": f"http://127.0.0.1:{free_port()}"}), 502,
             "is unreachable: ConnectError"),
            (inv.model_copy(update={"agent_url": ""}), 503, "serves no logs")):
        await setup.node_event(NodeRegistered(inventory=inventory, agent_started_at=utcnow()))
        r = await get(f"/v1/jobs/{job}/logs", headers=auth(setup.vision))
        assert r.status_code == answer and detail in r.json()["detail"], r.text
    await setup.node_event(NodeRegistered(inventory=inv, agent_started_at=utcnow()))
    assert (await get(f"/v1/jobs/{job}/logs", headers=auth(setup.vision))).status_code == 200
    await setup.node_event(NodeLost(node_id="n1", last_seen=utcnow()))
    r = await get(f"/v1/jobs/{job}/logs", headers=auth(setup.vision))
    assert r.status_code == 503
    assert r.json() == {"detail": "node n1 is lost: its agent does not answer heartbeats"}
    doc = (await get("/openapi.json")).json()["paths"]["/v1/jobs/{job_id}/logs"]["get"]
    assert {"200", "404", "502", "503", "504"} <= set(doc["responses"])
    assert json.dumps(doc).count("text/plain")
