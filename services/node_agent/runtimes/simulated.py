"""A simulated runtime: a task 'runs' for its declared duration, then exits 0.

Hundreds of simulated agents share one event loop, so a task is just a timer.
"""

from __future__ import annotations

import asyncio
import contextlib

from services.node_agent.runtimes.base import ExitCallback, TaskExit, TaskLaunch

DEFAULT_DURATION_S = 5.0


class SimulatedRuntime:
    name = "simulated"

    def __init__(self, on_exit: ExitCallback) -> None:
        self._on_exit = on_exit
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def start(self, launch: TaskLaunch) -> None:
        if launch.key in self._tasks:
            return
        duration = DEFAULT_DURATION_S if launch.duration_s is None else launch.duration_s
        self._tasks[launch.key] = asyncio.create_task(self._run(launch.key, duration))

    async def _run(self, key: str, duration: float) -> None:
        await asyncio.sleep(duration)
        self._tasks.pop(key, None)
        await self._on_exit(TaskExit(key, 0, "completed"))

    async def stop(self, key: str, grace_s: float, reason: str = "stopped",
                   message: str = "") -> None:
        task = self._tasks.pop(key, None)
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self._on_exit(TaskExit(key, 137, reason, message))

    async def running(self) -> list[str]:
        return list(self._tasks)

    async def reconcile(self) -> list[TaskExit]:
        return []  # simulated tasks do not outlive the agent

    async def forget(self, key: str) -> None:
        return None

    def logs(self, key: str, tail: int | None = None) -> str:
        if key not in self._tasks:
            raise KeyError(key)
        return ""

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
