"""Test helpers for the node agent: a fluent launch builder, an exit recorder, polling,
a stand-in MPS control binary."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

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


FAKE_MPS = """#!/bin/sh
# stand-in for nvidia-cuda-mps-control: records how it was called
echo "$@ pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "$CALLS"
if [ "$1" = "-d" ]; then
  if [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ]; then echo "already running"; exit 1; fi
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0
fi
read cmd; echo "stdin=$cmd" >> "$CALLS"; rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
"""


def install_fake_mps(tmp_path: Path, setenv: Callable[[str, str], None]) -> Path:
    """Put a stand-in ``nvidia-cuda-mps-control`` first on PATH (the real one needs a GPU:
    it behaves like it for ``-d`` and ``quit``); returns the file recording its calls.
    ``setenv``: ``monkeypatch.setenv``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    binary = bin_dir / "nvidia-cuda-mps-control"
    binary.write_text(FAKE_MPS)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls"
    setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    setenv("CALLS", str(calls))
    return calls
