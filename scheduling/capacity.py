"""Free capacity of a cluster, derived from nodes and allocations, with trial placement.

A ``Capacity`` is mutable scratch state for one cycle: placing a gang tentatively and
rolling it back whole is how all-or-nothing is kept (Volcano's Statement).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduling.model import Allocation, GpuUse, Node, TaskRequest


@dataclass(slots=True)
class GpuFree:
    memory_mib: int
    compute_pct: int
    total_memory_mib: int
    healthy: bool = True

    @property
    def idle(self) -> bool:
        return self.compute_pct >= 100 and self.memory_mib >= self.total_memory_mib


@dataclass(slots=True)
class NodeFree:
    node: Node
    cpu_milli: int
    memory_mib: int
    gpus: list[GpuFree] = field(default_factory=list)

    def take(self, cpu: int, mem: int, uses: tuple[GpuUse, ...], sign: int = 1) -> None:
        self.cpu_milli -= sign * cpu
        self.memory_mib -= sign * mem
        for u in uses:
            g = self.gpus[u.index]
            if u.whole:
                g.memory_mib -= sign * g.total_memory_mib
                g.compute_pct -= sign * 100
            else:
                g.memory_mib -= sign * u.memory_mib
                g.compute_pct -= sign * u.compute_pct

    def fit(self, t: TaskRequest) -> tuple[GpuUse, ...] | None:
        """GPUs for one replica of ``t`` on this node (first fit), or None."""
        if not self.node.schedulable or t.cpu_milli > self.cpu_milli or t.memory_mib > self.memory_mib:
            return None
        if t.gpu:
            idle = [i for i, g in enumerate(self.gpus) if g.healthy and g.idle]
            if len(idle) < t.gpu:
                return None
            return tuple(GpuUse(i) for i in idle[: t.gpu])
        if t.shared:
            for i, g in enumerate(self.gpus):
                if g.healthy and g.memory_mib >= t.gpu_memory_mib and g.compute_pct >= t.gpu_compute_pct:
                    return (GpuUse(i, t.gpu_memory_mib, t.gpu_compute_pct),)
            return None
        if t.mig:
            return None  # first fit does not place MIG instances
        return ()


def build_capacity(nodes: tuple[Node, ...], allocations: tuple[Allocation, ...]) -> dict[str, NodeFree]:
    free = {
        n.node_id: NodeFree(
            n,
            n.cpu_milli,
            n.memory_mib,
            # MIG-mode GPUs only serve MIG instances, which first fit does not place.
            [GpuFree(g.memory_mib, 100, g.memory_mib, g.healthy and not g.mig_mode) for g in n.gpus],
        )
        for n in nodes
    }
    for a in allocations:
        nf = free.get(a.node_id)
        if nf is not None:
            nf.take(a.cpu_milli, a.memory_mib, a.gpus)
    return free
