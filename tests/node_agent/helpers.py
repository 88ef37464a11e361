"""Test helpers for the node agent: a fluent launch builder, an exit recorder, polling."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from services.node_agent.runtimes.base import GpuGrant, TaskExit, TaskLaunch


def launch(job: str = "j1", task: str = "worker-0", attempt: int = 1, *command: str,
           env: dict[str, str] | None = None, gpus: tuple[GpuGrant, ...] = (),
           image: str = "busybox") -> TaskLaunch:
    return TaskLaunch(job_id=job, task_id=task, attempt=attempt, image=image,
                      command=tuple(command), env=dict(env or {}), gpus=gpus,
                      cpu_milli=1000, memory_mib=512)


def with_env(base: TaskLaunch, **env: str) -> TaskLaunch:
    return replace(base, env={**base.env, **env})


class Exits:
    """An ExitCallback that records what it is told."""

    def __init__(self) -> None:
        self.exits: list[TaskExit] = []
        self._changed = asyncio.Event()

    async def __call__(self, exit_: TaskExit) -> None:
        self.exits.append(exit_)
        self._changed.set()

    async def wait(self, key: str) -> TaskExit:
        while True:
            for exit_ in self.exits:
                if exit_.key == key:
                    return exit_
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), 30)


async def until(predicate: Callable[[], bool], step_s: float = 0.02) -> None:
    """Poll ``predicate`` until true (bounded by the test timeout, never asserted on time)."""
    async with asyncio.timeout(30):
        while not predicate():
            await asyncio.sleep(step_s)
