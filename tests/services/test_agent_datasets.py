"""Dataset locality: the agent reports what its local cache holds (registration and every
heartbeat), the scheduler feeds it to the core's locality plugin and then prefers a node
caching the job's dataset, and the gateway's nodes read model shows it."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from scheduling import Scheduler, SchedulerConfig
from services.admission import store
from services.node_agent.agent import NodeAgent
from services.node_agent.datasets import DatasetCache
from services.node_agent.devices.simulated import SimulatedDevices
from services.node_agent.inventory import node_inventory
from services.node_agent.runtimes.simulated import SimulatedRuntime
from services.scheduler.state import Output, SchedulerState
from shared.db import make_engine
from shared.events import (
    Binding,
    BindingAction,
    Envelope,
    JobReady,
    NodeHeartbeat,
    NodeRegistered,
    utcnow,
)
from shared.jobspec import parse_job_spec
from tests.services.builders import node
from tests.services.test_agent_shell import Recorder


def test_the_cache_lists_its_entries_and_the_configured_names(tmp_path: Path) -> None:
    (tmp_path / "imagenet").mkdir()
    (tmp_path / "wikitext.tar").write_bytes(b"x")
    for skipped in (".hidden", "coco.partial", "laion.tmp"):
        (tmp_path / skipped).mkdir()
    cache = DatasetCache.from_setting(str(tmp_path), " c4, ,imagenet")
    assert cache.list() == ["c4", "imagenet", "wikitext.tar"]
    (tmp_path / "coco.partial").rename(tmp_path / "coco")  # the download finished
    assert "coco" in cache.list()
    assert DatasetCache(str(tmp_path / "absent")).list() == []


def test_registration_and_heartbeats_carry_the_cache(tmp_path: Path) -> None:
    cache = DatasetCache(str(tmp_path), ["c4"])
    devices = SimulatedDevices("n1", 2)
    inv = node_inventory("n1", devices, 8_000, 16_000, "r0", datasets=cache.list())
    agent = NodeAgent(inv, devices, SimulatedRuntime, Recorder(), datasets=cache)
    assert agent.inventory.datasets == ["c4"]
    (tmp_path / "imagenet").mkdir()
    assert agent.heartbeat().datasets == ["c4", "imagenet"]


def test_a_job_spec_names_its_dataset() -> None:
    spec = parse_job_spec({"name": "j", "dataset": "imagenet/train-2012",
                           "tasks": [{"name": "w"}]})
    assert spec.dataset == "imagenet/train-2012"
    for bad in ("../etc", "a b", ""):
        with pytest.raises(pydantic.ValidationError, match="dataset"):
            parse_job_spec({"name": "j", "dataset": bad, "tasks": [{"name": "w"}]})


def _ready(job_id: str, dataset: str | None) -> JobReady:
    spec = parse_job_spec({"name": job_id.lower(), "duration": 60,
                           **({"dataset": dataset} if dataset else {}),
                           "tasks": [{"name": "w", "resources": {"gpu": 2}}]})
    return JobReady(job_id=job_id, queue="default", tenant="t", user="u", spec=spec,
                    submitted_at=utcnow(), admitted_at=utcnow())


def _placed_on(cached: dict[str, list[str]], job: JobReady,
               heartbeats: dict[str, list[str]] | None = None) -> str:
    """Two identical empty nodes; which one the default scheduler picks for ``job``."""
    state = SchedulerState(epoch=1, placer=Scheduler(SchedulerConfig.preset("default")).schedule)
    out = Output()
    for n in ("n1", "n2"):
        reg = node(n)
        inv = reg.inventory.model_copy(update={"datasets": cached.get(n, [])})
        state.handle(NodeRegistered(inventory=inv, agent_started_at=utcnow()), out)
    for n, names in (heartbeats or {}).items():
        state.handle(NodeHeartbeat(node_id=n, datasets=names), out)
    state.handle(job, out)
    state.cycle(0.0, out)
    binds = [e.payload() for e, t in out.events if t == "bindings"]
    return next(b.node_id for b in binds  # type: ignore[attr-defined]
                if isinstance(b, Binding) and b.action is BindingAction.ALLOCATE)


def test_the_scheduler_prefers_a_node_caching_the_jobs_dataset() -> None:
    usual = _placed_on({}, _ready("A", "imagenet"))  # cached nowhere: the usual choice
    other = "n2" if usual == "n1" else "n1"
    assert _placed_on({}, _ready("B", None)) == usual
    assert _placed_on({other: ["imagenet"]}, _ready("C", "imagenet")) == other
    assert _placed_on({other: ["coco"]}, _ready("D", "imagenet")) == usual
    # a heartbeat reports what landed in the cache since registration
    assert _placed_on({}, _ready("E", "imagenet"), {other: ["imagenet"]}) == other
    assert _placed_on({other: ["imagenet"]}, _ready("F", "imagenet"), {other: []}) == usual


@pytest.mark.db
async def test_the_nodes_read_model_shows_the_cache(db_url: str) -> None:
    engine = make_engine(db_url, pool_size=2)
    reg = node("n1")
    reg = NodeRegistered(inventory=reg.inventory.model_copy(update={"datasets": ["c4"]}),
                         agent_started_at=utcnow())
    events = [reg, NodeHeartbeat(node_id="n1")]  # a heartbeat without the field keeps it
    await store.apply_events(engine, [(Envelope.wrap(e, "t"), e) for e in events])
    assert [n["inventory"]["datasets"] for n in await store.list_nodes(engine)] == [["c4"]]
    beat = NodeHeartbeat(node_id="n1", datasets=["imagenet", "c4"])
    await store.apply_events(engine, [(Envelope.wrap(beat, "t"), beat)])
    nodes = await store.list_nodes(engine)
    assert nodes[0]["inventory"]["datasets"] == ["c4", "imagenet"]
    assert nodes[0]["inventory"]["gpus"]  # the rest of the inventory is kept
    await engine.dispose()
