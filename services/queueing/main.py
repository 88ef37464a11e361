"""The queueing service's shell: the queues file, the consumer, the loops and the
ops endpoints (health, ``/metrics``).

Its settings are ``settings``; what it does is ``service`` (the event loop), with the
decisions in ``admit`` (quota admission and reclaim), ``explain`` (why jobs wait) and
``queue_commands`` (admin commands); the quota model is ``quota``, the order
``ordering``, the file format ``config``, the tables ``store``.
"""

from __future__ import annotations

import sys

from services.queueing.config import OrderingSpec, QueueConfigError, load_queues_file
from services.queueing.service import Queueing
from services.queueing.settings import QueueingSettings
from shared.bus import Consumer, ConsumerOptions
from shared.http import HttpServer, ops_app
from shared.queuespec import QueueSpec
from shared.refill import BrokerWatch
from shared.service import ServiceRuntime, run_main
from shared.topics import JOBS_COMMANDS, JOBS_STATUS, JOBS_SUBMITTED, QUEUES_EVENTS


def load_config(settings: QueueingSettings) -> tuple[OrderingSpec, list[QueueSpec]]:
    if not settings.queues_file:
        return OrderingSpec(), []
    return load_queues_file(settings.queues_file)


async def main(settings: QueueingSettings | None = None) -> None:
    settings = settings or QueueingSettings()
    try:
        ordering, specs = load_config(settings)
    except QueueConfigError as exc:  # refuse to start, naming every bad field
        print(f"{settings.queues_file}: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    rt = ServiceRuntime(settings)
    await rt.start_dependencies()
    assert rt.engine is not None
    q = Queueing(rt.producer, rt.engine, ordering)
    await q.start(specs)
    await q.cycle()  # what was held before a restart, in the order it was stored
    rt.add_consumer(Consumer(
        settings, ConsumerOptions("queueing", [JOBS_SUBMITTED.name, JOBS_COMMANDS.name,
                                               JOBS_STATUS.name, QUEUES_EVENTS.name]),
        q.handle, rt.producer, on_batch_end=q.cycle_if_dirty, batch_handler=q.handle_batch))
    rt.add_loop(lambda: q.tick(settings.cycle_interval_s))
    rt.add_loop(q.relay.run)  # what a flush could not publish (broker away), and replays
    rt.add_loop(BrokerWatch(settings, rt.engine, rt.producer).run)
    await rt.run(HttpServer(ops_app(rt.ready), settings.http_host, settings.http_port))


def run() -> None:
    run_main(main)
