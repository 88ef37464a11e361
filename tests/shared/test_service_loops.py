"""A service's loops outlive an outage: one that fails because PostgreSQL or the broker
is away starts over (the queueing service's cycle loop used to end the process on a
PostgreSQL restart); one that fails on anything else still ends the service."""

from __future__ import annotations

import pytest

from shared.config import CommonSettings
from shared.service import ServiceRuntime


def _runtime() -> ServiceRuntime:
    return ServiceRuntime(CommonSettings(service_name="loops"), use_db=False)


async def test_a_loop_that_meets_an_outage_starts_over_and_a_bug_still_ends_it() -> None:
    calls = []

    async def cycle() -> None:
        calls.append(1)
        if len(calls) <= 2:  # PostgreSQL's socket gone while it restarts
            raise FileNotFoundError(2, "No such file or directory")
        raise ValueError("a bug")

    rt = _runtime()
    rt.add_loop(cycle)
    (loop,) = rt._loops  # what run() starts as a task
    with pytest.raises(ValueError, match="a bug"):
        await loop()
    assert len(calls) == 3  # two outages waited out, then the bug ends it


async def test_a_loop_that_ends_is_not_started_again() -> None:
    calls = []

    async def once() -> None:
        calls.append(1)

    rt = _runtime()
    rt.add_loop(once)
    await rt._loops[0]()
    assert calls == [1]
