"""Succeeded jobs' durations as the scheduler and the forecaster learn them
(``services/scheduler/history.py``), and the estimates and samples the scheduler's
snapshot gives waiting jobs from them, as the simulator does; a restarted scheduler
learns them again from its rows (real PostgreSQL, and the real broker its events go to)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from scheduling import JobRequest, Scheduler, SchedulerConfig, TaskRequest
from services.scheduler import history as history_module
from services.scheduler.history import JobHistory, gpu_key, shape
from services.scheduler.main import SchedulerService
from services.scheduler.model import Output
from services.scheduler.state import SchedulerState
from shared.bus import Producer
from shared.config import CommonSettings
from shared.db import make_engine
from shared.events import JobState, JobStatus
from tests.services.builders import node, ready

CONFIG = SchedulerConfig.preset("default")


def row(job_id: str, state: str, bound_at: float | None, ended_at: float, gpus: int = 8,
        tenant: str = "lab") -> dict[str, object]:
    """A ``sched_jobs`` row as the history query reads it (JSON columns decoded)."""
    r = ready(job_id).gpus(gpus).tenant(tenant).build()
    return {"job_id": job_id, "state": state, "attempt": 1, "ready": r.model_dump(mode="json"),
            "placement": [], "tasks": {"bound_at": bound_at}, "ended_at": ended_at}


def test_rows_teach_the_duration_of_succeeded_jobs_only() -> None:
    h = JobHistory()
    h.learn_row(row("a", "succeeded", 100.0, 220.0))
    h.learn_row(row("b", "succeeded", 100.0, 400.0))
    h.learn_row(row("c", "failed", 100.0, 900.0))  # says nothing of how long it takes
    h.learn_row(row("d", "succeeded", None, 900.0))  # never placed
    h.learn_row({**row("e", "succeeded", 0.0, 5.0), "ready": {}})  # a cancel's tombstone
    h.learn_row(row("f", "succeeded", 50.0, 40.0))  # clocks apart: never negative
    assert h.every == [120.0, 300.0, 0.0]
    assert h.by_key == {("lab", 8): [120.0, 300.0, 0.0]}
    assert h.estimate("lab", 8) == 120.0
    assert h.samples("lab", 8) == (0.0, 120.0, 300.0)


def test_the_key_is_the_tenant_and_whole_gpus() -> None:
    assert shape(ready("j").gpus(4).replicas(2).tenant("lab").build()) == ("lab", 8)
    # a shared GPU counts as one
    assert shape(ready("s").share(20480, 25).tenant("lab").build()) == ("lab", 1)
    shares = JobRequest("h", (TaskRequest("w", "worker", 3, gpu_memory_mib=20480,
                                          gpu_compute_pct=50),))
    assert 0 < shares.total_gpus < 3 and gpu_key(shares) == math.ceil(shares.total_gpus)


def test_memory_stays_bounded_keeping_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history_module, "KEEP", 4)
    h = JobHistory()
    for i in range(8):
        h.learn("lab", 1, float(i))
    assert h.every == [float(i) for i in range(8)] and h.generation == 0
    v = h.version(1)
    h.learn("lab", 1, 8.0)  # past twice KEEP: rebuilt from the last four
    assert h.every == [5.0, 6.0, 7.0, 8.0] and h.by_key == {("lab", 1): [5.0, 6.0, 7.0, 8.0]}
    assert h.gpu_s == 26.0 and h.generation == 1 and h.version(1) != v


def test_a_request_gets_the_median_and_the_samples_unless_the_user_estimated() -> None:
    h = JobHistory()
    mine = JobRequest("m", (TaskRequest("w", "worker", 1, gpu=8),), tenant="lab",
                      runtime_estimate_s=42.0)
    theirs = JobRequest("t", (TaskRequest("w", "worker", 1, gpu=8),), tenant="lab")
    assert h.fill(theirs, 8) is theirs  # nothing known yet
    for d in (100.0, 300.0, 200.0):
        h.learn("lab", 8, d)
    got = h.fill(theirs, 8)
    assert got.runtime_estimate_s == 200.0 and got.runtime_samples == (100.0, 200.0, 300.0)
    kept = h.fill(mine, 8)
    assert kept.runtime_estimate_s == 42.0 and kept.runtime_samples == (100.0, 200.0, 300.0)


def test_speeds_per_model_are_learnt_from_first_attempts_on_one_model_and_kept_in_rows() -> None:
    """A class (tenant, name, GPUs) that took 100 s on H100s and 400 s on V100s runs 4x
    faster on an H100: a job of it without a throughput is placed by that; a job with
    one keeps its own; a later attempt (it resumed, part of the work done) or a placement
    over several models teaches nothing; a restart learns the same from the rows."""
    r = ready("a").gpus(8).tenant("lab").build()
    h = JobHistory()
    h.learn_job(r, 0.0, 100.0, "H100-80GB", 1)
    h.learn_job(r, 0.0, 400.0, "V100-32GB", 1)
    h.learn_job(r, 0.0, 10.0, "V100-32GB", 2)  # a resumed attempt: not learnt
    h.learn_job(r, 0.0, 10.0, "", 1)  # several models: not learnt
    job = JobRequest("j", (TaskRequest("w", "worker", 1, gpu=8),), tenant="lab")
    got = h.fill(job, 8, r.spec.name)
    assert got.gpu_speeds == (("H100-80GB", 1.0), ("V100-32GB", 0.25))
    assert h.fill(job, 8) is not got and h.fill(job, 8).gpu_speeds == ()  # not asked
    own = JobRequest("o", job.tasks, tenant="lab", gpu_speeds=(("V100-32GB", 1.0),))
    assert h.fill(own, 8, r.spec.name).gpu_speeds == (("V100-32GB", 1.0),)
    # another class of the tenant, never measured, is placed by the typical class's
    assert h.fill(job, 8, "other").gpu_speeds == (("H100-80GB", 1.0), ("V100-32GB", 0.25))
    again = JobHistory()
    for k, (model, took) in enumerate((("H100-80GB", 100.0), ("V100-32GB", 400.0))):
        rr = row(f"r{k}", "succeeded", 0.0, took)
        again.learn_row({**rr, "ready": r.model_dump(mode="json"),
                         "tasks": {"bound_at": 0.0, "bound_model": model}})
    assert again.fill(job, 8, r.spec.name).gpu_speeds == got.gpu_speeds
    assert JobHistory().fill(job, 8, r.spec.name) is job  # nothing known: the same object


def test_a_request_takes_what_the_history_knows_when_it_queues_and_again_when_it_starts() -> None:
    """The snapshot keeps each request while it waits, whatever the history learns
    meanwhile; the attempt's start fills it anew, and it is kept again while it runs (a
    job's rank moves with its own progress only, as in the simulator: sim/engine.py)."""
    s = SchedulerState(1, Scheduler(CONFIG).schedule, JobHistory())
    out = Output()
    s.handle(ready("p").gpus(8).tenant("lab").build(), out)
    before = s.snapshot(0.0).pending[0]
    assert before.runtime_estimate_s is None and before.runtime_samples == ()
    assert s.history is not None
    s.history.learn("lab", 8, 60.0)
    assert s.snapshot(1.0).pending[0] is before  # kept while it waits
    s.handle(node("n0"), out)
    s.cycle(2.0, out)
    snap = s.snapshot(3.0)
    assert not snap.pending
    started = snap.running[0].job
    assert started.runtime_estimate_s == 60.0 and started.runtime_samples == (60.0,)
    s.history.learn("lab", 8, 90.0)
    assert s.snapshot(4.0).running[0].job is started  # kept while it runs


