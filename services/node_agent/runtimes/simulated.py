"""A simulated runtime: a task 'runs' for its declared duration, then exits 0.

Hundreds of simulated agents share one event loop, so a task is just a timer. Each task
gets a synthetic pid (above any real pid, so it never matches a real process) under
which the simulated GPUs report its memory, and a synthetic log: a start line, one
training-step line per second it has run, and its end. The log is built when read, from
the start time and the end, so a task costs no timer per line; it is append-only, so a
follower polling it sees each line once.

With a state directory each task is also a file (its launch, wall-clock start and
duration; its exit if it was stopped), so a task outlives an agent killed and restarted:
``reconcile()`` resumes it for the time it has left, or returns it as ended if its time
ran out while the agent was down. Whether the agent may keep it (was it down past its
lease?) is the agent's decision. A task that ran its full time needs no exit written
(its file says when its time ran out), and a reported task's file is removed: the
agent's journal remembers every task that ended on the node, so a redelivered binding
never reaches the runtime again. Two writes a task at most, one unlink: at hundreds of
tasks a second, the agent's CPU is mostly these files. (Tombstones of earlier versions,
marked ``reported``, are pruned after ``keep_done_s``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote

from services.node_agent.atomic_file import write_json
from services.node_agent.runtimes.base import ExitCallback, GpuGrant, TaskExit, TaskLaunch

DEFAULT_DURATION_S = 5.0
SYNTHETIC_PID_BASE = 1 << 23  # Linux pid_max is at most 2**22: no real pid is this high
MAX_STEP_LINES = 1_000  # a long simulated task logs its first steps, then its end
KEEP_LOGS = 512  # ended tasks whose log is kept (per simulated node)
KEPT_ENV = ("RANK", "WORLD_SIZE")  # what the simulation reads (and KAIROS_SIM_*); no secrets


@dataclass
class _SimTask:
    launch: TaskLaunch
    pid: int
    started: float  # wall clock: log lines carry real times
    duration: float
    ended: float | None = None
    end_line: str = ""
    saved: dict[str, Any] | None = None  # what its file holds (None without a state dir)


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class SimulatedRuntime:
    name = "simulated"

    def __init__(self, on_exit: ExitCallback, state_dir: str | os.PathLike[str] | None = None,
                 *, keep_done_s: float = 7 * 86400) -> None:
        self._on_exit = on_exit
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sims: OrderedDict[str, _SimTask] = OrderedDict()
        self._pids = itertools.count(SYNTHETIC_PID_BASE)
        self._dir = Path(state_dir, "sim-tasks") if state_dir else None
        self._keep_done_s = keep_done_s

    async def start(self, launch: TaskLaunch) -> None:
        if launch.key in self._tasks:
            return
        state = self._read(launch.key)
        if state is not None and "exit" in state:  # it ran here before: report that again
            await self._on_exit(TaskExit(**state["exit"]))
            return
        duration = DEFAULT_DURATION_S if launch.duration_s is None else launch.duration_s
        sim = self._track(launch, time.time(), duration)
        if self._dir is not None:
            sim.saved = {"launch": _saved(launch), "started": sim.started, "duration": duration}
            self._write(launch.key, sim.saved)
        self._tasks[launch.key] = asyncio.create_task(self._run(launch.key, duration))

    def _track(self, launch: TaskLaunch, started: float, duration: float) -> _SimTask:
        sim = self._sims[launch.key] = _SimTask(launch, next(self._pids), started, duration)
        self._sims.move_to_end(launch.key)
        if len(self._sims) > KEEP_LOGS + len(self._tasks):  # the oldest ended logs go
            ended = [k for k, s in self._sims.items() if s.ended is not None]
            for old in ended[:max(0, len(ended) - KEEP_LOGS)]:
                del self._sims[old]
        return sim

    async def _run(self, key: str, duration: float) -> None:
        await asyncio.sleep(duration)
        self._tasks.pop(key, None)
        await self._end(key, 0, "completed", "", "training finished: exit 0", ran_out=True)

    async def _end(self, key: str, code: int, reason: str, message: str, line: str,
                   *, ran_out: bool = False) -> None:
        """Record the exit of a stopped task in its file (a restart reports it, never
        resumes it; one that ran out its time says so by its start and duration), then
        report it."""
        sim = self._sims.get(key)
        if sim is not None and sim.ended is None:
            sim.ended, sim.end_line = time.time(), line
        exit_ = TaskExit(key, code, reason, message, ran_s=self._ran(key))
        if not ran_out and sim is not None and sim.saved is not None:
            self._write(key, {**sim.saved, "exit": asdict(exit_), "ended": sim.ended,
                              "end_line": line})
        await self._on_exit(exit_)

    async def stop(self, key: str, grace_s: float, reason: str = "stopped",
                   message: str = "") -> None:
        task = self._tasks.pop(key, None)
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self._end(key, 137, reason, message,
                        f"stopped ({reason}{': ' + message if message else ''}): exit 137")

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
        """After a restart: resume the tasks whose time is not up, return those that
        ended unreported (their time ran out while the agent was down, or they ended
        before it died). Prunes old tombstones."""
        if self._dir is None or not self._dir.is_dir():
            return []
        ended, now = [], time.time()
        for file in sorted(self._dir.glob("*.json")):
            state = _load(file)
            if state is None or state.get("reported"):
                if state is None or now - state.get("reported_at", now) > self._keep_done_s:
                    file.unlink(missing_ok=True)
                continue
            launch = _restored(state["launch"])
            if launch.key in self._tasks:
                continue
            sim = self._track(launch, state["started"], state["duration"])
            sim.saved = {k: state[k] for k in ("launch", "started", "duration")}
            end = sim.started + sim.duration
            if "exit" not in state and end <= now:  # its time ran out while we were down
                state.update(exit=asdict(TaskExit(launch.key, 0, "completed",
                                                  ran_s=round(sim.duration, 3))),
                             ended=end, end_line="training finished: exit 0")
                self._write(launch.key, state)
            if "exit" in state:
                sim.ended, sim.end_line = state.get("ended") or now, state.get("end_line", "")
                ended.append(TaskExit(**state["exit"]))
            else:
                self._tasks[launch.key] = asyncio.create_task(self._run(launch.key, end - now))
        return ended

    async def forget(self, key: str) -> None:
        """The exit of ``key`` was reported (and the agent's journal keeps it)."""
        file = self._file(key)
        if file is not None:
            file.unlink(missing_ok=True)

    def _file(self, key: str) -> Path | None:
        return None if self._dir is None else self._dir / f"{quote(key, safe='')}.json"

    def _read(self, key: str) -> dict[str, Any] | None:
        file = self._file(key)
        return None if file is None else _load(file)

    def _write(self, key: str, state: dict[str, Any]) -> None:
        file = self._file(key)
        if file is not None:
            write_json(file, state)

    def logs(self, key: str, tail: int | None = None) -> str:
        sim = self._sims.get(key)
        if sim is None:
            raise KeyError(key)
        lines = self._lines(sim)
        return "".join(lines if tail is None else lines[-tail:] if tail else [])

    @staticmethod
    def _lines(sim: _SimTask) -> list[str]:
        la, env = sim.launch, sim.launch.env
        gpus = ", ".join(f"{g.index}" + (f" (MIG {g.mig_profile} at {g.mig_start})" if g.is_mig
                                         else f" ({g.memory_mib} MiB, {g.compute_pct}%)"
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
        """The tasks end with the process; their files (if any) let the next run resume them."""
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()


def _load(file: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return state


def _saved(launch: TaskLaunch) -> dict[str, Any]:
    """The launch as its file keeps it: shallow (JSON copies it anyway), without secrets."""
    env = {k: v for k, v in launch.env.items() if k in KEPT_ENV or k.startswith("KAIROS_SIM_")}
    saved = {f.name: getattr(launch, f.name) for f in fields(launch)}
    return {**saved, "env": env, "gpus": [dict(vars(g)) for g in launch.gpus]}


def _restored(saved: dict[str, Any]) -> TaskLaunch:
    return TaskLaunch(**{**saved, "command": tuple(saved["command"]),
                         "gpus": tuple(GpuGrant(**g) for g in saved["gpus"])})
