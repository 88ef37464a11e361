"""The core's data model: cluster, allocations and requests in; a plan out.

Plain slotted dataclasses (no pydantic) because the simulator builds millions of them.
Units: CPU millicores, memory and GPU memory MiB, GPU compute percent, time seconds.
Every field added after the first version has a default, so ``Snapshot(now, nodes,
allocations, pending)`` and the other original constructors keep working.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from scheduling.mig import SLICES, Instance, slices_of


class PendingReason(StrEnum):
    """Why a job was left pending; one vocabulary for events, API and metric labels."""

    NO_FIT = "no_fit"  # no node set can hold the job now
    GANG_INCOMPLETE = "gang_incomplete"  # some but not all of a gang fits: place none
    NEVER_FITS = "never_fits"  # larger than the whole (healthy) cluster
    QUOTA = "quota"
    PRIORITY = "priority"  # capacity is reserved for a higher-priority job
    BACKFILL_BLOCKED = "backfill_blocked"  # would delay the reserved head job
    GPU_MODEL = "gpu_model"  # no GPU of an allowed model is free
    PREEMPTING = "preempting"  # victims were asked to stop; it starts when they have
    AFFINITY = "affinity"  # a required (anti-)affinity rule cannot be met now
    NO_MATCHING_NODE = "no_matching_node"  # node selector / taints exclude every node
    CORDONED = "cordoned"  # room for it only on cordoned (or draining) nodes


class PreemptReason(StrEnum):
    """Why a running job (or some replicas of it) is asked to stop."""

    PRIORITY = "priority"  # a higher-priority job needs the capacity
    RECLAIM = "reclaim"  # the quota owner takes back capacity another tenant borrowed
    FAIR_SHARE = "fair_share"  # DRF: the victim's tenant is over its fair share
    LAS = "las"  # Tiresias: the victim attained more service than the preemptor
    SRTF = "srtf"  # the preemptor has less remaining time than the victim
    SHRINK = "shrink"  # an elastic job gives back replicas above its minimum
    FASTER_GPU = "faster_gpu"  # the job itself moves to faster GPUs left free (the migrate action)


class ResizeReason(StrEnum):
    GROW = "grow"  # idle GPUs: an elastic job gets more replicas
    SHRINK = "shrink"  # pressure: an elastic job gives replicas back (not killed)


@dataclass(slots=True)
class GpuSlot:
    """One physical GPU of a node. In MIG mode it serves only its MIG instances."""

    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int = 81920
    nvlink_domain: int = 0
    healthy: bool = True
    mig_mode: bool = False
    mig: tuple[Instance, ...] = ()  # the MIG instances configured on it (scheduling/mig.py)
    tflops: float = 0.0  # informational compute rating


@dataclass(slots=True)
class Node:
    node_id: str
    cpu_milli: int
    memory_mib: int
    gpus: list[GpuSlot] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    rack: str = ""  # the leaf switch / rack above the node (topology level 3)
    schedulable: bool = True  # False when cordoned, lost or draining
    cordoned: bool = False  # an operator cordoned it (schedulable is False too): pending
    # jobs that would fit only there say ``cordoned`` rather than no_fit / never_fits
    taints: tuple[str, ...] = ()  # "key=value:Effect" or "key"; a job must tolerate each
    datasets: frozenset[str] = frozenset()  # datasets the agent reports in its local cache


@dataclass(frozen=True, slots=True)
class GpuStats:
    """Live telemetry of one GPU, as the agent reports it (an input, never a clock)."""

    index: int
    utilization_pct: float = 0.0
    memory_used_mib: int = 0
    temperature_c: float = 0.0
    degraded: bool = False


@dataclass(frozen=True, slots=True)
class GpuUse:
    """Part of one GPU held by a task: memory MiB (0 = whole) and compute percent.

    A MIG use holds one instance of a MIG-mode GPU: ``mig_slots`` its memory slices as
    a mask (which says where it is), ``mig_slices`` its compute slices (memory 0, compute 0).
    """

    index: int
    memory_mib: int = 0
    compute_pct: int = 100
    mig_slices: int = 0
    mig_slots: int = 0

    @property
    def whole(self) -> bool:
        return self.memory_mib == 0 and self.compute_pct >= 100 and self.mig_slices == 0

    @property
    def share(self) -> float:  # the part of a GPU: 1 whole, MIG its slices of 7, else compute
        return 1.0 if self.whole else self.mig_slices / SLICES if self.mig_slices else self.compute_pct / 100.0


@dataclass(frozen=True, slots=True)
class Allocation:
    """A task already placed (bound or running)."""

    job_id: str
    task_id: str
    node_id: str
    gpus: tuple[GpuUse, ...]
    cpu_milli: int
    memory_mib: int
    task_name: str = ""  # defaults to task_id without its "-<replica>" suffix
    role: str = ""


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """One replica group of a job: ``replicas`` identical tasks. Elastic groups set
    ``min_replicas`` / ``max_replicas``: the job may start with ``min_replicas``, grows to
    ``max_replicas`` into idle GPUs and shrinks back under pressure, not preempted."""

    name: str
    role: str
    replicas: int
    gpu: int = 0  # whole GPUs per replica
    gpu_memory_mib: int = 0  # fractional request on one GPU
    gpu_compute_pct: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    mig_profile: str = ""  # one MIG instance of this profile ("1g.10gb") per replica
    min_replicas: int | None = None
    max_replicas: int | None = None

    @property
    def shape(self) -> tuple[int, int, int, str, int, int]:
        """What one replica asks of a node: equal shapes fit and score alike."""
        return (self.gpu, self.gpu_memory_mib, self.gpu_compute_pct, self.mig_profile, self.cpu_milli,
                self.memory_mib)

    @property
    def shared(self) -> bool:
        return self.gpu == 0 and (self.gpu_memory_mib > 0 or self.gpu_compute_pct > 0)

    @property
    def mig(self) -> bool:
        return self.gpu == 0 and bool(self.mig_profile) and not self.shared

    @property
    def mig_slices(self) -> int:
        return slices_of(self.mig_profile)

    @property
    def elastic(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    @property
    def least_replicas(self) -> int:
        return self.replicas if self.min_replicas is None else min(self.min_replicas, self.replicas)

    @property
    def most_replicas(self) -> int:
        return self.replicas if self.max_replicas is None else max(self.max_replicas, self.replicas)

    @property
    def gpu_amount(self) -> float:
        """GPUs one replica holds, fractions for shares (compute, or memory if no compute)."""
        if self.gpu:
            return float(self.gpu)
        if self.shared:
            return self.gpu_compute_pct / 100.0 if self.gpu_compute_pct else 0.0
        return self.mig_slices / SLICES


@dataclass(frozen=True, slots=True)
class AffinityRule:
    """Replicas of ``role`` want to be (``anti``: not to be) near those of ``to_role``, or
    with ``to_jobs`` near other jobs' tasks whose labels include those pairs. ``scope``:
    "node", "rack", or a node label key (its value is the domain; NVLINK_DOMAIN defaults
    to the node); ``required``: a hard constraint, else a preference.
    ``AffinityRule("worker", "worker", "node", anti=True)`` spreads workers."""

    role: str
    to_role: str
    scope: str = "node"
    anti: bool = False
    required: bool = False
    to_jobs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class JobRequest:
    job_id: str
    tasks: tuple[TaskRequest, ...]
    queue: str = "default"
    tenant: str = "default"
    priority: int = 0  # the user priority (-1000..1000)
    submit_time: float = 0.0
    min_available: int | None = None
    priority_class: str = "normal"  # low | normal | high | urgent (values from config)
    user: str = ""
    runtime_estimate_s: float | None = None
    # durations (s) of similar finished jobs, the history the estimate came from: the
    # srpt plugin's Gittins rank reads the spread in them (empty: the estimate alone)
    runtime_samples: tuple[float, ...] = ()
    preemptible: bool = True
    checkpoint_grace_s: float = 30.0  # time the victim gets to checkpoint before it stops
    min_runtime_s: float = 0.0  # no preemption before it has run this long
    gpu_models: tuple[str, ...] = ()  # allowed GPU models; empty = any
    labels: Mapping[str, str] = field(default_factory=dict)  # what other jobs' affinity selects
    # the job's speed per GPU model, relative to the model its runtime estimate is for
    # (1.0); a model it lacks runs it at its lowest given speed. Empty: blind to models
    gpu_speeds: tuple[tuple[str, float], ...] = ()
    # the user's order of preference of each of ``gpu_models`` (0: first choice; models of
    # one family asked for together share a rank). Empty: no preference
    gpu_model_ranks: tuple[int, ...] = ()
    # one GPU of a model in fair share (its queue's billing weights; unnamed: 1; empty: all 1)
    gpu_prices: tuple[tuple[str, float], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[str, ...] = ()  # taint keys or full taints this job tolerates
    affinity: tuple[AffinityRule, ...] = ()
    dataset: str = ""  # prefer nodes whose cache holds it
    attained_service_s: float = 0.0  # GPU-seconds received in earlier attempts (LAS, SRTF)
    attempt: int = 1

    @property
    def total_replicas(self) -> int:
        return sum(t.replicas for t in self.tasks)

    @property
    def gang_size(self) -> int:
        return self.min_available or self.total_replicas

    @property
    def min_members(self) -> int:
        """Replicas that must start together: minAvailable, else the elastic minimum."""
        if self.min_available:
            return self.min_available
        return sum(t.least_replicas for t in self.tasks)

    @property
    def total_gpus(self) -> float:
        return sum(t.replicas * t.gpu_amount for t in self.tasks)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds allocations. ``terminating``: already asked to stop (preempted,
    shrinking); its allocations hold their GPUs, but it is neither preempted again nor
    counted as future usage when placing the job it makes room for."""

    job: JobRequest
    start_time: float
    last_checkpoint_time: float | None = None
    terminating: bool = False


