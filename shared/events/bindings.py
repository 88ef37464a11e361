"""The scheduler's placements (``bindings``, keyed by node) and an agent's refusal of
one (``jobs.status``, keyed by job)."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from shared.events.base import Event
from shared.events.reasons import EndCause, EndCode


class GpuAssignment(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    index: int
    uuid: str = ""
    memory_mib: int = Field(0, description="0 = the whole GPU")
    compute_pct: int = Field(100, description="100 = the whole GPU")
    mig_profile: str = Field("", description="a MIG instance of this profile, not the GPU")
    mig_start: int = Field(-1, description="the MIG instance's first memory slice")


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
    cause: EndCode = Field(
        default=None, description="stop / resize: why the tasks are stopped, as a code "
        "(shared/events/reasons.py EndCause); the agent reports their end with it")
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

    def stop_cause(self) -> EndCause:
        """Why this stop's tasks end: its code, or (an older scheduler) its text's."""
        if self.cause is not None:
            return self.cause
        return EndCause.PREEMPTED if self.reason.startswith("preempt") else EndCause.CANCELLED


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
