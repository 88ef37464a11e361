"""The plugin interface and what a plugin sees of one cycle.

One small interface (Volcano's framework): a plugin implements any of the hooks below;
the scheduler collects, once, the plugins that override each hook and calls them in
the configured order. Hooks take the cycle and return plain values or numpy arrays
over the nodes (``cand`` holds node indices), so a plugin never walks nodes in Python.

- ``open``: start of a cycle (publish the plugin's per-cycle state, below)
- ``static_priority`` / ``task_order``: a job's priority before aging, the order its
  tasks are placed in (the first plugin that answers decides; asked once per job object)
- ``order_keys``: sort keys over the pending jobs (ascending: earlier first)
- ``admit``: a quota / fairness gate before placement (a ``PendingReason`` refuses)
- ``node_mask``: a static predicate per task (selectors, taints, GPU models)
- ``task_mask`` / ``score``: per-replica predicate and score while a gang is placed
- ``victims``: which running jobs may be preempted for a job, and why (boolean arrays
  over ``cycle.running``; ``cycle.runs()`` has their figures as arrays)
- ``pick``: which GPUs of the chosen node (FGD picks the GPU for shares)
- ``min_members``: how many replicas must start together (gang)

Per-plugin state. ``Cycle`` holds only what every plugin shares: the snapshot, the
time, the node table and free capacity, the running and pending jobs' figures, usage
and capacity. What one plugin decides for a cycle is an object of the plugin's own
type, kept on the cycle by type: the plugin publishes it (``cycle.put(obj)``, or
``cycle.setdefault(Kind)``, which makes ``Kind()`` on first use) and readers ask for it
by type (``cycle.get(Kind)``: None where no configured plugin published one). The types
others read are the contracts below, each written by the plugins named:

- ``PlacementHints``: how the placer picks GPUs and fences gangs (binpack, topology,
  gpumodel, loadaware)
- ``JobPriorities``: the pending jobs' aged priority, who starved, the starvation
  bound (priority; read by the allocate action, fairshare, srpt)
- ``scheduling.quota.QuotaBook``: quota usage, kept up to date as jobs are placed
  (fairshare, drf; read by the session and the grow action)

A plugin's private per-cycle memos use the same API with a type of its own module.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar, Literal, TypeVar, cast

import numpy as np
from pydantic import BaseModel, ConfigDict

from scheduling.arrays import BoolArray, FloatArray, IntArray
from scheduling.model import (
    Bind,
    GpuUse,
    JobRequest,
    PendingReason,
    Plan,
    PreemptReason,
    Resources,
    RunningJob,
    Snapshot,
    TaskRequest,
)
from scheduling.node_table import NodeTable
from scheduling.state import ClusterState

_TENANT = attrgetter("run.job.tenant")
S = TypeVar("S")


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(slots=True)
class JobInfo:
    """A pending job with what every plugin would otherwise recompute."""

    job: JobRequest
    tasks: tuple[TaskRequest, ...]  # in intra-job role order
    demand: Resources
    gpus: float
    min_members: int
    static_priority: float = 0.0  # priority class value + weighted user priority
    priority: float = 0.0  # combined priority (with aging), for ordering and reports
    estimate: float | None = None  # runtime estimate, seconds
    starved: bool = False
    shape: tuple[Any, ...] = ()
    pshape: int = 0  # interned (shape, static priority, tenant): the preemption memo's key


@dataclass(slots=True)
class RunningInfo:
    """A running job, with its allocations' positions in the cycle's allocation arrays."""

    run: RunningJob
    allocs: list[int] = field(default_factory=list)
    gpus: float = 0.0
    demand: Resources = field(default_factory=Resources)
    static_priority: float = 0.0
    elastic: bool = False  # some task has a replica range
    slot: int = -1  # its row in the scheduler's running-job columns (RunTable's numbers)

    @property
    def job(self) -> JobRequest:
        return self.run.job

    def table_row(self) -> tuple[float, ...]:
        """Its RunTable numbers (``RUN_FIELDS``): static priority, GPUs, start, attained
        service, estimate (inf: none), last checkpoint (-inf: none), protected whatever
        the time, minimum run time, demand (GPUs, CPU, memory), submit time."""
        run = self.run
        job = run.job
        est, ckpt, d = job.runtime_estimate_s, run.last_checkpoint_time, self.demand
        return (self.static_priority, self.gpus, run.start_time, job.attained_service_s,
                np.inf if est is None else est, -np.inf if ckpt is None else ckpt,
                float(run.terminating or not job.preemptible), job.min_runtime_s,
                d.gpu, d.cpu_milli, d.memory_mib, job.submit_time)


RUN_FIELDS = 12


@dataclass(slots=True)
class Placing:
    """The replica being placed, on ``state``; the job's replicas so far (node, role)."""

    info: JobInfo
    task: TaskRequest
    state: ClusterState
    remaining: int = 1  # replicas of the gang still to place, this one included
    nodes: list[int] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    domains: dict[int, set[int]] = field(default_factory=dict)  # node -> NVLink domains its GPUs use


