"""Why an admitted job is not placed yet: the scheduler's ``job.waiting`` (the core's
pending reason and backfill's estimated start), sent only when it changes; stored by the
gateway's read model from the real broker and shown by GET /v1/jobs/{id} and
``kairos describe`` until the job is placed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kairos.cli import app as cli
from kairos.embedded import free_port
from scheduling import PendingReason, Scheduler, SchedulerConfig
from services.admission import store, tokens
from services.admission.app import create_app
from services.admission.settings import AdmissionSettings
from services.scheduler.explain import DETAIL
from services.scheduler.main import SchedulerService
from services.scheduler.state import Output, SchedulerState
from shared.bus import Consumer, ConsumerOptions, Producer
from shared.config import CommonSettings
from shared.db import make_engine
from shared.events import (
    Envelope,
    Event,
    JobReady,
    JobState,
    JobStatus,
    JobWaiting,
    NodeAction,
    NodeCommand,
    TransitionReason,
    WaitReason,
    utcnow,
)
from shared.http import HttpServer
from shared.jobspec import parse_job_spec
from shared.topics import JOBS_STATUS
from tests.services import builders
from tests.services.builders import node, ready


def core() -> SchedulerState:
    return SchedulerState(epoch=2, placer=Scheduler(SchedulerConfig.preset("default")).schedule)


def estimated(job: JobReady, seconds: float) -> JobReady:
    return job.model_copy(update={"spec": job.spec.model_copy(
        update={"runtime_estimate": seconds})})


def step(s: SchedulerState, now: float, *events: object) -> list[tuple[str, str, bool]]:
    """The job.waiting notices of one flush: (job, reason, has an estimate)."""
    out = builders.step(s, *events, now=now)
    return [(w.job_id, w.reason, w.estimated_start is not None) for env, topic in out.events
            for w in [env.payload()] if isinstance(w, JobWaiting) and topic == "jobs.status"]


def test_the_scheduler_says_why_a_job_waits_only_when_that_changes() -> None:
    s = core()
    a = estimated(ready("A").gpus(8).build(), 600)  # n1 frees at 1000 + 600
    assert step(s, 1000, node("n1"), node("n2"), a, ready("X").gpus(8).build()) == []
    assert step(s, 1010, ready("BIG").gpus(16).build()) == [("BIG", "never_fits", False)]
    out = Output()
    s.handle(ready("G").gpus(8).replicas(2).build(), out)
    s.cycle(1011, out)
    waiting = [e.payload() for e, _ in out.events if e.type == "job.waiting"]
    assert [(w.job_id, w.reason) for w in waiting] == [("G", "no_fit")]  # type: ignore[attr-defined]
    g = waiting[0]
    assert isinstance(g, JobWaiting) and (g.attempt, g.epoch) == (1, 2)
    assert g.estimated_start == datetime.fromtimestamp(1600, UTC)  # backfill's reservation
    assert g.detail == "no node has room for it now; backfill holds n1, n2 for it"
    # cycles that change nothing for them say nothing, however often they run
    for now in (1012, 1013, 1100):
        s.needs_cycle = True
        assert step(s, now) == []
    assert step(s, 1020, NodeCommand(node_id="n2", action=NodeAction.CORDON,
                                     generation=1)) == [("G", "never_fits", False)]
    assert step(s, 1030, JobStatus(job_id="X", state=JobState.SUCCEEDED, reason="agent",
                                   task="worker-0", node_id="n2")) == [("G", "cordoned", False)]
    assert step(s, 1040, NodeCommand(node_id="n2", action=NodeAction.UNCORDON,
                                     generation=2)) == [("G", "gang_incomplete", True)]
    # placed: no notice, its bound status ends the wait; BIG still never fits, unsaid
    assert step(s, 1600, JobStatus(job_id="A", state=JobState.SUCCEEDED, reason="agent",
                                   task="worker-0", node_id="n1")) == []
    assert s.jobs["G"].state is JobState.BOUND and s.pending_reasons == {"BIG": "never_fits"}


def test_a_new_leader_says_it_again_under_new_event_ids() -> None:
    s = core()
    out = Output()
    for e in (node("n1", gpus=4), ready("W").gpus(8).build()):
        s.handle(e, out)
    s.cycle(0.0, out)
    first = [env.id for env, _ in out.events if env.type == "job.waiting"]
    successor = SchedulerState(epoch=3, placer=s.placer)
    for job_id in s.jobs:
        row = s.job_row(job_id)
        successor.load_job({**row, "ready": json.loads(row["ready"])})
    successor.handle(node("n1", gpus=4), Output())
    again = Output()
    successor.cycle(1.0, again)
    said = [env for env, _ in again.events if env.type == "job.waiting"]
    assert [e.data["reason"] for e in said] == ["never_fits"]
    assert said[0].id not in first and said[0].id.endswith("-e3-1")


def test_b_waits_behind_a_of_higher_priority_and_names_it() -> None:
    """B, submitted first but of a lower class, would fit were it not for A, which the
    cycle placed ahead of it: B's wait is ``priority`` behind A, not ``no_fit``."""
    s = core()
    b = ready("B").gpus(4).priority_class("low").build()
    a = ready("A").gpus(6).priority_class("high").build()
    out = builders.step(s, node("n1"), b, a, now=100)
    events = [env.payload() for env, _ in out.events]
    [wait] = [e for e in events if isinstance(e, JobWaiting)]
    assert (wait.job_id, wait.reason, wait.blocked_by) == ("B", WaitReason.PRIORITY, "A")
    assert wait.detail == DETAIL[PendingReason.PRIORITY]
    [bound] = [e for e in events if isinstance(e, JobStatus) and e.job_id == "A"]
    assert (bound.state, bound.reason_code) == (JobState.BOUND, TransitionReason.PLACED)
    # next cycle A holds the room: B waits for room, and that is news
    s.needs_cycle = True
    assert step(s, 101) == [("B", "no_fit", True)]  # backfill reserves n1 for it


