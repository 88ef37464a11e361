"""GPU-hours per tenant and queue, from the running intervals of task replicas.

The read model records one ``task_runs`` row per task replica run (job, task, attempt):
it opens on the task's ``running`` report and closes on the task's own end report
(succeeded, failed, cancelled, preempted). A job-level report closes what the task
itself may never report: the job ending (a task on a lost node says nothing) or a new
attempt starting. A task report that comes after such a close moves the end to the
task's real stop, so the GPUs held through a grace period are counted.

A replica holds ``gpus``: its whole GPUs, or for a share its fraction of one GPU (the
compute share, or the memory share of the node's GPU when it asks for memory only), of
the node's GPU model (``gpu_model``, as ``H100-80GB``): usage is reported per model and
billed at each queue's weights (``shared/billing.py``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shared.events import JobState, JobStatus
from shared.gpu_models import model_id

ENDS = ("succeeded", "failed", "cancelled", "preempted")  # the states that end a run


def task_name(task_id: str) -> str:
    """``worker-3`` or ``worker-3.2`` (an elastic incarnation) -> ``worker``."""
    return task_id.split(".")[0].rsplit("-", 1)[0]


def replica_gpus(task: dict[str, Any], gpu_memory_mib: int | None) -> tuple[float, bool]:
    """(GPUs one replica holds, whether it is a share) from the task's spec (wire names)."""
    res = task.get("resources") or {}
    whole = int(res.get("gpu") or 0)
    if whole:
        return float(whole), False
    compute, memory = int(res.get("gpuCompute") or 0), int(res.get("gpuMemory") or 0)
    if compute:
        return compute / 100.0, True
    if memory and gpu_memory_mib:
        return min(1.0, memory / gpu_memory_mib), True
    return 0.0, bool(memory)


async def record(conn: AsyncConnection, st: JobStatus, occurred_at: datetime) -> None:
    """Apply one (new, not replayed) jobs.status report to ``task_runs``."""
    if st.task is not None:
        if st.state is JobState.RUNNING:
            await _open(conn, st, occurred_at)
        elif st.state.value in ENDS:
            await conn.execute(text(
                """UPDATE task_runs SET ended_at = GREATEST(started_at, :o)
                   WHERE job_id = :j AND task_id = :t AND attempt = :a
                     AND (ended_at IS NULL OR ended_at < :o)"""),
                {"j": st.job_id, "t": st.task, "a": st.attempt, "o": occurred_at})
        return
    # the job moved on: runs of older attempts are over, and all of them when it ends
    await conn.execute(text(
        """UPDATE task_runs SET ended_at = GREATEST(started_at, :o)
           WHERE job_id = :j AND ended_at IS NULL
             AND (attempt < :a OR (:over AND attempt <= :a))"""),
        {"j": st.job_id, "a": st.attempt, "o": occurred_at,
         "over": st.state.value in ENDS})


async def _open(conn: AsyncConnection, st: JobStatus, occurred_at: datetime) -> None:
    assert st.task is not None
    job = (await conn.execute(
        text("SELECT tenant, queue, spec, state, attempt FROM jobs WHERE id = :j"),
        {"j": st.job_id})).mappings().first()
    if job is None:
        return  # a job this gateway never accepted
    spec = job["spec"] if isinstance(job["spec"], dict) else json.loads(job["spec"])
    name = task_name(st.task)
    task: dict[str, Any] = next((t for t in spec.get("tasks", []) if t.get("name") == name), {})
    gpu = None
    if st.node_id:
        gpu = (await conn.execute(text(
            """SELECT (inventory->'gpus'->0->>'memory_mib')::int AS memory_mib,
                      inventory->'gpus'->0->>'model' AS model
               FROM nodes_view WHERE node_id = :n"""), {"n": st.node_id})).first()
    compute = (task.get("resources") or {}).get("gpuCompute")
    gpus, shared = replica_gpus(task, None if gpu is None or compute else gpu.memory_mib)
    model = model_id(gpu.model, gpu.memory_mib or 0) if gpu is not None and gpu.model \
        and gpus > 0 else ""
    # a late `running` of a job already past this attempt opens a run of no length; the
    # task's own end report then stretches it to when it really stopped
    over = JobState(job["state"]).terminal or job["attempt"] > st.attempt
    await conn.execute(text(
        """INSERT INTO task_runs (job_id, task_id, attempt, tenant, queue, node_id, gpus,
                                  shared, started_at, ended_at, gpu_model)
           VALUES (:j, :t, :a, :tenant, :q, :n, :g, :s, :o, :end, :m)
           ON CONFLICT (job_id, task_id, attempt) DO NOTHING"""),
        {"j": st.job_id, "t": st.task, "a": st.attempt, "tenant": job["tenant"],
         "q": job["queue"], "n": st.node_id, "g": gpus, "s": shared, "o": occurred_at,
         "end": occurred_at if over else None, "m": model})


async def gpu_hours(engine: AsyncEngine, start: datetime, end: datetime,
                    tenant: str | None) -> tuple[datetime, list[dict[str, Any]]]:
    """GPU-hours per (tenant, queue, GPU model) inside [start, end), runs still open
    counted up to now. Returns (the database's now, rows of tenant, queue, gpu_model,
    gpu_hours, shared_gpu_hours, runs)."""
    async with engine.connect() as conn:
        now = await conn.scalar(text("SELECT now()"))
        rows = (await conn.execute(text(
            """SELECT tenant, queue, gpu_model,
                      sum(gpus * secs) / 3600.0 AS gpu_hours,
                      sum(CASE WHEN shared THEN gpus * secs ELSE 0 END) / 3600.0
                          AS shared_gpu_hours,
                      count(*) AS runs
               FROM (SELECT tenant, queue, gpu_model, gpus, shared, GREATEST(0, EXTRACT(EPOCH FROM
                            LEAST(COALESCE(ended_at, :now), :end)
                            - GREATEST(started_at, :start))) AS secs
                     FROM task_runs
                     WHERE started_at < :end AND (ended_at IS NULL OR ended_at > :start)
                       AND started_at < :now
                       AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)) r
               GROUP BY tenant, queue, gpu_model ORDER BY tenant, queue, gpu_model"""),
            {"start": start, "end": end, "now": now, "tenant": tenant})).mappings()
        return now, [dict(r) for r in rows]
