"""The Gittins rank (scheduling.estimates.gittins_rank): SRPT on tight history, least
attained service on dispersed history."""

from __future__ import annotations

import math
import random

import pytest

from scheduling.estimates import DurationHistory, gittins_rank


def test_tight_history_ranks_by_time_left() -> None:
    assert gittins_rank([600.0] * 10, 0.0) == pytest.approx(600.0)
    assert gittins_rank([600.0] * 10, 200.0) == pytest.approx(400.0)


def test_outliving_every_sample_gives_none() -> None:
    assert gittins_rank([100.0, 200.0], 250.0) is None


def test_a_job_past_the_short_mode_ranks_behind_a_fresh_one() -> None:
    # 90% take 60 s, 10% take 10 h: fresh, a job likely ends within a minute; once past
    # the minute it is one of the long ones (SRPT on the median would call it nearly done)
    samples = [60.0] * 9 + [36_000.0]
    fresh, past = gittins_rank(samples, 0.0), gittins_rank(samples, 120.0)
    assert fresh is not None and past is not None
    assert fresh < 120.0
    assert past == pytest.approx(36_000.0 - 120.0)


def test_dispersed_history_does_not_rank_by_the_median() -> None:
    # half short, half very long: the median (anything between) says little; the rank
    # is the expected service per chance of finishing, far below the mean
    samples = [100.0] * 5 + [100_000.0] * 5
    g = gittins_rank(samples, 0.0)
    # E[min(X, 100)] = 100 over P(X <= 100) = 5/10, its count two standard deviations lower
    assert g == pytest.approx(100.0 * 10 / (5 - 2 * math.sqrt(5 * 0.5)))
    assert g < 0.02 * sum(samples) / len(samples)


def test_a_few_lucky_short_samples_do_not_rank_a_class_far_below_its_mean() -> None:
    """Memoryless durations: nothing learned from them says a job ends soon, so the rank
    is about the mean. The minimum over quanta of the raw shares picked the luckiest
    short samples (m times the shortest of m is itself exponential around the mean): a
    class of 10-minute jobs ranked below 2 minutes, and its jobs stopped hour-long ones
    (syn-exp-steady-1t: 1.16 x Tiresias' average JCT)."""
    rng = random.Random(7)
    mean = 600.0
    ranks = []
    for _ in range(50):
        samples = tuple(rng.expovariate(1 / mean) for _ in range(200))
        g = gittins_rank(samples, 0.0)
        assert g is not None
        ranks.append(g / (sum(samples) / len(samples)))
    assert min(ranks) > 0.7 and max(ranks) <= 1.0 + 1e-9


def test_history_samples_are_the_estimates_jobs() -> None:
    h = DurationHistory()
    for d in (30.0, 10.0, 20.0):
        h.learn("a", 1, d)
    h.learn("b", 1, 99.0)
    assert h.samples("a", 1) == (10.0, 20.0, 30.0)
    assert h.estimate("a", 1) == 20.0
    assert h.samples("c", 1) == (10.0, 20.0, 30.0, 99.0)  # no such tenant: every job of that size
    assert h.samples("a", 4) == ()


def test_a_sample_tuple_ranks_as_its_list_at_every_point() -> None:
    """The sorted copy of a tuple is kept between calls (a cycle ranks every running job
    of a class on the same tuple); a list, which may change, is sorted each time."""
    samples = (900.0, 30.0, float("nan"), 60.0, 36_000.0, 30.0)
    plain = [x for x in samples if x == x]
    for done in (0.0, 30.0, 45.0, 900.0, 40_000.0):
        assert gittins_rank(samples, done) == gittins_rank(plain, done)
        assert gittins_rank(samples, done) == gittins_rank(samples, done)
    grown = [100.0]
    assert gittins_rank(grown, 0.0) == pytest.approx(100.0)
    grown.append(1.0)  # the same list, changed: not a kept copy
    # 1 / P(X <= 1) is below none: its count two deviations lower is 0; the mean is 50.5
    assert gittins_rank(grown, 0.0) == pytest.approx(50.5)
