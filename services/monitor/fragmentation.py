"""Cluster fragmentation: the share of free GPU capacity that the waiting jobs' task
shapes cannot use (FGD's notion, Weng et al. ATC'23, measured against the live queue).

Capacity is counted in GPUs: a free GPU is 1, the room left on a shared GPU is its free
compute share (``free_pct / 100``). A whole GPU is usable if some waiting whole-GPU task
fits on its node in whole multiples (3 free GPUs and tasks of 2: one is stranded), or if
some fractional task waits; the room on a shared GPU is usable if a fractional task fits
in both its free memory and its free compute. With no GPU task waiting nothing is
stranded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Shape:
    """One task's request: ``gpus`` whole GPUs, or a share (``memory_mib``, ``compute_pct``)."""

    gpus: int = 0
    memory_mib: int = 0
    compute_pct: int = 0

    @property
    def fractional(self) -> bool:
        return self.gpus == 0 and (self.memory_mib > 0 or self.compute_pct > 0)


@dataclass
class NodeRoom:
    """What a schedulable node has left: whole free GPUs and the room on shared ones."""

    whole_free: int = 0
    partial: list[tuple[int, int]] = field(default_factory=list)  # (free MiB, free %)


def fragmentation(nodes: Iterable[NodeRoom], shapes: Iterable[Shape]) -> float:
    shapes = {s for s in shapes if s.gpus > 0 or s.fractional}  # CPU-only tasks need no GPU
    whole = sorted({s.gpus for s in shapes if s.gpus > 0})
    fractions = [s for s in shapes if s.fractional]
    free = usable = 0.0
    for n in nodes:
        free += n.whole_free + sum(pct for _, pct in n.partial) / 100
        if fractions and n.whole_free:
            usable += n.whole_free
        elif n.whole_free:
            usable += max((n.whole_free // g * g for g in whole if g <= n.whole_free),
                          default=0)
        for mem, pct in n.partial:
            if any(s.memory_mib <= mem and s.compute_pct <= pct for s in fractions):
                usable += pct / 100
    if not shapes or free <= 0:
        return 0.0
    return max(0.0, min(1.0, (free - usable) / free))
