"""The events queueing publishes, each with the topic it goes to.

Ids are fixed by what they announce (job and attempt, queue and version, a request), so
an event stored twice or published again after a crash is one event to its consumers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.queueing.errors import (
    CommandRefused,
    InvalidQueueSettings,
    QueueExists,
    QueueNotFound,
    QueueStateConflict,
)
from services.queueing.ordering import Held
from services.queueing.quota import QueueTree, Reclaim
from services.queueing.store import JobRow
from shared.events import (
    CommandAction,
    Envelope,
    Event,
    JobCommand,
    JobReady,
    JobState,
    JobStatus,
    JobSubmitted,
    QueueChanged,
    QueueCommand,
    QueueRefusal,
    TransitionReason,
)
from shared.model_quota import NO_MODEL, Choice
from shared.queuespec import QueueSpec
from shared.topics import topic_for

SOURCE = "queueing"
Outgoing = tuple[Envelope, str]  # an event as the outbox stores it, with its topic

# A refused admin command is answered through the admin API (admission's queue routes
# answer with the status this reply carries): this is where a refusal meets HTTP.
REFUSALS: dict[type[CommandRefused], QueueRefusal] = {
    QueueNotFound: QueueRefusal.NOT_FOUND, QueueExists: QueueRefusal.EXISTS,
    QueueStateConflict: QueueRefusal.CONFLICT, InvalidQueueSettings: QueueRefusal.INVALID}


def outgoing(event: Event, event_id: str | None = None) -> Outgoing:
    return Envelope.wrap(event, SOURCE, event_id), topic_for(event).name


def queue_settings(spec: QueueSpec, tree: QueueTree) -> dict[str, Any]:
    """A queue as its ``queue.changed`` shows it: its config and the tenant it bills."""
    return {**spec.public(), "effective_tenant": tree.tenant(spec.name)
            if spec.name in tree.specs else spec.tenant}


def queue_changed(spec: QueueSpec, tree: QueueTree, version: int, change: Any = "updated",
                  request_id: str = "") -> Outgoing:
    return outgoing(QueueChanged(queue=spec.name, change=change,
                                 settings=queue_settings(spec, tree), request_id=request_id,
                                 version=version), f"queue-{spec.name}-v{version}")


def rejected(cmd: QueueCommand, error: CommandRefused) -> Outgoing:
    event = QueueChanged(queue=cmd.queue, change="rejected", request_id=cmd.request_id,
                         error=str(error), refusal=REFUSALS[type(error)])
    return outgoing(event, f"queue-rejected-{cmd.request_id}")


def admitted(job: Held, borrowing: bool, now: datetime, choice: Choice = NO_MODEL,
             billing_weights: dict[str, float] | None = None) -> list[Outgoing]:
    """``jobs.ready`` for the scheduler and the ``admitted`` status; ``choice``: the GPU
    model quota it was admitted against (the scheduler places it on those models only);
    ``billing_weights``: its queue's (the scheduler's fair share counts GPUs at them)."""
    sub, attempt = job.event, job.attempt
    ready = JobReady(job_id=sub.job_id, queue=sub.queue, tenant=sub.tenant, user=sub.user,
                     spec=sub.spec, submitted_at=sub.submitted_at, admitted_at=now,
                     attempt=attempt, gpu_models=list(choice.models),
                     billing_weights=billing_weights or {})
    why = f"admitted by queue {sub.queue}" + (
        f" against its {choice.key} quota" if choice.key else "") + (
        " (borrowing its cohort's quota)" if borrowing else "")
    status = JobStatus(job_id=sub.job_id, state=JobState.ADMITTED, reason=why,
                       reason_code=TransitionReason.ADMITTED, attempt=attempt)
    return [outgoing(ready, f"ready-{sub.job_id}-{attempt}"),
            outgoing(status, f"admitted-{sub.job_id}-{attempt}")]


def reclaim(row: JobRow, rc: Reclaim) -> Outgoing:
    cmd = JobCommand(job_id=row.job_id, action=CommandAction.PREEMPT,
                     reason=f"quota reclaimed: queue {row.queue} borrowed "
                     + (f"{rc.model} GPUs that " if rc.model else "what ")
                     + f"{rc.member} is guaranteed in cohort {rc.cohort}", requested_by=SOURCE)
    return outgoing(cmd, f"reclaim-{row.job_id}-{row.attempt}")


def waiting(row: JobRow, reason: str, detail: str, notice: int) -> Outgoing:
    """The ``pending`` status of a job whose reason to wait changed (its ``notice``-th)."""
    st = JobStatus(job_id=row.job_id, state=JobState.PENDING, attempt=row.attempt,
                   reason=f"waiting: {reason}", reason_code=TransitionReason.WAITING,
                   message=detail)
    return outgoing(st, f"waiting-{row.job_id}-{row.attempt}-{notice}")


def requeued(row: JobRow, attempt: int) -> Outgoing:
    return outgoing(JobStatus(
        job_id=row.job_id, state=JobState.PENDING, attempt=attempt,
        reason=f"requeued in queue {row.queue}: its quota was reclaimed",
        reason_code=TransitionReason.REQUEUED),
        f"requeued-{row.job_id}-{attempt}")


def cancelled(cmd: JobCommand) -> Outgoing:
    return outgoing(JobStatus(job_id=cmd.job_id, state=JobState.CANCELLED,
                              reason=cmd.reason or "cancelled while queued",
                              reason_code=TransitionReason.CANCELLED),
                    f"cancelled-q-{cmd.job_id}")


def no_queue(sub: JobSubmitted) -> Outgoing:
    return outgoing(JobStatus(job_id=sub.job_id, state=JobState.FAILED, reason=f"no queue "
                              f"{sub.queue} to hold it (unknown or a cohort)",
                              reason_code=TransitionReason.NO_QUEUE),
                    f"failed-q-{sub.job_id}")
