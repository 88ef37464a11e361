"""Kairos' packing plugin (``kairos``): FGD's fragmentation plus CPU stranding and the
expected leftover of a shared GPU. Each case is one where FGD places differently."""

from __future__ import annotations

import pytest

from scheduling import (
    Allocation,
    ConfigError,
    GpuSlot,
    GpuUse,
    Node,
    Scheduler,
    SchedulerConfig,
    Snapshot,
)
from scheduling.model import TaskShape
from scheduling.plugins.kairos_pack import cpu_per_gpu, hole_values
from tests.scheduling.builders import job


def _node(name: str, gpus: int, cpu: int) -> Node:
    return Node(name, cpu, 1_000_000, [GpuSlot(i, f"{name}-{i}", "V100") for i in range(gpus)])


def _place(spec: dict, nodes: tuple[Node, ...], j, mix, held: tuple[Allocation, ...] = ()):
    cfg = SchedulerConfig.load({"plugins": [{"name": "gang"}, {"name": "fifo"}, spec],
                                "preemption": {"enabled": False}})
    plan = Scheduler(cfg).schedule(Snapshot(0.0, nodes, held, (j,), task_mix=mix))
    assert len(plan.binds) == 1
    b = plan.binds[0]
    return b.node_id, [(u.index, u.compute_pct) for u in b.gpus]


# An 8-GPU node with 12 cores per GPU (first in the list) and a CPU-rich 2-GPU node;
# the workload's GPU tasks ask 11 cores per GPU.
BIG, RICH = _node("a-big", 8, 96_000), _node("b-rich", 2, 104_000)
GPU_MIX = (TaskShape(1.0, gpu=1, cpu_milli=11_000),)


@pytest.mark.parametrize(
    ("case", "task", "fgd", "kairos"),
    [
        # 64 cores left for 8 GPUs that want 88: ~2.2 GPUs stranded on a-big, none on b-rich.
        # FGD sees every single task type still fit on a-big, a tie, so the first node.
        ("cpu-only task", job("c").cpu(32_000).build(), "a-big", "b-rich"),
        # 24 cores for one GPU: a-big's 7 other GPUs would be left 72 cores (they want 77)
        ("CPU-hungry GPU task", job("h").gpus(1).cpu(24_000).build(), "a-big", "b-rich"),
        # 2 cores for one GPU strands nothing anywhere: both agree (ties: first node)
        ("CPU-light GPU task", job("l").gpus(1).cpu(2_000).build(), "a-big", "a-big"),
    ],
)
def test_cpu_stranding_moves_cpu_heavy_tasks_to_cpu_rich_nodes(case, task, fgd, kairos) -> None:
    assert _place({"name": "fgd"}, (BIG, RICH), task, GPU_MIX)[0] == fgd, case
    assert _place({"name": "kairos"}, (BIG, RICH), task, GPU_MIX)[0] == kairos, case


def test_cpu_stranding_can_be_switched_off() -> None:
    task = job("c").cpu(32_000).build()
    spec = {"name": "kairos", "args": {"cpu_weight": 0}}
    assert _place(spec, (BIG, RICH), task, GPU_MIX)[0] == "a-big"


def test_hole_values_follow_the_mix() -> None:
    mix = ((0.5, 1, 0, 0, 4000, 0, None), (0.3, 0, 0, 47, 2000, 0, None),
           (0.2, 0, 0, 32, 2000, 0, None), (0.1, 0, 0, 0, 8000, 0, None))
    v = hole_values(mix)
    assert v[0] == 0.0
    assert v[20] == 20.0  # nothing in the mix fits a 20% hole: all of it is lost
    assert v[100] < v[68]  # a free GPU may still take a whole-GPU task
    # a 53% hole waits for a common 47% share (6% left): worth more than a 21% hole
    assert v[53] == pytest.approx(0.6 * 6 + 0.4 * 21)
    assert v[53] < v[21]
    # cores per GPU over the GPU tasks only (the CPU-only type is left out)
    assert cpu_per_gpu(mix) == pytest.approx((0.5 * 4000 + 0.5 * 2000) / (0.5 + 0.3 * 0.47 + 0.2 * 0.32))
    assert cpu_per_gpu(((1.0, 0, 0, 0, 8000, 0, None),)) == float("inf")


# openb-like shares: 47% common, 32% and 65% rarer, half the tasks whole GPUs
SHARE_MIX = (TaskShape(0.5, gpu=1, cpu_milli=1000), TaskShape(0.3, gpu_compute_pct=47, cpu_milli=1000),
             TaskShape(0.1, gpu_compute_pct=32, cpu_milli=1000),
             TaskShape(0.1, gpu_compute_pct=65, cpu_milli=1000))


@pytest.mark.parametrize(
    ("spec", "gpu"),
    [
        # FGD: the 32% share into GPU 1's 53% hole (left by a 47% share): 21% stays,
        # which nothing in the mix fits
        ({"name": "fgd"}, 1),
        # Kairos: GPU 0 (a 32% share on it, 68% free): 36% stays for another 32%,
        # and GPU 1 keeps its 53% for the next, common, 47% share (6% lost)
        ({"name": "kairos"}, 0),
        ({"name": "kairos", "args": {"hole_weight": 0}}, 1),  # without V: FGD's choice
    ],
)
def test_hole_value_chooses_the_gpu_for_a_share(spec, gpu) -> None:
    n = _node("n", 2, 64_000)
    held = (Allocation("x", "x-0", "n", (GpuUse(0, 0, 32),), 1000, 0),
            Allocation("y", "y-0", "n", (GpuUse(1, 0, 47),), 1000, 0))
    task = job("s").share(compute_pct=32).cpu(1000).build()
    assert _place(spec, (n,), task, SHARE_MIX, held) == ("n", [(gpu, 32)])


def test_args_are_validated() -> None:
    with pytest.raises(ConfigError, match="hole_weight"):
        SchedulerConfig.load({"plugins": [{"name": "kairos", "args": {"hole_weight": -1}}]})
    with pytest.raises(ConfigError, match="dead_hole_pct"):
        SchedulerConfig.load({"plugins": [{"name": "kairos", "args": {"dead_hole_pct": 101}}]})


def test_default_preset_packs_with_kairos_and_runs_without_a_task_mix() -> None:
    assert "kairos" in [p.name for p in SchedulerConfig.preset("default").plugins]
    plan = Scheduler().schedule(Snapshot(0.0, (BIG, RICH), (), (job("c").cpu(32_000).build(),
                                                               job("g").gpus(1).cpu(11_000).build())))
    assert {b.job_id for b in plan.binds} == {"c", "g"}
