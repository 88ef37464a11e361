"""Waiting out a dependency that is away: PostgreSQL restarting, the broker gone.

A transient error (``shared.errors.is_transient``) is retried with capped exponential
backoff for as long as it lasts; any other error is the caller's to handle. This is
what keeps a service alive through a database or broker restart instead of exiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shared import metrics
from shared.errors import is_transient
from shared.logging import get_logger

log = get_logger(__name__)
T = TypeVar("T")


def backoff_s(attempt: int, base_s: float = 0.2, cap_s: float = 5.0) -> float:
    """The wait before try ``attempt + 1`` (attempt counts from 1)."""
    return float(min(cap_s, base_s * 2 ** max(0, attempt - 1)))


async def retry_transient(fn: Callable[[], Awaitable[T]], what: str, *,
                          base_s: float = 0.2, cap_s: float = 5.0) -> T:
    """``await fn()`` until it succeeds or fails with a non-transient error. For a
    service loop, ``fn`` is the loop: it starts over (its own state lost, so it must
    resume from what is stored); a non-transient error ends the service (non-zero exit)
    for its supervisor to restart."""
    attempt = 0
    while True:
        try:
            return await fn()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not is_transient(exc):
                raise
            attempt += 1
            metrics.DEPENDENCY_WAITS.labels(what).inc()
            wait = backoff_s(attempt, base_s, cap_s)
            log.warning("dependency unavailable, retrying", what=what, attempt=attempt,
                        wait_s=round(wait, 2), error=repr(exc)[:300])
            await asyncio.sleep(wait)
