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
    assert plan.blocked_by == {"l": "head"}  # the job whose reservation it would delay


def test_without_backfill_later_jobs_start_greedily() -> None:
    w = World(cluster(2), Scheduler(config("gang", "priority", "binpack")), now=100)
    w.start(job("r0").gpus(4).estimate(300), at=0, n0=[0, 1, 2, 3])
    w.start(job("r1").gpus(6).estimate(900), at=0, n1=[0, 1, 2, 3, 4, 5])
    plan = w.submit(job("head").gpus(8).submit(0), job("l").gpus(4).submit(50)).step()
    assert bound(plan) == {"l": ["n0"]}


def test_a_reservation_is_kept_for_the_interval_while_its_start_is_ahead(monkeypatch) -> None:
    """backfill.interval_s (Slurm's bf_interval): the head job's reservation is not
    searched again within the interval while its start is ahead; after that, or once
    the start has passed, it is."""
    from scheduling.actions import Backfill

    searches: list[float] = []
    original = Backfill.search

    def counting(self, session, info):  # type: ignore[no-untyped-def]
        searches.append(session.cycle.now)
        return original(self, session, info)

    monkeypatch.setattr(Backfill, "search", counting)
    w = World(cluster(2), Scheduler(config("gang", "priority", "binpack", ("backfill", {"interval_s": 600}))),
              now=100)
    w.start(job("r0").gpus(4).estimate(300), at=0, n0=[0, 1, 2, 3])  # expected to end at 300
    w.start(job("r1").gpus(6).estimate(900), at=0, n1=[0, 1, 2, 3, 4, 5])
    w.submit(job("head").gpus(8).submit(0))
    first = w.step().reservations
    assert [(r.start_time, r.node_ids) for r in first] == [(300, ("n0",))] and searches == [100]
    assert w.step(100).reservations == first and searches == [100]  # kept: 200 < 300
    later = w.step(150).reservations  # at 350 the start has passed: searched again
    assert searches == [100, 350] and later[0].start_time > 350
    # and the backfill rule still holds with a kept reservation: a short job fits before it
    w.submit(job("s").gpus(2).estimate(50).submit(360))
    assert set(bound(w.step(10))) == {"s"} and searches == [100, 350]


def test_without_an_interval_the_reservation_is_searched_every_cycle(monkeypatch) -> None:
    from scheduling.actions import Backfill

    calls: list[float] = []
    original = Backfill.search
    monkeypatch.setattr(Backfill, "search",
                        lambda self, session, info: calls.append(session.cycle.now) or original(self, session, info))
    w = world().submit(job("head").gpus(8).submit(0))
    w.step()
    w.step(50)
    assert calls == [100, 150]
