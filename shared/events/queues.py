"""Queue events, keyed by queue (``queues.events``): configuration changes, admins'
commands and usage against quota with the waiting jobs."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.events.base import Event
from shared.events.reasons import WaitCode


class QueueRefusal(StrEnum):
    """Why queueing refused an admin command; the gateway answers each with its own
    HTTP status (``services/admission/queues_view.py``)."""

    NOT_FOUND = "not_found"  # no such queue
    EXISTS = "exists"  # a create of a queue that exists
    CONFLICT = "conflict"  # the queue cannot take that state
    INVALID = "invalid"  # the settings do not validate, or break the tree


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
    refusal: QueueRefusal | None = Field(default=None, description="rejected: the kind")
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
    reason: WaitCode = Field(description="quota | reclaim | queue_closed | priority | "
                             "array_limit (shared/events/reasons.py WaitReason)")
    detail: str = ""
    estimated_start: datetime | None = None
    blocked_by: str | None = Field(default=None, description="priority: the job ahead of "
                                   "it in its strict queue")


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
    used_by_model: dict[str, float] = Field(default_factory=dict, description=(
        "GPUs held of each GPU model its tree gives a quota of its own (subtree, as used)"))
    pending: int = 0
    admitted: int = 0
    running: int = 0
    waiting: list[WaitingJob] = Field(default_factory=list, description="in queue order "
                                      "(the first 500)")

    def key(self) -> str:
        return self.queue
