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
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    TopicAlreadyExistsError,
)
from aiokafka.partitioner import murmur2
from pydantic import ValidationError

from shared import metrics
from shared.config import CommonSettings
from shared.errors import EventTooLarge, NonRetryable, is_transient
from shared.events import DeadLetter, Envelope, Event
from shared.logging import get_logger
from shared.retry import backoff_s, retry_transient
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

    def __init__(self, bootstrap: str, source: str, linger_ms: int = 0,
                 max_event_bytes: int = 1_000_000) -> None:
        self.source = source
        self.max_event_bytes = max_event_bytes
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

    def encode(self, env: Envelope) -> bytes:
        """The envelope's bytes, refused before any send when over the event limit (a
        broker refuses it anyway, and a message that can never go must not block those
        behind it)."""
        return check_size(env, self.max_event_bytes)

    async def publish_envelope(self, env: Envelope, topic: str,
                               partition: int | None = None) -> None:
        await self._producer.send_and_wait(topic, self.encode(env), key=env.key.encode(),
                                           partition=partition)
        metrics.PUBLISHED.labels(self.source, topic).inc()

    async def publish_many(self, items: Sequence[tuple[Envelope, str]]) -> None:
        """Send a batch and wait for every acknowledgement (order kept per partition)."""
        payloads = [self.encode(env) for env, _ in items]  # all checked before any send
        futures = [
            await self._producer.send(topic, value, key=env.key.encode())
            for (env, topic), value in zip(items, payloads, strict=True)
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

    async def send_future(self, topic: str, key: str, value: bytes) -> asyncio.Future[Any]:
        """Queue one stored message for sending; the future resolves on its ack (the
        outbox relay sends a batch, then waits for all)."""
        fut: asyncio.Future[Any] = await self._producer.send(topic, value, key=key.encode())
        return fut

    async def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        await self._producer.send_and_wait(topic, value, key=key)


def check_size(env: Envelope, limit: int) -> bytes:
    data = env.encode()
    if len(data) > limit:
        raise EventTooLarge(f"{env.type} event {env.id} is {len(data)} bytes, over the "
                            f"{limit}-byte event limit")
    return data


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
    # None = the service setting: how far an idle consumer stretches its fetch wait
    idle_fetch_max_wait_ms: int | None = None
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
        self._busy_wait_ms = int(common["fetch_max_wait_ms"])  # type: ignore[call-overload]
        self._idle_wait_ms = max(self._busy_wait_ms, options.idle_fetch_max_wait_ms
                                 or settings.fetch_idle_max_wait_ms)
        self._wait_ms = self._busy_wait_ms

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
        """Consume until stopped. Offsets are committed after a whole batch is handled.
        While PostgreSQL or the broker is away, the batch is retried (never dropped or
        dead-lettered for it) and the loop lives on."""
        idle_errors = 0
        while not self._stopping.is_set():
            try:
                batch = await self._consumer.getmany(timeout_ms=200)
                idle_errors = 0
            except (KafkaError, OSError) as exc:
                idle_errors += 1  # the broker is away: aiokafka reconnects by itself
                log.warning("fetch failed, retrying", group=self.options.group_id,
                            error=repr(exc)[:200])
                await asyncio.sleep(backoff_s(idle_errors))
                continue
            self._pace_fetches(bool(batch))
            if not batch:
                await self._watch_positions()
                continue
            offsets: dict[TopicPartition, int] = {}
            records = [r for rs in batch.values() for r in rs]
            for tp, rs in batch.items():
                offsets[tp] = rs[-1].offset + 1
            if self._batch_handler is None or not await self._handle_batch(records):
                for record in records:
                    await self._handle_record(record)
            if self._on_batch_end is not None:
                await retry_transient(self._on_batch_end, f"{self._service}.batch_end")
            if self.options.commit:
                await self._commit(offsets)
            await self._watch_positions()

    def _pace_fetches(self, got_data: bool) -> None:
        """Stretch the fetch wait while idle, back to the short one on the first data.

        A broker that does not answer a waiting fetch as soon as data arrives (Tansu:
        consumers poll with a short wait to keep latency down) makes every idle consumer
        cost it a fetch per wait, whatever the traffic.
        Doubling the wait after each empty poll (200 ms of nothing) up to the idle
        bound, and dropping back on the first message, keeps a busy consumer on the
        short wait and an idle one cheap; the price is up to the idle bound on the first
        message after a quiet spell. aiokafka reads the wait from its fetcher for each
        request it builds (tests/broker/test_tansu_fetch_wait.py checks that it does)."""
        wait = self._busy_wait_ms if got_data else min(self._idle_wait_ms, self._wait_ms * 2)
        if wait != self._wait_ms:
            self._wait_ms = wait
            fetcher = getattr(self._consumer, "_fetcher", None)
            if fetcher is not None:
                fetcher._fetch_max_wait_ms = wait

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        """A commit that fails only means the batch is read again (handlers are
        idempotent): after a rebalance, or while the broker is away, go on."""
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError, KafkaError, OSError) as exc:
            log.warning("commit failed; the batch may be read again",
                        group=self.options.group_id, error=repr(exc)[:200])

    async def _watch_positions(self) -> None:
        try:
            await self._report_lag()
        except (KafkaError, OSError) as exc:
            log.info("lag check failed", group=self.options.group_id, error=repr(exc)[:200])

    async def _report_lag(self, every_s: float = 1.0) -> None:
        """Lag per partition: highwater - position. The highwater comes with fetches; a
        partition that has not returned data yet is asked for its end offset instead.
        A log that ends before our position is gone (a broker that came back empty, a
        topic recreated): everything in it is new, so read it from its start."""
        now = time.monotonic()
        if now - self._lag_at < every_s:
            return
        self._lag_at = now
        assigned = list(self._consumer.assignment())
        unknown = [tp for tp in assigned if self._consumer.highwater(tp) is None]
        ends = await self._consumer.end_offsets(unknown) if unknown else {}
        positions = {tp: await self._consumer.position(tp) for tp in assigned}
        behind = [tp for tp in assigned if (self._consumer.highwater(tp) or 0) < positions[tp]]
        if behind:  # confirm with the broker: a highwater from a fetch may be stale
            ends.update(await self._consumer.end_offsets(behind))
            gone = [tp for tp in behind if ends[tp] < positions[tp]]
            if gone:
                for tp in gone:
                    log.warning("partition log is gone (broker restarted empty?): reading "
                                "it from the start", topic=tp.topic, partition=tp.partition,
                                position=positions[tp], end=ends[tp])
                    metrics.OFFSET_RESETS.labels(self._service, tp.topic).inc()
                await self._consumer.seek_to_beginning(*gone)
                return
        for tp in assigned:
            high = self._consumer.highwater(tp)
            if high is None or tp in ends:
                high = ends.get(tp)
            if high is None:
                continue
            metrics.CONSUMER_LAG.labels(self._service, self.options.group_id, tp.topic,
                                        str(tp.partition)).set(max(0, high - positions[tp]))

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
        attempt = waits = 0
        while attempt <= self.settings.handler_retries:
            started = time.perf_counter()
            try:
                await self._batch_handler(items)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if is_transient(exc):  # a dependency is away: wait, spend no retry
                    waits += 1
                    await self._wait_dependency(exc, waits)
                    continue
                attempt += 1
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

    async def _wait_dependency(self, exc: BaseException, waits: int) -> None:
        metrics.DEPENDENCY_WAITS.labels(f"{self._service}.handler").inc()
        wait = backoff_s(waits)
        log.warning("handler waits for an unavailable dependency", group=self.options.group_id,
                    wait_s=round(wait, 2), error=repr(exc)[:300])
        await asyncio.sleep(wait)

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
        attempt = waits = 0
        while True:
            started = time.perf_counter()
            try:
                await self._handler(env, event)
            except NonRetryable as exc:
                await self._dead_letter(record, "rejected", repr(exc)[:2000])
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if is_transient(exc):  # a dependency is away: wait, spend no retry
                    waits += 1
                    await self._wait_dependency(exc, waits)
                    continue
                attempt += 1
                if attempt >= attempts:
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
            # bounded: the letter itself must fit the event limit
            value=(record.value or b"")[:65536].decode(errors="replace"),
            reason=reason,
            error=error,
            consumer_group=self.options.group_id,
        )
        if not self.options.dead_letter:
            log.warning("skipped a message another consumer dead-letters", topic=record.topic,
                        offset=record.offset, reason=reason, error=error[:200])
            return
        await retry_transient(lambda: self._producer.publish(letter),
                              f"{self._service}.deadletter")
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
