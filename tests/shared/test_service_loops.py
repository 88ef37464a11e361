"""A service's loops outlive an outage: one that fails because PostgreSQL or the broker
is away starts over (the queueing service's cycle loop used to end the process on a
PostgreSQL restart); one that fails on anything else still ends the service."""

from __future__ import annotations

import asyncio

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


class SlowJoin:
    """A consumer whose group join takes long (as after a kill -9, until the dead
    member's session ends): start() waits until ``joined`` is set. The contract of
    shared.bus.Consumer that ServiceRuntime uses: options.assign, start, run, stop."""

    def __init__(self, assign: object | None = None) -> None:
        self.options = type("Options", (), {"assign": assign})()
        self.joined = asyncio.Event()
        self.started = False

    async def start(self) -> None:
        await self.joined.wait()
        self.started = True

    async def run(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        self.joined.set()


async def test_loops_run_while_a_consumer_group_is_still_joining() -> None:
    """Before: every consumer started, one after another, before any loop, so the outbox
    relay of a restarted admission published nothing for the ~10 s of the join."""
    rt = _runtime()
    slow = SlowJoin()
    rt.add_consumer(slow)  # type: ignore[arg-type]
    relayed = asyncio.Event()

    async def relay() -> None:
        relayed.set()
        await asyncio.Event().wait()

    rt.add_loop(relay)
    running = asyncio.create_task(rt.run())
    await asyncio.wait_for(relayed.wait(), 10)
    assert not slow.started
    slow.joined.set()
    rt.stopping.set()
    await asyncio.wait_for(running, 30)
    assert slow.started
