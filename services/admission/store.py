"""Admission's tables: jobs with their history, and the node/allocation read model."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.admission import ops_views, usage
from services.admission.event_ids import submitted_event_id
from services.admission.forecasts_view import apply_forecast
from services.admission.node_health import GpuHealthTracker
from services.admission.queues_view import apply_job_waiting, apply_queue_event
from shared.db import autocommit
from shared.events import (
    Binding,
    BindingAction,
    CommandAction,
    Envelope,
    Event,
    JobCommand,
    JobForecast,
    JobState,
    JobStatus,
    JobSubmitted,
    JobWaiting,
    NodeHeartbeat,
    NodeLost,
    NodeRegistered,
    NodeSchedulingChanged,
    NodeTelemetry,
    QueueChanged,
    QueueStatus,
    utcnow,
)
from shared.jobspec import JobSpec
from shared.outbox import DEFAULT_MAX_EVENT_BYTES, add_to_outbox, channel, outbox_row

# Forward order of a job's life; a report never moves a job backwards within one attempt.
_RANK = {
    JobState.PENDING: 0,
    JobState.ADMITTED: 1,
    JobState.PREEMPTED: 1,
    JobState.BOUND: 2,
    JobState.RUNNING: 3,
    JobState.SUCCEEDED: 4,
    JobState.FAILED: 4,
    JobState.CANCELLED: 4,
}


def accepts(current: JobState, current_attempt: int, new: JobState, attempt: int) -> bool:
    """The job state machine: replays, stale attempts and moves out of a terminal state
    are ignored; a cancel wins over anything not yet terminal. ``_JOB_STATUS`` applies
    the same rule in SQL (tests/services/test_admission_read_model_rule.py checks that
    the two agree on every move)."""
    if current.terminal:
        return False
    if new is JobState.CANCELLED:
        return True
    if attempt != current_attempt:
        return attempt > current_attempt
    if new is JobState.PENDING and current is JobState.PENDING:
        return True  # queueing says why it waits ("waiting: quota"): the reason moves on
    return _RANK[new] > _RANK[current] or (
        new is JobState.PREEMPTED and current in (JobState.BOUND, JobState.RUNNING)
    )


def new_job_id() -> str:
    return "j-" + uuid.uuid4().hex[:16]


# The job, its first history entry, its jobs.submitted event and the relay's wake-up in
# one statement: one round trip, atomic on its own (no BEGIN/COMMIT around it). A retry
# with an Idempotency-Key already used inserts nothing (the conflict empties ``j``).
_SUBMIT = text("""
    WITH j AS (
        INSERT INTO jobs (id, name, queue, tenant, "user", spec, state, reason,
                          idempotency_key, submitted_at, updated_at)
        VALUES (:id, :name, :queue, :tenant, :user, :spec, 'pending', 'accepted',
                :key, :now, :now)
        ON CONFLICT (tenant, idempotency_key) DO NOTHING
        RETURNING *),
    e AS (
        INSERT INTO job_events (event_id, job_id, state, reason, attempt, occurred_at)
        SELECT :event, id, 'pending', 'accepted', 1, :now FROM j),
    o AS (
        INSERT INTO outbox (event_id, topic, key, payload, source)
        SELECT :i, :t, :k, :p, :s FROM j
        ON CONFLICT (event_id) DO NOTHING)
    SELECT j.*, pg_notify(:channel, '') AS _notified FROM j""")


async def insert_job(
    engine: AsyncEngine, spec: JobSpec, tenant: str, user: str, idempotency_key: str | None,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
) -> tuple[dict[str, Any], bool]:
    """Store the job and its jobs.submitted event at once (one statement).

    Returns (job row, created). A retried submit with the same idempotency key returns
    the job created the first time.
    """
    job_id = new_job_id()
    now = utcnow()
    event = JobSubmitted(job_id=job_id, queue=spec.queue, tenant=tenant, user=user,
                         spec=spec, submitted_at=now)
    # over the event limit: EventTooLarge, a 413, before anything is written
    row_params = outbox_row(event, "admission", submitted_event_id(job_id), max_event_bytes)
    async with autocommit(engine).connect() as conn:
        row = (await conn.execute(_SUBMIT, {
            "id": job_id, "name": spec.name, "queue": spec.queue, "tenant": tenant,
            "user": user, "spec": json.dumps(spec.model_dump(mode="json", by_alias=True)),
            "key": idempotency_key, "now": now, "event": f"accepted-{job_id}",
            "channel": channel("admission"), **row_params})).mappings().first()
        if row is None:  # the Idempotency-Key came before: that job
            assert idempotency_key is not None
            existing = await _job_by_key(conn, tenant, idempotency_key)
            assert existing is not None
            return existing, False
    out = dict(row)
    del out["_notified"]
    return out, True


async def _job_by_key(conn: AsyncConnection, tenant: str, key: str) -> dict[str, Any] | None:
    row = (await conn.execute(
        text("SELECT * FROM jobs WHERE tenant = :t AND idempotency_key = :k"),
        {"t": tenant, "k": key})).mappings().first()
    return dict(row) if row else None


async def get_job(engine: AsyncEngine, job_id: str) -> dict[str, Any] | None:
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT * FROM jobs WHERE id = :j"), {"j": job_id})
               ).mappings().first()
        if row is None:
            return None
        job = dict(row)
        job["history"] = [dict(r) for r in (await conn.execute(
            text("""SELECT state, reason, reason_code, attempt, exit_code, task, node_id,
                           message, occurred_at
                    FROM job_events WHERE job_id = :j ORDER BY seq"""), {"j": job_id})
        ).mappings()]
        job["placement"] = [dict(r) for r in (await conn.execute(
            text("""SELECT task_id, node_id, attempt, gpus, cpu_milli, memory_mib, bound_at
                    FROM allocations_view WHERE job_id = :j ORDER BY task_id"""), {"j": job_id})
        ).mappings()]
        return job


async def list_jobs(engine: AsyncEngine, tenant: str | None, state: str | None,
                    queue: str | None, limit: int, offset: int, user: str | None = None,
                    after: tuple[datetime, str] | None = None,
                    array: str | None = None) -> list[dict[str, Any]]:
    """Jobs oldest first, by (submitted_at, id): ``after`` (a keyset cursor, the last
    row of the previous page) makes pages stable while jobs come and go."""
    clauses: list[str] = []
    params: dict[str, Any] = {"limit": limit, "offset": offset}
    for col, val in (("tenant", tenant), ("state", state), ("queue", queue), ("user", user),
                     ("array_id", array)):
        if val is not None:
            clauses.append(f'"{col}" = :{col}')
            params[col] = val
    if after is not None:
        clauses.append("(submitted_at, id) > (:after_at, :after_id)")
        params["after_at"], params["after_id"] = after
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(f"SELECT * FROM jobs {where} ORDER BY submitted_at, id LIMIT :limit OFFSET :offset"),
            params)
        return [dict(r) for r in rows.mappings()]


async def request_cancel(engine: AsyncEngine, job_id: str, requested_by: str) -> None:
    async with engine.begin() as conn:
        await add_to_outbox(
            conn,
            JobCommand(job_id=job_id, action=CommandAction.CANCEL, reason="cancelled by user",
                       requested_by=requested_by),
            "admission",
        )


# --- the read model, fed by jobs.status, bindings and nodes.lifecycle -------------------


async def apply_events(engine: AsyncEngine, items: list[tuple[Envelope, Event]],
                       gpu_health: GpuHealthTracker | None = None) -> None:
    """Apply a batch of events to the read model in one transaction, committed durably
    before the consumer commits its offsets: a job's last transition lost in a crash of
    PostgreSQL would show the job running forever (its event is never read again). Only
    a batch of heartbeats and telemetry, which the next interval writes again, does not
    wait for its commit to reach disk. Telemetry counts only with ``gpu_health`` (the
    consumer's memory of what is stored); samples that change nothing open no
    transaction."""
    items = [(env, ev) for env, ev in items if not isinstance(ev, NodeTelemetry)
             or (gpu_health is not None and not gpu_health.skip(ev))]
    if not items:
        return
    try:
        await _apply_events(engine, items, gpu_health)
    except BaseException:
        if gpu_health is not None:
            gpu_health.rollback()
        raise
    if gpu_health is not None:
        gpu_health.commit()


# The heartbeats of a batch in one statement: each node's latest (a node's heartbeats
# only move last_heartbeat forward and bring a lost node back, so the latest says all).
# At 2,000 nodes they are 400 a second: one UPDATE each kept admission's consumer, and
# the job reports behind them, minutes late.
_HEARTBEATS = text("""
    UPDATE nodes_view v SET last_heartbeat = GREATEST(v.last_heartbeat, h.at),
        state = CASE WHEN v.state = 'lost' THEN 'ready' ELSE v.state END
    FROM unnest(CAST(:nodes AS text[]), CAST(:ats AS timestamptz[])) AS h(node, at)
    WHERE v.node_id = h.node""")


async def _apply_heartbeats(conn: AsyncConnection,
                            beats: dict[str, tuple[Envelope, NodeHeartbeat]]) -> None:
    if beats:
        await conn.execute(_HEARTBEATS, {"nodes": list(beats), "ats": [
            env.occurred_at for env, _ in beats.values()]})
        beats.clear()


async def _apply_events(engine: AsyncEngine, items: list[tuple[Envelope, Event]],
                        gpu_health: GpuHealthTracker | None) -> None:
    async with engine.begin() as conn:
        if all(isinstance(ev, NodeHeartbeat | NodeTelemetry) for _, ev in items):
            await conn.execute(text("SET LOCAL synchronous_commit = off"))
        beats: dict[str, tuple[Envelope, NodeHeartbeat]] = {}  # plain ones, held back
        for env, event in items:
            if isinstance(event, NodeHeartbeat) and event.datasets is None:
                held = beats.get(event.node_id)
                if held is None or held[0].occurred_at <= env.occurred_at:
                    beats[event.node_id] = (env, event)
                continue
            if isinstance(event, NodeRegistered | NodeHeartbeat | NodeLost):
                await _apply_heartbeats(conn, beats)  # a node's events stay in order
            if isinstance(event, NodeTelemetry):
                assert gpu_health is not None  # filtered above
                await gpu_health.apply(conn, event)
            elif isinstance(event, JobStatus):
                await apply_status(conn, env.id, event, env.occurred_at)
                if event.connection is not None:
                    await ops_views.apply_connection(conn, event)
            elif isinstance(event, NodeSchedulingChanged):
                await ops_views.apply_node_scheduling(conn, event)
            elif isinstance(event, Binding):
                await apply_binding(conn, event, env.occurred_at)
            elif isinstance(event, NodeRegistered | NodeHeartbeat | NodeLost):
                await apply_node_event(conn, event, env.occurred_at)
            elif isinstance(event, QueueChanged | QueueStatus):
                await apply_queue_event(conn, event)
            elif isinstance(event, JobWaiting):
                await apply_job_waiting(conn, env.id, event, env.occurred_at)
            elif isinstance(event, JobForecast):
                await apply_forecast(conn, event)
        await _apply_heartbeats(conn, beats)


def _rank_sql(column: str) -> str:
    return "CASE " + " ".join(f"WHEN {column} = '{state.value}' THEN {rank}"
                              for state, rank in _RANK.items()) + " END"


# A job-level report in one statement (one round trip): its history row; if that is new
# (not a replay), the job's move through ``accepts`` (the same rules, in SQL), the task
# runs it closes (usage.record's job-level rule) and, if the job moved, the scheduler's
# waiting reason and its allocations when it left them. Every part reads the snapshot
# from before the statement, and each table is written once, so the parts are independent.
_JOB_STATUS = text(f"""
    WITH e AS (
        INSERT INTO job_events (event_id, job_id, state, reason, reason_code, attempt,
                                exit_code, task, node_id, message, occurred_at)
        VALUES (:e, :j, :s, :r, :c, :a, :x, NULL, :n, :m, :o)
        ON CONFLICT (event_id) DO NOTHING RETURNING seq),
    runs AS (
        UPDATE task_runs SET ended_at = GREATEST(started_at, :o)
        WHERE EXISTS (SELECT 1 FROM e) AND job_id = :j AND ended_at IS NULL
          AND (attempt < :a OR (:ends AND attempt <= :a))),
    moved AS (
        UPDATE jobs SET state = :s, reason = :r, attempt = GREATEST(attempt, :a),
                        exit_code = COALESCE(:x, exit_code), updated_at = now()
        WHERE id = :j AND EXISTS (SELECT 1 FROM e)
          AND state NOT IN ('succeeded', 'failed', 'cancelled')
          AND (:s = 'cancelled'
               OR (attempt <> :a AND :a > attempt)
               OR (attempt = :a AND ({_rank_sql(':s')} > {_rank_sql('state')}
                   OR (:s = 'pending' AND state = 'pending')
                   OR (:s = 'preempted' AND state IN ('bound', 'running')))))
        RETURNING id),
    unwaited AS (
        DELETE FROM queue_waiting_view
        WHERE :leaves_wait AND position = 0 AND job_id IN (SELECT id FROM moved)),
    freed AS (
        DELETE FROM allocations_view
        WHERE :frees AND job_id IN (SELECT id FROM moved)),
    unforecast AS (
        DELETE FROM job_forecasts WHERE :leaves_wait AND job_id IN (SELECT id FROM moved))
    SELECT count(*) FROM moved""")


async def apply_status(conn: AsyncConnection, event_id: str, st: JobStatus,
                       occurred_at: datetime) -> None:
    if st.task is None:
        ends = st.state.value in usage.ENDS
        await conn.execute(_JOB_STATUS, {
            "e": event_id, "j": st.job_id, "s": st.state.value, "r": st.reason,
            "c": st.reason_code, "a": st.attempt, "x": st.exit_code, "n": st.node_id, "m": st.message,
            "o": occurred_at, "ends": ends,
            "leaves_wait": st.state in (JobState.BOUND, JobState.RUNNING, JobState.PREEMPTED)
            or st.state.terminal,
            "frees": st.state.terminal or st.state is JobState.PREEMPTED})
        return
    inserted = await conn.scalar(
        text("""INSERT INTO job_events (event_id, job_id, state, reason, attempt, exit_code,
                    task, node_id, message, occurred_at)
                VALUES (:e, :j, :s, :r, :a, :x, :t, :n, :m, :o)
                ON CONFLICT (event_id) DO NOTHING RETURNING seq"""),
        {"e": event_id, "j": st.job_id, "s": st.state.value, "r": st.reason, "a": st.attempt,
         "x": st.exit_code, "t": st.task, "n": st.node_id, "m": st.message, "o": occurred_at})
    if inserted is None:
        return  # a replay
    await usage.record(conn, st, occurred_at)
    if st.state.terminal or st.state is JobState.PREEMPTED:
        await conn.execute(
            text("DELETE FROM allocations_view WHERE job_id = :j AND task_id = :t"
                 " AND attempt <= :a"), {"j": st.job_id, "t": st.task, "a": st.attempt})


async def apply_binding(conn: AsyncConnection, b: Binding, occurred_at: datetime) -> None:
    if b.action not in (BindingAction.ALLOCATE, BindingAction.RESIZE) or not b.tasks:
        return  # a resize lists the replicas it adds; removed ones leave on their report
    # only for jobs this gateway accepted and that have not ended (a stale scheduler's
    # binding for a job nobody knows never shows up as a phantom allocation)
    await conn.execute(
        text("""INSERT INTO allocations_view (job_id, task_id, node_id, attempt, gpus,
                    cpu_milli, memory_mib, bound_at)
                SELECT :j, :t, :n, :a, CAST(:g AS jsonb), :c, :m, :o
                WHERE EXISTS (SELECT 1 FROM jobs WHERE id = :j
                    AND state NOT IN ('succeeded', 'failed', 'cancelled'))
                ON CONFLICT (job_id, task_id) DO UPDATE SET node_id = EXCLUDED.node_id,
                    attempt = EXCLUDED.attempt, gpus = EXCLUDED.gpus
                WHERE allocations_view.attempt < EXCLUDED.attempt"""),
        [{"j": b.job_id, "t": t.task_id, "n": b.node_id, "a": b.attempt,
          "g": json.dumps([g.model_dump() for g in t.gpus]), "c": t.cpu_milli,
          "m": t.memory_mib, "o": occurred_at} for t in b.tasks])


async def apply_node_event(conn: AsyncConnection,
                           ev: NodeRegistered | NodeHeartbeat | NodeLost,
                           occurred_at: datetime) -> None:
    if isinstance(ev, NodeRegistered):
        await conn.execute(
            text("""INSERT INTO nodes_view (node_id, inventory, state, last_heartbeat,
                        registered_at)
                    VALUES (:n, CAST(:i AS jsonb), 'ready', :o, :o)
                    ON CONFLICT (node_id) DO UPDATE SET inventory = EXCLUDED.inventory,
                        state = 'ready', last_heartbeat = EXCLUDED.last_heartbeat"""),
            {"n": ev.inventory.node_id, "i": ev.inventory.model_dump_json(), "o": occurred_at})
    elif isinstance(ev, NodeHeartbeat):
        # datasets: the local dataset cache now, when the agent reports it
        await conn.execute(
            text("""UPDATE nodes_view SET last_heartbeat = GREATEST(last_heartbeat, :o),
                        state = CASE WHEN state = 'lost' THEN 'ready' ELSE state END,
                        inventory = CASE WHEN CAST(:d AS jsonb) IS NULL THEN inventory
                            ELSE jsonb_set(inventory, '{datasets}', CAST(:d AS jsonb)) END
                    WHERE node_id = :n"""),
            {"n": ev.node_id, "o": occurred_at,
             "d": None if ev.datasets is None else json.dumps(sorted(ev.datasets))})
    else:
        await conn.execute(text("UPDATE nodes_view SET state = 'lost' WHERE node_id = :n"),
                           {"n": ev.node_id})


async def list_nodes(engine: AsyncEngine) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        nodes = [dict(r) for r in (await conn.execute(
            text("SELECT * FROM nodes_view ORDER BY node_id"))).mappings()]
        allocs = (await conn.execute(
            text("""SELECT a.node_id, a.job_id, a.task_id, a.gpus, j.tenant
                    FROM allocations_view a LEFT JOIN jobs j ON j.id = a.job_id"""))).mappings()
        by_node: dict[str, list[dict[str, Any]]] = {}
        for a in allocs:
            by_node.setdefault(a["node_id"], []).append(dict(a))
    for n in nodes:
        n["allocations"] = by_node.get(n["node_id"], [])
    return nodes
