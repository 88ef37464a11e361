"""Fluent builders for scheduling tests: ``job("j").queue("q").gpus(4).gang(4)``.

A ``World`` plays cycles: it applies a plan's binds as allocations, lets preempted
jobs stop, and finishes jobs, so scenario tests read as a short story.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from scheduling import (
    AffinityRule,
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
)
from scheduling.mig import Instance, layout


class JobBuilder:
    def __init__(self, job_id: str) -> None:
        self._job: dict[str, Any] = {"job_id": job_id}
        self._tasks: list[TaskRequest] = []
        self._cur: dict[str, Any] = {"name": "w", "role": "worker", "replicas": 1}

    # --- the current task group ----------------------------------------------------
    def gpus(self, n: int) -> JobBuilder:
        self._cur.update(gpu=n, gpu_memory_mib=0, gpu_compute_pct=0)
        return self

    def share(self, memory_mib: int = 0, compute_pct: int = 0) -> JobBuilder:
        self._cur.update(gpu=0, gpu_memory_mib=memory_mib, gpu_compute_pct=compute_pct)
        return self

    def mig(self, profile: str) -> JobBuilder:
        self._cur.update(gpu=0, mig_profile=profile)
        return self

    def replicas(self, n: int) -> JobBuilder:
        self._cur["replicas"] = n
        return self

    def gang(self, n: int) -> JobBuilder:
        """``n`` replicas that start together (the default when minAvailable is unset)."""
        return self.replicas(n)

    def cpu(self, milli: int) -> JobBuilder:
        self._cur["cpu_milli"] = milli
        return self

    def mem(self, mib: int) -> JobBuilder:
        self._cur["memory_mib"] = mib
        return self

    def elastic(self, lo: int, hi: int) -> JobBuilder:
        self._cur.update(min_replicas=lo, max_replicas=hi)
        return self

    def task(self, name: str, role: str | None = None) -> JobBuilder:
        """Close the current group and start another one."""
        self._tasks.append(TaskRequest(**self._cur))
        self._cur = {"name": name, "role": role or name, "replicas": 1}
        return self

    def named(self, name: str, role: str | None = None) -> JobBuilder:
        self._cur.update(name=name, role=role or name)
        return self

    # --- the job ---------------------------------------------------------------------
    def queue(self, q: str) -> JobBuilder:
        self._job["queue"] = q
        return self

    def tenant(self, t: str) -> JobBuilder:
        self._job["tenant"] = t
        return self

    def priority(self, p: int) -> JobBuilder:
        self._job["priority"] = p
        return self

    def klass(self, c: str) -> JobBuilder:
        self._job["priority_class"] = c
        return self

    def submit(self, t: float) -> JobBuilder:
        self._job["submit_time"] = t
        return self

    def estimate(self, s: float) -> JobBuilder:
        self._job["runtime_estimate_s"] = s
        return self

    def samples(self, *durations: float) -> JobBuilder:
        """Durations of similar finished jobs, as the history gives them."""
        self._job["runtime_samples"] = durations
        return self

    def min_available(self, n: int) -> JobBuilder:
        self._job["min_available"] = n
        return self

    def models(self, *m: str) -> JobBuilder:
        self._job["gpu_models"] = m
        return self

    def prices(self, **weights: float) -> JobBuilder:
        """Billing weights per GPU model: ``prices(H100=4)``."""
        self._job["gpu_prices"] = tuple(sorted(weights.items()))
        return self

    def selector(self, **labels: str) -> JobBuilder:
        self._job["node_selector"] = labels
        return self

    def tolerate(self, *t: str) -> JobBuilder:
        self._job["tolerations"] = t
        return self

    def labels(self, **kv: str) -> JobBuilder:
        self._job["labels"] = kv
        return self

    def affinity(self, *rules: AffinityRule) -> JobBuilder:
        self._job["affinity"] = rules
        return self

    def dataset(self, d: str) -> JobBuilder:
        self._job["dataset"] = d
        return self

    def not_preemptible(self) -> JobBuilder:
        self._job["preemptible"] = False
        return self

    def min_runtime(self, s: float) -> JobBuilder:
        self._job["min_runtime_s"] = s
        return self

    def grace(self, s: float) -> JobBuilder:
        self._job["checkpoint_grace_s"] = s
        return self

    def attained(self, gpu_s: float) -> JobBuilder:
        self._job["attained_service_s"] = gpu_s
        return self

    def build(self) -> JobRequest:
        return JobRequest(tasks=(*self._tasks, TaskRequest(**self._cur)), **self._job)


def job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)


class NodeBuilder:
    def __init__(self, node_id: str) -> None:
        self._n: dict[str, Any] = {"node_id": node_id, "cpu_milli": 64_000, "memory_mib": 512_000}
        self._gpus = 8
        self._model = "A100"
        self._gmem = 81920
        self._nvlink: list[int] | None = None
        self._mig: tuple[Instance, ...] | None = None
        self._unhealthy: set[int] = set()

    def gpus(self, n: int, model: str = "A100", memory_mib: int = 81920) -> NodeBuilder:
        self._gpus, self._model, self._gmem = n, model, memory_mib
        return self

    def nvlink(self, *domains: int) -> NodeBuilder:
        self._nvlink = list(domains)
        return self

    def mig(self, *profiles: str, model: str = "A100-80GB") -> NodeBuilder:
        """Every GPU in MIG mode with these instances (laid out as nvidia-smi would)."""
        self._mig = layout(model, list(profiles))
        return self

    def unhealthy(self, *idx: int) -> NodeBuilder:
        self._unhealthy |= set(idx)
        return self

    def cpu(self, milli: int) -> NodeBuilder:
        self._n["cpu_milli"] = milli
        return self

    def rack(self, r: str) -> NodeBuilder:
        self._n["rack"] = r
        return self

    def label(self, **kv: str) -> NodeBuilder:
        self._n.setdefault("labels", {}).update(kv)
        return self

    def taint(self, *t: str) -> NodeBuilder:
        self._n["taints"] = t
        return self

    def datasets(self, *d: str) -> NodeBuilder:
        self._n["datasets"] = frozenset(d)
        return self

    def cordoned(self) -> NodeBuilder:
        self._n["schedulable"] = False
        return self

    def build(self) -> Node:
        dom = self._nvlink or [0] * self._gpus
        gpus = [GpuSlot(i, f"{self._n['node_id']}-g{i}", self._model, self._gmem, dom[i],
                        i not in self._unhealthy, self._mig is not None, self._mig or ())
                for i in range(self._gpus)]
        return Node(gpus=gpus, **self._n)


def node(node_id: str) -> NodeBuilder:
    return NodeBuilder(node_id)


def cluster(n: int = 2, gpus: int = 8, per_rack: int = 0, **kw: Any) -> tuple[Node, ...]:
    out = []
    for i in range(n):
        b = node(f"n{i}").gpus(gpus, **kw)
        if per_rack:
            b.rack(f"r{i // per_rack}")
        out.append(b.build())
    return tuple(out)


def quota(tenant: str, gpu: float, cohort: str = "", borrow: float | None = None,
          lend: float | None = None, weight: float = 1.0) -> Quota:
    big = 1e12
    return Quota(tenant, Resources(gpu, big, big), cohort,
                 None if borrow is None else Resources(borrow, big, big),
                 None if lend is None else Resources(lend, big, big), weight)


def config(*plugins: str | tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], float],
           **kw: Any) -> SchedulerConfig:
    specs = []
    for p in plugins:
        if isinstance(p, str):
            specs.append({"name": p})
        elif len(p) == 2:
            specs.append({"name": p[0], "args": p[1]})
        else:
            specs.append({"name": p[0], "args": p[1], "weight": p[2]})
    return SchedulerConfig.load({"plugins": specs, **kw})


@dataclass
class World:
    """A cluster that runs plans: binds become allocations, preempted jobs stop later."""

    nodes: tuple[Node, ...]
    scheduler: Scheduler = field(default_factory=Scheduler)
    now: float = 0.0
    pending: list[JobRequest] = field(default_factory=list)
    allocations: list[Allocation] = field(default_factory=list)
    running: dict[str, RunningJob] = field(default_factory=dict)
    quotas: tuple[Quota, ...] = ()
    telemetry: dict[str, tuple[GpuStats, ...]] = field(default_factory=dict)

    def submit(self, *jobs: JobBuilder | JobRequest) -> World:
        for j in jobs:
            self.pending.append(j.build() if isinstance(j, JobBuilder) else j)
        return self

    def snapshot(self) -> Snapshot:
        return Snapshot(self.now, self.nodes, tuple(self.allocations), tuple(self.pending),
                        tuple(self.running.values()), self.quotas, self.telemetry)

    def start(self, j: JobBuilder | JobRequest, at: float = 0.0, checkpoint: float | None = None,
              **placement: list[int]) -> World:
        """Make a job run already: ``start(job, n0=[0, 1])`` puts one replica per node entry."""
        req = j.build() if isinstance(j, JobBuilder) else j
        t = req.tasks[0]
        for r, (nid, gpus) in enumerate(placement.items()):
            from scheduling import GpuUse

            uses = tuple(GpuUse(g) if t.gpu else GpuUse(g, t.gpu_memory_mib, t.gpu_compute_pct)
                         for g in gpus)
            self.allocations.append(Allocation(req.job_id, f"{t.name}-{r}", nid, uses, t.cpu_milli,
                                               t.memory_mib, t.name, t.role))
        self.running[req.job_id] = RunningJob(req, at, checkpoint)
        return self

    def step(self, dt: float = 0.0) -> Plan:
        self.now += dt
        plan = self.scheduler.schedule(self.snapshot())
        self.apply(plan)
        return plan

    def apply(self, plan: Plan) -> None:
        by_job = plan.binds_by_job()
        for jid, binds in by_job.items():
            req = next(j for j in self.pending if j.job_id == jid)
            self.pending.remove(req)
            self.running[jid] = RunningJob(req, self.now)
            self.allocations += [Allocation(b.job_id, b.task_id, b.node_id, b.gpus, b.cpu_milli,
                                            b.memory_mib, b.task_name, b.role) for b in binds]
        for p in plan.preemptions:
            self.running[p.job_id] = replace(self.running[p.job_id], terminating=True)
        for rz in plan.resizes:
            self.allocations += [Allocation(b.job_id, b.task_id, b.node_id, b.gpus, b.cpu_milli,
                                            b.memory_mib, b.task_name, b.role) for b in rz.binds]
            stop = set(rz.stop_task_ids)
            self.allocations = [a for a in self.allocations
                                if not (a.job_id == rz.job_id and a.task_id in stop)]

    def stop_terminating(self) -> list[str]:
        """Preempted jobs finish their grace period: they stop and queue again."""
        gone = [jid for jid, r in self.running.items() if r.terminating]
        for jid in gone:
            self.pending.append(replace(self.running.pop(jid).job, attempt=2))
        self.allocations = [a for a in self.allocations if a.job_id not in gone]
        return gone

    def finish(self, *job_ids: str) -> World:
        for jid in job_ids:
            self.running.pop(jid, None)
        self.allocations = [a for a in self.allocations if a.job_id not in job_ids]
        return self

    def nodes_of(self, job_id: str) -> set[str]:
        return {a.node_id for a in self.allocations if a.job_id == job_id}


def bound(plan: Plan) -> dict[str, list[str]]:
    """job -> node of each bind, in bind order."""
    out: dict[str, list[str]] = {}
    for b in plan.binds:
        out.setdefault(b.job_id, []).append(b.node_id)
    return out
