"""Event contracts: one frozen pydantic model per event type, inside one envelope.

Every message on every topic is an :class:`Envelope` serialised as JSON. ``type``
names the payload model (see ``EVENT_TYPES``); ``schema_version`` is that model's
version. Consumers tolerate unknown newer fields (``extra="ignore"``) so producers can
add optional fields without a coordinated deploy.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.jobspec import JobSpec


def utcnow() -> datetime:
    return datetime.now(UTC)


class Event(BaseModel):
    """Base of every payload: frozen, tolerant of newer fields, versioned."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    TYPE: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1

    def key(self) -> str:  # pragma: no cover - every subclass overrides
        raise NotImplementedError


class JobState(StrEnum):
    """The job life of DESIGN.md; task-level reports use the same names."""

    PENDING = "pending"
    ADMITTED = "admitted"
    BOUND = "bound"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


# --- jobs.submitted / jobs.ready (keyed by queue) -------------------------------------


class JobSubmitted(Event):
    TYPE: ClassVar[str] = "job.submitted"
    job_id: str
    queue: str
    tenant: str
    user: str
    spec: JobSpec
    submitted_at: datetime
    # an element of a job array: its array, index, and the array's cap on elements
    # holding quota at once (queueing keeps to it)
    array_id: str | None = None
    array_index: int | None = None
    array_max_running: int | None = None

    def key(self) -> str:
        return self.queue


class JobReady(Event):
    """Queueing admitted the job against its queue's quota; the scheduler may place it."""

    TYPE: ClassVar[str] = "job.ready"
    job_id: str
    queue: str
    tenant: str
    user: str
    spec: JobSpec
    submitted_at: datetime
    admitted_at: datetime
    attempt: int = 1

    def key(self) -> str:
        return self.queue


# --- jobs.status (keyed by job) --------------------------------------------------------


# The reason an agent gives when it stops a task at its spec's timeLimit; the scheduler
# ends the job on it (no retry): cancelled for an interactive environment, failed for batch.
TIME_LIMIT_REACHED = "time limit reached"
# The cancel reason of an interactive environment handed back by its user; the job ends
# cancelled with it.
RETURNED = "returned"
# the reason's prefix of a task an agent stopped (or did not start) because it could not
# renew its lease: its node is as good as lost, and the job is not to blame
FENCED = "fenced"


