"""Fluent builders for service-level test data: ``ready("j").gpus(2).replicas(2)``."""

from __future__ import annotations

from typing import Any

from services.scheduler.state import Output, SchedulerState
from shared.events import GpuInfo, JobReady, NodeInventory, NodeRegistered, utcnow
from shared.jobspec import parse_job_spec


class ReadyBuilder:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._task: dict[str, Any] = {"name": "worker", "replicas": 1,
                                      "resources": {"gpu": 1}}
        self._spec: dict[str, Any] = {"name": job_id.lower(), "duration": 1}
        self._attempt = 1
        self._tenant = "t"

    def gpus(self, n: int) -> ReadyBuilder:
        self._task["resources"] = {"gpu": n}
        return self

    def share(self, memory_mib: int, compute_pct: int) -> ReadyBuilder:
        self._task["resources"] = {"gpuMemory": memory_mib, "gpuCompute": compute_pct}
        return self

    def replicas(self, n: int) -> ReadyBuilder:
        self._task["replicas"] = n
        return self

    def elastic(self, least: int, most: int) -> ReadyBuilder:
        self._task["minReplicas"], self._task["maxReplicas"] = least, most
        return self

    def duration(self, seconds: float) -> ReadyBuilder:
        self._spec["duration"] = seconds
        return self

    def estimate(self, seconds: float) -> ReadyBuilder:
        self._spec["runtimeEstimate"] = seconds
        return self

    def not_preemptible(self) -> ReadyBuilder:
        self._spec["preemptible"] = False
        return self

    def tenant(self, name: str) -> ReadyBuilder:
        self._tenant = name
        return self

    def priority_class(self, name: str) -> ReadyBuilder:
        self._spec["priorityClass"] = name
        return self

    def retries(self, n: int) -> ReadyBuilder:
        self._spec["maxRetry"] = n
        return self

    def build(self) -> JobReady:
        spec = parse_job_spec({**self._spec, "tasks": [self._task]})
        return JobReady(job_id=self.job_id, queue="default", tenant=self._tenant, user="u", spec=spec,
                        submitted_at=utcnow(), admitted_at=utcnow(), attempt=self._attempt)


def ready(job_id: str) -> ReadyBuilder:
    return ReadyBuilder(job_id)


def node(node_id: str, gpus: int = 8) -> NodeRegistered:
    return NodeRegistered(
        inventory=NodeInventory(
            node_id=node_id, cpu_milli=128_000, memory_mib=1_048_576, address=f"{node_id}.local",
            gpus=[GpuInfo(index=i, uuid=f"GPU-{node_id}-{i}", model="H100", memory_mib=81559)
                  for i in range(gpus)]),
        agent_started_at=utcnow())


def step(s: SchedulerState, *events: object, now: float = 0.0) -> Output:
    """Feed events to the scheduler's bookkeeping, then run a cycle if one is due: what
    the service does for one batch, without Kafka or the database."""
    out = Output()
    for e in events:
        s.handle(e, out)  # type: ignore[arg-type]
    if s.needs_cycle:
        s.cycle(now, out)
    return out
