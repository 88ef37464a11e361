"""Fair share over decayed past use in the live scheduler: the scheduler keeps each
tenant's decayed GPU-seconds from what its tasks hold cycle after cycle, orders by it
with the policy's half-life, and a new leader goes on from the stored figure (real
PostgreSQL)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scheduling import Scheduler, SchedulerConfig
from scheduling.decay import DecayedUsage
from services.scheduler.main import SchedulerService
from services.scheduler.state import Output, SchedulerState
from shared.config import CommonSettings
from shared.db import make_engine
from shared.events import JobState, JobStatus
from tests.services.builders import node, ready, step

HOUR = 3600.0


def policy() -> SchedulerConfig:
    extra = {"fairshare": {"half_life_s": HOUR}, "priority": {"fairshare_weight": 100.0}}
    cfg = SchedulerConfig.preset("default")
    return cfg.model_copy(update={"plugins": [
        p.model_copy(update={"args": {**p.args, **extra.get(p.name, {})}}) for p in cfg.plugins]})


def state(epoch: int = 1) -> SchedulerState:
    cfg = policy()
    s = SchedulerState(epoch, Scheduler(cfg).schedule, None,
                       DecayedUsage(cfg.decay_half_life_s()))
    step(s, node("n1"), now=0.0)
    return s


def finish(s: SchedulerState, job_id: str, now: float) -> None:
    job = s.jobs[job_id]
    for p in job.active():
        step(s, JobStatus(job_id=job_id, state=JobState.SUCCEEDED, reason="done",
                          attempt=job.attempt, task=p.task_id, node_id=p.node_id), now=now)


def test_a_tenant_that_held_the_node_lately_goes_after_one_that_did_not() -> None:
    s = state()
    step(s, ready("A0").tenant("heavy").gpus(8).build(), now=0.0)
    assert s.jobs["A0"].active()  # it runs for two hours
    finish(s, "A0", 2 * HOUR)  # the cycle its end brings counts the two hours
    assert s.decay is not None and s.decay.gpu_s["heavy"] == pytest.approx(
        8 * HOUR / 0.6931471805599453 * 0.75)  # 8 GPUs x tau x (1 - 2^-2)
    # both submit at once, heavy first: light goes first all the same
    step(s, ready("A1").tenant("heavy").gpus(8).build(),
         ready("B1").tenant("light").gpus(8).build(), now=2 * HOUR + 1)
    assert s.jobs["B1"].active() and not s.jobs["A1"].active()


def test_without_a_past_the_first_come_goes_first() -> None:
    s = state()
    step(s, ready("A1").tenant("heavy").gpus(8).build(),
         ready("B1").tenant("light").gpus(8).build(), now=0.0)
    assert s.jobs["A1"].active() and not s.jobs["B1"].active()


@pytest.mark.db
async def test_a_new_leader_goes_on_from_the_stored_past(db_url: str) -> None:
    engine = make_engine(db_url, pool_size=2)
    try:
        rt = SimpleNamespace(producer=None, settings=CommonSettings(database_url=db_url))
        first = SchedulerService(rt, engine, state(epoch=1))  # type: ignore[arg-type]
        first.state.handle(ready("A0").tenant("heavy").gpus(8).build(), first.out)
        first.state.cycle(1000.0, first.out)
        first.state.handle(ready("A9").tenant("heavy").gpus(1).build(), first.out)
        first.state.cycle(1000.0 + HOUR, first.out)  # an hour of 8 GPUs
        out, first.out = first.out, Output()
        await first.persist(out)
        held = first.state.decay.gpu_s["heavy"]  # type: ignore[union-attr]
        assert held > 0

        nxt = SchedulerService(rt, engine, state(epoch=2))  # type: ignore[arg-type]
        await nxt.load()
        assert nxt.state.decay is not None
        assert nxt.state.decay.gpu_s == pytest.approx({"heavy": held})
        assert nxt.state.decay.at == 1000.0 + HOUR
    finally:
        await engine.dispose()
