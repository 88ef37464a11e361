"""Job arrays in admission's tables: the array row and its elements, stored with their
``jobs.submitted`` events in one transaction (all or none), read back as a summary, and
cancelled as a whole."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission.event_ids import submitted_event_id
from shared.bus import check_size
from shared.events import CommandAction, Envelope, JobCommand, JobState, JobSubmitted, utcnow
from shared.job_array import ArrayIndices, element_env, element_id, new_array_id
from shared.jobspec import JobSpec
from shared.outbox import DEFAULT_MAX_EVENT_BYTES, add_many
from shared.topics import topic_for

SOURCE = "admission"
TERMINAL = [s.value for s in JobState if s.terminal]


def element_spec(spec: JobSpec, arr: ArrayIndices, array_id: str, index: int) -> JobSpec:
    """The array's spec for one index: no ``array`` of its own, the index in every task's
    environment (the platform's names win over the user's)."""
    env = element_env(array_id, index, arr)
    return spec.model_copy(update={"array": None, "tasks": [
        t.model_copy(update={"env": {**t.env, **env}}) for t in spec.tasks]})


async def insert_array(
    engine: AsyncEngine, spec: JobSpec, tenant: str, user: str, idempotency_key: str | None,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
) -> tuple[dict[str, Any], bool]:
    """Store the array, every element and its event in one transaction. Returns (array
    row, created); a retry with the same Idempotency-Key gets the first array back. An
    element whose event would be too large raises ``EventTooLarge`` before anything is
    written (a 413)."""
    arr = spec.array_indices
    assert arr is not None
    array_id, now = new_array_id(), utcnow()
    elements = []
    for index in arr.indices:
        job_id = element_id(array_id, index)
        espec = element_spec(spec, arr, array_id, index)
        event = JobSubmitted(
            job_id=job_id, queue=spec.queue, tenant=tenant, user=user, spec=espec,
            submitted_at=now, array_id=array_id, array_index=index,
            array_max_running=arr.max_running)
        env = Envelope.wrap(event, SOURCE, submitted_event_id(job_id))
        check_size(env, max_event_bytes)
        elements.append((job_id, index, espec, env, topic_for(event).name))
    async with engine.begin() as conn:
        row = (await conn.execute(text(
            """INSERT INTO job_arrays (id, name, queue, tenant, "user", spec, indices, size,
                   max_running, idempotency_key, submitted_at)
               VALUES (:id, :name, :queue, :tenant, :user, :spec, :indices, :size, :cap,
                   :key, :now)
               ON CONFLICT (tenant, idempotency_key) DO NOTHING
               RETURNING *"""),
            {"id": array_id, "name": spec.name, "queue": spec.queue, "tenant": tenant,
             "user": user, "spec": json.dumps(spec.model_dump(mode="json", by_alias=True)),
             "indices": spec.array, "size": arr.size, "cap": arr.max_running,
             "key": idempotency_key, "now": now})).mappings().first()
        if row is None:  # the same key came before (maybe concurrently): that array
            existing = (await conn.execute(text(
                "SELECT * FROM job_arrays WHERE tenant = :t AND idempotency_key = :k"),
                {"t": tenant, "k": idempotency_key})).mappings().first()
            assert existing is not None
            return dict(existing), False
        await conn.execute(text(
            """INSERT INTO jobs (id, name, queue, tenant, "user", spec, state, reason,
                   submitted_at, updated_at, array_id, array_index)
               SELECT j, :name, :queue, :tenant, :user, s, 'pending', 'accepted', :now, :now,
                   :array_id, i
               FROM unnest(CAST(:ids AS text[]), CAST(:specs AS jsonb[]),
                           CAST(:indices AS int[])) AS e(j, s, i)"""),
            {"name": spec.name, "queue": spec.queue, "tenant": tenant, "user": user,
             "now": now, "array_id": array_id, "ids": [e[0] for e in elements],
             "specs": [json.dumps(e[2].model_dump(mode="json", by_alias=True))
                       for e in elements],
             "indices": [e[1] for e in elements]})
        await conn.execute(text(
            """INSERT INTO job_events (event_id, job_id, state, reason, attempt, occurred_at)
               SELECT 'accepted-' || j, j, 'pending', 'accepted', 1, :now
               FROM unnest(CAST(:ids AS text[])) AS e(j)"""),
            {"ids": [e[0] for e in elements], "now": now})
        await add_many(conn, [(e[3], e[4]) for e in elements], SOURCE,
                       max_bytes=max_event_bytes)
        return dict(row), True


async def get_array(engine: AsyncEngine, array_id: str) -> dict[str, Any] | None:
    """The array row with its elements counted by state."""
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT * FROM job_arrays WHERE id = :a"),
                                  {"a": array_id})).mappings().first()
        if row is None:
            return None
        counts = {state: n for state, n in (await conn.execute(text(
            "SELECT state, count(*) FROM jobs WHERE array_id = :a GROUP BY state"),
            {"a": array_id})).all()}
    return {**dict(row), "states": counts}


async def cancel_array(engine: AsyncEngine, array_id: str, requested_by: str) -> int:
    """A cancel for every element not ended yet, in one transaction. Returns how many."""
    async with engine.begin() as conn:
        ids = list((await conn.execute(text(
            "SELECT id FROM jobs WHERE array_id = :a AND state <> ALL(:ended)"
            " ORDER BY array_index"), {"a": array_id, "ended": TERMINAL})).scalars())
        commands = [JobCommand(job_id=j, action=CommandAction.CANCEL,
                               reason="cancelled by user (the whole array)",
                               requested_by=requested_by) for j in ids]
        await add_many(conn, [(Envelope.wrap(c, SOURCE), topic_for(c).name)
                              for c in commands], SOURCE)
    return len(ids)
