"""The trace file ``kairos sim export`` writes and every ``kairos sim`` command reads:
the platform's own recorded history, one row per job.

Format (CSV, one comment line first)::

    # kairos-history {"version": 1, "time_unit": "s", "origin": "<ISO time of submit_s 0>", ...}
    job_id,submitted_at,submit_s,duration_s,num_gpus,...

Units are explicit twice: the header says ``time_unit: s`` and every time column ends in
``_s``. Numbers are written as Python's ``repr`` of the float (the shortest text that
reads back to the same float), so export -> load is exact; nothing is clamped, guessed
or scaled (a ``--time-unit`` other than the file's is refused, not applied).

``duration_s`` is the job's summed running time over its attempts (see sim/export.py);
``censored`` marks a job that had not ended at export time (its duration is the running
time so far, a lower bound; 0 if it never started).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from sim.traces import TimeUnit, TraceError, TraceJob

MAGIC = "# kairos-history "
VERSION = 1


@dataclass(frozen=True, slots=True)
class TaskShape:
    """One replica group: ``replicas`` copies of ``gpu`` whole GPUs (or a share)."""

    name: str
    replicas: int
    gpu: int = 0
    gpu_memory_mib: int = 0
    gpu_compute_pct: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0

    def text(self) -> str:
        return ":".join(str(v) for v in (self.name, self.replicas, self.gpu, self.gpu_memory_mib,
                                         self.gpu_compute_pct, self.cpu_milli, self.memory_mib))

    @classmethod
    def parse(cls, s: str) -> TaskShape:
        name, *nums = s.split(":")
        return cls(name, *(int(x) for x in nums))


@dataclass(frozen=True, slots=True)
class HistoryJob(TraceJob):
    """A recorded job: a ``TraceJob`` (``num_gpus`` = whole GPUs of all replicas, the
    gang) that also keeps what the live core ranks and places by."""

    queue: str = "default"
    user: str = ""
    tasks: tuple[TaskShape, ...] = ()
    min_available: int | None = None
    priority: int = 0
    priority_class: str = "normal"
    preemptible: bool = True
    runtime_estimate_s: float | None = None
    state: str = "succeeded"  # the final (or, censored, the current) state
    censored: bool = False
    attempts: int = 1  # attempts that ran (1 + times preempted and restarted)
    submitted_at: str = ""  # ISO, as recorded (submit_s is seconds after the header's origin)
    first_start_s: float | None = None  # on the recorded cluster, seconds after the origin
    end_s: float | None = None

    @property
    def gpus_per_task(self) -> int:
        """Whole GPUs of one replica of the job's largest GPU group."""
        return max((t.gpu for t in self.tasks), default=0)

    @property
    def replicas(self) -> int:
        return sum(t.replicas for t in self.tasks)

    @property
    def ran(self) -> bool:
        """It held GPUs at some point (a job cancelled while waiting did not)."""
        return self.duration_s > 0


COLUMNS = ("job_id", "submitted_at", "submit_s", "duration_s", "num_gpus", "gpus_per_task", "replicas",
           "tasks", "tenant", "queue", "user", "priority", "priority_class", "min_available", "preemptible",
           "runtime_estimate_s", "state", "censored", "attempts", "first_start_s", "end_s")
_DERIVED = ("gpus_per_task", "replicas")  # written for people and other tools; read back from tasks
# a job's speed per GPU model and class (mixed clusters, sim/gavel.py): the platform does
# not record them yet, so a history replays on one GPU model
_NOT_RECORDED = frozenset({"speeds", "kind"})
_FLOATS = ("submit_s", "duration_s", "runtime_estimate_s", "first_start_s", "end_s")
_INTS = ("num_gpus", "priority", "min_available", "attempts")
_BOOLS = ("preemptible", "censored")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple):
        return ";".join(t.text() for t in v)
    return str(v)


def write_history(path: Path | str, jobs: Sequence[HistoryJob], meta: dict[str, Any]) -> None:
    """The header line (``meta`` plus version and unit) and one row per job."""
    head = {"version": VERSION, "time_unit": TimeUnit.S.value} | meta
    with open(path, "w", newline="") as f:
        f.write(MAGIC + json.dumps(head, sort_keys=True) + "\n")
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for j in jobs:
            d = {fd.name: getattr(j, fd.name) for fd in fields(j)}
            d |= {"gpus_per_task": j.gpus_per_task, "replicas": j.replicas}
            w.writerow([_cell(d[c]) for c in COLUMNS])


def is_history(path: Path | str) -> bool:
    with open(path) as f:
        return f.readline().startswith(MAGIC)


def read_header(path: Path | str) -> dict[str, Any]:
    with open(path) as f:
        line = f.readline()
    if not line.startswith(MAGIC):
        raise TraceError(f"{path}: not a kairos history file (no {MAGIC.strip()!r} line)")
    try:
        head: dict[str, Any] = json.loads(line[len(MAGIC):])
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: bad header: {e}") from e
    if head.get("version") != VERSION or head.get("time_unit") != TimeUnit.S.value:
        raise TraceError(f"{path}: version {head.get('version')} / time unit {head.get('time_unit')!r}; "
                         f"this reader takes version {VERSION} in seconds")
    return head


def _job(r: dict[str, str]) -> HistoryJob:
    kw: dict[str, Any] = {}
    for name in (fd.name for fd in fields(HistoryJob) if fd.name not in _NOT_RECORDED):
        v = r[name]
        if name in _FLOATS:
            kw[name] = float(v) if v != "" else None
        elif name in _INTS:
            kw[name] = int(v) if v != "" else None
        elif name in _BOOLS:
            kw[name] = v == "1"
        elif name == "tasks":
            kw[name] = tuple(TaskShape.parse(s) for s in v.split(";") if s)
        else:
            kw[name] = v
    return HistoryJob(**kw)


def load_history(path: Path | str, limit: int | None = None, time_unit: TimeUnit | str | None = None,
                 ran_only: bool = False) -> tuple[list[HistoryJob], dict[str, Any]]:
    """(jobs by submit time, header). ``ran_only``: only jobs that held GPUs (what a
    replay can run: a job that never started has no duration to replay)."""
    head = read_header(path)
    if time_unit is not None and TimeUnit(time_unit) is not TimeUnit.S:
        raise TraceError(f"{path}: a kairos history file states its unit (seconds); "
                         f"--time-unit {TimeUnit(time_unit).value} does not apply")
    with open(path, newline="") as f:
        f.readline()
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {missing}")
        try:
            jobs = [_job(r) for r in reader]
        except (ValueError, TypeError) as e:
            raise TraceError(f"{path}: bad row: {e}") from e
    if ran_only:
        jobs = [j for j in jobs if j.ran]
    jobs.sort(key=lambda j: j.submit_s)
    return (jobs[:limit] if limit is not None else jobs), head


def as_dict(j: HistoryJob) -> dict[str, Any]:
    """The job as plain data (JSON output, tests)."""
    return asdict(j)


assert set(COLUMNS) - set(_DERIVED) == {fd.name for fd in fields(HistoryJob)} - _NOT_RECORDED, "columns and fields"
