"""The simulator with fair share over decayed past use (sim/decay_experiment.py): a
tenant back after another's burst waits less with a half-life than without, and the
one that burst waits more; with the half-life off nothing differs from the default."""

from __future__ import annotations

from scheduling import SchedulerConfig
from sim.decay_experiment import config, per_tenant, return_after_burst
from sim.engine import SimSettings, Simulation
from sim.traces import uniform_cluster


def waits(half_life_s: float) -> dict[str, float]:
    res = Simulation(uniform_cluster(4, 8), return_after_burst(1), config(half_life_s),
                     SimSettings(cycle_s=60.0)).run()
    return {t: r["avg_wait_s"] for t, r in per_tenant(res, only="burst-").items()}


def test_the_tenant_back_after_a_burst_waits_less_with_a_half_life() -> None:
    off, day = waits(0.0), waits(86400.0)
    assert day["light"] < off["light"] / 2
    assert day["heavy"] > off["heavy"]
    assert config(0.0) == SchedulerConfig.preset("default")