def test_without_a_history_requests_carry_only_the_users_estimate() -> None:
    s = SchedulerState(1, Scheduler(CONFIG).schedule)  # history_estimates off
    out = Output()
    s.handle(ready("p").gpus(8).tenant("lab").build(), out)
    s.handle(ready("q").gpus(8).tenant("lab").estimate(30).build(), out)
    assert [(j.runtime_estimate_s, j.runtime_samples) for j in s.snapshot(0.0).pending] == [
        (None, ()), (30.0, ())]


# --- the service, on real PostgreSQL and the real broker ----------------------------------

@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    e = make_engine(db_url, pool_size=3)
    yield e
    await e.dispose()


def leader(engine: AsyncEngine, db_url: str, epoch: int, producer: Producer | None = None
           ) -> SchedulerService:
    rt = SimpleNamespace(producer=producer, settings=CommonSettings(database_url=db_url))
    state = SchedulerState(epoch, Scheduler(CONFIG).schedule, JobHistory())
    return SchedulerService(rt, engine, state, history_first_read=100)  # type: ignore[arg-type]


async def place(svc: SchedulerService, *events: object, now: float) -> None:
    """A batch whose cycle runs at ``now`` (placed then), stored."""
    for ev in events:
        svc.state.handle(ev, svc.out)  # type: ignore[arg-type]
    svc.state.cycle(now, svc.out)
    out, svc.out = svc.out, Output()
    await svc.persist(out)