class Connection(BaseModel):
    """How to reach an interactive environment: the host and port the agent allocated,
    or the Pod's Service (Kubernetes runtime)."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    host: str = ""
    port: int | None = None
    service: str = Field(default="", description="Kubernetes: the Service in front of the Pod")
    simulated: bool = Field(default=False, description="a simulated node: nothing listens")


class JobStatus(Event):
    """A transition of a whole job (``task`` empty) or of one task replica of it."""

    TYPE: ClassVar[str] = "job.status"
    job_id: str
    state: JobState
    reason: str
    attempt: int = 1
    exit_code: int | None = None
    task: str | None = Field(default=None, description="task id, e.g. worker-0; empty = job")
    node_id: str | None = None
    message: str | None = None
    epoch: int | None = Field(default=None, description="scheduler epoch of the binding")
    replicas: dict[str, int] | None = Field(
        default=None, description="after a resize: replicas per task group")
    connection: Connection | None = Field(
        default=None, description="running task of an interactive environment: where to "
        "connect")
    ran_s: float | None = Field(
        default=None, description="a task that ended (preempted, cancelled, ...): the "
        "seconds it ran on its node, the work done")
    checkpoint: str | None = Field(
        default=None, description="a task that ended: the last checkpoint it recorded "
        "(KAIROS_CHECKPOINT_FILE / the Pod's termination message), where known")

    def key(self) -> str:
        return self.job_id


class JobWaiting(Event):
    """Why the scheduler has not placed an admitted job yet, sent when that changes (the
    reason, or the estimated start by more than a minute). Not a transition: the job stays
    ``admitted``; its next status (bound, cancelled, ...) ends the wait."""

    TYPE: ClassVar[str] = "job.waiting"
    job_id: str
    attempt: int = 1
    reason: str = Field(description="the scheduling core's pending reason: no_fit, "
                        "gang_incomplete, never_fits, preempting, cordoned, ...")
    detail: str = ""
    estimated_start: datetime | None = Field(
        default=None, description="when backfill expects it to start (its reservation)")
    epoch: int | None = Field(default=None, description="the scheduler epoch that said so")

    def key(self) -> str:
        return self.job_id


class BindingRefused(Event):
    """An agent refused a binding (e.g. from a stale scheduler epoch)."""

    TYPE: ClassVar[str] = "binding.refused"
    job_id: str
    node_id: str
    binding_id: str
    reason: str
    epoch: int
    current_epoch: int

    def key(self) -> str:
        return self.job_id


# --- jobs.commands (keyed by job) ------------------------------------------------------


class CommandAction(StrEnum):
    CANCEL = "cancel"
    PREEMPT = "preempt"
    RESIZE = "resize"


class JobCommand(Event):
    TYPE: ClassVar[str] = "job.command"
    job_id: str
    action: CommandAction
    reason: str = ""
    requested_by: str = ""
    replicas: int | None = Field(default=None, description="resize: the replica count wanted")
    task: str | None = Field(default=None, description="resize: the elastic task group; "
                             "empty = the job's only elastic group")

    def key(self) -> str:
        return self.job_id


# --- bindings (keyed by node) ----------------------------------------------------------


class GpuAssignment(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    index: int
    uuid: str = ""
    memory_mib: int = Field(0, description="0 = the whole GPU")
    compute_pct: int = Field(100, description="100 = the whole GPU")


class TaskBinding(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    task_id: str
    task_name: str
    role: str
    replica: int
    rank: int
    local_rank: int | None = Field(default=None, description="rank among the job's tasks "
                                   "on this node")
    local_world_size: int | None = Field(default=None, description="the job's tasks on this "
                                         "node (a resize binding lists only the new ones)")
    gpus: list[GpuAssignment] = Field(default_factory=list)
    cpu_milli: int = 0
    memory_mib: int = 0
    image: str = ""
    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class ClusterMember(BaseModel):
    """One task of the job wherever it runs, so every node can build TF_CONFIG."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    role: str
    rank: int
    host: str
    port: int | None = None


class BindingAction(StrEnum):
    ALLOCATE = "allocate"
    STOP = "stop"
    RESIZE = "resize"
    FENCE = "fence"  # no tasks: a new leader announces its epoch to every node
    # a node that (re)registers or comes back after it was declared lost: ``owned`` lists
    # every task the scheduler holds there; the agent stops the others it still runs
    RECONCILE = "reconcile"


class Binding(Event):
    """The scheduler's decision for one node: start (or stop) these tasks of a job."""

    TYPE: ClassVar[str] = "binding"
    binding_id: str
    action: BindingAction
    node_id: str
    epoch: int
    job_id: str
    attempt: int = 1
    tasks: list[TaskBinding] = Field(default_factory=list)
    cluster: list[ClusterMember] = Field(default_factory=list)
    world_size: int = 1
    master_addr: str = ""
    master_port: int = 29500
    duration_s: float | None = None
    grace_period_s: float = 30.0
    reason: str = ""
    stop_task_ids: list[str] = Field(
        default_factory=list, description="resize: tasks of the job to stop on this node "
        "(checkpoint signal, grace period, kill); the others keep running")
    owned: list[str] = Field(
        default_factory=list, description="reconcile: keys (job/task/attempt) of every task "
        "the scheduler holds on this node; the agent stops any other task it runs")
    time_limit_s: float | None = Field(
        default=None, description="the agent stops the tasks this long after they start")
    interactive: bool = Field(
        default=False, description="an interactive environment: the agent allocates a port "
        "(KAIROS_PORT) and reports the connection")

    def key(self) -> str:
        return self.node_id


