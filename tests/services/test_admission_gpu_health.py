"""GPU health in the node read model: nodes.telemetry through admission's consumer code
(store.apply_events with its GpuHealthTracker) into real PostgreSQL, shown by GET
/v1/nodes and `kairos nodes`; and the same chain over the real broker."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from kairos.cli import app
from services.admission import store
from services.admission.node_health import GpuHealthTracker
from shared.bus import Consumer, ConsumerOptions, Producer
from shared.config import CommonSettings
from shared.events import (
    Envelope,
    Event,
    GpuHealth,
    GpuTelemetry,
    NodeTelemetry,
)
from shared.topics import NODES_LIFECYCLE, NODES_TELEMETRY
from tests.services.builders import node
from tests.services.gateway_helpers import Gateway, auth, gateway

pytestmark = pytest.mark.db


def telemetry(node_id: str, degraded: dict[int, float] | None = None, gpus: int = 4,
              util: float = 50.0) -> NodeTelemetry:
    """A sample: GPUs in ``degraded`` (index -> temperature) are degraded."""
    degraded = degraded or {}
    return NodeTelemetry(node_id=node_id, gpus=[
        GpuTelemetry(index=i, utilization_pct=util, memory_used_mib=1024,
                     temperature_c=degraded.get(i, 60.0), power_w=300.0,
                     health=GpuHealth.DEGRADED if i in degraded else GpuHealth.HEALTHY)
        for i in range(gpus)])


class Feed:
    """Feeds the read model as admission's consumer does, with one tracker (a replica)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw, self.health = gw, GpuHealthTracker()

    async def __call__(self, *events: Event) -> None:
        await store.apply_events(self.gw.engine, [(Envelope.wrap(e, "test"), e)
                                                  for e in events], self.health)


async def nodes(gw: Gateway, token: str) -> dict[str, dict[str, Any]]:
    r = await gw.http.get("/v1/nodes", headers=auth(token))
    assert r.status_code == 200, r.text
    return {n["node_id"]: n for n in r.json()}


async def changed_at(gw: Gateway, node_id: str) -> datetime | None:
    async with gw.engine.connect() as conn:
        return await conn.scalar(text(  # type: ignore[no-any-return]
            "SELECT gpu_health_changed_at FROM nodes_view WHERE node_id = :n"), {"n": node_id})


@pytest.fixture
async def gw(db_url: str) -> AsyncIterator[Gateway]:
    async with gateway(db_url) as g:
        yield g


async def test_degraded_gpus_appear_and_recovered_ones_disappear(gw: Gateway) -> None:
    feed = Feed(gw)
    user = await gw.token("vision")
    await feed(node("n1", gpus=4), node("n2", gpus=4))
    await feed(telemetry("n1"), telemetry("n2"))
    assert {n: v["gpu_health"] for n, v in (await nodes(gw, user)).items()} == {
        "n1": [], "n2": []}
    assert feed.health.writes == 0  # all healthy, as the rows already say

    await feed(telemetry("n1", {1: 95.0, 3: 93.5}))
    shown = (await nodes(gw, user))["n1"]["gpu_health"]
    assert [(g["index"], g["health"], g["temperature_c"]) for g in shown] == [
        (1, "degraded", 95.0), (3, "degraded", 93.5)]
    assert shown[0]["utilization_pct"] == 50.0 and shown[0]["power_w"] == 300.0
    assert (await nodes(gw, gw.admin))["n1"]["gpu_health"] == shown  # same for everyone
    assert feed.health.writes == 1

    await feed(telemetry("n1", {3: 91.0}))  # GPU 1 recovered
    assert [g["index"] for g in (await nodes(gw, user))["n1"]["gpu_health"]] == [3]
    await feed(telemetry("n1"))
    assert (await nodes(gw, user))["n1"]["gpu_health"] == []
    assert (await nodes(gw, user))["n2"]["gpu_health"] == []
    assert feed.health.writes == 3


