"""An admin's labels and taints on a node (``kairos node label|taint``): the scheduler
places by them beside the agent's, ignores replays and older changes, keeps them across
a re-registration and a leader failover (real PostgreSQL); the admin API refuses
everyone but an admin and every malformed label or taint, and sends the whole set
through the outbox (real PostgreSQL, the gateway in process). The agent's own labels
(from NVML: driver, CUDA, NVLink domain) show in the node's inventory."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from scheduling import Scheduler, SchedulerConfig
from services.admission import store
from services.node_agent.devices import nvml as nvml_backend
from services.node_agent.inventory import node_inventory
from services.scheduler.main import SchedulerService
from services.scheduler.state import Output, SchedulerState
from shared.config import CommonSettings
from shared.db import make_engine
from shared.events import Envelope, NodeLabels, NodeRegistered, utcnow
from shared.jobspec import parse_job_spec
from tests.fakes.fake_nvml import NVL72_CLUSTER, FakeNvml, gb200_tray
from tests.services.builders import node, ready, step
from tests.services.test_node_ops import Gateway, gw, new_state, outbox_events  # noqa: F401


def labels(node_id: str, gen: int, taints: tuple[str, ...] = (), **kv: str) -> NodeLabels:
    return NodeLabels(node_id=node_id, labels=kv, taints=list(taints), generation=gen,
                      requested_by="ops")


def selecting(job_id: str, **extra: object):  # type: ignore[no-untyped-def]
    b = ready(job_id).gpus(1)
    spec = b.build().spec.model_dump(by_alias=True, exclude_none=True) | extra
    r = b.build()
    return r.model_copy(update={"spec": parse_job_spec(spec)})


def placed_on(s: SchedulerState, job_id: str) -> str:
    return s.jobs[job_id].active()[0].node_id


def test_a_job_selecting_an_admins_label_lands_only_on_that_node() -> None:
    s = new_state()
    step(s, labels("n2", 1, team="vision"))
    for i in range(3):
        step(s, selecting(f"J{i}", nodeSelector={"team": "vision"}))
        assert placed_on(s, f"J{i}") == "n2"


def test_an_admins_taint_keeps_out_jobs_that_do_not_tolerate_it() -> None:
    s = new_state()
    step(s, labels("n1", 1, ("maintenance=true:NoSchedule",)))
    for i in range(3):
        step(s, ready(f"P{i}").gpus(1).build())
        assert placed_on(s, f"P{i}") == "n2"
    step(s, selecting("T", nodeSelector={}, tolerations=[
        {"key": "maintenance", "operator": "Exists"}], gpuModel="H100"))
    assert placed_on(s, "T") in ("n1", "n2")  # it may go anywhere


def test_replays_and_older_changes_are_ignored_and_a_re_registration_keeps_them() -> None:
    s = new_state()
    step(s, labels("n1", 2, zone="b"))
    out = step(s, labels("n1", 1, zone="a"))  # older, delivered late
    assert s.nodes["n1"].admin_labels == {"zone": "b"} and "n1" not in out.dirty_nodes
    step(s, node("n1"))  # the agent restarts and registers again
    assert s.nodes["n1"].admin_labels == {"zone": "b"}
    step(s, labels("nope", 1, zone="c"))  # an unknown node: ignored, no error
    assert "nope" not in s.nodes


@pytest.mark.db
async def test_labels_and_taints_survive_a_leader_failover(db_url: str) -> None:
    engine = make_engine(db_url, pool_size=2)
    try:
        rt = SimpleNamespace(producer=None, settings=CommonSettings(database_url=db_url))
        first = SchedulerService(rt, engine, new_state(epoch=1))  # type: ignore[arg-type]
        first.state.handle(labels("n1", 3, ("gpu=bad:NoSchedule",), team="nlp"), first.out)
        out, first.out = first.out, Output()
        await first.persist(out)
        nxt = SchedulerService(rt, engine, SchedulerState(  # type: ignore[arg-type]
            epoch=2, placer=Scheduler(SchedulerConfig.preset("default")).schedule))
        await nxt.load()
        v = nxt.state.nodes["n1"]
        assert (v.admin_labels, v.admin_taints, v.labels_generation) == (
            {"team": "nlp"}, ("gpu=bad:NoSchedule",), 3)
        step(nxt.state, node("n1"), node("n2"))  # both agents register with the new leader
        assert nxt.state.nodes["n1"].admin_labels == {"team": "nlp"}
        step(nxt.state, ready("A").gpus(1).build())
        assert placed_on(nxt.state, "A") == "n2"  # the taint still holds
    finally:
        await engine.dispose()


# --- the admin API -----------------------------------------------------------------------


async def outbox_labels(engine: AsyncEngine) -> list[NodeLabels]:
    return await outbox_events(engine, NodeLabels)


@pytest.mark.db
async def test_labels_and_taints_go_out_whole_and_show_on_the_node(gw: Gateway) -> None:  # noqa: F811
    r = await gw.http.put("/v1/nodes/n1/labels", headers=gw.admin,
                          json={"labels": {"team": "vision", "example.com/rack-row": "b"}})
    assert r.status_code == 200, r.text
    assert (r.json()["generation"], r.json()["taints"]) == (1, [])
    r = await gw.http.put("/v1/nodes/n1/taints", headers=gw.admin,
                          json={"taints": ["maintenance=true:NoSchedule", "x:PreferNoSchedule",
                                           "maintenance=true:NoSchedule"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["labels"] == {"team": "vision", "example.com/rack-row": "b"}  # kept
    assert body["taints"] == ["maintenance=true:NoSchedule", "x=:PreferNoSchedule"]
    assert body["generation"] == 2
    sent = await outbox_labels(gw.engine)
    assert [(e.generation, e.labels, e.taints, e.requested_by) for e in sent] == [
        (1, {"team": "vision", "example.com/rack-row": "b"}, [], "root"),
        (2, {"team": "vision", "example.com/rack-row": "b"}, body["taints"], "root")]
    nodes = {n["node_id"]: n for n in (await gw.http.get("/v1/nodes", headers=gw.user)).json()}
    assert nodes["n1"]["admin_labels"] == {"team": "vision", "example.com/rack-row": "b"}
    assert nodes["n1"]["admin_taints"] == body["taints"] and nodes["n2"]["admin_labels"] == {}


@pytest.mark.db
@pytest.mark.parametrize(("path", "body", "field"), [
    ("labels", {"labels": {"kairos.io/gpu-model": "H100-80GB"}}, "body.labels"),
    ("labels", {"labels": {"bad key!": "x"}}, "body.labels.bad key!.[key]"),
    ("labels", {"labels": {"k": "v" * 64}}, "body.labels.k"),
    ("labels", {"labels": {f"k{i}": "v" for i in range(65)}}, "body.labels"),
    ("taints", {"taints": ["no-effect"]}, "body.taints"),
    ("taints", {"taints": ["k=v:Sometimes"]}, "body.taints"),
    ("taints", {"taints": ["k=v:NoSchedule"], "extra": 1}, "body.extra"),
])
async def test_malformed_labels_and_taints_are_refused_naming_the_field(
        gw: Gateway, path: str, body: dict[str, object], field: str) -> None:  # noqa: F811
    r = await gw.http.put(f"/v1/nodes/n1/{path}", headers=gw.admin, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == field, r.text
    assert await outbox_labels(gw.engine) == []


@pytest.mark.db
async def test_only_an_admin_labels_a_node(gw: Gateway) -> None:  # noqa: F811
    for path, body in (("labels", {"labels": {"team": "mine"}}),
                       ("taints", {"taints": ["others=out:NoSchedule"]})):
        assert (await gw.http.put(f"/v1/nodes/n1/{path}", json=body)).status_code == 401
        r = await gw.http.put(f"/v1/nodes/n1/{path}", headers=gw.user, json=body)
        assert (r.status_code, r.json()["detail"]) == (
            403, "admin role required (this token's role is user)")
        r = await gw.http.put(f"/v1/nodes/nope/{path}", headers=gw.admin, json=body)
        assert (r.status_code, r.json()["detail"]) == (404, "no node nope")
    assert await outbox_labels(gw.engine) == []


@pytest.mark.db
async def test_the_agents_driver_and_nvlink_labels_show_in_the_inventory(
        gw: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setattr(nvml_backend, "pynvml", FakeNvml(gb200_tray(), cuda_version=12080))
    inv = node_inventory("tray-1", nvml_backend.NvmlDevices(), 8000, 16384, "r0")
    ev = NodeRegistered(inventory=inv, agent_started_at=utcnow())
    await store.apply_events(gw.engine, [(Envelope.wrap(ev, "node-agent"), ev)])
    nodes = {n["node_id"]: n for n in (await gw.http.get("/v1/nodes", headers=gw.user)).json()}
    labels = nodes["tray-1"]["inventory"]["labels"]
    assert {k: labels[k] for k in ("kairos.io/driver-version", "kairos.io/cuda-version",
                                   "kairos.io/nvlink-domain", "kairos.io/gpu-model")} == {
        "kairos.io/driver-version": "550.90.07", "kairos.io/cuda-version": "12.8",
        "kairos.io/nvlink-domain": f"{NVL72_CLUSTER.hex()}-32766",
        "kairos.io/gpu-model": "GB200-192GB"}
    assert nodes["tray-1"]["admin_labels"] == {}  # the platform's, not an admin's
