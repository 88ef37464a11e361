"""The read model's job state machine, applied in SQL (one statement a job-level report,
``store._JOB_STATUS``), agrees with its rule in Python (``store.accepts``) on every move:
every current state and attempt against every reported state and attempt, on real
PostgreSQL. Also: a replayed report changes nothing, and the parts that follow a move
(the scheduler's waiting reason, the allocations, the task runs) follow it."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import text

from services.admission import store
from shared.events import JobState, JobStatus, JobWaiting
from tests.services.gateway_helpers import gateway

pytestmark = pytest.mark.db


async def test_every_move_is_judged_as_the_rule_in_python_judges_it(db_url: str) -> None:
    async with gateway(db_url) as gw:
        tok = await gw.token("vision")
        job = await gw.submit(tok)
        cases = list(itertools.product(JobState, (2,), JobState, (1, 2, 3)))
        wrong = []
        for current, current_attempt, new, attempt in cases:
            async with gw.engine.begin() as conn:
                await conn.execute(text("UPDATE jobs SET state = :s, attempt = :a "
                                        "WHERE id = :j"),
                                   {"s": current.value, "a": current_attempt, "j": job})
            await gw.apply(JobStatus(job_id=job, state=new, attempt=attempt, reason="rule"))
            async with gw.engine.connect() as conn:
                state, att = (await conn.execute(text(
                    "SELECT state, attempt FROM jobs WHERE id = :j"), {"j": job})).one()
            moves = store.accepts(current, current_attempt, new, attempt)
            expected = (new.value, max(current_attempt, attempt)) if moves \
                else (current.value, current_attempt)
            if (state, att) != expected:
                wrong.append((current.value, current_attempt, new.value, attempt, state, att))
        assert not wrong, wrong
        assert len(cases) == 8 * 8 * 3


async def test_a_replay_changes_nothing_and_a_move_clears_what_it_ends(db_url: str) -> None:
    async with gateway(db_url) as gw:
        tok = await gw.token("vision")
        job = await gw.submit(tok)
        await gw.status(job, JobState.ADMITTED)
        await gw.apply(JobWaiting(job_id=job, reason="no_fit", detail="no node has room"))
        await gw.status(job, JobState.BOUND, task="w-0")
        await gw.status(job, JobState.RUNNING, task="w-0")
        async with gw.engine.connect() as conn:
            waiting = await conn.scalar(text(
                "SELECT count(*) FROM queue_waiting_view WHERE job_id = :j AND position = 0"),
                {"j": job})
        assert waiting == 1
        await gw.status(job, JobState.RUNNING)  # the job moved: its waiting reason is past
        await gw.status(job, JobState.SUCCEEDED)
        await gw.apply_replay()  # the same report again: nothing more
        async with gw.engine.connect() as conn:
            row = (await conn.execute(text(
                "SELECT state, (SELECT count(*) FROM job_events WHERE job_id = :j"
                " AND state = 'succeeded' AND task IS NULL) AS ends,"
                " (SELECT count(*) FROM queue_waiting_view WHERE job_id = :j) AS waits,"
                " (SELECT count(*) FROM task_runs WHERE job_id = :j AND ended_at IS NULL)"
                " AS open_runs FROM jobs WHERE id = :j"), {"j": job})).one()
        assert (row.state, row.ends, row.waits, row.open_runs) == ("succeeded", 1, 0, 0)


async def test_a_batch_with_a_transition_commits_durably_liveness_alone_need_not(
        db_url: str) -> None:
    """A job's last transition must survive a crash of PostgreSQL right after the
    consumer committed its offsets (issue 40: once, a task's end was missing after a
    kill -9 of the postmaster). A batch of heartbeats alone may skip the wait for disk:
    the next interval writes it again. Read from the statements the batch really sends."""
    from sqlalchemy import event

    from shared.events import Envelope, NodeHeartbeat

    async with gateway(db_url) as gw:
        tok = await gw.token("vision")
        job = await gw.submit(tok)
        sent: list[str] = []
        event.listen(gw.engine.sync_engine, "before_cursor_execute",
                     lambda conn, cursor, stmt, *rest: sent.append(stmt))
        beat = NodeHeartbeat(node_id="n1")
        await store.apply_events(gw.engine, [(Envelope.wrap(beat, "agent"), beat)])
        assert any("synchronous_commit = off" in s for s in sent)
        sent.clear()
        end = JobStatus(job_id=job, state=JobState.FAILED, reason="x")
        await store.apply_events(gw.engine, [(Envelope.wrap(beat, "agent"), beat),
                                             (Envelope.wrap(end, "scheduler"), end)])
        assert sent and not any("synchronous_commit" in s for s in sent)
