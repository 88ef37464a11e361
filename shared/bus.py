"""The event bus on aiokafka: a producer and a consumer loop.

The consumer commits only after the handler succeeded (at-least-once), retries a
failing handler with bounded backoff, dead-letters undecodable or permanently failing
messages with the reason, and drops duplicates by event id. Kafka transactions and
the idempotent producer are not used: the embedded broker lacks them, and every
consumer is idempotent anyway.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError
from aiokafka.partitioner import murmur2
from pydantic import ValidationError

from shared import metrics
from shared.config import CommonSettings
from shared.errors import NonRetryable
from shared.events import DeadLetter, Envelope, Event
from shared.logging import get_logger
from shared.topics import ALL_TOPICS, DEAD_LETTER, Topic, topic_for

log = get_logger(__name__)


def partition_for(key: str, partitions: int) -> int:
    """Kafka's default partitioner (murmur2, as the producer uses), so a manual assigner
    knows which partition a key's messages land in."""
    return int(murmur2(key.encode()) & 0x7FFFFFFF) % partitions


async def ensure_topics(bootstrap: str, topics: Iterable[Topic] = ALL_TOPICS,
                        max_partitions: int | None = None) -> None:
    """Create the registry's topics; an existing topic is fine (Tansu says nothing,
    Apache Kafka raises TopicAlreadyExistsError). ``max_partitions`` caps the counts for
    a one-machine stack: every idle fetch costs the embedded broker CPU per partition.
    Clients read the real count from the broker's metadata, never from the registry."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(t.name, min(t.partitions, max_partitions or t.partitions), 1,
                     topic_configs={"retention.ms": str(t.retention_ms)})
            for t in topics
            if t.name not in existing
        ]
        if new:
            try:
                await admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


async def wait_for_broker(bootstrap: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            await admin.start()
            await admin.list_topics()
            return
        except (KafkaConnectionError, OSError) as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka at {bootstrap} unreachable after {timeout_s}s") from exc
            log.info("waiting for kafka", bootstrap=bootstrap)
            await asyncio.sleep(0.5)
        finally:
            await admin.close()


class Producer:
    """Publishes events in their envelope to the topic the registry assigns."""

    def __init__(self, bootstrap: str, source: str, linger_ms: int = 0) -> None:
        self.source = source
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            linger_ms=linger_ms,
            acks="all",
            enable_idempotence=False,
            max_request_size=4 * 1024 * 1024,
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def publish(self, event: Event, event_id: str | None = None) -> Envelope:
        env = Envelope.wrap(event, self.source, event_id)
        await self.publish_envelope(env, topic_for(event).name)
        return env

    async def publish_envelope(self, env: Envelope, topic: str) -> None:
        await self._producer.send_and_wait(topic, env.encode(), key=env.key.encode())
        metrics.PUBLISHED.labels(self.source, topic).inc()

    async def publish_many(self, items: Sequence[tuple[Envelope, str]]) -> None:
        """Send a batch and wait for every acknowledgement (order kept per partition)."""
        futures = [
            await self._producer.send(topic, env.encode(), key=env.key.encode())
            for env, topic in items
        ]
        await asyncio.gather(*futures)
        for _, topic in items:
            metrics.PUBLISHED.labels(self.source, topic).inc()

    async def reachable(self, timeout_s: float = 2.0) -> bool:
        """A metadata round trip to the broker succeeds (for /readyz)."""
        try:
            await asyncio.wait_for(self._producer.client.fetch_all_metadata(), timeout_s)
            return True
        except Exception:
            return False

    async def partition_count(self, topic: str) -> int:
        """Partitions of ``topic`` as the broker has them."""
        return len(await self._producer.partitions_for(topic))

    async def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        await self._producer.send_and_wait(topic, value, key=key)


Handler = Callable[[Envelope, Event], Awaitable[None]]
BatchHandler = Callable[[list[tuple[Envelope, Event]]], Awaitable[None]]
BatchHook = Callable[[], Awaitable[None]]


class _Dedupe:
    """A bounded memory of event ids already handled."""

    def __init__(self, capacity: int) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def seen(self, event_id: str) -> bool:
        return event_id in self._seen

    def add(self, event_id: str) -> None:
        self._seen[event_id] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)


@dataclass
class ConsumerOptions:
    group_id: str
    topics: Sequence[str]
    assign: Sequence[TopicPartition] | None = None  # manual assignment, no group rebalance
    from_beginning: bool = True
    max_records: int = 500
    # None = the service setting. Consumers off the submit->running path (monitor, read
    # models) wait longer per fetch: an idle fetch costs the broker CPU.
    fetch_max_wait_ms: int | None = None
    # False: never commit offsets (and join no group): for a manual assignment that is
    # read from the beginning on every start, e.g. a view rebuilt from the whole history.
    commit: bool = True
    # False: a message that cannot be handled is logged and skipped, not dead-lettered:
    # for a second reader of topics whose own consumer group dead-letters them already.
    dead_letter: bool = True


class Consumer:
    """One consumer loop: decode → dedupe → handle (retry) → dead-letter → commit."""

    def __init__(
        self,
        settings: CommonSettings,
        options: ConsumerOptions,
        handler: Handler,
        producer: Producer,
        on_batch_end: BatchHook | None = None,
        batch_handler: BatchHandler | None = None,
    ) -> None:
        """``handler`` takes one message. ``batch_handler``, when given, takes all the
        decoded messages of a fetch at once (one database transaction instead of one per
        message); if it keeps failing, the batch is replayed through ``handler`` one by
        one so only the poisoned message is dead-lettered."""
        self.settings = settings
        self.options = options
        self._handler = handler
        self._batch_handler = batch_handler
        self._producer = producer
        self._on_batch_end = on_batch_end
        self._dedupe = _Dedupe(settings.dedupe_window)
        self._service = settings.service_name
        common = dict(
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=options.group_id if options.commit else None,
            enable_auto_commit=False,
            auto_offset_reset="earliest" if options.from_beginning else "latest",
            fetch_max_wait_ms=options.fetch_max_wait_ms or settings.fetch_max_wait_ms,
            max_poll_records=options.max_records,
        )
        if options.assign is None:
            self._consumer = AIOKafkaConsumer(
                *options.topics,
                session_timeout_ms=settings.session_timeout_ms,
                heartbeat_interval_ms=settings.heartbeat_interval_ms,
                rebalance_timeout_ms=settings.rebalance_timeout_ms,
                **common,
            )
        else:
            self._consumer = AIOKafkaConsumer(**common)
        self._stopping = asyncio.Event()
        self._started = False
        self._lag_at = 0.0

    async def start(self) -> None:
        """Connect and, for a manual assignment, fix the start positions now, so that
        nothing published after ``start`` returns is skipped by an offset reset."""
        if self._started:
            return
        self._started = True
        await self._consumer.start()
        if self.options.assign is not None:
            self._consumer.assign(list(self.options.assign))
            for tp in self.options.assign:
                await self._consumer.position(tp)

    async def stop(self) -> None:
        self._stopping.set()
        await self._consumer.stop()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer holds now (the group's share, or the manual set)."""
        return set(self._consumer.assignment()) if self._started else set()

    async def run(self) -> None:
        """Consume until stopped. Offsets are committed after a whole batch is handled."""
        while not self._stopping.is_set():
            batch = await self._consumer.getmany(timeout_ms=200)
            if not batch:
                await self._report_lag()
                continue
            offsets: dict[TopicPartition, int] = {}
            records = [r for rs in batch.values() for r in rs]
            for tp, rs in batch.items():
                offsets[tp] = rs[-1].offset + 1
            if self._batch_handler is None or not await self._handle_batch(records):
                for record in records:
                    await self._handle_record(record)
            if self._on_batch_end is not None:
                await self._on_batch_end()
            if self.options.commit:
                await self._consumer.commit(offsets)
            await self._report_lag()

    async def _report_lag(self, every_s: float = 1.0) -> None:
        """Lag per partition: highwater - position. The highwater comes with fetches; a
        partition that has not returned data yet is asked for its end offset instead."""
        now = time.monotonic()
        if now - self._lag_at < every_s:
            return
        self._lag_at = now
        assigned = list(self._consumer.assignment())
        unknown = [tp for tp in assigned if self._consumer.highwater(tp) is None]
        ends = await self._consumer.end_offsets(unknown) if unknown else {}
        for tp in assigned:
            high = self._consumer.highwater(tp)
            if high is None:
                high = ends.get(tp)
            if high is None:
                continue
            pos = await self._consumer.position(tp)
            metrics.CONSUMER_LAG.labels(self._service, self.options.group_id, tp.topic,
                                        str(tp.partition)).set(
                max(0, high - pos)
            )

    @staticmethod
    def _decode(record: ConsumerRecord[bytes, bytes]) -> tuple[Envelope, Event]:
        env = Envelope.decode(record.value or b"")
        return env, env.payload()

    async def _handle_batch(self, records: list[ConsumerRecord[bytes, bytes]]) -> bool:
        """True if the batch handler took every message; False to go one by one."""
        assert self._batch_handler is not None
        items: list[tuple[Envelope, Event]] = []
        for record in records:
            try:
                env, event = self._decode(record)
            except (ValidationError, KeyError, ValueError):
                return False  # let the one-by-one path dead-letter it
            if not self._dedupe.seen(env.id):
                items.append((env, event))
        if not items:
            return True
        for attempt in range(1, self.settings.handler_retries + 2):
            started = time.perf_counter()
            try:
                await self._batch_handler(items)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("batch handler failed", attempt=attempt, size=len(items),
                            error=repr(exc))
                if isinstance(exc, NonRetryable):
                    return False
                await asyncio.sleep(self.settings.retry_backoff_s * 2 ** (attempt - 1))
                continue
            per_message = (time.perf_counter() - started) / len(items)
            for env, _ in items:
                self._dedupe.add(env.id)
            for record in records:
                metrics.HANDLER_SECONDS.labels(self._service, record.topic).observe(per_message)
                metrics.MESSAGES.labels(self._service, record.topic, "ok").inc()
            return True
        return False

    async def _handle_record(self, record: ConsumerRecord[bytes, bytes]) -> None:
        topic = record.topic
        try:
            env, event = self._decode(record)
        except (ValidationError, KeyError, ValueError) as exc:
            await self._dead_letter(record, "undecodable", repr(exc)[:2000])
            return
        if self._dedupe.seen(env.id):
            metrics.MESSAGES.labels(self._service, topic, "duplicate").inc()
            return
        attempts = self.settings.handler_retries + 1
        for attempt in range(1, attempts + 1):
            started = time.perf_counter()
            try:
                await self._handler(env, event)
            except NonRetryable as exc:
                await self._dead_letter(record, "rejected", repr(exc)[:2000])
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == attempts:
                    log.exception("handler failed permanently", event_id=env.id, topic=topic)
                    await self._dead_letter(record, "handler_failed", repr(exc)[:2000])
                    return
                metrics.MESSAGES.labels(self._service, topic, "retried").inc()
                log.warning("handler failed, retrying", event_id=env.id, attempt=attempt,
                            error=repr(exc))
                await asyncio.sleep(self.settings.retry_backoff_s * 2 ** (attempt - 1))
            else:
                metrics.HANDLER_SECONDS.labels(self._service, topic).observe(
                    time.perf_counter() - started
                )
                metrics.MESSAGES.labels(self._service, topic, "ok").inc()
                self._dedupe.add(env.id)
                return

    async def _dead_letter(
        self, record: ConsumerRecord[bytes, bytes], reason: str, error: str
    ) -> None:
        letter = DeadLetter(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            msg_key=record.key.decode(errors="replace") if record.key else None,
            value=(record.value or b"").decode(errors="replace"),
            reason=reason,
            error=error,
            consumer_group=self.options.group_id,
        )
        if not self.options.dead_letter:
            log.warning("skipped a message another consumer dead-letters", topic=record.topic,
                        offset=record.offset, reason=reason, error=error[:200])
            return
        await self._producer.publish(letter)
        metrics.DEADLETTERS.labels(self._service, record.topic, reason).inc()
        metrics.MESSAGES.labels(self._service, record.topic, "deadlettered").inc()
        log.warning("dead-lettered", topic=record.topic, offset=record.offset, reason=reason,
                    error=error[:200])


__all__ = [
    "DEAD_LETTER",
    "Consumer",
    "ConsumerOptions",
    "Producer",
    "ensure_topics",
    "partition_for",
    "wait_for_broker",
]
