"""The lower bound behind issue 17's starvation finding (sim/wait_bound.py): valid (FIFO,
which keeps the wait, is never below it) and, on its trace, above what Tiresias reaches."""

from __future__ import annotations

import pytest

from sim.engine import Simulation
from sim.metrics import summarize
from sim.policies import policy_config, policy_settings
from sim.suite import SYN_RULES
from sim.traces import uniform_cluster
from sim.wait_bound import H, jct_lower_bound, trace


def _run(jobs, policy: str):  # type: ignore[no-untyped-def]
    res = Simulation(uniform_cluster(1, 8), jobs, policy_config(policy), policy_settings(policy, SYN_RULES)).run()
    return summarize(res)


def test_no_schedule_keeps_fifos_longest_wait_and_tiresias_jct() -> None:
    jobs = trace(100.0, 0.8, span_h=200.0)
    fifo, tiresias = _run(jobs, "FIFO"), _run(jobs, "Tiresias")
    wait_h = fifo["max_total_wait_s"] / H
    bound = jct_lower_bound(jobs, 100.0, wait_h)
    # FIFO keeps its own longest wait, so no valid bound exceeds its average JCT
    assert bound <= fifo["avg_jct_s"] / H
    # Tiresias runs the stream at once and starves the long job far past FIFO's wait ...
    assert tiresias["max_total_wait_s"] > 1.5 * fifo["max_total_wait_s"]
    # ... and any schedule that does not starve it queues the stream: several times slower
    assert bound > 3 * tiresias["avg_jct_s"] / H


def test_the_bound_grows_with_the_wait_allowed_shrinking() -> None:
    jobs = trace(50.0, 0.9, "poisson", seed=3, span_h=150.0)
    loose, tight = jct_lower_bound(jobs, 50.0, 400.0), jct_lower_bound(jobs, 50.0, 40.0)
    assert tight > loose >= 1.0  # a job holds at least its own hour


def test_arrivals_other_than_even_or_poisson_are_refused() -> None:
    with pytest.raises(ValueError, match="even"):
        trace(10.0, 0.8, "bursty")
