"""What travels on the wire: every message on every topic is an :class:`Envelope`
serialised as JSON. ``type`` names the payload model (see ``EVENT_TYPES``);
``schema_version`` is that model's version."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.events.base import Event, utcnow
from shared.events.bindings import Binding, BindingRefused
from shared.events.forecasts import JobForecast
from shared.events.jobs import JobCommand, JobReady, JobStatus, JobSubmitted, JobWaiting
from shared.events.nodes import (
    NodeCommand,
    NodeHeartbeat,
    NodeLabels,
    NodeLost,
    NodeRegistered,
    NodeSchedulingChanged,
    NodeTelemetry,
)
from shared.events.queues import QueueChanged, QueueCommand, QueueStatus
from shared.events.system import BrokerIncarnation, DeadLetter

EVENT_TYPES: dict[str, type[Event]] = {
    m.TYPE: m
    for m in (
        JobSubmitted,
        JobReady,
        JobStatus,
        JobWaiting,
        JobForecast,
        BindingRefused,
        JobCommand,
        Binding,
        NodeRegistered,
        NodeHeartbeat,
        NodeLost,
        NodeCommand,
        NodeLabels,
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
