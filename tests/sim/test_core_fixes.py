"""Core changes the simulator needed, each pinned by a small case."""

from __future__ import annotations

from scheduling import GpuSlot, Node, Scheduler, SchedulerConfig, Snapshot
from scheduling.model import TaskShape
from tests.scheduling.builders import job


def _node(name: str, gpus: int, cpu: int) -> Node:
    return Node(name, cpu, 1_000_000, [GpuSlot(i, f"{name}-{i}", "V100") for i in range(gpus)])


def _cfg(placement: dict) -> SchedulerConfig:
    return SchedulerConfig.load({"plugins": [{"name": "gang"}, {"name": "fifo"}, placement],
                                 "preemption": {"enabled": False}})


def test_bestfit_normalises_by_the_largest_spec_not_per_node():
    # After one GPU: the empty 2-GPU node has 1 GPU left (half of it), the 8-GPU node
    # with 4 busy has 3 left (3/8 of it). Per-node ratios would pick the big node; the
    # paper's BestFit counts absolute leftovers (/ 8 GPUs, / 128 cores) and picks the small.
    from scheduling import Allocation, GpuUse
    small, big = _node("a-small", 2, 64_000), _node("b-big", 8, 64_000)
    held = (Allocation("x", "x-0", "b-big", tuple(GpuUse(i) for i in range(4)), 0, 0),)
    plan = Scheduler(_cfg({"name": "bestfit"})).schedule(
        Snapshot(0.0, (small, big), held, (job("j").gpus(1).build(),)))
    assert plan.binds[0].node_id == "a-small"


def test_fgd_places_cpu_tasks_where_they_strand_no_gpu():
    # node a: an idle GPU that a CPU-hungry task would strand; node b: its GPU is busy
    from scheduling import Allocation, GpuUse
    a, b = _node("a", 1, 16_000), _node("b", 1, 16_000)
    mix = (TaskShape(1.0, gpu=1, cpu_milli=8_000),)
    held = (Allocation("g", "g-0", "b", (GpuUse(0),), 1_000, 0),)
    plan = Scheduler(_cfg({"name": "fgd"})).schedule(
        Snapshot(0.0, (a, b), held, (job("c").cpu(12_000).build(),), task_mix=mix))
    assert plan.binds[0].node_id == "b"  # on a it would leave 4 cores: a's GPU stranded


def test_fgd_paper_score_is_integer_and_ties_go_to_first_node():
    nodes = (_node("a", 8, 96_000), _node("b", 8, 96_000))
    mix = (TaskShape(1.0, gpu=1, cpu_milli=1_000),)
    sched = Scheduler(_cfg({"name": "fgd", "args": {"score": "paper"}}))
    plan = sched.schedule(Snapshot(0.0, nodes, (), (job("j").gpus(1).cpu(1_000).build(),), task_mix=mix))
    assert plan.binds[0].node_id == "a"
