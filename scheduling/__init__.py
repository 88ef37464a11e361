"""Kairos' pure scheduling core: snapshot in, plan out.

Imports nothing of Kafka, databases, Kubernetes or NVML, and never reads the clock:
``Snapshot.now`` is the time. The live scheduler service, queueing's ordering and the
simulator all call this same code.

How a service uses it::

    from scheduling import Scheduler, SchedulerConfig, Snapshot

    sched = Scheduler(SchedulerConfig.from_yaml(text))   # once; raises ConfigError
    plan = sched.schedule(Snapshot(
        now=clock.now(),                  # seconds; the only time the core sees
        nodes=nodes,                      # tuple[Node]; pass the SAME tuple object while
                                          # the inventory is unchanged, a new one on change
        allocations=allocations,          # tuple[Allocation]: every bound/running task
        pending=pending,                  # tuple[JobRequest]: admitted, not yet placed
        running=running,                  # tuple[RunningJob]: jobs holding allocations
        quotas=quotas,                    # tuple[Quota] (optional)
        telemetry=telemetry,              # {node_id: tuple[GpuStats]} (optional)
    ))
    plan.binds          # Bind per task: publish ``allocate`` bindings (group by node)
    plan.preemptions    # Preemption per victim job: ``stop`` its tasks after grace_period_s
    plan.resizes        # Resize: grow (binds) or shrink (stop_task_ids) elastic jobs
    plan.pending        # {job_id: PendingReason} for every pending job not bound
    plan.reservations   # EASY backfill reservations (for status / metrics)

Queueing calls ``sched.order(snapshot)`` for its order; ``QuotaBook`` is the quota
model itself. ``first_fit`` remains as the plain baseline.

Inside: ``Scheduler`` opens each cycle through its ``SnapshotCache`` (what a caller may
reuse between snapshots is documented there), orders the pending jobs, and runs the
config's actions (scheduling.actions: allocate, preempt, backfill, grow) over a
``Session``; policies are plugins (scheduling.framework, scheduling.plugins).
"""

from scheduling.config import ConfigError, PluginSpec, PreemptionSettings, SchedulerConfig
from scheduling.first_fit import first_fit
from scheduling.framework import REGISTRY, Cycle, JobInfo, Placing, Plugin, register
from scheduling.model import (
    AffinityRule,
    Allocation,
    Bind,
    GpuSlot,
    GpuStats,
    GpuUse,
    JobRequest,
    Node,
    PendingReason,
    Plan,
    Preemption,
    PreemptReason,
    Quota,
    Reservation,
    Resize,
    ResizeReason,
    Resources,
    RunningJob,
    Snapshot,
    TaskRequest,
    TaskShape,
)
from scheduling.quota import Admission, QuotaBook, dominant_share
from scheduling.scheduler import Scheduler

__all__ = [
    "REGISTRY",
    "Admission",
    "AffinityRule",
    "Allocation",
    "Bind",
    "ConfigError",
    "Cycle",
    "GpuSlot",
    "GpuStats",
    "GpuUse",
    "JobInfo",
    "JobRequest",
    "Node",
    "PendingReason",
    "Placing",
    "Plan",
    "Plugin",
    "PluginSpec",
    "PreemptReason",
    "Preemption",
    "PreemptionSettings",
    "Quota",
    "QuotaBook",
    "Reservation",
    "Resize",
    "ResizeReason",
    "Resources",
    "RunningJob",
    "Scheduler",
    "SchedulerConfig",
    "Snapshot",
    "TaskRequest",
    "TaskShape",
    "dominant_share",
    "first_fit",
    "register",
]
