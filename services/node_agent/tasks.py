"""The tasks one node's agent runs, and the keys of those it ran.

A task is keyed ``<job_id>/<task_id>/<attempt>`` (``TaskLaunch.key``). A key that ran
here is remembered (the last ``REMEMBERED`` of them), so a redelivered binding never
starts it again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

from services.node_agent.runtimes.base import TaskLaunch
from shared.events import Connection, EndCause, JobState

REMEMBERED = 100_000


@dataclass
class TaskRecord:
    launch: TaskLaunch
    stop_state: JobState | None = None  # set when the scheduler asked for a stop
    stop_reason: str = "stopped by scheduler"
    stop_cause: EndCause = EndCause.CANCELLED  # why, as a code (with stop_state)
    connection: Connection | None = None  # an interactive session's, once running
    timer: asyncio.Task[None] | None = None  # stops it at the spec's timeLimit
    started: float | None = None  # monotonic clock at its start here (None: adopted)

    def stopping(self, state: JobState, reason: str, cause: EndCause) -> None:
        """Asked to stop: it will be reported ``state`` with this reason and cause."""
        self.stop_state, self.stop_reason, self.stop_cause = state, reason, cause


def task_key(job_id: str, task_id: str, attempt: int) -> str:
    return f"{job_id}/{task_id}/{attempt}"


def split_key(key: str) -> tuple[str, str, int]:
    """(job_id, task_id, attempt) of a task key."""
    job_id, task_id, attempt = key.split("/")
    return job_id, task_id, int(attempt)


class TaskBook:
    def __init__(self) -> None:
        self.live: dict[str, TaskRecord] = {}  # running here (or being stopped)
        self._ran: OrderedDict[str, None] = OrderedDict()  # ended: never start again

    def __len__(self) -> int:
        return len(self.live)

    def remember(self, key: str) -> None:
        self._ran[key] = None
        if len(self._ran) > REMEMBERED:
            self._ran.popitem(last=False)

    def ran(self, key: str) -> bool:
        return key in self._ran

    def seen(self, key: str) -> bool:
        """Running here, or ran here: a binding for it starts nothing."""
        return key in self.live or key in self._ran

    def adopt(self, launch: TaskLaunch, connection: Connection | None = None) -> TaskRecord:
        """A task found running after a restart, as the node's journal recorded it."""
        rec = self.live[launch.key] = TaskRecord(launch, connection=connection)
        return rec

    def keys_of(self, job_id: str) -> list[str]:
        """Keys of the job's tasks running or ran here."""
        prefix = f"{job_id}/"
        return sorted({*(k for k in self.live if k.startswith(prefix)),
                       *(k for k in self._ran if k.startswith(prefix))})
