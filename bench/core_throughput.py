"""Throughput of the scheduling core: placements per second of cycle time.

Clusters of 500 and 5,000 nodes x 8 GPUs start empty with pending jobs asking for
twice the cluster's GPUs (70% 1-GPU, a third of them GPU shares; 20% 2-8 GPUs; 10%
gangs of 16-64 GPUs). Each cycle schedules with every plugin on (the default config:
gang, priority, fair share with quotas, predicates, topology, bin-packing, FGD,
telemetry, locality, backfill, elastic, preemption); then 10% of running jobs finish,
preempted jobs stop and queue again, and as many new jobs arrive as finished. Plain
first fit runs on the same workload in the same run. Time is the ``schedule()`` call
only (the service builds the snapshot incrementally); a placement is one task bound.

    python bench/core_throughput.py --repeat 3       # both sizes, writes the JSON
    python bench/core_throughput.py --nodes 500 --cycles 5 --no-write
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduling import (
    Allocation,
    GpuSlot,
    GpuStats,
    JobRequest,
    Node,
    Plan,
    Quota,
    Resources,
    RunningJob,
    Scheduler,
    SchedulerConfig,
    Snapshot,
    TaskRequest,
    first_fit,
)
from scheduling.plugins.fgd import task_shapes, typical_mix

TENANTS = ("vision", "nlp", "speech", "rl")
DATASETS = tuple(f"ds{i}" for i in range(20))


def make_nodes(n: int, rng: random.Random) -> tuple[Node, ...]:
    return tuple(
        Node(f"node-{i:05d}", 96_000, 1_048_576,
             [GpuSlot(g, f"n{i}-g{g}", "A100-80GB", 81920, g // 4) for g in range(8)],
             labels={"pool": "train"}, rack=f"rack-{i // 32:04d}",
             datasets=frozenset(rng.sample(DATASETS, 2)))
        for i in range(n))


class Workload:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.k = 0

    def job(self, now: float) -> JobRequest:
        r = self.rng
        self.k += 1
        x = r.random()
        if x < 0.70:
            if r.random() < 1 / 3:
                t = TaskRequest("w", "worker", 1, gpu_memory_mib=r.choice([10_240, 20_480, 40_960]),
                                gpu_compute_pct=r.choice([25, 50]), cpu_milli=2000, memory_mib=16_384)
            else:
                t = TaskRequest("w", "worker", 1, gpu=1, cpu_milli=8000, memory_mib=65_536)
            tasks: tuple[TaskRequest, ...] = (t,)
        elif x < 0.90:
            g = r.choice([2, 4, 8])
            tasks = (TaskRequest("w", "worker", 1, gpu=g, cpu_milli=8000 * g, memory_mib=65_536 * g),)
        else:
            replicas = r.choice([2, 4, 8])  # 16-64 GPUs as 8-GPU workers
            tasks = (TaskRequest("w", "worker", replicas, gpu=8, cpu_milli=64_000, memory_mib=524_288),)
            if r.random() < 0.3:
                tasks = (TaskRequest("ps", "ps", 1, cpu_milli=4000, memory_mib=16_384), *tasks)
        if r.random() < 0.1 and len(tasks) == 1 and tasks[0].gpu == 1:
            tasks = (replace(tasks[0], replicas=2, min_replicas=1, max_replicas=4),)
        klass = r.choices(["low", "normal", "high"], [0.2, 0.7, 0.1])[0]
        return JobRequest(
            f"j{self.k:07d}", tasks, queue="q", tenant=r.choice(TENANTS), priority=r.randint(-10, 10),
            submit_time=now, priority_class=klass,
            runtime_estimate_s=r.choice([600.0, 1800.0, 3600.0, 14_400.0]) if r.random() < 0.8 else None,
            dataset=r.choice(DATASETS), checkpoint_grace_s=30.0)


def gpus_of(j: JobRequest) -> float:
    return j.total_gpus


class Cluster:
    """Keeps allocations and running jobs between cycles, as the service's cache does."""

    def __init__(self, nodes: tuple[Node, ...], seed: int) -> None:
        self.nodes = nodes
        self.work = Workload(seed)
        self.rng = random.Random(seed + 1)
        self.now = 0.0
        self.pending: dict[str, JobRequest] = {}
        self.allocs: dict[str, list[Allocation]] = {}
        self.running: dict[str, RunningJob] = {}
        target = 2 * 8 * len(nodes)
        demand = 0.0
        while demand < target:
            j = self.work.job(0.0)
            self.pending[j.job_id] = j
            demand += gpus_of(j)
        self.telemetry = {n.node_id: tuple(GpuStats(g, self.rng.uniform(0, 100), 0, self.rng.uniform(35, 85),
                                                    self.rng.random() < 0.01) for g in range(8))
                          for n in nodes}
        share = 8.0 * len(nodes) / len(TENANTS)
        big = 1e12
        self.quotas = tuple(Quota(t, Resources(share, big, big), "all") for t in TENANTS)
        shapes = task_shapes((t, j.gpu_models, t.replicas) for j in self.pending.values() for t in j.tasks)
        self.mix = tuple(typical_mix(shapes))

    def snapshot(self) -> Snapshot:
        allocs = tuple(a for lst in self.allocs.values() for a in lst)
        return Snapshot(self.now, self.nodes, allocs, tuple(self.pending.values()),
                        tuple(self.running.values()), self.quotas, self.telemetry, self.mix)

    def apply(self, plan: Plan) -> int:
        placed = 0
        for jid, binds in plan.binds_by_job().items():
            job = self.pending.pop(jid)
            self.running[jid] = RunningJob(job, self.now)
            self.allocs[jid] = [Allocation(b.job_id, b.task_id, b.node_id, b.gpus, b.cpu_milli, b.memory_mib,
                                           b.task_name, b.role) for b in binds]
            placed += len(binds)
        for p in plan.preemptions:
            self.running[p.job_id] = replace(self.running[p.job_id], terminating=True)
        for rz in plan.resizes:
            lst = self.allocs[rz.job_id]
            lst += [Allocation(b.job_id, b.task_id, b.node_id, b.gpus, b.cpu_milli, b.memory_mib, b.task_name,
                               b.role) for b in rz.binds]
            stop = set(rz.stop_task_ids)
            self.allocs[rz.job_id] = [a for a in lst if a.task_id not in stop]
            placed += len(rz.binds)
        return placed

    def churn(self, dt: float = 60.0) -> None:
        self.now += dt
        for jid in [j for j, r in self.running.items() if r.terminating]:
            job = self.running.pop(jid).job
            del self.allocs[jid]
            self.pending[jid] = replace(job, attempt=job.attempt + 1)
        done = [j for j in self.running if self.rng.random() < 0.10]
        for jid in done:
            del self.running[jid]
            del self.allocs[jid]
        for _ in done:
            j = self.work.job(self.now)
            self.pending[j.job_id] = j


