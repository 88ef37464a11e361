"""The shell every service runs in: start dependencies, run loops, stop cleanly on signal."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from shared import metrics
from shared.bus import Consumer, Producer, wait_for_broker
from shared.config import CommonSettings
from shared.db import make_engine, migrate, wait_for_database
from shared.http import HttpServer
from shared.logging import configure_logging, get_logger
from shared.retry import retry_transient

log = get_logger(__name__)


def run_main(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """A service process's entry: its main coroutine on uvloop where installed (its
    sockets and callbacks cost less CPU per message than asyncio's own loop, which the
    control plane spends on every job), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:  # a platform without uvloop's wheels: the default loop works
        asyncio.run(main())
        return
    uvloop.run(main())


def dump_tasks() -> None:
    """Print every task's stack to stderr (the service's log): ``kill -USR1 <pid>`` shows
    where a service that stopped making progress is waiting."""
    for task in asyncio.all_tasks():
        print(f"--- task {task.get_name()}", file=sys.stderr)
        # the await chain, outermost first (a task's own stack shows only its top frame)
        coro: Any = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                print(f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}",
                      file=sys.stderr)
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    sys.stderr.flush()


def _version() -> str:
    try:
        return importlib.metadata.version("kairos")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


async def check_database(engine: AsyncEngine, timeout_s: float = 2.0) -> bool:
    """A round trip, connecting included: a database that accepts connections but never
    answers (a network partition) must not hold /readyz past the probe's timeout."""
    async def probe() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    try:
        async with asyncio.timeout(timeout_s):
            await probe()
        return True
    except Exception:
        return False


class ServiceRuntime:
    """Owns the producer, the database engine, consumers, background loops and HTTP."""

    def __init__(self, settings: CommonSettings, *, use_db: bool = True) -> None:
        self.settings = settings
        configure_logging(settings.service_name, settings.log_level, settings.log_json)
        metrics.BUILD_INFO.labels(settings.service_name, _version()).set(1)
        self.producer = Producer(settings.kafka_bootstrap, settings.service_name,
                                 max_event_bytes=settings.max_event_bytes)
        self.engine: AsyncEngine | None = (
            make_engine(settings.database_url, pool_size=5,
                        connect_wait_s=settings.db_connect_wait_s) if use_db else None
        )
        self.consumers: list[Consumer] = []
        self._loops: list[Callable[[], Coroutine[Any, Any, Any]]] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self.http: HttpServer | None = None
        self.stopping = asyncio.Event()

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)

    def add_loop(self, loop: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Run ``loop`` until the service stops. One that fails because PostgreSQL or the
        broker is away starts over when it is back (so each loop must resume from what
        is stored); one that ends or fails otherwise ends the service (exit 1)."""
        name = getattr(loop, "__qualname__", "loop").replace(".<lambda>", "")
        what = f"{self.settings.service_name}.{name}"
        self._loops.append(lambda: retry_transient(loop, what))

    async def ready(self) -> dict[str, bool]:
        checks = {"broker": await self.producer.reachable()}
        if self.engine is not None:
            checks["database"] = await check_database(self.engine)
        return checks

    async def start_dependencies(self) -> None:
        await wait_for_broker(self.settings.kafka_bootstrap)
        if self.engine is not None:
            await wait_for_database(self.engine)
            await migrate(self.engine)
        await self.producer.start()

    async def run(self, http: HttpServer | None = None) -> None:
        """Start everything, run until SIGINT/SIGTERM, then stop in reverse order."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stopping.set)
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
        self.http = http
        if http is not None:
            await http.start()
        for consumer in self.consumers:
            if consumer.options.assign is not None:
                # fixed positions first: nothing this service publishes from here on
                # (a registration, a heartbeat) can draw an answer it would skip
                await consumer.start()
        for fn in self._loops:
            self._tasks.append(asyncio.create_task(fn()))
        for consumer in self.consumers:
            # a group's first join can wait out a killed member's session (~10 s): the
            # loops (the outbox relay publishing accepted submits) must not wait with it
            self._tasks.append(asyncio.create_task(self._consume(consumer)))
        log.info("service started", port=self.settings.http_port)
        stop_wait = asyncio.create_task(self.stopping.wait())
        done, _ = await asyncio.wait([stop_wait, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
        failed = False
        for t in done:
            if t is stop_wait or t.cancelled():
                continue
            failed = True  # a loop meant to run until stopped ended: restart the process
            exc = t.exception()
            log.error("a service loop ended; exiting for the supervisor to restart us",
                      error=repr(exc) if exc is not None else "returned")
        await self.shutdown()
        if failed:
            raise SystemExit(1)

    @staticmethod
    async def _consume(consumer: Consumer) -> None:
        await consumer.start()  # returns at once if started already
        await consumer.run()

    async def shutdown(self, step_timeout_s: float = 5.0) -> None:
        """Stop loops, consumers, HTTP, producer and database in turn. Each step is
        bounded, so a broker or database that is already gone cannot hang the exit."""
        self.stopping.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                async with asyncio.timeout(step_timeout_s):
                    await t
        steps: list[Awaitable[Any]] = [c.stop() for c in self.consumers]
        if self.http is not None:
            steps.append(self.http.stop())
        steps.append(self.producer.stop())
        if self.engine is not None:
            steps.append(self.engine.dispose())
        for step in steps:
            try:
                async with asyncio.timeout(step_timeout_s):
                    await step
            except (TimeoutError, Exception) as exc:
                log.warning("shutdown step did not finish cleanly", error=repr(exc))
        log.info("service stopped")
