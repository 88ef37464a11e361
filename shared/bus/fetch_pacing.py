"""How long a consumer's fetches wait on the broker: short while busy, longer while idle."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer


class FetchPacer:
    """Stretch the fetch wait while idle, back to the short one on the first data.

    A broker that does not answer a waiting fetch as soon as data arrives (Tansu:
    consumers poll with a short wait to keep latency down) makes every idle consumer
    cost it a fetch per wait, whatever the traffic.
    Doubling the wait after each empty poll (200 ms of nothing) up to the idle
    bound, and dropping back on the first message, keeps a busy consumer on the
    short wait and an idle one cheap; the price is up to the idle bound on the first
    message after a quiet spell. aiokafka reads the wait from its fetcher for each
    request it builds (tests/shared/test_bus.py's idle-consumer test checks that it
    does)."""

    def __init__(self, consumer: AIOKafkaConsumer, busy_wait_ms: int,
                 idle_wait_ms: int) -> None:
        self._consumer = consumer
        self._busy_wait_ms = busy_wait_ms
        self._idle_wait_ms = max(busy_wait_ms, idle_wait_ms)
        self._wait_ms = busy_wait_ms

    def after_poll(self, got_data: bool) -> None:
        wait = self._busy_wait_ms if got_data else min(self._idle_wait_ms, self._wait_ms * 2)
        if wait != self._wait_ms:
            self._wait_ms = wait
            fetcher = getattr(self._consumer, "_fetcher", None)
            if fetcher is not None:
                fetcher._fetch_max_wait_ms = wait
