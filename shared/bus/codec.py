"""Envelopes to bytes and back, as the bus sends and receives them."""

from __future__ import annotations

from aiokafka import ConsumerRecord
from pydantic import ValidationError

from shared.errors import EventTooLarge
from shared.events import Envelope, Event

# what decode_record raises for bytes that are not a known, valid event: the consumer
# dead-letters the message as "undecodable"
UNDECODABLE = (ValidationError, KeyError, ValueError)


def check_size(env: Envelope, limit: int) -> bytes:
    """The envelope's bytes, or EventTooLarge when they are over ``limit``."""
    data = env.encode()
    if len(data) > limit:
        raise EventTooLarge(f"{env.type} event {env.id} is {len(data)} bytes, over the "
                            f"{limit}-byte event limit")
    return data


def decode_record(record: ConsumerRecord[bytes, bytes]) -> tuple[Envelope, Event]:
    """The envelope and its typed event; raises one of ``UNDECODABLE``."""
    env = Envelope.decode(record.value or b"")
    return env, env.payload()
