"""Cordon, drain and uncordon: the scheduler's bookkeeping (with the scheduling core),
its persistence across a leader failover (real PostgreSQL), and the admin API with
every refusal (real PostgreSQL, the gateway in process)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TypeVar

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from scheduling import Scheduler, SchedulerConfig
from services.admission import store, tokens
from services.admission.app import create_app
from services.admission.settings import AdmissionSettings
from services.scheduler.main import SchedulerService
from services.scheduler.model import Stopping
from services.scheduler.state import Output, SchedulerState
from shared.config import CommonSettings
from shared.db import make_engine
from shared.events import (
    Binding,
    BindingAction,
    EndCause,
    Envelope,
    Event,
    JobState,
    JobStatus,
    NodeAction,
    NodeCommand,
    NodeSchedulingChanged,
)
from tests.services.builders import node, ready, step

E = TypeVar("E", bound=Event)


def new_state(epoch: int = 3) -> SchedulerState:
    s = SchedulerState(epoch=epoch,
                       placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    for n in ("n1", "n2"):
        s.handle(node(n), Output())
    return s


def cmd(node_id: str, action: NodeAction, gen: int, grace: float = 30.0) -> NodeCommand:
    return NodeCommand(node_id=node_id, action=action, generation=gen, requested_by="ops",
                       grace_period_s=grace)


def bindings(out: Output) -> list[Binding]:
    return [p for e, t in out.events if t == "bindings" for p in [e.payload()]
            if isinstance(p, Binding)]


def statuses(out: Output) -> list[tuple[str, str, str]]:
    return [(p.job_id, p.state.value, p.reason) for e, _ in out.events
            for p in [e.payload()] if isinstance(p, JobStatus) and p.task is None]


def announced(out: Output) -> list[tuple[str, str]]:
    return [(p.node_id, p.scheduling.value) for e, _ in out.events for p in [e.payload()]
            if isinstance(p, NodeSchedulingChanged)]


def node_of(s: SchedulerState, job: str) -> str:
    return s.jobs[job].active()[0].node_id


def run(s: SchedulerState, job: str) -> Output:
    out = Output()
    for p in s.jobs[job].active():
        out = step(s, JobStatus(job_id=job, state=JobState.RUNNING, reason="started",
                                attempt=s.jobs[job].attempt, task=p.task_id,
                                node_id=p.node_id))
    return out


# --- the scheduler -----------------------------------------------------------------------


def test_a_cordoned_node_gets_nothing_new_and_says_why_until_uncordoned() -> None:
    s = new_state()
    out = step(s, cmd("n1", NodeAction.CORDON, 1))
    assert announced(out) == [("n1", "cordoned")]
    out = step(s, ready("A").gpus(8).build())
    assert [b.node_id for b in bindings(out)] == ["n2"]
    out = step(s, ready("B").gpus(8).build())  # room only on the cordoned node
    assert bindings(out) == [] and s.pending_reasons == {"B": "cordoned"}
    out = step(s, cmd("n1", NodeAction.UNCORDON, 2))
    assert announced(out) == [("n1", "schedulable")]
    assert [(b.job_id, b.node_id) for b in bindings(out)] == [("B", "n1")]


def test_a_job_that_fits_nowhere_else_is_not_blamed_on_the_cordon_when_it_cannot_fit_there(
) -> None:
    s = new_state()
    step(s, ready("A").gpus(8).build())
    step(s, cmd(node_of(s, "A"), NodeAction.CORDON, 1))  # cordoned and full
    step(s, ready("B").gpus(8).build())
    step(s, ready("C").gpus(8).build())
    assert s.pending_reasons["C"] != "cordoned"


def test_cordon_leaves_what_runs_there_alone() -> None:
    s = new_state()
    step(s, ready("A").gpus(4).build())
    run(s, "A")
    out = step(s, cmd(node_of(s, "A"), NodeAction.CORDON, 1))
    assert bindings(out) == [] and statuses(out) == []
    assert s.jobs["A"].state is JobState.RUNNING


def test_drain_stops_gracefully_requeues_elsewhere_and_spends_no_retry() -> None:
    s = new_state()
    step(s, ready("A").gpus(8).retries(0).build())
    run(s, "A")
    where = node_of(s, "A")
    other = ({"n1", "n2"} - {where}).pop()
    out = step(s, cmd(where, NodeAction.DRAIN, 1, grace=45))
    assert announced(out) == [(where, "draining")]
    (stop,) = bindings(out)
    assert stop.action is BindingAction.STOP and stop.grace_period_s == 45
    assert stop.reason.startswith("preempted")  # the agent's checkpoint-signal path
    assert statuses(out) == []  # nothing fails while it checkpoints
    task = s.jobs["A"].placed[0].task_id
    out = step(s, JobStatus(job_id="A", state=JobState.PREEMPTED, reason="stopped",
                            attempt=1, task=task, node_id=where))
    assert statuses(out) == [("A", "preempted", f"preempted for drain of node {where}"),
                             ("A", "admitted", f"retry after task {task} preempted: stopped"),
                             ("A", "bound", "placed on 1 node(s), on H100-80GB")]
    assert [b.node_id for b in bindings(out) if b.action is BindingAction.ALLOCATE] == [other]
    assert announced(out) == [(where, "drained")]
    # the drained attempt was free: a real failure now ends it (maxRetry 0)
    run(s, "A")
    out = step(s, JobStatus(job_id="A", state=JobState.FAILED, reason="error", attempt=2,
                            task=s.jobs["A"].active()[0].task_id, node_id=other, exit_code=1))
    assert [x[:2] for x in statuses(out)] == [("A", "failed")]


def test_drain_of_an_idle_node_is_drained_at_once() -> None:
    s = new_state()
    out = step(s, cmd("n2", NodeAction.DRAIN, 1))
    assert announced(out) == [("n2", "draining"), ("n2", "drained")]


def test_replayed_and_late_commands_change_nothing() -> None:
    s = new_state()
    step(s, cmd("n1", NodeAction.CORDON, 1), cmd("n1", NodeAction.UNCORDON, 2))
    out = step(s, cmd("n1", NodeAction.CORDON, 1))  # the first, delivered again
    assert announced(out) == [] and s.nodes["n1"].cordon == ""
    out = step(s, cmd("nx", NodeAction.CORDON, 1))  # a node nobody registered
    assert out.events == []


def test_a_re_registering_agent_keeps_its_node_cordoned() -> None:
    s = new_state()
    step(s, cmd("n1", NodeAction.CORDON, 1))
    step(s, node("n1"))
    step(s, ready("A").gpus(8).build(), ready("B").gpus(8).build())
    assert s.pending_reasons == {"B": "cordoned"}


@pytest.mark.db
async def test_cordon_and_drain_survive_a_leader_failover(db_url: str) -> None:
    engine = make_engine(db_url, pool_size=2)
    try:
        rt = SimpleNamespace(producer=None, settings=CommonSettings(database_url=db_url))
        first = SchedulerService(rt, engine, new_state(epoch=1))  # type: ignore[arg-type]
        first.state.handle(ready("A").gpus(8).build(), first.out)
        first.state.cycle(0.0, first.out)
        where = node_of(first.state, "A")
        for c in (cmd("n1" if where == "n2" else "n2", NodeAction.CORDON, 1),
                  cmd(where, NodeAction.DRAIN, 1)):
            first.state.handle(c, first.out)
        out, first.out = first.out, Output()
        await first.persist(out)

        nxt = SchedulerService(rt, engine, SchedulerState(  # type: ignore[arg-type]
            epoch=2, placer=Scheduler(SchedulerConfig.preset("default")).schedule))
        await nxt.load()
        views = nxt.state.nodes
        assert {n: (v.cordon, v.cordon_generation) for n, v in views.items()} == {
            where: ("draining", 1), ("n1" if where == "n2" else "n2"): ("cordoned", 1)}
        assert nxt.state.jobs["A"].stopping == Stopping(EndCause.DRAINED,
                                                        f"drain of node {where}")
        # the new leader finishes the drain: the stop is confirmed, A waits (both cordoned)
        out = step(nxt.state, JobStatus(job_id="A", state=JobState.PREEMPTED, reason="stopped",
                                        attempt=1, task=nxt.state.jobs["A"].placed[0].task_id,
                                        node_id=where))
        assert announced(out) == [(where, "drained")]
        assert nxt.state.pending_reasons == {"A": "cordoned"}
        out = step(nxt.state, cmd(where, NodeAction.DRAIN, 1))  # a replay after failover
        assert out.events == []
    finally:
        await engine.dispose()


# --- the admin API -----------------------------------------------------------------------


@dataclass
class Gateway:
    http: httpx.AsyncClient
    engine: AsyncEngine
    admin: dict[str, str]
    user: dict[str, str]


@pytest.fixture
async def gw(db_url: str) -> AsyncIterator[Gateway]:
    engine = make_engine(db_url, pool_size=3)

    async def ready_check() -> dict[str, bool]:
        return {"database": True}

    app = create_app(AdmissionSettings(database_url=db_url), engine, ready_check)
    _, admin = await tokens.create_token(engine, "ops", "admin", "root")
    _, user = await tokens.create_token(engine, "vision", "user", "alice")
    await store.apply_events(engine, [(Envelope.wrap(node(n), "test"), node(n))
                                      for n in ("n1", "n2")])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw") as http:
        yield Gateway(http, engine, {"Authorization": f"Bearer {admin}"},
                      {"Authorization": f"Bearer {user}"})
    await engine.dispose()


async def outbox_events(engine: AsyncEngine, kind: type[E]) -> list[E]:
    """The ``kind`` events on nodes.lifecycle the gateway's outbox holds, in order."""
    async with engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT payload FROM outbox WHERE topic = 'nodes.lifecycle' ORDER BY seq"))).all()
    return [p for (raw,) in rows for p in [Envelope.decode(bytes(raw)).payload()]
            if isinstance(p, kind)]