class RunTable:
    """The running jobs of a cycle as arrays (index = position in ``cycle.running``)."""

    def __init__(self, cycle: Cycle) -> None:
        runs = cycle.running
        now = cycle.now
        names = list(map(_TENANT, runs))
        self.tenants = sorted(set(names))
        code = {t: k for k, t in enumerate(self.tenants)}
        self.tenant = np.fromiter(map(code.__getitem__, names), dtype=np.int64, count=len(names))
        c = cycle.run_cols  # (RUN_FIELDS, running jobs): RunningInfo.table_row, gathered
        self.static, self.gpus, self.start, self.attained, self.estimate = (c[k] for k in range(5))
        self.demand = c[8:11].T
        # seconds since the last checkpoint (or start), and the GPU-seconds lost if stopped now
        self.since_checkpoint = np.maximum(0.0, now - np.maximum(self.start, c[5]))
        self.lost = self.gpus * self.since_checkpoint
        self.protected = (c[6] > 0) | (now - self.start < c[7])
        # how long each waited before its current start (less earlier runs, as ``waited``)
        ran = np.where(self.gpus > 0, self.attained / np.maximum(self.gpus, 1e-9), 0.0)
        self.waited = np.maximum(0.0, self.start - c[11] - ran)


@dataclass(slots=True)
class PlacementHints:
    """How the placer picks GPUs on a node and fences gangs, as the plugins set it in
    ``open`` (the defaults: no such plugin configured)."""

    spread: bool = False  # binpack's spread strategy: shares go on the freest GPU
    gang_racks: bool = False  # topology: a gang also on the fewest racks that hold it on the fewest nodes
    enforce_models: bool = False  # gpumodel: GPU picks keep to the job's GPU models
    gpu_penalty: FloatArray | None = None  # loadaware: per GPU (node, column), from telemetry


@dataclass(slots=True)
class JobPriorities:
    """The priority plugin's verdict on the pending jobs, one entry per column of
    ``cycle.cols`` (published by its ``order_keys``)."""

    priority: FloatArray  # combined priority, aging included
    starved: BoolArray  # waited past the starvation bound
    starvation_bound_s: float  # this cycle's bound (stretched under overload)
    running_starved: BoolArray | None = None  # per running job: it starved before it started
    hold_line: bool = True  # a starved job with no reservation stops every job after it


class Cycle:
    """One scheduling cycle: snapshot, arrays, and the state every plugin shares; each
    plugin's own state is kept by type (``put`` / ``get`` / ``setdefault``)."""

    def __init__(self, snapshot: Snapshot, table: NodeTable, state: ClusterState, seed: int) -> None:
        self.snapshot = snapshot
        self.now = snapshot.now
        self.table = table
        self.state = state
        self.seed = seed
        self.running: list[RunningInfo] = []
        self.running_by_id: dict[str, RunningInfo] = {}
        self.alloc_node: IntArray = np.zeros(0, dtype=np.int64)
        self.alloc_gpu: FloatArray = np.zeros(0)
        self.alloc_run: IntArray = np.zeros(0, dtype=np.int64)  # position in running, -1: none
        self.run_cols: FloatArray = np.zeros((RUN_FIELDS, 0))  # the running jobs' RunTable numbers
        self.usage: dict[str, Resources] = {}  # per tenant, running + placed this cycle
        self.placed: list[tuple[JobRequest, list[Bind]]] = []  # jobs placed this cycle, in order
        # per tenant, its decayed past use as a share of the GPUs (scheduling/decay.py;
        # empty without a half-life): fair share's key and priority's fairshare_weight
        self.past_share: dict[str, float] = {}
        self.capacity = Resources()
        self._runs: RunTable | None = None
        # the pending jobs' numbers, one column per job in the order of the JobInfo list
        # (rows: scheduling.jobcols), and what ordering found
        self.cols: FloatArray = np.zeros((10, 0))
        self.order: IntArray = np.zeros(0, dtype=np.int64)  # JobInfo positions, in order
        self._states: dict[type[Any], Any] = {}  # the plugins' own state, by type

    def put(self, state: S) -> S:
        """Publish a plugin's state for this cycle under its type (replacing any)."""
        self._states[type(state)] = state
        return state

    def get(self, kind: type[S]) -> S | None:
        """The state of that type published this cycle; None: none was."""
        return cast("S | None", self._states.get(kind))

    def setdefault(self, kind: type[S]) -> S:
        """The state of that type, made with ``kind()`` and published on first use."""
        found = self._states.get(kind)
        return cast(S, found) if found is not None else self.put(kind())

    def runs(self) -> RunTable:
        if self._runs is None:
            self._runs = RunTable(self)
        return self._runs

    def rng(self, salt: int = 0) -> np.random.Generator:
        """Seeded from config, the snapshot time and a salt: same snapshot, same draws."""
        return np.random.default_rng([self.seed, int(self.now * 1000) & 0xFFFFFFFF, salt])


