"""What a consumer does with the messages of one fetch, whatever transport fetched them:
decode → dedupe → handle (retry) → dead-letter, then the end-of-batch hook.

The Kafka consumer (``shared.bus.consumer``) and the in-memory test double
(``tests/fakes/fake_bus.py``) both hand their fetches to a :class:`Dispatcher`, so the
double differs from the real bus only in how messages are stored and fetched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeAlias

from aiokafka import ConsumerRecord

from shared import metrics
from shared.bus.codec import UNDECODABLE, decode_record
from shared.bus.dedupe import Dedupe
from shared.config import CommonSettings
from shared.errors import NonRetryable, is_transient
from shared.events import DeadLetter, Envelope, Event
from shared.logging import get_logger
from shared.retry import backoff_s, retry_transient

log = get_logger(__name__)

Handler = Callable[[Envelope, Event], Awaitable[None]]
BatchHandler = Callable[[list[tuple[Envelope, Event]]], Awaitable[None]]
BatchHook = Callable[[], Awaitable[None]]
Record: TypeAlias = "ConsumerRecord[bytes, bytes]"


class Publisher(Protocol):
    """Where dead letters go: the service's producer."""

    async def publish(self, event: Event, event_id: str | None = None) -> Envelope: ...


class Dispatcher:
    """Hands decoded messages to the handlers; a message that cannot be handled is
    dead-lettered with the reason (or, with ``dead_letter`` False, logged and skipped:
    for a second reader of topics whose own consumer group dead-letters them)."""

    def __init__(self, settings: CommonSettings, group_id: str, handler: Handler,
                 publisher: Publisher, *, batch_handler: BatchHandler | None = None,
                 on_batch_end: BatchHook | None = None, dead_letter: bool = True) -> None:
        self.settings = settings
        self._group_id = group_id
        self._handler = handler
        self._batch_handler = batch_handler
        self._on_batch_end = on_batch_end
        self._publisher = publisher
        self._dead_letter_enabled = dead_letter
        self._dedupe = Dedupe(settings.dedupe_window)
        self._service = settings.service_name

    async def handle_fetch(self, records: list[Record]) -> None:
        """Handle every message of one fetch, then run the end-of-batch hook. Returns
        when the fetch may be committed; raises only CancelledError."""
        if self._batch_handler is None or not await self._handle_batch(records):
            for record in records:
                await self._handle_record(record)
        if self._on_batch_end is not None:
            await retry_transient(self._on_batch_end, f"{self._service}.batch_end")

    async def _handle_batch(self, records: list[Record]) -> bool:
        """True if the batch handler took every message; False to go one by one."""
        assert self._batch_handler is not None
        items: list[tuple[Envelope, Event]] = []
        for record in records:
            try:
                env, event = decode_record(record)
            except UNDECODABLE:
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
        log.warning("handler waits for an unavailable dependency", group=self._group_id,
                    wait_s=round(wait, 2), error=repr(exc)[:300])
        await asyncio.sleep(wait)

    async def _handle_record(self, record: Record) -> None:
        topic = record.topic
        try:
            env, event = decode_record(record)
        except UNDECODABLE as exc:
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

    async def _dead_letter(self, record: Record, reason: str, error: str) -> None:
        letter = DeadLetter(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            msg_key=record.key.decode(errors="replace") if record.key else None,
            # bounded: the letter itself must fit the event limit
            value=(record.value or b"")[:65536].decode(errors="replace"),
            reason=reason,
            error=error,
            consumer_group=self._group_id,
        )
        if not self._dead_letter_enabled:
            log.warning("skipped a message another consumer dead-letters", topic=record.topic,
                        offset=record.offset, reason=reason, error=error[:200])
            return
        await retry_transient(lambda: self._publisher.publish(letter),
                              f"{self._service}.deadletter")
        metrics.DEADLETTERS.labels(self._service, record.topic, reason).inc()
        metrics.MESSAGES.labels(self._service, record.topic, "deadlettered").inc()
        log.warning("dead-lettered", topic=record.topic, offset=record.offset, reason=reason,
                    error=error[:200])