async def outbox_commands(engine: AsyncEngine) -> list[NodeCommand]:
    return await outbox_events(engine, NodeCommand)


async def scheduling(gw: Gateway, node_id: str) -> str:
    nodes = (await gw.http.get("/v1/nodes", headers=gw.user)).json()
    return str(next(n["scheduling"] for n in nodes if n["node_id"] == node_id))


@pytest.mark.db
async def test_commands_go_out_through_the_outbox_and_show_on_the_node(gw: Gateway) -> None:
    r = await gw.http.post("/v1/nodes/n1/drain", headers=gw.admin,
                           json={"reason": "bad fan", "grace_period_s": 90})
    assert r.status_code == 202, r.text
    assert r.json() | {"requested_by": "-"} == {
        "node_id": "n1", "action": "drain", "scheduling": "draining", "generation": 1,
        "requested_by": "-", "reason": "bad fan"}
    assert await scheduling(gw, "n1") == "draining"
    (c,) = await outbox_commands(gw.engine)
    assert (c.node_id, c.action, c.generation, c.grace_period_s, c.requested_by) == (
        "n1", NodeAction.DRAIN, 1, 90, "root")
    # the scheduler's announcements land in the read model, in generation order
    drained = NodeSchedulingChanged(node_id="n1", scheduling="drained", generation=1)
    await store.apply_events(gw.engine, [(Envelope.wrap(drained, "scheduler"), drained)])
    assert await scheduling(gw, "n1") == "drained"
    r = await gw.http.post("/v1/nodes/n1/uncordon", headers=gw.admin)  # no body: defaults
    assert (r.status_code, r.json()["generation"]) == (202, 2)
    await store.apply_events(gw.engine, [(Envelope.wrap(drained, "scheduler"), drained)])
    assert await scheduling(gw, "n1") == "schedulable"  # a late, older announcement
    assert [c.action for c in await outbox_commands(gw.engine)] == [
        NodeAction.DRAIN, NodeAction.UNCORDON]