@dataclass(frozen=True, slots=True)
class Resources:
    """A resource vector for quotas and fair share."""

    gpu: float = 0.0
    cpu_milli: float = 0.0
    memory_mib: float = 0.0

    def __add__(self, o: Resources) -> Resources:
        return Resources(self.gpu + o.gpu, self.cpu_milli + o.cpu_milli, self.memory_mib + o.memory_mib)

    def __sub__(self, o: Resources) -> Resources:
        return Resources(self.gpu - o.gpu, self.cpu_milli - o.cpu_milli, self.memory_mib - o.memory_mib)

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.gpu, self.cpu_milli, self.memory_mib)


@dataclass(frozen=True, slots=True)
class Quota:
    """A tenant's quota in a Kueue-style cohort: ``nominal``; others may borrow up to
    ``lending_limit`` of it (the rest is guaranteed); it may borrow up to ``borrowing_limit``
    above nominal from the cohort (None: no limit); ``weight`` scales its DRF share."""

    tenant: str
    nominal: Resources
    cohort: str = ""
    borrowing_limit: Resources | None = None
    lending_limit: Resources | None = None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class TaskShape:
    """A kind of task in the workload, with its share of all tasks (FGD's M and p_m)."""

    weight: float
    gpu: int = 0
    gpu_memory_mib: int = 0
    gpu_compute_pct: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[Node, ...]
    allocations: tuple[Allocation, ...]
    pending: tuple[JobRequest, ...]  # in the order queueing admitted them
    running: tuple[RunningJob, ...] = ()  # jobs holding allocations, for preemption etc.
    quotas: tuple[Quota, ...] = ()  # empty: no quota admission in the core
    telemetry: Mapping[str, tuple[GpuStats, ...]] = field(default_factory=dict)  # by node id
    task_mix: tuple[TaskShape, ...] = ()  # FGD's workload; empty: derived from the snapshot
    # per tenant, past GPU-seconds decayed to ``now`` (scheduling/decay.py; fairshare half_life_s)
    past_usage: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Bind:
    job_id: str
    task_id: str  # "<task name>-<replica>"
    task_name: str
    replica: int
    node_id: str
    gpus: tuple[GpuUse, ...]
    cpu_milli: int
    memory_mib: int
    role: str = ""


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop every task of ``job_id`` (the victim) so that ``preemptor`` can start."""

    job_id: str
    reason: PreemptReason
    preemptor: str
    grace_period_s: float
    task_ids: tuple[str, ...] = ()
    node_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Resize:
    """An elastic job changes one task group's replica count. Grow: start ``binds`` (new
    replicas). Shrink: stop ``stop_task_ids`` (highest replicas) after ``grace_period_s``."""

    job_id: str
    task_name: str
    replicas_from: int
    replicas_to: int
    reason: ResizeReason
    binds: tuple[Bind, ...] = ()
    stop_task_ids: tuple[str, ...] = ()
    for_job: str = ""  # the job a shrink makes room for
    grace_period_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Reservation:
    """EASY backfill: the blocked head job is expected to start at ``start_time`` here."""

    job_id: str
    start_time: float
    node_ids: tuple[str, ...]


@dataclass(slots=True)
class Plan:
    binds: list[Bind] = field(default_factory=list)
    pending: dict[str, PendingReason] = field(default_factory=dict)
    preemptions: list[Preemption] = field(default_factory=list)
    resizes: list[Resize] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # pending job ids in the order tried
    # a job pending for PRIORITY or BACKFILL_BLOCKED -> the job it waits behind
    blocked_by: dict[str, str] = field(default_factory=dict)

    def binds_by_job(self) -> dict[str, list[Bind]]:
        out: dict[str, list[Bind]] = {}
        for b in self.binds:
            out.setdefault(b.job_id, []).append(b)
        return out
