"""The node's journal of tasks: what each was started with, and how it ended.

One small file per task under ``<state_dir>/<node>/journal/``, written by the agent
(whatever the runtime): at the start its GPUs, sizes, time limit, grace and first start
(wall clock); at the end its final report, the ``JobStatus`` the agent sent. So:

- an agent restarted (kill -9, Ctrl-C) gives an adopted task back everything it had
  (its limit counted from its first start, its GPUs for the share watchdog, its
  connection), and remembers every task that ended here: a redelivered binding starts
  nothing, and a reconcile that still lists an ended task gets its outcome again;
- an outcome outlives a broker that acknowledged the report and then lost it (the
  embedded broker keeps its log in memory): the scheduler's next reconcile of the node
  lists the task as still owned, and the agent sends the outcome again instead of
  "not running here". A task leaving the owned list is the scheduler's acknowledgement.

Entries whose task ended more than ``keep_s`` ago are pruned at start, and the oldest
ended entries go past ``limit``. Without a directory the journal lives in memory (unit
tests, an agent without state): the same rules, for the life of the process. Secrets
never reach it: of the environment only the simulation's own settings are kept.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote

from services.node_agent.atomic_file import write_json
from services.node_agent.runtimes.base import GpuGrant, TaskLaunch
from shared.events import Connection, JobStatus
from shared.logging import get_logger

log = get_logger(__name__)

KEEP_S = 7 * 86400.0
LIMIT = 100_000
KEPT_ENV_PREFIX = "KAIROS_SIM_"  # what a simulated task reads back; no secrets


@dataclass
class TaskEntry:
    key: str
    gpus: list[dict[str, Any]] = field(default_factory=list)
    cpu_milli: int = 0
    memory_mib: int = 0
    env: dict[str, str] = field(default_factory=dict)
    started_at: float | None = None  # wall clock of its first start here
    time_limit_s: float | None = None
    grace_s: float = 30.0
    connection: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None  # the final JobStatus, as sent
    ended_at: float | None = None  # wall clock

    def launch(self) -> TaskLaunch:
        """What the task was launched with, as far as the journal keeps it."""
        job_id, task_id, attempt = self.key.split("/")
        return TaskLaunch(job_id=job_id, task_id=task_id, attempt=int(attempt), image="",
                          command=(), env=dict(self.env),
                          gpus=tuple(GpuGrant(**g) for g in self.gpus),
                          cpu_milli=self.cpu_milli, memory_mib=self.memory_mib)

    def status(self) -> JobStatus | None:
        return None if self.outcome is None else JobStatus.model_validate(self.outcome)

    def limit_left(self, now: float) -> float | None:
        """Seconds left of its time limit (counted from its first start), if it has one."""
        if not self.time_limit_s or self.started_at is None:
            return None
        return max(0.0, self.started_at + self.time_limit_s - now)

    def conn(self) -> Connection | None:
        return None if self.connection is None else Connection.model_validate(self.connection)


class Journal:
    def __init__(self, path: Path | None = None, *, keep_s: float = KEEP_S,
                 limit: int = LIMIT) -> None:
        self._path = path
        self._keep_s = keep_s
        self._limit = limit
        self._entries: dict[str, TaskEntry] = {}
        if path is not None and path.is_dir():
            self._load(path)

    def _load(self, path: Path) -> None:
        now = time.time()
        loaded = []
        for file in path.glob("*.json"):
            try:
                entry = TaskEntry(**json.loads(file.read_text()))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("unreadable journal entry dropped", file=str(file), error=repr(exc))
                file.unlink(missing_ok=True)
                continue
            if entry.ended_at is not None and now - entry.ended_at > self._keep_s:
                file.unlink(missing_ok=True)
                continue
            loaded.append(entry)
        # oldest first, so that the cap drops the oldest ended entries
        for entry in sorted(loaded, key=lambda e: e.ended_at or e.started_at or 0.0):
            self._entries[entry.key] = entry
        self._cap()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> TaskEntry | None:
        return self._entries.get(key)

    def ended_keys(self) -> list[str]:
        return [k for k, e in self._entries.items() if e.outcome is not None]

    def outcome(self, key: str) -> JobStatus | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.status()

    def started(self, launch: TaskLaunch, *, time_limit_s: float | None, grace_s: float,
                connection: Connection | None = None) -> TaskEntry:
        """Record a start; a task started before (a redelivery, a restart) keeps its
        first start time, so its limit is never stretched."""
        entry = self._entries.get(launch.key)
        if entry is not None and entry.started_at is not None:
            return entry
        entry = TaskEntry(
            key=launch.key, gpus=[dict(vars(g)) for g in launch.gpus], cpu_milli=launch.cpu_milli,
            memory_mib=launch.memory_mib,
            env={k: v for k, v in launch.env.items() if k.startswith(KEPT_ENV_PREFIX)},
            started_at=time.time(), time_limit_s=time_limit_s, grace_s=grace_s,
            connection=None if connection is None else connection.model_dump(mode="json"))
        self._put(entry)
        return entry

    def ended(self, key: str, status: JobStatus) -> None:
        """Record the task's final report before it is sent: from now on the node knows
        how it ended, whatever happens to the report."""
        entry = self._entries.get(key) or TaskEntry(key=key)
        entry.outcome = status.model_dump(mode="json")
        entry.ended_at = time.time()
        self._entries.pop(key, None)  # the newest end last: the cap drops the oldest
        self._put(entry)
        self._cap()

    def _put(self, entry: TaskEntry) -> None:
        self._entries[entry.key] = entry
        if self._path is None:
            return
        # shallow: asdict's deep copy was most of the cost of a write
        write_json(self._file(entry.key), {f.name: getattr(entry, f.name)
                                           for f in fields(entry)})

    def _cap(self) -> None:
        if len(self._entries) <= self._limit:
            return
        for key in [k for k, e in self._entries.items() if e.outcome is not None]:
            if len(self._entries) <= self._limit:
                break
            del self._entries[key]
            if self._path is not None:
                with contextlib.suppress(OSError):
                    self._file(key).unlink()

    def _file(self, key: str) -> Path:
        assert self._path is not None
        return self._path / f"{quote(key, safe='')}.json"