def run(nodes: int, cycles: int, seed: int, policy: Callable[[Snapshot], Plan]) -> dict[str, float]:
    c = Cluster(make_nodes(nodes, random.Random(seed)), seed)
    # What a long-running host does after loading its cluster: keep the static objects
    # out of the collector's full passes (gc.freeze), so a cycle pays only for its own.
    gc.collect()
    gc.freeze()
    times: list[float] = []
    cpu: list[float] = []
    firsts: list[int] = []  # placements per cycle
    placed = 0
    for _ in range(cycles):
        snap = c.snapshot()
        t0, c0 = time.perf_counter(), time.process_time()
        plan = policy(snap)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        n = c.apply(plan)
        placed += n
        firsts.append(n)
        c.churn()
    total = sum(times)
    return {
        "placements": placed,
        "seconds": total,
        "placements_per_s": placed / total if total else 0.0,
        "cycle_p50_ms": 1000 * statistics.median(times),
        "cycle_p99_ms": 1000 * (sorted(times)[min(len(times) - 1, int(0.99 * len(times)))]),
        "us_per_placement": 1e6 * total / max(placed, 1),
        "cycles": cycles,
        "cpu_placements_per_s": placed / sum(cpu) if sum(cpu) else 0.0,
        "first_cycle_placements_per_s": firsts[0] / times[0] if times else 0.0,
        "steady_placements_per_s": sum(firsts[1:]) / sum(times[1:]) if len(times) > 1 else 0.0,
    }


def swapped(swaps: list[str]) -> SchedulerConfig:
    """The default config with plugins replaced (``old=new``) or dropped (``old=``)."""
    change = dict(sw.split("=", 1) for sw in swaps)
    plugins = []
    for p in SchedulerConfig().plugins:
        if p.name not in change:
            plugins.append(p.model_dump())
        elif change[p.name]:
            plugins.append({"name": change[p.name], "weight": p.weight})
    return SchedulerConfig.load({"plugins": plugins})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="*", default=[500, 5000])
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--ff-cycles", type=int, default=3, help="first fit is slow at 5,000 nodes")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--repeat", type=int, default=1, help="runs per size; the best is kept")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--swap", action="append", default=[], metavar="OLD=NEW",
                    help="replace a default plugin (kairos=fgd), or drop it (srpt=); for attribution")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "core_throughput.json"))
    args = ap.parse_args()
    runs = []
    for n in args.nodes:
        tries = [run(n, args.cycles, args.seed, Scheduler(swapped(args.swap)).schedule)
                 for _ in range(args.repeat)]
        core = max(tries, key=lambda r: r["placements_per_s"])
        ff = run(n, args.ff_cycles, args.seed, first_fit) if args.ff_cycles else {
            "placements_per_s": 0.0, "cycle_p50_ms": 0.0, "cycles": 0}
        row = {
            "nodes": n,
            "placements_per_s": round(core["placements_per_s"], 1),
            "cycle_p50_ms": round(core["cycle_p50_ms"], 1),
            "cycle_p99_ms": round(core["cycle_p99_ms"], 1),
            "us_per_placement": round(core["us_per_placement"], 1),
            "cpu_placements_per_s": round(core["cpu_placements_per_s"], 1),
            "runs_placements_per_s": [round(r["placements_per_s"], 1) for r in tries],
            "first_cycle_placements_per_s": round(core["first_cycle_placements_per_s"], 1),
            "steady_placements_per_s": round(core["steady_placements_per_s"], 1),
            "placements": core["placements"],
            "cycles": core["cycles"],
            "first_fit_placements_per_s": round(ff["placements_per_s"], 1),
            "first_fit_cycle_p50_ms": round(ff["cycle_p50_ms"], 1),
            "first_fit_cycles": ff["cycles"],
        }
        runs.append(row)
        print(json.dumps(row), flush=True)
    out = {"runs": runs}
    if len(runs) >= 2:
        out["time_per_placement_growth"] = round(runs[-1]["us_per_placement"] / runs[0]["us_per_placement"], 2)
        print(f"time per placement grows x{out['time_per_placement_growth']} from "
              f"{runs[0]['nodes']} to {runs[-1]['nodes']} nodes")
    out["config"] = {"cycles": args.cycles, "seed": args.seed, "repeat": args.repeat,
                     "policy": "SchedulerConfig() (all plugins)" + (f", swapped {args.swap}" if args.swap else ""),
                     "timing": "wall time of schedule() per cycle; cpu_* is process CPU time",
                     "python": sys.version.split()[0], "cpus": os.cpu_count(),
                     "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    if not args.no_write:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
