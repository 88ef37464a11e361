"""The one vocabulary of reasons: why a job waits, and why a job changed state.

Events, the gateway's API and metric labels all use these codes; the free text beside
them (``detail``, ``JobStatus.reason``) is for people. The scheduling core keeps its own
``PendingReason`` (it imports nothing from ``shared``): every one of its values is a
``WaitReason`` of the same name (``from_pending``; a test holds the two in step).

**WaitReason** — why a job is not running yet (``JobWaiting.reason``,
``WaitingJob.reason``, the gateway's ``waiting`` / ``placement_wait``):

============================  ==========================================  ==============
code                          meaning                                     set by
============================  ==========================================  ==============
``quota``                     its queue (or a cohort above) has no quota  queueing, core
                              left for it now
``reclaim``                   within its guarantee: borrowers are being   queueing
                              preempted for it
``queue_closed``              its queue is closed                         queueing
``array_limit``               its job array runs as many elements as it   queueing
                              may
``priority``                  it waits behind earlier or higher-priority  queueing (a
                              work: ``blocked_by`` names that job         strict queue),
                                                                          scheduler
``no_fit``                    no node has room for it now                 scheduler
``gang_incomplete``           only part of its gang fits now              scheduler
``never_fits``                larger than the whole healthy cluster       scheduler
``backfill_blocked``          starting it would delay the job backfill    scheduler
                              holds capacity for (``blocked_by``)
``gpu_model``                 no GPU of an allowed model is free          scheduler
``preempting``                lower-priority work is stopping for it      scheduler
``affinity``                  a required (anti-)affinity rule fails now   scheduler
``no_matching_node``          its selector or taints exclude every node   scheduler
``cordoned``                  room for it only on cordoned nodes          scheduler
``unknown``                   a reader's fallback for a code it does not  readers
                              know (a newer producer)
============================  ==========================================  ==============

**TransitionReason** — why a ``JobStatus`` was sent (``JobStatus.reason_code``, the
monitor's ``kairos_job_transitions_total{reason}``):

==================  ==================================================  ==============
code                meaning                                             set by
==================  ==================================================  ==============
``admitted``        admitted by its queue (state admitted)              queueing
``waiting``         its reason to wait in its queue changed (pending)   queueing
``requeued``        back in its queue after a reclaim (pending)         queueing
``no_queue``        no queue to hold it (failed)                        queueing
``placed``          bound to nodes (bound)                              scheduler
``started``         all its tasks run (running)                         scheduler
``succeeded``       all its tasks succeeded                             scheduler
``resized``         an elastic resize changed its replicas              scheduler
``retry``           a new attempt after a failure, preemption or lost   scheduler
                    node (admitted)
``out_of_retries``  failed, no retry left                               scheduler
``preempted``       stopped for a higher-priority job                   scheduler
``reclaimed``       stopped and handed back to its queue: quota         scheduler
                    reclaimed (preempted)
``node_lost``       failed: too many nodes lost under it                scheduler
``time_limit``      reached its spec's timeLimit (failed / cancelled)   scheduler
``cancelled``       cancelled by its user, or returned (interactive)    queueing,
                                                                        scheduler
``other``           none of the above; also an unknown code's fallback  readers
==================  ==================================================  ==============

**EndCause** — why a task ended, or why the scheduler asks it to stop (task-level
``JobStatus.cause``, set by the agent; ``Binding.cause`` of a stop or resize, set by the
scheduler). Code decides on these, never on the words beside them. A *platform* cause
(``PLATFORM_CAUSES``) is never the job's fault: it leaves the job's ``maxRetry`` alone.

==================  ==========================================================
code                meaning
==================  ==========================================================
``completed``       it exited 0
``failed``          it exited non-zero on its own
``start_failed``    the runtime could not start it
``cancelled``       its user cancelled the job (or returned the environment)
``preempted``       stopped for a higher-priority job (platform)
``reclaimed``       stopped: its queue took back borrowed quota (platform)
``drained``         stopped: its node is drained (platform)
``resized``         a replica an elastic shrink removed (platform)
``retry``           the rest of an attempt that is retried after a failure
``time_limit``      it reached its spec's timeLimit
``share_exceeded``  it used more of a shared GPU than its share
``fenced``          its agent could not renew its lease (platform)
``lost``            its agent holds no record of it: restarted without it, or
                    never got its binding (platform)
``node_lost``       its node was declared lost (platform)
``not_owned``       the scheduler placed it elsewhere (platform)
``other``           none of the above; also an unknown code's fallback
==================  ==========================================================

An event from an older producer has no ``reason_code``: ``classify_transition`` reads it
from the text, as the monitor did before codes existed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BeforeValidator


class WaitReason(StrEnum):
    """Why a job waits; the table above says who sets which."""

    QUOTA = "quota"
    RECLAIM = "reclaim"
    QUEUE_CLOSED = "queue_closed"
    ARRAY_LIMIT = "array_limit"
    PRIORITY = "priority"
    NO_FIT = "no_fit"
    GANG_INCOMPLETE = "gang_incomplete"
    NEVER_FITS = "never_fits"
    BACKFILL_BLOCKED = "backfill_blocked"
    GPU_MODEL = "gpu_model"
    PREEMPTING = "preempting"
    AFFINITY = "affinity"
    NO_MATCHING_NODE = "no_matching_node"
    CORDONED = "cordoned"
    UNKNOWN = "unknown"


def mig_never_fits(profiles: tuple[str, ...]) -> str:
    """Why a job asking for MIG instances no schedulable node has enough of waits."""
    return (f"no schedulable node has enough MIG instances of {', '.join(profiles)}: each "
            f"GPU's MIG geometry is set by an administrator (kairos nodes -o wide shows it)")


class TransitionReason(StrEnum):
    """Why a job changed state; the table above says who sets which."""

    ADMITTED = "admitted"
    WAITING = "waiting"
    REQUEUED = "requeued"
    NO_QUEUE = "no_queue"
    PLACED = "placed"
    STARTED = "started"
    SUCCEEDED = "succeeded"
    RESIZED = "resized"
    RETRY = "retry"
    OUT_OF_RETRIES = "out_of_retries"
    PREEMPTED = "preempted"
    RECLAIMED = "reclaimed"
    NODE_LOST = "node_lost"
    TIME_LIMIT = "time_limit"
    CANCELLED = "cancelled"
    OTHER = "other"


class EndCause(StrEnum):
    """Why a task ended or is asked to stop (the module's table says what each means)."""

    COMPLETED = "completed"
    FAILED = "failed"
    START_FAILED = "start_failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    RECLAIMED = "reclaimed"
    DRAINED = "drained"
    RESIZED = "resized"
    RETRY = "retry"
    TIME_LIMIT = "time_limit"
    SHARE_EXCEEDED = "share_exceeded"
    FENCED = "fenced"
    LOST = "lost"
    NODE_LOST = "node_lost"
    NOT_OWNED = "not_owned"
    OTHER = "other"


# not the job's doing: an attempt ended by one of these does not spend its maxRetry
PLATFORM_CAUSES = frozenset({
    EndCause.PREEMPTED, EndCause.RECLAIMED, EndCause.DRAINED, EndCause.RESIZED,
    EndCause.FENCED, EndCause.LOST, EndCause.NODE_LOST, EndCause.NOT_OWNED})
# the task's node, not the task, is gone or cut off
NODE_CAUSES = frozenset({EndCause.FENCED, EndCause.LOST, EndCause.NODE_LOST})


# the codes queueing sets (the rest are the scheduler's)
QUEUEING_WAITS = (WaitReason.QUOTA, WaitReason.RECLAIM, WaitReason.QUEUE_CLOSED,
                  WaitReason.ARRAY_LIMIT, WaitReason.PRIORITY)


def wait_reason(value: object) -> WaitReason:
    """The code for ``value``; ``unknown`` for one this reader does not know."""
    if isinstance(value, str) and value in WaitReason._value2member_map_:
        return WaitReason(value)
    return WaitReason.UNKNOWN


def from_pending(value: str) -> WaitReason:
    """The core's ``PendingReason`` (by value) as a wait code: the same name."""
    return wait_reason(value)


def _or_other(codes: type[TransitionReason] | type[EndCause]) -> Any:
    """A field's reader: None stays None, a code this reader lacks reads as ``other``."""
    def read(value: Any) -> Any:
        if value is None or isinstance(value, codes):
            return value
        try:
            return codes(value)
        except ValueError:
            return codes.OTHER
    return read


# the event fields: a newer producer's code this reader lacks reads as the fallback
# instead of failing the whole event
WaitCode = Annotated[WaitReason, BeforeValidator(
    lambda v: v if isinstance(v, WaitReason) else wait_reason(v))]
TransitionCode = Annotated[TransitionReason | None, BeforeValidator(_or_other(TransitionReason))]
EndCode = Annotated[EndCause | None, BeforeValidator(_or_other(EndCause))]

# An older producer's text, by prefix (first match wins): what the scheduler and
# queueing wrote before codes (services/scheduler/jobs.py, state.py, resizes.py,
# services/queueing/messages.py).
_PREFIXES = (
    ("admitted", TransitionReason.ADMITTED),
    ("waiting", TransitionReason.WAITING),
    ("requeued", TransitionReason.REQUEUED),
    ("no queue", TransitionReason.NO_QUEUE),
    ("placed", TransitionReason.PLACED),
    ("all tasks running", TransitionReason.STARTED),
    ("all tasks succeeded", TransitionReason.SUCCEEDED),
    ("resized", TransitionReason.RESIZED),
    ("out of retries", TransitionReason.OUT_OF_RETRIES),
    ("retry", TransitionReason.RETRY),
    ("preempted", TransitionReason.PREEMPTED),
    ("quota reclaimed", TransitionReason.RECLAIMED),
    ("node lost", TransitionReason.NODE_LOST),
    ("time limit", TransitionReason.TIME_LIMIT),
    ("returned", TransitionReason.CANCELLED),
)


def classify_transition(text: str) -> TransitionReason:
    """The code of a transition that came without one, from its text."""
    low = text.strip().lower()
    for prefix, code in _PREFIXES:
        if low.startswith(prefix):
            return code
    if "nodes lost under it" in low:
        return TransitionReason.NODE_LOST
    return TransitionReason.CANCELLED if "cancel" in low else TransitionReason.OTHER


# What an older agent wrote before causes (``fenced: ...``, ``time limit reached``,
# ``lost: ...``), by prefix; otherwise the state says it.
_END_PREFIXES = (
    ("fenced", EndCause.FENCED),
    ("time limit reached", EndCause.TIME_LIMIT),
    ("lost:", EndCause.LOST),
    ("preempt", EndCause.PREEMPTED),
    ("share_exceeded", EndCause.SHARE_EXCEEDED),
)
_END_OF_STATE = {"succeeded": EndCause.COMPLETED, "failed": EndCause.FAILED,
                 "cancelled": EndCause.CANCELLED, "preempted": EndCause.PREEMPTED}


def classify_end(state: str, text: str) -> EndCause:
    """The cause of a task's end that came without one (an older agent), from its text
    and state. Only for such events: code reads ``cause``."""
    low = text.strip().lower()
    for prefix, cause in _END_PREFIXES:
        if low.startswith(prefix):
            return cause
    return _END_OF_STATE.get(state, EndCause.OTHER)
