"""Fair share over decayed past use (``scheduling/decay.py``, the fairshare plugin's
``half_life_s``): the arithmetic of the decay, and its effect on the order."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import Scheduler, SchedulerConfig
from scheduling.decay import DecayedUsage, past_share
from tests.scheduling.builders import World, cluster, job

HOUR = 3600.0


def test_past_use_halves_every_half_life_and_a_steady_holder_reaches_its_share() -> None:
    d = DecayedUsage(HOUR)
    d.advance(0.0)
    d.hold({"a": 8.0})
    one = d.advance(HOUR)["a"]
    assert one == pytest.approx(8 * (HOUR / math.log(2)) * 0.5, rel=1e-9)  # 8 GPUs x tau x (1 - 1/2)
    d.hold({})  # a stops
    assert d.advance(2 * HOUR)["a"] == pytest.approx(one / 2)
    steady = DecayedUsage(HOUR)
    steady.advance(0.0)
    steady.hold({"b": 8.0})
    far = steady.advance(40 * HOUR)["b"]
    assert past_share(far, 32.0, HOUR) == pytest.approx(8 / 32, rel=1e-6)  # its current share


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 5000), st.floats(0, 16)), min_size=1, max_size=20))
def test_many_steps_decay_as_one_and_the_past_stays_within_the_cluster(
        steps: list[tuple[float, float]]) -> None:
    """Advancing in many steps holding the same GPUs is one step; no tenant's past share
    exceeds the most it held over the whole cluster."""
    fine, coarse = DecayedUsage(HOUR), DecayedUsage(HOUR)
    fine.advance(0.0)
    coarse.advance(0.0)
    t = 0.0
    for dt, gpus in steps:
        fine.hold({"a": gpus})
        for k in range(1, 5):
            fine.advance(t + dt * k / 4)
        coarse.hold({"a": gpus})
        coarse.advance(t + dt)
        t += dt
        assert fine.gpu_s.get("a", 0.0) == pytest.approx(coarse.gpu_s.get("a", 0.0), rel=1e-6,
                                                         abs=1e-6)
    most = max(g for _, g in steps)
    assert past_share(coarse.gpu_s.get("a", 0.0), 16.0, HOUR) <= most / 16 + 1e-9
    assert coarse.advance(t - 10) == coarse.gpu_s  # a clock going back counts nothing


def test_a_tenant_that_ran_much_lately_waits_behind_one_that_did_not() -> None:
    """Neither holds anything now; a's decayed past is two cluster-hours. Without a
    half-life the order is first come; with one, b goes first."""
    def order(half_life: float) -> list[str]:
        cfg = SchedulerConfig.preset("default")
        if half_life:
            plugins = [p.model_copy(update={"args": {**p.args, "half_life_s": half_life}})
                       if p.name == "fairshare" else p for p in cfg.plugins]
            cfg = cfg.model_copy(update={"plugins": plugins})
        w = World(cluster(2), Scheduler(cfg))
        w.submit(job("a1").tenant("a").gpus(8).submit(0), job("b1").tenant("b").gpus(8).submit(1))
        snap = replace(w.snapshot(), past_usage={"a": 2 * 16 * HOUR})
        return [j.job_id for j in w.scheduler.order(snap)]
    assert order(0.0) == ["a1", "b1"]
    assert order(HOUR) == ["b1", "a1"]
