"""Admission policy on a job's size, before it is accepted.

- ``max_job_gpus``: the whole GPUs a job asks for at its largest (elastic tasks at
  ``maxReplicas``) must not pass the gateway's limit.
- A job that could never run on this cluster is refused now instead of waiting
  forever: one replica must fit on some node (GPUs, CPU, memory, a GPU with enough
  memory for a share), and the gang's GPUs must not exceed the cluster's. The cluster
  is what admission's node read model knows (every registered node, lost ones too: they
  may come back); with no node registered yet nothing is refused.

Each refusal is a 422 whose ``field`` names the part of the spec at fault.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, status
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.admission.ratelimit import REFUSED
from shared.jobspec import JobSpec, TaskSpec


@dataclass(frozen=True)
class NodeShape:
    gpus: int
    gpu_memory_mib: int  # of its largest GPU
    cpu_milli: int
    memory_mib: int


class ClusterShapes:
    """The distinct node shapes of the cluster and its GPU count, re-read at most every
    ``ttl_s``: a submit should not read every node of a large cluster."""

    def __init__(self, engine: AsyncEngine, ttl_s: float = 5.0) -> None:
        self.engine, self.ttl_s = engine, ttl_s
        self._at = -1e9
        self.shapes: list[NodeShape] = []
        self.total_gpus = 0

    async def refresh(self) -> ClusterShapes:
        if time.monotonic() - self._at > self.ttl_s:
            async with self.engine.connect() as conn:
                nodes = [_shape(inv) for inv in (await conn.execute(
                    text("SELECT inventory FROM nodes_view"))).scalars()]
            self.shapes = sorted(set(nodes), key=lambda s: (
                s.gpus, s.gpu_memory_mib, s.cpu_milli, s.memory_mib))
            self.total_gpus = sum(n.gpus for n in nodes)
            self._at = time.monotonic()
        return self


def _shape(inv: dict[str, Any]) -> NodeShape:
    gpus = inv.get("gpus") or []
    return NodeShape(len(gpus), max((int(g.get("memory_mib", 0)) for g in gpus), default=0),
                     int(inv.get("cpu_milli", 0)), int(inv.get("memory_mib", 0)))


def _refuse(reason: str, field: str, message: str) -> HTTPException:
    REFUSED.labels(reason).inc()
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=[
        {"field": field, "message": message, "type": reason}])


def _fits(t: TaskSpec, n: NodeShape) -> bool:
    r = t.resources
    if r.is_shared and (n.gpus == 0 or n.gpu_memory_mib < r.gpu_memory):
        return False
    return n.gpus >= r.gpu and n.cpu_milli >= r.cpu and n.memory_mib >= r.memory


def largest_gpus(spec: JobSpec) -> int:
    """Whole GPUs the job holds at its largest (elastic tasks at maxReplicas)."""
    return sum(t.most_replicas * t.resources.gpu for t in spec.tasks)


def gang_gpus(spec: JobSpec) -> int:
    """Whole GPUs the job needs at once to start: the cheapest ``minAvailable`` replicas
    (every replica's, elastic tasks at minReplicas, without one)."""
    if spec.min_available is None:
        return sum(t.least_replicas * t.resources.gpu for t in spec.tasks)
    per_replica = sorted(t.resources.gpu for t in spec.tasks for _ in range(t.replicas))
    return sum(per_replica[:spec.min_available])


async def check(spec: JobSpec, max_job_gpus: int, shapes: ClusterShapes) -> None:
    """Raise 422 when the job is larger than allowed or could never run here."""
    size = largest_gpus(spec)
    if max_job_gpus and size > max_job_gpus:
        raise _refuse("job_too_large", "tasks", (
            f"the job asks for {size} GPUs at its largest; this gateway admits jobs of at "
            f"most {max_job_gpus} GPUs"))
    cluster = await shapes.refresh()
    nodes = cluster.shapes
    if not nodes:
        return
    for i, t in enumerate(spec.tasks):
        if not any(_fits(t, n) for n in nodes):
            r = t.resources
            want = (f"a GPU with {r.gpu_memory} MiB" if r.is_shared else f"{r.gpu} GPUs")
            raise _refuse("never_fits", f"tasks.{i}.resources", (
                f"no node can ever hold one replica of task {t.name} ({want}, {r.cpu} "
                f"millicores, {r.memory} MiB): the largest nodes have "
                f"{max(n.gpus for n in nodes)} GPUs "
                f"({max(n.gpu_memory_mib for n in nodes)} MiB each), "
                f"{max(n.cpu_milli for n in nodes)} millicores, "
                f"{max(n.memory_mib for n in nodes)} MiB"))
    need = gang_gpus(spec)
    if need > cluster.total_gpus:
        raise _refuse("never_fits", "minAvailable" if spec.min_available else "tasks", (
            f"the gang needs {need} GPUs at once; the whole cluster has "
            f"{cluster.total_gpus}"))
