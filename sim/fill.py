"""The FGD paper's "fill" experiment on Alibaba openb, through the scheduling core.

Protocol (data/traces/SOURCE_README.md, as FGD's public simulator runs it): inflate the
task list by drawing tasks uniformly with replacement while the next one keeps the total
GPU request within 130% of capacity (or remove tasks at random until it is within 130%),
shuffle with the seed, place the tasks one at a time, online, with no departures,
honouring CPU, memory, GPU model and GPU capacity; a task that fits nowhere is skipped.
Record allocated milli-GPU / capacity against arrived GPU request.

The nodes are in a seeded random order (``node_order``), the same for every policy: the
public simulator prefixes each node's name with a random permutation index, and its
scheduler takes the first node of the best score, so ties (many: FGD's integer score
and BestFit's leave whole classes of nodes equal) go to the first node of a random
order fixed for the run. In the file's order (sorted by name: 2-GPU P100 nodes first)
ties pile CPU-only tasks onto the same few nodes: FGD loses 1.7 points on a list with
25% CPU-only tasks (cpu250, 91.9 against the published 93.4).

Placement is the core's (``Scheduler`` with a preset: random, bestfit, fgd, or Kairos');
no second implementation lives here. All tasks go to the core in one snapshot, ordered
FIFO by arrival index: the core places them one after the other on the state left by the
previous ones, which is online placement (nothing looks at later tasks; FGD's workload
mix is the trace's, passed as ``Snapshot.task_mix``, as FGD's simulator does). Preemption
is off (a fill has no priorities) and the failure memo is exact because capacity only
shrinks. ``tests/sim/test_fill.py`` checks that this equals one call per task.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduling import JobRequest, Node, Plan, Scheduler, SchedulerConfig, Snapshot, TaskRequest
from scheduling.model import TaskShape
from scheduling.plugins.fgd import typical_mix
from sim.traces import OpenbPod

TARGET = 1.30
POLICIES = ("Random", "BestFit", "FGD", "Kairos")


def gpu_capacity_milli(nodes: Sequence[Node]) -> int:
    return 1000 * sum(1 for n in nodes for g in n.gpus if g.healthy)


def inflate(pods: Sequence[OpenbPod], capacity_milli: int, seed: int, target: float = TARGET) -> list[OpenbPod]:
    """The workload of one seed: sampled up (or down) to ``target`` x capacity, shuffled."""
    rng = random.Random(seed)
    tasks = list(pods)
    limit = target * capacity_milli
    total = sum(p.gpu_request_milli for p in tasks)
    if total > limit:
        while total > limit and tasks:
            total -= tasks.pop(rng.randrange(len(tasks))).gpu_request_milli
    else:
        while True:
            p = pods[rng.randrange(len(pods))]
            if total + p.gpu_request_milli > limit:
                break
            tasks.append(p)
            total += p.gpu_request_milli
    rng.shuffle(tasks)
    return tasks


def node_order(nodes: Sequence[Node], seed: int) -> tuple[Node, ...]:
    """The nodes as the fill of ``seed`` presents them: a seeded random permutation
    (its own stream: the workload's draws stay those of ``inflate``)."""
    perm = np.random.default_rng([seed, 1]).permutation(len(nodes))
    return tuple(nodes[int(i)] for i in perm)


def to_job(k: int, p: OpenbPod) -> JobRequest:
    if p.shared:
        t = TaskRequest("p", "worker", 1, gpu_compute_pct=p.gpu_milli // 10, cpu_milli=p.cpu_milli,
                        memory_mib=p.memory_mib)
    else:
        t = TaskRequest("p", "worker", 1, gpu=p.num_gpu, cpu_milli=p.cpu_milli, memory_mib=p.memory_mib)
    return JobRequest(f"t{k:06d}", (t,), submit_time=float(k), gpu_models=p.gpu_models)


def workload_mix(pods: Sequence[OpenbPod]) -> tuple[TaskShape, ...]:
    """FGD's target workload as the paper's simulator builds it (typicalPodsConfig:
    CPU tasks included, the most popular types one at a time until they cover 95%,
    equally popular ones in its order)."""
    shapes = [TaskShape(1.0, 0 if p.shared else p.num_gpu, 0, p.gpu_milli // 10 if p.shared else 0,
                        p.cpu_milli, 0, p.gpu_models) for p in pods]
    return tuple(typical_mix(shapes, popularity_pct=95.0, step=1, include_cpu=True, ties="paper"))


_BASE = ({"name": "gang"}, {"name": "nodeaffinity"}, {"name": "gpumodel"}, {"name": "fifo"})
# Placement of each policy: the core's plugins, configured. FGD scores as the paper's
# simulator does (integer sigmoid score, ties to the first node, a share's GPU the first
# of the best score); Kairos' packing is the
# ``kairos`` plugin: FGD's fragmentation plus CPU stranding and the expected leftover of
# a shared GPU (scheduling/plugins/kairos_pack.py).
PLACEMENT: dict[str, tuple[dict[str, object], ...]] = {
    "Random": ({"name": "random"},),
    "BestFit": ({"name": "bestfit"},),
    "FGD": ({"name": "fgd", "args": {"score": "paper", "levels": 100, "gpu_pick": "paper"}},),
    "Kairos": ({"name": "kairos"},),
}


def fill_config(policy: str, seed: int) -> SchedulerConfig:
    """The core's config for a fill: one placement policy, FIFO, no preemption."""
    return SchedulerConfig.load({"plugins": [*_BASE, *PLACEMENT[policy]], "seed": seed,
                                 "preemption": {"enabled": False}})


@dataclass(frozen=True, slots=True)
class FillResult:
    policy: str
    seed: int
    arrived_pct: list[float]  # cumulative GPU request / capacity after each task
    allocated_pct: list[float]  # allocated milli-GPU / capacity after each task
    placed: int
    skipped: int

    @property
    def final_allocation_pct(self) -> float:
        return self.allocated_pct[-1] if self.allocated_pct else 0.0

    def allocation_at(self, arrived_pct: float) -> float:
        """Allocation when the arrived request first reaches ``arrived_pct``."""
        a = np.asarray(self.arrived_pct)
        k = int(np.searchsorted(a, arrived_pct - 1e-9))
        return self.allocated_pct[min(k, len(a) - 1)]


def run_fill(nodes: tuple[Node, ...], pods: Sequence[OpenbPod], policy: str, seed: int,
             mix: tuple[TaskShape, ...] | None = None, target: float = TARGET, shuffle_nodes: bool = True,
             ) -> FillResult:
    """One fill; ``shuffle_nodes=False`` keeps the nodes in the given order."""
    cap = gpu_capacity_milli(nodes)
    tasks = inflate(pods, cap, seed, target)
    jobs = tuple(to_job(k, p) for k, p in enumerate(tasks))
    if shuffle_nodes:
        nodes = node_order(nodes, seed)
    sched = Scheduler(fill_config(policy, seed))
    plan = sched.schedule(Snapshot(0.0, nodes, (), jobs, task_mix=mix if mix is not None else workload_mix(pods)))
    return _curve(policy, seed, tasks, plan, cap)


def _curve(policy: str, seed: int, tasks: Sequence[OpenbPod], plan: Plan, cap: int) -> FillResult:
    placed = {b.job_id for b in plan.binds}
    arrived, alloc = [], []
    a_sum = g_sum = 0
    for k, p in enumerate(tasks):
        a_sum += p.gpu_request_milli
        if f"t{k:06d}" in placed:
            g_sum += p.gpu_request_milli
        arrived.append(100.0 * a_sum / cap)
        alloc.append(100.0 * g_sum / cap)
    return FillResult(policy, seed, arrived, alloc, len(placed), len(tasks) - len(placed))
