"""Admission: the HTTP gateway, its outbox relay, and the read model it builds from events."""

from __future__ import annotations

from datetime import timedelta

from services.admission import store, tokens
from services.admission.app import create_app
from services.admission.node_health import GpuHealthTracker
from services.admission.overload import OverloadGuard
from services.admission.settings import AdmissionSettings
from shared.bus import Consumer, ConsumerOptions
from shared.events import Envelope, Event
from shared.http import HttpServer
from shared.outbox import OutboxRelay
from shared.refill import BrokerWatch
from shared.service import ServiceRuntime, run_main
from shared.topics import (
    BINDINGS,
    JOBS_FORECASTS,
    JOBS_STATUS,
    NODES_LIFECYCLE,
    NODES_TELEMETRY,
    QUEUES_EVENTS,
)


async def main(settings: AdmissionSettings | None = None) -> None:
    settings = settings or AdmissionSettings()
    rt = ServiceRuntime(settings)
    await rt.start_dependencies()
    assert rt.engine is not None
    engine = rt.engine
    if settings.dev_token:  # the embedded stack's (or a deployment's bootstrap) admin token
        await tokens.ensure_dev_token(engine, settings.dev_token)

    gpu_health = GpuHealthTracker()  # what nodes_view holds, so steady telemetry costs nothing

    async def handle(env: Envelope, event: Event) -> None:
        await store.apply_events(engine, [(env, event)])

    async def handle_batch(items: list[tuple[Envelope, Event]]) -> None:
        await store.apply_events(engine, items)

    # the node consumer's alone: the tracker's memory follows that consumer's transactions
    async def handle_node(env: Envelope, event: Event) -> None:
        await store.apply_events(engine, [(env, event)], gpu_health)

    async def handle_node_batch(items: list[tuple[Envelope, Event]]) -> None:
        await store.apply_events(engine, items, gpu_health)

    # Two consumers: the jobs' reports never wait behind the nodes' traffic (2,000 nodes
    # send 800 heartbeats and samples a second; read by one consumer, they kept the job
    # states, and the intake lag the overload gate reads, minutes behind). A node's events
    # are all keyed and read by the second, so their order holds.
    rt.add_consumer(Consumer(
        settings,
        ConsumerOptions("admission", [JOBS_STATUS.name, BINDINGS.name, QUEUES_EVENTS.name],
                        fetch_max_wait_ms=50),
        handle, rt.producer, batch_handler=handle_batch))
    rt.add_consumer(Consumer(
        settings,
        ConsumerOptions("admission-nodes", [NODES_LIFECYCLE.name, NODES_TELEMETRY.name],
                        fetch_max_wait_ms=100),
        handle_node, rt.producer, batch_handler=handle_node_batch))
    # forecasts apart too: a minute's refresh of thousands of waiting jobs must not hold
    # up the jobs' own reports
    rt.add_consumer(Consumer(
        settings, ConsumerOptions("admission-forecasts", [JOBS_FORECASTS.name],
                                  fetch_max_wait_ms=100),
        handle, rt.producer, batch_handler=handle_batch))
    relay = OutboxRelay(engine, rt.producer, settings.database_url,
                        timedelta(seconds=settings.outbox_replay_window_s))
    rt.add_loop(relay.run)
    rt.add_loop(BrokerWatch(settings, engine, rt.producer).run)
    guard = OverloadGuard.from_settings(settings)

    async def intake_lag() -> None:
        await guard.watch(engine)

    rt.add_loop(intake_lag)
    app = create_app(settings, engine, rt.ready, guard)
    await rt.run(HttpServer(app, settings.http_host, settings.http_port))


def run() -> None:
    run_main(main)
