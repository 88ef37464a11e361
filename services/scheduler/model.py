"""What the scheduler holds: jobs, the tasks they placed, nodes, and what handling produced.

``Cluster`` is the one record every part of the state (lifecycle, nodes, resizes,
bindings, snapshot) reads and changes; ``Output`` collects what a batch of events made
the scheduler publish and persist.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from scheduling import GpuUse
from services.scheduler.history import JobHistory
from shared.events import (
    EndCause,
    Envelope,
    Event,
    JobReady,
    JobState,
    NodeInventory,
    NodeSchedulability,
    NodeTelemetry,
)
from shared.topics import topic_for

SOURCE = "scheduler"
TERMINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED}
DEFAULT_GRACE_S = 30.0  # checkpoint grace when the core gives none (JobRequest's default)
# Node losses are not the job's failures and do not spend its maxRetry; but a job whose
# nodes keep dying under it may be what kills them, so this many losses fail it.
MAX_NODE_LOSSES = 10


@dataclass
class Placed:
    """One task of one attempt on a node; holds its resources until it is terminal."""

    task_id: str
    task_name: str
    replica: int
    rank: int
    node_id: str
    gpus: tuple[GpuUse, ...]
    cpu_milli: int
    memory_mib: int
    attempt: int
    state: JobState = JobState.BOUND
    removed: bool = False  # a shrink asked it to stop; the job goes on without it

    @property
    def core_id(self) -> str:
        """The id the scheduling core knows it by (``<task>-<replica>``). ``task_id`` is
        unique per incarnation: a replica grown again after a shrink gets a new one."""
        return f"{self.task_name}-{self.replica}"

    def to_json(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in (
            "task_id", "task_name", "replica", "rank", "node_id", "cpu_milli", "memory_mib",
            "attempt", "removed")}, "state": self.state.value,
            "gpus": [[g.index, g.memory_mib, g.compute_pct, *([g.mig_slices, g.mig_slots] if g.mig_slots else [])]
                     for g in self.gpus]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Placed:
        return cls(**{**d, "state": JobState(d["state"]),
                      "gpus": tuple(GpuUse(*g) for g in d["gpus"])})


# a stop for good: the job ends once its tasks have stopped
ENDING = frozenset({EndCause.CANCELLED, EndCause.TIME_LIMIT})
# a stop for other work: the job runs again with a new attempt, its retries untouched
FOR_OTHERS = frozenset({EndCause.PREEMPTED, EndCause.DRAINED})
_STRENGTH = {EndCause.PREEMPTED: 0, EndCause.DRAINED: 0, EndCause.RECLAIMED: 1,
             EndCause.CANCELLED: 2, EndCause.TIME_LIMIT: 2}


@dataclass(frozen=True)
class Stopping:
    """Why the scheduler asked a job's current attempt to stop: one typed cause (the
    code its stop bindings carry, ``EndCause``) and, for people, a detail.

    ``cancelled`` (detail ``returned`` for an interactive environment handed back) and
    ``time_limit`` end the job once its tasks have stopped; ``preempted`` (detail: the
    preemptor) and ``drained`` (the node) run it again with a new attempt that does not
    spend a retry; ``reclaimed`` (its queue's reason) hands it back to its queue.
    ``after``: the cause whose stop was already sent when this one came (a reclaim or a
    cancel during a preemption): that stop is in flight, none is sent again."""

    cause: EndCause
    detail: str = ""
    after: EndCause | None = None


@dataclass
class SchedJob:
    job_id: str
    ready: JobReady | None  # None for a tombstone (cancel seen before the job)
    state: JobState
    attempt: int
    seq: int  # arrival order, for FIFO among pending jobs
    placed: list[Placed] = field(default_factory=list)  # includes tasks of older attempts
    stopping: Stopping | None = None  # why its current attempt was asked to stop, if it was
    bound_at: float | None = None  # when the current attempt was placed (scheduler clock)
    bound_model: str = ""  # the one GPU model it was placed on ("": none, or several)
    targets: dict[str, int] = field(default_factory=dict)  # user resize: replicas per group
    resizes: int = 0  # resizes so far (deterministic ids of their events and new tasks)
    requeues: int = 0  # attempts that a drain started again (not counted against maxRetry)
    node_losses: int = 0  # attempts ended by a lost node (requeued, not counted as retries)

    def ask_stop(self, cause: EndCause, detail: str = "") -> None:
        """Record why the current attempt is asked to stop (the caller sends the stop).
        The stronger cause stands: ending the job over handing it back to its queue,
        that over running it again; a stop for others met on the way is kept in flight."""
        before = self.stopping
        if before is None:
            self.stopping = Stopping(cause, detail)
            return
        in_flight = before.cause if before.cause in FOR_OTHERS else before.after
        if _STRENGTH[cause] < _STRENGTH[before.cause]:
            self.stopping = replace(before, after=cause if cause in FOR_OTHERS else before.after)
        else:
            self.stopping = Stopping(cause, detail, in_flight)

    @property
    def ending(self) -> bool:
        """Asked to stop for good (cancelled, its time limit)."""
        return self.stopping is not None and self.stopping.cause in ENDING

    @property
    def preempted(self) -> bool:
        """A stop for other work (a preemption, a drain) was sent and is in flight."""
        return self.stopping is not None and (self.stopping.cause in FOR_OTHERS
                                              or self.stopping.after in FOR_OTHERS)

    @property
    def reclaimed(self) -> bool:
        """Its queue took its quota back: once stopped it returns to its queue."""
        return self.stopping is not None and self.stopping.cause is EndCause.RECLAIMED

    def live(self) -> Iterator[Placed]:
        return (p for p in self.placed if p.state not in TERMINAL)

    def current(self) -> list[Placed]:
        """The tasks of the current attempt, less those a shrink removed."""
        return [p for p in self.placed if p.attempt == self.attempt and not p.removed]

    def active(self, task_name: str | None = None) -> list[Placed]:
        """Current tasks still holding resources (of one group, or all)."""
        return [p for p in self.current() if p.state not in TERMINAL
                and (task_name is None or p.task_name == task_name)]


@dataclass
class NodeView:
    inventory: NodeInventory
    lost: bool = False
    degraded_gpus: frozenset[int] = frozenset()
    cordon: str = ""  # "" | "cordoned" | "draining": an operator's command
    cordon_generation: int = 0  # of the last command applied (replays are ignored)
    cordon_reason: str = ""
    drained: bool = False  # draining and nothing of ours runs there any more (announced)
    admin_labels: dict[str, str] = field(default_factory=dict)  # an admin's, over the agent's
    admin_taints: tuple[str, ...] = ()  # an admin's, beside the agent's
    labels_generation: int = 0  # of the last admin change applied (replays are ignored)
    datasets: frozenset[str] | None = None  # from heartbeats; None = the inventory's

    def current_datasets(self) -> frozenset[str]:
        return self.datasets if self.datasets is not None \
            else frozenset(self.inventory.datasets)

    @property
    def scheduling(self) -> NodeSchedulability:
        if self.cordon == "draining":
            return NodeSchedulability.DRAINED if self.drained else NodeSchedulability.DRAINING
        return NodeSchedulability.CORDONED if self.cordon else NodeSchedulability.SCHEDULABLE


class Cluster:
    """The nodes and jobs the scheduler holds, shared by every part of its state."""

    def __init__(self, epoch: int, history: JobHistory | None = None) -> None:
        self.epoch = epoch
        # succeeded jobs' durations, for the requests' estimates (None: none from history)
        self.history = history
        self.succeeded: list[SchedJob] = []  # since the last cycle, which learns them
        self.nodes: dict[str, NodeView] = {}
        self.jobs: dict[str, SchedJob] = {}
        self.telemetry: dict[str, NodeTelemetry] = {}
        self.finished: set[str] = set()  # ended jobs, evicted from ``jobs`` once persisted
        self.needs_cycle = True
        # raised whenever what the core's node table holds changes (``SnapshotBuilder``)
        self.nodes_version = 0
        self.seq = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def nodes_changed(self) -> None:
        """A node's inventory, health, cordon or reachability changed: rebuild the core's
        node table and run a cycle."""
        self.nodes_version += 1
        self.needs_cycle = True


@dataclass
class Output:
    """What handling produced: events to publish and the jobs whose rows changed."""

    events: list[tuple[Envelope, str]] = field(default_factory=list)
    dirty_jobs: set[str] = field(default_factory=set)
    dirty_nodes: set[str] = field(default_factory=set)
    # appended to fixed event ids: a resend within one epoch (the broker came back
    # empty) needs ids of its own, or the outbox takes it for the first send
    id_suffix: str = ""

    def emit(self, event: Event, source: str, event_id: str | None = None) -> None:
        if event_id is not None:
            event_id += self.id_suffix
        self.events.append((Envelope.wrap(event, source, event_id), topic_for(event).name))