def estimates(svc: SchedulerService, now: float) -> dict[str, tuple[float | None, tuple[float, ...]]]:
    return {j.job_id: (j.runtime_estimate_s, j.runtime_samples)
            for j in svc.state.snapshot(now).pending}


@pytest.mark.db
@pytest.mark.broker
async def test_waiting_jobs_are_estimated_from_their_tenants_succeeded_jobs_across_a_restart(
        engine: AsyncEngine, db_url: str, broker: str) -> None:
    producer = Producer(broker, "scheduler")
    await producer.start()
    try:
        svc = leader(engine, db_url, epoch=1, producer=producer)
        await svc.load()
        ran = {"old0": 100.0, "old1": 300.0, "old2": 200.0}
        t0 = time.time()
        for i, (job, d) in enumerate(ran.items()):  # each placed d seconds ago, on a node of its own
            await place(svc, node(f"n{i}"), ready(job).gpus(8).tenant("lab").build(), now=t0 - d)
        for i, job in enumerate(ran):  # ... and succeeding now: the leader's own batches
            task = svc.state.jobs[job].placed[0].task_id
            for st in (JobState.RUNNING, JobState.SUCCEEDED):
                await svc.handle(None, JobStatus(  # type: ignore[arg-type]
                    job_id=job, state=st, reason="agent", attempt=1, task=task, node_id=f"n{i}"))
                await svc.flush()  # cycle, store, publish
        assert await svc.relay.pending() == 0 and not svc.state.jobs  # ended and evicted
        h = svc.state.history
        assert h is not None and h.every == pytest.approx(list(ran.values()), abs=5)
        median = statistics.median(h.every)
        assert median == pytest.approx(200, abs=5)

        def waiting(s: SchedulerService) -> dict[str, tuple[float | None, tuple[float, ...]]]:
            out = Output()
            for r in (ready("p-none").gpus(8).tenant("lab").build(),
                      ready("p-own").gpus(8).tenant("lab").estimate(42).build(),
                      ready("p-small").gpus(2).tenant("lab").build()):
                s.state.handle(r, out)
            return estimates(s, time.time())

        got = waiting(svc)
        samples = tuple(sorted(h.every))
        assert got["p-none"] == (median, samples)  # the median of its tenant's 8-GPU jobs
        assert got["p-own"] == (42.0, samples)  # the user's own estimate wins
        assert got["p-small"] == (None, ())  # no 2-GPU job finished yet

        # a new leader (a restart, a failover) learns them again from the rows
        nxt = leader(engine, db_url, epoch=2, producer=producer)
        await nxt.load()
        assert nxt.state.history is not None
        assert nxt.state.history.every == pytest.approx(list(ran.values()), abs=5)
        again = waiting(nxt)
        assert again["p-none"][0] == pytest.approx(200, abs=5)
        assert again["p-none"][1] == pytest.approx(samples, abs=5)
        assert again["p-own"][0] == 42.0 and len(again["p-own"][1]) == 3
        assert again["p-small"] == (None, ())
    finally:
        await producer.stop()
