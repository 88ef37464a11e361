"""The interface every runtime implements; the agent shell only talks to this.

A task is identified by ``TaskLaunch.key`` (``<job_id>/<task_id>/<attempt>``), unique
per attempt, so a redelivered binding maps to the same key and is started once.

Importable on Python 3.9 (no ``slots=True``), as is the local-process runtime:
``scripts/gpu_check.sh`` runs them with a GPU host's own Python.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class GpuGrant:
    """A GPU (or share of one, or a MIG instance of one) granted to the task."""

    index: int
    uuid: str = ""  # a MIG grant: the instance's, "MIG-..."
    memory_mib: int = 0  # 0 = whole GPU
    compute_pct: int = 100
    mig_profile: str = ""  # set: the MIG instance at memory slice mig_start, not the GPU
    mig_start: int = -1

    @property
    def is_mig(self) -> bool:
        """A MIG instance: isolated by the hardware, never a share (no MPS, no watchdog)."""
        return bool(self.mig_profile)


@dataclass(frozen=True)
class TaskLaunch:
    job_id: str
    task_id: str
    attempt: int
    image: str
    command: tuple[str, ...]
    env: dict[str, str]  # job env plus rendezvous variables, already merged
    gpus: tuple[GpuGrant, ...]
    cpu_milli: int
    memory_mib: int
    duration_s: float | None = None  # for the simulated runtime
    labels: dict[str, str] = field(default_factory=dict)
    rank: int = 0  # the task's rank in its job (the Kubernetes runtime names its Pod host)

    @property
    def key(self) -> str:
        return f"{self.job_id}/{self.task_id}/{self.attempt}"


@dataclass(frozen=True)
class TaskExit:
    key: str
    exit_code: int
    reason: str  # "completed", "error", "killed", "stopped", "share_exceeded", ...
    message: str = ""
    ran_s: float | None = None  # how long it ran, where the runtime knows (the work done)
    checkpoint: str | None = None  # the last checkpoint the task recorded, where known


ExitCallback = Callable[[TaskExit], Awaitable[None]]


def exit_reason(code: int) -> str:
    """The reason word of an exit code: a SIGTERM or SIGKILL death reads as killed."""
    if code == 0:
        return "completed"
    return "killed" if code in (128 + signal.SIGKILL, 128 + signal.SIGTERM) else "error"

# Where a task records its last checkpoint (a path or step, one line), read when it ends
# and reported with its exit. The local runtime points it at a file of its own; Pods at
# the container's termination message path, which Kubernetes returns in the Pod status.
CHECKPOINT_ENV = "KAIROS_CHECKPOINT_FILE"
CHECKPOINT_MAX = 512  # characters kept


def read_checkpoint(text: str | None) -> str | None:
    """The last non-empty line of what the task recorded, trimmed; None if nothing."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:CHECKPOINT_MAX] if lines else None


class Runtime(Protocol):
    name: str

    async def start(self, launch: TaskLaunch) -> None:
        """Start the task; returns once it is running. Raises RuntimeStartError."""

    async def stop(self, key: str, grace_s: float, reason: str = "stopped",
                   message: str = "") -> None:
        """Signal the task, wait up to ``grace_s``, then kill it. Idempotent.

        The exit is reported through the ExitCallback with ``reason``/``message``
        (e.g. "preempted", "cancelled", "share_exceeded") and the real exit code."""

    async def running(self) -> list[str]:
        """Keys of tasks this runtime still runs (used to reconcile after a restart)."""

    async def reconcile(self) -> list[TaskExit]:
        """After a restart: adopt the tasks still running (they then report through the
        ExitCallback) and return those that ended unreported while the agent was down."""

    async def forget(self, key: str) -> None:
        """The exit of ``key`` was published; ``reconcile`` stops returning it."""

    def logs(self, key: str, tail: int | None = None) -> str:
        """The task's output; raises KeyError for an unknown task. Blocking (a file or an
        HTTP read): call it through ``asyncio.to_thread``."""

    async def close(self) -> None:
        """Release resources; running tasks of a simulated runtime end (with a state
        directory, the next run resumes them)."""


class RuntimeStartError(Exception):
    """The runtime could not start a task; the agent reports it failed."""