class Plugin:
    """Base of every policy plugin. Override only the hooks you need."""

    name: ClassVar[str] = ""
    Args: ClassVar[type[BaseModel]] = NoArgs
    # what a keyed score of a node depends on besides the key: "state", its inventory
    # and free capacity (ClusterState.state_ids: blind to the order of alike GPUs), or
    # "node", which node it is (labels, rack, telemetry, datasets) but not what is free
    score_by: ClassVar[Literal["state", "node"]] = "state"

    def __init__(self, args: BaseModel, weight: float = 1.0) -> None:
        self.args = args
        self.weight = weight

    def open(self, cycle: Cycle) -> None:
        """Called once per cycle, once the running jobs are read, before ordering."""

    def settle(self, cycle: Cycle, plan: Plan, ordered: Sequence[JobInfo]) -> None:
        """Called once per cycle with its plan and the pending jobs in the order tried."""

    def static_priority(self, job: JobRequest) -> float | None:
        """The job's priority before aging; None: the job's own ``priority``."""
        return None

    def task_order(self, job: JobRequest) -> tuple[TaskRequest, ...] | None:
        """The job's tasks in the order they are placed; None: as the job lists them."""
        return None

    def order_keys(self, cycle: Cycle, jobs: Sequence[JobInfo]) -> list[FloatArray]:
        return []

    def admit(self, cycle: Cycle, info: JobInfo) -> PendingReason | None:
        return None

    def node_mask(self, cycle: Cycle, info: JobInfo, task: TaskRequest) -> BoolArray | None:
        return None

    def task_mask(self, cycle: Cycle, p: Placing, cand: IntArray) -> BoolArray | None:
        return None

    def score_epoch(self, cycle: Cycle) -> Hashable | None:
        """Changes when the plugin's keyed scores may change for an unchanged node state
        (new settings or workload mix); None: they hold for this cycle only. Scores
        memoised by node state are kept across cycles while every epoch is the same."""
        return None

    def task_mask_applies(self, cycle: Cycle, p: Placing) -> bool:
        """Whether ``task_mask`` may filter anything for this replica."""
        return True

    def score(self, cycle: Cycle, p: Placing, cand: IntArray) -> FloatArray | None:
        return None

    def score_key(self, cycle: Cycle, p: Placing) -> Hashable | None:
        """A key such that, this cycle, ``score`` gives a node a value that depends only
        on the key and (``score_by``) the node's state or the node itself; the placer
        then memoises the scores. None: score every candidate every time."""
        return None

    def victims(self, cycle: Cycle, info: JobInfo) -> list[tuple[BoolArray, PreemptReason]]:
        """Masks over ``cycle.running`` of jobs this plugin would preempt for ``info``."""
        return []

    def min_members(self, info: JobInfo) -> int | None:
        return None

    def pick(self, cycle: Cycle, p: Placing, i: int) -> tuple[GpuUse, ...] | None:
        """GPUs for the replica on node ``i``; None leaves it to the next plugin/default."""
        return None


REGISTRY: dict[str, type[Plugin]] = {}


def register(cls: type[Plugin]) -> type[Plugin]:
    """Class decorator: make a plugin available to the config by its ``name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"plugin name {cls.name!r} missing or already registered")
    REGISTRY[cls.name] = cls
    return cls


def overrides(plugin: Plugin, hook: str) -> bool:
    return getattr(type(plugin), hook) is not getattr(Plugin, hook)
