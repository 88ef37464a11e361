"""``kairos sim export``: the platform's recorded history (PostgreSQL) as a trace file.

What it reads: ``jobs`` (one row per accepted job: queue, tenant, user, the spec, its
state, ``submitted_at``), the job-level rows of ``job_events`` (every transition of
the whole job with its attempt and ``occurred_at``; task-level rows are left aside) and
``nodes_view`` (the cluster's shape). Jobs submitted since ``since`` are exported.

Observed duration = the job's **summed running time over its attempts**: each attempt
from its job-level ``running`` (all replicas of the gang running) to the first end of
that attempt (``preempted``, ``succeeded``, ``failed``, ``cancelled``, or a later
attempt's first report). Not first start to end: the time a preempted job spent waiting
again was the policy's doing, which a replay must recreate, not take as given. The sum
still includes work a preemption threw away (an upper bound of the work; the replay's
checkpoint rule charges its own preemptions again), so ``attempts`` is written too.

Jobs not ended at export time are written with ``censored=1``: one running has its
running time so far (a lower bound), one that never started 0. ``kairos sim replay``
replays the running ones (they held GPUs) and leaves out those that never started.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sim.history_trace import HistoryJob, TaskShape, write_history

ENDS = frozenset({"preempted", "succeeded", "failed", "cancelled"})
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
DEFAULT_DATABASE_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/kairos"  # shared.config's default

_JOBS = """SELECT id, queue, tenant, "user", spec, state, submitted_at FROM jobs
           WHERE submitted_at >= :since ORDER BY submitted_at, id"""
# job-level transitions only (task IS NULL): the gang's start and end, not each replica's
_EVENTS = """SELECT e.job_id, e.state, e.attempt, e.occurred_at FROM job_events e
             JOIN jobs j ON j.id = e.job_id
             WHERE j.submitted_at >= :since AND e.task IS NULL
             ORDER BY e.job_id, e.occurred_at, e.seq"""
_NODES = "SELECT node_id, inventory, state FROM nodes_view ORDER BY node_id"


@dataclass(frozen=True, slots=True)
class Observed:
    """A job's running time as the history shows it."""

    run_time: timedelta
    attempts: int
    first_start: datetime | None
    end: datetime | None
    censored: bool


def observe(events: Iterable[tuple[str, int, datetime]], now: datetime) -> Observed:
    """Summed running time over attempts from the job's job-level transitions (state,
    attempt, time) in order; a run still open is counted up to ``now`` (censored)."""
    total, attempts = timedelta(0), 0
    opened: datetime | None = None
    open_attempt = 0
    first: datetime | None = None
    end: datetime | None = None
    for state, attempt, at in events:
        if opened is not None and (state in ENDS or attempt > open_attempt):
            total += max(at - opened, timedelta(0))
            opened = None
        if state == "running" and opened is None and end is None:
            opened, open_attempt = at, attempt
            attempts += 1
            first = first or at
        if state in TERMINAL and end is None:
            end = at
    censored = end is None
    if opened is not None:
        total += max(now - opened, timedelta(0))
    return Observed(total, attempts, first, end, censored)


def _seconds(d: timedelta) -> float:
    return d.total_seconds()  # whole microseconds / 10**6: exact to the stored precision


def tasks_of(spec: dict[str, Any]) -> tuple[TaskShape, ...]:
    """The spec's replica groups (wire names, as stored)."""
    out = []
    for t in spec.get("tasks") or []:
        r = t.get("resources") or {}
        out.append(TaskShape(t["name"], int(t.get("replicas", 1)), int(r.get("gpu", 0)),
                             int(r.get("gpuMemory", 0)), int(r.get("gpuCompute", 0)),
                             int(r.get("cpu", 1000)), int(r.get("memory", 1024))))
    return tuple(out)


