"""The mean time left over similar jobs (scheduling.estimates.mean_left) and its use for
many jobs at once (ordering.with_mean_left), which groups jobs by their samples."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from scheduling.estimates import mean_left
from scheduling.plugins.ordering import with_mean_left
from tests.scheduling.builders import job


def _by_definition(samples: list[float], done: float) -> float:
    longer = [x - done for x in samples if x > done]
    return sum(longer) / len(longer) if longer else float("nan")


def test_mean_left_is_the_mean_excess_over_the_longer_samples_and_nan_past_them_all() -> None:
    rng = random.Random(7)
    for _ in range(200):
        samples = tuple(rng.expovariate(1 / 3600) for _ in range(rng.randint(1, 40)))
        done = np.array([0.0, *(rng.uniform(0, 2 * max(samples)) for _ in range(20)), max(samples)])
        got = mean_left(samples, done)
        want = np.array([_by_definition(list(samples), d) for d in done])
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert got[~np.isnan(got)] == pytest.approx(want[~np.isnan(want)], rel=1e-9, abs=1e-6)


def test_with_mean_left_fills_each_job_from_its_own_samples_and_keeps_the_rest() -> None:
    short, long_ = (60.0, 120.0, 180.0), (7200.0, 14400.0)
    # j0 and j2 share one samples tuple, as jobs of one class share the history's
    jobs = [job(f"j{i}").samples(*s).build() if s else job(f"j{i}").build()
            for i, s in enumerate((short, long_, short, (), long_))]
    jobs[2] = replace(jobs[2], runtime_samples=jobs[0].runtime_samples)
    done = np.array([0.0, 0.0, 150.0, 0.0, 20000.0])  # j4 outlived its samples
    left = np.full(5, -1.0)
    out = with_mean_left(jobs, done, left)
    assert out.tolist() == pytest.approx([120.0, 10800.0, 30.0, -1.0, -1.0])