@pytest.mark.db
async def test_refusals_say_why_and_send_nothing(gw: Gateway) -> None:
    r = await gw.http.post("/v1/nodes/n1/cordon")
    assert r.status_code == 401
    r = await gw.http.post("/v1/nodes/n1/cordon", headers=gw.user)
    assert (r.status_code, r.json()["detail"]) == (
        403, "admin role required (this token's role is user)")
    r = await gw.http.post("/v1/nodes/nope/drain", headers=gw.admin)
    assert (r.status_code, r.json()["detail"]) == (404, "no node nope")
    r = await gw.http.post("/v1/nodes/n1/uncordon", headers=gw.admin)
    assert (r.status_code, r.json()["detail"]) == (
        409, "cannot uncordon node n1: it is not cordoned")
    r = await gw.http.post("/v1/nodes/n1/drain", headers=gw.admin, json={"grace_period_s": -1})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "body.grace_period_s"
    assert await outbox_commands(gw.engine) == []
    assert (await gw.http.post("/v1/nodes/n1/cordon", headers=gw.admin)).status_code == 202
    r = await gw.http.post("/v1/nodes/n1/cordon", headers=gw.admin)
    assert (r.status_code, r.json()["detail"]) == (
        409, "cannot cordon node n1: it is already cordoned")
    assert (await gw.http.post("/v1/nodes/n1/drain", headers=gw.admin)).status_code == 202
    r = await gw.http.post("/v1/nodes/n1/drain", headers=gw.admin)
    assert (r.status_code, r.json()["detail"]) == (
        409, "cannot drain node n1: it is already being drained")
    assert [c.generation for c in await outbox_commands(gw.engine)] == [1, 2]
