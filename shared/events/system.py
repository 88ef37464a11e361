"""Events about the messaging itself: dead letters, and the broker's incarnation."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from shared.events.base import Event


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
