"""Wait until consumer groups have read (and committed) every message of some topics:
the graceful stop of the embedded stack waits for it between stopping the agents and
stopping the services, so that no report in flight is left in a broker that forgets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition


async def wait_consumed(bootstrap: str, groups: Sequence[str], topics: Sequence[str],
                        timeout_s: float) -> bool:
    """True once every group's committed offset reaches where every partition of
    ``topics`` ended when called (what was sent until then: later messages, such as the
    admissions of submits still coming in, are not waited for); False when ``timeout_s``
    passed first (or the broker did not answer)."""
    deadline = time.monotonic() + timeout_s
    readers = [AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=g,
                                enable_auto_commit=False, request_timeout_ms=3000)
               for g in groups]
    try:
        for r in readers:
            await r.start()
        tps = [TopicPartition(t, p) for t in topics
               for p in sorted(readers[0].partitions_for_topic(t) or ())] if readers else []
        ends = await readers[0].end_offsets(tps) if tps else {}
        while time.monotonic() < deadline:
            committed = [{tp: await r.committed(tp) for tp in tps} for r in readers]
            if all(_caught_up(ends, c) for c in committed):
                return True
            await asyncio.sleep(0.2)
        return False
    except Exception:  # a broker already gone: nothing more can be read from it anyway
        return False
    finally:
        for r in readers:
            await r.stop()


def _caught_up(ends: Mapping[TopicPartition, int],
               committed: Mapping[TopicPartition, int | None]) -> bool:
    return all(end == 0 or (committed.get(tp) or 0) >= end for tp, end in ends.items())
