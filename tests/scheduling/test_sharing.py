"""GPU sharing and FGD (fragmentation gradient descent)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling import Scheduler, TaskShape
from scheduling.plugins.fgd import fragmentation, live_mix, typical_mix
from tests.scheduling.builders import World, bound, cluster, config, job, node

SHARE = ("gang", "priority", "binpack")


def test_shares_pack_onto_one_gpu_without_overcommit() -> None:
    jobs = [job(f"s{i}").share(20_000, 25) for i in range(5)]
    plan = World(cluster(1), Scheduler(config(*SHARE))).submit(*jobs).step()
    assert [b.gpus[0].index for b in plan.binds] == [0, 0, 0, 0, 1]


def test_memory_bounds_sharing_too() -> None:
    jobs = [job(f"s{i}").share(50_000, 10) for i in range(3)]
    plan = World(cluster(1), Scheduler(config(*SHARE))).submit(*jobs).step()
    assert [b.gpus[0].index for b in plan.binds] == [0, 1, 2]


SHARE70 = ((1.0, 0, 0, 70, 0, 0, None),)
WHOLE1 = ((1.0, 1, 0, 0, 0, 0, None),)
WHOLE2 = ((1.0, 2, 0, 0, 0, 0, None),)
M = 81920


@pytest.mark.parametrize(
    ("name", "gc", "gm", "mix", "expected"),
    [
        ("idle GPUs serve everything", [100, 100], [M, M], SHARE70, 0.0),
        ("a 40% leftover cannot host a 70% share", [100, 40], [M, M], SHARE70, 0.4),
        ("partial GPUs are fragments for whole-GPU tasks", [100, 50], [M, M], WHOLE1, 0.5),
        ("a 2-GPU task cannot run: all free is fragment", [100, 50], [M, M], WHOLE2, 1.5),
        ("memory matters too", [100, 100], [M, 1000], ((1.0, 0, 2000, 10, 0, 0, None),), 1.0),
        ("mix is a weighted sum", [100, 40], [M, M], ((0.5, 0, 0, 70, 0, 0, None), (0.5, 2, 0, 0, 0, 0, None)),
         0.5 * 0.4 + 0.5 * 1.4),
    ],
)
def test_fragmentation(name, gc, gm, mix, expected) -> None:
    f = fragmentation(gm, gc, [M, M], [True, True], [0, 0], 64_000, 512_000, mix)
    assert f == pytest.approx(expected), name


def test_fragmentation_counts_cpu_starved_nodes_whole() -> None:
    mix = ((1.0, 1, 0, 0, 8000, 0, None),)
    assert fragmentation([M], [100], [M], [True], [0], 4000, 1, mix) == 1.0


@pytest.mark.parametrize(("policy", "expected"), [("fgd", "n0"), ("bestfit", "n1")])
def test_fgd_keeps_room_for_the_common_task_where_best_fit_does_not(policy, expected) -> None:
    nodes = (node("n0").gpus(1).build(), node("n1").gpus(1).build())
    w = World(nodes, Scheduler(config("gang", "fifo", policy)))
    w.start(job("x").share(0, 30), n1=[0])
    snap = w.submit(job("a").share(0, 30)).snapshot()
    snap = replace(snap, task_mix=(TaskShape(1.0, gpu_compute_pct=70),))
    plan = w.scheduler.schedule(snap)
    assert bound(plan) == {"a": [expected]}


def test_fgd_chooses_the_gpu_inside_the_node() -> None:
    w = World((node("n0").gpus(2).build(),), Scheduler(config("gang", "fifo", "fgd")))
    w.start(job("x").share(0, 30), n0=[1])
    snap = replace(w.submit(job("a").share(0, 30)).snapshot(), task_mix=(TaskShape(1.0, gpu_compute_pct=70),))
    assert gpu_of(w.scheduler.schedule(snap)) == 0
    # with 40%-tasks common instead, packing onto the used GPU keeps both usable
    snap = replace(snap, task_mix=(TaskShape(1.0, gpu_compute_pct=40),))
    assert gpu_of(w.scheduler.schedule(snap)) == 1


def gpu_of(plan) -> int:
    return plan.binds[0].gpus[0].index


def test_typical_mix_keeps_the_popular_types() -> None:
    shapes = [TaskShape(50, gpu=1), TaskShape(30, gpu_compute_pct=50), *[TaskShape(1, gpu=k) for k in range(2, 22)],
              TaskShape(100, cpu_milli=4)]
    mix = typical_mix(shapes, popularity_pct=60, step=1)
    assert [(s.gpu, s.gpu_compute_pct) for s in mix] == [(1, 0), (0, 50)]
    assert sum(s.weight for s in mix) == pytest.approx(1.0)
    assert len(typical_mix(shapes, popularity_pct=60, step=10)) == 10


def test_the_live_mix_is_rounded_so_that_jobs_coming_and_going_keep_it() -> None:
    """Without Snapshot.task_mix the mix is the pending and running jobs': its shares
    are rounded (a new mix restarts the fragmentation memo and the kept scores)."""
    def mix_of(n_whole: int, n_half: int) -> list[TaskShape]:
        return live_mix(typical_mix([TaskShape(n_whole, gpu=1), TaskShape(n_half, gpu_compute_pct=50)],
                                    popularity_pct=100), 0.05)

    assert mix_of(700, 300) == mix_of(701, 300) == mix_of(690, 310)  # 70/30 stays 70/30
    assert [round(s.weight, 9) for s in mix_of(700, 300)] == [0.7, 0.3]
    assert mix_of(600, 400) != mix_of(700, 300)
    assert [s.gpu for s in mix_of(990, 10)] == [1]  # a 1% type is dropped
    one = [TaskShape(0.01, gpu=1)]
    assert live_mix(one, 0.05) == one  # rounding would drop every type: kept as it is
    assert live_mix(one, 0.0) == one


def test_fgd_scores_survive_a_small_change_of_the_live_mix() -> None:
    from scheduling import SchedulerConfig, Snapshot

    sched = Scheduler(SchedulerConfig.preset("fgd"))
    fgd = next(p for p in sched.plugins if p.name == "fgd")
    nodes = cluster(2)
    pending = (*(job(f"w{k}").gpus(1).submit(k).build() for k in range(28)),
               *(job(f"s{k}").share(compute_pct=50).submit(k).build() for k in range(12)))
    sched.schedule(Snapshot(0.0, nodes, (), pending))
    mix, memo = fgd.mix, fgd.frag_memo
    assert len(mix) == 2 and memo  # 70 / 30, and fragmentation computed for the nodes seen
    sched.schedule(Snapshot(0.0, nodes, (), pending[1:]))  # 27 / 12 is still 70 / 30
    assert fgd.mix == mix and fgd.frag_memo is memo


def test_a_live_mix_that_comes_back_resumes_its_memos_and_plans_as_a_fresh_scheduler() -> None:
    """FGD's memos and the kept placement scores are stashed per workload mix: going
    back to an earlier mix takes its memos back (same generation, so the same score
    epoch), and the plan is the one a scheduler that never saw the other mix makes."""
    from scheduling import SchedulerConfig, Snapshot

    nodes = cluster(2)
    pending = (*(job(f"w{k}").gpus(1).submit(k).build() for k in range(28)),
               *(job(f"s{k}").share(compute_pct=50).submit(k).build() for k in range(12)))
    other = pending[:14] + pending[28:]  # 14 / 12: about 55 / 45, another mix
    sched = Scheduler(SchedulerConfig.preset("fgd"))
    fgd = next(p for p in sched.plugins if p.name == "fgd")
    sched.schedule(Snapshot(0.0, nodes, (), pending))
    first, memo = (fgd.mix, fgd.generation), fgd.frag_memo
    sched.schedule(Snapshot(0.0, nodes, (), other))
    assert fgd.mix != first[0] and fgd.generation != first[1]
    plan = sched.schedule(Snapshot(0.0, nodes, (), pending))
    assert (fgd.mix, fgd.generation) == first and fgd.frag_memo is memo
    assert plan == Scheduler(SchedulerConfig.preset("fgd")).schedule(Snapshot(0.0, nodes, (), pending))
