"""The producer: events in their envelope, to the topic the registry assigns."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from shared import metrics
from shared.bus.codec import check_size
from shared.events import Envelope, Event
from shared.topics import topic_for


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
            async with asyncio.timeout(timeout_s):
                await self._producer.client.fetch_all_metadata()
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


async def all_partitions(producer: Producer, topics: Sequence[str]) -> list[TopicPartition]:
    """Every partition of ``topics``: the manual assignment of a reader that holds a
    lease (it reads alone, so it need not wait for a group to rebalance)."""
    return [TopicPartition(t, p) for t in topics
            for p in range(await producer.partition_count(t))]
