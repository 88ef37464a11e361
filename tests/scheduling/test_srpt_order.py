"""Srpt's order among jobs alike but for when the history was read for them: a job that
never ran is not passed by a later one of its tenant and size (``srpt.siblings``)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduling import Scheduler
from scheduling.plugins.srpt import oldest_not_behind
from tests.scheduling.builders import World, bound, cluster, config, job

HOUR = 3600.0


def _first_started(siblings: bool, old_ran_s: float = 0.0, new_gpus: int = 4) -> list[str]:
    """Room for one 4-GPU job. 'old' queued when its size's history said 2 h; 'new', of
    the same tenant, queued later when it said 30 min; 'other' tenant's job ranks 1 h."""
    w = World(cluster(1), Scheduler(config("gang", ("srpt", {"by": "time", "rank": "gittins", "preempt": False,
                                                               "siblings": siblings}), "fairshare", "binpack")),
              now=1000)
    w.start(job("r").gpus(4).submit(-100).estimate(10 * HOUR).not_preemptible(), n0=[0, 1, 2, 3])
    w.submit(job("old").gpus(4).tenant("a").submit(0).samples(*[2 * HOUR] * 20).attained(old_ran_s * 4),
             job("other").gpus(4).tenant("b").submit(50).samples(*[HOUR] * 20),
             job("new").gpus(new_gpus).tenant("a").submit(100).samples(*[0.5 * HOUR] * 20))
    return list(bound(w.step()))


def test_a_job_is_not_passed_by_a_later_one_of_its_tenant_and_size_that_knows_more() -> None:
    # without the rule 'old' would wait for as long as its size keeps arriving
    assert _first_started(siblings=True) == ["old"]
    assert _first_started(siblings=False) == ["new"]


def test_jobs_that_differ_in_service_or_size_keep_their_own_rank() -> None:
    # 'old' has run 1.9 h of its 2 h: it is not the newcomer's like, and ranks by its own
    # 6 min left; a 2-GPU newcomer is of another size, so 'old' keeps its 2 h rank and the
    # newcomer, ranked first, takes half of the free GPUs (too few left for 'old')
    assert _first_started(siblings=True, old_ran_s=1.9 * HOUR) == ["old"]
    assert _first_started(siblings=True, new_gpus=2) == ["new"]
    assert _first_started(siblings=False, new_gpus=2) == ["new"]


@pytest.mark.parametrize("seed", range(20))
def test_no_job_that_never_ran_ranks_behind_a_later_alike_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 60
    tenant = rng.integers(0, 3, n).astype(float)
    gpus = rng.choice([1.0, 2.0, 8.0], n)
    submit = rng.permutation(n).astype(float)
    fresh = rng.random(n) < 0.7  # never ran, ranked by its samples
    left = rng.random(n) * 1000
    out = oldest_not_behind(tenant, gpus, submit, fresh, left)
    assert np.all(out <= left)
    for i in range(n):
        if not fresh[i]:
            assert out[i] == left[i]  # a job that ran, or has no samples, keeps its rank
            continue
        kin = (tenant == tenant[i]) & (gpus == gpus[i]) & fresh
        # the least rank of itself and the alike jobs after it: none of them ranks ahead
        assert out[i] == left[kin & (submit >= submit[i])].min()
        assert not np.any(out[kin & (submit > submit[i])] < out[i])
