"""An in-memory bus with the interface of ``shared.bus``'s Producer and Consumer.

This is a STAND-IN for the broker, checked against the real one (Tansu) by
tests/shared/test_bus_contract.py: what that suite asserts for both is what this fake
promises, and nothing more. Only the transport is faked. The log is a list per
partition, keys are partitioned as Kafka's default partitioner does (murmur2), and
offsets are committed per group. What a consumer does with a fetch (decode, dedupe,
retries, dead letters, the end-of-batch hook) is the real
``shared.bus.dispatch.Dispatcher``, exactly as the Kafka consumer runs it.

Not modelled: group rebalancing (a second live member of a group is refused: use the
real broker), broker outages, retention, topics created after a consumer started,
lag metrics and fetch pacing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.partitioner import murmur2

from shared.bus import BatchHandler, BatchHook, ConsumerOptions, Handler, check_size
from shared.bus.dispatch import Dispatcher
from shared.config import CommonSettings
from shared.events import Envelope, Event
from shared.topics import ALL_TOPICS, Topic, topic_for

Record: TypeAlias = "ConsumerRecord[bytes, bytes]"


class InMemoryBroker:
    """Topics of partitions of records, and each group's committed offsets."""

    def __init__(self, topics: Iterable[Topic] = ALL_TOPICS,
                 max_partitions: int | None = None) -> None:
        self._logs: dict[str, list[list[Record]]] = {}
        self._committed: dict[tuple[str, TopicPartition], int] = {}
        self._members: set[str] = set()  # groups with a live subscribed member
        for t in topics:
            self.create_topic(t.name, min(t.partitions, max_partitions or t.partitions))

    def create_topic(self, name: str, partitions: int) -> None:
        """An existing topic stays as it is (as ensure_topics leaves it)."""
        self._logs.setdefault(name, [[] for _ in range(partitions)])

    def partitions(self, topic: str) -> int:
        return len(self._logs[topic])

    def append(self, topic: str, key: bytes | None, value: bytes,
               partition: int | None = None) -> None:
        """Kafka's default partitioner for a keyed message; an unkeyed one (which Kairos
        never sends but as raw test bytes) goes to partition 0. Unknown topics are
        created with one partition, as a broker that auto-creates them does."""
        log = self._logs.setdefault(topic, [[]])
        if partition is None:
            partition = int(murmur2(key) & 0x7FFFFFFF) % len(log) if key is not None else 0
        records = log[partition]
        records.append(ConsumerRecord(
            topic=topic, partition=partition, offset=len(records),
            timestamp=int(time.time() * 1000), timestamp_type=0, key=key, value=value,
            checksum=None, serialized_key_size=len(key or b""),
            serialized_value_size=len(value), headers=[]))

    def read(self, tp: TopicPartition, offset: int, limit: int) -> list[Record]:
        return self._logs[tp.topic][tp.partition][offset:offset + limit]

    def end_offset(self, tp: TopicPartition) -> int:
        return len(self._logs[tp.topic][tp.partition])

    def committed(self, group: str, tp: TopicPartition) -> int | None:
        return self._committed.get((group, tp))

    def commit(self, group: str, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            self._committed[(group, tp)] = offset

    def join(self, group: str) -> None:
        if group in self._members:
            raise NotImplementedError(f"group {group} already has a live member: the fake "
                                      "does not rebalance; use the real broker")
        self._members.add(group)

    def leave(self, group: str) -> None:
        self._members.discard(group)


class FakeProducer:
    """``shared.bus.Producer`` onto an :class:`InMemoryBroker`."""

    def __init__(self, broker: InMemoryBroker, source: str,
                 max_event_bytes: int = 1_000_000) -> None:
        self.broker = broker
        self.source = source
        self.max_event_bytes = max_event_bytes

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def publish(self, event: Event, event_id: str | None = None) -> Envelope:
        env = Envelope.wrap(event, self.source, event_id)
        await self.publish_envelope(env, topic_for(event).name)
        return env

    def encode(self, env: Envelope) -> bytes:
        return check_size(env, self.max_event_bytes)

    async def publish_envelope(self, env: Envelope, topic: str,
                               partition: int | None = None) -> None:
        self.broker.append(topic, env.key.encode(), self.encode(env), partition)

    async def publish_many(self, items: Sequence[tuple[Envelope, str]]) -> None:
        payloads = [self.encode(env) for env, _ in items]  # all checked before any send
        for (env, topic), value in zip(items, payloads, strict=True):
            self.broker.append(topic, env.key.encode(), value)

    async def reachable(self, timeout_s: float = 2.0) -> bool:
        return True

    async def partition_count(self, topic: str) -> int:
        return self.broker.partitions(topic)

    async def send_future(self, topic: str, key: str, value: bytes) -> asyncio.Future[Any]:
        self.broker.append(topic, key.encode(), value)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        self.broker.append(topic, key, value)


class FakeConsumer:
    """``shared.bus.Consumer`` reading the broker of ``producer``: fetch → the real
    dispatcher → commit after the whole fetch, as the Kafka consumer does."""

    POLL_S = 0.01  # an idle consumer looks for new records this often

    def __init__(self, settings: CommonSettings, options: ConsumerOptions, handler: Handler,
                 producer: FakeProducer, on_batch_end: BatchHook | None = None,
                 batch_handler: BatchHandler | None = None) -> None:
        self.settings = settings
        self.options = options
        self._broker = producer.broker
        self._dispatcher = Dispatcher(settings, options.group_id, handler, producer,
                                      batch_handler=batch_handler, on_batch_end=on_batch_end,
                                      dead_letter=options.dead_letter)
        self._positions: dict[TopicPartition, int] = {}
        self._stopping = asyncio.Event()
        self._started = False
        self._member = False

    async def start(self) -> None:
        """Take the assigned partitions (or every partition of the topics, as the only
        member of the group) at the committed offset, else the beginning or the end."""
        if self._started:
            return
        self._started = True
        if self.options.assign is not None:
            partitions = list(self.options.assign)
        else:
            if self.options.commit:
                self._broker.join(self.options.group_id)
                self._member = True
            partitions = [TopicPartition(t, p) for t in self.options.topics
                          for p in range(self._broker.partitions(t))]
        for tp in partitions:
            committed = (self._broker.committed(self.options.group_id, tp)
                         if self.options.commit else None)
            if committed is None:
                committed = 0 if self.options.from_beginning else self._broker.end_offset(tp)
            self._positions[tp] = committed

    async def stop(self) -> None:
        self._stopping.set()
        if self._member:
            self._broker.leave(self.options.group_id)
            self._member = False

    def assignment(self) -> set[TopicPartition]:
        return set(self._positions)

    async def run(self) -> None:
        while not self._stopping.is_set():
            batch: dict[TopicPartition, list[Record]] = {}
            room = self.options.max_records
            for tp, position in self._positions.items():
                records = self._broker.read(tp, position, room)
                if records:
                    batch[tp] = records
                    room -= len(records)
                if not room:
                    break
            if not batch:
                await asyncio.sleep(self.POLL_S)
                continue
            offsets = {tp: rs[-1].offset + 1 for tp, rs in batch.items()}
            self._positions.update(offsets)  # fetched: the position moves on, as Kafka's
            await self._dispatcher.handle_fetch([r for rs in batch.values() for r in rs])
            if self.options.commit:
                self._broker.commit(self.options.group_id, offsets)