# --- nodes.lifecycle / nodes.telemetry (keyed by node) ---------------------------------


class GpuInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    index: int
    uuid: str
    model: str
    memory_mib: int
    nvlink_domain: int = 0
    nvlink_peers: list[int] = Field(default_factory=list)
    mig_mode: bool = False


class NodeInventory(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    node_id: str
    hostname: str = ""
    address: str = ""
    cpu_milli: int
    memory_mib: int
    gpus: list[GpuInfo] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    rack: str = ""
    runtime: str = "simulated"
    agent_url: str = Field(default="", description="the agent's HTTP base URL (task logs)")
    datasets: list[str] = Field(
        default_factory=list, description="datasets the node's local cache holds (locality)")


class NodeRegistered(Event):
    TYPE: ClassVar[str] = "node.registered"
    inventory: NodeInventory
    agent_started_at: datetime

    def key(self) -> str:
        return self.inventory.node_id


class NodeHeartbeat(Event):
    TYPE: ClassVar[str] = "node.heartbeat"
    node_id: str
    running_tasks: int = 0
    max_epoch_seen: int = 0
    datasets: list[str] | None = Field(
        default=None, description="the local dataset cache now; None = not reported")

    def key(self) -> str:
        return self.node_id


class NodeLost(Event):
    TYPE: ClassVar[str] = "node.lost"
    node_id: str
    last_seen: datetime
    reason: str = "missed heartbeats"

    def key(self) -> str:
        return self.node_id


class NodeAction(StrEnum):
    CORDON = "cordon"
    DRAIN = "drain"
    UNCORDON = "uncordon"


class NodeCommand(Event):
    """An operator's cordon / drain / uncordon of a node (admission, through its outbox).
    ``generation`` rises with every command for the node, so a replay is ignored."""

    TYPE: ClassVar[str] = "node.command"
    node_id: str
    action: NodeAction
    generation: int = 0
    reason: str = ""
    requested_by: str = ""
    grace_period_s: float = Field(default=30.0, ge=0, description="drain: checkpoint grace")

    def key(self) -> str:
        return self.node_id


class NodeSchedulability(StrEnum):
    SCHEDULABLE = "schedulable"
    CORDONED = "cordoned"  # nothing new is placed there
    DRAINING = "draining"  # cordoned, and its tasks are being stopped and requeued
    DRAINED = "drained"  # cordoned, and nothing runs there any more


class NodeSchedulingChanged(Event):
    """The scheduler applied a node command (or a drain finished)."""

    TYPE: ClassVar[str] = "node.scheduling"
    node_id: str
    scheduling: NodeSchedulability
    generation: int = 0
    reason: str = ""

    def key(self) -> str:
        return self.node_id


class GpuHealth(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"


class GpuTelemetry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    index: int
    utilization_pct: float
    memory_used_mib: int
    temperature_c: float
    power_w: float = 0.0
    health: GpuHealth = GpuHealth.HEALTHY


class NodeTelemetry(Event):
    TYPE: ClassVar[str] = "node.telemetry"
    node_id: str
    gpus: list[GpuTelemetry]

    def key(self) -> str:
        return self.node_id


# --- queues.events / dead letters ------------------------------------------------------


class QueueChanged(Event):
    """Queueing applied a queue's configuration (from its file or an admin command):
    ``settings`` is the whole queue as it is now. ``rejected`` answers a command that
    queueing refused (``error`` says why); nothing changed then."""

    TYPE: ClassVar[str] = "queue.changed"
    queue: str
    change: Literal["created", "updated", "closed", "draining", "opened", "deleted",
                    "rejected"]
    settings: dict[str, Any] = Field(default_factory=dict)
    request_id: str = Field(default="", description="the admin command this answers")
    error: str = Field(default="", description="rejected: why")
    version: int = Field(default=0, description="rises with every change of the queue")

    def key(self) -> str:
        return self.queue


class QueueAction(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    CLOSE = "close"
    DRAIN = "drain"
    OPEN = "open"


class QueueCommand(Event):
    """An admin's change to a queue (admission, through its outbox); queueing applies or
    rejects it and answers with ``queue.changed`` carrying the same ``request_id``."""

    TYPE: ClassVar[str] = "queue.command"
    request_id: str
    queue: str
    action: QueueAction
    settings: dict[str, Any] = Field(default_factory=dict, description="create / update: "
                                     "the queue's fields (update: only those that change)")
    requested_by: str = ""

    def key(self) -> str:
        return self.queue


class WaitingJob(BaseModel):
    """Why a job still waits in its queue."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    job_id: str
    position: int = Field(description="1 = next in its queue's order")
    reason: str = Field(description="quota | reclaim | queue_closed | priority | array_limit")
    detail: str = ""
    estimated_start: datetime | None = None


class QueueStatus(Event):
    """A queue's usage against its quota and its waiting jobs, after a queueing cycle
    changed them. Resources are GPUs (fractions for shares), CPU millicores, memory MiB."""

    TYPE: ClassVar[str] = "queue.status"
    queue: str
    tenant: str = ""
    state: str = "open"
    guaranteed: dict[str, float | None] = Field(default_factory=dict)
    used: dict[str, float] = Field(default_factory=dict)
    borrowed: dict[str, float] = Field(default_factory=dict)
    pending: int = 0
    admitted: int = 0
    running: int = 0
    waiting: list[WaitingJob] = Field(default_factory=list, description="in queue order "
                                      "(the first 500)")

    def key(self) -> str:
        return self.queue


class DeadLetter(Event):
    """A message a consumer could not handle, kept with the reason."""

    TYPE: ClassVar[str] = "dead.letter"
    topic: str
    partition: int
    offset: int
    msg_key: str | None
    value: str = Field(description="the original bytes, decoded as UTF-8 with replacement")
    reason: str
    error: str
    consumer_group: str

    def key(self) -> str:
        return self.topic


class BrokerIncarnation(Event):
    """The first message of a broker's log: written when the platform found the broker
    empty (a fresh start, or one that came back without its log) and refilled it from
    the outboxes. A new id tells every service that the log started over."""

    TYPE: ClassVar[str] = "broker.incarnation"
    incarnation: str
    refilled: int = Field(default=0, description="outbox rows marked to publish again")
    by: str = Field(default="", description="the service that found the broker empty")

    def key(self) -> str:
        return "broker"


EVENT_TYPES: dict[str, type[Event]] = {
    m.TYPE: m
    for m in (
        JobSubmitted,
        JobReady,
        JobStatus,
        JobWaiting,
        BindingRefused,
        JobCommand,
        Binding,
        NodeRegistered,
        NodeHeartbeat,
        NodeLost,
        NodeCommand,
        NodeSchedulingChanged,
        NodeTelemetry,
        QueueChanged,
        QueueCommand,
        QueueStatus,
        DeadLetter,
        BrokerIncarnation,
    )
}


class Envelope(BaseModel):
    """What travels on the wire. ``data`` is the payload of the model named by ``type``."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    type: str
    schema_version: int
    occurred_at: datetime = Field(default_factory=utcnow)
    source: str
    key: str
    data: dict[str, Any]

    @classmethod
    def wrap(cls, event: Event, source: str, event_id: str | None = None) -> Envelope:
        return cls(
            id=event_id or uuid.uuid4().hex,
            type=event.TYPE,
            schema_version=event.VERSION,
            source=source,
            key=event.key(),
            data=event.model_dump(mode="json"),
        )

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def decode(cls, raw: bytes) -> Envelope:
        return cls.model_validate_json(raw)

    def payload(self) -> Event:
        """The typed event; raises KeyError for an unknown type, ValidationError if bad."""
        model = EVENT_TYPES[self.type]
        return model.model_validate(self.data)
