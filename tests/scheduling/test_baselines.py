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
