"""FGD as the public simulator runs it (hkust-adsl/kubernetes-scheduler-simulator, the
FGD paper's artifact): small cases computed by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling import Scheduler, TaskShape
from scheduling.plugins.fgd import Fgd, FgdArgs, fragmentation, typical_mix
from tests.scheduling.builders import World, bound, config, job, node

M = 81920
SHARE30, WHOLE2, CPU2 = (0.5, 0, 0, 30, 1000, 0, None), (0.3, 2, 0, 0, 4000, 0, None), (0.2, 0, 0, 0, 2000, 0, None)


def frag(gc: list[int], cpu: int, mix: tuple) -> float:
    n = len(gc)
    return fragmentation([M] * n, gc, [M] * n, [True] * n, [0] * n, cpu, 512_000, mix)


def test_a_nodes_fragmentation_for_a_task_distribution() -> None:
    """4 GPUs with 100, 100, 50, 20% free, 8 cores; half the tasks a 30% share, 30% two
    whole GPUs, 20% CPU-only. The share fits GPUs 0-2: GPU 3's 0.2 is its fragment; the
    2-GPU task fits the idle pair: 0.5 + 0.2 are its fragments; a CPU-only task uses no
    GPU: all 2.7 free GPUs are fragments for it (the reference counts them too)."""
    assert frag([100, 100, 50, 20], 8000, (SHARE30, WHOLE2, CPU2)) == pytest.approx(
        0.5 * 0.2 + 0.3 * 0.7 + 0.2 * 2.7)  # 0.85


def test_a_type_short_of_cpu_sees_every_free_gpu_as_fragment() -> None:
    """With 3 cores the 2-GPU task (4 cores) cannot run here: 2.7 GPUs, not 0.7."""
    assert frag([100, 100, 50, 20], 3000, (SHARE30, WHOLE2, CPU2)) == pytest.approx(
        0.5 * 0.2 + 0.3 * 2.7 + 0.2 * 2.7)  # 1.45


def test_fragmentation_is_in_gpus_not_normalised_by_the_node() -> None:
    """The score compares absolute GPU amounts: a half-used GPU is 0.5 GPU of fragment on
    a 2-GPU node and on an 8-GPU one (the reference's -norm max normalises DotProd's
    vectors; FGD's score reads no normalisation)."""
    whole1 = ((1.0, 1, 0, 0, 0, 0, None),)
    assert frag([100, 50], 64_000, whole1) == frag([100] * 7 + [50], 64_000, whole1) == 0.5


@pytest.mark.parametrize(("d", "score"), [(0.0, 50), (0.01, 49), (-0.003, 50), (-1.0, 73), (1.0, 26), (1e6, 0)])
def test_the_paper_score_is_the_integer_sigmoid_of_the_decrease(d, score) -> None:
    """int(100 * sigmoid(F_before - F_after)): an increase of F of 0.01 GPU already drops
    a node from 50 to 49, while one GPU less of F lifts it to 73 only."""
    assert Fgd(FgdArgs(score="paper")).paper_score(d) == score


def test_a_cpu_only_task_goes_where_its_cpu_strands_no_gpu() -> None:
    """Every task wants one GPU and 4 of the node's 8 cores. A 6-core CPU-only task on n0
    (its GPU free) leaves 2 cores: its GPU can no longer be used, F rises by 1 GPU (score
    26). On n1, whose GPU is taken, F stays 0 (score 50): FGD puts it there, although n0
    comes first."""
    nodes = (node("n0").gpus(1).cpu(8000).build(), node("n1").gpus(1).cpu(8000).build())
    w = World(nodes, Scheduler(config("gang", "fifo", ("fgd", {"score": "paper"}))))
    w.start(job("x").gpus(1), n1=[0])
    snap = replace(w.submit(job("c").cpu(6000)).snapshot(), task_mix=(TaskShape(1.0, gpu=1, cpu_milli=4000),))
    assert bound(w.scheduler.schedule(snap)) == {"c": ["n1"]}


@pytest.mark.parametrize(("gpu_pick", "gpu"), [("paper", 0), ("exact", 2)])
def test_a_shares_gpu_is_the_first_of_the_best_paper_score(gpu_pick, gpu) -> None:
    """GPUs 100, 100, 60% free; a 10% share; 97% of tasks are 20% shares, 3% 65% ones.
    On GPU 2 (60 -> 50%) F falls by 0.003 (its 60% was already too small for a 65%
    share), on GPU 0 or 1 it stays: all three score 50. The reference takes the first,
    GPU 0; the exact choice takes GPU 2."""
    w = World((node("n0").gpus(3).build(),), Scheduler(config(
        "gang", "fifo", ("fgd", {"score": "paper", "gpu_pick": gpu_pick}))))
    w.start(job("x").share(0, 40), n0=[2])
    snap = replace(w.submit(job("a").share(0, 10)).snapshot(),
                   task_mix=(TaskShape(0.97, gpu_compute_pct=20), TaskShape(0.03, gpu_compute_pct=65)))
    assert w.scheduler.schedule(snap).binds[0].gpus[0].index == gpu


def test_equally_popular_types_are_kept_in_the_references_order() -> None:
    """60% of 20 tasks: the 50% share (10) and one of the two 5-task types. The reference
    ranks equal counts by more CPU first, then the larger per-GPU share, then more GPUs."""
    shapes = [TaskShape(10, gpu_compute_pct=50, cpu_milli=1000), TaskShape(5, gpu=1, cpu_milli=4000),
              TaskShape(5, gpu=1, cpu_milli=8000)]
    kept = typical_mix(shapes, popularity_pct=60, step=1, include_cpu=True, ties="paper")
    assert [(s.gpu_compute_pct, s.cpu_milli) for s in kept] == [(50, 1000), (0, 8000)]
    assert typical_mix(shapes, popularity_pct=60, step=1, include_cpu=True)[1].cpu_milli == 4000  # repr order
    same_cpu = [TaskShape(10, gpu_compute_pct=50), TaskShape(5, gpu_compute_pct=60), TaskShape(5, gpu=1),
                TaskShape(5, gpu=2)]
    kept = typical_mix(same_cpu, popularity_pct=50, step=1, ties="paper")
    assert [(s.gpu, s.gpu_compute_pct) for s in kept] == [(0, 50), (2, 0)]  # 2 whole GPUs before 1, before a 60% share
