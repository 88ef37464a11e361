"""The Kafka consumer loop: fetch → dispatch (``shared.bus.dispatch``) → commit.

It commits only after the whole fetch was handled (at-least-once): a consumer stopped
mid-batch leaves the batch to the group's next consumer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from shared.bus.dispatch import BatchHandler, BatchHook, Dispatcher, Handler, Publisher
from shared.bus.fetch_pacing import FetchPacer
from shared.bus.positions import PositionWatcher
from shared.config import CommonSettings
from shared.logging import get_logger
from shared.retry import backoff_s

log = get_logger(__name__)


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


def _kafka_consumer(settings: CommonSettings, options: ConsumerOptions,
                    fetch_max_wait_ms: int) -> AIOKafkaConsumer:
    """A group member subscribed to the topics, or (``assign``) a consumer that is
    assigned its partitions at start."""
    connect = partial(
        AIOKafkaConsumer,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=options.group_id if options.commit else None,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if options.from_beginning else "latest",
        fetch_max_wait_ms=fetch_max_wait_ms,
        max_poll_records=options.max_records,
    )
    if options.assign is not None:
        return connect()
    return connect(
        *options.topics,
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        rebalance_timeout_ms=settings.rebalance_timeout_ms,
    )


class Consumer:
    """One consumer loop: decode → dedupe → handle (retry) → dead-letter → commit."""

    def __init__(
        self,
        settings: CommonSettings,
        options: ConsumerOptions,
        handler: Handler,
        producer: Publisher,
        on_batch_end: BatchHook | None = None,
        batch_handler: BatchHandler | None = None,
    ) -> None:
        """``handler`` takes one message. ``batch_handler``, when given, takes all the
        decoded messages of a fetch at once (one database transaction instead of one per
        message); if it keeps failing, the batch is replayed through ``handler`` one by
        one so only the poisoned message is dead-lettered."""
        self.settings = settings
        self.options = options
        self._dispatcher = Dispatcher(settings, options.group_id, handler, producer,
                                      batch_handler=batch_handler, on_batch_end=on_batch_end,
                                      dead_letter=options.dead_letter)
        fetch_wait_ms = options.fetch_max_wait_ms or settings.fetch_max_wait_ms
        self._consumer = _kafka_consumer(settings, options, fetch_wait_ms)
        self._pacer = FetchPacer(self._consumer, fetch_wait_ms, options.idle_fetch_max_wait_ms
                                 or settings.fetch_idle_max_wait_ms)
        self._positions = PositionWatcher(self._consumer, settings.service_name,
                                          options.group_id)
        self._stopping = asyncio.Event()
        self._started = False

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
            self._pacer.after_poll(bool(batch))
            if not batch:
                await self._positions.watch()
                continue
            offsets = {tp: rs[-1].offset + 1 for tp, rs in batch.items()}
            await self._dispatcher.handle_fetch([r for rs in batch.values() for r in rs])
            if self.options.commit:
                await self._commit(offsets)
            await self._positions.watch()

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        """A commit that fails only means the batch is read again (handlers are
        idempotent): after a rebalance, or while the broker is away, go on."""
        try:
            await self._consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError, KafkaError, OSError) as exc:
            log.warning("commit failed; the batch may be read again",
                        group=self.options.group_id, error=repr(exc)[:200])
