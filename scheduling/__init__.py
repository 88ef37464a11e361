"""Kairos' pure scheduling core: snapshot in, plan out.

Imports nothing of Kafka, databases, Kubernetes or NVML, and never reads the clock:
``Snapshot.now`` is the time. The live scheduler service, queueing's ordering and the
simulator all call this same code.
"""

from scheduling.model import (
    Allocation,
    Bind,
    GpuSlot,
    GpuUse,
    JobRequest,
    Node,
    PendingReason,
    Plan,
    Snapshot,
    TaskRequest,
)
from scheduling.first_fit import first_fit

__all__ = [
    "Allocation",
    "Bind",
    "GpuSlot",
    "GpuUse",
    "JobRequest",
    "Node",
    "PendingReason",
    "Plan",
    "Snapshot",
    "TaskRequest",
    "first_fit",
]