async def test_steady_telemetry_writes_nothing_and_a_restart_writes_once(gw: Gateway) -> None:
    feed = Feed(gw)
    await feed(node("n1", gpus=4))
    await feed(telemetry("n1", {2: 96.0}))
    first = await changed_at(gw, "n1")
    assert first is not None and feed.health.writes == 1
    for i in range(5):  # the same GPUs degraded, readings moving: nothing to write
        await feed(telemetry("n1", {2: 96.0 + i}, util=10.0 * i))
    await feed(*[telemetry("n1", {2: 97.0}) for _ in range(3)])  # a batch of them
    assert feed.health.writes == 1 and await changed_at(gw, "n1") == first

    restarted = Feed(gw)  # a new replica: the row already holds this set
    await restarted(telemetry("n1", {2: 99.0}))
    await restarted(telemetry("n1", {2: 99.5}))
    assert restarted.health.writes == 0 and await changed_at(gw, "n1") == first
    await restarted(telemetry("n1", {0: 92.0, 2: 99.0}))  # a change: one write
    await restarted(telemetry("n1", {0: 92.0, 2: 99.0}))
    assert restarted.health.writes == 1 and await changed_at(gw, "n1") != first
    assert [g["index"] for g in (await nodes(gw, gw.admin))["n1"]["gpu_health"]] == [0, 2]


async def test_telemetry_before_registration_is_stored_once_the_node_is_known(
        gw: Gateway) -> None:
    feed = Feed(gw)
    await feed(telemetry("n9", {0: 95.0}))  # no row yet: nothing remembered
    assert feed.health.writes == 0 and await nodes(gw, gw.admin) == {}
    await feed(node("n9", gpus=4))
    await feed(telemetry("n9", {0: 95.0}))
    assert [g["index"] for g in (await nodes(gw, gw.admin))["n9"]["gpu_health"]] == [0]
    assert feed.health.writes == 1


async def test_kairos_nodes_shows_a_health_column_and_the_schema_documents_it(
        gw: Gateway) -> None:
    feed = Feed(gw)
    user = await gw.token("vision")
    await feed(node("n1", gpus=4), node("n2", gpus=4))
    await feed(telemetry("n1", {1: 95.0, 3: 93.0}), telemetry("n2"))

    def cli() -> tuple[int, str]:
        result = CliRunner().invoke(app, ["nodes", "--url", str(gw.http.base_url),
                                          "--token", user])
        return result.exit_code, result.output

    code, out = await asyncio.to_thread(cli)
    assert code == 0, out
    assert "health" in out
    rows = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.count("│") > 2}
    assert "2 degraded" in rows["n1"] and "ok" in rows["n2"]

    schema = (await gw.http.get("/openapi.json")).json()
    field = schema["components"]["schemas"]["NodeOut"]["properties"]["gpu_health"]
    assert field["items"]["$ref"].endswith("/GpuHealthOut")
    assert {"index", "health", "temperature_c"} <= set(
        schema["components"]["schemas"]["GpuHealthOut"]["properties"])


@pytest.mark.broker
async def test_telemetry_on_the_real_broker_reaches_the_nodes_view(db_url: str,
                                                                     broker: str) -> None:
    """The consumer admission runs (its topics, the batch handler, one tracker) on the
    real broker: a degraded GPU shows in GET /v1/nodes, a recovery clears it."""
    tag = uuid.uuid4().hex[:8]
    n = f"gh-{tag}"  # the topics keep earlier runs' messages: a node of this run only
    settings = CommonSettings(service_name="test", kafka_bootstrap=broker, retry_backoff_s=0.01,
                              session_timeout_ms=6000, heartbeat_interval_ms=500,
                              rebalance_timeout_ms=6000, fetch_max_wait_ms=20)
    producer = Producer(broker, "test")
    await producer.start()
    async with gateway(db_url) as gw:
        health = GpuHealthTracker()

        async def handle(env: Envelope, ev: Event) -> None:
            await store.apply_events(gw.engine, [(env, ev)], health)

        async def handle_batch(items: list[tuple[Envelope, Event]]) -> None:
            await store.apply_events(gw.engine, items, health)

        consumer = Consumer(settings, ConsumerOptions(
            f"admission-{tag}", [NODES_LIFECYCLE.name, NODES_TELEMETRY.name],
            fetch_max_wait_ms=50), handle, producer, batch_handler=handle_batch)
        await consumer.start()
        task = asyncio.create_task(consumer.run())
        try:
            await producer.publish(node(n, gpus=4))

            async def shown() -> list[int] | None:
                got = (await gw.http.get("/v1/nodes", headers=auth(gw.admin))).json()
                return next(([g["index"] for g in x["gpu_health"]] for x in got
                             if x["node_id"] == n), None)

            async def until(want: list[int]) -> None:
                seen = None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(60):  # a fresh group takes seconds to join
                        while (seen := await shown()) != want:
                            await producer.publish(telemetry(n, dict.fromkeys(want, 95.0)))
                            await asyncio.sleep(0.2)
                assert seen == want, f"GET /v1/nodes shows degraded GPUs {seen}, not {want}"

            await until([2])
            await until([])
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            await consumer.stop()
            await producer.stop()
