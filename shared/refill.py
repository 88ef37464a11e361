"""A broker that came back empty is brought up to date from PostgreSQL, automatically.

The embedded Tansu broker keeps its log in memory, so a restart loses every topic and
message; a production Kafka can lose a topic too. Each service with a database runs a
``BrokerWatch``: every few seconds it reads the one message of ``kairos.broker`` (the
broker's incarnation). None there means the broker is empty: under an advisory lock,
one watcher recreates the topics, marks the outboxes' replay window to be published
again (``shared.outbox.replay``) and writes a new incarnation. Every watcher that sees a
new incarnation runs its service's hooks (the scheduler resends its bindings, which are
not replayed). Consumers reset their positions on their own (``shared.bus``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from shared import metrics
from shared.bus import Producer, ensure_topics
from shared.config import CommonSettings
from shared.events import BrokerIncarnation, Envelope, utcnow
from shared.logging import get_logger
from shared.outbox import replay
from shared.retry import retry_transient
from shared.topics import BROKER

log = get_logger(__name__)
_REFILL_LOCK = 0x4B52_4546  # "KREF"
Hook = Callable[[], Awaitable[None]]


class BrokerWatch:
    def __init__(self, settings: CommonSettings, engine: AsyncEngine, producer: Producer,
                 every_s: float = 2.0) -> None:
        self.settings = settings
        self.engine = engine
        self.producer = producer
        self.every_s = every_s
        self.incarnation: str | None = None  # the last one seen; None before the first
        self._hooks: list[Hook] = []
        self._reader: AIOKafkaConsumer | None = None

    def on_new_incarnation(self, hook: Hook) -> None:
        """Run ``hook`` whenever the broker's log started over (not on the first look)."""
        self._hooks.append(hook)

    async def run(self) -> None:
        try:
            await retry_transient(self._loop, f"{self.settings.service_name}.broker_watch")
        finally:
            await self.close()

    async def _loop(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.every_s)

    async def check(self) -> bool:
        """Look once; refill if the broker is empty. True when a new incarnation was seen
        (and the hooks ran)."""
        current = await self._read()
        if current is None:
            current = await self._refill()
        if current == self.incarnation:
            return False
        first = self.incarnation is None
        self.incarnation = current
        if first:
            return False
        log.warning("the broker's log started over; resending what it lost",
                    incarnation=current)
        for hook in self._hooks:
            await hook()
        return True

    async def _refill(self) -> str:
        async with self.engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _REFILL_LOCK})
            again = await self._read()
            if again is not None:  # another service refilled it while we waited
                return again
            await ensure_topics(self.settings.kafka_bootstrap,
                                max_partitions=self.settings.topic_partitions_max)
            window = timedelta(seconds=self.settings.outbox_replay_window_s)
            count = await replay(conn, utcnow() - window)
            marker = BrokerIncarnation(incarnation=uuid.uuid4().hex, refilled=count,
                                       by=self.settings.service_name)
            # written before the commit: if we die now, the next watcher refills again
            # (a replay is harmless), but no watcher ever sees a marker with no refill
            # partition 0 by name: a topic a client's metadata request auto-created may
            # have more partitions than the registry says
            await self.producer.publish_envelope(
                Envelope.wrap(marker, self.producer.source, f"broker-{marker.incarnation}"),
                BROKER.name, partition=0)
        metrics.BROKER_REFILLS.inc()
        log.warning("broker was empty: topics created, outbox window marked to publish "
                    "again", rows=count, incarnation=marker.incarnation)
        return marker.incarnation

    async def _read(self) -> str | None:
        """The incarnation in the broker's log, or None when it has none (empty broker).
        Raises while the broker is unreachable (``retry_transient`` waits it out)."""
        reader = await self._open_reader()
        tp = TopicPartition(BROKER.name, 0)
        if BROKER.name not in await reader.topics():
            return None
        if tp not in reader.assignment():  # only once the topic exists
            reader.assign([tp])
        end = (await reader.end_offsets([tp]))[tp]
        if end == 0:
            return None
        reader.seek(tp, end - 1)
        got = await reader.getmany(tp, timeout_ms=5000)
        for record in got.get(tp, [])[-1:]:
            return str(Envelope.decode(record.value or b"").data["incarnation"])
        raise TimeoutError("the broker's incarnation message could not be read")

    async def _open_reader(self) -> AIOKafkaConsumer:
        if self._reader is None:
            reader = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap,
                                      enable_auto_commit=False, fetch_max_wait_ms=100)
            await reader.start()
            self._reader = reader
        return self._reader

    async def close(self) -> None:
        """Stop the reader ``check`` opened (``run`` does it on its way out)."""
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.stop()
