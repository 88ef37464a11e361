"""Event contracts: one frozen pydantic model per event type, inside one envelope.

Every message on every topic is an :class:`Envelope` serialised as JSON whose ``data``
is the event its ``type`` names (``EVENT_TYPES``). The models live by subject:
``jobs``, ``forecasts``, ``bindings``, ``nodes``, ``queues``, ``system`` (dead letters, the broker's
incarnation); ``reasons`` holds the codes of why a job waits or changed state,
``envelope`` the wire format and the registry. This package exports them all: import
from ``shared.events``.
"""

from shared.events.base import Event, utcnow
from shared.events.bindings import (
    Binding,
    BindingAction,
    BindingRefused,
    ClusterMember,
    GpuAssignment,
    TaskBinding,
)
from shared.events.envelope import EVENT_TYPES, Envelope
from shared.events.forecasts import JobForecast
from shared.events.jobs import (
    FENCED,
    RETURNED,
    TIME_LIMIT_REACHED,
    CommandAction,
    Connection,
    JobCommand,
    JobReady,
    JobState,
    JobStatus,
    JobSubmitted,
    JobWaiting,
)
from shared.events.nodes import (
    GpuHealth,
    GpuInfo,
    GpuTelemetry,
    NodeAction,
    NodeCommand,
    NodeHeartbeat,
    NodeInventory,
    NodeLabels,
    NodeLost,
    NodeRegistered,
    NodeSchedulability,
    NodeSchedulingChanged,
    NodeTelemetry,
)
from shared.events.queues import (
    QueueAction,
    QueueChanged,
    QueueCommand,
    QueueRefusal,
    QueueStatus,
    WaitingJob,
)
from shared.events.reasons import (
    NODE_CAUSES,
    PLATFORM_CAUSES,
    EndCause,
    TransitionReason,
    WaitReason,
    classify_end,
    classify_transition,
    from_pending,
    wait_reason,
)
from shared.events.system import BrokerIncarnation, DeadLetter

__all__ = [
    "EVENT_TYPES",
    "FENCED",
    "NODE_CAUSES",
    "PLATFORM_CAUSES",
    "RETURNED",
    "TIME_LIMIT_REACHED",
    "Binding",
    "BindingAction",
    "BindingRefused",
    "BrokerIncarnation",
    "ClusterMember",
    "CommandAction",
    "Connection",
    "DeadLetter",
    "EndCause",
    "Envelope",
    "Event",
    "GpuAssignment",
    "GpuHealth",
    "GpuInfo",
    "GpuTelemetry",
    "JobCommand",
    "JobForecast",
    "JobReady",
    "JobState",
    "JobStatus",
    "JobSubmitted",
    "JobWaiting",
    "NodeAction",
    "NodeCommand",
    "NodeHeartbeat",
    "NodeInventory",
    "NodeLabels",
    "NodeLost",
    "NodeRegistered",
    "NodeSchedulability",
    "NodeSchedulingChanged",
    "NodeTelemetry",
    "QueueAction",
    "QueueChanged",
    "QueueCommand",
    "QueueRefusal",
    "QueueStatus",
    "TaskBinding",
    "TransitionReason",
    "WaitReason",
    "WaitingJob",
    "classify_end",
    "classify_transition",
    "from_pending",
    "utcnow",
    "wait_reason",
]
