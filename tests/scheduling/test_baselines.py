"""Research baselines as plugins of the same core: FIFO, SJF, SRTF, Tiresias, DRF,
Random, BestFit, FGD."""

from __future__ import annotations

import pytest

from scheduling import Scheduler, SchedulerConfig
from scheduling.config import PRESETS
from tests.scheduling.builders import World, bound, cluster, config, job

JOBS = [
    job("a").gpus(4).submit(0).estimate(500).attained(7200),
    job("b").gpus(2).submit(1).estimate(100),
    job("c").gpus(1).submit(2),
    job("d").tenant("t2").gpus(1).submit(3).estimate(50),
]


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("fifo", ["a", "b", "c", "d"]),
        ("sjf", ["d", "b", "a", "c"]),
        ("srtf", ["a", "d", "b", "c"]),  # a did 7200 GPU-s / 4 GPUs = 1800 s of its 500: none left
        ("tiresias", ["b", "c", "d", "a"]),  # a attained 7200 GPU-s: second queue
        ("drf", ["d", "a", "b", "c"]),  # t2's share after d is 1/8; default's grow 4/8, 6/8, 7/8
    ],
)
def test_orders(preset, expected) -> None:
    w = World(cluster(1), Scheduler(SchedulerConfig.preset(preset))).submit(*JOBS)
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == expected


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_schedules_and_is_deterministic(preset) -> None:
    def run():
        w = World(cluster(3, per_rack=2), Scheduler(SchedulerConfig.preset(preset)), now=50)
        w.start(job("x").share(10_000, 30), n1=[2])
        return w.submit(*JOBS, job("g").gpus(8).gang(2).submit(4)).step()

    first = run()
    assert first.binds
    assert run() == first


def test_random_placement_depends_on_the_seed_only() -> None:
    def nodes(seed: int) -> list[str]:
        w = World(cluster(16), Scheduler(SchedulerConfig.preset("random", seed=seed)))
        return [b.node_id for b in w.submit(*[job(f"j{i}").gpus(1) for i in range(8)]).step().binds]

    assert nodes(1) == nodes(1)
    assert nodes(1) != nodes(2)


def test_best_fit_fills_the_fullest_node() -> None:
    w = World(cluster(3), Scheduler(config("gang", "fifo", "bestfit")))
    w.start(job("x").gpus(6), n1=list(range(6)))
    w.start(job("y").gpus(3), n2=list(range(3)))
    assert bound(w.submit(job("a").gpus(2)).step()) == {"a": ["n1"]}


SRPT_JOBS = [
    job("long").gpus(1).submit(0).estimate(10_000),
    job("wide").gpus(8).submit(1).estimate(600),  # 4,800 GPU-s
    job("short").gpus(1).submit(2).estimate(60),
    job("unknown").gpus(1).submit(3),  # no estimate: unknown_s (3,600 s)
    job("overran").gpus(2).submit(4).estimate(100).attained(2 * 1000),  # ran 1,000 s of 100: as long again
]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, ["short", "overran", "unknown", "wide", "long"]),  # GPU-seconds left: 60, 2000, 3600, 4800, 10000
        ({"by": "time"}, ["short", "wide", "overran", "unknown", "long"]),  # seconds left: 60, 600, 1000, 3600, 10000
        ({"unknown_s": 100}, ["short", "unknown", "overran", "wide", "long"]),
    ],
)
def test_srpt_orders_by_expected_service_left(args, expected) -> None:
    w = World(cluster(1), Scheduler(config("gang", ("srpt", args))), now=50).submit(*SRPT_JOBS)
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == expected


def test_srpt_ages_by_the_response_ratio() -> None:
    """A long job that waited a day overtakes a shorter one just submitted, and is not
    overtaken without aging."""
    jobs = [job("old").gpus(1).submit(0).estimate(10_000), job("new").gpus(1).submit(86_000).estimate(1_000)]
    for args, expected in (({"aging_s": 3600.0}, ["old", "new"]), ({}, ["new", "old"])):
        w = World(cluster(1), Scheduler(config("gang", ("srpt", args))), now=86_400).submit(*jobs)
        assert [j.job_id for j in w.scheduler.order(w.snapshot())] == expected


def test_srpt_preempts_only_a_job_expected_to_hold_far_longer() -> None:
    from scheduling import PreemptReason

    for est, preempted in ((100_000, ["long"]), (2_000, [])):  # 8 x 100,000 vs 8 x 1,000 GPU-s; ratio 4
        w = World(cluster(1), Scheduler(config("gang", "srpt", "binpack")), now=10)
        w.start(job("long").gpus(8).estimate(est), at=0, n0=list(range(8)))
        plan = w.submit(job("short").gpus(8).estimate(1_000)).step()
        assert [p.job_id for p in plan.preemptions] == preempted
        assert all(p.reason == PreemptReason.SRTF for p in plan.preemptions)


def test_srpt_does_not_preempt_a_job_that_starved_before_it_started() -> None:
    """A long job that waited past the starvation bound, then started, is not stopped for
    shorter work: it would queue again, starve again and go first again, in a loop."""
    cfg = config("gang", ("priority", {"starvation_bound_s": 3600.0}), "srpt", "binpack")
    for submitted, preempted in ((-100, ["long"]), (-7200, [])):  # waited 100 s, or 2 h, before its start at 0
        w = World(cluster(1), Scheduler(cfg), now=10)
        w.start(job("long").gpus(8).estimate(100_000).submit(submitted), at=0, n0=list(range(8)))
        plan = w.submit(job("short").gpus(8).estimate(1_000).submit(5)).step()
        assert [p.job_id for p in plan.preemptions] == preempted


def test_the_default_preset_ranks_by_expected_run_time_left() -> None:
    """Kairos' default: srpt by time (on the whole Philly trace, 64 x 8, 7.08 h average
    JCT against 7.88 h by GPU-seconds left: a wide job is not put behind every narrow one)."""
    w = World(cluster(1), Scheduler(), now=50).submit(*SRPT_JOBS)
    assert [j.job_id for j in w.scheduler.order(w.snapshot())] == ["short", "wide", "overran", "unknown", "long"]


def test_a_job_whose_victim_search_found_nothing_sits_out_the_next_cycle() -> None:
    """The preemption budget goes to the jobs behind a blocked job that found no victims
    (else the same head jobs would spend it every cycle and nobody behind would look);
    the cycle after, it searches again."""
    cfg = config("gang", ("srpt", {"by": "time"}), "binpack", preemption={"max_preemptors_per_cycle": 1})
    w = World(cluster(2), Scheduler(cfg), now=10)
    w.start(job("long").gpus(8).estimate(100_000), at=0, n0=list(range(8)))
    w.start(job("pinned").gpus(8).estimate(100_000).not_preemptible(), at=0, n1=list(range(8)))
    # the wide job goes first (1,000 s) but cannot get both nodes; the short one could
    w.submit(job("wide").gpus(8).gang(2).estimate(1_000).submit(0), job("short").gpus(8).estimate(2_000).submit(1))
    assert w.step().preemptions == []  # wide spent the budget and found nothing
    assert [p.job_id for p in w.step(10).preemptions] == ["long"]  # wide sits out: short looks
