"""EASY backfill with runtime estimates and a reservation for the blocked head job."""

from __future__ import annotations

import pytest

from scheduling import PendingReason, Scheduler
from tests.scheduling.builders import World, bound, cluster, config, job


def world() -> World:
    w = World(cluster(2), Scheduler(config("gang", "priority", "binpack", "backfill")), now=100)
    w.start(job("r0").gpus(4).estimate(300), at=0, n0=[0, 1, 2, 3])  # ends at 300
    w.start(job("r1").gpus(6).estimate(900), at=0, n1=[0, 1, 2, 3, 4, 5])  # ends at 900
    return w


def test_head_job_gets_a_reservation() -> None:
    w = world().submit(job("head").gpus(8).submit(0))
    plan = w.step()
    [res] = plan.reservations
    assert (res.job_id, res.start_time, res.node_ids) == ("head", 300, ("n0",))
    assert plan.pending == {"head": PendingReason.NO_FIT}


@pytest.mark.parametrize(
    ("name", "later", "placed_on"),
    [
        ("short job backfills the reserved node", job("s").gpus(4).estimate(100), "n0"),
        ("long job goes elsewhere", job("l").gpus(2).estimate(5000), "n1"),
        ("no estimate goes elsewhere", job("u").gpus(2), "n1"),
    ],
)
def test_later_jobs_do_not_delay_the_head(name, later, placed_on) -> None:
    w = world().submit(job("head").gpus(8).submit(0), later.submit(50))
    plan = w.step()
    jid = later.build().job_id
    assert bound(plan) == {jid: [placed_on]}, name


def test_long_job_that_only_fits_on_reserved_nodes_waits() -> None:
    w = world().submit(job("head").gpus(8).submit(0), job("l").gpus(4).estimate(5000).submit(50))
    plan = w.step()
    assert plan.binds == []
    assert plan.pending == {"head": PendingReason.NO_FIT, "l": PendingReason.BACKFILL_BLOCKED}


def test_without_backfill_later_jobs_start_greedily() -> None:
    w = World(cluster(2), Scheduler(config("gang", "priority", "binpack")), now=100)
    w.start(job("r0").gpus(4).estimate(300), at=0, n0=[0, 1, 2, 3])
    w.start(job("r1").gpus(6).estimate(900), at=0, n1=[0, 1, 2, 3, 4, 5])
    plan = w.submit(job("head").gpus(8).submit(0), job("l").gpus(4).submit(50)).step()
    assert bound(plan) == {"l": ["n0"]}