def history_jobs(rows: Sequence[dict[str, Any]], events: dict[str, list[tuple[str, int, datetime]]],
                 now: datetime) -> tuple[list[HistoryJob], datetime | None]:
    """(jobs, origin): the ``jobs`` rows with their transitions as trace records, times in
    seconds after the first submit (the origin)."""
    if not rows:
        return [], None
    origin = min(r["submitted_at"] for r in rows)

    def rel(t: datetime | None) -> float | None:
        return None if t is None else _seconds(t - origin)

    out = []
    for r in rows:
        spec = r["spec"] if isinstance(r["spec"], dict) else json.loads(r["spec"])
        obs = observe(events.get(r["id"], []), now)
        tasks = tasks_of(spec)
        out.append(HistoryJob(
            job_id=r["id"], submit_s=_seconds(r["submitted_at"] - origin), duration_s=_seconds(obs.run_time),
            num_gpus=sum(t.gpu * t.replicas for t in tasks), tenant=r["tenant"], queue=r["queue"],
            user=r["user"], tasks=tasks, min_available=spec.get("minAvailable"),
            priority=int(spec.get("priority", 0)), priority_class=str(spec.get("priorityClass", "normal")),
            preemptible=bool(spec.get("preemptible", True)),
            runtime_estimate_s=None if spec.get("runtimeEstimate") is None else float(spec["runtimeEstimate"]),
            state=r["state"], censored=r["state"] not in TERMINAL, attempts=obs.attempts,
            submitted_at=r["submitted_at"].isoformat(), first_start_s=rel(obs.first_start), end_s=rel(obs.end)))
    return out, origin


def cluster_shape(nodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The nodes the history ran on (lost ones included), grouped by shape: GPUs, their
    model and memory, CPU and memory; ``gpus_per_node`` is the most common GPU count."""
    groups: Counter[tuple[int, str, int, int, int]] = Counter()
    for n in nodes:
        inv = n["inventory"] if isinstance(n["inventory"], dict) else json.loads(n["inventory"])
        gpus = inv.get("gpus") or []
        model, mem = (gpus[0].get("model", ""), int(gpus[0].get("memory_mib", 0))) if gpus else ("", 0)
        groups[(len(gpus), model, mem, int(inv.get("cpu_milli", 0)), int(inv.get("memory_mib", 0)))] += 1
    by_gpus: Counter[int] = Counter()
    for (g, *_), k in groups.items():
        by_gpus[g] += k
    return {"nodes": sum(groups.values()), "gpus_per_node": by_gpus.most_common(1)[0][0] if by_gpus else 0,
            "groups": [{"count": k, "gpus": g, "gpu_model": m, "gpu_memory_mib": mem, "cpu_milli": c,
                        "memory_mib": ram} for (g, m, mem, c, ram), k in sorted(groups.items())]}


async def read_history(database_url: str, since: datetime, now: datetime
                       ) -> tuple[list[HistoryJob], dict[str, Any]]:
    """(jobs, header fields) from the database at ``database_url``."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(database_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            rows = [dict(r) for r in (await conn.execute(text(_JOBS), {"since": since})).mappings()]
            events: dict[str, list[tuple[str, int, datetime]]] = {}
            for e in (await conn.execute(text(_EVENTS), {"since": since})).mappings():
                events.setdefault(e["job_id"], []).append((e["state"], e["attempt"], e["occurred_at"]))
            nodes = [dict(r) for r in (await conn.execute(text(_NODES))).mappings()]
    finally:
        await engine.dispose()
    jobs, origin = history_jobs(rows, events, now)
    meta = {"origin": origin.isoformat() if origin else None, "since": since.isoformat(),
            "exported_at": now.isoformat(), "cluster": cluster_shape(nodes),
            "duration": "summed running time over attempts (job-level running -> end of that attempt)",
            "censored": "not ended at export: running time so far (0 if it never started)"}
    return jobs, meta


def export(database_url: str, since: timedelta, out: Path, now: datetime | None = None
           ) -> tuple[list[HistoryJob], dict[str, Any]]:
    """Write the history of the last ``since`` to ``out``; returns what was written."""
    now = now or datetime.now(UTC)
    jobs, meta = asyncio.run(read_history(database_url, now - since, now))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_history(out, jobs, meta)
    return jobs, meta


def read_history_now(database_url: str, since: timedelta) -> tuple[list[HistoryJob], dict[str, Any]]:
    """What ``export`` would write, without a file (``sim replay`` from the database)."""
    now = datetime.now(UTC)
    return asyncio.run(read_history(database_url, now - since, now))
