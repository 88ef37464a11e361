"""The topic registry: every topic, its key, partitions, retention and the events on it.

Partitions are sized up front because the embedded broker cannot add partitions later.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared import events as ev


@dataclass(frozen=True)
class Topic:
    name: str
    key: str
    partitions: int
    retention_ms: int
    events: tuple[type[ev.Event], ...]
    description: str


DAY_MS = 24 * 3600 * 1000

JOBS_SUBMITTED = Topic(
    "jobs.submitted", "queue", 8, 7 * DAY_MS, (ev.JobSubmitted,),
    "Accepted jobs, published by admission through its outbox.",
)
JOBS_READY = Topic(
    "jobs.ready", "queue", 8, 7 * DAY_MS, (ev.JobReady,),
    "Jobs queueing admitted against quota, in queue order.",
)
JOBS_STATUS = Topic(
    "jobs.status", "job id", 16, 7 * DAY_MS, (ev.JobStatus, ev.JobWaiting, ev.BindingRefused),
    "Every transition of a job or of one of its tasks, with reason, attempt and exit code; "
    "and why an admitted job is not placed yet, when that changes.",
)
JOBS_COMMANDS = Topic(
    "jobs.commands", "job id", 8, 7 * DAY_MS, (ev.JobCommand,),
    "Cancel, preempt and resize requests.",
)
JOBS_FORECASTS = Topic(
    "jobs.forecasts", "job id", 8, 1 * DAY_MS, (ev.JobForecast,),
    "Each waiting job's expected start, finish, nodes and band, from the forecaster, "
    "when it moves (or every minute).",
)
BINDINGS = Topic(
    "bindings", "node id", 64, 7 * DAY_MS, (ev.Binding,),
    "The scheduler's decisions per node, fenced by its epoch.",
)
NODES_LIFECYCLE = Topic(
    "nodes.lifecycle", "node id", 16, 7 * DAY_MS,
    (ev.NodeRegistered, ev.NodeHeartbeat, ev.NodeLost, ev.NodeCommand,
     ev.NodeSchedulingChanged, ev.NodeLabels),
    "Node registration (inventory), heartbeats, node.lost, cordon / drain / uncordon "
    "(the operator's command and the scheduler's answer), and an admin's labels and taints.",
)
NODES_TELEMETRY = Topic(
    "nodes.telemetry", "node id", 16, 1 * DAY_MS, (ev.NodeTelemetry,),
    "Per-GPU telemetry at the agent's interval.",
)
QUEUES_EVENTS = Topic(
    "queues.events", "queue", 4, 30 * DAY_MS, (ev.QueueCommand, ev.QueueChanged, ev.QueueStatus),
    "Admin commands on queues, the configuration queueing applied, and each queue's usage "
    "and waiting jobs.",
)
DEAD_LETTER = Topic(
    "deadletter", "source topic", 4, 30 * DAY_MS, (ev.DeadLetter,),
    "Messages a consumer could not decode or handle, with the reason.",
)

BROKER = Topic(
    "kairos.broker", "broker", 1, 365 * DAY_MS, (ev.BrokerIncarnation,),
    "One message per broker log: written when the platform found the broker empty and "
    "refilled it from the outboxes (shared.refill).",
)

ALL_TOPICS: tuple[Topic, ...] = (
    JOBS_SUBMITTED, JOBS_READY, JOBS_STATUS, JOBS_COMMANDS, JOBS_FORECASTS, BINDINGS,
    NODES_LIFECYCLE, NODES_TELEMETRY, QUEUES_EVENTS, DEAD_LETTER, BROKER,
)
BY_NAME: dict[str, Topic] = {t.name: t for t in ALL_TOPICS}


def topic_for(event: ev.Event) -> Topic:
    for t in ALL_TOPICS:
        if type(event) in t.events:
            return t
    raise KeyError(f"no topic carries {event.TYPE}")
