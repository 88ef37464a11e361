"""Elastic jobs grow into idle GPUs and shrink under pressure (never die for it)."""

from __future__ import annotations

from scheduling import ResizeReason, Scheduler
from tests.scheduling.builders import World, bound, cluster, config, job

EL = ("gang", "priority", "binpack", "elastic")


def test_elastic_job_starts_with_what_fits_then_grows() -> None:
    w = World(cluster(1), Scheduler(config(*EL)))
    w.start(job("x").gpus(5), n0=[0, 1, 2, 3, 4])
    plan = w.submit(job("el").gpus(1).replicas(4).elastic(2, 6)).step()
    assert len(bound(plan)["el"]) == 3  # at least its minimum of 2 to start
    w.finish("x")
    plan = w.step(60)
    [rz] = plan.resizes
    assert (rz.reason, rz.replicas_from, rz.replicas_to) == (ResizeReason.GROW, 3, 6)
    assert sorted(b.task_id for b in rz.binds) == ["w-3", "w-4", "w-5"]
    assert w.step(60).resizes == []  # at its maximum


def test_growth_stays_out_of_reservations() -> None:
    w = World(cluster(3), Scheduler(config(*EL, "backfill")), now=100)
    w.start(job("r").gpus(4).estimate(300), at=0, n0=[0, 1, 2, 3])
    w.start(job("el").gpus(1).replicas(1).elastic(1, 16).estimate(10_000), at=0, n1=[0])
    plan = w.submit(job("head").gpus(8).gang(2)).step()
    [res] = plan.reservations
    assert res.node_ids == ("n0", "n2")
    [rz] = plan.resizes
    assert {b.node_id for b in rz.binds} == {"n1"}
    assert rz.replicas_to == 8


def test_shrink_then_the_pending_job_starts() -> None:
    w = World(cluster(1), Scheduler(config(*EL)), now=100)
    w.start(job("el").gpus(2).replicas(1).elastic(1, 4), at=0, n0=[0, 1])
    w.allocations += [a.__class__("el", f"w-{r}", "n0", tuple(a.gpus[0].__class__(g) for g in (2 * r, 2 * r + 1)),
                                  0, 0, "w", "w") for r, a in ((1, w.allocations[0]), (2, w.allocations[0]),
                                                               (3, w.allocations[0]))]
    plan = w.submit(job("p").gpus(4)).step()
    [rz] = plan.resizes
    assert (rz.reason, rz.replicas_from, rz.replicas_to, rz.for_job) == (ResizeReason.SHRINK, 4, 2, "p")
    w.step(30)  # the agent stops the two replicas (World applies stop_task_ids at once)
    assert "p" in w.running
