"""A consumer's positions against the log: lag per partition, and a restart from the
beginning of a log that ends before the position (the broker lost it)."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from shared import metrics
from shared.logging import get_logger

log = get_logger(__name__)


class PositionWatcher:
    """Checks the positions of one consumer at most once every ``every_s``."""

    def __init__(self, consumer: AIOKafkaConsumer, service: str, group_id: str,
                 every_s: float = 1.0, timeout_s: float = 10.0) -> None:
        self._consumer = consumer
        self._service = service
        self._group_id = group_id
        self._every_s = every_s
        self._timeout_s = timeout_s
        self._checked_at = 0.0

    async def watch(self) -> None:
        """Report lag and reset gone logs; a broker that does not answer only skips it."""
        try:
            # bounded: ``position`` waits for a partition's offset, which a consumer whose
            # group coordinator died may never get; the consumer loop must not wait with it
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
            # lands as its inner call ends (CPython gh-86296), and a consumer loop cancelled
            # there ran on forever (a monitor standing down hung on it)
            async with asyncio.timeout(self._timeout_s):
                await self._check()
        except TimeoutError:
            log.warning("lag check timed out", group=self._group_id, timeout_s=self._timeout_s)
        except (KafkaError, OSError) as exc:
            log.info("lag check failed", group=self._group_id, error=repr(exc)[:200])

    async def _check(self) -> None:
        """Lag per partition: highwater - position. The highwater comes with fetches; a
        partition that has not returned data yet is asked for its end offset instead.
        A log that ends before our position is gone (a broker that came back empty, a
        topic recreated): everything in it is new, so read it from its start."""
        now = time.monotonic()
        if now - self._checked_at < self._every_s:
            return
        self._checked_at = now
        consumer = self._consumer
        assigned = list(consumer.assignment())
        unknown = [tp for tp in assigned if consumer.highwater(tp) is None]
        ends = await consumer.end_offsets(unknown) if unknown else {}
        positions = {tp: await consumer.position(tp) for tp in assigned}
        behind = [tp for tp in assigned if (consumer.highwater(tp) or 0) < positions[tp]]
        if behind:  # confirm with the broker: a highwater from a fetch may be stale
            ends.update(await consumer.end_offsets(behind))
            gone = [tp for tp in behind if ends[tp] < positions[tp]]
            if gone:
                for tp in gone:
                    log.warning("partition log is gone (broker restarted empty?): reading "
                                "it from the start", topic=tp.topic, partition=tp.partition,
                                position=positions[tp], end=ends[tp])
                    metrics.OFFSET_RESETS.labels(self._service, tp.topic).inc()
                await consumer.seek_to_beginning(*gone)
                return
        for tp in assigned:
            high = consumer.highwater(tp)
            if high is None or tp in ends:
                high = ends.get(tp)
            if high is None:
                continue
            metrics.CONSUMER_LAG.labels(self._service, self._group_id, tp.topic,
                                        str(tp.partition)).set(max(0, high - positions[tp]))
