"""Fair share: DRF ordering, Kueue cohort quotas (borrowing, lending), reclaim."""

from __future__ import annotations

import pytest

from scheduling import PendingReason, PreemptReason, QuotaBook, Resources, Scheduler, dominant_share
from tests.scheduling.builders import World, bound, cluster, config, job, quota

FAIR = ("gang", "priority", "fairshare", "binpack")


def test_drf_orders_the_tenant_with_the_smaller_dominant_share_first() -> None:
    w = World(cluster(2), Scheduler(config(*FAIR)))
    w.start(job("big").tenant("a").gpus(8), n0=list(range(8)))
    w.submit(job("a1").tenant("a").gpus(1).submit(0), job("b1").tenant("b").gpus(1).submit(5),
             job("b2").tenant("b").gpus(1).submit(6))
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == ["b1", "b2", "a1"]


def test_drf_interleaves_tenants_by_projected_share() -> None:
    w = World(cluster(2), Scheduler(config("gang", "fairshare", "binpack")))
    w.submit(*[job(f"a{i}").tenant("a").gpus(2).submit(i) for i in range(3)],
             *[job(f"b{i}").tenant("b").gpus(2).submit(10 + i) for i in range(3)])
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == ["a0", "b0", "a1", "b1", "a2", "b2"]


@pytest.mark.parametrize(
    ("name", "quotas", "used", "ask", "admitted", "borrowing"),
    [
        ("within nominal", [quota("a", 4)], {"a": 2}, 2, True, False),
        ("over nominal, no cohort", [quota("a", 4)], {"a": 2}, 3, False, False),
        ("borrow from the cohort", [quota("a", 4, "c"), quota("b", 4, "c")], {"a": 4}, 3, True, True),
        ("borrowing limit", [quota("a", 4, "c", borrow=2), quota("b", 4, "c")], {"a": 4}, 3, False, False),
        ("lending limit keeps a guarantee", [quota("a", 4, "c"), quota("b", 4, "c", lend=1)], {"a": 4}, 2,
         False, False),
        ("cohort pool used up", [quota("a", 4, "c"), quota("b", 4, "c")], {"a": 4, "b": 4}, 1, False, False),
        ("no quota, no limit", [quota("a", 4)], {}, 100, True, False),
    ],
)
def test_quota_book(name, quotas, used, ask, admitted, borrowing) -> None:
    book = QuotaBook(quotas, {t: Resources(g) for t, g in used.items()})
    tenant = "z" if name.startswith("no quota") else "a"
    adm = book.check(tenant, Resources(ask))
    assert (adm.admitted, adm.borrowing) == (admitted, borrowing), name
    if not admitted:
        assert adm.reason == PendingReason.QUOTA


def test_scheduler_holds_jobs_over_quota() -> None:
    w = World(cluster(2), Scheduler(config(*FAIR)), quotas=(quota("a", 8),))
    plan = w.submit(job("a1").tenant("a").gpus(8), job("a2").tenant("a").gpus(1)).step()
    assert set(bound(plan)) == {"a1"}
    assert plan.pending == {"a2": PendingReason.QUOTA}


def test_reclaim_preempts_the_borrower_for_the_owner() -> None:
    w = World(cluster(2), Scheduler(config(*FAIR)), quotas=(quota("a", 8, "c"), quota("b", 8, "c")), now=100)
    w.start(job("b1").tenant("b").gpus(8), n0=list(range(8)))
    w.start(job("b2").tenant("b").gpus(8), at=50, n1=list(range(8)))  # b borrows a's 8 GPUs
    plan = w.submit(job("a1").tenant("a").gpus(8)).step()
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [("b2", PreemptReason.RECLAIM)]
    assert plan.pending == {"a1": PendingReason.PREEMPTING}


def test_no_reclaim_beyond_the_owners_nominal_quota() -> None:
    w = World(cluster(2), Scheduler(config(*FAIR)), quotas=(quota("a", 4, "c"), quota("b", 12, "c")), now=100)
    w.start(job("b1").tenant("b").gpus(8), n0=list(range(8)))
    w.start(job("b2").tenant("b").gpus(8), at=50, n1=list(range(8)))
    plan = w.submit(job("a1").tenant("a").gpus(8)).step()
    assert plan.preemptions == []


def test_dominant_share() -> None:
    cap = Resources(10, 100, 1000)
    assert dominant_share(Resources(2, 50, 10), cap) == 0.5
    assert dominant_share(Resources(2, 50, 10), cap, weight=2.0) == 0.25
