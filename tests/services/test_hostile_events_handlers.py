"""Hostile events that decode, fed to queueing's and admission's own handlers over real
PostgreSQL: statuses, commands and bindings for jobs nobody knows, attempts and epochs
out of any range, duplicates, admin commands for queues that do not exist, telemetry of
unknown nodes. Each either changes nothing or fails on that message alone, never as a
"dependency away" (a consumer would wait on that forever: a stuck partition), and the
service goes on: the next real job is admitted and its status shown.

The bytes that do not decode are in tests/services/test_hostile_events.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.admission import store
from shared.db import make_engine
from shared.errors import is_transient
from shared.events import (
    Binding,
    BindingAction,
    CommandAction,
    Envelope,
    Event,
    GpuTelemetry,
    JobCommand,
    JobState,
    JobStatus,
    JobSubmitted,
    NodeHeartbeat,
    NodeLost,
    NodeTelemetry,
    QueueAction,
    QueueChanged,
    QueueCommand,
    QueueStatus,
    TaskBinding,
    utcnow,
)
from shared.jobspec import parse_job_spec
from tests.services.test_queueing_service import Recording, World

pytestmark = [pytest.mark.db, pytest.mark.broker]

HUGE = 2**63 - 1  # past PostgreSQL's integer and bigint alike


def _spec(name: str = "x", gpus: int = 1, queue: str = "default", replicas: int = 1) -> Any:
    return parse_job_spec({"name": name, "queue": queue, "tasks": [
        {"name": "w", "replicas": replicas, "resources": {"gpu": gpus}}]})


def hostile() -> list[Event]:
    now = utcnow()
    return [
        JobStatus(job_id="nobody", state=JobState.SUCCEEDED, reason="x"),
        JobStatus(job_id="nobody", state=JobState.RUNNING, reason="x", attempt=HUGE),
        JobStatus(job_id="nobody", state=JobState.FAILED, reason="x", attempt=-HUGE,
                  exit_code=HUGE, task="w-0", node_id="n" * 5000),
        JobStatus(job_id="", state=JobState.CANCELLED, reason="\u202e" * 100, epoch=HUGE,
                  replicas={"w": -HUGE}),
        JobCommand(job_id="nobody", action=CommandAction.CANCEL),
        JobCommand(job_id="nobody", action=CommandAction.RESIZE, replicas=-HUGE),
        JobSubmitted(job_id="dup", queue="default", tenant="t", user="u", spec=_spec(),
                     submitted_at=now),
        JobSubmitted(job_id="dup", queue="default", tenant="t", user="u", spec=_spec(),
                     submitted_at=now),  # a second submit of the same id
        JobSubmitted(job_id="../../etc", queue="../ghost; rm -rf /", tenant="t", user="u",
                     spec=_spec(queue="ghost"), submitted_at=now),
        JobSubmitted(job_id="big", queue="default", tenant="t", user="u",
                     spec=_spec(gpus=64, replicas=1024), submitted_at=now),  # no cluster fits it
        QueueCommand(request_id="r1", queue="ghost", action=QueueAction.UPDATE,
                     settings={"guaranteed": {"gpus": -HUGE}}),
        QueueCommand(request_id="r2", queue="ghost", action=QueueAction.CLOSE),
        QueueCommand(request_id="r2", queue="default", action=QueueAction.UPDATE,
                     settings={"guaranteed": "all of it", "tenant": ["x"]}),
        QueueCommand(request_id="r3", queue="x" * 10000, action=QueueAction.CREATE,
                     settings={"cohort": {"nested": [1, 2, {"deep": None}]}}),
        QueueChanged(queue="ghost", change="deleted", version=HUGE),
        QueueStatus(queue="ghost", admitted=-HUGE, used={"gpus": 1e308}),
        Binding(binding_id="b", action=BindingAction.ALLOCATE, node_id="ghost", epoch=HUGE,
                job_id="nobody", attempt=HUGE,
                tasks=[TaskBinding(task_id="w-0", task_name="w", role="w", replica=-1, rank=HUGE,
                                   cpu_milli=HUGE, memory_mib=HUGE)]),
        NodeHeartbeat(node_id="ghost", running_tasks=-HUGE, max_epoch_seen=HUGE),
        NodeLost(node_id="ghost", last_seen=now),
        NodeTelemetry(node_id="ghost", gpus=[GpuTelemetry(
            index=HUGE, utilization_pct=1e308, memory_used_mib=HUGE, temperature_c=-1e308)]),
    ]


def _wrap(ev: Event) -> tuple[Envelope, Event]:
    return Envelope.wrap(ev, "hostile"), ev


async def _survives(handle: Any, items: list[tuple[Envelope, Event]]) -> None:
    """What a consumer would do with it: taken, or failed on its own (dead-lettered after
    its retries). A failure that says "a dependency is away" would never end."""
    failure: Exception | None = None
    try:
        await handle(items)
    except Exception as exc:
        failure = exc
    assert failure is None or not is_transient(failure), (
        f"{items[0][1]!r} reads as an outage: {failure!r}")


@pytest.fixture
async def world(db_url: str, broker: str) -> AsyncIterator[World]:
    engine = make_engine(db_url, pool_size=3)
    producer = Recording(broker)
    await producer.start()
    w = World(engine, producer, None)  # type: ignore[arg-type]
    await w.restart()
    yield w
    await producer.stop()
    await engine.dispose()


async def test_queueing_takes_hostile_events_and_goes_on(world: World) -> None:
    for item in map(_wrap, hostile()):
        await _survives(world.q.handle_batch, [item])
        await world.q.cycle()
    await _survives(world.q.handle_batch, [_wrap(e) for e in hostile()])  # all at once
    await world.q.cycle()
    await world.submit("default", gpus=2, name="real")
    await world.q.cycle()
    assert "real" in world.ready()
    assert world.ready().count("dup") == 1  # a duplicate submit is admitted once
    assert "default" in world.q.tree.specs  # the hostile admin commands changed nothing


async def test_admission_read_model_takes_hostile_events_and_goes_on(world: World) -> None:
    engine = world.engine
    job, _ = await store.insert_job(engine, _spec("real"), "t", "u", None)
    for item in map(_wrap, hostile()):
        await _survives(lambda items: store.apply_events(engine, items), [item])
    await _survives(lambda items: store.apply_events(engine, items),
                    [_wrap(e) for e in hostile()])
    # a hostile status for the real job changes nothing it cannot
    await _survives(lambda items: store.apply_events(engine, items), [_wrap(JobStatus(
        job_id=job["id"], state=JobState.RUNNING, reason="x", attempt=HUGE))])
    await store.apply_events(engine, [_wrap(JobStatus(
        job_id=job["id"], state=JobState.SUCCEEDED, reason="done"))])
    row = await store.get_job(engine, job["id"])
    assert row is not None and row["state"] == "succeeded"
    assert not any(n["node_id"] == "ghost" for n in await store.list_nodes(engine))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(state=st.sampled_from(list(JobState)),
       attempt=st.integers(min_value=-HUGE, max_value=HUGE),
       task=st.none() | st.text(max_size=30), job=st.sampled_from(["nobody", "real", ""]))
async def test_any_status_of_any_attempt_is_taken_or_refused_alone(
        world: World, state: JobState, attempt: int, task: str | None, job: str) -> None:
    ev = JobStatus(job_id=job, state=state, reason="fuzz", attempt=attempt, task=task)
    await _survives(world.q.handle_batch, [_wrap(ev)])
    await _survives(lambda items: store.apply_events(world.engine, items), [_wrap(ev)])