class Recording:
    """The real producer, remembering what the scheduler published."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.source = producer.source
        self.max_event_bytes = producer.max_event_bytes
        self.sent: list[Envelope] = []

    async def send_future(self, topic: str, key: str, value: bytes) -> asyncio.Future[Any]:
        """What the scheduler's outbox relay sends."""
        self.sent.append(Envelope.decode(value))
        return await self.producer.send_future(topic, key, value)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.db
@pytest.mark.broker
async def test_the_gateway_shows_why_an_admitted_job_waits_for_gpus(db_url: str,
                                                                     broker: str) -> None:
    """Scheduler (its service flush: cycle, persist, publish) -> real broker -> the
    gateway's read model -> GET /v1/jobs/{id} over real HTTP and ``kairos describe``."""
    engine = make_engine(db_url, pool_size=5)
    settings = CommonSettings(service_name="test", kafka_bootstrap=broker, retry_backoff_s=0.01,
                              session_timeout_ms=6000, heartbeat_interval_ms=500,
                              rebalance_timeout_ms=6000, fetch_max_wait_ms=20)
    producer = Producer(broker, "test")
    await producer.start()
    recording = Recording(producer)
    sched = SchedulerService(SimpleNamespace(producer=recording, settings=CommonSettings(  # type: ignore[arg-type]
        database_url=db_url)), engine, core())

    async def read_model(env: Envelope, ev: Event) -> None:
        await store.apply_events(engine, [(env, ev)])

    consumer = Consumer(settings, ConsumerOptions(f"admission-{uuid.uuid4().hex[:8]}",
                                                  [JOBS_STATUS.name]), read_model, producer)

    async def ready_check() -> dict[str, bool]:
        return {"database": True}

    port = free_port()
    http = HttpServer(create_app(AdmissionSettings(database_url=db_url), engine, ready_check),
                      "127.0.0.1", port)
    url = f"http://127.0.0.1:{port}"
    _, token = await tokens.create_token(engine, "vision", "user", "ana")
    task = None
    try:
        await consumer.start()
        task = asyncio.create_task(consumer.run())
        await http.start()
        async with httpx.AsyncClient(base_url=url, headers=auth(token), timeout=30) as gw:
            async def submit(name: str, **spec: Any) -> JobReady:
                body = {"name": name, **spec, "tasks": [
                    {"name": "worker", "resources": {"gpu": 8}}]}
                r = await gw.post("/v1/jobs", json=body)
                assert r.status_code == 201, r.text
                job = r.json()
                # what queueing does: admit it, and hand it to the scheduler
                await producer.publish(JobStatus(job_id=job["id"], state=JobState.ADMITTED,
                                                 reason="admitted by queue default"))
                return JobReady(job_id=job["id"], queue="default", tenant="vision",
                                user="ana", spec=parse_job_spec(body), submitted_at=utcnow(),
                                admitted_at=utcnow())

            first = await submit("first", runtimeEstimate=600)
            second = await submit("second")
            for ev in (node("n1"), first):
                await sched.handle(Envelope.wrap(ev, "test"), ev)
            await sched.flush()  # first is placed on n1's 8 GPUs
            await sched.handle(Envelope.wrap(second, "test"), second)
            await sched.flush()  # second waits: no room until first ends
            for _ in range(3):  # more cycles, nothing new: nothing more is said
                sched.state.needs_cycle = True
                await sched.flush()
            said = [e for e in recording.sent if e.type == "job.waiting"]
            assert [e.data["job_id"] for e in said] == [second.job_id]
            expected = datetime.fromtimestamp(
                sched.state.jobs[first.job_id].bound_at + 600, UTC)  # type: ignore[operator]

            async def job() -> dict[str, Any]:
                r = await gw.get(f"/v1/jobs/{second.job_id}")
                assert r.status_code == 200
                return r.json()  # type: ignore[no-any-return]

            async with asyncio.timeout(60):  # a fresh consumer group takes seconds to join
                while (await job())["placement_wait"] is None:
                    await asyncio.sleep(0.1)
            j = await job()  # its history was read before the wait arrived, maybe
            assert j["state"] == "admitted" and j["waiting"] is None
            wait = j["placement_wait"]
            assert (wait["reason"], wait["blocked_by"]) == ("no_fit", None)  # room, not order
            assert wait["detail"] == "no node has room for it now; backfill holds n1 for it"
            assert datetime.fromisoformat(wait["estimated_start"]) == expected
            assert ("admitted", "waiting: no_fit", "waiting") in [
                (h["state"], h["reason"], h["reason_code"]) for h in j["history"]]
            # the admitted status above is sent as an older queueing did: without a code
            assert ("admitted", None) in [(h["state"], h["reason_code"]) for h in j["history"]]
            result = await asyncio.to_thread(CliRunner().invoke, cli, [
                "describe", second.job_id, "--url", url, "--token", token])
            assert result.exit_code == 0, result.output
            assert "waiting for GPUs: no_fit (no node has room for it now; backfill holds n1 " \
                   f"for it), estimated start {expected.isoformat()[:19]}" in \
                   " ".join(result.output.split())

            # first ends: second is placed, and the wait is over
            done = JobStatus(job_id=first.job_id, state=JobState.SUCCEEDED, reason="agent",
                             task="worker-0", node_id="n1")
            await sched.handle(Envelope.wrap(done, "test"), done)
            await sched.flush()
            async with asyncio.timeout(30):
                while (j := await job())["state"] != "bound":
                    await asyncio.sleep(0.1)
            assert j["placement_wait"] is None
            assert [e.data["job_id"] for e in recording.sent if e.type == "job.waiting"] == [
                second.job_id]  # one notice in all
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await consumer.stop()
        await http.stop()
        await producer.stop()
        await engine.dispose()
