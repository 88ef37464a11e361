from __future__ import annotations

from scheduling import Scheduler, Snapshot
from sim.fill import (
    fill_config,
    gpu_capacity_milli,
    inflate,
    node_order,
    run_fill,
    to_job,
    workload_mix,
)
from sim.traces import OPENB, load_openb_nodes, load_openb_pods


def _small(slice_file):
    nodes = load_openb_nodes(slice_file(OPENB / "openb_node_list_gpu_node.csv", 30))
    pods = load_openb_pods(slice_file(OPENB / "openb_pod_list_default.csv", 120))
    return nodes, pods


def test_inflate_reaches_target_without_passing_it(slice_file):
    nodes, pods = _small(slice_file)
    cap = gpu_capacity_milli(nodes)
    tasks = inflate(pods, cap, seed=42)
    total = sum(p.gpu_request_milli for p in tasks)
    assert total <= 1.3 * cap
    assert inflate(pods, cap, seed=42) == tasks  # seeded
    few = inflate(pods, cap // 100, seed=1)  # the list asks for more: removed down to 130%
    assert sum(p.gpu_request_milli for p in few) <= 1.3 * (cap // 100)


def test_batched_fill_equals_one_call_per_task(slice_file):
    """All tasks in one snapshot (FIFO) place exactly as one online call per task."""
    nodes, pods = _small(slice_file)
    for policy in ("BestFit", "FGD", "Kairos"):
        batched = run_fill(nodes, pods, policy, seed=42)
        tasks = inflate(pods, gpu_capacity_milli(nodes), 42)
        shuffled = node_order(nodes, 42)  # the order the fill of seed 42 presents
        sched = Scheduler(fill_config(policy, 42))
        mix = workload_mix(pods)
        allocs: tuple = ()
        placed = 0
        from scheduling import Allocation
        for k, p in enumerate(tasks):
            plan = sched.schedule(Snapshot(0.0, shuffled, allocs, (to_job(k, p),), task_mix=mix))
            allocs = allocs + tuple(Allocation(b.job_id, b.task_id, b.node_id, b.gpus, b.cpu_milli, b.memory_mib)
                                    for b in plan.binds)
            placed += bool(plan.binds)
        assert placed == batched.placed, policy


def test_allocation_never_exceeds_arrived_or_capacity(slice_file):
    nodes, pods = _small(slice_file)
    r = run_fill(nodes, pods, "Random", seed=43)
    assert all(a <= b + 1e-9 for a, b in zip(r.allocated_pct, r.arrived_pct, strict=True))
    assert r.final_allocation_pct <= 100.0
    assert r.arrived_pct[-1] <= 130.0
