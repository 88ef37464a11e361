"""Gang (all-or-nothing) placement scenarios."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling import PendingReason, Scheduler, Snapshot, first_fit
from tests.scheduling.builders import World, bound, cluster, config, job

BASE = ("gang", "priority", "binpack")


@pytest.mark.parametrize(
    ("name", "nodes", "jobs", "placed", "reasons"),
    [
        ("fits across two nodes", 2, [job("a").gpus(8).gang(2)], {"a": 2}, {}),
        ("too big waits whole", 2, [job("a").gpus(8).gang(3)], {}, {"a": PendingReason.NEVER_FITS}),
        # x, ahead of it in the order, took the room it would fit in: it waits behind x
        ("partial fit holds nothing", 2,
         [job("x").gpus(8), job("a").gpus(8).gang(2)], {"x": 1}, {"a": PendingReason.PRIORITY}),
        ("minAvailable starts the minimum", 2,
         [job("x").gpus(8), job("a").gpus(4).gang(4).min_available(2)], {"x": 1, "a": 2}, {}),
        ("a share and whole GPUs in one gang", 1,
         [job("a").gpus(4).task("eval").share(1000, 50)], {"a": 2}, {}),
    ],
)
def test_gang_scenarios(name, nodes, jobs, placed, reasons) -> None:
    w = World(cluster(nodes), Scheduler(config(*BASE))).submit(*jobs)
    plan = w.step()
    assert {j: len(n) for j, n in bound(plan).items()} == placed, name
    assert plan.pending == reasons, name


def test_two_gangs_that_each_need_most_of_the_cluster_do_not_deadlock() -> None:
    w = World(cluster(4), Scheduler(config(*BASE))).submit(
        job("a").gpus(8).gang(3).submit(0), job("b").gpus(8).gang(3).submit(1))
    plan = w.step()
    assert set(bound(plan)) == {"a"}
    # a, placed first, took the room b would fit in: b waits behind a
    assert (plan.pending, plan.blocked_by) == ({"b": PendingReason.PRIORITY}, {"b": "a"})
    # b holds nothing while it waits, and starts as soon as a is done
    assert w.nodes_of("b") == set()
    # while a runs, b simply has no room (no order would help)
    assert w.step(5).pending == {"b": PendingReason.GANG_INCOMPLETE}
    w.finish("a")
    assert set(bound(w.step(10))) == {"b"}


def test_without_the_gang_plugin_replicas_start_one_by_one() -> None:
    w = World(cluster(2), Scheduler(config("priority", "binpack"))).submit(
        job("x").gpus(8), job("a").gpus(8).gang(2))
    plan = w.step()
    assert len(bound(plan)["a"]) == 1


def test_snapshot_positional_constructor_and_first_fit_still_work() -> None:
    snap = Snapshot(0.0, cluster(1), (), (job("a").gpus(4).gang(2).build(), job("b").gpus(1).build()))
    plan = first_fit(snap)
    assert [b.task_id for b in plan.binds] == ["w-0", "w-1"]
    assert plan.pending == {"b": PendingReason.NO_FIT}
    # the default preset starts the shortest expected run time first (srpt by time); with
    # no estimates the two tie and go in snapshot order: a's gang fills the node, and b
    # waits behind a
    assert Scheduler().schedule(snap).pending == {"b": PendingReason.PRIORITY}
    # with b known to be short, b goes first and a's gang cannot fit: behind b
    short = replace(snap, pending=(snap.pending[0], replace(snap.pending[1], runtime_estimate_s=60.0)))
    plan = Scheduler().schedule(short)
    assert (plan.pending, plan.blocked_by) == ({"a": PendingReason.PRIORITY}, {"a": "b"})


def test_allocations_on_nodes_gone_from_the_inventory_are_ignored() -> None:
    w = World(cluster(1), Scheduler())
    w.start(job("ghost").klass("low").gpus(8), n9=list(range(8)))
    w.start(job("low").klass("low").gpus(8), n0=list(range(8)))
    plan = w.submit(job("hi").klass("high").gpus(8)).step()
    assert [p.job_id for p in plan.preemptions] == ["low"]
