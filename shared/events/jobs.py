"""Job events: submission and admission (``jobs.submitted`` / ``jobs.ready``, keyed by
queue), transitions and waits (``jobs.status``, keyed by job) and commands
(``jobs.commands``, keyed by job)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from shared.events.base import Event
from shared.events.reasons import EndCause, EndCode, TransitionCode, WaitCode, classify_end
from shared.jobspec import JobSpec


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
    gpu_models: list[str] = Field(default_factory=list, description=(
        "the GPU models the quota it was admitted against covers: it runs only on these "
        "(empty: any its spec allows)"))
    billing_weights: dict[str, float] = Field(default_factory=dict, description=(
        "its queue's billing weights per GPU model (shared/billing.py): what one GPU-hour "
        "of a model counts as in fair share"))

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
    reason: str = Field(description="why, in words (see reason_code)")
    reason_code: TransitionCode = Field(
        default=None, description="why, as a code (shared/events/reasons.py "
        "TransitionReason); absent from an older producer: readers classify the text")
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
    cause: EndCode = Field(
        default=None, description="a task's end: why, as a code (shared/events/reasons.py "
        "EndCause); absent from an older agent: read end_cause()")

    def key(self) -> str:
        return self.job_id

    def end_cause(self) -> EndCause:
        """Why this task ended: its code, or (an older agent) what its text says."""
        return self.cause or classify_end(self.state.value, self.reason)


class JobWaiting(Event):
    """Why the scheduler has not placed an admitted job yet, sent when that changes (the
    reason, or the estimated start by more than a minute). Not a transition: the job stays
    ``admitted``; its next status (bound, cancelled, ...) ends the wait."""

    TYPE: ClassVar[str] = "job.waiting"
    job_id: str
    attempt: int = 1
    reason: WaitCode = Field(description="the scheduling core's pending reason: no_fit, "
                             "gang_incomplete, never_fits, priority, preempting, "
                             "cordoned, ... (shared/events/reasons.py WaitReason; a code "
                             "this reader lacks reads as unknown)")
    detail: str = ""
    blocked_by: str | None = Field(
        default=None, description="priority / backfill_blocked: the job it waits behind")
    estimated_start: datetime | None = Field(
        default=None, description="when backfill expects it to start (its reservation)")
    epoch: int | None = Field(default=None, description="the scheduler epoch that said so")

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
