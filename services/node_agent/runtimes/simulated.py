"""A simulated runtime: a task 'runs' for its declared duration, then exits 0.

Hundreds of simulated agents share one event loop, so a task is just a timer. Each task
gets a synthetic pid (above any real pid, so it never matches a real process) under
which the simulated GPUs report its memory, and a synthetic log: a start line, one
training-step line per second it has run, and its end. The log is built when read, from
the start time and the end, so a task costs no timer per line; it is append-only, so a
follower polling it sees each line once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from services.node_agent.runtimes.base import ExitCallback, TaskExit, TaskLaunch

DEFAULT_DURATION_S = 5.0
SYNTHETIC_PID_BASE = 1 << 23  # Linux pid_max is at most 2**22: no real pid is this high
MAX_STEP_LINES = 1_000  # a long simulated task logs its first steps, then its end
KEEP_LOGS = 512  # ended tasks whose log is kept (per simulated node)


@dataclass
class _SimTask:
    launch: TaskLaunch
    pid: int
    started: float  # wall clock: log lines carry real times
    duration: float
    ended: float | None = None
    end_line: str = ""


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class SimulatedRuntime:
    name = "simulated"

    def __init__(self, on_exit: ExitCallback) -> None:
        self._on_exit = on_exit
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sims: OrderedDict[str, _SimTask] = OrderedDict()
        self._pids = itertools.count(SYNTHETIC_PID_BASE)

    async def start(self, launch: TaskLaunch) -> None:
        if launch.key in self._tasks:
            return
        duration = DEFAULT_DURATION_S if launch.duration_s is None else launch.duration_s
        self._sims[launch.key] = _SimTask(launch, next(self._pids), time.time(), duration)
        self._sims.move_to_end(launch.key)
        if len(self._sims) > KEEP_LOGS + len(self._tasks):  # the oldest ended logs go
            ended = [k for k, s in self._sims.items() if s.ended is not None]
            for old in ended[:max(0, len(ended) - KEEP_LOGS)]:
                del self._sims[old]
        self._tasks[launch.key] = asyncio.create_task(self._run(launch.key, duration))

    async def _run(self, key: str, duration: float) -> None:
        await asyncio.sleep(duration)
        self._tasks.pop(key, None)
        self._ended(key, "training finished: exit 0")
        await self._on_exit(TaskExit(key, 0, "completed", ran_s=self._ran(key)))

    def _ended(self, key: str, line: str) -> None:
        sim = self._sims.get(key)
        if sim is not None and sim.ended is None:
            sim.ended, sim.end_line = time.time(), line

    async def stop(self, key: str, grace_s: float, reason: str = "stopped",
                   message: str = "") -> None:
        task = self._tasks.pop(key, None)
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self._ended(key, f"stopped ({reason}{': ' + message if message else ''}): exit 137")
        await self._on_exit(TaskExit(key, 137, reason, message, ran_s=self._ran(key)))

    def _ran(self, key: str) -> float | None:
        sim = self._sims.get(key)
        if sim is None:
            return None
        return round((sim.ended or time.time()) - sim.started, 3)

    async def running(self) -> list[str]:
        return list(self._tasks)

    def task_pids(self, key: str) -> set[int]:
        """The task's synthetic pid while it runs (the share watchdog's view of it)."""
        sim = self._sims.get(key)
        return {sim.pid} if sim is not None and key in self._tasks else set()

    async def reconcile(self) -> list[TaskExit]:
        return []  # simulated tasks do not outlive the agent

    async def forget(self, key: str) -> None:
        return None

    def logs(self, key: str, tail: int | None = None) -> str:
        sim = self._sims.get(key)
        if sim is None:
            raise KeyError(key)
        lines = self._lines(sim)
        return "".join(lines if tail is None else lines[-tail:] if tail else [])

    @staticmethod
    def _lines(sim: _SimTask) -> list[str]:
        la, env = sim.launch, sim.launch.env
        gpus = ", ".join(f"{g.index}" + (f" ({g.memory_mib} MiB, {g.compute_pct}%)"
                                         if g.memory_mib else "") for g in la.gpus) or "none"
        lines = [f"{_stamp(sim.started)} [kairos-sim] {la.task_id} of {la.job_id} attempt "
                 f"{la.attempt}: rank {env.get('RANK', '0')} of {env.get('WORLD_SIZE', '1')}, "
                 f"GPUs {gpus}, {sim.duration:g}s of training\n"]
        until = sim.ended if sim.ended is not None else time.time()
        steps = min(int(until - sim.started), int(sim.duration), MAX_STEP_LINES)
        for k in range(1, steps + 1):
            loss = 2.5 * math.exp(-3.0 * k / max(sim.duration, 1.0)) + 0.1
            lines.append(f"{_stamp(sim.started + k)} step {k}: loss {loss:.4f}\n")
        if sim.ended is not None:
            lines.append(f"{_stamp(sim.ended)} [kairos-sim] {sim.end_line}\n")
        return lines

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
